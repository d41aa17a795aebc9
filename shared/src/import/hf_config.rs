//! A Hugging Face `config.json` as `.mlb` metadata: the family from its
//! `model_type` (or `architectures`), then what varies per model. Both of
//! transformers' forms are read: v4's `rope_theta` + `rope_scaling` and
//! v5's `rope_parameters` (per layer type or not); a multimodal wrapper's
//! `text_config` is unwrapped.

use serde_json::{Map, Value};

use super::families::{self, Family, Layers, FULL, LINEAR, SLIDING};
use crate::format::mlb::MetaValue;
use crate::model::LIMIT_LAYERS;

/// What config.json says about a model.
pub struct HfConfig {
    pub family: &'static Family,
    /// `.mlb` metadata in order, up to (not including) `tie_embeddings`.
    pub meta: Vec<(String, MetaValue)>,
    /// `tie_word_embeddings`, when the config says.
    pub tie: Option<bool>,
}

impl HfConfig {
    pub fn int(&self, key: &str) -> i64 {
        match self.meta.iter().find(|(k, _)| k == key) {
            Some((_, MetaValue::Int(v))) => *v,
            _ => 0,
        }
    }

    pub fn layer_kinds(&self) -> Option<&[i64]> {
        match self.meta.iter().find(|(k, _)| k == "layer_kinds") {
            Some((_, MetaValue::IntArray(v))) => Some(v),
            _ => None,
        }
    }
}

/// RoPE parameters of one kind of layer (v4 `rope_scaling` or v5
/// `rope_parameters`).
#[derive(Default)]
struct Rope {
    theta: Option<f64>,
    /// `linear` or `llama3`, with its factor.
    scaling: Option<(&'static str, f64)>,
    /// llama3's low and high frequency factors and original context.
    llama3: Option<(f64, f64, i64)>,
    partial: Option<f64>,
}

/// A JSON value is "set" as Python's truthiness says: not null, false, 0, "" or empty.
fn truthy(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    })
}

fn number(key: &str, v: &Value) -> Result<f64, String> {
    v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("config.json: {key} should be a number, not {v}"))
}

/// A whole number (written as an integer or as a float with no fraction).
fn integer(key: &str, v: &Value) -> Result<i64, String> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Ok(x as i64),
        _ => Err(format!("config.json: {key} should be an integer, not {v}")),
    }
}

/// A count: a whole number from 1 to 2^31.
fn count(key: &str, v: &Value) -> Result<i64, String> {
    let n = integer(key, v)?;
    if !(1..=1 << 31).contains(&n) {
        return Err(format!("config.json: {key} = {n} is outside 1..=2147483648"));
    }
    Ok(n)
}

fn rope_block(p: &Map<String, Value>) -> Result<Rope, String> {
    let mut out = Rope::default();
    if let Some(t) = p.get("rope_theta").filter(|v| !v.is_null()) {
        out.theta = Some(number("rope_theta", t)?);
    }
    let kind = truthy(p.get("rope_type").or(p.get("type"))).map_or(Ok("default"), |v| {
        v.as_str().ok_or_else(|| format!("config.json: rope_type should be a string, not {v}"))
    })?;
    let kind = match kind {
        "default" => None,
        "linear" => Some("linear"),
        "llama3" => Some("llama3"),
        other => return Err(format!("unsupported rope_type {other:?}")),
    };
    let get = |k: &str, default: f64| p.get(k).filter(|v| !v.is_null()).map_or(Ok(default), |v| number(k, v));
    if let Some(kind) = kind {
        out.scaling = Some((kind, get("factor", 1.0)?));
        if kind == "llama3" {
            let orig = match p.get("original_max_position_embeddings").filter(|v| !v.is_null()) {
                Some(v) => count("original_max_position_embeddings", v)?,
                None => 8192,
            };
            out.llama3 = Some((get("low_freq_factor", 1.0)?, get("high_freq_factor", 4.0)?, orig));
        }
    }
    if let Some(v) = p.get("partial_rotary_factor").filter(|v| !v.is_null()) {
        out.partial = Some(number("partial_rotary_factor", v)?);
    }
    Ok(out)
}

fn object<'a>(key: &str, v: &'a Value) -> Result<&'a Map<String, Value>, String> {
    v.as_object().ok_or_else(|| format!("config.json: {key} should be an object"))
}

