//! AVX-512 VNNI kernels: int8 dots with `vpdpbusd` (four u8 × i8 products
//! summed into each i32 lane in one instruction), in its 256-bit AVX512VL form
//! so one 32-weight block fills one vector. (A 512-bit two-blocks-per-vector
//! version measured slower on Zen 4: 9.8 vs 14 GB/s for Q4.) For Q4 the unsigned nibbles go in
//! directly and the block's −8·Σq correction is the accumulator's start
//! value. The f32 kernels are AVX2's.

#[cfg(test)]
pub use super::avx2::vexp;
pub use super::avx2::{axpy, dot_f16_f32, dot_f32, f16_to_f32, gelu_tanh_mul, rmsnorm, silu_mul, softmax};

entry_points!(dot_q8, dot_q4);

mod imp {
    use core::arch::x86_64::*;

    use super::super::avx2::imp::{ld32, sum_blocks, unpack_nibbles};
    use super::super::{q4_scale, q8_scale};
    use crate::quant::{BlockQ8Act, Q4Block, Q8Block};

    /// Q8 weights · Q8 activations: |w| × sign(x, w) (activation quants in
    /// [-127, 127], so the sign never overflows), exact i32 lanes per block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q8<B: Q8Block>(w: &[B], x: &[BlockQ8Act]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let n = w.len().min(x.len());
        sum_blocks(n, |i| {
            let (a, b) = (ld32(w[i].quants()), ld32(&x[i].qs));
            let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(b, a));
            (s, q8_scale(&w[i]) * x[i].d)
        })
    }

    /// Q4 weights · Q8 activations: Σ nibble·q − 8·Σq per block (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q4<B: Q4Block>(w: &[B], x: &[BlockQ8Act]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let n = w.len().min(x.len());
        sum_blocks(n, |i| {
            let corr = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-8 * x[i].sum));
            let s = _mm256_dpbusd_epi32(corr, unpack_nibbles(w[i].nibbles()), ld32(&x[i].qs));
            (s, q4_scale(&w[i]) * x[i].d)
        })
    }
}
