//! What the importers know about each model family, in one table: the
//! names the family has in each source format, its fixed traits (the
//! metadata every model of the family gets, whatever the source) and its
//! default layer pattern. The readers (`gguf.rs`, `hf_config.rs`,
//! `llama2c.rs`) look families up here and read only what varies per model
//! from their source; where a source states the layer pattern itself (HF
//! `layer_types` / `sliding_window_pattern`, GGUF
//! `attention.sliding_window_pattern`), that overrides the default.

use crate::format::mlb::MetaValue;

/// `.mlb` layer kinds (metadata `layer_kinds`).
pub const FULL: i64 = 0;
pub const SLIDING: i64 = 1;
pub const LINEAR: i64 = 2;

/// A family's default layer pattern when the file lists no kind per layer.
#[derive(Clone, Copy, Debug)]
pub enum Layers {
    /// Every layer full attention.
    Full,
    /// The last layer of every `period` is full, the others slide (llama.cpp's
    /// swa pattern; the file may give its own period, 0 = every layer slides).
    Periodic(u64),
    /// Every layer slides once the file gives a sliding window.
    Window,
    /// Layers from the source's `max_window_layers` on slide once the
    /// source enables a sliding window; GGUF does not store it, so none does.
    WindowFrom,
}

/// One model family.
#[derive(Debug)]
pub struct Family {
    /// `.mlb` arch.
    pub arch: &'static str,
    /// GGUF `general.architecture` ("": not read from GGUF).
    pub gguf_arch: &'static str,
    /// config.json `model_type`s.
    pub hf_model_types: &'static [&'static str],
    /// config.json `architectures` (classes).
    pub hf_classes: &'static [&'static str],
    /// RMSNorm of q and k per head.
    pub qk_norm: bool,
    /// Gemma block: sandwich norms, embeddings scaled by sqrt(hidden_size),
    /// GeGLU (tanh) feed-forward (its 1 + w norms are stored so in GGUF).
    pub gemma: bool,
    /// (1 + w) norms without the rest of the Gemma block.
    pub norm_unit_offset: bool,
    /// Sigmoid gate on the attention output (q_proj rows doubled).
    pub attn_output_gate: bool,
    /// Gated DeltaNet layers (layer kind LINEAR, `linear_attn.*`).
    pub linear_attention: bool,
    /// Some layers without RoPE (metadata `layer_rope`).
    pub nope_layers: bool,
    pub layers: Layers,
    /// convert_hf_to_gguf permutes q/k rows to interleaved RoPE (LlamaModel).
    pub qk_permuted: bool,
    /// llama.cpp reads (and applies) the attention and final logit soft-caps.
    pub softcaps: bool,
    /// RoPE theta of sliding layers, which llama.cpp hard-codes.
    pub local_rope_theta: Option<f64>,
    /// Mixture-of-Experts layers divide the chosen experts' weights by
    /// their sum (when the model has experts; llama.cpp fixes it per family).
    pub expert_weights_norm: bool,
    /// GGUF stores q/k/v as one `attn_qkv` and gate/up as one `ffn_up` (Phi-3).
    pub fused: bool,
    /// gpt-oss: the clamped SwiGLU, `post_attention_norm` as the
    /// feed-forward norm, YaRN without truncation (its config's).
    pub oai_moe: bool,
}

const BASE: Family = Family {
    arch: "",
    gguf_arch: "",
    hf_model_types: &[],
    hf_classes: &[],
    qk_norm: false,
    gemma: false,
    norm_unit_offset: false,
    attn_output_gate: false,
    linear_attention: false,
    nope_layers: false,
    layers: Layers::Full,
    qk_permuted: false,
    softcaps: false,
    local_rope_theta: None,
    expert_weights_norm: false,
    fused: false,
    oai_moe: false,
};

