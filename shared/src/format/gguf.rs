//! Reader for GGUF files (llama.cpp's model format, versions 2 and 3):
//! the metadata, in file order, and where each tensor's bytes are.
//!
//! Layout: `GGUF`, a u32 version, u64 tensor and metadata counts; the
//! metadata (u64-length key, u32 value type, value; arrays are a u32 element
//! type, a u64 count and the elements); the tensor table (name, u32 number
//! of dimensions, u64 dimensions innermost first, u32 ggml type, u64 offset
//! from the start of the data); the data, aligned to `general.alignment`
//! (default 32). As for `.mlb`, the whole file is validated before anything
//! is handed out: every count, length and offset with checked arithmetic
//! against the bytes that remain, tensors inside the file, aligned and not
//! overlapping, every tensor type one this reader knows the size of.

use std::collections::HashMap;
use std::path::Path;

use super::bytes::ByteReader;
use super::mlb::Bytes;

const MAX_KV: u64 = 1 << 20;
const MAX_TENSORS: u64 = 1 << 20;
const MAX_KEY: u64 = 1 << 16;
const MAX_STRING: u64 = 1 << 26;
const MAX_ARRAY: u64 = 1 << 26;
const MAX_NAME: u64 = 1 << 10;
const MAX_DIMS: u32 = 4;
const MAX_ALIGNMENT: u64 = 1 << 16;

/// A metadata value, borrowed from the file (arrays are read element by
/// element, so a long array costs nothing until it is used).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(&'a str),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value: `len` elements of GGUF type `elem` (not an array),
/// encoded in `bytes`, which the parser has validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Array<'a> {
    pub elem: u32,
    pub len: usize,
    bytes: &'a [u8],
}

impl<'a> Array<'a> {
    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = Value<'a>> + 'a {
        let mut r = ByteReader::new(self.bytes);
        let elem = self.elem;
        // Validated when the file was parsed: reading again cannot fail.
        (0..self.len).map_while(move |_| read_value(&mut r, elem, "array element", false).ok())
    }

    /// The elements as strings, or None if the array holds something else.
    pub fn strings(&self) -> Option<impl Iterator<Item = &'a str> + 'a> {
        (self.elem == TYPE_STRING).then(|| self.iter().filter_map(|v| v.as_str()))
    }
}

impl<'a> Value<'a> {
    /// An integer of any width, as i64 (None for other values, or a u64 above i64::MAX).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            _ => return None,
        })
    }

    /// A number (float or integer) as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<Array<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

/// A ggml tensor type this reader knows the layout of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// OCP MXFP4 (`quant::BlockMxfp4`).
    Mxfp4,
}

impl GgmlType {
    /// The type with ggml's code `code`; Err with its name (or number) when
    /// this reader does not know it.
    pub fn from_code(code: u32) -> Result<GgmlType, String> {
        Ok(match code {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            15 => GgmlType::Q8K,
            30 => GgmlType::BF16,
            39 => GgmlType::Mxfp4,
            other => {
                const NAMES: [&str; 40] = [
                    "F32",
                    "F16",
                    "Q4_0",
                    "Q4_1",
                    "Q4_2",
                    "Q4_3",
                    "Q5_0",
                    "Q5_1",
                    "Q8_0",
                    "Q8_1",
                    "Q2_K",
                    "Q3_K",
                    "Q4_K",
                    "Q5_K",
                    "Q6_K",
                    "Q8_K",
                    "IQ2_XXS",
                    "IQ2_XS",
                    "IQ3_XXS",
                    "IQ1_S",
                    "IQ4_NL",
                    "IQ3_S",
                    "IQ2_S",
                    "IQ4_XS",
                    "I8",
                    "I16",
                    "I32",
                    "I64",
                    "F64",
                    "IQ1_M",
                    "BF16",
                    "Q4_0_4_4",
                    "Q4_0_4_8",
                    "Q4_0_8_8",
                    "TQ1_0",
                    "TQ2_0",
                    "IQ4_NL_4_4",
                    "IQ4_NL_4_8",
                    "IQ4_NL_8_8",
                    "MXFP4",
                ];
                return Err(match NAMES.get(other as usize) {
                    Some(name) => format!("{name} (type {other})"),
                    None => format!("type {other}"),
                });
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::Mxfp4 => "MXFP4",
        }
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::Q8K => (256, 292),
            GgmlType::Mxfp4 => (32, 17),
        }
    }
}

/// Where a tensor's data is.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub ty: GgmlType,
    /// Innermost first (ggml's `ne`): a [rows, cols] matrix is `[cols, rows]`.
    pub dims: Vec<u64>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

impl Tensor {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A metadata entry: its key, and where its value (of GGUF type `ty`) lies
/// in the file.
#[derive(Clone, Debug)]
pub struct MetaEntry {
    pub key: String,
    ty: u32,
    start: usize,
    end: usize,
}

impl MetaEntry {
    /// The value, from the bytes of the file it was parsed from.
    pub fn value<'a>(&self, file: &'a [u8]) -> Value<'a> {
        let mut r = ByteReader::new(&file[self.start..self.end]);
        // Validated when the file was parsed: reading again cannot fail.
        read_value(&mut r, self.ty, "metadata", true).unwrap_or(Value::U8(0))
    }
}

