//! Reader for `.mlb` model files (layout in docs/FORMAT.md).
//!
//! The file is memory-mapped and validated completely before any tensor is
//! handed out: every count, length, shape and offset is checked against the
//! file size with checked arithmetic, so a truncated or hostile file gives a
//! one-line error and never a panic or an allocation larger than the file.

use std::collections::HashMap;
use std::path::Path;

use super::bytes::ByteReader;
use crate::fault::Fault;
use crate::quant::{
    repack_q4_x8, repack_q4k_x8, repack_q6k_x8, repack_q8_x8, BlockMxfp4, BlockQ4K, BlockQ4Kx8, BlockQ4_0,
    BlockQ4_0F32, BlockQ4_0x8, BlockQ5K, BlockQ6K, BlockQ6Kx8, BlockQ8_0, BlockQ8_0F32, BlockQ8_0x8, QK, QK_K, ROWS8,
};

pub const MAGIC: &[u8; 8] = b"KRAFLAMB";
/// The version of files whose tensor entries have a layout field; writers
/// write it when a tensor is not in the plain row layout.
pub const VERSION: u32 = 2;
/// The version without layout fields (every tensor plain), still read and
/// written when every tensor is plain, so such files are what they were.
pub const VERSION_ROWS: u32 = 1;
const MAX_META: u32 = 4096;
const MAX_TENSORS: u32 = 65536;
const MAX_KEY: u32 = 256;
const MAX_STRING: u32 = 65536;
const MAX_ARRAY: u32 = 65536;
const MAX_DIMS: u32 = 4;
pub const DATA_ALIGN: u64 = 64;

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    Q8_0,
    Q4_0,
    Q8_0F32,
    Q4_0F32,
    /// llama.cpp's K-quant super-blocks of 256 (`quant::BlockQ4K` ...).
    Q4K,
    Q5K,
    Q6K,
    /// OCP MXFP4 blocks of 32 (`quant::BlockMxfp4`).
    Mxfp4,
}

impl TensorType {
    pub fn from_code(code: u32) -> Option<TensorType> {
        Some(match code {
            0 => TensorType::F32,
            1 => TensorType::F16,
            2 => TensorType::Q8_0,
            3 => TensorType::Q4_0,
            4 => TensorType::Q8_0F32,
            5 => TensorType::Q4_0F32,
            6 => TensorType::Q4K,
            7 => TensorType::Q5K,
            8 => TensorType::Q6K,
            9 => TensorType::Mxfp4,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "f32",
            TensorType::F16 => "f16",
            TensorType::Q8_0 => "q8_0",
            TensorType::Q4_0 => "q4_0",
            TensorType::Q8_0F32 => "q8_0(f32 scale)",
            TensorType::Q4_0F32 => "q4_0(f32 scale)",
            TensorType::Q4K => "q4_k",
            TensorType::Q5K => "q5_k",
            TensorType::Q6K => "q6_k",
            TensorType::Mxfp4 => "mxfp4",
        }
    }

    /// Bytes needed for `n` elements of the contiguous dimension, or None if
    /// `n` does not fit the type's block size or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let blocks_of = |weights: usize, block_bytes: usize| -> Option<u64> {
            if !n.is_multiple_of(weights as u64) {
                return None;
            }
            (n / weights as u64).checked_mul(block_bytes as u64)
        };
        let blocks = |block_bytes: usize| blocks_of(QK, block_bytes);
        match self {
            TensorType::F32 => n.checked_mul(4),
            TensorType::F16 => n.checked_mul(2),
            TensorType::Q8_0 => blocks(std::mem::size_of::<BlockQ8_0>()),
            TensorType::Q4_0 => blocks(std::mem::size_of::<BlockQ4_0>()),
            TensorType::Q8_0F32 => blocks(std::mem::size_of::<BlockQ8_0F32>()),
            TensorType::Q4_0F32 => blocks(std::mem::size_of::<BlockQ4_0F32>()),
            TensorType::Q4K => blocks_of(QK_K, std::mem::size_of::<BlockQ4K>()),
            TensorType::Q5K => blocks_of(QK_K, std::mem::size_of::<BlockQ5K>()),
            TensorType::Q6K => blocks_of(QK_K, std::mem::size_of::<BlockQ6K>()),
            TensorType::Mxfp4 => blocks(std::mem::size_of::<BlockMxfp4>()),
        }
    }
}

/// How a tensor's rows are stored (docs/FORMAT.md, "Tensor layouts").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Rows one after another, as the type's table says.
    Rows = 0,
    /// A 2-D Q8_0, Q4_0, Q4_K or Q6_K matrix as the eight-row kernels read
    /// it: rows 0 .. 8·⌊rows/8⌋ in interleaved groups of eight
    /// (`quant::BlockQ8_0x8` ...; Q8_0 quants with bias 0), group g's
    /// block b at g·nb + b, then the last rows % 8 rows plain.
    Rows8 = 1,
}

