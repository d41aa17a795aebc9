//! AVX-512 VNNI kernels: int8 dots with `vpdpbusd` (four u8 × i8 products
//! summed into each i32 lane in one instruction), in its 256-bit AVX512VL form,
//! eight blocks per step in `portable`'s eight-lane order (see avx2.rs's
//! `sum_blocks8`). For Q4 the unsigned nibbles go in directly, two blocks per
//! vector, and the blocks' −8·Σq is added after the reduction. The f32
//! kernels are AVX2's.

#[cfg(test)]
pub use super::avx2::vexp;
pub use super::avx2::{axpy, dot_f16_f32, dot_f32, f16_to_f32, gelu_tanh_mul, rmsnorm, silu_mul, softmax};

entry_points!(dot_q8, dot_q4, dot_q8_x4, dot_q4_x4);

mod imp {
    use core::arch::x86_64::*;

    use super::super::avx2::imp::{
        act_or_zero, act_pair, hsum_i32, ld32, nibble_pair, q4_or_zero, q8_or_zero, reduce8, reduce_pairs,
        unpack_nibbles,
    };
    use super::super::avx2::{sum_blocks8, sum_blocks8_x4};
    use crate::quant::{ActRef, Q4Block, Q8Block};

    /// Q8 weights · Q8 activations: |w| × sign(x, w) (activation quants in
    /// [-127, 127], so the sign never overflows), exact i32 lanes per block;
    /// eight blocks per step in `portable`'s lane order (`sum_blocks8`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let x = x.range(0, w.len().min(x.len()));
        sum_blocks8!(
            x,
            false,
            B::F16_SCALE,
            |i| {
                reduce8(unroll!(8, |j| {
                    let (a, b) = (ld32(w[i + j].quants()), ld32(&x.blocks()[i + j].qs));
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(b, a))
                }))
            },
            |j| w[i + j].scale_bits(),
            |b| (
                {
                    let (a, q) = (ld32(w[b].quants()), ld32(&x.blocks()[b].qs));
                    hsum_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(q, a)))
                },
                w[b].scale()
            ),
        )
    }

    /// Q4 weights · Q8 activations: Σ nibble·q (unsigned nibbles straight
    /// into `vpdpbusd`, two blocks per vector) − 8·Σq per block (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let x = x.range(0, w.len().min(x.len()));
        sum_blocks8!(
            x,
            true,
            B::F16_SCALE,
            |i| {
                reduce_pairs(unroll!(4, |p| {
                    let (j0, j1) = (2 * p, 2 * p + 1);
                    let (lo, hi) = nibble_pair(w[i + j0].nibbles(), w[i + j1].nibbles());
                    let (x0, x1) = act_pair(&x.blocks()[i + j0].qs, &x.blocks()[i + j1].qs);
                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, x0), hi, x1)
                }))
            },
            |j| w[i + j].scale_bits(),
            |b| (
                {
                    let (n, q) = (unpack_nibbles(w[b].nibbles()), ld32(&x.blocks()[b].qs));
                    hsum_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), n, q)) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }

    /// `dot_q8` of one weight row with four activation rows, |w| made once
    /// per block (each result bit-identical to `dot_q8`'s).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        let xs = xs.map(|x| x.range(0, w.len().min(x.len())));
        sum_blocks8_x4!(
            xs,
            false,
            B::F16_SCALE,
            |i, r| unroll!(8, |j| ld32(q8_or_zero(w, i, j, r))),
            |wv, x| {
                reduce8(unroll!(8, |j| {
                    let (a, b) = (wv[j], ld32(act_or_zero(x, i, j, r)));
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(b, a))
                }))
            },
            |j| w[i + j].scale_bits(),
            |b, x| (
                {
                    let (a, q) = (ld32(w[b].quants()), ld32(&x.blocks()[b].qs));
                    hsum_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(q, a)))
                },
                w[b].scale()
            ),
        )
    }

    /// `dot_q4` of one weight row with four activation rows, the nibbles
    /// unpacked once per block pair (each result bit-identical to `dot_q4`'s).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        let xs = xs.map(|x| x.range(0, w.len().min(x.len())));
        sum_blocks8_x4!(
            xs,
            true,
            B::F16_SCALE,
            |i, r| unroll!(4, |p| nibble_pair(q4_or_zero(w, i, 2 * p, r), q4_or_zero(w, i, 2 * p + 1, r))),
            |wv, x| {
                reduce_pairs(unroll!(4, |p| {
                    let (lo, hi) = wv[p];
                    let (x0, x1) = act_pair(act_or_zero(x, i, 2 * p, r), act_or_zero(x, i, 2 * p + 1, r));
                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, x0), hi, x1)
                }))
            },
            |j| w[i + j].scale_bits(),
            |b, x| (
                {
                    let (n, q) = (unpack_nibbles(w[b].nibbles()), ld32(&x.blocks()[b].qs));
                    hsum_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), n, q)) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }
}
