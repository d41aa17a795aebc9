//! A model's weights: where each matrix lies in the mapped file, in which
//! layout (plain rows, or the eight-row groups the kernels read: docs/FORMAT.md),
//! the copies load makes when the file's layout is not the build's
//! (eight-row groups repacked from plain rows, or plain rows de-interleaved
//! from groups), and the small vectors (norms, biases) copied out at load
//! time, checked against the configuration.

use std::sync::Arc;

use half::f16;

use super::config::{Config, LayerKind};
use super::Model;
use crate::format::mlb::{rows8_block_bytes, Layout, Mlb, TensorInfo, TensorType};
use crate::kernels::{Arch, Kernels, MatRef, Packed, WeightData};
use crate::quant::{
    deinterleave_x8, dequant_mxfp4, dequant_q4, dequant_q4k, dequant_q5k, dequant_q6k, dequant_q8, f16_to_f32,
    nonfinite_block, nonfinite_scale_error, rebias_q8_x8, repack_rows8, BlockMxfp4, BlockMxfp4x8, BlockQ4K, BlockQ4Kx8,
    BlockQ4_0, BlockQ4_0F32, BlockQ4_0x8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, BlockQ8_0, BlockQ8_0F32,
    BlockQ8_0x8, Rows8, Scaled, Scales, QK, QK_K, ROWS8,
};

/// A weight matrix: the tensor in the mapped file, where the kernels read
/// its plain rows, and where its eight-row groups, if the build's kernels
/// read them.
#[derive(Clone, Debug)]
pub(super) struct Matrix {
    pub(super) ttype: TensorType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// The tensor's bytes in the file, in its stored layout.
    pub(super) start: usize,
    pub(super) len: usize,
    /// The plain rows: rows `plain_from ..` are valid (the earlier ones are
    /// read through the groups: a `rows8` tensor used in place).
    plain: Rows,
    plain_from: usize,
    pub(super) groups: Groups,
}

/// Where a matrix's plain rows lie.
#[derive(Clone, Debug)]
enum Rows {
    /// A byte range of the file, read as rows × blocks of the type from
    /// `start` (for a `rows8` tensor: placed so that its plain tail rows
    /// are at their row index).
    File { start: usize, len: usize },
    /// De-interleaved at load from the file's groups (a build without
    /// eight-row kernels for the type).
    Copy(Arc<PlainRows>),
}

/// Where a matrix's eight-row groups lie, if the kernels read them.
#[derive(Clone, Debug)]
pub(super) enum Groups {
    None,
    /// In the file (a `rows8` tensor used in place; Q8_0 with bias 0).
    File {
        start: usize,
        len: usize,
    },
    /// Made at load (repacked from plain rows; Q8_0 with `Arch::Q8_X8_BIAS`).
    Copy(Arc<PackedRows>),
}

/// Every row of a `rows8` tensor in the plain layout (its groups
/// de-interleaved, then its tail rows), for builds without eight-row kernels.
#[derive(Debug)]
pub(super) enum PlainRows {
    Q8(Vec<BlockQ8_0>),
    Q4(Vec<BlockQ4_0>),
    Q4K(Vec<BlockQ4K>),
    Q6K(Vec<BlockQ6K>),
}

/// Bytes of memory holding weights copied at load (`Model::weight_copies`).
#[derive(Clone, Copy, Debug, Default)]
pub struct WeightCopies {
    /// Eight-row groups made from plain rows (or re-biased Q8_0 groups).
    pub repacked: usize,
    /// Plain rows made from the file's eight-row groups.
    pub deinterleaved: usize,
}

impl Matrix {
    pub(super) fn copies(&self) -> WeightCopies {
        WeightCopies {
            repacked: match &self.groups {
                Groups::Copy(p) => p.bytes(),
                _ => 0,
            },
            // a plain copy holds every row
            deinterleaved: match &self.plain {
                Rows::Copy(_) => self.rows * self.ttype.row_bytes(self.cols as u64).unwrap_or(0) as usize,
                Rows::File { .. } => 0,
            },
        }
    }
}

