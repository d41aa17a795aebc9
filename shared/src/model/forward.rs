//! The forward pass, top to bottom: token embeddings, then per layer the
//! token mixer (attention or Gated DeltaNet, attention.rs / deltanet.rs)
//! and the feed-forward block (dense or Mixture of Experts, ffn.rs), each behind an RMSNorm and added to the
//! residual stream, then the output norm and head. One pass serves every
//! family; the configuration turns its parts on and off.

use super::rope::RopeTables;
use super::state::State;
use super::token_check::check_tokens;
use super::weights::Mixer;
use super::{LogitsFor, Model};
use crate::kernels::{matmul, Arch, Input, Kernels};

/// One sequence's share of a batched forward call: its state, its new
/// tokens (positions `state.pos ..`), and which of their logits it wants.
pub struct Segment<'a> {
    pub state: &'a mut State,
    pub tokens: &'a [u32],
    pub want: LogitsFor,
}

impl Model {
    /// Runs `tokens` (positions state.pos ..) through the model, appending to
    /// the cache, and returns logits [n][V] for the positions asked for.
    /// Logits that are not finite are an error (`check_logits`: a weight
    /// that is not, or the activations' overflow), and the state is back
    /// where it was.
    pub fn forward(&self, st: &mut State, tokens: &[u32], want: LogitsFor) -> Result<Vec<f32>, String> {
        let before = st.pos;
        let logits = self.forward_batch(&mut [Segment { state: st, tokens, want }])?.pop().unwrap_or_default();
        let rows = logits.len() / self.config.vocab_size.max(1);
        if let Err(e) = self.check_logits(&logits, st.pos - rows) {
            st.truncate(before);
            return Err(e);
        }
        Ok(logits)
    }

