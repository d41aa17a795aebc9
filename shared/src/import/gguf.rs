//! A GGUF model as an `.mlb` model in memory: the metadata read through the
//! family table, the tensors named and ordered as `.mlb` tensors, then
//! `convert.rs`: the tensors of the types Krafla reads as they are (F32,
//! F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) stay in the mapped file unless
//! `--requantize` asks otherwise; the others are converted. What a loaded
//! model then repacks for its kernels is `model/weights.rs`'s choice.
//! `--save` writes these tensors as an `.mlb` file.

use super::convert::{self, check_shapes, conversion_metadata, convert, Metadata, SourceTensor};
use super::families::{self, Family, FULL, LINEAR, SLIDING};
use super::{ConvertType, ImportOptions};
use crate::fault::Fault;
use crate::format::gguf::{GgmlType, Gguf, Tensor, Value};
use crate::format::mlb::{MetaValue, Mlb};
use crate::model::LIMIT_LAYERS;

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
    ("ffn_gate_inp", "ffn_gate_inp"),
    ("ffn_gate_exps", "ffn_gate_exps"),
    ("ffn_up_exps", "ffn_up_exps"),
    ("ffn_down_exps", "ffn_down_exps"),
    ("ffn_gate_shexp", "ffn_gate_shexp"),
    ("ffn_up_shexp", "ffn_up_shexp"),
    ("ffn_down_shexp", "ffn_down_shexp"),
    ("ffn_gate_inp_shexp", "ffn_gate_inp_shexp"),
    ("attn_sinks", "attn_sinks"),
];

/// Tensors every layer has (`.mlb` names), then those of its mixer
/// (attention, or Gated DeltaNet: a layer with `ssm_out`), of its
/// feed-forward block (dense, or experts: a layer with a router), and the
/// ones Gemma layers add.
const REQUIRED: &[&str] = &["attn_norm", "ffn_norm"];
const REQUIRED_ATTENTION: &[&str] = &["attn_q", "attn_k", "attn_v", "attn_o"];
const REQUIRED_LINEAR: &[&str] =
    &["ssm_qkv", "ssm_z", "ssm_a", "ssm_b", "ssm_conv", "ssm_dt_bias", "ssm_a_neg_exp", "ssm_norm", "ssm_out"];
const REQUIRED_DENSE: &[&str] = &["ffn_gate", "ffn_up", "ffn_down"];
const REQUIRED_EXPERTS: &[&str] = &["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];
const REQUIRED_GEMMA: &[&str] = &["attn_post_norm", "ffn_post_norm"];

/// Fused matrices (Phi-3's) and the `.mlb` matrices their rows are, in
/// order: q, k, v; gate, up.
const FUSED: &[(&str, &[&str])] = &[("attn_qkv", &["attn_q", "attn_k", "attn_v"]), ("ffn_up", &["ffn_gate", "ffn_up"])];

/// Gated DeltaNet families' GGUF names (llama.cpp's Qwen3.5) → `.mlb` names;
/// their pre-feed-forward norm is `post_attention_norm`.
const LINEAR_NAMES: &[(&str, &str)] = &[
    ("attn_qkv", "ssm_qkv"),
    ("attn_gate", "ssm_z"),
    ("ssm_alpha", "ssm_a"),
    ("ssm_beta", "ssm_b"),
    ("ssm_conv1d", "ssm_conv"),
    ("ssm_dt", "ssm_dt"),
    ("ssm_a", "ssm_a_neg_exp"),
    ("ssm_norm", "ssm_norm"),
    ("ssm_out", "ssm_out"),
    ("post_attention_norm", "ffn_norm"),
];

/// gpt-oss's GGUF names that mean something else in other families: its
/// pre-feed-forward norm is `post_attention_norm`.
const OAI_NAMES: &[(&str, &str)] = &[("post_attention_norm", "ffn_norm")];

/// The family's own GGUF → `.mlb` names, looked up before `LAYER_NAMES`.
fn family_names(family: &Family) -> &'static [(&'static str, &'static str)] {
    if family.linear_attention {
        LINEAR_NAMES
    } else if family.oai_moe {
        OAI_NAMES
    } else {
        &[]
    }
}