pub const FAMILIES: &[Family] = &[
    // (Mixtral too: Llama blocks with experts)
    Family {
        arch: "llama",
        gguf_arch: "llama",
        hf_model_types: &["llama"],
        hf_classes: &["LlamaForCausalLM"],
        qk_permuted: true,
        expert_weights_norm: true,
        ..BASE
    },
    Family {
        arch: "mistral",
        gguf_arch: "mistral",
        hf_model_types: &["mistral"],
        hf_classes: &["MistralForCausalLM"],
        layers: Layers::Window,
        qk_permuted: true,
        ..BASE
    },
    Family {
        arch: "qwen2",
        gguf_arch: "qwen2",
        hf_model_types: &["qwen2"],
        hf_classes: &["Qwen2ForCausalLM"],
        layers: Layers::WindowFrom,
        ..BASE
    },
    Family {
        arch: "qwen3",
        gguf_arch: "qwen3",
        hf_model_types: &["qwen3"],
        hf_classes: &["Qwen3ForCausalLM"],
        qk_norm: true,
        ..BASE
    },
    Family { arch: "qwen2moe", gguf_arch: "qwen2moe", ..BASE },
    Family { arch: "qwen3moe", gguf_arch: "qwen3moe", qk_norm: true, expert_weights_norm: true, ..BASE },
    Family {
        arch: "smollm3",
        gguf_arch: "smollm3",
        hf_model_types: &["smollm3"],
        hf_classes: &["SmolLM3ForCausalLM"],
        nope_layers: true,
        ..BASE
    },
    Family {
        arch: "gemma2",
        gguf_arch: "gemma2",
        hf_model_types: &["gemma2"],
        hf_classes: &["Gemma2ForCausalLM"],
        gemma: true,
        layers: Layers::Periodic(2),
        softcaps: true,
        ..BASE
    },
    Family {
        arch: "gemma3",
        gguf_arch: "gemma3",
        hf_model_types: &["gemma3", "gemma3_text"],
        hf_classes: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
        qk_norm: true,
        gemma: true,
        layers: Layers::Periodic(6),
        local_rope_theta: Some(10000.0),
        ..BASE
    },
    Family {
        arch: "qwen3_5",
        gguf_arch: "qwen35",
        hf_model_types: &["qwen3_5", "qwen3_5_text"],
        hf_classes: &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"],
        qk_norm: true,
        norm_unit_offset: true,
        attn_output_gate: true,
        linear_attention: true,
        ..BASE
    },
    // (from GGUF only: Krafla's Hugging Face reader does not stack experts yet)
    Family {
        arch: "qwen3_5_moe",
        gguf_arch: "qwen35moe",
        qk_norm: true,
        norm_unit_offset: true,
        attn_output_gate: true,
        linear_attention: true,
        expert_weights_norm: true,
        ..BASE
    },
    // Phi-3 / Phi-4-mini: LongRoPE from the file's factors (gguf.rs)
    Family { arch: "phi3", gguf_arch: "phi3", fused: true, ..BASE },
    // gpt-oss: sliding (even) and full layers alternating, attention sinks,
    // biases everywhere, experts in MXFP4 (from GGUF only, as the other MoE families)
    Family { arch: "gpt_oss", gguf_arch: "gpt-oss", layers: Layers::Periodic(2), oai_moe: true, ..BASE },
    // karpathy/llama2.c checkpoints: plain Llama 2 blocks
    Family { arch: "llama2c", ..BASE },
];

/// The family of an `.mlb` arch.
pub fn from_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.arch == arch)
}

/// The family of a config.json: by `model_type`, else by the first known
/// class in `architectures`.
pub fn from_hf(model_type: Option<&str>, classes: &[&str]) -> Option<&'static Family> {
    let by_type = model_type.and_then(|t| FAMILIES.iter().find(|f| f.hf_model_types.contains(&t)));
    by_type.or_else(|| classes.iter().find_map(|c| FAMILIES.iter().find(|f| f.hf_classes.contains(c))))
}

/// The family of a GGUF `general.architecture`.
pub fn from_gguf(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| !f.gguf_arch.is_empty() && f.gguf_arch == arch)
}

impl Family {
    /// The fixed metadata of the family, in `.mlb` metadata order. A GGUF
    /// file stores Gemma's and Qwen3.5's norms as 1 + w already (`unit_offset_stored`).
    pub fn traits(&self, hidden_size: u64, unit_offset_stored: bool) -> Vec<(&'static str, MetaValue)> {
        let mut m = Vec::new();
        if self.qk_norm {
            m.push(("qk_norm", MetaValue::Int(1)));
        }
        if self.gemma {
            if !unit_offset_stored {
                m.push(("norm_unit_offset", MetaValue::Int(1)));
            }
            m.push(("norm_sandwich", MetaValue::Int(1)));
            m.push(("embed_scale", MetaValue::Float((hidden_size as f64).sqrt())));
            m.push(("ffn_act", MetaValue::Str("gelu_tanh".into())));
        }
        if self.norm_unit_offset && !unit_offset_stored {
            m.push(("norm_unit_offset", MetaValue::Int(1)));
        }
        if self.attn_output_gate {
            m.push(("attn_output_gate", MetaValue::Int(1)));
        }
        if self.oai_moe {
            m.push(("ffn_act", MetaValue::Str("swiglu_oai".into())));
        }
        m
    }

