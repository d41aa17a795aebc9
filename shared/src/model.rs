//! The transformer: hyperparameters and weights from an `.mlb` file, and one
//! forward pass that every supported family runs through, driven by those
//! hyperparameters (norm flavour, biases, q/k norms, RoPE kind, sliding
//! windows, soft-caps, sandwich norms, activation).

use std::path::Path;
use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use crate::kernels::{matmul, matmul_group, Arch, Input, Kernels, MatRef, Packed, WeightData};
use crate::kvcache::{try_alloc, KvCache, KvType};
use crate::mlb::{Mlb, TensorInfo, TensorType};
use crate::quant::{
    repack_q4_x8, repack_q8_x8, BlockQ4_0, BlockQ4_0F32, BlockQ4_0x8, BlockQ8_0, BlockQ8_0F32, BlockQ8_0x8, QK, ROWS8,
};

/// What a layer's mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal attention over every earlier position.
    Full,
    /// Causal attention over the last `sliding_window` positions.
    Sliding,
    /// Gated DeltaNet linear attention (Qwen3.5); not implemented yet.
    DeltaNet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
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
}

/// Shapes of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeltaNetDims {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
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
const LIMIT_LAYERS: i64 = 1024;
const LIMIT_HEADS: i64 = 4096;
const LIMIT_CONTEXT: i64 = 1 << 24;

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

        let arch_name = f.require_str("arch")?.to_string();
        const KNOWN: [&str; 9] =
            ["llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma2", "gemma3", "qwen3_5", "llama2c"];
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
        let norm_eps = f.require_float("norm_eps")? as f32;
        if n_heads % n_kv_heads != 0 {
            return Err(format!("{p}: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}"));
        }
        if !(norm_eps.is_finite() && norm_eps >= 0.0) {
            return Err(format!("{p}: norm_eps {norm_eps} is not a non-negative number"));
        }

        let activation = match f.get_str("ffn_act")?.unwrap_or("silu") {
            "silu" => Activation::Silu,
            "gelu_tanh" => Activation::GeluTanh,
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
        let inv_freq_local = rope_inv_freq(local_theta, rope_dim);
        let factor = opt_float("rope_scaling_factor", 1.0)?;
        match f.get_str("rope_scaling")?.unwrap_or("none") {
            "none" => {}
            "linear" => inv_freq_global.iter_mut().for_each(|v| *v = (*v as f64 / factor) as f32),
            "llama3" => llama3_scale(
                &mut inv_freq_global,
                factor,
                opt_float("rope_low_freq_factor", 1.0)?,
                opt_float("rope_high_freq_factor", 4.0)?,
                opt_int("rope_original_context", 8192)? as f64,
            ),
            other => return Err(format!("{p}: unknown rope_scaling '{other}'")),
        }
        if !(factor.is_finite() && factor > 0.0) {
            return Err(format!("{p}: rope_scaling_factor {factor} is not a positive number"));
        }

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
        let layer_rope = per_layer("layer_rope", 1)?.into_iter().map(|v| v != 0).collect();
        let sliding_window = opt_int("sliding_window", 0)?;
        if sliding_window < 0 || (sliding_window == 0 && layer_kinds.contains(&LayerKind::Sliding)) {
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
            };
            if deltanet.n_v_heads % deltanet.n_k_heads != 0 {
                return Err(format!("{p}: linear_n_v_heads is not a multiple of linear_n_k_heads"));
            }
        }
        let query_scale = opt_float("query_scale", 1.0 / (head_dim as f64).sqrt())? as f32;
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
            norm_eps,
            norm_unit_offset: opt_int("norm_unit_offset", 0)? != 0,
            norm_sandwich: opt_int("norm_sandwich", 0)? != 0,
            embed_scale: opt_float("embed_scale", 1.0)? as f32,
            tie_embeddings: opt_int("tie_embeddings", 0)? != 0,
            activation,
            rope_style,
            rope_dim,
            inv_freq_global,
            inv_freq_local,
            layer_kinds,
            layer_rope,
            sliding_window: sliding_window as usize,
            query_scale,
            attn_softcap: opt_float("attn_softcap", 0.0)? as f32,
            final_softcap: opt_float("final_softcap", 0.0)? as f32,
            qk_norm: opt_int("qk_norm", 0)? != 0,
            attn_output_gate: opt_int("attn_output_gate", 0)? != 0,
            deltanet,
        })
    }

    /// The context to run with: `requested`, or 4096 (the model's maximum if
    /// smaller) when none is given; errors for 0 or more than the maximum.
    pub fn resolve_ctx(&self, requested: Option<usize>) -> Result<usize, String> {
        match requested {
            Some(0) => Err("--ctx must be at least 1".into()),
            Some(n) if n > self.context_length => {
                Err(format!("--ctx {n} exceeds the model's maximum context {}", self.context_length))
            }
            Some(n) => Ok(n),
            None => Ok(self.context_length.min(4096)),
        }
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
    (0..dim / 2).map(|i| (1.0 / theta.powf((2 * i) as f64 / dim as f64)) as f32).collect()
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

/// A weight matrix located in the mapped file, and its rows again in the
/// eight-row interleaved layout when the build's kernels use it.
#[derive(Clone, Debug)]
struct Matrix {
    ttype: TensorType,
    rows: usize,
    cols: usize,
    start: usize,
    len: usize,
    packed: Option<Arc<PackedRows>>,
}

/// Rows 0 .. ⌊rows/8⌋·8 of a Q8_0 / Q4_0 matrix copied into the
/// interleaved layout of `kernels::rows8` (memory: the same bytes again).
#[derive(Debug)]
enum PackedRows {
    Q8(Vec<BlockQ8_0x8>),
    Q4(Vec<BlockQ4_0x8>),
}

impl PackedRows {
    fn bytes(&self) -> usize {
        match self {
            PackedRows::Q8(v) => std::mem::size_of_val(&v[..]),
            PackedRows::Q4(v) => std::mem::size_of_val(&v[..]),
        }
    }
}

/// How to load a model.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Copy Q8_0 / Q4_0 matrices into the eight-row interleaved layout when
    /// this build has kernels for it (faster; costs their size in memory).
    pub repack: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { repack: true }
    }
}

