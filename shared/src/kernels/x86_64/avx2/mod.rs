//! AVX2 + FMA + F16C kernels: int8 dots with `vpmaddubsw` + `vpmaddwd`, one
//! 32-weight block per 256-bit vector; f32 ops eight lanes wide; f16 through
//! `vcvtph2ps`. Reductions follow `portable`'s order and no FMA is used, so
//! results equal the other x86 builds' (see sse2.rs for why). Quantised dots
//! take eight blocks per step: per-block i32 vectors, a transpose-add tree
//! to the eight block sums, then one f32 multiply and add into the eight
//! lanes (`sum_blocks8_n!`). Repacked weights (`quant::BlockQ8_0x8`,
//! `BlockQ4_0x8`) go eight rows at a time, one row per lane, with no
//! horizontal reduction (`rows8_n!`); so do repacked Q4_K / Q5_K / Q6_K
//! matrices (`quant::BlockQ4Kx8`, `BlockQ5Kx8`, `BlockQ6Kx8`; `kquant_rows8.rs`). The AVX-512 VNNI
//! build re-exports the f32 half.
//!
//! `float.rs` holds the f32 kernels, `int8.rs` the quantised dots,
//! `kquant.rs` the K-quant (Q4_K, Q5_K, Q6_K) dots, `kquant_rows8.rs` their
//! eight-row forms, `tiles.rs` their prompt tiles (eight tokens at a time);
//! the loads they use are here.

use core::arch::x86_64::*;

use crate::kernels::Kernels;

pub mod float;
pub mod int8;
pub mod kquant;
pub mod kquant_rows8;
pub mod tiles;

/// The AVX2 + FMA + F16C kernel set (FMA enabled, never used: see above).
pub struct Avx2;

impl Kernels for Avx2 {
    const ROWS8: bool = true;
    const Q8_X8_BIAS: u8 = int8::Q8_X8_BIAS;
    const INT8_PEAK: &'static str = "vpmaddubsw + vpmaddwd ymm";
    const KQUANT_ROWS8: bool = true;
    const MXFP4_ROWS8: bool = true;
    entry_points!(float: f32_ops, kv_rows);
    entry_points!(int8: int8_dots, int8_dots_x4, mxfp4_dots, rows8, mxfp4_rows8, int8_peak);
    entry_points!(kquant: kquant_dots, kquant_dots_x4);
    entry_points!(kquant_rows8: kquant_rows8);
    entry_points!(tiles: kquant_tiles);
    #[inline]
    fn prefetch(bytes: &[u8]) {
        super::prefetch(bytes)
    }
}

isa_features!(
    #[inline]
    pub(crate) fn ld(c: &[f32]) -> __m256 {
        let c: &[f32; 8] = c.try_into().unwrap();
        // SAFETY: `c` is a reference to 8 readable f32; loadu needs no alignment.
        unsafe { _mm256_loadu_ps(c.as_ptr()) }
    }

    #[inline]
    pub(crate) fn st(c: &mut [f32], v: __m256) {
        let c: &mut [f32; 8] = c.try_into().unwrap();
        // SAFETY: `c` is a unique reference to 8 writable f32; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), v) }
    }

    /// ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)): `portable`'s combination.
    #[inline]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(t, _mm_shuffle_ps::<0b10_11_00_01>(t, t));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)))
    }
);
