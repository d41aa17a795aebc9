//! A GGUF model as an `.mlb` model in memory: the metadata read through the
//! family table; the tensors of the types Krafla reads as they are (F32,
//! F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) left in the mapped file unless
//! `--requantize` or `--type` asks otherwise; the others (and those asked
//! for) converted on all threads, Q4_0 and bias-0 Q8_0 matrices straight
//! into eight-row groups where the build's kernels read them so. What a
//! loaded model then repacks for its kernels is `model/weights.rs`'s
//! choice. `--save` writes these tensors as an `.mlb` file.

use rayon::prelude::*;

use super::dequant::{dequantize, nonfinite_scale};
use super::families::{self, Family, FULL, SLIDING};
use super::mixed;
use super::quantize::{quantize_q4_0, quantize_q8_0, Q4Rule, BAND_ROWS};
use super::{ConvertType, ImportOptions};
use crate::fault::Fault;
use crate::format::gguf::{GgmlType, Gguf, Tensor, Value};
use crate::format::mlb::{converted_start, Layout, MetaValue, Mlb, TensorInfo, TensorType, DATA_ALIGN};
use crate::model::{groups_used_in_place, LIMIT_LAYERS};
use crate::quant::{all_finite, dequant_q4, interleave_q4_x8, interleave_q8_x8, BlockQ4_0, BlockQ8_0, QK, ROWS8};

/// GGUF per-layer tensor names (before `.weight` / `.bias`) → `.mlb` names.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm", "attn_norm"),
    ("attn_q", "attn_q"),
    ("attn_k", "attn_k"),
    ("attn_v", "attn_v"),
    ("attn_output", "attn_o"),
    ("attn_q_norm", "attn_q_norm"),
    ("attn_k_norm", "attn_k_norm"),
    ("ffn_norm", "ffn_norm"),
    ("ffn_gate", "ffn_gate"),
    ("ffn_up", "ffn_up"),
    ("ffn_down", "ffn_down"),
    ("post_attention_norm", "attn_post_norm"),
    ("post_ffw_norm", "ffn_post_norm"),
];

/// Tensors every layer has, and the ones Gemma layers add.
const REQUIRED: &[&str] = &[
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
];
const REQUIRED_GEMMA: &[&str] = &["post_attention_norm.weight", "post_ffw_norm.weight"];

/// Tensor kinds kept in Q8_0 by `q4_0` and `auto` (`convert.py`'s `Q4_0_Q8`).
const Q8_KINDS: &[&str] = &["token_embd", "output"];