/// Weights of one transformer block.
struct Layer {
    attn_norm: Vec<f32>, // [D]
    mixer: Mixer,
    attn_post_norm: Option<Vec<f32>>, // [D]
    ffn_norm: Vec<f32>,               // [D]
    ffn_gate: Matrix,                 // [F, D]
    ffn_up: Matrix,                   // [F, D]
    ffn_down: Matrix,                 // [D, F]
    ffn_post_norm: Option<Vec<f32>>,  // [D]
}

impl Layer {
    /// The layer's weight matrices: the mixer's, then the feed-forward's.
    fn matrices(&self) -> Vec<&Matrix> {
        let mut mats = match &self.mixer {
            Mixer::Attention(w) => vec![&w.q, &w.k, &w.v, &w.o],
            Mixer::DeltaNet(w) => vec![&w.qkv, &w.z, &w.b, &w.a, &w.out],
        };
        mats.extend([&self.ffn_gate, &self.ffn_up, &self.ffn_down]);
        mats
    }
}

/// The token-mixing half of a block.
enum Mixer {
    Attention(AttentionWeights),
    DeltaNet(DeltaNetWeights),
}

struct AttentionWeights {
    q: Matrix,                // [H·hd, D]; [H·2·hd, D] with the output gate
    k: Matrix,                // [Hkv·hd, D]
    v: Matrix,                // [Hkv·hd, D]
    o: Matrix,                // [D, H·hd]
    q_bias: Option<Vec<f32>>, // [rows of q]
    k_bias: Option<Vec<f32>>, // [Hkv·hd]
    v_bias: Option<Vec<f32>>, // [Hkv·hd]
    q_norm: Option<Vec<f32>>, // [hd]
    k_norm: Option<Vec<f32>>, // [hd]
}

struct DeltaNetWeights {
    qkv: Matrix,       // [C, D], C = 2·nk·dk + nv·dv
    z: Matrix,         // [nv·dv, D]
    b: Matrix,         // [nv, D]
    a: Matrix,         // [nv, D]
    conv: Vec<f32>,    // [C, K]
    a_log: Vec<f32>,   // [nv]
    dt_bias: Vec<f32>, // [nv]
    norm: Vec<f32>,    // [dv]
    out: Matrix,       // [D, nv·dv]
}

/// A loaded model: the mapped file, its configuration and tensor locations.
pub struct Model {
    pub file: Arc<Mlb>,
    pub config: Config,
    token_embd: Matrix,    // [V, D]
    output_norm: Vec<f32>, // [D]
    output: Matrix,        // [V, D] (token_embd when tied)
    layers: Vec<Layer>,
}

/// Which positions of a forward call need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    None,
    Last,
    All,
}

/// Per-sequence state: the KV cache of attention layers, the convolution
/// and recurrent state of DeltaNet layers, and the number of positions filled.
pub struct State {
    pub pos: usize,
    pub ctx: usize,
    /// Per layer: index of its slot in the KV cache or in the recurrent state.
    slot: Vec<usize>,
    kv: KvCache,          // [attention layers][ctx][Hkv·hd], keys and values
    conv_state: Vec<f32>, // [DeltaNet layers][K−1][C]: the last K−1 projected inputs, oldest first
    ssm_state: Vec<f32>,  // [DeltaNet layers][nv][dk][dv]
}

