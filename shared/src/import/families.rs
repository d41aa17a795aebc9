//! What the GGUF loader knows about each model family, in one table: the
//! Rust side of `tools/families.py` (the two must agree: `--save` and
//! `tools/convert.py` write the same file, which a test checks). Only the
//! families llama.cpp writes GGUF files for are here.

use crate::format::mlb::MetaValue;

/// `.mlb` layer kinds (metadata `layer_kinds`).
pub const FULL: i64 = 0;
pub const SLIDING: i64 = 1;

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
    /// Layers from the source's `max_window_layers` on slide; GGUF does not
    /// store it, so none does.
    WindowFrom,
}

/// One model family.
#[derive(Debug)]
pub struct Family {
    /// `.mlb` arch.
    pub arch: &'static str,
    /// GGUF `general.architecture`.
    pub gguf_arch: &'static str,
    /// RMSNorm of q and k per head.
    pub qk_norm: bool,
    /// Gemma block: sandwich norms, embeddings scaled by sqrt(hidden_size),
    /// GeGLU (tanh) feed-forward (its 1 + w norms are stored so in GGUF).
    pub gemma: bool,
    pub layers: Layers,
    /// convert_hf_to_gguf permutes q/k rows to interleaved RoPE (LlamaModel).
    pub qk_permuted: bool,
    /// llama.cpp reads (and applies) the attention and final logit soft-caps.
    pub softcaps: bool,
    /// RoPE theta of sliding layers, which llama.cpp hard-codes.
    pub local_rope_theta: Option<f64>,
}

const BASE: Family = Family {
    arch: "",
    gguf_arch: "",
    qk_norm: false,
    gemma: false,
    layers: Layers::Full,
    qk_permuted: false,
    softcaps: false,
    local_rope_theta: None,
};

pub const FAMILIES: &[Family] = &[
    Family { arch: "llama", gguf_arch: "llama", qk_permuted: true, ..BASE },
    Family { arch: "mistral", gguf_arch: "mistral", layers: Layers::Window, qk_permuted: true, ..BASE },
    Family { arch: "qwen2", gguf_arch: "qwen2", layers: Layers::WindowFrom, ..BASE },
    Family { arch: "qwen3", gguf_arch: "qwen3", qk_norm: true, ..BASE },
    Family { arch: "smollm3", gguf_arch: "smollm3", ..BASE },
    Family { arch: "gemma2", gguf_arch: "gemma2", gemma: true, layers: Layers::Periodic(2), softcaps: true, ..BASE },
    Family {
        arch: "gemma3",
        gguf_arch: "gemma3",
        qk_norm: true,
        gemma: true,
        layers: Layers::Periodic(6),
        local_rope_theta: Some(10000.0),
        ..BASE
    },
];

/// The family of a GGUF `general.architecture`.
pub fn from_gguf(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.gguf_arch == arch)
}

impl Family {
    /// The fixed metadata of the family, in `.mlb` metadata order.
    pub fn traits(&self, hidden_size: u64) -> Vec<(&'static str, MetaValue)> {
        let mut m = Vec::new();
        if self.qk_norm {
            m.push(("qk_norm", MetaValue::Int(1)));
        }
        if self.gemma {
            m.push(("norm_sandwich", MetaValue::Int(1)));
            m.push(("embed_scale", MetaValue::Float((hidden_size as f64).sqrt())));
            m.push(("ffn_act", MetaValue::Str("gelu_tanh".into())));
        }
        m
    }

    /// Per-layer kinds from the family's default pattern, or None when every
    /// layer is full attention. `window`: the file's sliding window, if any;
    /// `period`: the file's own period for a periodic family.
    pub fn layer_kinds(&self, n_layers: usize, window: Option<u64>, period: Option<u64>) -> Option<Vec<i64>> {
        let window = window.filter(|&w| w != 0);
        match self.layers {
            Layers::Periodic(default) => {
                let p = period.unwrap_or(default);
                Some((0..n_layers as u64).map(|i| if p == 0 || i % p < p - 1 { SLIDING } else { FULL }).collect())
            }
            Layers::Window if window.is_some() => Some(vec![SLIDING; n_layers]),
            Layers::WindowFrom if window.is_some() => Some(vec![FULL; n_layers]),
            _ => None,
        }
    }
}
