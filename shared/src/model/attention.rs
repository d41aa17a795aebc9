//! Attention for a batch of new tokens, possibly of several sequences: q/k/v
//! projections, biases, q/k norms, RoPE, the append to each sequence's KV
//! cache, causal (optionally windowed) attention of each row over its own
//! sequence's cache, the output gate and the output projection.

use std::ops::Range;

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

/// Query tokens of one sequence that go through its cache together (with
/// the query heads of one KV group): each key and value row is read once
/// for all of them instead of once per token and head.
const QUERY_BLOCK: usize = 8;

/// Cache positions whose key (or value) rows stay in L1 while every query
/// of a block takes them: 32 rows of a 128-wide head are 16 KiB.
const POSITION_CHUNK: usize = 32;

/// Causal (optionally windowed) multi-head attention of T new queries, each
/// over its own sequence's cache (`spans`, in row order); writes [T][H·hd].
/// With `sinks` (one logit per head), each head's softmax takes its sink
/// as one more score, last, whose value is nothing: the weights sum to
/// less than one.
///
/// One task per run of up to `QUERY_BLOCK` tokens of a sequence and KV
/// group (its query heads together), or per token and head when that gives
/// too few tasks for the threads (a decode step): at a 2048-token prompt
/// the per-(token, head) tasks each streamed their group's keys and values
/// from L3, and attention took more than the matrices. Every query's
/// numbers are those of the query alone (`attend_block`), so the split
/// changes nothing.
fn attention(c: &Config, q: &[f32], spans: &[Span], window: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    let (hd, nh) = (c.head_dim, c.n_heads);
    let group = nh / c.n_kv_heads;
    let n_tok = q.len() / (nh * hd);
    let mut blocks = Vec::new(); // (span, first row, rows)
    for (i, s) in spans.iter().enumerate() {
        let end = spans.get(i + 1).map_or(n_tok, |next| next.first_row);
        for t0 in (s.first_row..end).step_by(QUERY_BLOCK) {
            blocks.push((i, t0, QUERY_BLOCK.min(end - t0)));
        }
    }
    let heads = if blocks.len() * c.n_kv_heads >= 2 * crate::pool::threads() { group } else { 1 };
    let tasks: Vec<(usize, usize, usize, usize)> =
        blocks.iter().flat_map(|&(s, t0, n)| (0..nh).step_by(heads).map(move |h0| (s, t0, n, h0))).collect();
    // Short contexts are cheaper on one thread than split across several.
    let positions = spans.iter().map(|s| s.pos0).max().unwrap_or(0) + n_tok;
    let per_task = (4096 / (positions * hd).max(1)).clamp(1, nh);
    let mut parts = vec![Vec::new(); tasks.len()];
    crate::pool::chunks_mut(&mut parts, 1, per_task, |i, part| {
        let (s, t0, n, h0) = tasks[i];
        part[0] = attend_block(c, q, &spans[s], t0..t0 + n, h0..h0 + heads, window, sinks);
    });
    for (&(_, t0, _, h0), part) in tasks.iter().zip(&parts) {
        for (t, rows) in part.chunks_exact(heads * hd).enumerate() {
            out[((t0 + t) * nh + h0) * hd..][..heads * hd].copy_from_slice(rows);
        }
    }
}

/// The queries of rows `tokens` (one sequence's, `span`) and query heads
/// `heads` (of one KV group) over the cache: [tokens][heads][hd]. Each
/// query's scores are its dots with the keys of its positions, scaled
/// (and soft-capped), then its softmax; its output starts at zero and
/// adds weight·value position after position: the same operations in the
/// same order as for the query alone. The positions go in chunks of
/// `POSITION_CHUNK` through the several-rows kernels (`KvCache::scores`,
/// `accumulate_values`), every query of the block taking a chunk while its
/// rows are in L1: each key and value row is read from memory once for the
/// block.
fn attend_block(
    c: &Config,
    q: &[f32],
    span: &Span,
    tokens: Range<usize>,
    heads: Range<usize>,
    window: usize,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let (hd, nh, nq) = (c.head_dim, c.n_heads, heads.len());
    let (kv, slot) = (span.kv, span.slot);
    let kv_off = (heads.start / (nh / c.n_kv_heads)) * hd;
    // the cache positions row t attends to
    let positions = |t: usize| {
        let pos = span.pos0 + t - span.first_row;
        let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
        first..pos + 1
    };
    let (lo, hi) = (positions(tokens.start).start, positions(tokens.end - 1).end);
    let queries: Vec<_> = tokens
        .clone()
        .flat_map(|t| q[(t * nh + heads.start) * hd..][..nq * hd].chunks_exact(hd).map(|x| kv.query(x)))
        .collect();
    let mut scores: Vec<Vec<f32>> = tokens
        .clone()
        .flat_map(|t| (0..nq).map(move |_| vec![0.0f32; positions(t).len() + sinks.is_some() as usize]))
        .collect();
    // Each query's positions within a chunk: [a, b) and where they start in its scores.
    let each_part = |c0: usize, f: &mut dyn FnMut(usize, usize, usize, usize)| {
        let c1 = (c0 + POSITION_CHUNK).min(hi);
        for (i, t) in tokens.clone().enumerate() {
            let at = positions(t);
            let (a, b) = (c0.max(at.start), c1.min(at.end));
            if a < b {
                (0..nq).for_each(|j| f(i * nq + j, a, b, a - at.start));
            }
        }
    };
    for c0 in (lo..hi).step_by(POSITION_CHUNK) {
        each_part(c0, &mut |k, a, b, s| kv.scores(slot, a, kv_off, &queries[k], &mut scores[k][s..s + b - a]));
    }
    for (i, s) in scores.iter_mut().enumerate() {
        let n = s.len() - sinks.is_some() as usize;
        for v in s[..n].iter_mut() {
            *v *= c.query_scale;
            if c.attn_softcap > 0.0 {
                *v = c.attn_softcap * libm::tanhf(*v / c.attn_softcap);
            }
        }
        if let Some(sinks) = sinks {
            s[n] = sinks[heads.start + i % nq];
        }
        Arch::softmax(s);
    }
    let mut out = vec![0.0f32; tokens.len() * nq * hd];
    let mut scratch = vec![0.0f32; hd];
    for c0 in (lo..hi).step_by(POSITION_CHUNK) {
        each_part(c0, &mut |k, a, b, s| {
            let o = &mut out[k * hd..][..hd];
            kv.accumulate_values(slot, a, kv_off, &scores[k][s..s + b - a], o, &mut scratch);
        });
    }
    out
}