impl Layout {
    pub fn from_code(code: u32) -> Option<Layout> {
        match code {
            0 => Some(Layout::Rows),
            1 => Some(Layout::Rows8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Rows => "rows",
            Layout::Rows8 => "rows8",
        }
    }
}

/// Bytes of one eight-row group's block (eight rows × one block of the
/// type), for the types the `Rows8` layout holds.
pub fn rows8_block_bytes(ttype: TensorType) -> Option<usize> {
    match ttype {
        TensorType::Q8_0 => Some(std::mem::size_of::<BlockQ8_0x8>()),
        TensorType::Q4_0 => Some(std::mem::size_of::<BlockQ4_0x8>()),
        TensorType::Q4K => Some(std::mem::size_of::<BlockQ4Kx8>()),
        TensorType::Q6K => Some(std::mem::size_of::<BlockQ6Kx8>()),
        _ => None,
    }
}

/// The layout `Mlb::save` (and tools/convert.py) writes a tensor in: as it
/// is if interleaved, else eight-row groups for a 2-D matrix of a type the
/// `Rows8` layout holds with at least eight rows.
pub fn saved_layout(ttype: TensorType, layout: Layout, dims: &[u64]) -> Layout {
    match dims {
        [rows, _] if *rows >= ROWS8 as u64 && rows8_block_bytes(ttype).is_some() => Layout::Rows8,
        _ => layout,
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    Int(i64),
    Float(f64),
    Str(String),
    IntArray(Vec<i64>),
    FloatArray(Vec<f64>),
}

/// A tensor's description; the bytes are `Mlb::tensor_bytes`.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ttype: TensorType,
    pub layout: Layout,
    /// Outermost first; the last dimension is contiguous.
    pub dims: Vec<u64>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Rows = product of all but the last dim; cols = last dim.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = *self.dims.last().unwrap_or(&1) as usize;
        let rows = self.dims[..self.dims.len().saturating_sub(1)].iter().product::<u64>() as usize;
        (rows, cols)
    }
}

/// A validated `.mlb` model: a memory-mapped file, or a model imported from
/// another format (`crate::import`), whose tensors lie partly in that
/// file's map and partly in memory converted at load time.
pub struct Mlb {
    map: Bytes,
    /// The data of tensors converted at load time (u64s, so that every
    /// tensor is 8-byte aligned); their `start` counts from `converted_start`.
    converted: Vec<u64>,
    converted_start: usize,
    pub meta: HashMap<String, MetaValue>,
    /// The metadata keys in file order.
    meta_keys: Vec<String>,
    pub tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    pub path: String,
    /// Size of the `.mlb` file this is (or `save` writes).
    file_len: usize,
}

/// Backing store: an mmap of a file, or owned bytes (tests).
pub enum Bytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    /// A file mapped read-only; errors are one line naming the file.
    pub fn map_file(path: &Path) -> Result<Bytes, String> {
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("{shown}: cannot open: {e}"))?;
        // SAFETY: the map is read-only and private; Krafla never writes model
        // files while running. A file truncated by another process while mapped
        // is outside what we can defend against (as for every mmap reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("{shown}: cannot map: {e}"))?;
        Ok(Bytes::Map(map))
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Where tensors converted at load time start, after a source of `source_len`
/// bytes: `TensorInfo::start` of such a tensor is this plus its offset in
/// the converted data.
pub fn converted_start(source_len: usize) -> usize {
    source_len.next_multiple_of(DATA_ALIGN as usize)
}

impl Mlb {
    /// Opens and validates a model file. Errors are one line naming the file.
    pub fn open(path: &Path) -> Result<Mlb, String> {
        Self::parse(Bytes::map_file(path)?, path.display().to_string())
    }

    /// Parses an in-memory file (tests, hostile-input checks).
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Mlb, String> {
        Self::parse(Bytes::Owned(bytes), name.to_string())
    }

    fn parse(map: Bytes, path: String) -> Result<Mlb, String> {
        let (meta, tensors) = parse_layout(&map).map_err(|e| format!("{path}: {e}"))?;
        let file_len = map.len();
        Self::build(map, Vec::new(), meta, tensors, path, file_len)
    }

    fn build(
        map: Bytes,
        converted: Vec<u64>,
        meta: Vec<(String, MetaValue)>,
        tensors: Vec<TensorInfo>,
        path: String,
        file_len: usize,
    ) -> Result<Mlb, String> {
        let meta_keys = meta.iter().map(|(k, _)| k.clone()).collect();
        let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let converted_start = converted_start(map.len());
        let meta = meta.into_iter().collect();
        Ok(Mlb { map, converted, converted_start, meta, meta_keys, tensors, by_name, path, file_len })
    }

