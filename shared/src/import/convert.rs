//! The conversion every source shares: a model's tensors, already named
//! and ordered as `.mlb` tensors (`gguf.rs`, `hf.rs` and `llama2c.rs` do
//! that), get their `.mlb` types by `--type`'s rules; the ones a source
//! lets stay as they are keep their place in the mapped file, the others
//! are converted on all threads, Q4_0 and Q8_0 matrices straight into
//! eight-row groups where the build's kernels read them so.

use rayon::prelude::*;

use super::dequant::{dequantize, nonfinite_scale};
use super::mixed;
use super::quantize::{quantize_q4_0, quantize_q8_0, Q4Rule, BAND_ROWS};
use super::{ConvertType, ImportOptions};
use crate::fault::Fault;
use crate::format::gguf::GgmlType;
use crate::format::mlb::{converted_start, Layout, MetaValue, TensorInfo, TensorType, DATA_ALIGN};
use crate::model::groups_used_in_place;
use crate::quant::{all_finite, dequant_q4, interleave_q4_x8, interleave_q8_x8, BlockQ4_0, BlockQ8_0, QK, ROWS8};

/// `.mlb` metadata, in order.
pub type Metadata = Vec<(String, MetaValue)>;

/// One tensor of a source model, as the `.mlb` model will have it.
pub struct SourceTensor<'a> {
    /// Its `.mlb` name (`blk.0.attn_q`).
    pub name: String,
    /// Its name in the source, for errors.
    pub source_name: String,
    /// Its element type in the source.
    pub ty: GgmlType,
    /// Innermost first (ggml's order): a [rows, cols] matrix is `[cols, rows]`.
    pub dims: Vec<u64>,
    pub bytes: &'a [u8],
    /// Where `bytes` start in the file the model keeps mapped, when it may
    /// be used there as it is (GGUF); None: always converted.
    pub in_place: Option<usize>,
}

impl SourceTensor<'_> {
    /// Rows first, as `.mlb` shapes are written.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Its type if it may stay as it is (`--requantize` keeps nothing).
    fn keepable(&self, opts: &ImportOptions) -> Option<GgmlType> {
        self.in_place.filter(|_| !opts.requantize).map(|_| self.ty)
    }
}

/// Tensor kinds kept in Q8_0 by `q4_0`, `q4_mixed` and `auto`.
const Q8_KINDS: &[&str] = &["token_embd", "output"];

