//! Rotary position embeddings: the cos/sin tables of one forward call's
//! positions (one per row: a batch may hold several sequences), and their
//! application to the heads of queries and keys.

use super::config::{Config, RopeStyle};

/// cos/sin of position × inverse frequency for each row of one call.
pub(super) struct RopeTables {
    pub(super) style: RopeStyle,
    pub(super) rope_dim: usize,
    pub(super) global: Vec<(f32, f32)>, // [T][rope_dim/2]
    pub(super) local: Vec<(f32, f32)>,
}

impl RopeTables {
    /// The tables of rows at `positions`, each of a sequence whose context
    /// is `contexts[row]` (LongRoPE: above `rope_long_context`, the long factors).
    pub(super) fn new(c: &Config, positions: &[usize], contexts: &[usize]) -> Self {
        let table = |inv: &[f32], long: Option<&[f32]>| -> Vec<(f32, f32)> {
            let mut t = Vec::with_capacity(positions.len() * inv.len());
            for (&p, &ctx) in positions.iter().zip(contexts) {
                let inv = match long {
                    Some(long) if ctx > c.rope_long_context => long,
                    _ => inv,
                };
                for &f in inv {
                    // Angle in f32 as transformers computes it; cos/sin rounded from f64,
                    // then times the attention factor in f32 (1: unchanged).
                    let angle = (p as f32 * f) as f64;
                    let (cos, sin) = (libm::cos(angle) as f32, libm::sin(angle) as f32);
                    t.push(if c.rope_attn_factor == 1.0 {
                        (cos, sin)
                    } else {
                        (cos * c.rope_attn_factor, sin * c.rope_attn_factor)
                    });
                }
            }
            t
        };
        RopeTables {
            style: c.rope_style,
            rope_dim: c.rope_dim,
            global: table(&c.inv_freq_global, c.inv_freq_long.as_deref()),
            local: table(&c.inv_freq_local, None),
        }
    }

    /// Rotates the first rope_dim dims of every head of every row of x ([T][heads·hd]).
    pub(super) fn apply(&self, table: &[(f32, f32)], x: &mut [f32], hd: usize) {
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
