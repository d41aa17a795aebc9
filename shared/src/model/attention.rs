//! Attention for a batch of new tokens, possibly of several sequences: q/k/v
//! projections, biases, q/k norms, RoPE, the append to each sequence's KV
//! cache, causal (optionally windowed) attention of each row over its own
//! sequence's cache, the output gate and the output projection.

use super::config::{Config, LayerKind};
use super::forward::carry_non_finite;
use super::kvcache::KvCache;
use super::rope::RopeTables;
use super::weights::AttentionWeights;
use super::{Model, Segment};
use crate::kernels::{matmul, matmul_group, Arch, Input, Kernels};

impl Model {
    /// Attention for the new tokens: q/k/v projections, biases, q/k norms,
    /// RoPE, cache append, causal (windowed) attention, output gate, o_proj.
    pub(super) fn attention_block(
        &self,
        l: usize,
        w: &AttentionWeights,
        xn: &[f32],
        segs: &mut [Segment],
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
        self.record(l, &["attn_q", "attn_k", "attn_v"], xn, c.hidden_size);
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

        // Append each sequence's keys and values to its cache, then attend.
        let mut row = 0;
        for seg in segs.iter_mut() {
            let (n, st) = (seg.tokens.len(), &mut *seg.state);
            if n > 0 {
                let rows = row * kv_dim..(row + n) * kv_dim;
                st.kv.write(st.slot[l], st.pos, &k[rows.clone()], &v[rows]);
            }
            row += n;
        }
        let mut spans = Vec::with_capacity(segs.len());
        let mut first_row = 0;
        for seg in segs.iter() {
            spans.push(Span { kv: &seg.state.kv, slot: seg.state.slot[l], pos0: seg.state.pos, first_row });
            first_row += seg.tokens.len();
        }
        let window = if sliding { c.sliding_window } else { 0 };
        let mut att = vec![0.0f32; n_tok * c.q_dim()];
        attention(c, &queries, &spans, window, w.sinks.as_deref(), &mut att);
        if c.attn_output_gate {
            for (a, g) in att.iter_mut().zip(&gates) {
                *a *= 1.0 / (1.0 + libm::expf(-*g));
            }
        }
        self.record(l, &["attn_o"], &att, c.q_dim());
        matmul(&self.mat(&w.o), &Input::new(&att, c.q_dim()), out);
        add_bias_rows(out, w.o_bias.as_deref());
        carry_non_finite(&att, c.q_dim(), out, c.hidden_size);
    }
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

/// The rows of one sequence in a batch: its cache, the cache slot of this
/// layer, the position of its first new row, and where its rows start.
struct Span<'a> {
    kv: &'a KvCache,
    slot: usize,
    pos0: usize,
    first_row: usize,
}

/// Causal (optionally windowed) multi-head attention of T new queries, each
/// over its own sequence's cache (`spans`, in row order); writes [T][H·hd].
/// With `sinks` (one logit per head), each head's softmax takes its sink
/// as one more score, last, whose value is nothing: the weights sum to
/// less than one. One task per (token, head): fixed order inside.
fn attention(c: &Config, q: &[f32], spans: &[Span], window: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    let hd = c.head_dim;
    let group = c.n_heads / c.n_kv_heads;
    let n_tok = q.len() / (c.n_heads * hd);
    // Short contexts are cheaper on one thread than split across several.
    let positions = spans.iter().map(|s| s.pos0).max().unwrap_or(0) + n_tok;
    let min_len = (4096 / (positions * hd).max(1)).clamp(1, c.n_heads);
    crate::pool::chunks_mut(out, hd, min_len, |idx, o| {
        let (t, h) = (idx / c.n_heads, idx % c.n_heads);
        let span = &spans[spans.partition_point(|s| s.first_row <= t) - 1];
        let (kv, slot) = (span.kv, span.slot);
        let pos = span.pos0 + t - span.first_row;
        let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
        let query = kv.query(&q[(t * c.n_heads + h) * hd..][..hd]);
        let kv_off = (h / group) * hd;
        let n = pos + 1 - first;
        let mut scores = vec![0.0f32; n + sinks.is_some() as usize];
        kv.scores(slot, first, kv_off, &query, &mut scores[..n]);
        for s in scores[..n].iter_mut() {
            *s *= c.query_scale;
            if c.attn_softcap > 0.0 {
                *s = c.attn_softcap * libm::tanhf(*s / c.attn_softcap);
            }
        }
        if let Some(sinks) = sinks {
            scores[n] = sinks[h];
        }
        Arch::softmax(&mut scores);
        o.fill(0.0);
        let mut scratch = vec![0.0f32; hd];
        kv.accumulate_values(slot, first, kv_off, &scores[..n], o, &mut scratch);
    });
}
