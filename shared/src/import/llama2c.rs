//! A karpathy/llama2.c checkpoint (`.bin`) as an `.mlb` model in memory:
//! the legacy v0 layout of `run.c` and `export.py`'s v1 (float32) and v2
//! (Q8_0 in groups of its own size, the scales after the values). Their q
//! and k rows are in the interleaved RoPE layout; they become the `half`
//! layout Krafla's llama2c arch uses. `convert.rs` converts every tensor.

use std::ops::Range;
use std::path::Path;

use super::convert::{self, check_shapes, conversion_metadata, convert, SourceTensor};
use super::families;
use super::ImportOptions;
use crate::fault::Fault;
use crate::format::gguf::GgmlType;
use crate::format::mlb::{Bytes, MetaValue, Mlb};

/// The magic of export.py's versioned files ("ak42").
const MAGIC: u32 = 0x616B_3432;

/// Where a tensor's values are.
enum Stored {
    /// f32 in the file.
    F32(Range<usize>),
    /// v2: int8 values and one f32 scale per `group` of them.
    Q8 { values: Range<usize>, scales: Range<usize> },
}

/// One tensor: its `.mlb` name, shape (rows first), where it is, and the
/// heads whose rows are interleaved (q and k).
struct Entry {
    name: String,
    shape: Vec<u64>,
    stored: Stored,
    interleaved_heads: Option<usize>,
}

/// A checkpoint, mapped and its header read.
pub struct Llama2c {
    pub path: String,
    map: Bytes,
    meta: Vec<(String, MetaValue)>,
    entries: Vec<Entry>,
    group: usize,
}

/// A cursor handing out the file's tensors in order.
struct Layout {
    pos: usize,
    size: usize,
    group: usize,
    quantized: bool,
}

impl Layout {
    /// `n` f32 values (`n` a product of header fields: in u64, it cannot
    /// overflow).
    fn f32(&mut self, n: u64) -> Result<Stored, String> {
        let start = self.pos;
        let end = n.checked_mul(4).and_then(|b| b.checked_add(start as u64)).filter(|&e| e <= self.size as u64);
        let Some(end) = end else {
            return Err("truncated (needs more weights than the file holds)".into());
        };
        self.pos = end as usize;
        Ok(Stored::F32(start..self.pos))
    }

    fn matrix(&mut self, n: u64) -> Result<Stored, String> {
        if !self.quantized {
            return self.f32(n);
        }
        if !n.is_multiple_of(self.group as u64) {
            return Err(format!("tensor size not a multiple of group size {}", self.group));
        }
        let bytes = n + n / self.group as u64 * 4;
        if bytes > (self.size - self.pos) as u64 {
            return Err("truncated (needs more weights than the file holds)".into());
        }
        let values = self.pos..self.pos + n as usize;
        let scales = values.end..self.pos + bytes as usize;
        self.pos = scales.end;
        Ok(Stored::Q8 { values, scales })
    }
}

/// Whether a file is taken for a llama2.c checkpoint: its name ends in `.bin`.
pub fn is_checkpoint(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "bin")
}

impl Llama2c {
    pub fn open(path: &Path) -> Result<Llama2c, String> {
        let shown = path.display().to_string();
        let map = Bytes::map_file(path)?;
        Self::parse(map, shown.clone()).map_err(|e| format!("{shown}: {e}"))
    }