/// Rows 0 .. ⌊rows/8⌋·8 of a Q8_0 / Q4_0 (or, when the kernels have them,
/// Q4_K / Q5_K / Q6_K / MXFP4) matrix copied into the interleaved layout of
/// the eight-row kernels (`Kernels::dot_q8_r8`, `dot_q4k_r8` ...; memory:
/// the same bytes again, Q4_K's 3 %, Q5_K's 2 % and Q6_K's 30 % more).
#[derive(Debug)]
pub(super) enum PackedRows {
    Q8(Vec<BlockQ8_0x8>),
    Q4(Vec<BlockQ4_0x8>),
    Q4K(Vec<BlockQ4Kx8>),
    Q5K(Vec<BlockQ5Kx8>),
    Q6K(Vec<BlockQ6Kx8>),
    Mxfp4(Vec<BlockMxfp4x8>),
}

impl PackedRows {
    pub(super) fn bytes(&self) -> usize {
        match self {
            PackedRows::Q8(v) => std::mem::size_of_val(&v[..]),
            PackedRows::Q4(v) => std::mem::size_of_val(&v[..]),
            PackedRows::Q4K(v) => std::mem::size_of_val(&v[..]),
            PackedRows::Q5K(v) => std::mem::size_of_val(&v[..]),
            PackedRows::Q6K(v) => std::mem::size_of_val(&v[..]),
            PackedRows::Mxfp4(v) => std::mem::size_of_val(&v[..]),
        }
    }
}

/// How to load a model.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Copy Q8_0 / Q4_0 (and Q4_K / Q5_K / Q6_K) matrices stored as plain rows
    /// into the eight-row interleaved layout when this build has kernels
    /// for it (faster; costs their size in memory). Matrices stored
    /// interleaved are read in place either way.
    pub repack: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { repack: true }
    }
}

/// Weights of one transformer block.
pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>, // [D]
    pub(super) mixer: Mixer,
    pub(super) attn_post_norm: Option<Vec<f32>>, // [D]
    pub(super) ffn_norm: Vec<f32>,               // [D]
    pub(super) ffn: Ffn,
    pub(super) ffn_post_norm: Option<Vec<f32>>, // [D]
}

impl Layer {
    /// The layer's weight matrices: the mixer's, then the feed-forward's.
    pub(super) fn matrices(&self) -> Vec<&Matrix> {
        self.matrices_per_token().into_iter().map(|(m, _)| m).collect()
    }

    /// Each weight matrix with the share of its rows one token reads:
    /// all of them, but the experts' `n_used / n_experts`.
    pub(super) fn matrices_per_token(&self) -> Vec<(&Matrix, f64)> {
        let mut mats: Vec<(&Matrix, f64)> = match &self.mixer {
            Mixer::Attention(w) => vec![&w.q, &w.k, &w.v, &w.o],
            Mixer::DeltaNet(w) => vec![&w.qkv, &w.z, &w.b, &w.a, &w.out],
        }
        .into_iter()
        .map(|m| (m, 1.0))
        .collect();
        match &self.ffn {
            Ffn::Dense(f) => mats.extend([(&f.gate, 1.0), (&f.up, 1.0), (&f.down, 1.0)]),
            Ffn::Experts(x) => {
                let share = x.n_used as f64 / x.n_experts as f64;
                mats.extend([(&x.router, 1.0), (&x.gate, share), (&x.up, share), (&x.down, share)]);
                if let Some(f) = &x.shared {
                    mats.extend([(&f.gate, 1.0), (&f.up, 1.0), (&f.down, 1.0)]);
                }
            }
        }
        mats
    }
}

/// The feed-forward half of a block.
#[allow(clippy::large_enum_variant)] // (one a layer: a box would save nothing worth a pointer's chase)
pub(super) enum Ffn {
    Dense(DenseFfn),
    Experts(ExpertsFfn),
}

/// A gated feed-forward block: down(act(gate·x) ⊙ up·x).
pub(super) struct DenseFfn {
    pub(super) gate: Matrix, // [F, D]
    pub(super) up: Matrix,   // [F, D]
    pub(super) down: Matrix, // [D, F]
}