/// The tensors of `plan` as `.mlb` tensors by `opts`' rules: their table
/// (kept ones where they lie in a source of `source_len` bytes, the others
/// in the returned converted data, which starts at
/// `converted_start(source_len)`).
pub fn convert(
    plan: &[SourceTensor],
    source_len: usize,
    opts: &ImportOptions,
    path: &str,
) -> Result<(Vec<u64>, Vec<TensorInfo>), Fault> {
    let ctype = opts.ctype;
    for t in plan {
        if !(1..=4).contains(&t.dims.len()) || t.dims.contains(&0) {
            return Err(format!("{path}: tensor {:?} has shape {:?}", t.source_name, t.shape()).into());
        }
    }
    // Where each tensor goes: its bytes in the file, or converted into `converted`.
    let base = converted_start(source_len);
    let mut infos = Vec::with_capacity(plan.len());
    let mut jobs = Vec::new();
    let mut converted_total = 0usize;
    let mut types: Vec<TensorType> =
        plan.iter().map(|t| choose_type(&t.name, &t.shape(), t.keepable(opts), ctype)).collect();
    if ctype == ConvertType::Q4Mixed {
        for i in mixed_q8(plan, &types, opts) {
            types[i] = TensorType::Q8_0;
        }
    }
    for (t, &ttype) in plan.iter().zip(&types) {
        let dims = t.shape();
        let kept = t.keepable(opts).and_then(kept_type) == Some(ttype);
        let layout = if !kept && made_in_groups(ttype, &dims) { Layout::Rows8 } else { Layout::Rows };
        let (start, len) = match t.in_place {
            Some(start) if kept => (start, t.bytes.len()),
            _ => {
                let len =
                    converted_len(ttype, &dims).ok_or_else(|| format!("{path}: tensor {:?} is too large", t.name))?;
                let at = converted_total;
                converted_total = (at + len).next_multiple_of(DATA_ALIGN as usize);
                jobs.push((t, ttype, layout, at, len));
                (base + at, len)
            }
        };
        infos.push(TensorInfo { name: t.name.clone(), ttype, layout, dims, start, len });
    }

    // zeroed by the allocator (fresh pages from the system: no pass over
    // them here), then written by the tasks on all threads
    let mut converted: Vec<u64> = bytemuck::allocation::try_zeroed_slice_box(converted_total / 8)
        .map_err(|_| Fault::Resource(format!("{path}: cannot allocate {converted_total} bytes")))?
        .into_vec();
    crate::quant::ask_for_huge_pages(&converted);
    let mut tasks = Vec::new();
    let mut rest: &mut [u8] = bytemuck::cast_slice_mut(&mut converted);
    let mut pos = 0;
    for &(t, ttype, layout, at, len) in &jobs {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - pos);
        let (out, tail) = tail.split_at_mut(len);
        rest = tail;
        pos = at + len;
        let cols = t.dims[0] as usize;
        let rows = len / row_len(ttype, cols);
        let name = t.name.as_str();
        let weights = match &opts.imatrix {
            Some(m) if ttype == TensorType::Q4_0 => Some(m.weights(name, cols).ok_or_else(|| {
                format!("the importance matrix has no entry for {name} of {cols} columns (made for another model?)")
            })?),
            _ => None,
        };
        let (src_row, out_row) = (t.bytes.len() / rows, len / rows);
        // about 64 KiB of f32 a task, in whole bands of the Q4_0 quantiser's rows
        let chunk = (16384 / cols).max(1).next_multiple_of(BAND_ROWS);
        let groups = layout == Layout::Rows8;
        for (i, (s, o)) in t.bytes.chunks(chunk * src_row).zip(out.chunks_mut(chunk * out_row)).enumerate() {
            let first_value = i * chunk * cols;
            tasks.push((t.ty, ttype, cols, weights, groups, s, o, (t.source_name.as_str(), first_value)));
        }
    }
    // each task's error, if any: the first in task order is the one told
    let errors: Vec<Option<String>> = tasks
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new()),
            |(buf, plain), (from, to, cols, weights, groups, src, out, (name, first_value))| {
                // a NaN or infinity would go into the blocks as garbage (the
                // quantisers pass NaN over), found by no later check: the
                // source's block scales, or its values if it has none
                let (block_values, block_bytes) = from.block();
                if let Some((b, d)) = nonfinite_scale(from, src) {
                    let b = first_value / block_values + b;
                    return Some(format!("tensor '{name}' has a non-finite scale ({d}) in block {b}"));
                }
                buf.resize(src.len() / block_bytes * block_values, 0.0);
                dequantize(from, src, buf);
                if let Some(i) = (block_values == 1).then(|| first_nonfinite(buf)).flatten() {
                    let at = first_value + i;
                    return Some(format!("tensor '{name}' has a non-finite value ({}) at element {at}", buf[i]));
                }
                // a task's rows start at a whole group: its groups, then (the
                // tensor's last task) the rows % 8 plain rows
                let encoded: &[u8] = if groups {
                    plain.resize(out.len().div_ceil(8), 0u64);
                    let plain = &mut bytemuck::cast_slice_mut::<u64, u8>(plain)[..out.len()];
                    encode(to, cols, buf, opts.q4_rule, weights, plain);
                    let row = to.row_bytes(cols as u64).unwrap_or(0) as usize;
                    let whole = out.len() / (ROWS8 * row) * ROWS8 * row;
                    let (head, tail) = out.split_at_mut(whole);
                    let nb = cols / QK;
                    match to {
                        TensorType::Q4_0 => interleave_q4_x8(cast(&plain[..whole]), nb, cast_mut(head)),
                        _ => interleave_q8_x8(cast(&plain[..whole]), nb, cast_mut(head)),
                    }
                    tail.copy_from_slice(&plain[whole..]);
                    plain
                } else {
                    encode(to, cols, buf, opts.q4_rule, weights, out);
                    out
                };
                too_large(to, encoded, first_value).map(|e| format!("tensor '{name}' has {e}"))
            },
        )
        .collect();
    if let Some(e) = errors.into_iter().flatten().next() {
        return Err(format!("{path}: {e}").into());
    }
    Ok((converted, infos))
}

/// Whether `convert` would make any tensor of `plan` Q4_0.
pub fn makes_q4(plan: &[SourceTensor], opts: &ImportOptions) -> bool {
    plan.iter().any(|t| choose_type(&t.name, &t.shape(), t.keepable(opts), opts.ctype) == TensorType::Q4_0)
}