    /// A checkpoint's bytes (`path` names it in errors).
    pub fn parse(map: Bytes, path: String) -> Result<Llama2c, String> {
        let size = map.len();
        if size < 28 {
            return Err("too small for a llama2.c checkpoint".into());
        }
        let i32_at = |at: usize| i32::from_le_bytes(map[at..at + 4].try_into().expect("4 bytes"));
        let (version, header, shared, group, pos) = if i32_at(0) as u32 == MAGIC {
            if size < 256 {
                return Err("too small for a llama2.c checkpoint".into());
            }
            let version = i32_at(4);
            if !matches!(version, 1 | 2) {
                return Err(format!("unsupported llama2.c version {version}"));
            }
            let header: Vec<i32> = (0..7).map(|i| i32_at(8 + 4 * i)).collect();
            let group = if version == 2 { i32_at(37) } else { 1 };
            (version, header, map[36] != 0, group, 256)
        } else {
            let mut header: Vec<i32> = (0..7).map(|i| i32_at(4 * i)).collect();
            // a negative vocabulary size: the classifier is not shared
            let shared = header[5] > 0;
            header[5] = header[5].checked_abs().unwrap_or(0);
            (0, header, shared, 1, 28)
        };
        if header.iter().chain([&group]).any(|&v| !(1..=1 << 24).contains(&v)) {
            return Err("implausible llama2.c header".into());
        }
        let [dim, hidden, n_layers, heads, kv_heads, vocab, seq] = header[..].try_into().expect("7 fields");
        let [dim, hidden, n_layers, heads, kv_heads, vocab, seq] =
            [dim, hidden, n_layers, heads, kv_heads, vocab, seq].map(|v| v as usize);
        if n_layers > crate::model::LIMIT_LAYERS as usize {
            return Err(format!("{n_layers} layers is above the limit of {}", crate::model::LIMIT_LAYERS));
        }
        if !dim.is_multiple_of(heads) || !heads.is_multiple_of(kv_heads) {
            return Err("bad head counts".into());
        }
        let hd = dim / heads;
        let kvd = kv_heads * hd;
        let family = families::from_arch("llama2c").expect("the llama2c family");
        let int = |v: usize| MetaValue::Int(v as i64);
        let mut meta: Vec<(String, MetaValue)> = vec![
            ("arch".into(), MetaValue::Str(family.arch.into())),
            ("vocab_size".into(), int(vocab)),
            ("hidden_size".into(), int(dim)),
            ("n_layers".into(), int(n_layers)),
            ("n_heads".into(), int(heads)),
            ("n_kv_heads".into(), int(kv_heads)),
            ("head_dim".into(), int(hd)),
            ("ffn_dim".into(), int(hidden)),
            ("context_length".into(), int(seq)),
            ("norm_eps".into(), MetaValue::Float(1e-5)),
            ("rope_theta".into(), MetaValue::Float(10000.0)),
            ("rope_style".into(), MetaValue::Str("half".into())),
        ];
        meta.extend(family.traits(dim as u64, false).into_iter().map(|(k, v)| (k.to_string(), v)));
        meta.push(("tie_embeddings".into(), MetaValue::Int(shared as i64)));

        let mut at = Layout { pos, size, group: group as usize, quantized: version == 2 };
        let [d, f, nv, kv, s, h] = [dim, hidden, vocab, kvd, seq, hd].map(|x| x as u64);
        let per_layer = |at: &mut Layout, n: u64, matrix: bool| -> Result<Vec<Stored>, String> {
            (0..n_layers).map(|_| if matrix { at.matrix(n) } else { at.f32(n) }).collect()
        };
        // the file's order: v0 interleaves norms and matrices as run.c reads them
        let (embd, attn_norm, q, k, v, o, ffn_norm, gate, down, up, norm);
        if version == 0 {
            embd = at.f32(nv * d)?;
            attn_norm = per_layer(&mut at, d, false)?;
            q = per_layer(&mut at, d * d, false)?;
            k = per_layer(&mut at, kv * d, false)?;
            v = per_layer(&mut at, kv * d, false)?;
            o = per_layer(&mut at, d * d, false)?;
            ffn_norm = per_layer(&mut at, d, false)?;
            gate = per_layer(&mut at, f * d, false)?;
            down = per_layer(&mut at, d * f, false)?;
            up = per_layer(&mut at, f * d, false)?;
            norm = at.f32(d)?;
            at.f32(s * (h / 2) * 2)?; // freq_cis_real and _imag (unused)
        } else {
            attn_norm = per_layer(&mut at, d, false)?;
            ffn_norm = per_layer(&mut at, d, false)?;
            norm = at.f32(d)?;
            embd = at.matrix(nv * d)?;
            q = per_layer(&mut at, d * d, true)?;
            k = per_layer(&mut at, kv * d, true)?;
            v = per_layer(&mut at, kv * d, true)?;
            o = per_layer(&mut at, d * d, true)?;
            gate = per_layer(&mut at, f * d, true)?;
            down = per_layer(&mut at, d * f, true)?;
            up = per_layer(&mut at, f * d, true)?;
        }
        let output = if shared { None } else { Some(if version == 0 { at.f32(nv * d)? } else { at.matrix(nv * d)? }) };

        let e = |name: String, shape: &[usize], stored: Stored, interleaved_heads: Option<usize>| Entry {
            name,
            shape: shape.iter().map(|&d| d as u64).collect(),
            stored,
            interleaved_heads,
        };
        let mut entries = vec![e("token_embd".into(), &[vocab, dim], embd, None)];
        let layers = attn_norm.into_iter().zip(q).zip(k).zip(v).zip(o).zip(ffn_norm).zip(gate).zip(up).zip(down);
        for (i, ((((((((an, q), k), v), o), fnorm), gate), up), down)) in layers.enumerate() {
            let p = |n: &str| format!("blk.{i}.{n}");
            entries.push(e(p("attn_norm"), &[dim], an, None));
            entries.push(e(p("attn_q"), &[dim, dim], q, Some(heads)));
            entries.push(e(p("attn_k"), &[kvd, dim], k, Some(kv_heads)));
            entries.push(e(p("attn_v"), &[kvd, dim], v, None));
            entries.push(e(p("attn_o"), &[dim, dim], o, None));
            entries.push(e(p("ffn_norm"), &[dim], fnorm, None));
            entries.push(e(p("ffn_gate"), &[hidden, dim], gate, None));
            entries.push(e(p("ffn_up"), &[hidden, dim], up, None));
            entries.push(e(p("ffn_down"), &[dim, hidden], down, None));
        }
        entries.push(e("output_norm".into(), &[dim], norm, None));
        if let Some(out) = output {
            entries.push(e("output".into(), &[vocab, dim], out, None));
        }
        Ok(Llama2c { path, map, meta, entries, group: group as usize })
    }

