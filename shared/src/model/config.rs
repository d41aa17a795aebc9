//! The hyperparameters of a model, read from its `.mlb` metadata
//! (docs/FORMAT.md) and checked, plus the RoPE frequencies they imply.

use crate::format::mlb::Mlb;

/// What a layer's mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal attention over every earlier position.
    Full,
    /// Causal attention over the last `sliding_window` positions.
    Sliding,
    /// Gated DeltaNet linear attention (Qwen3.5; deltanet.rs).
    DeltaNet,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Silu,
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, ±limit),
    /// (u + 1)·g·sigmoid(alpha·g).
    SwigluOai {
        alpha: f32,
        limit: f32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (i, i + d/2): Hugging Face / NeoX layout.
    Half,
    /// Pairs (2i, 2i + 1): original Llama / llama2.c layout.
    Interleaved,
}

/// Hyperparameters read from the file's metadata (docs/FORMAT.md).
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub context_length: usize,
    pub norm_eps: f32,
    pub norm_unit_offset: bool,
    pub norm_sandwich: bool,
    pub embed_scale: f32,
    pub tie_embeddings: bool,
    pub activation: Activation,
    pub rope_style: RopeStyle,
    pub rope_dim: usize,
    /// Inverse frequencies for full-attention layers (scaling applied).
    pub inv_freq_global: Vec<f32>,
    /// Inverse frequencies for sliding-window layers.
    pub inv_freq_local: Vec<f32>,
    /// LongRoPE (Phi-3): the global frequencies of a sequence whose context
    /// is above `rope_long_context`, each divided by its long factor
    /// (`inv_freq_global` holds the short factors').
    pub inv_freq_long: Option<Vec<f32>>,
    pub rope_long_context: usize,
    /// Multiplies cos and sin (LongRoPE's attention factor): the rotated
    /// dims of q and k are scaled by it.
    pub rope_attn_factor: f32,
    pub layer_kinds: Vec<LayerKind>,
    pub layer_rope: Vec<bool>,
    pub sliding_window: usize,
    pub query_scale: f32,
    pub attn_softcap: f32,
    pub final_softcap: f32,
    pub qk_norm: bool,
    pub attn_output_gate: bool,
    /// Gated DeltaNet dimensions (zero when the model has no such layers).
    pub deltanet: DeltaNetDims,
    /// Mixture-of-Experts routing (no experts: every layer dense).
    pub moe: MoeConfig,
    /// How embeddings pool, where the file says (GGUF `pooling_type`).
    pub pooling: Option<super::Pooling>,
}

/// How a Mixture-of-Experts layer weighs its experts for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExpertGating {
    /// Softmax over every expert's router logit, then the top k
    /// probabilities (Qwen-MoE, Mixtral).
    #[default]
    Softmax,
    /// The top k router logits, then a softmax over those k (gpt-oss).
    SoftmaxSelected,
}

/// Mixture-of-Experts hyperparameters: a layer with a router
/// (`ffn_gate_inp`) sends each token to `n_used` of its `n_experts`
/// feed-forward blocks and sums their outputs by the router's weights.
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub n_used: usize,
    /// Rows of each expert's gate and up matrices.
    pub expert_ffn_dim: usize,
    /// Rows of the shared expert's gate and up matrices (0: none).
    pub shared_ffn_dim: usize,
    pub gating: ExpertGating,
    /// The k weights divided by their sum.
    pub norm_weights: bool,
}

/// Shapes of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeltaNetDims {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
    /// Value heads in llama.cpp's tiled order (head j uses key head j mod
    /// n_k_heads), not grouped by key head (j / (n_v_heads / n_k_heads)).
    pub v_tiled: bool,
}

impl DeltaNetDims {
    /// Channels of the fused q|k|v projection and of the convolution.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.k_head_dim + self.n_v_heads * self.v_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.v_head_dim
    }
}

const LIMIT_VOCAB: i64 = 1 << 24;

const LIMIT_WIDTH: i64 = 1 << 17;

/// The most layers a model may have (a GGUF's `block_count` is checked
/// against it before anything is made per layer).
pub const LIMIT_LAYERS: i64 = 1024;