/// The `.mlb` model of a GGUF file, converted by `opts`' rules.
pub fn import_model(g: Gguf, opts: &ImportOptions) -> Result<Mlb, Fault> {
    let ctype = opts.ctype;
    let path = g.path.clone();
    if ctype == ConvertType::Auto && opts.requantize {
        return Err(
            "--type auto chooses by the GGUF tensor types: it cannot --requantize them (give --type q8_0 or q4_0)"
                .into(),
        );
    }
    let (meta, heads) = metadata(&g, opts).map_err(|e| format!("{path}: {e}"))?;
    let plan = tensor_plan(&g, &heads).map_err(|e| format!("{path}: {e}"))?;
    check_shapes(&heads, &plan).map_err(|e| format!("{path}: {e}"))?;

    // Where each tensor goes: its bytes in the file, or converted into `converted`.
    let base = converted_start(g.file_len());
    let mut infos = Vec::with_capacity(plan.len());
    let mut jobs = Vec::new();
    let mut converted_total = 0usize;
    let mut types: Vec<TensorType> = plan
        .iter()
        .map(|(name, t)| {
            let dims: Vec<u64> = t.dims.iter().rev().copied().collect();
            choose_type(name, &dims, t.ty, ctype, opts.requantize)
        })
        .collect();
    if ctype == ConvertType::Q4Mixed {
        for i in mixed_q8(&g, &plan, &types, opts) {
            types[i] = TensorType::Q8_0;
        }
    }
    for ((name, t), &ttype) in plan.iter().zip(&types) {
        let dims: Vec<u64> = t.dims.iter().rev().copied().collect();
        let kept = kept_type(t.ty) == Some(ttype) && !opts.requantize;
        let layout = if !kept && made_in_groups(ttype, &dims) { Layout::Rows8 } else { Layout::Rows };
        let (start, len) = if kept {
            (t.start, t.len)
        } else {
            let len = converted_len(ttype, &dims).ok_or_else(|| format!("{path}: tensor {name:?} is too large"))?;
            let at = converted_total;
            converted_total = (at + len).next_multiple_of(DATA_ALIGN as usize);
            jobs.push((*t, ttype, layout, at, len, name.as_str()));
            (base + at, len)
        };
        infos.push(TensorInfo { name: name.clone(), ttype, layout, dims, start, len });
    }

    // zeroed by the allocator (fresh pages from the system: no pass over
    // them here), then written by the tasks on all threads
    let mut converted: Vec<u64> = bytemuck::allocation::try_zeroed_slice_box(converted_total / 8)
        .map_err(|_| Fault::Resource(format!("{path}: cannot allocate {converted_total} bytes")))?
        .into_vec();
    let mut tasks = Vec::new();
    let mut rest: &mut [u8] = bytemuck::cast_slice_mut(&mut converted);
    let mut pos = 0;
    for &(t, ttype, layout, at, len, name) in &jobs {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - pos);
        let (out, tail) = tail.split_at_mut(len);
        rest = tail;
        pos = at + len;
        let cols = t.dims[0] as usize;
        let rows = len / row_len(ttype, cols);
        let weights = match &opts.imatrix {
            Some(m) if ttype == TensorType::Q4_0 => Some(m.weights(name, cols).ok_or_else(|| {
                format!("the importance matrix has no entry for {name} of {cols} columns (made for another model?)")
            })?),
            _ => None,
        };
        let src = g.tensor_bytes(t);
        let (src_row, out_row) = (src.len() / rows, len / rows);
        // about 64 KiB of f32 a task, in whole bands of the Q4_0 quantiser's rows
        let chunk = (16384 / cols).max(1).next_multiple_of(BAND_ROWS);
        let groups = layout == Layout::Rows8;
        for (i, (s, o)) in src.chunks(chunk * src_row).zip(out.chunks_mut(chunk * out_row)).enumerate() {
            let first_value = i * chunk * cols;
            tasks.push((t.ty, ttype, cols, weights, groups, s, o, (t.name.as_str(), first_value)));
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

    Mlb::assemble(g.into_map(), converted, meta, infos, path)
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
fn mixed_q8(g: &Gguf, plan: &[(String, &Tensor)], types: &[TensorType], opts: &ImportOptions) -> Vec<usize> {
    let size =
        |ttype: TensorType, t: &Tensor| ttype.row_bytes(t.dims[0]).unwrap_or(0) * (t.n_elements() / t.dims[0].max(1));
    let total: u64 =
        plan.iter().zip(types).map(|((_, t), &ty)| if ty == TensorType::F32 { 0 } else { size(ty, t) }).sum();
    let q4: Vec<usize> = (0..plan.len()).filter(|&i| types[i] == TensorType::Q4_0).collect();
    let errors: Vec<f64> = q4
        .iter()
        .map(|&i| {
            let (name, t) = &plan[i];
            let cols = t.dims[0] as usize;
            let weights = opts.imatrix.as_ref().and_then(|m| m.weights(name, cols));
            q4_relative_error(t.ty, g.tensor_bytes(t), cols, opts.q4_rule, weights)
        })
        .collect();
    let candidates: Vec<mixed::Candidate> = q4
        .iter()
        .zip(&errors)
        .map(|(&i, &error)| {
            let (name, t) = &plan[i];
            let extra_bytes = size(TensorType::Q8_0, t) - size(TensorType::Q4_0, t);
            mixed::Candidate { kind: kind_of(name), error, extra_bytes }
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

/// Whether `import_model(g, opts)` would make any tensor Q4_0.
pub fn makes_q4(g: &Gguf, opts: &ImportOptions) -> Result<bool, String> {
    let path = &g.path;
    let (_, heads) = metadata(g, opts).map_err(|e| format!("{path}: {e}"))?;
    let plan = tensor_plan(g, &heads).map_err(|e| format!("{path}: {e}"))?;
    Ok(plan.iter().any(|(name, t)| {
        let dims: Vec<u64> = t.dims.iter().rev().copied().collect();
        choose_type(name, &dims, t.ty, opts.ctype, opts.requantize) == TensorType::Q4_0
    }))
}

/// The hyperparameters the tensor table needs.
struct Heads {
    family: &'static Family,
    n_layers: usize,
    meta: Vec<(String, MetaValue)>,
}

impl Heads {
    fn int(&self, key: &str) -> u64 {
        match self.meta.iter().find(|(k, _)| k == key) {
            Some((_, MetaValue::Int(v))) => *v as u64,
            _ => 0,
        }
    }
}

/// The `.mlb` metadata of a GGUF file, in `tools/source_gguf.py`'s order,
/// then `convert.py`'s `convert_type` and `convert_q4_scale`.
fn metadata(g: &Gguf, opts: &ImportOptions) -> Result<(Vec<(String, MetaValue)>, Heads), String> {
    let ctype = opts.ctype;
    let ga = g
        .get("general.architecture")
        .ok_or("missing general.architecture")?
        .as_str()
        .ok_or("general.architecture is not a string")?;
    let family = families::from_gguf(ga).ok_or_else(|| format!("unsupported architecture {ga:?}"))?;
    let key = |k: &str| format!("{ga}.{k}");
    let get = |k: &str| g.get(&key(k));
    // an integer, or the first of an array of them (per-layer counts)
    let int_of = |k: &str, v: Value| -> Result<u64, String> {
        let v = match v {
            Value::Array(a) => a.iter().next().ok_or_else(|| format!("{} is an empty array", key(k)))?,
            v => v,
        };
        v.as_i64().and_then(|i| u64::try_from(i).ok()).ok_or_else(|| format!("{} should be a count, not {v:?}", key(k)))
    };
    let int = |k: &str, default: Option<u64>| -> Result<u64, String> {
        match get(k) {
            Some(v) => int_of(k, v),
            None => default.ok_or_else(|| format!("GGUF lacks {}", key(k))),
        }
    };
    let float = |k: &str, default: f64| -> Result<f64, String> {
        match get(k) {
            Some(v) => v.as_f64().ok_or_else(|| format!("{} should be a number, not {v:?}", key(k))),
            None => Ok(default),
        }
    };
    let nonzero = |k: &str| -> Result<Option<f64>, String> { Ok(Some(float(k, 0.0)?).filter(|&v| v != 0.0)) };

    let d = int("embedding_length", None)?;
    let h = int("attention.head_count", None)?;
    let l = int("block_count", None)?;
    check_block_count(g, &key("block_count"), l)?;
    let hkv = int("attention.head_count_kv", Some(h))?;
    if h == 0 || d == 0 {
        return Err(format!("{} and {} must be positive", key("embedding_length"), key("attention.head_count")));
    }
    let hd = int("attention.key_length", Some(d / h))?;
    let f = int("feed_forward_length", None)?;
    let embd = g.tensor("token_embd.weight").ok_or("missing tensor token_embd.weight")?;
    let v = match int("vocab_size", Some(0))? {
        0 => *embd.dims.last().unwrap_or(&0),
        v => v,
    };
    let count = |v: u64| MetaValue::Int(v.min(i64::MAX as u64) as i64);
    let mut meta: Vec<(String, MetaValue)> = vec![
        ("arch".into(), MetaValue::Str(family.arch.into())),
        ("vocab_size".into(), count(v)),
        ("hidden_size".into(), count(d)),
        ("n_layers".into(), count(l)),
        ("n_heads".into(), count(h)),
        ("n_kv_heads".into(), count(hkv)),
        ("head_dim".into(), count(hd)),
        ("ffn_dim".into(), count(f)),
        ("context_length".into(), count(int("context_length", Some(2048))?)),
        ("norm_eps".into(), MetaValue::Float(float("attention.layer_norm_rms_epsilon", 1e-5)?)),
        ("rope_theta".into(), MetaValue::Float(float("rope.freq_base", 10000.0)?)),
        ("rope_style".into(), MetaValue::Str(if family.qk_permuted { "interleaved" } else { "half" }.into())),
    ];
    if let Some(v) = get("rope.dimension_count") {
        let rd = int_of("rope.dimension_count", v)?;
        if rd != hd {
            meta.push(("rope_dim".into(), count(rd)));
        }
    }
    if get("rope.scaling.type").and_then(|v| v.as_str()) == Some("linear") {
        if let Some(factor) = nonzero("rope.scaling.factor")? {
            meta.push(("rope_scaling".into(), MetaValue::Str("linear".into())));
            meta.push(("rope_scaling_factor".into(), MetaValue::Float(factor)));
        }
    }
    if let Some(t) = g.tensor("rope_freqs.weight") {
        // llama.cpp's form of llama3 RoPE scaling: one divisor per frequency
        meta.push(("rope_freq_factors".into(), MetaValue::FloatArray(rope_freq_factors(g, t)?)));
    }
    for (k, gk) in [("bos_id", "tokenizer.ggml.bos_token_id"), ("eos_id", "tokenizer.ggml.eos_token_id")] {
        if let Some(v) = g.get(gk) {
            let id = v.as_i64().ok_or_else(|| format!("{gk} should be an integer, not {v:?}"))?;
            meta.push((k.into(), MetaValue::Int(id)));
        }
    }
    meta.extend(family.traits(d).into_iter().map(|(k, v)| (k.to_string(), v)));

    // layer kinds: the file's own pattern if it has one, else the family's
    let n_layers = usize::try_from(l).map_err(|_| format!("{} {l} is too large", key("block_count")))?;
    let window = match get("attention.sliding_window") {
        Some(v) => Some(int_of("attention.sliding_window", v)?),
        None => None,
    };
    let kinds = match get("attention.sliding_window_pattern") {
        Some(Value::Array(a)) => {
            if a.len != n_layers {
                return Err(format!("{} has {} entries, not {l}", key("attention.sliding_window_pattern"), a.len));
            }
            let slides = |v: Value| v.as_bool().or(v.as_i64().map(|i| i != 0)).unwrap_or(false);
            Some(a.iter().map(|v| if slides(v) { SLIDING } else { FULL }).collect())
        }
        Some(v) => family.layer_kinds(n_layers, window, Some(int_of("attention.sliding_window_pattern", v)?)),
        None => family.layer_kinds(n_layers, window, None),
    };
    if let Some(kinds) = kinds.filter(|k: &Vec<i64>| k.iter().any(|&k| k != FULL)) {
        if let Some(w) = window.filter(|&w| w != 0) {
            meta.push(("sliding_window".into(), count(w)));
        }
        meta.push(("layer_kinds".into(), MetaValue::IntArray(kinds)));
    }
    if family.softcaps {
        if let Some(c) = nonzero("attn_logit_softcapping")? {
            meta.push(("attn_softcap".into(), MetaValue::Float(c)));
        }
        if let Some(c) = nonzero("final_logit_softcapping")? {
            meta.push(("final_softcap".into(), MetaValue::Float(c)));
        }
    }
    if let Some(theta) = family.local_rope_theta {
        meta.push(("rope_local_theta".into(), MetaValue::Float(theta)));
    }
    if family.gemma {
        // llama.cpp: query_pre_attn_scalar = head_dim
        meta.push(("query_scale".into(), MetaValue::Float(1.0 / (hd as f64).sqrt())));
    }
    let tied = g.tensor("output.weight").is_none();
    meta.push(("tie_embeddings".into(), MetaValue::Int(tied as i64)));
    meta.push(("convert_type".into(), MetaValue::Str(ctype.name().into())));
    if matches!(ctype, ConvertType::Q4_0 | ConvertType::Q4Mixed | ConvertType::Auto) {
        let weighted = opts.imatrix.is_some() && opts.q4_rule == Q4Rule::Fit;
        let rule = format!("{}{}", opts.q4_rule.name(), if weighted { "+imatrix" } else { "" });
        meta.push(("convert_q4_scale".into(), MetaValue::Str(rule)));
    }
    let heads = Heads { family, n_layers, meta: meta.clone() };
    Ok((meta, heads))
}

/// Refuses a layer count above what a model may have (the model config's
/// limit) or above the layers the file has tensors for, before anything is
/// made per layer: a 500-byte file must not ask for terabytes of layer
/// kinds by saying 2^40 layers. (A layer that lacks one of its tensors is
/// named by `tensor_plan`.)
fn check_block_count(g: &Gguf, key: &str, layers: u64) -> Result<(), String> {
    let limit = LIMIT_LAYERS as usize;
    if !(1..=limit as u64).contains(&layers) {
        return Err(format!("{key} = {layers} is outside 1..={limit}"));
    }
    let mut present = vec![false; limit];
    for t in &g.tensors {
        if let Some((i, _)) = layer_of(&t.name).filter(|&(i, _)| i < limit) {
            present[i] = true;
        }
    }
    let with_tensors = present.iter().filter(|&&p| p).count();
    if layers as usize > with_tensors {
        return Err(format!("{key} = {layers}, but the file has tensors for {with_tensors} layers"));
    }
    Ok(())
}

/// (N, rest) of a tensor named "blk.N.rest", N as Python's str(N) writes
/// it: no sign, no leading zeros.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let (i, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    if i.is_empty() || (i.len() > 1 && i.starts_with('0')) || !i.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((i.parse().ok()?, rest))
}

/// The tensors in `.mlb` order and names: `token_embd`, each layer's in
/// the sorted order of their GGUF names, `output_norm`, `output`.
fn tensor_plan<'g>(g: &'g Gguf, heads: &Heads) -> Result<Vec<(String, &'g Tensor)>, String> {
    let need = |name: &str| g.tensor(name).ok_or_else(|| format!("missing tensor {name}"));
    let mut plan = vec![("token_embd".to_string(), need("token_embd.weight")?)];
    // (at most as many layers as have tensors: `check_block_count`)
    let mut by_layer: Vec<Vec<(&str, &Tensor)>> = vec![Vec::new(); heads.n_layers];
    for t in &g.tensors {
        if let Some((layer, suffix)) = layer_of(&t.name).and_then(|(i, s)| Some((by_layer.get_mut(i)?, s))) {
            layer.push((suffix, t));
        }
    }
    let required = REQUIRED.iter().chain(if heads.family.gemma { REQUIRED_GEMMA } else { &[] });
    for (i, mut names) in by_layer.into_iter().enumerate() {
        for rq in required.clone() {
            if !names.iter().any(|(n, _)| n == rq) {
                return Err(format!("missing tensor blk.{i}.{rq}"));
            }
        }
        names.sort_by(|a, b| a.0.cmp(b.0));
        for (n, t) in names {
            let (base, kind) = n.rsplit_once('.').unwrap_or(("", n));
            let mapped = LAYER_NAMES.iter().find(|(g, _)| *g == base).map(|(_, m)| m);
            let (Some(mapped), "weight" | "bias") = (mapped, kind) else {
                return Err(format!("unexpected tensor blk.{i}.{n:?} for arch {}", heads.family.gguf_arch));
            };
            let bias = if kind == "bias" { "_bias" } else { "" };
            plan.push((format!("blk.{i}.{mapped}{bias}"), t));
        }
    }
    plan.push(("output_norm".to_string(), need("output_norm.weight")?));
    if let Some(t) = g.tensor("output.weight") {
        plan.push(("output".to_string(), t));
    }
    Ok(plan)
}

/// A tensor's kind: its `.mlb` name without `blk.N.`.
fn kind_of(name: &str) -> &str {
    match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((i, kind)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => kind,
        _ => name,
    }
}

/// Every tensor has the shape the hyperparameters give it (`convert.py`'s
/// `_check_shapes`).
fn check_shapes(heads: &Heads, plan: &[(String, &Tensor)]) -> Result<(), String> {
    let [d, v, f, h, hkv, hd] =
        ["hidden_size", "vocab_size", "ffn_dim", "n_heads", "n_kv_heads", "head_dim"].map(|k| heads.int(k));
    if hkv == 0 || h % hkv != 0 {
        return Err(format!("n_heads {h} not a multiple of n_kv_heads {hkv}"));
    }
    let (q, kv, o) = (h.saturating_mul(hd), hkv.saturating_mul(hd), h.saturating_mul(hd));
    for (name, t) in plan {
        let expect: &[u64] = match kind_of(name) {
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
            _ => continue,
        };
        let shape: Vec<u64> = t.dims.iter().rev().copied().collect();
        if shape != expect {
            return Err(format!("{name}: shape {shape:?}, expected {expect:?}"));
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
        _ => return None,
    })
}

/// The `.mlb` type of one tensor (`convert.py`'s `choose_type`): vectors in
/// F32; the types Krafla reads as they are (F32, F16, Q8_0, Q4_0, Q4_K,
/// Q5_K, Q6_K: used in place, whatever `ctype`); BF16 in F32 (exact); rows that
/// are not whole blocks in F16; then `q8_0` everything in Q8_0, `q4_0` and
/// `auto` the embeddings and output in Q8_0 and the rest in Q4_0, except
/// that `auto` keeps the other types of 5 bits a weight or more (Q5_0, Q5_1,
/// Q8_K) in Q8_0.
pub fn choose_type(name: &str, dims: &[u64], source: GgmlType, ctype: ConvertType, requantize: bool) -> TensorType {
    let kind = kind_of(name);
    if dims.len() != 2 || kind.ends_with("norm") || kind.ends_with("bias") || kind == "ssm_conv" {
        return TensorType::F32;
    }
    if let Some(t) = kept_type(source).filter(|_| !requantize) {
        return t;
    }
    if source == GgmlType::BF16 && !requantize {
        return TensorType::F32;
    }
    if ctype == ConvertType::F32 {
        return TensorType::F32;
    }
    if !dims[1].is_multiple_of(QK as u64) {
        return TensorType::F16;
    }
    let wide = matches!(source, GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8K);
    match ctype {
        ConvertType::F32 | ConvertType::Q8_0 => TensorType::Q8_0,
        _ if Q8_KINDS.contains(&kind) => TensorType::Q8_0,
        ConvertType::Auto if wide => TensorType::Q8_0,
        _ => TensorType::Q4_0,
    }
}

/// The values of llama.cpp's `rope_freqs` tensor (F32, one per rotated
/// pair; the model's config checks the count against its RoPE width).
fn rope_freq_factors(g: &Gguf, t: &Tensor) -> Result<Vec<f64>, String> {
    if t.ty != GgmlType::F32 || t.dims.len() != 1 {
        return Err(format!("rope_freqs.weight should be a vector of F32, not {:?} {:?}", t.ty, t.dims));
    }
    Ok(g.tensor_bytes(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect())
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
        TensorType::Q4K | TensorType::Q5K | TensorType::Q6K => unreachable!("K-quant tensors are kept, never encoded"),
    }
    debug_assert_eq!(x.len() % cols.max(1), 0);
}