/// The `.mlb` model of a GGUF file, converted by `opts`' rules.
pub fn import_model(g: Gguf, opts: &ImportOptions) -> Result<Mlb, Fault> {
    let path = g.path.clone();
    if opts.ctype == ConvertType::Auto && opts.requantize {
        return Err(
            "--type auto chooses by the GGUF tensor types: it cannot --requantize them (give --type q8_0 or q4_0)"
                .into(),
        );
    }
    let (mut meta, plan) = source(&g).map_err(|e| format!("{path}: {e}"))?;
    meta.extend(conversion_metadata(opts));
    let (converted, infos) = convert(&plan, g.file_len(), opts, &path)?;
    drop(plan);
    Mlb::assemble(g.into_map(), converted, meta, infos, path)
}

/// Whether `import_model(g, opts)` would make any tensor Q4_0.
pub fn makes_q4(g: &Gguf, opts: &ImportOptions) -> Result<bool, String> {
    let (_, plan) = source(g).map_err(|e| format!("{}: {e}", g.path))?;
    Ok(convert::makes_q4(&plan, opts))
}

/// The file's `.mlb` metadata and its tensors in `.mlb` order and names,
/// their shapes checked.
fn source(g: &Gguf) -> Result<(Metadata, Vec<SourceTensor<'_>>), String> {
    let (meta, heads) = metadata(g)?;
    let plan = tensor_plan(g, &heads)?;
    let mut out = Vec::with_capacity(plan.len());
    for (name, t, part) in plan {
        let (dims, bytes, start) = match part {
            None => (stacked_matrix(&t.dims), g.tensor_bytes(t), t.start),
            // rows r0 .. r0 + n of a fused matrix (plain rows: a byte range of it)
            Some((r0, n)) => {
                let (values, block) = t.ty.block();
                let cols = t.dims[0] as usize;
                let row = cols / values * block;
                let whole = g.tensor_bytes(t);
                let (from, len) = (r0 as usize * row, n as usize * row);
                if t.dims.len() != 2 || !cols.is_multiple_of(values) || from + len > whole.len() {
                    return Err(format!("{}: shape {:?} cannot be split into rows {r0}..{}", t.name, t.dims, r0 + n));
                }
                (vec![t.dims[0], n], &whole[from..from + len], t.start + from)
            }
        };
        out.push(SourceTensor { name, source_name: t.name.clone(), ty: t.ty, dims, bytes, in_place: Some(start) });
    }
    let plan = out;
    check_shapes(&meta, &plan)?;
    Ok((meta, plan))
}

/// A tensor of matrices stacked along its outer dimensions (the experts'
/// [cols, rows, experts], ggml order) as the one matrix of all their rows,
/// as `.mlb` stores it; other shapes as they are.
fn stacked_matrix(dims: &[u64]) -> Vec<u64> {
    match dims {
        [cols, rows, outer @ ..] if !outer.is_empty() => {
            vec![*cols, outer.iter().try_fold(*rows, |a, &b| a.checked_mul(b)).unwrap_or(u64::MAX)]
        }
        _ => dims.to_vec(),
    }
}

/// The hyperparameters the tensor table needs.
struct Heads {
    family: &'static Family,
    n_layers: usize,
    /// Rows of q, of k and of v, and of the feed-forward's gate and up
    /// (the parts of fused matrices).
    q_rows: u64,
    kv_rows: u64,
    ffn_rows: u64,
}