    /// A model assembled from parts: `meta` in order, `tensors` in order,
    /// each lying in `source` or (from `converted_start(source.len())` on) in
    /// `converted`. Each tensor's size and place are checked.
    pub fn assemble(
        source: Bytes,
        converted: Vec<u64>,
        meta: Vec<(String, MetaValue)>,
        tensors: Vec<TensorInfo>,
        path: String,
    ) -> Result<Mlb, Fault> {
        let base = converted_start(source.len());
        let converted_len = converted.len() * 8;
        for t in &tensors {
            let size = tensor_size(t.ttype, t.layout, &t.dims);
            let end = t.start.checked_add(t.len);
            let inside = match end {
                Some(end) if t.start >= base => end - base <= converted_len,
                Some(end) => end <= source.len(),
                None => false,
            };
            if size != Some(t.len as u64) || !inside {
                return Err(Fault::Internal(format!("{path}: tensor '{}' was assembled wrongly", t.name)));
            }
        }
        let saved: Vec<_> = tensors.iter().map(saved_entry).collect();
        let (head, offsets) = header(meta.iter().map(|(k, v)| (k.as_str(), v)), saved.iter().copied());
        let file_len = match (offsets.last(), saved.last()) {
            (Some(&o), Some(t)) => (head.len() as u64 + o + t.4 as u64).next_multiple_of(DATA_ALIGN) as usize,
            _ => head.len(),
        };
        Ok(Self::build(source, converted, meta, tensors, path, file_len)?)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        self.range(t.start, t.len)
    }

    /// `len` bytes of tensor data from `start` (a `TensorInfo::start`).
    pub fn range(&self, start: usize, len: usize) -> &[u8] {
        if start >= self.converted_start {
            let at = start - self.converted_start;
            &bytemuck::cast_slice::<u64, u8>(&self.converted)[at..at + len]
        } else {
            &self.map[start..start + len]
        }
    }

    /// Tells the system this process no longer needs the mapped pages of
    /// tensor bytes `start .. start + len` (a matrix the loader copied into
    /// another layout): they leave its resident memory, and are read from
    /// the file again (the page cache) if ever touched. Only whole 64 KiB
    /// spans inside the range (a multiple of every page size); data
    /// converted at load and owned bytes are left as they are.
    pub fn release(&self, start: usize, len: usize) {
        const SPAN: usize = 65536;
        let (from, to) = (start.next_multiple_of(SPAN), (start + len) / SPAN * SPAN);
        #[cfg(unix)]
        if let Bytes::Map(m) = &self.map {
            if start < self.converted_start && to > from && to <= m.len() {
                // SAFETY: a read-only file mapping that is never written:
                // MADV_DONTNEED only drops this process's page-table entries,
                // and the next access reads the same bytes from the file, so no
                // slice into the map sees its data change. (Advice is a hint:
                // its error is of no consequence.)
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from) };
            }
        }
        let _ = (from, to);
    }

    /// Bytes of the tensors converted at load time (0 for an `.mlb` file).
    pub fn converted_bytes(&self) -> usize {
        self.converted.len() * 8
    }

    /// Size of the `.mlb` file: the one opened, or the one `save` writes.
    pub fn file_len(&self) -> usize {
        self.file_len
    }

    /// The metadata in file order.
    pub fn meta_in_order(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.meta_keys.iter().filter_map(|k| self.meta.get(k).map(|v| (k.as_str(), v)))
    }

    /// Writes the model as an `.mlb` file, byte for byte what
    /// `tools/mlb.py`'s `write_mlb` writes for the same metadata and tensors,
    /// each matrix in its `saved_layout` (through a temporary file renamed
    /// over `path`, so a failure leaves nothing half-written).
    pub fn save(&self, path: &Path) -> Result<(), Fault> {
        let saved: Vec<_> = self.tensors.iter().map(saved_entry).collect();
        let (head, offsets) = header(self.meta_in_order(), saved.iter().copied());
        super::write_atomic(path, |out| {
            out.write_all(&head)?;
            let mut pos = 0u64;
            for ((t, &o), &(_, _, layout, _, len)) in self.tensors.iter().zip(&offsets).zip(&saved) {
                out.write_all(&vec![0u8; (o - pos) as usize])?;
                if layout == t.layout {
                    out.write_all(self.tensor_bytes(t))?;
                } else {
                    let what = format!("{}: tensor '{}'", self.path, t.name);
                    let bytes = interleave_rows8(t.ttype, &t.dims, self.tensor_bytes(t), &what)
                        .map_err(std::io::Error::other)?;
                    out.write_all(&bytes)?;
                }
                pos = o + len as u64;
            }
            out.write_all(&vec![0u8; (pos.next_multiple_of(DATA_ALIGN) - pos) as usize])
        })
    }

    // ---- typed metadata access; errors name the file and the key ----

    pub fn get_int(&self, key: &str) -> Result<Option<i64>, String> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Int(v)) => Ok(Some(*v)),
            Some(_) => Err(format!("{}: metadata '{key}' should be an integer", self.path)),
        }
    }
    pub fn get_float(&self, key: &str) -> Result<Option<f64>, String> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Float(v)) => Ok(Some(*v)),
            Some(MetaValue::Int(v)) => Ok(Some(*v as f64)),
            Some(_) => Err(format!("{}: metadata '{key}' should be a number", self.path)),
        }
    }
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, String> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Str(v)) => Ok(Some(v)),
            Some(_) => Err(format!("{}: metadata '{key}' should be a string", self.path)),
        }
    }
    pub fn get_int_array(&self, key: &str) -> Result<Option<&[i64]>, String> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::IntArray(v)) => Ok(Some(v)),
            Some(_) => Err(format!("{}: metadata '{key}' should be an integer array", self.path)),
        }
    }
    pub fn get_float_array(&self, key: &str) -> Result<Option<&[f64]>, String> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::FloatArray(v)) => Ok(Some(v)),
            Some(_) => Err(format!("{}: metadata '{key}' should be a float array", self.path)),
        }
    }
    pub fn require_int(&self, key: &str) -> Result<i64, String> {
        self.get_int(key)?.ok_or_else(|| format!("{}: missing metadata '{key}'", self.path))
    }
    pub fn require_float(&self, key: &str) -> Result<f64, String> {
        self.get_float(key)?.ok_or_else(|| format!("{}: missing metadata '{key}'", self.path))
    }
    pub fn require_str(&self, key: &str) -> Result<&str, String> {
        self.get_str(key)?.ok_or_else(|| format!("{}: missing metadata '{key}'", self.path))
    }
}

