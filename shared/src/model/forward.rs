//! The forward pass, top to bottom: token embeddings, then per layer the
//! token mixer (attention or Gated DeltaNet, attention.rs / deltanet.rs)
//! and the feed-forward block, each behind an RMSNorm and added to the
//! residual stream, then the output norm and head. One pass serves every
//! family; the configuration turns its parts on and off.

use rayon::prelude::*;

use super::config::Activation;
use super::rope::RopeTables;
use super::state::State;
use super::weights::Mixer;
use super::{LogitsFor, Model};
use crate::kernels::{matmul, matmul_group, Arch, Input, Kernels};

impl Model {
    /// Runs `tokens` (positions state.pos ..) through the model, appending to
    /// the cache, and returns logits [n][V] for the positions asked for.
    pub fn forward(&self, st: &mut State, tokens: &[u32], want: LogitsFor) -> Result<Vec<f32>, String> {
        let c = &self.config;
        let n_tok = tokens.len();
        if n_tok == 0 {
            return Ok(Vec::new());
        }
        if st.pos + n_tok > st.ctx {
            return Err(format!(
                "context is full: {} positions + {n_tok} new exceed the context of {}",
                st.pos, st.ctx
            ));
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
            logits.iter_mut().for_each(|v| *v = cap * libm::tanhf(*v / cap));
        }
        Ok(logits)
    }
}

pub(super) fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    out.par_chunks_mut(d).zip(x.par_chunks(d)).with_min_len(8).for_each(|(o, r)| Arch::rmsnorm(r, w, eps, o));
}
