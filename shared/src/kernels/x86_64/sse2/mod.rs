//! SSE2 kernels: the x86-64 baseline, so this module is compiled on every
//! x86-64 build (the SSE4.1 build re-exports its f32 half).
//!
//! Int8 dots sign-extend bytes to i16 and multiply-add pairs with `pmaddwd`.
//!
//! Cross-build identity: every reduction here follows `portable`'s order
//! exactly (quantised dots: the exact per-block integer sum, then
//! acc[i % 8] += (d_w·d_x)·isum, eight blocks per step; f32 dots: eight
//! partial sums without FMA), so dots, rmsnorm and axpy are bit-identical to `portable` and to the
//! other x86 builds. This matters because activations are re-quantised
//! between matmuls: a one-ulp difference can flip a rounding and move logits
//! by ~1e-2. exp (`exp4`, a Cephes polynomial) differs from libm's but is
//! computed by the same operation sequence in every x86 build (no FMA), so the
//! elementwise ops agree across x86 builds too.
//!
//! `float.rs` holds the f32 kernels, `int8.rs` the quantised dots (one row,
//! and eight interleaved rows), `kquant.rs` the K-quant dots; the loads they
//! use are here.

use core::arch::x86_64::*;

use crate::kernels::Kernels;
use crate::quant::QK;

pub mod float;
pub mod int8;
pub mod kquant;

/// The SSE2 kernel set (every x86-64 CPU).
pub struct Sse2;

impl Kernels for Sse2 {
    const ROWS8: bool = true;
    const Q8_X8_BIAS: u8 = int8::Q8_X8_BIAS;
    const INT8_PEAK: &'static str = "pmaddwd xmm on i16";
    entry_points!(float: f32_ops, kv_rows);
    entry_points!(int8: int8_dots, int8_dots_x4, mxfp4_dots, rows8, int8_peak);
    entry_points!(kquant: kquant_dots, kquant_dots_x4);
}

isa_features!(
    #[inline]
    pub(crate) fn ld(c: &[f32]) -> __m128 {
        let c: &[f32; 4] = c.try_into().unwrap();
        // SAFETY: `c` is a reference to 4 readable f32; loadu needs no alignment.
        unsafe { _mm_loadu_ps(c.as_ptr()) }
    }

    #[inline]
    pub(crate) fn st(c: &mut [f32], v: __m128) {
        let c: &mut [f32; 4] = c.try_into().unwrap();
        // SAFETY: `c` is a unique reference to 4 writable f32; storeu needs no alignment.
        unsafe { _mm_storeu_ps(c.as_mut_ptr(), v) }
    }

    /// 16 bytes as a vector.
    #[inline]
    pub(crate) fn ld16<T: Copy>(c: &[T; 16]) -> __m128i {
        debug_assert_eq!(core::mem::size_of::<T>(), 1);
        // SAFETY: `c` points to 16 readable bytes (T is i8 or u8); loadu needs no alignment.
        unsafe { _mm_loadu_si128(c.as_ptr() as *const __m128i) }
    }

    /// Halves of a 32-byte block.
    #[inline]
    pub(crate) fn halves<T: Copy>(q: &[T; QK]) -> (__m128i, __m128i) {
        (ld16(q[..16].try_into().unwrap()), ld16(q[16..].try_into().unwrap()))
    }

    /// (v0 + v1) + (v2 + v3): `portable`'s final combination of its partial sums.
    #[inline]
    pub(crate) fn hsum(v: __m128) -> f32 {
        let s = _mm_add_ps(v, _mm_shuffle_ps::<0b10_11_00_01>(v, v));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)))
    }

    /// Exact f16 → f32 of four halves (in the low 64 bits), as `f16_bits_to_f32`.
    #[inline]
    pub(crate) fn cvt_f16x4(h: __m128i) -> __m128 {
        let h = _mm_unpacklo_epi16(h, _mm_setzero_si128());
        let rest = _mm_slli_epi32::<13>(_mm_and_si128(h, _mm_set1_epi32(0x7fff)));
        let sign = _mm_slli_epi32::<16>(_mm_and_si128(h, _mm_set1_epi32(0x8000)));
        let v = _mm_castps_si128(_mm_mul_ps(_mm_castsi128_ps(rest), _mm_set1_ps(f32::from_bits(0x7780_0000))));
        let special = _mm_cmpgt_epi32(rest, _mm_set1_epi32(0x0f7f_ffff)); // exponent all ones
        let nan = _mm_and_si128(_mm_cmpgt_epi32(rest, _mm_set1_epi32(0x0f80_0000)), _mm_set1_epi32(0x0040_0000));
        let inf_nan = _mm_or_si128(_mm_or_si128(rest, _mm_set1_epi32(0x7f80_0000)), nan);
        let v = _mm_or_si128(_mm_andnot_si128(special, v), _mm_and_si128(special, inf_nan));
        _mm_castsi128_ps(_mm_or_si128(v, sign))
    }
);