type Parsed = (Vec<(String, MetaValue)>, Vec<TensorInfo>);

fn parse_layout(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = ByteReader::new(bytes);
    let magic = c.take(8, "magic")?;
    if magic != MAGIC {
        return Err("not a Krafla model (bad magic; expected KRAFLAMB)".into());
    }
    let version = c.u32("version")?;
    if version != VERSION && version != VERSION_ROWS {
        return Err(format!("unsupported .mlb version {version} (this build reads {VERSION_ROWS} and {VERSION})"));
    }
    let n_meta = c.u32("metadata count")?;
    if n_meta > MAX_META {
        return Err(format!("metadata count {n_meta} exceeds the limit {MAX_META}"));
    }
    let n_tensors = c.u32("tensor count")?;
    if n_tensors > MAX_TENSORS {
        return Err(format!("tensor count {n_tensors} exceeds the limit {MAX_TENSORS}"));
    }
    let reserved = c.u32("reserved field")?;
    if reserved != 0 {
        return Err(format!("the header's reserved field is {reserved}; it must be 0"));
    }

    let mut meta = Vec::new();
    let mut keys = std::collections::HashSet::new();
    for i in 0..n_meta {
        let key = c.str(MAX_KEY, &format!("metadata key {i}"))?.to_string();
        if key.is_empty() {
            return Err(format!("metadata key {i} is empty"));
        }
        let what = format!("metadata '{key}'");
        let value = match c.u8(&what)? {
            0 => MetaValue::Int(c.i64(&what)?),
            1 => MetaValue::Float(c.f64(&what)?),
            2 => MetaValue::Str(c.str(MAX_STRING, &what)?.to_string()),
            3 => {
                let n = c.count(MAX_ARRAY, 8, &format!("{what} element count"))?;
                MetaValue::IntArray((0..n).map(|_| c.i64(&what)).collect::<Result<_, _>>()?)
            }
            4 => {
                let n = c.count(MAX_ARRAY, 8, &format!("{what} element count"))?;
                MetaValue::FloatArray((0..n).map(|_| c.f64(&what)).collect::<Result<_, _>>()?)
            }
            t => return Err(format!("{what} has unknown value type {t}")),
        };
        if !keys.insert(key.clone()) {
            return Err(format!("duplicate metadata key '{key}'"));
        }
        meta.push((key, value));
    }

    struct Raw {
        name: String,
        ttype: TensorType,
        layout: Layout,
        dims: Vec<u64>,
        offset: u64,
    }
    let mut raws: Vec<Raw> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = c.str(MAX_KEY, &format!("tensor {i} name"))?.to_string();
        if name.is_empty() {
            return Err(format!("tensor {i} has an empty name"));
        }
        let what = format!("tensor '{name}'");
        let code = c.u32(&format!("{what} type"))?;
        let ttype = TensorType::from_code(code).ok_or_else(|| format!("{what} has unknown type {code}"))?;
        let layout = match version {
            VERSION_ROWS => Layout::Rows,
            _ => {
                let code = c.u32(&format!("{what} layout"))?;
                Layout::from_code(code)
                    .ok_or_else(|| format!("{what} has unknown layout {code} (0 rows, 1 rows8 are known)"))?
            }
        };
        let n_dims = c.u32(&format!("{what} dimension count"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!("{what} has {n_dims} dimensions (1..={MAX_DIMS} allowed)"));
        }
        let dims: Vec<u64> = (0..n_dims).map(|_| c.u64(&format!("{what} shape"))).collect::<Result<_, _>>()?;
        let offset = c.u64(&format!("{what} offset"))?;
        if !seen.insert(name.clone()) {
            return Err(format!("duplicate tensor name '{name}'"));
        }
        raws.push(Raw { name, ttype, layout, dims, offset });
    }

    let data_start = (c.pos() as u64).div_ceil(DATA_ALIGN) * DATA_ALIGN;
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(raws.len());
    for r in raws {
        let what = format!("tensor '{}'", r.name);
        if r.dims.contains(&0) {
            return Err(format!("{what} has a zero dimension {:?}", r.dims));
        }
        let last = *r.dims.last().unwrap();
        let quantized = !matches!(r.ttype, TensorType::F32 | TensorType::F16);
        if quantized && last % QK as u64 != 0 {
            return Err(format!("{what}: last dimension {last} of type {} is not a multiple of {QK}", r.ttype.name()));
        }
        if r.layout == Layout::Rows8 && (r.dims.len() != 2 || rows8_block_bytes(r.ttype).is_none()) {
            return Err(format!(
                "{what}: layout rows8 needs a 2-D q8_0, q4_0, q4_k or q6_k matrix, not {} {:?}",
                r.ttype.name(),
                r.dims
            ));
        }
        let size =
            tensor_size(r.ttype, r.layout, &r.dims).ok_or_else(|| format!("{what}: shape {:?} overflows", r.dims))?;
        if r.offset % DATA_ALIGN != 0 {
            return Err(format!("{what}: offset {} is not a multiple of {DATA_ALIGN}", r.offset));
        }
        let start = data_start.checked_add(r.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => tensors.push(TensorInfo {
                name: r.name,
                ttype: r.ttype,
                layout: r.layout,
                dims: r.dims,
                start: s as usize,
                len: size as usize,
            }),
            _ => {
                return Err(format!(
                    "{what}: data (offset {}, {size} bytes) runs past the end of the file ({file_len} bytes)",
                    r.offset
                ))
            }
        }
    }
    Ok((meta, tensors))
}