/// A Mixture-of-Experts feed-forward block: the router's top experts
/// for each token, each a `DenseFfn` whose matrices are stacked in one
/// tensor (expert e's rows are e·rows .. (e + 1)·rows, as GGUF stores
/// them), plus, in some families, a shared expert every token goes through.
pub(super) struct ExpertsFfn {
    pub(super) n_experts: usize,
    pub(super) n_used: usize,
    pub(super) router: Matrix,                // [E, D]
    pub(super) router_bias: Option<Vec<f32>>, // [E]
    pub(super) gate: Matrix,                  // [E·Fe, D]
    pub(super) up: Matrix,                    // [E·Fe, D]
    pub(super) down: Matrix,                  // [E·D, Fe]
    pub(super) shared: Option<DenseFfn>,      // [Fs, D], [Fs, D], [D, Fs]
    pub(super) shared_gate: Option<Vec<f32>>, // [D]: sigmoid(g·x) scales the shared expert's output
    /// Each expert's biases (gpt-oss): [E·Fe], [E·Fe], [E·D].
    pub(super) gate_bias: Option<Vec<f32>>,
    pub(super) up_bias: Option<Vec<f32>>,
    pub(super) down_bias: Option<Vec<f32>>,
}

/// The token-mixing half of a block.
pub(super) enum Mixer {
    Attention(AttentionWeights),
    DeltaNet(DeltaNetWeights),
}

pub(super) struct AttentionWeights {
    pub(super) q: Matrix,                // [H·hd, D]; [H·2·hd, D] with the output gate
    pub(super) k: Matrix,                // [Hkv·hd, D]
    pub(super) v: Matrix,                // [Hkv·hd, D]
    pub(super) o: Matrix,                // [D, H·hd]
    pub(super) q_bias: Option<Vec<f32>>, // [rows of q]
    pub(super) k_bias: Option<Vec<f32>>, // [Hkv·hd]
    pub(super) v_bias: Option<Vec<f32>>, // [Hkv·hd]
    pub(super) o_bias: Option<Vec<f32>>, // [D]
    /// Attention sinks (gpt-oss): one logit per head, in every softmax's
    /// denominator and attending to nothing.
    pub(super) sinks: Option<Vec<f32>>, // [H]
    pub(super) q_norm: Option<Vec<f32>>, // [hd]
    pub(super) k_norm: Option<Vec<f32>>, // [hd]
}

pub(super) struct DeltaNetWeights {
    pub(super) qkv: Matrix,       // [C, D], C = 2·nk·dk + nv·dv
    pub(super) z: Matrix,         // [nv·dv, D]
    pub(super) b: Matrix,         // [nv, D]
    pub(super) a: Matrix,         // [nv, D]
    pub(super) conv: Vec<f32>,    // [C, K]
    pub(super) decay: Vec<f32>,   // [nv]: −exp(A_log)
    pub(super) dt_bias: Vec<f32>, // [nv]
    pub(super) norm: Vec<f32>,    // [dv]
    pub(super) out: Matrix,       // [D, nv·dv]
}