impl State {
    /// A state with an f32 KV cache.
    pub fn new(config: &Config, ctx: usize) -> Result<State, String> {
        Self::with_kv(config, ctx, KvType::F32)
    }

    pub fn with_kv(config: &Config, ctx: usize, kv_type: KvType) -> Result<State, String> {
        let mut slot = Vec::with_capacity(config.n_layers);
        let (mut n_attn, mut n_dn) = (0usize, 0usize);
        for kind in &config.layer_kinds {
            let counter = if *kind == LayerKind::DeltaNet { &mut n_dn } else { &mut n_attn };
            slot.push(*counter);
            *counter += 1;
        }
        let dn = config.deltanet;
        let conv = n_dn * dn.conv_kernel.saturating_sub(1) * dn.conv_dim();
        let ssm = n_dn * dn.n_v_heads * dn.k_head_dim * dn.v_head_dim;
        Ok(State {
            pos: 0,
            ctx,
            slot,
            kv: KvCache::new(kv_type, n_attn, ctx, config.kv_dim(), config.head_dim)?,
            conv_state: try_alloc(conv, 0.0f32, "convolution state")?,
            ssm_state: try_alloc(ssm, 0.0f32, "recurrent state")?,
        })
    }

    /// Bytes held by the caches and recurrent state.
    pub fn bytes(&self) -> usize {
        self.kv.bytes() + (self.conv_state.len() + self.ssm_state.len()) * 4
    }

    /// True when the model has recurrent (DeltaNet) state, which cannot be
    /// rewound to an earlier position, only reset.
    pub fn is_recurrent(&self) -> bool {
        !self.ssm_state.is_empty()
    }

    /// Forgets everything: back to position 0.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.conv_state.fill(0.0);
        self.ssm_state.fill(0.0);
    }

    /// Keeps the first `pos` positions. Attention caches simply stop there;
    /// recurrent state cannot rewind, so such a model starts over.
    pub fn truncate(&mut self, pos: usize) {
        if pos < self.pos {
            if self.is_recurrent() {
                self.reset();
            } else {
                self.pos = pos;
            }
        }
    }
}

impl Model {
    pub fn load(path: &Path) -> Result<Model, String> {
        Self::load_with(path, LoadOptions::default())
    }

    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Model, String> {
        let file = Arc::new(Mlb::open(path)?);
        Self::from_mlb(file, options)
    }