/// Bytes of a tensor of type `ttype`, layout `layout` and shape `dims`
/// (outermost first), or None if the shape does not fit the type or the
/// size overflows.
pub fn tensor_size(ttype: TensorType, layout: Layout, dims: &[u64]) -> Option<u64> {
    let (&last, outer) = dims.split_last()?;
    let row = ttype.row_bytes(last)?;
    match (layout, outer, rows8_block_bytes(ttype)) {
        (Layout::Rows8, &[rows], Some(group_block)) => {
            let block = if matches!(ttype, TensorType::Q4K | TensorType::Q6K) { QK_K } else { QK };
            let blocks = last / block as u64;
            let groups = (rows / ROWS8 as u64).checked_mul(blocks)?.checked_mul(group_block as u64)?;
            groups.checked_add((rows % ROWS8 as u64).checked_mul(row)?)
        }
        (Layout::Rows8, ..) => None,
        (Layout::Rows, ..) => outer.iter().try_fold(row, |acc, &d| acc.checked_mul(d)),
    }
}

/// A tensor's entry as `save` writes it: name, type, layout, dims, bytes.
type Entry<'a> = (&'a str, TensorType, Layout, &'a [u64], usize);

fn saved_entry(t: &TensorInfo) -> Entry<'_> {
    let layout = saved_layout(t.ttype, t.layout, &t.dims);
    let len = if layout == t.layout { t.len } else { tensor_size(t.ttype, layout, &t.dims).unwrap_or(0) as usize };
    (&t.name, t.ttype, layout, &t.dims, len)
}