/// Whether a source that keeps nothing in place (floats: safetensors,
/// llama2.c) would have any of its tensors, by `.mlb` name and shape
/// (rows first), made Q4_0: decided before any bytes are read or made.
pub fn makes_q4_of_floats<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [u64])>, opts: &ImportOptions) -> bool {
    tensors.into_iter().any(|(name, shape)| choose_type(name, shape, None, opts.ctype) == TensorType::Q4_0)
}

/// The metadata `convert` adds after the source's: `convert_type`, and
/// for the Q4_0 types how their scales were chosen.
pub fn conversion_metadata(opts: &ImportOptions) -> Metadata {
    let ctype = opts.ctype;
    let mut meta = vec![("convert_type".to_string(), MetaValue::Str(ctype.name().into()))];
    if matches!(ctype, ConvertType::Q4_0 | ConvertType::Q4Mixed | ConvertType::Auto) {
        let weighted = opts.imatrix.is_some() && opts.q4_rule == Q4Rule::Fit;
        let rule = format!("{}{}", opts.q4_rule.name(), if weighted { "+imatrix" } else { "" });
        meta.push(("convert_q4_scale".into(), MetaValue::Str(rule)));
    }
    meta
}

/// The index of the first value of `x` that is NaN or infinite.
fn first_nonfinite(x: &[f32]) -> Option<usize> {
    // (the vectorised pass first: most often the only one)
    if all_finite(x) {
        return None;
    }
    x.iter().position(|v| !v.is_finite())
}

/// Where finite values encoded as `ttype` (plain rows, the first of them
/// value `first_value` of the tensor) did not fit its f16 fields: the
/// first block whose scale, or (F16) the first value, overflowed.
fn too_large(ttype: TensorType, encoded: &[u8], first_value: usize) -> Option<String> {
    let block = |b: usize| {
        format!("values too large for {} (its f16 scale overflows) in block {}", ttype.name(), first_value / QK + b)
    };
    match ttype {
        // (llama.cpp's layouts: the GGML types' own)
        TensorType::Q8_0 => nonfinite_scale(GgmlType::Q8_0, encoded).map(|(b, _)| block(b)),
        TensorType::Q4_0 => nonfinite_scale(GgmlType::Q4_0, encoded).map(|(b, _)| block(b)),
        TensorType::F16 => {
            let values = cast::<half::f16>(encoded);
            let i = values.iter().position(|v| !v.is_finite())?;
            Some(format!("a value too large for f16 at element {}", first_value + i))
        }
        _ => None,
    }
}

/// Whether a Q4_0 or Q8_0 matrix this import makes goes straight into
/// the eight-row groups of the `rows8` layout (docs/FORMAT.md): where the
/// loaded model would use such groups as they lie
/// (`model::groups_used_in_place`, the loader's own rule) and the matrix has
/// eight rows or more. `Model::from_mlb` would otherwise copy the plain rows
/// into groups; made so, a converted matrix is held once, not twice, and
/// `--save` writes the same bytes (the file layout is the same).
fn made_in_groups(ttype: TensorType, dims: &[u64]) -> bool {
    let writes_groups = matches!(ttype, TensorType::Q4_0 | TensorType::Q8_0); // (the writers this import has)
    writes_groups && groups_used_in_place(ttype) && matches!(dims, [rows, _] if *rows >= ROWS8 as u64)
}

fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> &[T] {
    bytemuck::cast_slice(bytes)
}

fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> &mut [T] {
    bytemuck::cast_slice_mut(bytes)
}

/// `q4_mixed`: the indices in `plan` of the Q4_0 tensors that go to Q8_0
/// (`mixed::choose_q8`, the budget a share of the weights' bytes).
fn mixed_q8(plan: &[SourceTensor], types: &[TensorType], opts: &ImportOptions) -> Vec<usize> {
    let size = |ttype: TensorType, t: &SourceTensor| {
        ttype.row_bytes(t.dims[0]).unwrap_or(0) * (t.n_elements() / t.dims[0].max(1))
    };
    let total: u64 = plan.iter().zip(types).map(|(t, &ty)| if ty == TensorType::F32 { 0 } else { size(ty, t) }).sum();
    let q4: Vec<usize> = (0..plan.len()).filter(|&i| types[i] == TensorType::Q4_0).collect();
    let errors: Vec<f64> = q4
        .iter()
        .map(|&i| {
            let t = &plan[i];
            let cols = t.dims[0] as usize;
            let weights = opts.imatrix.as_ref().and_then(|m| m.weights(&t.name, cols));
            q4_relative_error(t.ty, t.bytes, cols, opts.q4_rule, weights)
        })
        .collect();
    let candidates: Vec<mixed::Candidate> = q4
        .iter()
        .zip(&errors)
        .map(|(&i, &error)| {
            let t = &plan[i];
            let extra_bytes = size(TensorType::Q8_0, t) - size(TensorType::Q4_0, t);
            mixed::Candidate { kind: kind_of(&t.name), error, extra_bytes }
        })
        .collect();
    let budget = (total as f64 * opts.mixed_budget) as u64;
    mixed::choose_q8(&candidates, budget).into_iter().map(|c| q4[c]).collect()
}