/// config.json's text → the model's family and `.mlb` metadata.
pub fn parse(text: &str) -> Result<HfConfig, String> {
    let top: Value = serde_json::from_str(text).map_err(|e| format!("config.json: {e}"))?;
    let top = object("the file", &top)?;
    let mut cfg = top.clone();
    if let Some(Value::Object(text_config)) = top.get("text_config") {
        cfg = text_config.clone();
        if !cfg.contains_key("tie_word_embeddings") {
            if let Some(v) = top.get("tie_word_embeddings") {
                cfg.insert("tie_word_embeddings".into(), v.clone());
            }
        }
    }
    let get = |k: &str| cfg.get(k).filter(|v| !v.is_null());
    let model_type = get("model_type").and_then(|v| v.as_str());
    let classes: Vec<&str> = get("architectures")
        .and_then(|v| v.as_array())
        .map_or(Vec::new(), |a| a.iter().filter_map(|c| c.as_str()).collect());
    let family = families::from_hf(model_type, &classes).ok_or_else(|| {
        let name = model_type.map(str::to_string).unwrap_or_else(|| classes.join(","));
        let known: Vec<&str> = families::FAMILIES.iter().flat_map(|f| f.hf_model_types.iter().copied()).collect();
        format!(
            "unsupported architecture {:?} (supported model_types: {})",
            if name.is_empty() { "unknown" } else { &name },
            known.join(", ")
        )
    })?;
    let required = |k: &str| get(k).ok_or_else(|| format!("config.json lacks {k:?}"));
    let or = |k: &str, default: i64| truthy(cfg.get(k)).map_or(Ok(default), |v| count(k, v));

    let d = count("hidden_size", required("hidden_size")?)?;
    let h = count("num_attention_heads", required("num_attention_heads")?)?;
    let l = count("num_hidden_layers", required("num_hidden_layers")?)?;
    if l > LIMIT_LAYERS {
        return Err(format!("config.json: num_hidden_layers = {l} is outside 1..={LIMIT_LAYERS}"));
    }
    let n_layers = l as usize;
    let hkv = or("num_key_value_heads", h)?;
    let hd = or("head_dim", d / h)?;
    let eps = truthy(cfg.get("rms_norm_eps")).map_or(Ok(1e-6), |v| number("rms_norm_eps", v))?;
    let mut meta: Vec<(String, MetaValue)> = vec![
        ("arch".into(), MetaValue::Str(family.arch.into())),
        ("vocab_size".into(), MetaValue::Int(count("vocab_size", required("vocab_size")?)?)),
        ("hidden_size".into(), MetaValue::Int(d)),
        ("n_layers".into(), MetaValue::Int(l)),
        ("n_heads".into(), MetaValue::Int(h)),
        ("n_kv_heads".into(), MetaValue::Int(hkv)),
        ("head_dim".into(), MetaValue::Int(hd)),
        ("ffn_dim".into(), MetaValue::Int(count("intermediate_size", required("intermediate_size")?)?)),
        ("context_length".into(), MetaValue::Int(or("max_position_embeddings", 2048)?)),
        ("norm_eps".into(), MetaValue::Float(eps)),
    ];

    // RoPE: v5 rope_parameters (per layer type or not), else v4's keys
    let (global, local) = match get("rope_parameters") {
        Some(Value::Object(rp)) if rp.values().any(Value::is_object) => {
            let full = match truthy(rp.get("full_attention")) {
                Some(v) => rope_block(object("rope_parameters.full_attention", v)?)?,
                None => Rope::default(),
            };
            let local = match rp.get("sliding_attention") {
                Some(v) => Some(rope_block(object("rope_parameters.sliding_attention", v)?)?),
                None => None,
            };
            (full, local)
        }
        Some(Value::Object(rp)) => (rope_block(rp)?, None),
        _ => {
            let mut global = match truthy(cfg.get("rope_scaling")) {
                Some(v) => rope_block(object("rope_scaling", v)?)?,
                None => Rope::default(),
            };
            if let Some(v) = get("rope_theta") {
                global.theta = Some(number("rope_theta", v)?);
            }
            if let Some(v) = get("partial_rotary_factor") {
                global.partial = Some(number("partial_rotary_factor", v)?);
            }
            let local = match get("rope_local_base_freq") {
                Some(v) => Some(Rope { theta: Some(number("rope_local_base_freq", v)?), ..Rope::default() }),
                None => None,
            };
            (global, local)
        }
    };
    meta.push(("rope_theta".into(), MetaValue::Float(global.theta.unwrap_or(10000.0))));
    if let Some(theta) = local.and_then(|l| l.theta) {
        meta.push(("rope_local_theta".into(), MetaValue::Float(theta)));
    }
    if let Some((kind, factor)) = global.scaling {
        meta.push(("rope_scaling".into(), MetaValue::Str(kind.into())));
        meta.push(("rope_scaling_factor".into(), MetaValue::Float(factor)));
        if let Some((low, high, orig)) = global.llama3 {
            meta.push(("rope_low_freq_factor".into(), MetaValue::Float(low)));
            meta.push(("rope_high_freq_factor".into(), MetaValue::Float(high)));
            meta.push(("rope_original_context".into(), MetaValue::Int(orig)));
        }
    }
    if let Some(partial) = global.partial.filter(|&p| p != 1.0) {
        // (Python's round: ties to even)
        meta.push(("rope_dim".into(), MetaValue::Int((hd as f64 * partial).round_ties_even() as i64)));
    }
    meta.push(("rope_style".into(), MetaValue::Str("half".into())));

    // layer kinds and sliding window: the config's own list, else the family's pattern
    let mut window = truthy(cfg.get("sliding_window"));
    if matches!(family.layers, Layers::WindowFrom) && truthy(cfg.get("use_sliding_window")).is_none() {
        window = None; // Qwen2 configs carry a sliding_window they do not use
    }
    let window_value = window.map(|v| count("sliding_window", v)).transpose()?.map(|w| w as u64);
    let kinds = match truthy(cfg.get("layer_types")) {
        Some(v) => {
            let list = v.as_array().ok_or("config.json: layer_types should be a list")?;
            if list.len() != n_layers {
                return Err("layer_types length differs from num_hidden_layers".into());
            }
            let kinds = list
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(FULL),
                    Some("sliding_attention") => Ok(SLIDING),
                    Some("linear_attention") => Ok(LINEAR),
                    _ => Err(format!("unsupported layer type {t}")),
                })
                .collect::<Result<Vec<i64>, String>>()?;
            if matches!(family.layers, Layers::Window) && window.is_some() && kinds.iter().all(|&k| k == FULL) {
                // Mistral slides everywhere, whatever layer_types says
                family.layer_kinds(n_layers, window_value, None, None)
            } else {
                Some(kinds)
            }
        }
        None => {
            let period = truthy(cfg.get("sliding_window_pattern"))
                .or(truthy(cfg.get("_sliding_window_pattern")))
                .map(|v| integer("sliding_window_pattern", v).map(|p| p.max(0) as u64))
                .transpose()?;
            let from = truthy(cfg.get("max_window_layers"))
                .map(|v| integer("max_window_layers", v).map(|p| p.max(0) as u64))
                .transpose()?;
            family.layer_kinds(n_layers, window_value, period, from)
        }
    };
    if let Some(kinds) = &kinds {
        if kinds.contains(&SLIDING) {
            let w = truthy(cfg.get("sliding_window"))
                .ok_or("sliding-window layers but no sliding_window in config.json")?;
            meta.push(("sliding_window".into(), MetaValue::Int(count("sliding_window", w)?)));
        }
        if kinds.iter().any(|&k| k != FULL) {
            meta.push(("layer_kinds".into(), MetaValue::IntArray(kinds.clone())));
        }
    }

    // NoPE layers (SmolLM3)
    if family.nope_layers {
        let listed = match get("no_rope_layers") {
            Some(v) => Some(
                v.as_array()
                    .ok_or("config.json: no_rope_layers should be a list")?
                    .iter()
                    .map(|x| integer("no_rope_layers", x))
                    .collect::<Result<Vec<i64>, String>>()?,
            ),
            None => match truthy(cfg.get("no_rope_layer_interval")) {
                Some(v) => {
                    let every = count("no_rope_layer_interval", v)? as usize;
                    Some((0..n_layers).map(|i| if (i + 1) % every == 0 { 0 } else { 1 }).collect())
                }
                None => None,
            },
        };
        if let Some(rope) = listed {
            if rope.len() != n_layers {
                return Err("no_rope_layers length differs from num_hidden_layers".into());
            }
            meta.push(("layer_rope".into(), MetaValue::IntArray(rope)));
        }
    }

    // the family's traits, then what the config says within the family
    meta.extend(family.traits(d as u64, false).into_iter().map(|(k, v)| (k.to_string(), v)));
    if family.gemma {
        if let Some(v) = truthy(cfg.get("query_pre_attn_scalar")) {
            meta.push(("query_scale".into(), MetaValue::Float(number("query_pre_attn_scalar", v)?.powf(-0.5))));
        }
        for (k, ck) in [("attn_softcap", "attn_logit_softcapping"), ("final_softcap", "final_logit_softcapping")] {
            if let Some(v) = truthy(cfg.get(ck)) {
                meta.push((k.into(), MetaValue::Float(number(ck, v)?)));
            }
        }
    } else {
        let act = truthy(cfg.get("hidden_act")).or(truthy(cfg.get("hidden_activation")));
        let act = act.map_or(Some("silu"), |v| v.as_str());
        if !matches!(act, Some("silu" | "swish")) {
            return Err(format!(
                "unsupported hidden_act {}",
                act.map_or("(not a string)".into(), |a| format!("{a:?}"))
            ));
        }
    }
    if family.linear_attention {
        for (k, ck) in [
            ("linear_n_k_heads", "linear_num_key_heads"),
            ("linear_n_v_heads", "linear_num_value_heads"),
            ("linear_k_head_dim", "linear_key_head_dim"),
            ("linear_v_head_dim", "linear_value_head_dim"),
            ("linear_conv_kernel", "linear_conv_kernel_dim"),
        ] {
            if let Some(v) = get(ck) {
                meta.push((k.into(), MetaValue::Int(integer(ck, v)?)));
            }
        }
    }
    for (k, ck) in [("bos_id", "bos_token_id"), ("eos_id", "eos_token_id")] {
        let v = match get(ck) {
            Some(Value::Array(a)) => a.first(),
            v => v,
        };
        if let Some(id) = v.and_then(Value::as_i64) {
            meta.push((k.into(), MetaValue::Int(id)));
        }
    }
    let tie = get("tie_word_embeddings").and_then(Value::as_bool);
    Ok(HfConfig { family, meta, tie })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(json: &str) -> Vec<(String, MetaValue)> {
        parse(json).unwrap().meta
    }

    fn value<'a>(m: &'a [(String, MetaValue)], key: &str) -> Option<&'a MetaValue> {
        m.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    const LLAMA: &str = r#""model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 128"#;

    #[test]
    fn v4_and_v5_rope_forms_give_the_same_metadata() {
        let v4 = meta(&format!(
            r#"{{{LLAMA}, "rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
        ));
        let v5 = meta(&format!(
            r#"{{{LLAMA}, "rope_parameters": {{"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
        ));
        assert_eq!(v4, v5);
        assert_eq!(value(&v4, "rope_scaling"), Some(&MetaValue::Str("llama3".into())));
        assert_eq!(value(&v4, "rope_original_context"), Some(&MetaValue::Int(8192)));
    }

    #[test]
    fn partial_rotary_rounds_ties_to_even() {
        // head_dim 16 × 0.40625 = 6.5 → 6 (Python's round), not 7
        let m = meta(&format!(r#"{{{LLAMA}, "partial_rotary_factor": 0.40625}}"#));
        assert_eq!(value(&m, "rope_dim"), Some(&MetaValue::Int(6)));
    }

    #[test]
    fn qwen2_windows_slide_from_max_window_layers_only_when_used() {
        let base = r#""model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 4, "vocab_size": 100, "intermediate_size": 128, "sliding_window": 32"#;
        let unused = meta(&format!("{{{base}, \"max_window_layers\": 2}}"));
        assert_eq!(value(&unused, "layer_kinds"), None);
        let used = meta(&format!("{{{base}, \"max_window_layers\": 2, \"use_sliding_window\": true}}"));
        assert_eq!(value(&used, "layer_kinds"), Some(&MetaValue::IntArray(vec![0, 0, 1, 1])));
        assert_eq!(value(&used, "sliding_window"), Some(&MetaValue::Int(32)));
    }

    #[test]
    fn bad_configs_are_one_line_errors() {
        for (json, want) in [
            (r#"{"model_type": "bert"}"#, "unsupported architecture \"bert\""),
            (r#"{"model_type": "llama"}"#, "lacks \"hidden_size\""),
            ("[1]", "should be an object"),
            (&format!(r#"{{{LLAMA}, "rope_scaling": {{"type": "yarn"}}}}"#), "unsupported rope_type \"yarn\""),
            (&format!(r#"{{{LLAMA}, "hidden_act": "gelu"}}"#), "unsupported hidden_act \"gelu\""),
            (&format!(r#"{{{LLAMA}, "layer_types": ["full_attention"]}}"#), "layer_types length"),
            (
                r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1000000000000,
                "vocab_size": 100, "intermediate_size": 128}"#,
                "num_hidden_layers",
            ),
            (r#"{"model_type": "llama", "hidden_size": -5}"#, "hidden_size = -5"),
        ] {
            let e = parse(json).err().unwrap_or_else(|| panic!("{json} was accepted"));
            assert!(e.contains(want), "{e:?} lacks {want:?}");
            assert!(!e.contains('\n'));
        }
    }
}