    /// The `.mlb` model, converted by `opts`' rules.
    pub fn import(&self, opts: &ImportOptions) -> Result<Mlb, Fault> {
        self.with_tensors(|mut meta, plan| {
            meta.extend(conversion_metadata(opts));
            let (converted, infos) = convert(plan, 0, opts, &self.path)?;
            Mlb::assemble(Bytes::Owned(Vec::new()), converted, meta, infos, self.path.clone())
        })?
    }

    /// Whether `import(opts)` would make any tensor Q4_0 (from the names
    /// and shapes: nothing is dequantised or reordered).
    pub fn makes_q4(&self, opts: &ImportOptions) -> Result<bool, String> {
        Ok(convert::makes_q4_of_floats(self.entries.iter().map(|e| (e.name.as_str(), e.shape.as_slice())), opts))
    }

    /// `f` of the metadata and the tensors (the Q8_0 and interleaved ones
    /// as f32 made here, the others in the file).
    fn with_tensors<R>(&self, f: impl FnOnce(Vec<(String, MetaValue)>, &[SourceTensor]) -> R) -> Result<R, String> {
        let made: Vec<Option<Vec<u8>>> = self.entries.iter().map(|e| self.made(e)).collect();
        let plan: Vec<SourceTensor> = self
            .entries
            .iter()
            .zip(&made)
            .map(|(e, made)| SourceTensor {
                name: e.name.clone(),
                source_name: e.name.clone(),
                ty: GgmlType::F32,
                dims: e.shape.iter().rev().copied().collect(),
                bytes: match (made, &e.stored) {
                    (Some(bytes), _) => bytes,
                    (None, Stored::F32(range)) => &self.map[range.clone()],
                    (None, Stored::Q8 { .. }) => unreachable!("Q8 tensors are made"),
                },
                in_place: None,
            })
            .collect();
        check_shapes(&self.meta, &plan).map_err(|e| format!("{}: {e}", self.path))?;
        Ok(f(self.meta.clone(), &plan))
    }

    /// A tensor's f32 bytes when they are not the file's as they are: its
    /// Q8_0 values times their scales, and q/k rows out of the interleaved layout.
    fn made(&self, e: &Entry) -> Option<Vec<u8>> {
        let values: Vec<f32> = match &e.stored {
            Stored::F32(_) if e.interleaved_heads.is_none() => return None,
            Stored::F32(range) => {
                self.map[range.clone()].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4"))).collect()
            }
            Stored::Q8 { values, scales } => {
                let scales: Vec<f32> = self.map[scales.clone()]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4")))
                    .collect();
                let q = &self.map[values.clone()];
                q.iter().enumerate().map(|(i, &v)| v as i8 as f32 * scales[i / self.group]).collect()
            }
        };
        let values = match e.interleaved_heads {
            Some(heads) => half_layout(&values, heads, e.shape[1] as usize),
            None => values,
        };
        Some(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// Rows of `heads` heads in the interleaved RoPE layout (pairs 2i, 2i+1)
/// in the `half` layout (pairs i, i + head_dim/2), rows of `cols` values.
fn half_layout(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = w.len() / cols;
    let hd = rows / heads;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for p in 0..2 {
                let from = (h * hd + 2 * i + p) * cols;
                let to = (h * hd + p * (hd / 2) + i) * cols;
                out[to..to + cols].copy_from_slice(&w[from..from + cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_layout_moves_pairs_apart() {
        // one head of 4 rows: interleaved (a0 a1 b0 b1) → half (a0 b0 a1 b1)
        let w = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(half_layout(&w, 1, 1), [0.0, 2.0, 1.0, 3.0]);
        let two_heads = [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0];
        assert_eq!(half_layout(&two_heads, 2, 1), [0.0, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0]);
    }

    #[test]
    fn hostile_headers_are_one_line_errors() {
        let mut v0 = Vec::new();
        for x in [64i32, 128, 2, 4, 4, 100, 32] {
            v0.extend(x.to_le_bytes());
        }
        let err = |bytes: Vec<u8>| Llama2c::parse(Bytes::Owned(bytes), "t.bin".into()).err().unwrap();
        assert!(err(v0.clone()).contains("truncated"));
        assert!(err(v0[..20].to_vec()).contains("too small"));
        let mut huge = v0.clone();
        huge[8..12].copy_from_slice(&(1i32 << 30).to_le_bytes());
        assert!(err(huge).contains("implausible"));
        let mut bad_heads = v0.clone();
        bad_heads[12..16].copy_from_slice(&3i32.to_le_bytes());
        assert!(err(bad_heads).contains("head counts"));
        let mut versioned = MAGIC.to_le_bytes().to_vec();
        versioned.extend(7i32.to_le_bytes());
        versioned.resize(300, 0);
        assert!(err(versioned).contains("version 7"));
    }
}
