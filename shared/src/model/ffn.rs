//! The feed-forward half of a block: a gated feed-forward network, or a
//! Mixture of Experts, where a router picks `n_used` of the layer's experts
//! for each token and their outputs are summed by the router's weights.
//!
//! A batch's tokens are grouped by expert, so each chosen expert's weights
//! are read once for all the tokens routed to it (a decoded token reads only
//! its own experts' rows), and all the experts' gate and up products are one
//! parallel region, their down products another (`matmul_each`). Every
//! token's result is the same bits whatever shares its batch: each output
//! element is one kernel dot, routing is per token, and a token's experts
//! are summed in the router's order.

use super::config::{Activation, ExpertGating};
use super::forward::carry_non_finite;
use super::weights::{DenseFfn, ExpertsFfn, Ffn};
use super::Model;
use crate::kernels::{matmul, matmul_each, matmul_group, Arch, Input, Kernels};

impl Model {
    /// out[T][D] = the feed-forward block of layer `l` over the normed rows `xn` [T][D].
    pub(super) fn ffn_block(&self, l: usize, ffn: &Ffn, xn: &[f32], out: &mut [f32]) {
        match ffn {
            Ffn::Dense(w) => self.dense_ffn(l, w, xn, out),
            Ffn::Experts(w) => self.experts_ffn(l, w, xn, out),
        }
    }

    fn dense_ffn(&self, l: usize, w: &DenseFfn, xn: &[f32], out: &mut [f32]) {
        let d = self.config.hidden_size;
        let (f, n_tok) = (w.gate.rows, xn.len() / d);
        let (mut gate, mut up) = (vec![0.0f32; n_tok * f], vec![0.0f32; n_tok * f]);
        let input = Input::new(xn, d);
        self.record(l, &["ffn_gate", "ffn_up"], xn, d);
        let (wg, wu) = (self.mat(&w.gate), self.mat(&w.up));
        matmul_group(&mut [(&wg, &mut gate[..]), (&wu, &mut up[..])], &input);
        self.activate(&mut gate, &up, f);
        self.record(l, &["ffn_down"], &gate, f);
        matmul(&self.mat(&w.down), &Input::new(&gate, f), out);
        carry_non_finite(&gate, f, out, d);
    }

    /// act(gate) ⊙ up, row by row (rows `width` wide), into `gate`.
    fn activate(&self, gate: &mut [f32], up: &[f32], width: usize) {
        let act = self.config.activation;
        crate::pool::chunks_mut(gate, width, 8, |i, g| {
            let u = &up[i * width..][..g.len()];
            match act {
                Activation::Silu => Arch::silu_mul(g, u),
                Activation::GeluTanh => Arch::gelu_tanh_mul(g, u),
                Activation::SwigluOai { alpha, limit } => swiglu_oai(g, u, alpha, limit),
            }
        });
    }