/// A validated, memory-mapped GGUF file.
pub struct Gguf {
    map: Bytes,
    pub path: String,
    pub version: u32,
    /// The metadata in file order.
    meta: Vec<MetaEntry>,
    by_key: HashMap<String, usize>,
    /// The tensors in file order.
    pub tensors: Vec<Tensor>,
    by_name: HashMap<String, usize>,
}

impl Gguf {
    /// Opens and validates a GGUF file. Errors are one line naming the file.
    pub fn open(path: &Path) -> Result<Gguf, String> {
        Self::parse(Bytes::map_file(path)?, path.display().to_string())
    }

    /// Parses an in-memory file (tests, hostile-input checks).
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Gguf, String> {
        Self::parse(Bytes::Owned(bytes), name.to_string())
    }

    fn parse(map: Bytes, path: String) -> Result<Gguf, String> {
        let (version, meta, tensors) = parse(&map).map_err(|e| format!("{path}: {e}"))?;
        let by_key = meta.iter().enumerate().map(|(i, m)| (m.key.clone(), i)).collect();
        let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Gguf { map, path, version, meta, by_key, tensors, by_name })
    }

    /// Whether `bytes` start like a GGUF file.
    pub fn sniff(bytes: &[u8]) -> bool {
        bytes.starts_with(b"GGUF")
    }

    /// Whether the file at `path` starts like a GGUF file (its first four
    /// bytes read); errors are one line naming the file.
    pub fn sniff_file(path: &std::path::Path) -> Result<bool, String> {
        use std::io::Read;
        let mut head = [0u8; 4];
        let n = std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
        Ok(Self::sniff(&head[..n]))
    }

    pub fn get(&self, key: &str) -> Option<Value<'_>> {
        self.by_key.get(key).map(|&i| self.meta[i].value(&self.map))
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    pub fn tensor_bytes(&self, t: &Tensor) -> &[u8] {
        &self.map[t.start..t.start + t.len]
    }

    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    /// The mapped file, giving it up (its tensors' `start`/`len` index it).
    pub fn into_map(self) -> Bytes {
        self.map
    }
}

type Parsed = (u32, Vec<MetaEntry>, Vec<Tensor>);