    /// Runs the new tokens of several sequences through the model in one
    /// pass: their rows share every matrix product (one read of the weights
    /// for all), and each attends only to its own state. Every row's result
    /// is the same bits as in a call of its own (the kernels are batch-size
    /// invariant, attention is per row), so a sequence's logits do not
    /// depend on what shares the batch. Returns each segment's logits
    /// [n][V] for the positions it asked for. Nothing changes on an error.
    pub fn forward_batch(&self, segs: &mut [Segment]) -> Result<Vec<Vec<f32>>, String> {
        let c = &self.config;
        for seg in segs.iter() {
            check_tokens(seg.tokens, c.vocab_size, seg.state.pos, seg.state.ctx).map_err(|e| e.to_string())?;
        }
        let n_tok: usize = segs.iter().map(|s| s.tokens.len()).sum();
        if n_tok == 0 {
            return Ok(vec![Vec::new(); segs.len()]);
        }
        let d = c.hidden_size;

        // x: [T][D] token embeddings, the segments' rows one after another
        let tokens: Vec<u32> = segs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let mut x = vec![0.0f32; n_tok * d];
        for (t, row) in x.chunks_exact_mut(d).enumerate() {
            self.embedding_row(tokens[t] as usize, row);
            if c.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.embed_scale);
            }
        }

        let positions: Vec<usize> = segs.iter().flat_map(|s| s.state.pos..s.state.pos + s.tokens.len()).collect();
        let contexts: Vec<usize> = segs.iter().flat_map(|s| std::iter::repeat_n(s.state.ctx, s.tokens.len())).collect();
        let rope_tables = RopeTables::new(c, &positions, &contexts);
        let mut xn = vec![0.0f32; n_tok * d];
        let mut proj = vec![0.0f32; n_tok * d];

        for (l, layer) in self.layers.iter().enumerate() {
            // ---- token mixing: attention or Gated DeltaNet ----
            rmsnorm_rows(&x, &layer.attn_norm, c.norm_eps, &mut xn, d);
            match &layer.mixer {
                Mixer::Attention(w) => self.attention_block(l, w, &xn, segs, &rope_tables, &mut proj),
                Mixer::DeltaNet(w) => self.deltanet_block(l, w, &xn, segs, &mut proj),
            }
            if let Some(w) = &layer.attn_post_norm {
                let tmp = proj.clone();
                rmsnorm_rows(&tmp, w, c.norm_eps, &mut proj, d);
            }
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);

            // ---- feed-forward: dense, or a Mixture of Experts (ffn.rs) ----
            rmsnorm_rows(&x, &layer.ffn_norm, c.norm_eps, &mut xn, d);
            self.ffn_block(l, &layer.ffn, &xn, &mut proj);
            if let Some(w) = &layer.ffn_post_norm {
                let tmp = proj.clone();
                rmsnorm_rows(&tmp, w, c.norm_eps, &mut proj, d);
            }
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        for seg in segs.iter_mut() {
            seg.state.pos += seg.tokens.len();
        }

        // ---- hidden states after the output norm, for the segments that want them ----
        let mut hidden: Vec<Vec<f32>> = vec![Vec::new(); segs.len()];
        let mut first = 0;
        for (seg, out) in segs.iter().zip(&mut hidden) {
            let n = seg.tokens.len();
            if seg.want == LogitsFor::Hidden {
                *out = vec![0.0f32; n * d];
                rmsnorm_rows(&x[first * d..(first + n) * d], &self.output_norm, c.norm_eps, out, d);
            }
            first += n;
        }

        // ---- head: the rows the segments want, in one product ----
        let mut wanted: Vec<(usize, usize)> = Vec::with_capacity(segs.len()); // per segment: (first row, rows)
        let mut first = 0;
        for seg in segs.iter() {
            let n = seg.tokens.len();
            wanted.push(match seg.want {
                LogitsFor::None | LogitsFor::Hidden => (first, 0),
                LogitsFor::Last => (first + n.saturating_sub(1), n.min(1)),
                LogitsFor::All => (first, n),
            });
            first += n;
        }
        let rows: Vec<f32> = wanted.iter().flat_map(|&(r, n)| x[r * d..(r + n) * d].iter().copied()).collect();
        let mut logits = Vec::new();
        if !rows.is_empty() {
            let mut normed = vec![0.0f32; rows.len()];
            rmsnorm_rows(&rows, &self.output_norm, c.norm_eps, &mut normed, d);
            logits = vec![0.0f32; rows.len() / d * c.vocab_size];
            matmul(&self.mat(&self.output), &Input::new(&normed, d), &mut logits);
            if c.final_softcap > 0.0 {
                let cap = c.final_softcap;
                logits.iter_mut().for_each(|v| *v = cap * libm::tanhf(*v / cap));
            }
            // The activation quantiser passes NaN over, so a hidden state
            // that is not finite (a NaN or infinite weight's, or an
            // overflow's) would give finite logits of no meaning: they are
            // made NaN, for `check_logits` to see.
            for (h, row) in normed.chunks_exact(d).zip(logits.chunks_exact_mut(c.vocab_size)) {
                if h.iter().any(|v| !v.is_finite()) {
                    row.fill(f32::NAN);
                }
            }
        }
        let mut rest = &logits[..];
        Ok(wanted
            .iter()
            .zip(hidden)
            .map(|(&(_, n), hidden)| {
                let (mine, tail) = rest.split_at(n * c.vocab_size);
                rest = tail;
                if hidden.is_empty() {
                    mine.to_vec()
                } else {
                    hidden
                }
            })
            .collect())
    }
}

pub(super) fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    crate::pool::chunks_mut(out, d, 8, |i, o| Arch::rmsnorm(&x[i * d..][..d], w, eps, o));
}

/// Makes the rows of a product's output `out` NaN where the same row of its
/// input `input` is not finite. The activation quantiser passes NaN and
/// infinities over, so without this a matrix read in place whose block
/// scale is NaN (no load step checks it) would give a finite output to the
/// next product and silent garbage; with it the hidden state, then the
/// logits, show it, and `check_logits` names the tensor. One pass over the
/// input's exponent bits (they vectorise); finite rows are left as they are.
pub(super) fn carry_non_finite(input: &[f32], in_width: usize, out: &mut [f32], out_width: usize) {
    const EXPONENT: u32 = 0x7f80_0000;
    for (row, o) in input.chunks_exact(in_width).zip(out.chunks_exact_mut(out_width)) {
        if row.iter().map(|v| v.to_bits() & EXPONENT).max() == Some(EXPONENT) {
            o.fill(f32::NAN);
        }
    }
}