const LIMIT_HEADS: i64 = 4096;

const LIMIT_CONTEXT: i64 = 1 << 24;

const LIMIT_EXPERTS: i64 = 4096;

impl Config {
    pub fn from_mlb(f: &Mlb) -> Result<Config, String> {
        let p = &f.path;
        let int = |key: &str, lo: i64, hi: i64| -> Result<usize, String> {
            let v = f.require_int(key)?;
            if v < lo || v > hi {
                return Err(format!("{p}: metadata '{key}' = {v} is outside {lo}..={hi}"));
            }
            Ok(v as usize)
        };
        let opt_int = |key: &str, default: i64| -> Result<i64, String> { Ok(f.get_int(key)?.unwrap_or(default)) };
        let opt_float = |key: &str, default: f64| -> Result<f64, String> { Ok(f.get_float(key)?.unwrap_or(default)) };
        // every optional number below has its range (docs/FORMAT.md), checked here
        let flag = |key: &str| -> Result<bool, String> {
            match opt_int(key, 0)? {
                0 => Ok(false),
                1 => Ok(true),
                v => Err(format!("{p}: metadata '{key}' = {v} must be 0 or 1")),
            }
        };
        let float_in = |key: &str, default: f64, valid: fn(f64) -> bool, what: &str| -> Result<f64, String> {
            let v = opt_float(key, default)?;
            if v.is_finite() && valid(v) {
                Ok(v)
            } else {
                Err(format!("{p}: metadata '{key}' = {v} must be {what}"))
            }
        };
        let positive = |v: f64| v > 0.0;

        let arch_name = f.require_str("arch")?.to_string();
        const KNOWN: [&str; 14] = [
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "smollm3",
            "gemma2",
            "gemma3",
            "qwen3_5",
            "llama2c",
            "qwen2moe",
            "qwen3moe",
            "qwen3_5_moe",
            "phi3",
            "gpt_oss",
        ];
        if !KNOWN.contains(&arch_name.as_str()) {
            return Err(format!("{p}: unknown architecture '{arch_name}'"));
        }
        let vocab_size = int("vocab_size", 1, LIMIT_VOCAB)?;
        let hidden_size = int("hidden_size", 1, LIMIT_WIDTH)?;
        let n_layers = int("n_layers", 1, LIMIT_LAYERS)?;
        let n_heads = int("n_heads", 1, LIMIT_HEADS)?;
        let n_kv_heads = int("n_kv_heads", 1, LIMIT_HEADS)?;
        let head_dim = int("head_dim", 2, 4096)?;
        let ffn_dim = int("ffn_dim", 1, LIMIT_WIDTH * 8)?;
        let context_length = int("context_length", 1, LIMIT_CONTEXT)?;
        let norm_eps = f.require_float("norm_eps")?;
        if n_heads % n_kv_heads != 0 {
            return Err(format!("{p}: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}"));
        }
        if !(norm_eps > 0.0 && norm_eps <= 1.0) {
            return Err(format!("{p}: metadata 'norm_eps' = {norm_eps} must be a number above 0 and at most 1"));
        }

        let activation = match f.get_str("ffn_act")?.unwrap_or("silu") {
            "silu" => Activation::Silu,
            "gelu_tanh" => Activation::GeluTanh,
            "swiglu_oai" => Activation::SwigluOai {
                alpha: float_in("swiglu_alpha", 1.702, positive, "a positive number")? as f32,
                limit: float_in("swiglu_limit", 7.0, positive, "a positive number")? as f32,
            },
            other => return Err(format!("{p}: unknown ffn_act '{other}'")),
        };
        let rope_style = match f.get_str("rope_style")?.unwrap_or("half") {
            "half" => RopeStyle::Half,
            "interleaved" => RopeStyle::Interleaved,
            other => return Err(format!("{p}: unknown rope_style '{other}'")),
        };
        let rope_dim = opt_int("rope_dim", head_dim as i64)?;
        if rope_dim < 2 || rope_dim > head_dim as i64 || rope_dim % 2 != 0 {
            return Err(format!("{p}: rope_dim {rope_dim} must be even and within 2..={head_dim}"));
        }
        let rope_dim = rope_dim as usize;
        let theta = opt_float("rope_theta", 10000.0)?;
        let local_theta = opt_float("rope_local_theta", theta)?;
        if !(theta > 1.0 && local_theta > 1.0 && theta.is_finite() && local_theta.is_finite()) {
            return Err(format!("{p}: rope_theta must be a finite number above 1"));
        }
        let mut inv_freq_global = rope_inv_freq(theta, rope_dim);
        let mut inv_freq_local = rope_inv_freq(local_theta, rope_dim);
        let factor = float_in("rope_scaling_factor", 1.0, positive, "a positive number")?;
        let original_context = || -> Result<f64, String> {
            let original = opt_int("rope_original_context", 8192)?;
            if !(1..=LIMIT_CONTEXT).contains(&original) {
                return Err(format!(
                    "{p}: metadata 'rope_original_context' = {original} is outside 1..={LIMIT_CONTEXT}"
                ));
            }
            Ok(original as f64)
        };
        // YaRN's attention factor (0.1·ln(factor) + 1) unless the file gives its own
        let mut yarn_attn_factor = 1.0;
        match f.get_str("rope_scaling")?.unwrap_or("none") {
            "none" => {}
            "linear" => inv_freq_global.iter_mut().for_each(|v| *v = (*v as f64 / factor) as f32),
            "llama3" => {
                let low = float_in("rope_low_freq_factor", 1.0, positive, "a positive number")?;
                let high = float_in("rope_high_freq_factor", 4.0, positive, "a positive number")?;
                if high <= low {
                    return Err(format!("{p}: rope_high_freq_factor {high} must be above rope_low_freq_factor {low}"));
                }
                llama3_scale(&mut inv_freq_global, factor, low, high, original_context()?)
            }
            // (both tables: gpt-oss's sliding layers rotate as its full ones)
            "yarn" => {
                let yarn = Yarn {
                    factor,
                    original_context: original_context()?,
                    beta_fast: float_in("rope_yarn_beta_fast", 32.0, positive, "a positive number")?,
                    beta_slow: float_in("rope_yarn_beta_slow", 1.0, positive, "a positive number")?,
                    truncate: match opt_int("rope_yarn_truncate", 1)? {
                        0 => false,
                        1 => true,
                        v => return Err(format!("{p}: metadata 'rope_yarn_truncate' = {v} must be 0 or 1")),
                    },
                };
                yarn.scale(&mut inv_freq_global, theta, rope_dim);
                yarn.scale(&mut inv_freq_local, local_theta, rope_dim);
                if factor > 1.0 {
                    yarn_attn_factor = 0.1 * factor.ln() + 1.0;
                }
            }
            other => return Err(format!("{p}: unknown rope_scaling '{other}'")),
        }
        // llama.cpp's form of RoPE scaling (its rope_freqs tensor; LongRoPE's
        // short factors): each global frequency divided by its own factor
        let divided = |key: &str, inv: &[f32]| -> Result<Option<Vec<f32>>, String> {
            let Some(factors) = f.get_float_array(key)? else { return Ok(None) };
            if factors.len() != inv.len() || !factors.iter().all(|v| v.is_finite() && *v > 0.0) {
                return Err(format!("{p}: {key} should hold {} positive numbers, one per rotated pair", inv.len()));
            }
            Ok(Some(inv.iter().zip(factors).map(|(v, ff)| (*v as f64 / ff) as f32).collect()))
        };
        let unscaled = inv_freq_global.clone();
        if let Some(v) = divided("rope_freq_factors", &unscaled)? {
            inv_freq_global = v;
        }
        let inv_freq_long = divided("rope_freq_factors_long", &unscaled)?;
        let rope_long_context = opt_int("rope_long_context", LIMIT_CONTEXT)?;
        if inv_freq_long.is_some() && !(1..=LIMIT_CONTEXT).contains(&rope_long_context) {
            return Err(format!(
                "{p}: metadata 'rope_long_context' = {rope_long_context} is outside 1..={LIMIT_CONTEXT}"
            ));
        }
        let rope_attn_factor = float_in("rope_attn_factor", yarn_attn_factor, positive, "a positive number")? as f32;

        let per_layer = |key: &str, default: i64| -> Result<Vec<i64>, String> {
            match f.get_int_array(key)? {
                None => Ok(vec![default; n_layers]),
                Some(a) if a.len() == n_layers => Ok(a.to_vec()),
                Some(a) => Err(format!("{p}: '{key}' has {} entries for {n_layers} layers", a.len())),
            }
        };
        let layer_kinds = per_layer("layer_kinds", 0)?
            .into_iter()
            .enumerate()
            .map(|(i, k)| match k {
                0 => Ok(LayerKind::Full),
                1 => Ok(LayerKind::Sliding),
                2 => Ok(LayerKind::DeltaNet),
                _ => Err(format!("{p}: layer {i} has unknown kind {k}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let layer_rope = per_layer("layer_rope", 1)?
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                0 | 1 => Ok(v == 1),
                _ => Err(format!("{p}: 'layer_rope' of layer {i} is {v}; it must be 0 or 1")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sliding_window = opt_int("sliding_window", 0)?;
        if !(0..=LIMIT_CONTEXT).contains(&sliding_window) {
            return Err(format!("{p}: metadata 'sliding_window' = {sliding_window} is outside 0..={LIMIT_CONTEXT}"));
        }
        if sliding_window == 0 && layer_kinds.contains(&LayerKind::Sliding) {
            return Err(format!("{p}: sliding layers need a positive sliding_window (got {sliding_window})"));
        }
        let mut deltanet = DeltaNetDims::default();
        if layer_kinds.contains(&LayerKind::DeltaNet) {
            deltanet = DeltaNetDims {
                n_k_heads: int("linear_n_k_heads", 1, LIMIT_HEADS)?,
                n_v_heads: int("linear_n_v_heads", 1, LIMIT_HEADS)?,
                k_head_dim: int("linear_k_head_dim", 1, 4096)?,
                v_head_dim: int("linear_v_head_dim", 1, 4096)?,
                conv_kernel: int("linear_conv_kernel", 1, 64)?,
                v_tiled: flag("linear_v_tiled")?,
            };
            if deltanet.n_v_heads % deltanet.n_k_heads != 0 {
                return Err(format!("{p}: linear_n_v_heads is not a multiple of linear_n_k_heads"));
            }
        }
        let n_experts = opt_int("n_experts", 0)?;
        if !(0..=LIMIT_EXPERTS).contains(&n_experts) {
            return Err(format!("{p}: metadata 'n_experts' = {n_experts} is outside 0..={LIMIT_EXPERTS}"));
        }
        let mut moe = MoeConfig::default();
        if n_experts > 0 {
            moe = MoeConfig {
                n_experts: n_experts as usize,
                n_used: int("n_experts_used", 1, n_experts)?,
                expert_ffn_dim: match opt_int("expert_ffn_dim", ffn_dim as i64)? {
                    v @ 1..=LIMIT_WIDTH => v as usize,
                    v => return Err(format!("{p}: metadata 'expert_ffn_dim' = {v} is outside 1..={LIMIT_WIDTH}")),
                },
                shared_ffn_dim: match opt_int("shared_expert_ffn_dim", 0)? {
                    v @ 0..=LIMIT_WIDTH => v as usize,
                    v => {
                        return Err(format!("{p}: metadata 'shared_expert_ffn_dim' = {v} is outside 0..={LIMIT_WIDTH}"))
                    }
                },
                gating: match f.get_str("expert_gating")?.unwrap_or("softmax") {
                    "softmax" => ExpertGating::Softmax,
                    "softmax_selected" => ExpertGating::SoftmaxSelected,
                    other => return Err(format!("{p}: unknown expert_gating '{other}'")),
                },
                norm_weights: flag("expert_weights_norm")?,
            };
        }
        let query_scale = float_in("query_scale", 1.0 / (head_dim as f64).sqrt(), positive, "a positive number")?;
        let non_negative = |v: f64| v >= 0.0;
        let softcap_rule = "0 (off) or a positive number";
        Ok(Config {
            arch: arch_name,
            vocab_size,
            hidden_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            context_length,
            norm_eps: norm_eps as f32,
            norm_unit_offset: flag("norm_unit_offset")?,
            norm_sandwich: flag("norm_sandwich")?,
            embed_scale: float_in("embed_scale", 1.0, positive, "a positive number")? as f32,
            tie_embeddings: flag("tie_embeddings")?,
            activation,
            rope_style,
            rope_dim,
            inv_freq_global,
            inv_freq_local,
            inv_freq_long,
            rope_long_context: rope_long_context as usize,
            rope_attn_factor,
            layer_kinds,
            layer_rope,
            sliding_window: sliding_window as usize,
            query_scale: query_scale as f32,
            attn_softcap: float_in("attn_softcap", 0.0, non_negative, softcap_rule)? as f32,
            final_softcap: float_in("final_softcap", 0.0, non_negative, softcap_rule)? as f32,
            qk_norm: flag("qk_norm")?,
            attn_output_gate: flag("attn_output_gate")?,
            deltanet,
            moe,
            pooling: match opt_int("pooling", 0)? {
                0 => None,
                v => Some(
                    super::Pooling::from_gguf(v)
                        .ok_or_else(|| format!("{p}: metadata 'pooling' = {v} is not 1 (mean), 2 (cls) or 3 (last)"))?,
                ),
            },
        })
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

/// inv_freq[i] = 1 / theta^(2i / d), computed as transformers does (f32 result).
fn rope_inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2).map(|i| (1.0 / libm::pow(theta, (2 * i) as f64 / dim as f64)) as f32).collect()
}

/// YaRN RoPE scaling as transformers computes it: each frequency blended
/// between itself (extrapolated, the high frequencies) and itself / factor
/// (interpolated, the low ones) by a linear ramp over the dimensions whose
/// wavelengths turn `beta_fast` .. `beta_slow` times in the original context;
/// `truncate`: the ramp's ends rounded out to whole dimensions (transformers'
/// default, and llama.cpp's always; gpt-oss's config turns it off).
struct Yarn {
    factor: f64,
    original_context: f64,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
}

impl Yarn {
    fn scale(&self, inv_freq: &mut [f32], theta: f64, dim: usize) {
        let d = dim as f64;
        let corr = |rotations: f64| {
            d * (self.original_context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (corr(self.beta_fast), corr(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
        if low == high {
            high += 0.001;
        }
        for (i, f) in inv_freq.iter_mut().enumerate() {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            let freq = *f as f64;
            *f = (freq / self.factor * (1.0 - extrapolation) + freq * extrapolation) as f32;
        }
    }
}

/// Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short
/// ones kept, a smooth blend between.
fn llama3_scale(inv_freq: &mut [f32], factor: f64, low: f64, high: f64, original_context: f64) {
    let low_wavelen = original_context / low;
    let high_wavelen = original_context / high;
    for f in inv_freq.iter_mut() {
        let freq = *f as f64;
        let wavelen = 2.0 * std::f64::consts::PI / freq;
        *f = if wavelen < high_wavelen {
            freq as f32
        } else if wavelen > low_wavelen {
            (freq / factor) as f32
        } else {
            let smooth = (original_context / wavelen - low) / (high - low);
            ((1.0 - smooth) * freq / factor + smooth * freq) as f32
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::mlb::MetaValue;

    #[test]
    fn llama3_scaling_matches_the_piecewise_rule() {
        // Values from Llama 3.1's config: factor 8, low 1, high 4, original 8192.
        let mut inv = rope_inv_freq(500000.0, 128);
        let orig = inv.clone();
        llama3_scale(&mut inv, 8.0, 1.0, 4.0, 8192.0);
        // highest frequency untouched, lowest divided by the factor
        assert_eq!(inv[0], orig[0]);
        assert!((inv[63] - orig[63] / 8.0).abs() <= 1e-12);
        // in between: never above the original, never below original/factor
        for (a, b) in inv.iter().zip(&orig) {
            assert!(*a <= *b && *a >= *b / 8.0 * 0.999_999);
        }
    }

    fn config_with(extra: &[(&str, MetaValue)]) -> Result<Config, String> {
        use crate::format::mlb::{write_mlb, Mlb};
        let mut meta = vec![("arch", MetaValue::Str("llama".into()))];
        for (k, v) in [
            ("vocab_size", 8),
            ("hidden_size", 64),
            ("n_layers", 1),
            ("n_heads", 4),
            ("n_kv_heads", 4),
            ("head_dim", 16),
            ("ffn_dim", 64),
            ("context_length", 64),
            ("norm_eps", 0),
        ] {
            // a key in `extra` replaces the default
            if !extra.iter().any(|(e, _)| *e == k) {
                meta.push((k, if k == "norm_eps" { MetaValue::Float(1e-5) } else { MetaValue::Int(v) }));
            }
        }
        meta.extend(extra.iter().cloned());
        Config::from_mlb(&Mlb::from_bytes(write_mlb(&meta, &[]), "c.mlb")?)
    }

    #[test]
    fn meaningless_hyperparameters_are_refused_with_the_key() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        let floats: &[(&str, &[f64])] = &[
            ("query_scale", &[nan, inf, 0.0, -1.0]),
            ("attn_softcap", &[nan, -1.0, inf]),
            ("final_softcap", &[nan, -1.0, inf]),
            ("embed_scale", &[nan, inf, 0.0]),
            ("norm_eps", &[0.0, -1e-5, nan, inf, 2.0]),
            ("rope_scaling_factor", &[0.0, nan]),
        ];
        for (key, values) in floats {
            for &v in *values {
                let err = config_with(&[(key, MetaValue::Float(v))]).err().unwrap_or_else(|| panic!("{key} = {v}"));
                assert!(err.contains(&format!("'{key}' = ")), "{err}");
            }
        }
        let ints: &[(&str, &[i64])] = &[
            ("norm_unit_offset", &[-1, 5, 1 << 31]),
            ("tie_embeddings", &[-1, 2, 100000]),
            ("norm_sandwich", &[2]),
            ("qk_norm", &[-1]),
            ("attn_output_gate", &[3]),
            ("sliding_window", &[-1, 1 << 40]),
        ];
        for (key, values) in ints {
            for &v in *values {
                let err = config_with(&[(key, MetaValue::Int(v))]).err().unwrap_or_else(|| panic!("{key} = {v}"));
                assert!(err.contains(&format!("'{key}' = ")), "{err}");
            }
        }
        let llama3 = |extra: (&'static str, MetaValue)| {
            config_with(&[("rope_scaling", MetaValue::Str("llama3".into())), extra]).err().unwrap()
        };
        assert!(llama3(("rope_high_freq_factor", MetaValue::Float(1.0))).contains("rope_high_freq_factor"));
        assert!(llama3(("rope_original_context", MetaValue::Int(0))).contains("rope_original_context"));
        let err = config_with(&[("layer_rope", MetaValue::IntArray(vec![2]))]).err().unwrap();
        assert!(err.contains("layer_rope"), "{err}");
        // the edges that are valid
        let ok = config_with(&[
            ("attn_softcap", MetaValue::Float(0.0)),
            ("final_softcap", MetaValue::Float(30.0)),
            ("tie_embeddings", MetaValue::Int(1)),
            ("norm_eps", MetaValue::Float(1.0)),
        ])
        .unwrap();
        assert!(ok.tie_embeddings && ok.final_softcap == 30.0);
    }

    #[test]
    fn rope_freq_factors_divide_the_global_frequencies() {
        let plain = config_with(&[]).unwrap();
        let factors: Vec<f64> = (0..8).map(|i| 1.0 + i as f64).collect();
        let scaled = config_with(&[("rope_freq_factors", MetaValue::FloatArray(factors.clone()))]).unwrap();
        for ((a, b), f) in scaled.inv_freq_global.iter().zip(&plain.inv_freq_global).zip(&factors) {
            assert_eq!(*a, (*b as f64 / f) as f32);
        }
        assert_eq!(scaled.inv_freq_local, plain.inv_freq_local);
        for bad in [vec![1.0; 7], vec![1.0; 9], vec![0.0; 8], vec![f64::NAN; 8], vec![-1.0; 8]] {
            let err = config_with(&[("rope_freq_factors", MetaValue::FloatArray(bad))]).err().unwrap();
            assert!(err.contains("rope_freq_factors should hold 8 positive numbers"), "{err}");
        }
    }
}