    pub fn from_mlb(file: Arc<Mlb>, options: LoadOptions) -> Result<Model, String> {
        let config = Config::from_mlb(&file)?;
        let c = &config;
        let (d, f, v, hd) = (c.hidden_size, c.ffn_dim, c.vocab_size, c.head_dim);
        let q_rows = c.q_dim() * if c.attn_output_gate { 2 } else { 1 };
        let loader = Loader { file: &file, repack: options.repack && Arch::ROWS8 };
        let token_embd = loader.matrix("token_embd", v, d)?;
        let output = if c.tie_embeddings { token_embd.clone() } else { loader.matrix("output", v, d)? };
        let output_norm = loader.vector("output_norm", d, c.norm_unit_offset)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let name = |s: &str| format!("blk.{i}.{s}");
            let opt_vec = |s: &str, n: usize, offset: bool| -> Result<Option<Vec<f32>>, String> {
                if file.tensor(&name(s)).is_some() {
                    loader.vector(&name(s), n, offset).map(Some)
                } else {
                    Ok(None)
                }
            };
            let need_vec = |s: &str, n: usize, offset: bool| loader.vector(&name(s), n, offset);
            let sandwich = |s: &str| -> Result<Option<Vec<f32>>, String> {
                if c.norm_sandwich {
                    need_vec(s, d, c.norm_unit_offset).map(Some)
                } else {
                    Ok(None)
                }
            };
            let qk = |s: &str| -> Result<Option<Vec<f32>>, String> {
                if c.qk_norm {
                    need_vec(s, hd, c.norm_unit_offset).map(Some)
                } else {
                    Ok(None)
                }
            };
            let mixer = match c.layer_kinds[i] {
                LayerKind::Full | LayerKind::Sliding => Mixer::Attention(AttentionWeights {
                    q: loader.matrix(&name("attn_q"), q_rows, d)?,
                    k: loader.matrix(&name("attn_k"), c.kv_dim(), d)?,
                    v: loader.matrix(&name("attn_v"), c.kv_dim(), d)?,
                    o: loader.matrix(&name("attn_o"), d, c.q_dim())?,
                    q_bias: opt_vec("attn_q_bias", q_rows, false)?,
                    k_bias: opt_vec("attn_k_bias", c.kv_dim(), false)?,
                    v_bias: opt_vec("attn_v_bias", c.kv_dim(), false)?,
                    q_norm: qk("attn_q_norm")?,
                    k_norm: qk("attn_k_norm")?,
                }),
                LayerKind::DeltaNet => {
                    let dn = c.deltanet;
                    let (conv_dim, nv) = (dn.conv_dim(), dn.n_v_heads);
                    Mixer::DeltaNet(DeltaNetWeights {
                        qkv: loader.matrix(&name("ssm_qkv"), conv_dim, d)?,
                        z: loader.matrix(&name("ssm_z"), dn.value_dim(), d)?,
                        b: loader.matrix(&name("ssm_b"), nv, d)?,
                        a: loader.matrix(&name("ssm_a"), nv, d)?,
                        conv: loader.table(&name("ssm_conv"), conv_dim, dn.conv_kernel)?,
                        a_log: need_vec("ssm_a_log", nv, false)?,
                        dt_bias: need_vec("ssm_dt_bias", nv, false)?,
                        norm: need_vec("ssm_norm", dn.v_head_dim, false)?,
                        out: loader.matrix(&name("ssm_out"), d, dn.value_dim())?,
                    })
                }
            };
            layers.push(Layer {
                attn_norm: need_vec("attn_norm", d, c.norm_unit_offset)?,
                mixer,
                attn_post_norm: sandwich("attn_post_norm")?,
                ffn_norm: need_vec("ffn_norm", d, c.norm_unit_offset)?,
                ffn_gate: loader.matrix(&name("ffn_gate"), f, d)?,
                ffn_up: loader.matrix(&name("ffn_up"), f, d)?,
                ffn_down: loader.matrix(&name("ffn_down"), d, f)?,
                ffn_post_norm: sandwich("ffn_post_norm")?,
            });
        }
        Ok(Model { file, config, token_embd, output_norm, output, layers })
    }

    /// Bytes of weights one decoded token reads: every matrix of every
    /// layer and the output head (the embedding contributes one row).
    pub fn decode_bytes_per_token(&self) -> u64 {
        let mut total = self.output.len as u64 + (self.token_embd.len / self.token_embd.rows) as u64;
        for layer in &self.layers {
            total += layer.matrices().iter().map(|m| m.len as u64).sum::<u64>();
        }
        total
    }

    /// Bytes of memory holding repacked copies of weight rows (`LoadOptions::repack`).
    pub fn repacked_bytes(&self) -> usize {
        let packed = |m: &Matrix| m.packed.as_ref().map_or(0, |p| p.bytes());
        let tied = match (&self.token_embd.packed, &self.output.packed) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        let head = packed(&self.token_embd) + if tied { 0 } else { packed(&self.output) };
        head + self.layers.iter().flat_map(|l| l.matrices()).map(packed).sum::<usize>()
    }

    /// Number of weights (parameters) in the file.
    pub fn n_params(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.n_elements()).sum()
    }

    /// Borrow a stored matrix in its type. Alignment and size were checked at load.
    fn mat<'a>(&'a self, m: &'a Matrix) -> MatRef<'a> {
        let bytes = &self.file.bytes()[m.start..m.start + m.len];
        let data = match m.ttype {
            TensorType::F32 => WeightData::F32(cast::<f32>(bytes)),
            TensorType::F16 => WeightData::F16(cast::<f16>(bytes)),
            TensorType::Q8_0 => WeightData::Q8_0(cast::<BlockQ8_0>(bytes)),
            TensorType::Q4_0 => WeightData::Q4_0(cast::<BlockQ4_0>(bytes)),
            TensorType::Q8_0F32 => WeightData::Q8_0F32(cast::<BlockQ8_0F32>(bytes)),
            TensorType::Q4_0F32 => WeightData::Q4_0F32(cast::<BlockQ4_0F32>(bytes)),
        };
        let packed = match m.packed.as_deref() {
            Some(PackedRows::Q8(p)) => Packed::Q8(p),
            Some(PackedRows::Q4(p)) => Packed::Q4(p),
            None => Packed::None,
        };
        MatRef { rows: m.rows, cols: m.cols, data, packed }
    }

    /// Runs `tokens` (positions state.pos ..) through the model, appending to
    /// the cache, and returns logits [n][V] for the positions asked for.
    pub fn forward(&self, st: &mut State, tokens: &[u32], want: LogitsFor) -> Result<Vec<f32>, String> {
        let c = &self.config;
        let n_tok = tokens.len();
        if n_tok == 0 {
            return Ok(Vec::new());
        }
        if st.pos + n_tok > st.ctx {
            return Err(format!("context is full: {} positions + {n_tok} new exceed --ctx {}", st.pos, st.ctx));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(format!("token id {bad} is outside the vocabulary (size {})", c.vocab_size));
        }
        let d = c.hidden_size;
        let pos0 = st.pos;

        // x: [T][D] token embeddings
        let mut x = vec![0.0f32; n_tok * d];
        let embd = self.mat(&self.token_embd);
        for (t, row) in x.chunks_exact_mut(d).enumerate() {
            embd.row_to_f32(tokens[t] as usize, row);
            if c.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.embed_scale);
            }
        }

        let rope_tables = RopeTables::new(c, pos0, n_tok);
        let mut xn = vec![0.0f32; n_tok * d];
        let mut proj = vec![0.0f32; n_tok * d];
        let mut gate = vec![0.0f32; n_tok * c.ffn_dim];
        let mut up = vec![0.0f32; n_tok * c.ffn_dim];

        for (l, layer) in self.layers.iter().enumerate() {
            // ---- token mixing: attention or Gated DeltaNet ----
            rmsnorm_rows(&x, &layer.attn_norm, c.norm_eps, &mut xn, d);
            match &layer.mixer {
                Mixer::Attention(w) => self.attention_block(l, w, &xn, st, &rope_tables, &mut proj),
                Mixer::DeltaNet(w) => self.deltanet_block(l, w, &xn, st, &mut proj),
            }
            if let Some(w) = &layer.attn_post_norm {
                let tmp = proj.clone();
                rmsnorm_rows(&tmp, w, c.norm_eps, &mut proj, d);
            }
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);

            // ---- feed-forward ----
            rmsnorm_rows(&x, &layer.ffn_norm, c.norm_eps, &mut xn, d);
            let input = Input::new(&xn, d);
            let (wg, wu) = (self.mat(&layer.ffn_gate), self.mat(&layer.ffn_up));
            matmul_group(&mut [(&wg, &mut gate[..]), (&wu, &mut up[..])], &input);
            gate.par_chunks_mut(c.ffn_dim).zip(up.par_chunks(c.ffn_dim)).with_min_len(8).for_each(|(g, u)| {
                match c.activation {
                    Activation::Silu => Arch::silu_mul(g, u),
                    Activation::GeluTanh => Arch::gelu_tanh_mul(g, u),
                }
            });
            matmul(&self.mat(&layer.ffn_down), &Input::new(&gate, c.ffn_dim), &mut proj);
            if let Some(w) = &layer.ffn_post_norm {
                let tmp = proj.clone();
                rmsnorm_rows(&tmp, w, c.norm_eps, &mut proj, d);
            }
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        st.pos += n_tok;

        // ---- head ----
        let rows: &[f32] = match want {
            LogitsFor::None => return Ok(Vec::new()),
            LogitsFor::Last => &x[(n_tok - 1) * d..],
            LogitsFor::All => &x,
        };
        let mut normed = vec![0.0f32; rows.len()];
        rmsnorm_rows(rows, &self.output_norm, c.norm_eps, &mut normed, d);
        let mut logits = vec![0.0f32; rows.len() / d * c.vocab_size];
        matmul(&self.mat(&self.output), &Input::new(&normed, d), &mut logits);
        if c.final_softcap > 0.0 {
            let cap = c.final_softcap;
            logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        Ok(logits)
    }
}