/// Σ w_j (x − x̂)² / Σ w_j x² of a tensor's Q4_0 blocks x̂ (w: the column
/// importances, or 1), in f64, chunks of rows on all threads.
fn q4_relative_error(ty: GgmlType, src: &[u8], cols: usize, rule: Q4Rule, weights: Option<&[f32]>) -> f64 {
    let (block_elems, block_bytes) = ty.block();
    let row_bytes = cols / block_elems * block_bytes;
    let rows = (16384 / cols).max(1).next_multiple_of(BAND_ROWS);
    let parts: Vec<(f64, f64)> = src
        .par_chunks(rows * row_bytes)
        .map(|chunk| {
            let mut x = vec![0.0f32; chunk.len() / block_bytes * block_elems];
            dequantize(ty, chunk, &mut x);
            let mut q = vec![BlockQ4_0::default(); x.len() / QK];
            quantize_q4_0(&x, cols, rule, weights, &mut q);
            let mut y = vec![0.0f32; x.len()];
            dequant_q4(&q, &mut y);
            let (mut err, mut sig) = (0.0f64, 0.0f64);
            for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                let w = weights.map_or(1.0, |w| w[i % cols]) as f64;
                err += w * (a as f64 - b as f64).powi(2);
                sig += w * (a as f64).powi(2);
            }
            (err, sig)
        })
        .collect();
    // summed in chunk order: the same bits whatever the threads
    let (err, sig) = parts.iter().fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    if sig > 0.0 && err.is_finite() {
        err / sig
    } else {
        0.0
    }
}

/// A tensor's kind: its `.mlb` name without `blk.N.`.
pub fn kind_of(name: &str) -> &str {
    match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((i, kind)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => kind,
        _ => name,
    }
}

/// Every tensor has the shape the hyperparameters in `meta` give it.
pub fn check_shapes(meta: &[(String, MetaValue)], plan: &[SourceTensor]) -> Result<(), String> {
    let int = |key: &str| match meta.iter().find(|(k, _)| k == key) {
        Some((_, MetaValue::Int(v))) => *v as u64,
        _ => 0,
    };
    let [d, v, f, h, hkv, hd] = ["hidden_size", "vocab_size", "ffn_dim", "n_heads", "n_kv_heads", "head_dim"].map(int);
    let [e, fe, fs] = ["n_experts", "expert_ffn_dim", "shared_expert_ffn_dim"].map(int);
    if hkv == 0 || h % hkv != 0 {
        return Err(format!("n_heads {h} not a multiple of n_kv_heads {hkv}"));
    }
    // (a gated attention output doubles q's rows: the gate's half)
    let q = h.saturating_mul(hd).saturating_mul(if int("attn_output_gate") == 1 { 2 } else { 1 });
    let (kv, o) = (hkv.saturating_mul(hd), h.saturating_mul(hd));
    for t in plan {
        let expect: &[u64] = match kind_of(&t.name) {
            "token_embd" | "output" => &[v, d],
            "output_norm" | "attn_norm" | "ffn_norm" | "attn_post_norm" | "ffn_post_norm" => &[d],
            "attn_q" => &[q, d],
            "attn_k" | "attn_v" => &[kv, d],
            "attn_o" => &[d, o],
            "attn_q_norm" | "attn_k_norm" => &[hd],
            "attn_q_bias" => &[q],
            "attn_k_bias" | "attn_v_bias" => &[kv],
            "ffn_gate" | "ffn_up" => &[f, d],
            "ffn_down" => &[d, f],
            "ffn_gate_inp" => &[e, d],
            "ffn_gate_exps" | "ffn_up_exps" => &[e.saturating_mul(fe), d],
            "ffn_down_exps" => &[e.saturating_mul(d), fe],
            "ffn_gate_shexp" | "ffn_up_shexp" => &[fs, d],
            "ffn_down_shexp" => &[d, fs],
            "ffn_gate_inp_shexp" => &[1, d],
            _ => continue,
        };
        let shape = t.shape();
        if shape != expect {
            return Err(format!("{}: shape {shape:?}, expected {expect:?}", t.name));
        }
    }
    Ok(())
}

