//! The transformer: hyperparameters and weights from an `.mlb` file, and one
//! forward pass that every supported family runs through, driven by those
//! hyperparameters (norm flavour, biases, q/k norms, RoPE kind, sliding
//! windows, soft-caps, sandwich norms, activation, Gated DeltaNet layers).
//!
//! Scalar transcendental functions (exp, tanh, log1p, the RoPE table's sin
//! and cos) come from the `libm` crate, pure Rust, so that they give the
//! same bits on every platform and CPU (the C library's do not: glibc picks
//! FMA variants at run time on x86-64); the vector kernels have their own.
//!
//! Files: `config` (hyperparameters), `weights` (loading and the matrices),
//! `state` and `kvcache` (what a sequence keeps), `forward` (the pass, top
//! to bottom), `attention`, `rope`, `deltanet` (the token mixers), `ffn`
//! (the feed-forward block: dense or Mixture of Experts).

use std::path::Path;
use std::sync::{Arc, OnceLock};

mod attention;
mod config;
mod deltanet;
mod ffn;
mod forward;
mod input_stats;
mod kvcache;
mod pooling;
mod rope;
mod state;
mod token_check;
mod weights;

pub use config::{Activation, Config, DeltaNetDims, ExpertGating, LayerKind, MoeConfig, RopeStyle, LIMIT_LAYERS};
pub use forward::Segment;
pub use input_stats::InputStats;
pub use kvcache::KvType;
pub use pooling::{Pooled, Pooling};
pub use state::State;
pub use token_check::{check_prompt, check_tokens, TokenError};
pub use weights::{groups_used_in_place, kernels_read_groups, LoadOptions, WeightCopies};

use crate::format::mlb::Mlb;
use weights::{Layer, Matrix};

/// A loaded model: the mapped file, its configuration and tensor locations.
pub struct Model {
    pub file: Arc<Mlb>,
    pub config: Config,
    token_embd: Matrix,    // [V, D]
    output_norm: Vec<f32>, // [D]
    output: Matrix,        // [V, D] (token_embd when tied)
    layers: Vec<Layer>,
    /// What each matrix's inputs were, when recorded (`record_inputs`).
    input_stats: Option<InputStats>,
    /// The first weight tensor that is not finite, looked for the first
    /// time the logits were not (`check_logits`).
    nonfinite_weight: OnceLock<Option<String>>,
}

/// Which positions of a forward call need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    None,
    Last,
    All,
    /// No logits: every position's hidden state after the output norm
    /// ([n][hidden_size]), what embeddings pool.
    Hidden,
}

impl Model {
    pub fn load(path: &Path) -> Result<Model, String> {
        Self::load_with(path, LoadOptions::default())
    }

    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Model, String> {
        let file = Arc::new(Mlb::open(path)?);
        Self::from_mlb(file, options)
    }

    /// Bytes of weights one decoded token reads: every matrix of every
    /// layer (of a Mixture-of-Experts layer, its router, its shared expert
    /// and `n_used` of its experts) and the output head (the embedding
    /// contributes one row).
    pub fn decode_bytes_per_token(&self) -> u64 {
        let mut total = self.output.len as u64 + (self.token_embd.len / self.token_embd.rows) as u64;
        for layer in &self.layers {
            total += layer.matrices_per_token().iter().map(|(m, share)| (m.len as f64 * share) as u64).sum::<u64>();
        }
        total
    }

    /// Multiply-accumulates of the weight matrices: (per token through the
    /// layers, Σ rows·cols; the output head's rows·cols, once per token
    /// whose logits are computed). Attention's are not counted.
    pub fn matmul_macs(&self) -> (u64, u64) {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| l.matrices_per_token())
            .map(|(m, share)| ((m.rows * m.cols) as f64 * share) as u64)
            .sum();
        (layers, (self.output.rows * self.output.cols) as u64)
    }

    /// Bytes of memory holding weights copied at load: eight-row groups
    /// repacked from plain rows (`LoadOptions::repack`), plain rows
    /// de-interleaved from the file's groups (builds without eight-row kernels).
    pub fn weight_copies(&self) -> WeightCopies {
        let head =
            if self.config.tie_embeddings { vec![&self.token_embd] } else { vec![&self.token_embd, &self.output] };
        let all = head.into_iter().chain(self.layers.iter().flat_map(|l| l.matrices()));
        all.map(Matrix::copies).fold(WeightCopies::default(), |a, c| WeightCopies {
            repacked: a.repacked + c.repacked,
            deinterleaved: a.deinterleaved + c.deinterleaved,
        })
    }

    /// From now on, adds every matrix's inputs to `input_stats`.
    pub fn record_inputs(&mut self) {
        self.input_stats.get_or_insert_with(InputStats::default);
    }

    /// The inputs recorded since `record_inputs`.
    pub fn input_stats(&self) -> Option<&InputStats> {
        self.input_stats.as_ref()
    }

    /// Records `x` (rows `cols` wide) as the input of layer `l`'s matrices `kinds`.
    fn record(&self, l: usize, kinds: &[&str], x: &[f32], cols: usize) {
        if let Some(s) = &self.input_stats {
            let names: Vec<String> = kinds.iter().map(|k| format!("blk.{l}.{k}")).collect();
            s.add(&names, x, cols);
        }
    }

    /// Ok when every logit of `logits` (rows of the vocabulary's size, for
    /// positions `first_position ..`) is a finite number; else why not, as
    /// one line: the first weight tensor holding a NaN or infinite value or
    /// scale (looked for once, then remembered), or, every weight being
    /// finite, the activations' overflow at that position. One pass over
    /// the logits when they are finite; they are not changed.
    pub fn check_logits(&self, logits: &[f32], first_position: usize) -> Result<(), String> {
        if crate::quant::all_finite(logits) {
            return Ok(());
        }
        let i = logits.iter().position(|v| !v.is_finite()).unwrap_or(0);
        let vocab = self.config.vocab_size.max(1);
        let (position, id) = (first_position + i / vocab, i % vocab);
        Err(match self.nonfinite_weight.get_or_init(|| self.nonfinite_weight()) {
            Some(weight) => format!("{weight}, so the logits at position {position} are not finite"),
            None => format!(
                "the logits at position {position} are not finite ({} for token {id}) while every weight is finite: \
                 the activations overflowed",
                logits[i]
            ),
        })
    }

    /// Number of weights (parameters) in the file.
    pub fn n_params(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.n_elements()).sum()
    }
}