/// Validates the bytes of a whole GGUF file.
pub fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut r = ByteReader::new(bytes);
    if r.take(4, "magic")? != b"GGUF" {
        return Err("not a GGUF file (bad magic; expected GGUF)".into());
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(format!("unsupported GGUF version {version} (this build reads 2 and 3)"));
    }
    // Smallest tensor entry: empty name (8), one dimension (4 + 8), type (4), offset (8).
    let n_tensors = r.count64(MAX_TENSORS, 32, "tensor count")?;
    // Smallest metadata entry: empty key (8), type (4), a one-byte value.
    let n_kv = r.count64(MAX_KV, 13, "metadata count")?;

    let mut meta: Vec<MetaEntry> = Vec::with_capacity(n_kv);
    let mut keys = std::collections::HashSet::new();
    let mut alignment = 32;
    for i in 0..n_kv {
        let key = r.str64(MAX_KEY, &format!("metadata key {i}"))?.to_string();
        let what = format!("metadata {key:?}");
        let ty = r.u32(&format!("{what} type"))?;
        let start = r.pos();
        let value = read_value(&mut r, ty, &what, true)?;
        if key == "general.alignment" {
            alignment = match value.as_i64() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() && a as u64 <= MAX_ALIGNMENT => a as u64,
                _ => return Err(format!("general.alignment {value:?} is not a power of two up to {MAX_ALIGNMENT}")),
            };
        }
        if !keys.insert(key.clone()) {
            return Err(format!("duplicate metadata key {key:?}"));
        }
        meta.push(MetaEntry { key, ty, start, end: r.pos() });
    }

    struct Raw {
        name: String,
        ty: GgmlType,
        dims: Vec<u64>,
        offset: u64,
    }
    let mut raws = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = r.str64(MAX_NAME, &format!("tensor {i} name"))?.to_string();
        let what = format!("tensor {name:?}");
        let n_dims = r.u32(&format!("{what} dimension count"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!("{what} has {n_dims} dimensions (1..={MAX_DIMS} allowed)"));
        }
        let dims = (0..n_dims).map(|_| r.u64(&format!("{what} shape"))).collect::<Result<Vec<_>, _>>()?;
        let code = r.u32(&format!("{what} type"))?;
        let ty = GgmlType::from_code(code).map_err(|t| format!("{what} has type {t}, which Krafla does not read"))?;
        let offset = r.u64(&format!("{what} offset"))?;
        if !names.insert(name.clone()) {
            return Err(format!("duplicate tensor name {name:?}"));
        }
        raws.push(Raw { name, ty, dims, offset });
    }

    let data_start = (r.pos() as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(raws.len());
    for t in raws {
        let what = format!("tensor {:?}", t.name);
        if t.dims.contains(&0) {
            return Err(format!("{what} has a zero dimension {:?}", t.dims));
        }
        let (block, block_bytes) = t.ty.block();
        if t.dims[0] % block as u64 != 0 {
            return Err(format!(
                "{what}: {} elements per row is not a multiple of {}'s block of {block}",
                t.dims[0],
                t.ty.name()
            ));
        }
        let size = t.dims[1..]
            .iter()
            .try_fold((t.dims[0] / block as u64).checked_mul(block_bytes as u64), |acc, &d| {
                acc?.checked_mul(d).map(Some)
            })
            .flatten()
            .ok_or_else(|| format!("{what}: shape {:?} overflows", t.dims))?;
        if t.offset % alignment != 0 {
            return Err(format!("{what}: offset {} is not a multiple of the alignment {alignment}", t.offset));
        }
        let start = data_start.checked_add(t.offset);
        match start.and_then(|s| s.checked_add(size)) {
            Some(end) if end <= file_len => tensors.push(Tensor {
                name: t.name,
                ty: t.ty,
                dims: t.dims,
                start: (data_start + t.offset) as usize,
                len: size as usize,
            }),
            _ => {
                return Err(format!(
                    "{what}: data (offset {}, {size} bytes) runs past the end of the file ({file_len} bytes)",
                    t.offset
                ))
            }
        }
    }
    let mut by_start: Vec<&Tensor> = tensors.iter().collect();
    by_start.sort_by_key(|t| t.start);
    for pair in by_start.windows(2) {
        if pair[0].start + pair[0].len > pair[1].start {
            return Err(format!("tensors {:?} and {:?} overlap", pair[0].name, pair[1].name));
        }
    }
    Ok((version, meta, tensors))
}