/// The plain rows `plain` of a [rows, cols] matrix in the `Rows8` layout:
/// whole groups of eight interleaved (Q8_0 with bias 0), the last rows % 8
/// rows as they are.
pub fn interleave_rows8(ttype: TensorType, dims: &[u64], plain: &[u8], what: &str) -> Result<Vec<u8>, String> {
    fn read<B: bytemuck::Pod>(bytes: &[u8]) -> Vec<B> {
        bytes.chunks_exact(std::mem::size_of::<B>()).map(bytemuck::pod_read_unaligned).collect()
    }
    fn bytes_of<X: bytemuck::Pod>(v: Vec<X>) -> Vec<u8> {
        bytemuck::cast_slice(&v).to_vec()
    }
    let (rows, cols) = match dims {
        &[rows, cols] => (rows as usize, cols),
        _ => return Err(format!("{what}: only a matrix can be interleaved")),
    };
    let row = ttype.row_bytes(cols).ok_or_else(|| format!("{what}: bad row length {cols}"))? as usize;
    let (head, tail) = plain.split_at((rows / ROWS8 * ROWS8 * row).min(plain.len()));
    let (nb, nbk) = (cols as usize / QK, cols as usize / QK_K);
    let mut out = match ttype {
        TensorType::Q8_0 => bytes_of(repack_q8_x8(&read(head), nb, 0, what)?),
        TensorType::Q4_0 => bytes_of(repack_q4_x8(&read(head), nb, what)?),
        TensorType::Q4K => bytes_of(repack_q4k_x8(&read(head), nbk, what)?),
        TensorType::Q6K => bytes_of(repack_q6k_x8(&read(head), nbk, what)?),
        other => return Err(format!("{what}: type {} has no eight-row layout", other.name())),
    };
    out.extend_from_slice(tail);
    Ok(out)
}

/// The header of an `.mlb` file (padded to `DATA_ALIGN`) and each tensor's
/// offset from the start of the data: tensors in order, each at the next
/// multiple of `DATA_ALIGN` (docs/FORMAT.md).
fn header<'a>(
    meta: impl Iterator<Item = (&'a str, &'a MetaValue)>,
    tensors: impl Iterator<Item = Entry<'a>>,
) -> (Vec<u8>, Vec<u64>) {
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u32).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut entries = Vec::new();
    let mut n_meta = 0u32;
    for (k, v) in meta {
        n_meta += 1;
        put_str(&mut entries, k);
        match v {
            MetaValue::Int(x) => {
                entries.push(0);
                entries.extend(x.to_le_bytes());
            }
            MetaValue::Float(x) => {
                entries.push(1);
                entries.extend(x.to_le_bytes());
            }
            MetaValue::Str(s) => {
                entries.push(2);
                put_str(&mut entries, s);
            }
            MetaValue::IntArray(a) => {
                entries.push(3);
                entries.extend((a.len() as u32).to_le_bytes());
                a.iter().for_each(|x| entries.extend(x.to_le_bytes()));
            }
            MetaValue::FloatArray(a) => {
                entries.push(4);
                entries.extend((a.len() as u32).to_le_bytes());
                a.iter().for_each(|x| entries.extend(x.to_le_bytes()));
            }
        }
    }
    let tensors: Vec<Entry> = tensors.collect();
    let version = if tensors.iter().all(|t| t.2 == Layout::Rows) { VERSION_ROWS } else { VERSION };
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, ttype, layout, dims, len) in tensors {
        put_str(&mut entries, name);
        entries.extend((ttype as u32).to_le_bytes());
        if version == VERSION {
            entries.extend((layout as u32).to_le_bytes());
        }
        entries.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| entries.extend(d.to_le_bytes()));
        entries.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + len as u64).next_multiple_of(DATA_ALIGN);
    }
    let mut out = Vec::with_capacity(24 + entries.len() + DATA_ALIGN as usize);
    out.extend(MAGIC);
    out.extend(version.to_le_bytes());
    out.extend(n_meta.to_le_bytes());
    out.extend((offsets.len() as u32).to_le_bytes());
    out.extend(0u32.to_le_bytes());
    out.extend(entries);
    out.resize(out.len().next_multiple_of(DATA_ALIGN as usize), 0);
    (out, offsets)
}