/// The `.mlb` type a GGUF type is used as, unchanged, if there is one.
fn kept_type(ty: GgmlType) -> Option<TensorType> {
    Some(match ty {
        GgmlType::F32 => TensorType::F32,
        GgmlType::F16 => TensorType::F16,
        GgmlType::Q8_0 => TensorType::Q8_0,
        GgmlType::Q4_0 => TensorType::Q4_0,
        GgmlType::Q4K => TensorType::Q4K,
        GgmlType::Q5K => TensorType::Q5K,
        GgmlType::Q6K => TensorType::Q6K,
        GgmlType::Mxfp4 => TensorType::Mxfp4,
        _ => return None,
    })
}

/// The `.mlb` type of one tensor of shape `dims` (rows first): vectors and
/// the experts' routers in F32; a tensor that may stay as it is (`keepable`: its source type) in
/// the types Krafla reads as they are (F32, F16, Q8_0, Q4_0, Q4_K, Q5_K,
/// Q6_K: used in place, whatever `ctype`), or from BF16 in F32 (exact);
/// `f32` and `f16` every matrix in that type; rows that are not whole
/// blocks in F16; then `q8_0` everything in Q8_0,
/// `q4_0` and `auto` the embeddings and output in Q8_0 and the rest in
/// Q4_0, except that `auto` keeps the other types of 5 bits a weight or
/// more (Q5_0, Q5_1, Q8_K) in Q8_0.
pub fn choose_type(name: &str, dims: &[u64], keepable: Option<GgmlType>, ctype: ConvertType) -> TensorType {
    let kind = kind_of(name);
    // (the routers too: small, and what they choose should not move with the weights' type)
    if dims.len() != 2
        || kind.ends_with("norm")
        || kind.ends_with("bias")
        || kind == "ssm_conv"
        || kind.starts_with("ffn_gate_inp")
    {
        return TensorType::F32;
    }
    if let Some(t) = keepable.and_then(kept_type) {
        return t;
    }
    if keepable == Some(GgmlType::BF16) {
        return TensorType::F32;
    }
    match ctype {
        ConvertType::F32 => return TensorType::F32,
        ConvertType::F16 => return TensorType::F16,
        _ => {}
    }
    if !dims[1].is_multiple_of(QK as u64) {
        return TensorType::F16;
    }
    let wide = matches!(keepable, Some(GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8K));
    match ctype {
        ConvertType::F32 | ConvertType::F16 | ConvertType::Q8_0 => TensorType::Q8_0,
        _ if Q8_KINDS.contains(&kind) => TensorType::Q8_0,
        ConvertType::Auto if wide => TensorType::Q8_0,
        _ => TensorType::Q4_0,
    }
}

/// Bytes of one row of `cols` elements of a type the loader converts to.
fn row_len(ttype: TensorType, cols: usize) -> usize {
    ttype.row_bytes(cols as u64).unwrap_or(0) as usize
}

/// Bytes of a converted tensor, if they fit in memory.
fn converted_len(ttype: TensorType, dims: &[u64]) -> Option<usize> {
    let (&cols, outer) = dims.split_last()?;
    let size = outer.iter().try_fold(ttype.row_bytes(cols)?, |acc, &d| acc.checked_mul(d))?;
    usize::try_from(size).ok().filter(|&s| s <= isize::MAX as usize / 2)
}

/// Rows of `cols` floats `x` encoded as `ttype` into `out`.
fn encode(ttype: TensorType, cols: usize, x: &[f32], rule: Q4Rule, weights: Option<&[f32]>, out: &mut [u8]) {
    match ttype {
        TensorType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        TensorType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        TensorType::Q8_0 => quantize_q8_0(x, bytemuck::cast_slice_mut::<u8, BlockQ8_0>(out)),
        TensorType::Q4_0 => quantize_q4_0(x, cols, rule, weights, bytemuck::cast_slice_mut::<u8, BlockQ4_0>(out)),
        TensorType::Q8_0F32 | TensorType::Q4_0F32 => unreachable!("choose_type never picks f32 scales"),
        TensorType::Q4K | TensorType::Q5K | TensorType::Q6K | TensorType::Mxfp4 => {
            unreachable!("K-quant and MXFP4 tensors are kept, never encoded")
        }
    }
    debug_assert_eq!(x.len() % cols.max(1), 0);
}