/// One value of GGUF type `ty`; arrays (of anything but arrays) when `arrays`.
fn read_value<'a>(r: &mut ByteReader<'a>, ty: u32, what: &str, arrays: bool) -> Result<Value<'a>, String> {
    Ok(match ty {
        0 => Value::U8(r.u8(what)?),
        1 => Value::I8(r.u8(what)? as i8),
        2 => Value::U16(u16::from_le_bytes(r.array(what)?)),
        3 => Value::I16(i16::from_le_bytes(r.array(what)?)),
        4 => Value::U32(r.u32(what)?),
        5 => Value::I32(r.i32(what)?),
        6 => Value::F32(r.f32(what)?),
        7 => match r.u8(what)? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => return Err(format!("{what} is a bool of value {b}")),
        },
        TYPE_STRING => Value::Str(r.str64(MAX_STRING, what)?),
        TYPE_ARRAY if arrays => {
            let elem = r.u32(&format!("{what} element type"))?;
            if elem == TYPE_ARRAY {
                return Err(format!("{what} is an array of arrays, which Krafla does not read"));
            }
            let min = match elem {
                0 | 1 | 7 => 1,
                2 | 3 => 2,
                4..=6 => 4,
                8 | 10..=12 => 8,
                _ => return Err(format!("{what} has unknown element type {elem}")),
            };
            let len = r.count64(MAX_ARRAY, min, &format!("{what} element count"))?;
            let rest = r.rest();
            let start = r.pos();
            for _ in 0..len {
                read_value(r, elem, what, false)?;
            }
            Value::Array(Array { elem, len, bytes: &rest[..r.pos() - start] })
        }
        10 => Value::U64(r.u64(what)?),
        11 => Value::I64(r.i64(what)?),
        12 => Value::F64(r.f64(what)?),
        other => return Err(format!("{what} has unknown value type {other}")),
    })
}

/// An array value of `items` (all of GGUF type `elem`) for `write_gguf`.
#[cfg(test)]
pub fn test_array(elem: u32, items: &[Value]) -> Value<'static> {
    let mut bytes = Vec::new();
    for v in items {
        let mut one = Vec::new();
        put_value(&mut one, v, true);
        assert_eq!(u32::from_le_bytes(one[..4].try_into().unwrap()), elem, "{v:?}");
        bytes.extend(&one[4..]);
    }
    Value::Array(Array { elem, len: items.len(), bytes: bytes.leak() })
}

#[cfg(test)]
fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A value's GGUF type (with `with_type`) and encoding.
#[cfg(test)]
fn put_value(out: &mut Vec<u8>, v: &Value, with_type: bool) {
    let (ty, bytes): (u32, Vec<u8>) = match v {
        Value::U8(x) => (0, vec![*x]),
        Value::I8(x) => (1, vec![*x as u8]),
        Value::U16(x) => (2, x.to_le_bytes().to_vec()),
        Value::I16(x) => (3, x.to_le_bytes().to_vec()),
        Value::U32(x) => (4, x.to_le_bytes().to_vec()),
        Value::I32(x) => (5, x.to_le_bytes().to_vec()),
        Value::F32(x) => (6, x.to_le_bytes().to_vec()),
        Value::Bool(x) => (7, vec![*x as u8]),
        Value::Str(s) => {
            let mut b = Vec::new();
            put_str(&mut b, s);
            (8, b)
        }
        Value::Array(a) => {
            let mut b = Vec::new();
            b.extend(a.elem.to_le_bytes());
            b.extend((a.len as u64).to_le_bytes());
            b.extend(a.bytes);
            (9, b)
        }
        Value::U64(x) => (10, x.to_le_bytes().to_vec()),
        Value::I64(x) => (11, x.to_le_bytes().to_vec()),
        Value::F64(x) => (12, x.to_le_bytes().to_vec()),
    };
    if with_type {
        out.extend(ty.to_le_bytes());
    }
    out.extend(bytes);
}

