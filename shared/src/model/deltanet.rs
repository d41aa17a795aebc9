//! Gated DeltaNet (Qwen3.5's linear-attention layers) in its recurrent
//! form: a causal depthwise convolution over the projected inputs, then per
//! value head the delta rule on a dk × dv state, a gated RMSNorm and the
//! output projection.

use super::forward::carry_non_finite;
use super::weights::DeltaNetWeights;
use super::{Model, Segment};
use crate::kernels::{matmul, matmul_group, Arch, Input, Kernels};

impl Model {
    /// Gated DeltaNet for the new tokens, each sequence's one after another
    /// on its own state (the recurrent form), value heads in parallel.
    pub(super) fn deltanet_block(
        &self,
        l: usize,
        w: &DeltaNetWeights,
        xn: &[f32],
        segs: &mut [Segment],
        out: &mut [f32],
    ) {
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
        self.record(l, &["ssm_qkv", "ssm_z", "ssm_b", "ssm_a"], xn, c.hidden_size);
        matmul_group(&mut [(&wqkv, &mut mixed[..]), (&wz, &mut z[..]), (&wb, &mut b[..]), (&wa, &mut a[..])], &input);

        let mut core = vec![0.0f32; n_tok * dn.value_dim()]; // [T][nv·dv]
        let mut conv_out = vec![0.0f32; conv_dim];
        let hist = kw - 1;
        let mut row0 = 0;
        for seg in segs.iter_mut() {
            let st = &mut *seg.state;
            let slot = st.slot[l];
            let conv_state = &mut st.conv_state[slot * hist * conv_dim..(slot + 1) * hist * conv_dim];
            let ssm = &mut st.ssm_state[slot * nv * dk * dv..(slot + 1) * nv * dk * dv];
            let rows = row0..row0 + seg.tokens.len();
            row0 = rows.end;
            for t in rows {
                // Causal depthwise convolution over [state (K−1 inputs) | this input], then SiLU.
                let m_t = &mixed[t * conv_dim..(t + 1) * conv_dim];
                for (ch, o) in conv_out.iter_mut().enumerate() {
                    let wrow = &w.conv[ch * kw..(ch + 1) * kw];
                    let mut acc = 0.0f32;
                    for j in 0..hist {
                        acc += wrow[j] * conv_state[j * conv_dim + ch];
                    }
                    acc += wrow[hist] * m_t[ch];
                    *o = acc / (1.0 + libm::expf(-acc));
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
                crate::pool::zip_chunks_mut(ssm, dk * dv, core_t, dv, |j, s, o| {
                    // (llama.cpp's GGUF files order the value heads tiled: head j reads key head j mod nk)
                    let kh = if dn.v_tiled { j % nk } else { j / group };
                    let scale = 1.0 / (dk as f32).sqrt();
                    let q: Vec<f32> = l2norm(&q_all[kh * dk..(kh + 1) * dk]).iter().map(|v| v * scale).collect();
                    let k = l2norm(&k_all[kh * dk..(kh + 1) * dk]);
                    let v = &v_all[j * dv..(j + 1) * dv];
                    let beta = 1.0 / (1.0 + libm::expf(-b_t[j]));
                    let g = w.decay[j] * softplus(a_t[j] + w.dt_bias[j]);
                    delta_rule_step(s, &q, &k, v, libm::expf(g), beta, dk, dv, o);
                    // Gated RMSNorm: rmsnorm(o) · w · silu(z)
                    let mut normed = vec![0.0f32; dv];
                    Arch::rmsnorm(o, &w.norm, c.norm_eps, &mut normed);
                    for (e, ov) in o.iter_mut().enumerate() {
                        let zv = z_t[j * dv + e];
                        *ov = normed[e] * (zv / (1.0 + libm::expf(-zv)));
                    }
                });
            }
        }
        self.record(l, &["ssm_out"], &core, dn.value_dim());
        matmul(&self.mat(&w.out), &Input::new(&core, dn.value_dim()), out);
        carry_non_finite(&core, dn.value_dim(), out, c.hidden_size);
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
        libm::log1pf(libm::expf(x))
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