impl Model {
    pub fn from_mlb(file: Arc<Mlb>, options: LoadOptions) -> Result<Model, String> {
        let config = Config::from_mlb(&file)?;
        let c = &config;
        let (d, f, v, hd) = (c.hidden_size, c.ffn_dim, c.vocab_size, c.head_dim);
        let q_rows = c.q_dim() * if c.attn_output_gate { 2 } else { 1 };
        let loader = Loader { file: &file, repack: options.repack };
        let token_embd = loader.matrix("token_embd", v, d)?;
        let output = if c.tie_embeddings { token_embd.clone() } else { loader.matrix("output", v, d)? };
        let output_norm = loader.vector("output_norm", d, c.norm_unit_offset)?;
        // (grown as each layer's tensors are found, not sized by the file's claim)
        let mut layers = Vec::new();
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
            let opt_table = |s: &str, rows: usize, cols: usize| -> Result<Option<Vec<f32>>, String> {
                match file.tensor(&name(s)) {
                    Some(_) => loader.table(&name(s), rows, cols).map(Some),
                    None => Ok(None),
                }
            };
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
                    o_bias: opt_vec("attn_o_bias", d, false)?,
                    sinks: opt_vec("attn_sinks", c.n_heads, false)?,
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
                        // A_log as Hugging Face stores it, or −exp(A_log) as GGUF does
                        decay: match file.tensor(&name("ssm_a_neg_exp")) {
                            Some(_) => need_vec("ssm_a_neg_exp", nv, false)?,
                            None => need_vec("ssm_a_log", nv, false)?.iter().map(|&v| -libm::expf(v)).collect(),
                        },
                        dt_bias: need_vec("ssm_dt_bias", nv, false)?,
                        norm: need_vec("ssm_norm", dn.v_head_dim, false)?,
                        out: loader.matrix(&name("ssm_out"), d, dn.value_dim())?,
                    })
                }
            };
            let dense = |prefix: &str, rows: usize| -> Result<DenseFfn, String> {
                Ok(DenseFfn {
                    gate: loader.matrix(&name(&format!("ffn_gate{prefix}")), rows, d)?,
                    up: loader.matrix(&name(&format!("ffn_up{prefix}")), rows, d)?,
                    down: loader.matrix(&name(&format!("ffn_down{prefix}")), d, rows)?,
                })
            };
            let ffn = if file.tensor(&name("ffn_gate_inp")).is_some() {
                let moe = &c.moe;
                if moe.n_experts == 0 {
                    return Err(format!("{}: layer {i} has a router (ffn_gate_inp) but n_experts is 0", file.path));
                }
                let (e, fe) = (moe.n_experts, moe.expert_ffn_dim);
                let shared = (moe.shared_ffn_dim > 0).then(|| dense("_shexp", moe.shared_ffn_dim)).transpose()?;
                let shared_gate = match file.tensor(&name("ffn_gate_inp_shexp")) {
                    Some(_) if shared.is_none() => {
                        return Err(format!("{}: layer {i} gates a shared expert it does not have", file.path))
                    }
                    Some(_) => Some(loader.table(&name("ffn_gate_inp_shexp"), 1, d)?),
                    None => None,
                };
                Ffn::Experts(ExpertsFfn {
                    n_experts: e,
                    n_used: moe.n_used,
                    router: loader.matrix(&name("ffn_gate_inp"), e, d)?,
                    router_bias: opt_vec("ffn_gate_inp_bias", e, false)?,
                    gate: loader.experts(&name("ffn_gate_exps"), e, fe, d)?,
                    up: loader.experts(&name("ffn_up_exps"), e, fe, d)?,
                    down: loader.experts(&name("ffn_down_exps"), e, d, fe)?,
                    shared,
                    shared_gate,
                    gate_bias: opt_table("ffn_gate_exps_bias", e, fe)?,
                    up_bias: opt_table("ffn_up_exps_bias", e, fe)?,
                    down_bias: opt_table("ffn_down_exps_bias", e, d)?,
                })
            } else {
                Ffn::Dense(dense("", f)?)
            };
            layers.push(Layer {
                attn_norm: need_vec("attn_norm", d, c.norm_unit_offset)?,
                mixer,
                attn_post_norm: sandwich("attn_post_norm")?,
                ffn_norm: need_vec("ffn_norm", d, c.norm_unit_offset)?,
                ffn,
                ffn_post_norm: sandwich("ffn_post_norm")?,
            });
        }
        Ok(Model {
            file,
            config,
            token_embd,
            output_norm,
            output,
            layers,
            input_stats: None,
            nonfinite_weight: std::sync::OnceLock::new(),
        })
    }

    /// Borrow a stored matrix in its type. Alignment and size were checked at load.
    pub(super) fn mat<'a>(&'a self, m: &'a Matrix) -> MatRef<'a> {
        let bytes = match &m.plain {
            Rows::File { start, len } => self.file.range(*start, *len),
            Rows::Copy(_) => &[],
        };
        let data = match (&m.plain, m.ttype) {
            (Rows::Copy(p), _) => match &**p {
                PlainRows::Q8(v) => WeightData::Q8_0(v),
                PlainRows::Q4(v) => WeightData::Q4_0(v),
                PlainRows::Q4K(v) => WeightData::Q4K(v),
                PlainRows::Q6K(v) => WeightData::Q6K(v),
            },
            (_, ttype) => Self::plain_data(ttype, bytes),
        };
        let packed = match &m.groups {
            Groups::Copy(p) => match &**p {
                PackedRows::Q8(p) => Packed::Q8(p),
                PackedRows::Q4(p) => Packed::Q4(p),
                PackedRows::Q4K(p) => Packed::Q4K(p),
                PackedRows::Q5K(p) => Packed::Q5K(p),
                PackedRows::Q6K(p) => Packed::Q6K(p),
                PackedRows::Mxfp4(p) => Packed::Mxfp4(p),
            },
            Groups::File { start, len } => {
                let g = self.file.range(*start, *len);
                match m.ttype {
                    TensorType::Q8_0 => Packed::Q8(cast(g)),
                    TensorType::Q4_0 => Packed::Q4(cast(g)),
                    TensorType::Q4K => Packed::Q4K(cast(g)),
                    TensorType::Q6K => Packed::Q6K(cast(g)),
                    _ => Packed::None,
                }
            }
            Groups::None => Packed::None,
        };
        MatRef { rows: m.rows, cols: m.cols, data, packed }
    }

    /// Plain rows of a type as the kernels read them.
    fn plain_data(ttype: TensorType, bytes: &[u8]) -> WeightData<'_> {
        match ttype {
            TensorType::F32 => WeightData::F32(cast::<f32>(bytes)),
            TensorType::F16 => WeightData::F16(cast::<f16>(bytes)),
            TensorType::Q8_0 => WeightData::Q8_0(cast::<BlockQ8_0>(bytes)),
            TensorType::Q4_0 => WeightData::Q4_0(cast::<BlockQ4_0>(bytes)),
            TensorType::Q8_0F32 => WeightData::Q8_0F32(cast::<BlockQ8_0F32>(bytes)),
            TensorType::Q4_0F32 => WeightData::Q4_0F32(cast::<BlockQ4_0F32>(bytes)),
            TensorType::Q4K => WeightData::Q4K(cast::<BlockQ4K>(bytes)),
            TensorType::Q5K => WeightData::Q5K(cast::<BlockQ5K>(bytes)),
            TensorType::Q6K => WeightData::Q6K(cast::<BlockQ6K>(bytes)),
            TensorType::Mxfp4 => WeightData::Mxfp4(cast::<BlockMxfp4>(bytes)),
        }
    }

    /// Row `r` of the token embeddings as f32: the plain row, or for a
    /// matrix whose first rows are only in eight-row groups (a `rows8`
    /// tensor used in place) the row taken out of its group, dequantised by
    /// the same function, so the values are the same bits.
    pub(super) fn embedding_row(&self, r: usize, out: &mut [f32]) {
        let m = &self.token_embd;
        let w = self.mat(m);
        if r >= m.plain_from {
            return w.row_to_f32(r, out);
        }
        // groups in the file hold Q8_0 with bias 0, groups made at load the build's
        let bias = if matches!(m.groups, Groups::File { .. }) { 0 } else { Arch::Q8_X8_BIAS };
        fn row_of<X: Rows8>(groups: &[X], r: usize, nb: usize, bias: u8) -> Vec<X::Row> {
            let (g, k) = (r / ROWS8, r % ROWS8);
            groups[g * nb..(g + 1) * nb].iter().map(|x| x.row(k, bias)).collect()
        }
        let (nb, nbk) = (m.cols / QK, m.cols / QK_K);
        match w.packed {
            Packed::Q8(p) => dequant_q8(&row_of(p, r, nb, bias), out),
            Packed::Q4(p) => dequant_q4(&row_of(p, r, nb, bias), out),
            Packed::Q4K(p) => dequant_q4k(&row_of(p, r, nbk, bias), out),
            Packed::Q5K(p) => dequant_q5k(&row_of(p, r, nbk, bias), out),
            Packed::Q6K(p) => dequant_q6k(&row_of(p, r, nbk, bias), out),
            Packed::Mxfp4(p) => dequant_mxfp4(&row_of(p, r, nb, bias), out),
            // (not reached: `plain_from` is 0 unless the groups are there)
            Packed::None => w.row_to_f32(r, out),
        }
    }
}

