//! SSSE3 + SSE4.1 kernels: int8 dots with `pmaddubsw` (u8 × i8 pairs to i16)
//! then `pmaddwd` by ones; for Q8 the sign trick |w| × sign(x, w). The f32
//! kernels are SSE2's (nothing in SSE4.1 speeds them up).

#[cfg(test)]
pub use super::sse2::vexp;
pub use super::sse2::{axpy, dot_f16_f32, dot_f32, f16_to_f32, gelu_tanh_mul, rmsnorm, silu_mul, softmax};

entry_points!(dot_q8, dot_q4, dot_q8_x4, dot_q4_x4);

mod imp {
    use core::arch::x86_64::*;

    use super::super::sse2::imp::{halves, hsum_i32, ld16, nibbles, reduce4, reduce8};
    use super::super::sse2::{sum_blocks8, sum_blocks8_x4};
    use crate::quant::{ActRef, Q4Block, Q8Block};

    /// Σ of 16 u8 × i8 products in four i32 lanes. Exact while each pair sum
    /// fits i16: |u| ≤ 128 with |s| ≤ 127, or u ≤ 15.
    #[inline]
    #[target_feature(enable = "ssse3,sse4.1")]
    fn maddubs(u: __m128i, s: __m128i) -> __m128i {
        _mm_madd_epi16(_mm_maddubs_epi16(u, s), _mm_set1_epi16(1))
    }

    /// Q8 weights · Q8 activations. Activation quants are in [-127, 127]
    /// (`quantize_act`), so sign(x, w) never overflows and |w| ≤ 128 is exact.
    /// Eight blocks per step in `portable`'s lane order (sse2's `sum_blocks8`).
    #[inline]
    #[target_feature(enable = "ssse3,sse4.1")]
    pub fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let x = x.range(0, w.len().min(x.len()));
        sum_blocks8!(
            x,
            false,
            B::F16_SCALE,
            |i| reduce8(unroll!(8, |j| {
                let ((w0, w1), (x0, x1)) = (halves(w[i + j].quants()), halves(&x.blocks()[i + j].qs));
                let s0 = maddubs(_mm_abs_epi8(w0), _mm_sign_epi8(x0, w0));
                _mm_add_epi32(s0, maddubs(_mm_abs_epi8(w1), _mm_sign_epi8(x1, w1)))
            })),
            |j| w[i + j].scale_bits(),
            |b| (
                {
                    let ((w0, w1), (x0, x1)) = (halves(w[b].quants()), halves(&x.blocks()[b].qs));
                    let s0 = maddubs(_mm_abs_epi8(w0), _mm_sign_epi8(x0, w0));
                    hsum_i32(_mm_add_epi32(s0, maddubs(_mm_abs_epi8(w1), _mm_sign_epi8(x1, w1))))
                },
                w[b].scale()
            ),
        )
    }

    /// Q4 weights · Q8 activations: Σ nibble·q − 8·Σq per block (exact).
    #[inline]
    #[target_feature(enable = "ssse3,sse4.1")]
    pub fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let x = x.range(0, w.len().min(x.len()));
        let m = _mm_set1_epi8(0x0f);
        sum_blocks8!(
            x,
            true,
            B::F16_SCALE,
            |i| reduce8(unroll!(8, |j| {
                let n = ld16(w[i + j].nibbles());
                let (lo, hi) = (_mm_and_si128(n, m), _mm_and_si128(_mm_srli_epi16::<4>(n), m));
                let (x0, x1) = halves(&x.blocks()[i + j].qs);
                // pair sums ≤ 2·15·127, twice: the i16 add is exact
                let s = _mm_add_epi16(_mm_maddubs_epi16(lo, x0), _mm_maddubs_epi16(hi, x1));
                _mm_madd_epi16(s, _mm_set1_epi16(1))
            })),
            |j| w[i + j].scale_bits(),
            |b| (
                {
                    let n = ld16(w[b].nibbles());
                    let (lo, hi) = (_mm_and_si128(n, m), _mm_and_si128(_mm_srli_epi16::<4>(n), m));
                    let (x0, x1) = halves(&x.blocks()[b].qs);
                    hsum_i32(_mm_add_epi32(maddubs(lo, x0), maddubs(hi, x1))) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }

    /// `dot_q8` of one weight row with four activation rows, |w| made once
    /// per block (each result bit-identical to `dot_q8`'s).
    #[inline]
    #[target_feature(enable = "ssse3,sse4.1")]
    pub fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        let xs = unroll!(4, |t| xs[t].range(0, w.len().min(xs[t].len())));
        sum_blocks8_x4!(
            xs,
            false,
            B::F16_SCALE,
            |i, h| unroll!(4, |j| halves(w[i + 4 * h + j].quants())),
            |wv, x| reduce4(unroll!(4, |j| {
                let ((w0, w1), (x0, x1)) = (wv[j], halves(&x.blocks()[i + 4 * h + j].qs));
                let s0 = maddubs(_mm_abs_epi8(w0), _mm_sign_epi8(x0, w0));
                _mm_add_epi32(s0, maddubs(_mm_abs_epi8(w1), _mm_sign_epi8(x1, w1)))
            })),
            |j| w[i + j].scale_bits(),
            |b, x| (
                {
                    let ((w0, w1), (x0, x1)) = (halves(w[b].quants()), halves(&x.blocks()[b].qs));
                    let s0 = maddubs(_mm_abs_epi8(w0), _mm_sign_epi8(x0, w0));
                    hsum_i32(_mm_add_epi32(s0, maddubs(_mm_abs_epi8(w1), _mm_sign_epi8(x1, w1))))
                },
                w[b].scale()
            ),
        )
    }

    /// `dot_q4` of one weight row with four activation rows, each block's
    /// nibbles unpacked once (each result bit-identical to `dot_q4`'s).
    #[inline]
    #[target_feature(enable = "ssse3,sse4.1")]
    pub fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        let xs = unroll!(4, |t| xs[t].range(0, w.len().min(xs[t].len())));
        sum_blocks8_x4!(
            xs,
            true,
            B::F16_SCALE,
            |i, h| unroll!(4, |j| nibbles(w[i + 4 * h + j].nibbles())),
            |wv, x| reduce4(unroll!(4, |j| {
                let ((lo, hi), (x0, x1)) = (wv[j], halves(&x.blocks()[i + 4 * h + j].qs));
                // pair sums ≤ 2·15·127, twice: the i16 add is exact
                let s = _mm_add_epi16(_mm_maddubs_epi16(lo, x0), _mm_maddubs_epi16(hi, x1));
                _mm_madd_epi16(s, _mm_set1_epi16(1))
            })),
            |j| w[i + j].scale_bits(),
            |b, x| (
                {
                    let (lo, hi) = nibbles(w[b].nibbles());
                    let (x0, x1) = halves(&x.blocks()[b].qs);
                    hsum_i32(_mm_add_epi32(maddubs(lo, x0), maddubs(hi, x1))) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }
}