impl Model {
    /// Attention for the new tokens: q/k/v projections, biases, q/k norms,
    /// RoPE, cache append, causal (windowed) attention, output gate, o_proj.
    fn attention_block(
        &self,
        l: usize,
        w: &AttentionWeights,
        xn: &[f32],
        st: &mut State,
        rope: &RopeTables,
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, kv_dim) = (c.head_dim, c.kv_dim());
        let n_tok = xn.len() / c.hidden_size;
        let input = Input::new(xn, c.hidden_size);
        let mut q = vec![0.0f32; n_tok * w.q.rows];
        let mut k = vec![0.0f32; n_tok * kv_dim];
        let mut v = vec![0.0f32; n_tok * kv_dim];
        let (wq, wk, wv) = (self.mat(&w.q), self.mat(&w.k), self.mat(&w.v));
        matmul_group(&mut [(&wq, &mut q[..]), (&wk, &mut k[..]), (&wv, &mut v[..])], &input);
        add_bias_rows(&mut q, w.q_bias.as_deref());
        add_bias_rows(&mut k, w.k_bias.as_deref());
        add_bias_rows(&mut v, w.v_bias.as_deref());

        // Split [query | gate] per head when the layer has an output gate.
        let (mut queries, gates) = if c.attn_output_gate { split_query_gate(&q, c) } else { (q, Vec::new()) };
        if let Some(wn) = &w.q_norm {
            head_rmsnorm(&mut queries, wn, hd, c.norm_eps);
        }
        if let Some(wn) = &w.k_norm {
            head_rmsnorm(&mut k, wn, hd, c.norm_eps);
        }
        let sliding = c.layer_kinds[l] == LayerKind::Sliding;
        if c.layer_rope[l] {
            let table = if sliding { &rope.local } else { &rope.global };
            rope.apply(table, &mut queries, hd);
            rope.apply(table, &mut k, hd);
        }