/// Writes an `.mlb` image in memory, the last tensor ending the file (tests).
#[cfg(test)]
pub fn write_mlb(meta: &[(&str, MetaValue)], tensors: &[(&str, TensorType, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    write_mlb_layouts(
        meta,
        &tensors.iter().map(|(n, t, d, b)| (*n, *t, Layout::Rows, d.clone(), b.clone())).collect::<Vec<_>>(),
    )
}

/// A tensor for `write_mlb_layouts`: name, type, layout, dims, bytes in that layout.
#[cfg(test)]
pub type TestTensor<'a> = (&'a str, TensorType, Layout, Vec<u64>, Vec<u8>);

/// `write_mlb` with each tensor's layout (its bytes already in it).
#[cfg(test)]
pub fn write_mlb_layouts(meta: &[(&str, MetaValue)], tensors: &[TestTensor]) -> Vec<u8> {
    let (mut out, offsets) = header(
        meta.iter().map(|(k, v)| (*k, v)),
        tensors.iter().map(|(n, t, l, d, data)| (*n, *t, *l, &d[..], data.len())),
    );
    let data_start = out.len();
    for ((_, _, _, _, data), off) in tensors.iter().zip(offsets) {
        out.resize(data_start + off as usize, 0);
        out.extend(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let q8 = vec![0u8; 2 * 34];
        write_mlb(
            &[
                ("arch", MetaValue::Str("llama".into())),
                ("n_layers", MetaValue::Int(1)),
                ("rope_theta", MetaValue::Float(10000.0)),
                ("layer_kinds", MetaValue::IntArray(vec![0])),
                ("scales", MetaValue::FloatArray(vec![1.0, 2.0])),
            ],
            &[("a", TensorType::F32, vec![3], vec![0u8; 12]), ("b", TensorType::Q8_0, vec![2, 32], q8)],
        )
    }

    #[test]
    fn a_valid_file_round_trips() {
        let f = Mlb::from_bytes(sample(), "t.mlb").unwrap();
        assert_eq!(f.get_str("arch").unwrap(), Some("llama"));
        assert_eq!(f.require_int("n_layers").unwrap(), 1);
        assert_eq!(f.tensor("b").unwrap().dims, vec![2, 32]);
        assert_eq!(f.tensor("b").unwrap().start % 64, 0);
        assert!(f.require_int("missing").unwrap_err().contains("missing metadata 'missing'"));
    }

    /// A version 2 file: a Q8_0 [19, 64] and a Q4_K [9, 256] matrix in eight-row groups (each with
    /// a tail of plain rows), an f32 vector in plain rows, the Q4_K tensor ending the file.
    fn sample_rows8() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let q8: Vec<u8> = (0..19 * 2 * 34).map(|i| (i * 7) as u8).collect();
        let q4k: Vec<u8> = (0..9 * 144).map(|i| (i * 13) as u8).collect();
        let q8_groups = interleave_rows8(TensorType::Q8_0, &[19, 64], &q8, "q8").unwrap();
        let q4k_groups = interleave_rows8(TensorType::Q4K, &[9, 256], &q4k, "q4k").unwrap();
        let file = write_mlb_layouts(
            &[("arch", MetaValue::Str("llama".into()))],
            &[
                ("v", TensorType::F32, Layout::Rows, vec![3], vec![0u8; 12]),
                ("q8", TensorType::Q8_0, Layout::Rows8, vec![19, 64], q8_groups),
                ("q4k", TensorType::Q4K, Layout::Rows8, vec![9, 256], q4k_groups),
            ],
        );
        (file, q8, q4k)
    }

    #[test]
    fn rows8_tensors_are_read_with_their_layout_and_size() {
        let (file, q8, _) = sample_rows8();
        assert_eq!(u32::from_le_bytes(file[8..12].try_into().unwrap()), VERSION);
        let f = Mlb::from_bytes(file, "r8.mlb").unwrap();
        let (v, a, b) = (f.tensor("v").unwrap(), f.tensor("q8").unwrap(), f.tensor("q4k").unwrap());
        assert_eq!((v.layout, a.layout, b.layout), (Layout::Rows, Layout::Rows8, Layout::Rows8));
        // Q8_0 groups take the rows' bytes; Q4_K groups 32 bytes a group block more
        assert_eq!((a.len, b.len), (19 * 2 * 34, 1184 + 144));
        // the three tail rows stay plain, after the two groups
        assert_eq!(&f.tensor_bytes(a)[16 * 68..], &q8[16 * 68..]);
        assert_ne!(&f.tensor_bytes(a)[..16 * 68], &q8[..16 * 68]);
        // a file of plain tensors only is still written as version 1
        assert_eq!(u32::from_le_bytes(sample()[8..12].try_into().unwrap()), VERSION_ROWS);
    }

    #[test]
    fn bad_layouts_are_one_line_errors() {
        let (good, _, _) = sample_rows8();
        let check = |bytes: Vec<u8>, needle: &str| {
            let err = Mlb::from_bytes(bytes, "l.mlb").err().expect("accepted a bad layout");
            assert!(err.starts_with("l.mlb: ") && err.contains(needle) && !err.contains('\n'), "{err}");
        };
        // the layout field follows the type: name length, name, type, layout
        let at = |name: &[u8]| {
            let mut entry = (name.len() as u32).to_le_bytes().to_vec();
            entry.extend(name);
            good.windows(entry.len()).position(|w| w == entry).unwrap() + entry.len() + 4
        };
        let mut b = good.clone();
        patch_u32(&mut b, at(b"q8"), 7);
        check(b, "tensor 'q8' has unknown layout 7");
        let mut b = good.clone();
        patch_u32(&mut b, at(b"v"), 1);
        check(b, "tensor 'v': layout rows8 needs a 2-D q8_0, q4_0, q4_k or q6_k matrix, not f32 [3]");
        // the Q4_K groups are larger than its plain rows: as plain rows it would end earlier,
        // but with its layout one byte short of the file is past the end
        let mut b = good.clone();
        b.pop();
        check(b, "tensor 'q4k': data (offset");
        for cut in 0..good.len() {
            let err = Mlb::from_bytes(good[..cut].to_vec(), "cut.mlb").err().unwrap_or_else(|| panic!("cut {cut}"));
            assert!(err.starts_with("cut.mlb: ") && !err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn every_truncation_is_a_clean_error() {
        let full = sample();
        // The last tensor ends at the end of the file, so any shorter prefix is invalid.
        for cut in 0..full.len() {
            let err =
                Mlb::from_bytes(full[..cut].to_vec(), "cut.mlb").err().unwrap_or_else(|| panic!("cut {cut} accepted"));
            assert!(err.starts_with("cut.mlb: "), "{err}");
            assert!(!err.contains('\n'));
        }
    }

    /// Offset of the first tensor entry (after the metadata), found by parsing.
    fn patch_u32(bytes: &mut [u8], at: usize, v: u32) {
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn hostile_headers_are_rejected() {
        let good = sample();
        let check = |bytes: Vec<u8>, needle: &str| {
            let err = Mlb::from_bytes(bytes, "h.mlb").err().expect("accepted a hostile file");
            assert!(err.contains(needle), "error '{err}' lacks '{needle}'");
        };
        let mut b = good.clone();
        b[0] = b'X';
        check(b, "bad magic");
        let mut b = good.clone();
        patch_u32(&mut b, 8, 99);
        check(b, "unsupported .mlb version 99");
        let mut b = good.clone();
        patch_u32(&mut b, 12, u32::MAX);
        check(b, "metadata count");
        let mut b = good.clone();
        patch_u32(&mut b, 16, u32::MAX);
        check(b, "tensor count");
        let mut b = good.clone();
        patch_u32(&mut b, 20, 1);
        check(b, "reserved field is 1; it must be 0");
        // first key length huge
        let mut b = good.clone();
        patch_u32(&mut b, 24, 0xffff_fff0);
        check(b, "limit");
        // find tensor 'a' entry by its name bytes and corrupt type, dims, shape, offset
        let pos = good.windows(5).position(|w| w == [1, 0, 0, 0, b'a']).unwrap();
        let ty = pos + 5;
        let mut b = good.clone();
        patch_u32(&mut b, ty, 77);
        check(b, "unknown type 77");
        let mut b = good.clone();
        patch_u32(&mut b, ty + 4, 9);
        check(b, "dimensions");
        let mut b = good.clone();
        b[ty + 8..ty + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        check(b, "overflows");
        let mut b = good.clone();
        b[ty + 8..ty + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        check(b, "past the end");
        let mut b = good.clone();
        b[ty + 16..ty + 24].copy_from_slice(&(1u64 << 62).to_le_bytes());
        check(b, "past the end");
        let mut b = good.clone();
        b[ty + 16..ty + 24].copy_from_slice(&3u64.to_le_bytes());
        check(b, "multiple of 64");
        // huge shape product overflow on the quantised tensor
        let pos_b = good.windows(5).position(|w| w == [1, 0, 0, 0, b'b']).unwrap();
        let mut b = good.clone();
        b[pos_b + 13..pos_b + 21].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        check(b, "overflows");
        // last dim not a multiple of 32 for a quantised type
        let mut b = good.clone();
        b[pos_b + 21..pos_b + 29].copy_from_slice(&33u64.to_le_bytes());
        check(b, "not a multiple of 32");
        // duplicate names
        let dup =
            write_mlb(&[], &[("x", TensorType::F32, vec![1], vec![0; 4]), ("x", TensorType::F32, vec![1], vec![0; 4])]);
        check(dup, "duplicate tensor name 'x'");
        let dup = write_mlb(&[("k", MetaValue::Int(1)), ("k", MetaValue::Int(2))], &[]);
        check(dup, "duplicate metadata key 'k'");
        // unknown metadata value type
        let mut b = write_mlb(&[("k", MetaValue::Int(1))], &[]);
        b[24 + 4 + 1] = 42;
        check(b, "unknown value type 42");
        // array count beyond the file
        let mut b = write_mlb(&[("k", MetaValue::IntArray(vec![1, 2]))], &[]);
        patch_u32(&mut b, 24 + 4 + 1 + 1, 60000);
        check(b, "truncated");
    }
}