    /// Per-layer kinds from the family's default pattern, or None when every
    /// layer is full attention. `window`: the source's sliding window, if
    /// any (and enabled); `period`: the source's own period for a periodic
    /// family (0: every layer slides); `window_from`: the source's first
    /// sliding layer for a `WindowFrom` family (default: none slides).
    pub fn layer_kinds(
        &self,
        n_layers: usize,
        window: Option<u64>,
        period: Option<u64>,
        window_from: Option<u64>,
    ) -> Option<Vec<i64>> {
        let window = window.filter(|&w| w != 0);
        match self.layers {
            Layers::Periodic(default) => {
                let p = period.unwrap_or(default);
                Some((0..n_layers as u64).map(|i| if p == 0 || i % p < p - 1 { SLIDING } else { FULL }).collect())
            }
            Layers::Window if window.is_some() => Some(vec![SLIDING; n_layers]),
            Layers::WindowFrom if window.is_some() => {
                let first = window_from.unwrap_or(n_layers as u64);
                Some((0..n_layers as u64).map(|i| if i >= first { SLIDING } else { FULL }).collect())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(arch: &str) -> &'static Family {
        from_arch(arch).unwrap()
    }

    #[test]
    fn default_layer_patterns_and_a_sources_own_period() {
        let (s, f) = (SLIDING, FULL);
        assert_eq!(family("gemma2").layer_kinds(4, None, None, None), Some(vec![s, f, s, f]));
        assert_eq!(family("gemma3").layer_kinds(7, None, None, None), Some(vec![s, s, s, s, s, f, s]));
        assert_eq!(family("gemma3").layer_kinds(4, None, Some(2), None), Some(vec![s, f, s, f]));
        // llama.cpp: period 0 = every layer slides
        assert_eq!(family("gemma3").layer_kinds(3, None, Some(0), None), Some(vec![s, s, s]));
        assert_eq!(family("mistral").layer_kinds(3, Some(8), None, None), Some(vec![s, s, s]));
        assert_eq!(family("mistral").layer_kinds(3, None, None, None), None);
        assert_eq!(family("qwen2").layer_kinds(4, Some(8), None, Some(2)), Some(vec![f, f, s, s]));
        // max_window_layers defaults to every layer: none slides
        assert_eq!(family("qwen2").layer_kinds(4, Some(8), None, None), Some(vec![f, f, f, f]));
        assert_eq!(family("llama").layer_kinds(4, Some(8), Some(2), None), None);
    }

    #[test]
    fn families_are_found_by_each_sources_names() {
        assert_eq!(from_hf(Some("gemma3_text"), &[]).unwrap().arch, "gemma3");
        assert_eq!(from_hf(None, &["Foo", "Qwen3_5ForConditionalGeneration"]).unwrap().arch, "qwen3_5");
        assert_eq!(from_hf(Some("llava_like"), &["Bar"]).map(|f| f.arch), None);
        assert_eq!(from_gguf("gemma3").unwrap().arch, "gemma3");
        assert_eq!(from_gguf("qwen35moe").unwrap().arch, "qwen3_5_moe");
        assert_eq!(from_gguf("gpt-oss").unwrap().arch, "gpt_oss");
        // llama2.c has no GGUF name: an empty one matches nothing
        assert!(from_gguf("qwen3_5").is_none() && from_gguf("").is_none() && from_gguf("llama2c").is_none());
    }

    #[test]
    fn gemma_norms_are_offset_unless_the_file_stores_them_so() {
        let names = |stored| family("gemma3").traits(640, stored).into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(names(false), ["qk_norm", "norm_unit_offset", "norm_sandwich", "embed_scale", "ffn_act"]);
        assert_eq!(names(true), ["qk_norm", "norm_sandwich", "embed_scale", "ffn_act"]);
        assert!(family("qwen3_5").traits(64, false).iter().any(|(k, _)| *k == "attn_output_gate"));
    }
}