        // Append keys and values to this layer's cache slot.
        st.kv.write(st.slot[l], st.pos, &k, &v);
        let window = if sliding { c.sliding_window } else { 0 };
        let mut att = vec![0.0f32; n_tok * c.q_dim()];
        attention(c, &queries, &st.kv, st.slot[l], st.pos, window, &mut att);
        if c.attn_output_gate {
            for (a, g) in att.iter_mut().zip(&gates) {
                *a *= 1.0 / (1.0 + (-*g).exp());
            }
        }
        matmul(&self.mat(&w.o), &Input::new(&att, c.q_dim()), out);
    }

    /// Gated DeltaNet for the new tokens, one token after another (the
    /// recurrent form), value heads in parallel.
    fn deltanet_block(&self, l: usize, w: &DeltaNetWeights, xn: &[f32], st: &mut State, out: &mut [f32]) {
        let c = &self.config;
        let dn = c.deltanet;
        let (nk, nv, dk, dv, kw) = (dn.n_k_heads, dn.n_v_heads, dn.k_head_dim, dn.v_head_dim, dn.conv_kernel);
        let conv_dim = dn.conv_dim();
        let n_tok = xn.len() / c.hidden_size;
        let input = Input::new(xn, c.hidden_size);
        let mut mixed = vec![0.0f32; n_tok * conv_dim]; // [T][C]
        let mut z = vec![0.0f32; n_tok * dn.value_dim()]; // [T][nv·dv]
        let mut b = vec![0.0f32; n_tok * nv];
        let mut a = vec![0.0f32; n_tok * nv];
        let (wqkv, wz, wb, wa) = (self.mat(&w.qkv), self.mat(&w.z), self.mat(&w.b), self.mat(&w.a));
        matmul_group(&mut [(&wqkv, &mut mixed[..]), (&wz, &mut z[..]), (&wb, &mut b[..]), (&wa, &mut a[..])], &input);

        let slot = st.slot[l];
        let hist = kw - 1;
        let conv_state = &mut st.conv_state[slot * hist * conv_dim..(slot + 1) * hist * conv_dim];
        let ssm = &mut st.ssm_state[slot * nv * dk * dv..(slot + 1) * nv * dk * dv];
        let mut core = vec![0.0f32; n_tok * dn.value_dim()]; // [T][nv·dv]
        let mut conv_out = vec![0.0f32; conv_dim];
        for t in 0..n_tok {
            // Causal depthwise convolution over [state (K−1 inputs) | this input], then SiLU.
            let m_t = &mixed[t * conv_dim..(t + 1) * conv_dim];
            for (ch, o) in conv_out.iter_mut().enumerate() {
                let wrow = &w.conv[ch * kw..(ch + 1) * kw];
                let mut acc = 0.0f32;
                for j in 0..hist {
                    acc += wrow[j] * conv_state[j * conv_dim + ch];
                }
                acc += wrow[hist] * m_t[ch];
                *o = acc / (1.0 + (-acc).exp());
            }
            if hist > 0 {
                conv_state.copy_within(conv_dim.., 0);
                conv_state[(hist - 1) * conv_dim..].copy_from_slice(m_t);
            }
            let (q_all, rest) = conv_out.split_at(nk * dk);
            let (k_all, v_all) = rest.split_at(nk * dk);
            let (b_t, a_t) = (&b[t * nv..(t + 1) * nv], &a[t * nv..(t + 1) * nv]);
            let z_t = &z[t * nv * dv..(t + 1) * nv * dv];
            let core_t = &mut core[t * nv * dv..(t + 1) * nv * dv];
            let group = nv / nk;
            ssm.par_chunks_mut(dk * dv).zip(core_t.par_chunks_mut(dv)).enumerate().for_each(|(j, (s, o))| {
                let kh = j / group;
                let scale = 1.0 / (dk as f32).sqrt();
                let q: Vec<f32> = l2norm(&q_all[kh * dk..(kh + 1) * dk]).iter().map(|v| v * scale).collect();
                let k = l2norm(&k_all[kh * dk..(kh + 1) * dk]);
                let v = &v_all[j * dv..(j + 1) * dv];
                let beta = 1.0 / (1.0 + (-b_t[j]).exp());
                let g = -w.a_log[j].exp() * softplus(a_t[j] + w.dt_bias[j]);
                delta_rule_step(s, &q, &k, v, g.exp(), beta, dk, dv, o);
                // Gated RMSNorm: rmsnorm(o) · w · silu(z)
                let mut normed = vec![0.0f32; dv];
                Arch::rmsnorm(o, &w.norm, c.norm_eps, &mut normed);
                for (e, ov) in o.iter_mut().enumerate() {
                    let zv = z_t[j * dv + e];
                    *ov = normed[e] * (zv / (1.0 + (-zv).exp()));
                }
            });
        }
        matmul(&self.mat(&w.out), &Input::new(&core, dn.value_dim()), out);
    }
}