/// Validated file bytes as a slice of `T` (f32, f16 or a `#[repr(C)]`
/// block: `Pod`, so every bit pattern is a valid value). The loader checked
/// the alignment and the length; `cast_slice` checks them again.
fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> &[T] {
    bytemuck::cast_slice(bytes)
}

/// All rows of a `rows8` tensor in the plain layout: its groups (Q8_0 with
/// bias 0) de-interleaved, then its plain tail rows; every block's scales
/// checked on the way.
fn plain_copy<X: Rows8>(groups: &[u8], tail: &[u8], nb: usize, what: &str) -> Result<Vec<X::Row>, String> {
    let mut rows = deinterleave_x8::<X>(cast(groups), nb, 0, Scales::Finite, what)?;
    let tail: &[X::Row] = cast(tail);
    if let Some((b, d)) = nonfinite_block(tail) {
        return Err(nonfinite_scale_error(what, rows.len() + b, d));
    }
    rows.try_reserve_exact(tail.len()).map_err(|_| format!("out of memory de-interleaving {what}"))?;
    rows.extend_from_slice(tail);
    Ok(rows)
}

/// Whether this build's kernels read eight-row groups of `ttype` (a
/// `rows8` tensor, or a copy repacked at load): Q8_0 and Q4_0 where
/// `Kernels::ROWS8`, Q4_K, Q5_K and Q6_K where `KQUANT_ROWS8` too, MXFP4
/// where `MXFP4_ROWS8` too (Q5_K and MXFP4 only as a copy: the `rows8`
/// layout holds neither).
pub fn kernels_read_groups(ttype: TensorType) -> bool {
    match ttype {
        TensorType::Q8_0 | TensorType::Q4_0 => Arch::ROWS8,
        TensorType::Q4K | TensorType::Q5K | TensorType::Q6K => Arch::ROWS8 && Arch::KQUANT_ROWS8,
        TensorType::Mxfp4 => Arch::ROWS8 && Arch::MXFP4_ROWS8,
        _ => false,
    }
}