/// The `.mlb` metadata of a GGUF file, in `tools/source_gguf.py`'s order,
/// before what the conversion adds.
fn metadata(g: &Gguf) -> Result<(Vec<(String, MetaValue)>, Heads), String> {
    let ga = g
        .get("general.architecture")
        .ok_or("missing general.architecture")?
        .as_str()
        .ok_or("general.architecture is not a string")?;
    let family = families::from_gguf(ga).ok_or_else(|| {
        let known: Vec<&str> = families::FAMILIES.iter().map(|f| f.gguf_arch).filter(|a| !a.is_empty()).collect();
        format!("unsupported architecture {ga:?} (supported: {})", known.join(", "))
    })?;
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
    // (a model whose every layer has experts may give only their width)
    let f = match get("feed_forward_length") {
        Some(_) => int("feed_forward_length", None)?,
        None => {
            int("expert_feed_forward_length", None).map_err(|_| format!("GGUF lacks {}", key("feed_forward_length")))?
        }
    };
    let embd = g.tensor("token_embd.weight").ok_or("missing tensor token_embd.weight")?;
    let v = match int("vocab_size", Some(0))? {
        0 => *embd.dims.last().unwrap_or(&0),
        v => v,
    };
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
    match get("rope.scaling.type").and_then(|v| v.as_str()) {
        Some("linear") => {
            if let Some(factor) = nonzero("rope.scaling.factor")? {
                meta.push(("rope_scaling".into(), MetaValue::Str("linear".into())));
                meta.push(("rope_scaling_factor".into(), MetaValue::Float(factor)));
            }
        }
        // (llama.cpp's own YaRN keys; its attention factor 0.1·ln(factor) + 1 is the model's default)
        Some("yarn") => {
            meta.push(("rope_scaling".into(), MetaValue::Str("yarn".into())));
            meta.push(("rope_scaling_factor".into(), MetaValue::Float(float("rope.scaling.factor", 1.0)?)));
            meta.push(("rope_original_context".into(), count(int("rope.scaling.original_context_length", None)?)));
            meta.push(("rope_yarn_beta_fast".into(), MetaValue::Float(float("rope.scaling.yarn_beta_fast", 32.0)?)));
            meta.push(("rope_yarn_beta_slow".into(), MetaValue::Float(float("rope.scaling.yarn_beta_slow", 1.0)?)));
            if family.oai_moe {
                meta.push(("rope_yarn_truncate".into(), MetaValue::Int(0)));
            }
        }
        _ => {}
    }
    if let Some(t) = g.tensor("rope_freqs.weight") {
        // llama.cpp's form of llama3 RoPE scaling: one divisor per frequency
        meta.push(("rope_freq_factors".into(), MetaValue::FloatArray(rope_freq_factors(g, t)?)));
    }
    // LongRoPE (Phi-3): the short factors, and the long ones for a context above the original
    if let (Some(short), Some(long)) = (g.tensor("rope_factors_short.weight"), g.tensor("rope_factors_long.weight")) {
        meta.push(("rope_freq_factors".into(), MetaValue::FloatArray(rope_freq_factors(g, short)?)));
        meta.push(("rope_freq_factors_long".into(), MetaValue::FloatArray(rope_freq_factors(g, long)?)));
        let original = int("rope.scaling.original_context_length", None)?;
        meta.push(("rope_long_context".into(), count(original)));
    }
    if let Some(attn) = nonzero("rope.scaling.attn_factor")? {
        // (llama.cpp multiplies YaRN's own factor by it)
        let yarn = match get("rope.scaling.type").and_then(|v| v.as_str()) {
            Some("yarn") => {
                Some(float("rope.scaling.factor", 1.0)?).filter(|&f| f > 1.0).map_or(1.0, |f| 0.1 * f.ln() + 1.0)
            }
            _ => 1.0,
        };
        meta.push(("rope_attn_factor".into(), MetaValue::Float(attn * yarn)));
    }
    for (k, gk) in [("bos_id", "tokenizer.ggml.bos_token_id"), ("eos_id", "tokenizer.ggml.eos_token_id")] {
        if let Some(v) = g.get(gk) {
            let id = v.as_i64().ok_or_else(|| format!("{gk} should be an integer, not {v:?}"))?;
            meta.push((k.into(), MetaValue::Int(id)));
        }
    }
    meta.extend(family.traits(d, true).into_iter().map(|(k, v)| (k.to_string(), v)));
    meta.extend(experts_metadata(g, ga, family, f)?);

    // layer kinds: the file's own pattern if it has one, else the family's
    let n_layers = usize::try_from(l).map_err(|_| format!("{} {l} is too large", key("block_count")))?;
    if family.linear_attention {
        meta.extend(linear_metadata(g, ga, n_layers)?);
    }
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
        Some(v) => family.layer_kinds(n_layers, window, Some(int_of("attention.sliding_window_pattern", v)?), None),
        None => family.layer_kinds(n_layers, window, None, None),
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
    // how embeddings pool (llama.cpp's numbers: 1 mean, 2 cls, 3 last); none or rank: unset
    if let Some(v) = get("pooling_type") {
        if let Some(p) = crate::model::Pooling::from_gguf(int_of("pooling_type", v)? as i64) {
            meta.push(("pooling".into(), MetaValue::Int(p.gguf_number())));
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
    let heads = Heads { family, n_layers, q_rows: h.saturating_mul(hd), kv_rows: hkv.saturating_mul(hd), ffn_rows: f };
    Ok((meta, heads))
}

/// A count as `.mlb` metadata (an int; beyond i64, i64::MAX, for the
/// model's limits to refuse).
fn count(v: u64) -> MetaValue {
    MetaValue::Int(v.min(i64::MAX as u64) as i64)
}

/// The count at GGUF key `{ga}.{k}`, or `default` when it is absent.
fn key_count(g: &Gguf, ga: &str, k: &str, default: Option<u64>) -> Result<u64, String> {
    match g.get(&format!("{ga}.{k}")) {
        Some(v) => v
            .as_i64()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| format!("{ga}.{k} should be a count, not {v:?}")),
        None => default.ok_or_else(|| format!("GGUF lacks {ga}.{k}")),
    }
}

/// The Gated DeltaNet metadata of a llama.cpp Qwen3.5 file: the heads'
/// shapes (`ssm.*`), which layers are linear (`attention.recurrent_layers`,
/// else every `full_attention_interval`-th layer is full), and the value
/// heads' tiled order (llama.cpp reorders them when there are more value
/// heads than key heads).
fn linear_metadata(g: &Gguf, ga: &str, n_layers: usize) -> Result<Metadata, String> {
    let int = |k: &str| key_count(g, ga, k, None);
    let (nk, nv, dk, inner) =
        (int("ssm.group_count")?, int("ssm.time_step_rank")?, int("ssm.state_size")?, int("ssm.inner_size")?);
    if nk == 0 || nv == 0 || !nv.is_multiple_of(nk) || !inner.is_multiple_of(nv) {
        return Err(format!("{ga}.ssm: {nv} value heads of {inner} channels for {nk} key heads do not divide"));
    }
    let kinds: Vec<i64> = match g.get(&format!("{ga}.attention.recurrent_layers")) {
        Some(Value::Array(a)) if a.len == n_layers => {
            a.iter().map(|v| if v.as_bool().unwrap_or(false) { LINEAR } else { FULL }).collect()
        }
        Some(v) => return Err(format!("{ga}.attention.recurrent_layers should list {n_layers} layers, not {v:?}")),
        None => {
            let every = int("full_attention_interval")?.max(1) as usize;
            (0..n_layers).map(|i| if (i + 1) % every == 0 { FULL } else { LINEAR }).collect()
        }
    };
    Ok(vec![
        ("linear_n_k_heads".into(), count(nk)),
        ("linear_n_v_heads".into(), count(nv)),
        ("linear_k_head_dim".into(), count(dk)),
        ("linear_v_head_dim".into(), count(inner / nv)),
        ("linear_conv_kernel".into(), count(int("ssm.conv_kernel")?)),
        ("linear_v_tiled".into(), MetaValue::Int((nk != nv) as i64)),
        ("layer_kinds".into(), MetaValue::IntArray(kinds)),
    ])
}

/// The Mixture-of-Experts metadata of a GGUF file with `expert_count` > 0
/// (`f`: its dense feed-forward width), none without.
fn experts_metadata(g: &Gguf, ga: &str, family: &Family, f: u64) -> Result<Metadata, String> {
    let get = |k: &str| g.get(&format!("{ga}.{k}"));
    let int = |k: &str, default: Option<u64>| key_count(g, ga, k, default);
    let n = int("expert_count", Some(0))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut m: Metadata = vec![
        ("n_experts".into(), count(n)),
        ("n_experts_used".into(), count(int("expert_used_count", None)?)),
        ("expert_ffn_dim".into(), count(int("expert_feed_forward_length", Some(f))?)),
    ];
    if get("expert_shared_feed_forward_length").is_some() {
        m.push(("shared_expert_ffn_dim".into(), count(int("expert_shared_feed_forward_length", None)?)));
    }
    // llama.cpp's gating function (1 softmax, 3 softmax of the chosen) and normalisation
    match get("expert_gating_func").map(|v| v.as_i64()) {
        // (llama.cpp fixes gpt-oss's: the top k logits, then their softmax)
        None if family.oai_moe => m.push(("expert_gating".into(), MetaValue::Str("softmax_selected".into()))),
        None | Some(Some(1)) => {}
        Some(Some(3)) => m.push(("expert_gating".into(), MetaValue::Str("softmax_selected".into()))),
        Some(v) => return Err(format!("unsupported expert_gating_func {v:?} (Krafla has softmax, 1, and 3)")),
    }
    let norm = match get("expert_weights_norm") {
        Some(v) => v.as_bool().ok_or_else(|| format!("expert_weights_norm should be a boolean, not {v:?}"))?,
        None => family.expert_weights_norm,
    };
    m.push(("expert_weights_norm".into(), MetaValue::Int(norm as i64)));
    if let Some(v) = get("expert_weights_scale") {
        let scale = v.as_f64().ok_or_else(|| format!("expert_weights_scale should be a number, not {v:?}"))?;
        if scale != 0.0 && scale != 1.0 {
            return Err(format!("expert_weights_scale {scale} is not supported yet"));
        }
    }
    Ok(m)
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
/// A planned tensor: its `.mlb` name, the GGUF tensor, and which rows of
/// it (first, count) when it is part of a fused one.
type Planned<'g> = (String, &'g Tensor, Option<(u64, u64)>);

fn tensor_plan<'g>(g: &'g Gguf, heads: &Heads) -> Result<Vec<Planned<'g>>, String> {
    let need = |name: &str| g.tensor(name).ok_or_else(|| format!("missing tensor {name}"));
    let mut plan = vec![("token_embd".to_string(), need("token_embd.weight")?, None)];
    // (at most as many layers as have tensors: `check_block_count`)
    let mut by_layer: Vec<Vec<(&str, &Tensor)>> = vec![Vec::new(); heads.n_layers];
    for t in &g.tensors {
        if let Some((layer, suffix)) = layer_of(&t.name).and_then(|(i, s)| Some((by_layer.get_mut(i)?, s))) {
            layer.push((suffix, t));
        }
    }
    let family = heads.family;
    let gemma = if family.gemma { REQUIRED_GEMMA } else { &[] };
    for (i, mut names) in by_layer.into_iter().enumerate() {
        names.sort_by(|a, b| a.0.cmp(b.0));
        let mut mapped_names: Vec<Planned> = Vec::with_capacity(names.len());
        for (n, t) in names {
            // (llama.cpp's Qwen3.5 `ssm_a` has no `.weight`)
            let (base, kind) = n.rsplit_once('.').unwrap_or((n, "weight"));
            if let Some((_, parts)) = FUSED.iter().find(|(f, _)| family.fused && *f == base && kind == "weight") {
                let rows = match parts.len() {
                    3 => [heads.q_rows, heads.kv_rows, heads.kv_rows].to_vec(),
                    _ => [heads.ffn_rows, heads.ffn_rows].to_vec(),
                };
                let mut r0 = 0u64;
                for (part, n) in parts.iter().zip(rows) {
                    mapped_names.push((part.to_string(), t, Some((r0, n))));
                    r0 = r0.saturating_add(n);
                }
                continue;
            }
            let linear = family_names(family);
            let mapped = linear.iter().chain(LAYER_NAMES).find(|(g, _)| *g == base).map(|(_, m)| m);
            let (Some(mapped), "weight" | "bias") = (mapped, kind) else {
                return Err(format!("unexpected tensor blk.{i}.{n:?} for arch {}", family.gguf_arch));
            };
            let bias = if kind == "bias" { "_bias" } else { "" };
            mapped_names.push((format!("{mapped}{bias}"), t, None));
        }
        let has = |name: &str| mapped_names.iter().any(|(n, _, _)| n == name);
        let mixer = if has("ssm_out") { REQUIRED_LINEAR } else { REQUIRED_ATTENTION };
        let ffn = if has("ffn_gate_inp") { REQUIRED_EXPERTS } else { REQUIRED_DENSE };
        for rq in REQUIRED.iter().chain(mixer).chain(ffn).chain(gemma) {
            if !has(rq) {
                return Err(format!("missing tensor blk.{i}.{}", gguf_name(family, rq)));
            }
        }
        plan.extend(mapped_names.into_iter().map(|(n, t, part)| (format!("blk.{i}.{n}"), t, part)));
    }
    plan.push(("output_norm".to_string(), need("output_norm.weight")?, None));
    if let Some(t) = g.tensor("output.weight") {
        plan.push(("output".to_string(), t, None));
    }
    Ok(plan)
}

/// The GGUF name of a layer tensor's `.mlb` name in `family` (for errors).
fn gguf_name(family: &Family, mlb: &str) -> String {
    let linear = family_names(family);
    let (base, suffix) = match mlb.strip_suffix("_bias") {
        Some(base) => (base, ".bias"),
        None if mlb == "ssm_a_neg_exp" => (mlb, ""),
        None => (mlb, ".weight"),
    };
    let gguf = linear.iter().chain(LAYER_NAMES).find(|(_, m)| *m == base).map_or(base, |(g, _)| g);
    format!("{gguf}{suffix}")
}

/// The values of llama.cpp's `rope_freqs` tensor (F32, one per rotated
/// pair; the model's config checks the count against its RoPE width).
fn rope_freq_factors(g: &Gguf, t: &Tensor) -> Result<Vec<f64>, String> {
    if t.ty != GgmlType::F32 || t.dims.len() != 1 {
        return Err(format!("{} should be a vector of F32, not {:?} {:?}", t.name, t.ty, t.dims));
    }
    Ok(g.tensor_bytes(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect())
}