/// x / sqrt(Σx² + 1e-6), as transformers' l2norm in the DeltaNet kernel.
fn l2norm(x: &[f32]) -> Vec<f32> {
    let inv = 1.0 / (Arch::dot_f32(x, x) + 1e-6).sqrt();
    x.iter().map(|v| v * inv).collect()
}

/// softplus with torch's threshold: x above 20 passes through.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One delta-rule step on a head's state S [dk][dv]:
/// S ← S·decay; S += k ⊗ β(v − Sᵀk); o = Sᵀq (reading the updated state).
#[allow(clippy::too_many_arguments)]
fn delta_rule_step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    dk: usize,
    dv: usize,
    o: &mut [f32],
) {
    s.iter_mut().for_each(|x| *x *= decay);
    let mut kv_mem = vec![0.0f32; dv];
    for d in 0..dk {
        Arch::axpy(k[d], &s[d * dv..(d + 1) * dv], &mut kv_mem);
    }
    let delta: Vec<f32> = v.iter().zip(&kv_mem).map(|(vv, m)| (vv - m) * beta).collect();
    for d in 0..dk {
        Arch::axpy(k[d], &delta, &mut s[d * dv..(d + 1) * dv]);
    }
    o.fill(0.0);
    for d in 0..dk {
        Arch::axpy(q[d], &s[d * dv..(d + 1) * dv], o);
    }
}

/// Reinterprets validated file bytes as a slice of `T`.
fn cast<T>(bytes: &[u8]) -> &[T] {
    assert!(
        bytes.as_ptr().align_offset(std::mem::align_of::<T>()) == 0
            && bytes.len().is_multiple_of(std::mem::size_of::<T>())
    );
    // SAFETY: alignment and length were asserted just above; T is a plain-old-data
    // type (f32, f16 or a #[repr(C)] block of integers/floats) valid for any bits.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / std::mem::size_of::<T>()) }
}

/// Checks tensors against the configuration while loading.
struct Loader<'a> {
    file: &'a Mlb,
    /// Repack Q8_0 / Q4_0 matrices for `kernels::rows8`.
    repack: bool,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo, String> {
        self.file.tensor(name).ok_or_else(|| format!("{}: missing tensor '{name}'", self.file.path))
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, String> {
        let t = self.info(name)?;
        if t.dims != [rows as u64, cols as u64] {
            return Err(format!(
                "{}: tensor '{name}' has shape {:?}, expected [{rows}, {cols}]",
                self.file.path, t.dims
            ));
        }
        let align = match t.ttype {
            TensorType::F32 | TensorType::Q8_0F32 | TensorType::Q4_0F32 => 4,
            _ => 2,
        };
        if self.file.tensor_bytes(t).as_ptr().align_offset(align) != 0 {
            return Err(format!("{}: tensor '{name}' is misaligned", self.file.path));
        }
        let mut m = Matrix { ttype: t.ttype, rows, cols, start: t.start, len: t.len, packed: None };
        if self.repack && rows >= ROWS8 {
            let bytes = self.file.tensor_bytes(t);
            let what = format!("{}: tensor '{name}'", self.file.path);
            m.packed = match t.ttype {
                TensorType::Q8_0 => {
                    Some(PackedRows::Q8(repack_q8_x8(cast(bytes), cols / QK, Arch::Q8_X8_BIAS, &what)?))
                }
                TensorType::Q4_0 => Some(PackedRows::Q4(repack_q4_x8(cast(bytes), cols / QK, &what)?)),
                _ => None,
            }
            .map(Arc::new);
        }
        Ok(m)
    }

    /// A small 2-D f32/f16 tensor [rows, cols] copied out (convolution weights).
    fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, String> {
        let t = self.info(name)?;
        if t.dims != [rows as u64, cols as u64] {
            return Err(format!(
                "{}: tensor '{name}' has shape {:?}, expected [{rows}, {cols}]",
                self.file.path, t.dims
            ));
        }
        self.floats(name, t)
    }

    fn floats(&self, name: &str, t: &TensorInfo) -> Result<Vec<f32>, String> {
        let bytes = self.file.tensor_bytes(t);
        match t.ttype {
            TensorType::F32 => Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()),
            TensorType::F16 => {
                Ok(bytes.chunks_exact(2).map(|b| f16::from_le_bytes(b.try_into().unwrap()).to_f32()).collect())
            }
            other => Err(format!("{}: tensor '{name}' must be f32 or f16, not {}", self.file.path, other.name())),
        }
    }

    /// A 1-D f32/f16 tensor copied out, plus `1` per element for (1 + w) norms.
    fn vector(&self, name: &str, n: usize, unit_offset: bool) -> Result<Vec<f32>, String> {
        let t = self.info(name)?;
        if t.dims != [n as u64] {
            return Err(format!("{}: tensor '{name}' has shape {:?}, expected [{n}]", self.file.path, t.dims));
        }
        let mut out = self.floats(name, t)?;
        if unit_offset {
            out.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(out)
    }
}

fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    out.par_chunks_mut(d).zip(x.par_chunks(d)).with_min_len(8).for_each(|(o, r)| Arch::rmsnorm(r, w, eps, o));
}

fn add_bias_rows(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        x.chunks_exact_mut(b.len()).for_each(|row| row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv));
    }
}

/// RMSNorm of every head_dim-wide slice (q/k norms).
fn head_rmsnorm(x: &mut [f32], w: &[f32], hd: usize, eps: f32) {
    let mut tmp = vec![0.0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        Arch::rmsnorm(head, w, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    }
}

/// [T][H][2·hd] (query rows then gate rows per head) → ([T][H·hd], [T][H·hd]).
fn split_query_gate(q: &[f32], c: &Config) -> (Vec<f32>, Vec<f32>) {
    let hd = c.head_dim;
    let mut query = Vec::with_capacity(q.len() / 2);
    let mut gate = Vec::with_capacity(q.len() / 2);
    for head in q.chunks_exact(2 * hd) {
        query.extend_from_slice(&head[..hd]);
        gate.extend_from_slice(&head[hd..]);
    }
    (query, gate)
}

/// cos/sin of position × inverse frequency for the positions of one call.
struct RopeTables {
    style: RopeStyle,
    rope_dim: usize,
    global: Vec<(f32, f32)>, // [T][rope_dim/2]
    local: Vec<(f32, f32)>,
}

impl RopeTables {
    fn new(c: &Config, pos0: usize, n_tok: usize) -> Self {
        let table = |inv: &[f32]| -> Vec<(f32, f32)> {
            let mut t = Vec::with_capacity(n_tok * inv.len());
            for p in pos0..pos0 + n_tok {
                for &f in inv {
                    // Angle in f32 as transformers computes it; cos/sin rounded from f64.
                    let angle = (p as f32 * f) as f64;
                    t.push((angle.cos() as f32, angle.sin() as f32));
                }
            }
            t
        };
        RopeTables {
            style: c.rope_style,
            rope_dim: c.rope_dim,
            global: table(&c.inv_freq_global),
            local: table(&c.inv_freq_local),
        }
    }

    /// Rotates the first rope_dim dims of every head of every row of x ([T][heads·hd]).
    fn apply(&self, table: &[(f32, f32)], x: &mut [f32], hd: usize) {
        let half = self.rope_dim / 2;
        let n_tok = table.len() / half;
        let row_len = x.len() / n_tok;
        for (t, row) in x.chunks_exact_mut(row_len).enumerate() {
            let cs = &table[t * half..(t + 1) * half];
            for head in row.chunks_exact_mut(hd) {
                for (i, &(cos, sin)) in cs.iter().enumerate() {
                    let (a, b) = match self.style {
                        RopeStyle::Half => (i, i + half),
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x1 * cos + x0 * sin;
                }
            }
        }
    }
}

/// Causal (optionally windowed) multi-head attention of T new queries over the
/// cache slot of this layer; writes [T][H·hd]. One task per (token, head):
/// fixed order inside.
fn attention(c: &Config, q: &[f32], kv: &KvCache, slot: usize, pos0: usize, window: usize, out: &mut [f32]) {
    let hd = c.head_dim;
    let group = c.n_heads / c.n_kv_heads;
    // Short contexts are cheaper on one thread than split across several.
    let positions = pos0 + q.len() / (c.n_heads * hd);
    let min_len = (4096 / (positions * hd).max(1)).clamp(1, c.n_heads);
    out.par_chunks_mut(hd).enumerate().with_min_len(min_len).for_each(|(idx, o)| {
        let (t, h) = (idx / c.n_heads, idx % c.n_heads);
        let pos = pos0 + t;
        let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
        let query = kv.query(&q[(t * c.n_heads + h) * hd..][..hd]);
        let kv_off = (h / group) * hd;
        let mut scores = vec![0.0f32; pos + 1 - first];
        kv.scores(slot, first, kv_off, &query, &mut scores);
        for s in scores.iter_mut() {
            *s *= c.query_scale;
            if c.attn_softcap > 0.0 {
                *s = c.attn_softcap * (*s / c.attn_softcap).tanh();
            }
        }
        Arch::softmax(&mut scores);
        o.fill(0.0);
        let mut scratch = vec![0.0f32; hd];
        kv.accumulate_values(slot, first, kv_off, &scores, o, &mut scratch);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
