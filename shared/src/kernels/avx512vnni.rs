//! AVX-512 VNNI kernels: int8 dots with `vpdpbusd` (four u8 × i8 products
//! summed into each i32 lane in one instruction), in its 256-bit AVX512VL form,
//! eight blocks per step in `portable`'s eight-lane order, through avx2.rs's
//! `q8_dot_n!` / `q4_dot_n!` (`sum_blocks8_n!`), one token or four. For Q4 the unsigned nibbles go in directly, two blocks per
//! vector, and the blocks' −8·Σq is added after the reduction. The f32
//! kernels are AVX2's.

#[cfg(test)]
pub use super::avx2::vexp;
pub use super::avx2::{axpy, dot_f16_f32, dot_f32, f16_to_f32, gelu_tanh_mul, rmsnorm, silu_mul, softmax};

entry_points!(dot_q8, dot_q4, dot_q8_x4, dot_q4_x4);

mod imp {
    use core::arch::x86_64::*;

    use super::super::avx2::imp::{q4_dot_n, q8_dot_n};
    use crate::quant::{ActRef, Q4Block, Q8Block};

    /// A block's 32 u8 × i8 products (u = |w|, s = sign(x, w)) in eight exact i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn block_dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }

    /// Σ lo·x0 + hi·x1 (nibbles u8 × activations i8) in eight exact i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn pair_dot(lo: __m256i, hi: __m256i, x0: __m256i, x1: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, x0), hi, x1)
    }

    /// Q8 weights · Q8 activations: |w| × sign(x, w) (activation quants in
    /// [-127, 127], so the sign never overflows) into `vpdpbusd`, exact i32
    /// lanes per block, eight blocks per step (avx2.rs's `q8_dot_n!`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q8_dot_n!(1, w, [x], |u, s| block_dot(u, s))[0]
    }

    /// Q4 weights · Q8 activations: Σ nibble·q (unsigned nibbles straight
    /// into `vpdpbusd`, two blocks per vector) − 8·Σq per block (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q4_dot_n!(1, w, [x], |lo, hi, x0, x1| pair_dot(lo, hi, x0, x1))[0]
    }

    /// `dot_q8` of one weight row with four activation rows, |w| made once
    /// per block (each result bit-identical to `dot_q8`'s).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q8_dot_n!(4, w, xs, |u, s| block_dot(u, s))
    }

    /// `dot_q4` of one weight row with four activation rows, the nibbles
    /// unpacked once per block pair (each result bit-identical to `dot_q4`'s).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q4_dot_n!(4, w, xs, |lo, hi, x0, x1| pair_dot(lo, hi, x0, x1))
    }
}