/// Whether a `rows8` tensor of `ttype` is used as it lies, with no copy at
/// load: the kernels read its groups and, for Q8_0, with the file's bias 0
/// (`Loader::stored_groups` re-biases a copy otherwise). The importer makes
/// such tensors straight into groups.
pub fn groups_used_in_place(ttype: TensorType) -> bool {
    kernels_read_groups(ttype) && (ttype != TensorType::Q8_0 || Arch::Q8_X8_BIAS == 0)
}

/// Checks tensors against the configuration while loading.
struct Loader<'a> {
    file: &'a Mlb,
    /// Repack plain Q8_0 / Q4_0 matrices (and Q4_K / Q5_K / Q6_K when
    /// `Arch::KQUANT_ROWS8`) for the eight-row kernels.
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
        let what = format!("{}: tensor '{name}'", self.file.path);
        let plain = Rows::File { start: t.start, len: t.len };
        let mut m = Matrix {
            ttype: t.ttype,
            rows,
            cols,
            start: t.start,
            len: t.len,
            plain,
            plain_from: 0,
            groups: Groups::None,
        };
        let kernels_read_groups = kernels_read_groups(t.ttype);
        if t.layout == Layout::Rows8 {
            self.stored_groups(&mut m, kernels_read_groups, &what)?;
        } else if self.repack && kernels_read_groups && rows >= ROWS8 {
            // (every block's scales checked as it is copied: the blocks are read anyway)
            fn repack<X: Rows8>(bytes: &[u8], nb: usize, what: &str) -> Result<Vec<X>, String> {
                repack_rows8(cast(bytes), nb, Arch::Q8_X8_BIAS, Scales::Finite, what)
            }
            let bytes = self.file.tensor_bytes(t);
            m.groups = Groups::Copy(Arc::new(match t.ttype {
                TensorType::Q8_0 => PackedRows::Q8(repack(bytes, cols / QK, &what)?),
                TensorType::Q4_0 => PackedRows::Q4(repack(bytes, cols / QK, &what)?),
                TensorType::Q4K => PackedRows::Q4K(repack(bytes, cols / QK_K, &what)?),
                TensorType::Q5K => PackedRows::Q5K(repack(bytes, cols / QK_K, &what)?),
                TensorType::Mxfp4 => PackedRows::Mxfp4(repack(bytes, cols / QK, &what)?),
                _ => PackedRows::Q6K(repack(bytes, cols / QK_K, &what)?),
            }));
            // the kernels read the copy (the plain rows only for a lookup or
            // rows after the last group): the file's pages need not stay
            // resident beside it, so memory stays about the file's size
            self.file.release(t.start, t.len);
        }
        Ok(m)
    }

    /// The matrices of `n` experts, [rows, cols] each, stacked in one
    /// tensor [n·rows, cols]. Each expert is read on its own
    /// (`MatRef::rows`), so eight-row groups must not straddle two: rows
    /// not a multiple of eight are read as plain rows.
    fn experts(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Matrix, String> {
        let total = n.checked_mul(rows).ok_or_else(|| format!("{}: tensor '{name}' is too large", self.file.path))?;
        if rows.is_multiple_of(ROWS8) {
            return self.matrix(name, total, cols);
        }
        if self.info(name)?.layout == Layout::Rows8 {
            return Err(format!(
                "{}: tensor '{name}' holds experts of {rows} rows in eight-row groups, which would straddle them",
                self.file.path
            ));
        }
        Loader { file: self.file, repack: false }.matrix(name, total, cols)
    }

    /// A `rows8` tensor (eight-row groups, then rows % 8 plain rows): its
    /// groups used in place when the kernels read them (Q8_0 re-biased into
    /// a copy if the build's bias is not the file's 0), else de-interleaved
    /// into a plain copy. The plain tail rows are read in place either way.
    fn stored_groups(&self, m: &mut Matrix, kernels_read_groups: bool, what: &str) -> Result<(), String> {
        let whole = m.rows / ROWS8 * ROWS8;
        let group_block = rows8_block_bytes(m.ttype).ok_or_else(|| format!("{what}: no eight-row layout"))?;
        let row_block = m.ttype.row_bytes(m.cols as u64).unwrap_or(0) as usize;
        let nb = if matches!(m.ttype, TensorType::Q4K | TensorType::Q6K) { m.cols / QK_K } else { m.cols / QK };
        let groups_len = whole / ROWS8 * nb * group_block;
        let groups = self.file.range(m.start, groups_len);
        // Plain rows are read at row index r from `start`: the groups take
        // the bytes of rows 0..whole plus, for Q4_K (whose groups hold
        // unpacked scales), 32 bytes a group block more.
        let extra = groups_len - whole * row_block;
        m.plain = Rows::File { start: m.start + extra, len: m.len - extra };
        if kernels_read_groups {
            m.plain_from = whole;
            m.groups = match m.ttype {
                TensorType::Q8_0 if Arch::Q8_X8_BIAS != 0 => {
                    let copy = rebias_q8_x8(cast(groups), nb, Arch::Q8_X8_BIAS, Scales::Finite, what)?;
                    Groups::Copy(Arc::new(PackedRows::Q8(copy)))
                }
                _ => Groups::File { start: m.start, len: groups_len },
            };
            return Ok(());
        }
        let tail = self.file.range(m.start + groups_len, m.len - groups_len);
        let copy = match m.ttype {
            TensorType::Q8_0 => PlainRows::Q8(plain_copy::<BlockQ8_0x8>(groups, tail, nb, what)?),
            TensorType::Q4_0 => PlainRows::Q4(plain_copy::<BlockQ4_0x8>(groups, tail, nb, what)?),
            TensorType::Q4K => PlainRows::Q4K(plain_copy::<BlockQ4Kx8>(groups, tail, nb, what)?),
            _ => PlainRows::Q6K(plain_copy::<BlockQ6Kx8>(groups, tail, nb, what)?),
        };
        m.plain = Rows::Copy(Arc::new(copy));
        Ok(())
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

    /// The values of a small f32/f16 tensor, every one finite (a NaN or
    /// infinite norm weight would make every later value NaN).
    fn floats(&self, name: &str, t: &TensorInfo) -> Result<Vec<f32>, String> {
        let bytes = self.file.tensor_bytes(t);
        let values: Vec<f32> = match t.ttype {
            TensorType::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
            TensorType::F16 => {
                bytes.chunks_exact(2).map(|b| f16_to_f32(f16::from_le_bytes(b.try_into().unwrap()))).collect()
            }
            other => {
                return Err(format!("{}: tensor '{name}' must be f32 or f16, not {}", self.file.path, other.name()))
            }
        };
        match values.iter().position(|v| !v.is_finite()) {
            Some(i) => Err(nonfinite_value_error(&format!("{}: tensor '{name}'", self.file.path), i, values[i])),
            None => Ok(values),
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

/// The error of element `i` of `what` being `v`, not a finite number.
fn nonfinite_value_error(what: &str, i: usize, v: f32) -> String {
    format!("{what} has a non-finite value ({v}) at element {i}")
}

impl Model {
    /// The first tensor of the file (in file order) holding a value or a
    /// block scale that is NaN or infinite, as an error naming it; None
    /// when every one is finite. Reads every tensor's values or scales
    /// (the whole file: done only once the logits are not finite).
    pub(super) fn nonfinite_weight(&self) -> Option<String> {
        use rayon::prelude::*;
        let file = &self.file;
        file.tensors.par_iter().find_map_first(|t| {
            let what = format!("{}: tensor '{}'", file.path, t.name);
            let bytes = file.tensor_bytes(t);
            match t.ttype {
                TensorType::F32 => bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .enumerate()
                    .find(|(_, v)| !v.is_finite())
                    .map(|(i, v)| nonfinite_value_error(&what, i, v)),
                TensorType::F16 => bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes(b.try_into().unwrap()))
                    .enumerate()
                    .find(|(_, v)| !v.is_finite())
                    .map(|(i, v)| nonfinite_value_error(&what, i, f16_to_f32(v))),
                _ => nonfinite_scale_in(t, bytes).map(|(b, d)| nonfinite_scale_error(&what, b, d)),
            }
        })
    }
}

/// The first block (row-major) of a quantised tensor whose scale is not
/// finite, and that scale, whatever its layout (plain rows, or eight-row
/// groups and then the tail rows).
fn nonfinite_scale_in(t: &TensorInfo, bytes: &[u8]) -> Option<(usize, f32)> {
    fn plain<B: Scaled + bytemuck::Pod>(bytes: &[u8]) -> Option<(usize, f32)> {
        // (read unaligned: the tensors a model uses were checked, but this reads every one)
        let block = std::mem::size_of::<B>();
        bytes.chunks_exact(block).enumerate().find_map(|(i, b)| {
            let b: B = bytemuck::pod_read_unaligned(b);
            Some((i, b.nonfinite_scale()?))
        })
    }
    fn grouped<X: Rows8>(bytes: &[u8], rows: usize, nb: usize) -> Option<(usize, f32)> {
        let nb = nb.max(1);
        let groups_len = rows / ROWS8 * nb * std::mem::size_of::<X>();
        let (groups, tail) = bytes.split_at(groups_len.min(bytes.len()));
        let in_groups = groups.chunks_exact(std::mem::size_of::<X>()).enumerate().filter_map(|(i, x)| {
            let (k, d) = bytemuck::pod_read_unaligned::<X>(x).nonfinite_row()?;
            Some(((i / nb * ROWS8 + k) * nb + i % nb, d))
        });
        // the first in row-major order: the least index over the groups, then the tail's
        in_groups
            .min_by_key(|&(b, _)| b)
            .or_else(|| plain::<X::Row>(tail).map(|(b, d)| (rows / ROWS8 * ROWS8 * nb + b, d)))
    }
    let (rows, cols) = match t.dims[..] {
        [rows, cols] => (rows as usize, cols as usize),
        _ => (1, 0),
    };
    match (t.layout, t.ttype) {
        (Layout::Rows8, TensorType::Q8_0) => grouped::<BlockQ8_0x8>(bytes, rows, cols / QK),
        (Layout::Rows8, TensorType::Q4_0) => grouped::<BlockQ4_0x8>(bytes, rows, cols / QK),
        (Layout::Rows8, TensorType::Q4K) => grouped::<BlockQ4Kx8>(bytes, rows, cols / QK_K),
        (Layout::Rows8, TensorType::Q6K) => grouped::<BlockQ6Kx8>(bytes, rows, cols / QK_K),
        (_, TensorType::Q8_0) => plain::<BlockQ8_0>(bytes),
        (_, TensorType::Q4_0) => plain::<BlockQ4_0>(bytes),
        (_, TensorType::Q8_0F32) => plain::<BlockQ8_0F32>(bytes),
        (_, TensorType::Q4_0F32) => plain::<BlockQ4_0F32>(bytes),
        (_, TensorType::Q4K) => plain::<BlockQ4K>(bytes),
        (_, TensorType::Q5K) => plain::<BlockQ5K>(bytes),
        (_, TensorType::Q6K) => plain::<BlockQ6K>(bytes),
        // E8M0 scales: all finite
        (_, TensorType::Mxfp4) => None,
        (_, TensorType::F32 | TensorType::F16) => None,
    }
}