/// Writes a GGUF image in memory (the tests' hostile files start from it).
#[cfg(test)]
pub fn write_gguf(meta: &[(&str, Value)], tensors: &[(&str, GgmlType, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    fn code(ty: GgmlType) -> u32 {
        (0..64).find(|&c| GgmlType::from_code(c) == Ok(ty)).expect("a known type")
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut out, k);
        put_value(&mut out, v, true);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, ty, dims, data) in tensors {
        put_str(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(code(*ty).to_le_bytes());
        out.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len() as u64).div_ceil(32) * 32;
    }
    let data_start = (out.len() as u64).div_ceil(32) * 32;
    for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
        out.resize((data_start + off) as usize, 0);
        out.extend(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    fn sample() -> Vec<u8> {
        write_gguf(
            &[
                ("general.architecture", Value::Str("llama")),
                ("llama.block_count", Value::U32(1)),
                ("llama.rope.freq_base", Value::F32(10000.0)),
                ("tokenizer.ggml.tokens", test_array(8, &[Value::Str("a"), Value::Str("b")])),
                ("flag", Value::Bool(true)),
            ],
            &[
                ("a.weight", GgmlType::F32, vec![3], vec![0u8; 12]),
                ("b.weight", GgmlType::Q8_0, vec![32, 2], vec![0u8; 68]),
            ],
        )
    }

    #[test]
    fn a_valid_file_parses() {
        let file = sample();
        let (version, meta, tensors) = parse(&file).unwrap();
        assert_eq!(version, 3);
        assert_eq!((meta[0].key.as_str(), meta[0].value(&file)), ("general.architecture", Value::Str("llama")));
        assert_eq!(meta[2].value(&file).as_f64(), Some(10000.0));
        let tokens = meta[3].value(&file).as_array().unwrap();
        assert_eq!(tokens.strings().unwrap().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(tensors[1].name, "b.weight");
        assert_eq!((tensors[1].len, tensors[1].start % 32), (68, 0));
    }

    #[test]
    fn every_truncation_is_a_clean_error() {
        let full = sample();
        for cut in 0..full.len() {
            let err = parse(&full[..cut]).err().unwrap_or_else(|| panic!("cut {cut} accepted"));
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn hostile_headers_are_rejected() {
        let good = sample();
        let check = |bytes: Vec<u8>, needle: &str| {
            let err = parse(&bytes).expect_err("accepted a hostile file");
            assert!(err.contains(needle), "error '{err}' lacks '{needle}'");
        };
        let patch = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        check(patch(0, b"GGUX"), "bad magic");
        check(patch(4, &1u32.to_le_bytes()), "unsupported GGUF version 1");
        check(patch(8, &u64::MAX.to_le_bytes()), "tensor count");
        check(patch(16, &(1u64 << 40).to_le_bytes()), "metadata count");
        check(patch(24, &u64::MAX.to_le_bytes()), "limit");
        // the tensor entries: name, dims, type, offset of "a.weight"
        let pos = good.windows(8).position(|w| w == b"a.weight").unwrap() + 8;
        check(patch(pos, &9u32.to_le_bytes()), "dimensions");
        check(patch(pos + 4, &u64::MAX.to_le_bytes()), "overflows");
        check(patch(pos + 4, &(1u64 << 40).to_le_bytes()), "past the end");
        check(patch(pos + 12, &16u32.to_le_bytes()), "IQ2_XXS (type 16), which Krafla does not read");
        check(patch(pos + 12, &99u32.to_le_bytes()), "type 99");
        check(patch(pos + 16, &3u64.to_le_bytes()), "multiple of the alignment");
        check(patch(pos + 16, &(1u64 << 62).to_le_bytes()), "past the end");
        check(patch(pos + 16, &32u64.to_le_bytes()), "overlap");
        let pos_b = good.windows(8).position(|w| w == b"b.weight").unwrap() + 8;
        check(patch(pos_b + 4, &33u64.to_le_bytes()), "not a multiple of Q8_0's block of 32");
        check(patch(pos_b + 12, &(u64::MAX / 2).to_le_bytes()), "overflows");
        let dup = write_gguf(&[("k", Value::U8(1)), ("k", Value::U8(2))], &[]);
        check(dup, "duplicate metadata key \"k\"");
        let nested = write_gguf(&[("k", test_array(9, &[test_array(0, &[])]))], &[]);
        check(nested, "array of arrays");
        let align = write_gguf(&[("general.alignment", Value::U32(3))], &[]);
        check(align, "power of two");
        let evil = write_gguf(&[("evil\x1b]0;x\x07\nkey", Value::U8(1)), ("evil\x1b]0;x\x07\nkey", Value::U8(1))], &[]);
        let err = parse(&evil).unwrap_err();
        assert!(!err.contains('\n') && !err.contains('\x1b'), "{err}");
    }

    /// Mutated files (bytes flipped, runs overwritten) never panic.
    #[test]
    fn mutations_never_panic() {
        let good = sample();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..1 + rng.next() % 4 {
                let at = (rng.next() % b.len() as u64) as usize;
                match rng.next() % 3 {
                    0 => b[at] ^= 1 << (rng.next() % 8),
                    1 => b[at] = 0xff,
                    _ => {
                        let v = rng.next().to_le_bytes();
                        let n = (b.len() - at).min(8);
                        b[at..at + n].copy_from_slice(&v[..n]);
                    }
                }
            }
            let _ = parse(&b);
        }
    }
}