    fn experts_ffn(&self, l: usize, w: &ExpertsFfn, xn: &[f32], out: &mut [f32]) {
        let c = &self.config;
        let d = c.hidden_size;
        let (n_tok, k, fe) = (xn.len() / d, w.n_used, c.moe.expert_ffn_dim);

        // ---- routing: each token's experts and weights ----
        let mut logits = vec![0.0f32; n_tok * w.n_experts];
        matmul(&self.mat(&w.router), &Input::new(xn, d), &mut logits);
        let mut chosen = vec![(0usize, 0.0f32); n_tok * k]; // [T][k]: (expert, weight)
        for (t, row) in logits.chunks_exact_mut(w.n_experts).enumerate() {
            if let Some(b) = &w.router_bias {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
            route(row, c.moe.gating, c.moe.norm_weights, &mut chosen[t * k..(t + 1) * k]);
        }

        // ---- the tokens grouped by expert: expert e's rows in `x`, in token order ----
        let mut count = vec![0usize; w.n_experts];
        chosen.iter().for_each(|&(e, _)| count[e] += 1);
        let mut first = vec![0usize; w.n_experts + 1]; // expert e's rows: first[e] .. first[e + 1]
        for e in 0..w.n_experts {
            first[e + 1] = first[e] + count[e];
        }
        let mut row_of = vec![0usize; n_tok * k]; // (token, slot) -> its row in the expert buffers
        let mut next = first.clone();
        for (i, &(e, _)) in chosen.iter().enumerate() {
            row_of[i] = next[e];
            next[e] += 1;
        }
        let rows = n_tok * k;
        let mut x = vec![0.0f32; rows * d];
        for (i, &r) in row_of.iter().enumerate() {
            x[r * d..(r + 1) * d].copy_from_slice(&xn[i / k * d..(i / k + 1) * d]);
        }

        // ---- gate and up of every chosen expert (and the shared one), one region ----
        let (mut gate, mut up) = (vec![0.0f32; rows * fe], vec![0.0f32; rows * fe]);
        let used: Vec<usize> = (0..w.n_experts).filter(|&e| count[e] > 0).collect();
        let inputs: Vec<Input> = used.iter().map(|&e| Input::new(&x[first[e] * d..first[e + 1] * d], d)).collect();
        let (wg, wu) = (self.mat(&w.gate), self.mat(&w.up));
        let experts_g: Vec<_> = used.iter().map(|&e| wg.rows(e * fe, fe)).collect();
        let experts_u: Vec<_> = used.iter().map(|&e| wu.rows(e * fe, fe)).collect();
        self.record(l, &["ffn_gate_exps", "ffn_up_exps"], &x, d);
        let shared_input = Input::new(xn, d);
        let fs = w.shared.as_ref().map_or(0, |s| s.gate.rows);
        let (mut shared_gate, mut shared_up) = (vec![0.0f32; n_tok * fs], vec![0.0f32; n_tok * fs]);
        let shared_mats = w.shared.as_ref().map(|s| (self.mat(&s.gate), self.mat(&s.up), self.mat(&s.down)));
        {
            let mut items = Vec::with_capacity(2 * used.len() + 2);
            let (mut g_rest, mut u_rest) = (&mut gate[..], &mut up[..]);
            for (i, &e) in used.iter().enumerate() {
                let (g, gt) = std::mem::take(&mut g_rest).split_at_mut(count[e] * fe);
                let (u, ut) = std::mem::take(&mut u_rest).split_at_mut(count[e] * fe);
                (g_rest, u_rest) = (gt, ut);
                items.push((&experts_g[i], &inputs[i], g));
                items.push((&experts_u[i], &inputs[i], u));
            }
            if let Some((sg, su, _)) = &shared_mats {
                self.record(l, &["ffn_gate_shexp", "ffn_up_shexp"], xn, d);
                items.push((sg, &shared_input, &mut shared_gate[..]));
                items.push((su, &shared_input, &mut shared_up[..]));
            }
            matmul_each(&mut items);
        }
        for &e in &used {
            let rows = first[e] * fe..first[e + 1] * fe;
            add_expert_bias(&mut gate[rows.clone()], w.gate_bias.as_deref(), e, fe);
            add_expert_bias(&mut up[rows], w.up_bias.as_deref(), e, fe);
        }
        self.activate(&mut gate, &up, fe);
        if fs > 0 {
            self.activate(&mut shared_gate, &shared_up, fs);
        }

        // ---- down of every chosen expert (and the shared one), one region ----
        let mut y = vec![0.0f32; rows * d];
        let mut shared_y = vec![0.0f32; n_tok * d * (fs > 0) as usize];
        let wd = self.mat(&w.down);
        let experts_d: Vec<_> = used.iter().map(|&e| wd.rows(e * d, d)).collect();
        let down_inputs: Vec<Input> =
            used.iter().map(|&e| Input::new(&gate[first[e] * fe..first[e + 1] * fe], fe)).collect();
        self.record(l, &["ffn_down_exps"], &gate, fe);
        let shared_down_input = Input::new(&shared_gate, fs.max(1));
        {
            let mut items = Vec::with_capacity(used.len() + 1);
            let mut y_rest = &mut y[..];
            for (i, &e) in used.iter().enumerate() {
                let (part, tail) = std::mem::take(&mut y_rest).split_at_mut(count[e] * d);
                y_rest = tail;
                items.push((&experts_d[i], &down_inputs[i], part));
            }
            if let Some((_, _, sd)) = &shared_mats {
                self.record(l, &["ffn_down_shexp"], &shared_gate, fs);
                items.push((sd, &shared_down_input, &mut shared_y[..]));
            }
            matmul_each(&mut items);
        }
        for &e in &used {
            add_expert_bias(&mut y[first[e] * d..first[e + 1] * d], w.down_bias.as_deref(), e, d);
        }
        carry_non_finite(&gate, fe, &mut y, d);

        // ---- each token: its experts' outputs by weight, in the router's order, then the shared expert ----
        for (t, o) in out.chunks_exact_mut(d).enumerate() {
            o.fill(0.0);
            for j in 0..k {
                let (r, wt) = (row_of[t * k + j], chosen[t * k + j].1);
                o.iter_mut().zip(&y[r * d..(r + 1) * d]).for_each(|(o, v)| *o += wt * v);
            }
        }
        if fs > 0 {
            carry_non_finite(&shared_gate, fs, &mut shared_y, d);
            for (t, (o, s)) in out.chunks_exact_mut(d).zip(shared_y.chunks_exact(d)).enumerate() {
                let scale = match &w.shared_gate {
                    Some(g) => sigmoid(Arch::dot_f32(g, &xn[t * d..(t + 1) * d])),
                    None => 1.0,
                };
                o.iter_mut().zip(s).for_each(|(o, v)| *o += scale * v);
            }
        }
    }
}

/// Expert e's bias (row e of `bias`, `width` wide) added to each of `rows`.
fn add_expert_bias(rows: &mut [f32], bias: Option<&[f32]>, e: usize, width: usize) {
    if let Some(b) = bias {
        let b = &b[e * width..(e + 1) * width];
        rows.chunks_exact_mut(width).for_each(|r| r.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
}

/// gpt-oss's clamped SwiGLU into `gate`: g = min(gate, limit) (NaN kept),
/// u = clamp(up, −limit, limit), (u + 1)·g·sigmoid(alpha·g). Scalar, with
/// libm's `expf`: the same bits on every build.
fn swiglu_oai(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = if *g > limit { limit } else { *g };
        let u = u.clamp(-limit, limit);
        *g = (u + 1.0) * (x / (1.0 + libm::expf(-alpha * x)));
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-x))
}

/// One token's experts from its router logits: `chosen` gets the top
/// `chosen.len()` experts, highest first (the lower index first among
/// equals), with their weights by `gating`, divided by their sum when
/// `norm`. Plain scalar code in one order: the same bits on every build.
fn route(logits: &mut [f32], gating: ExpertGating, norm: bool, chosen: &mut [(usize, f32)]) {
    if gating == ExpertGating::Softmax {
        softmax(logits);
    }
    let mut taken = vec![false; logits.len()];
    for slot in chosen.iter_mut() {
        let mut best: Option<usize> = None;
        for (e, &v) in logits.iter().enumerate() {
            // (a NaN logit is never chosen over a number; all NaN: the first free expert)
            if !taken[e] && best.is_none_or(|b| v > logits[b] || logits[b].is_nan() && !v.is_nan()) {
                best = Some(e);
            }
        }
        let e = best.unwrap_or(0);
        taken[e] = true;
        *slot = (e, logits[e]);
    }
    if gating == ExpertGating::SoftmaxSelected {
        let mut w: Vec<f32> = chosen.iter().map(|&(_, v)| v).collect();
        softmax(&mut w);
        chosen.iter_mut().zip(w).for_each(|(c, w)| c.1 = w);
    }
    if norm {
        let sum: f32 = chosen.iter().map(|&(_, w)| w).sum();
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    }
}

/// exp(v − max) / Σ, in place. The sum is taken largest first, so the
/// weights do not depend on how the experts are numbered (a model whose
/// experts are stored in another order gives the same bits).
fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    v.iter_mut().for_each(|x| *x = libm::expf(*x - max));
    let mut sorted = v.to_vec();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let sum: f32 = sorted.iter().sum();
    v.iter_mut().for_each(|x| *x /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_takes_the_top_experts_by_each_rule() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let mut chosen = [(0, 0.0); 2];
        // ties: the lower index first
        route(&mut logits.clone(), ExpertGating::Softmax, false, &mut chosen);
        assert_eq!((chosen[0].0, chosen[1].0), (1, 3));
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        assert!((chosen[0].1 as f64 - 2f64.exp() / z).abs() < 1e-6);
        route(&mut logits.clone(), ExpertGating::Softmax, true, &mut chosen);
        assert!((chosen[0].1 - 0.5).abs() < 1e-6 && (chosen[1].1 - 0.5).abs() < 1e-6);
        let mut chosen3 = [(0, 0.0); 3];
        route(&mut logits.clone(), ExpertGating::SoftmaxSelected, false, &mut chosen3);
        assert_eq!(chosen3.map(|c| c.0), [1, 3, 4]);
        let z: f64 = [2.0f64, 2.0, 1.0].iter().map(|v| v.exp()).sum();
        assert!((chosen3[2].1 as f64 - 1f64.exp() / z).abs() < 1e-6);
        // NaN logits are passed over while numbers remain
        let mut nan = [f32::NAN, 1.0, f32::NAN, 0.0];
        route(&mut nan, ExpertGating::SoftmaxSelected, false, &mut chosen);
        assert_eq!((chosen[0].0, chosen[1].0), (1, 3));
    }
}
