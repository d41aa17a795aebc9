//! Prompt tiles on AVX2 (`Kernels::tile_q4k`, `tile_q5k`, `tile_q6k`): each of the two
//! interleaved K-quant groups of a tile (eight rows, a lane per row)
//! against up to eight tokens. A sub-block's codes are unpacked once for
//! all the tokens, and each token's sum is folded with the scales in
//! integers before its float steps, so a token costs little more than its
//! `vpmaddubsw` (the eight-row kernels, `kquant_rows8.rs`, unpack per four
//! tokens and keep 32 accumulators per four tokens, most of them spilled).
//!
//! The order is `portable::dot_q4k`'s / `dot_q6k`'s, as in the AVX-512 VNNI
//! tiles: sub-block j of every super-block goes into partial sum j; the
//! super-blocks are walked sub-block by sub-block (j outer), so that a
//! token needs one accumulator at a time, and the additions into each
//! partial sum still come in increasing s: every result is the same bits.
//!
//! Integer exactness (activation quants |q_x| ≤ 128).
//! * Q4_K: codes ≤ 15, so a `vpmaddubsw` lane is at most 2·15·128 = 3840
//!   and the eight of a sub-block add in i16 to at most 30720 < 32767;
//!   `vpmaddwd` with the row's scale in both halves of its lane gives S =
//!   sc·Σ q·q_x in i32 (|S| < 2^22), the integer `kquant_rows8.rs` takes in
//!   f32 as sc·isum (exact there too), so the same float.
//! * Q5_K: codes ≤ 31, a lane at most 2·31·128 = 7936; the four of each
//!   half of a sub-block add in i16 to at most 31744 and each half goes
//!   through `vpmaddwd` with the scale (`q5k_scaled_sum`): |S| ≤
//!   63·32·31·128 < 2^24, exact, the same float as sc·isum.
//! * Q6_K: codes ≤ 63, a lane at most 2·63·128 = 16128, two add in i16 to
//!   at most 32256; each pair is taken by `vpmaddwd` with its half's scale
//!   (|sc| ≤ 128): S = sc₀·A + sc₁·B − 32·(sc₀·X₀ + sc₁·X₁) in i32, A, B the
//!   halves' Σ q·q_x, X_h their activation sums (|X_h| ≤ 2048, an i16, the
//!   correction one more `vpmaddwd`). Every term and partial sum is below
//!   2^25 and S itself at most 2^24 (`kquant_rows8.rs`'s bound), which
//!   `kquant_rows8.rs` computes exactly in f32: the same float.

use core::arch::x86_64::*;

use super::int8::{bcast4, combine_rows, ld_rows, scales_f16};
use super::kquant_rows8::{act_halves, lanes_u8_ps, q4k_scaled_sum, q5k_scaled_sum, scale_pairs_u8};
use crate::quant::{ActRef, BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8Act};

/// Tokens per tile (`Kernels::TILE_TOKENS`).
pub const TILE_TOKENS: usize = 8;

/// One group's (`$w`, `nb` super-blocks) Q4_K or Q5_K tile loop for `$n`
/// tokens (module doc): `$codes(blk, j)` gives sub-block j's codes (bytes
/// below 16 or 32), `$scaled_sum` S from them (`q4k_scaled_sum`,
/// `q5k_scaled_sum`); lane k of token t's partial sum j += (d_k·d_x)·S −
/// (dmin_k·d_x)·(m_k·Σq_x), each product rounded, no FMA
/// (`portable::k_min_term`); results into `out[t][$col..$col + 8]`.
macro_rules! tile8_kmin_n {
    ($n:tt, $w:expr, $xs:expr, $out:expr, $col:expr, $codes:expr, $scaled_sum:expr) => {{
        let (w, out): (_, &mut [[f32; 16]]) = ($w, $out);
        let xs: [&[BlockQ8Act]; $n] = unroll!($n, |t| &$xs[t].blocks()[..8 * w.len()]);
        let mut part = [[_mm256_setzero_ps(); 8]; $n]; // [token][partial sum]
        for j in 0..8 {
            let mut acc = [_mm256_setzero_ps(); $n];
            for (s, blk) in w.iter().enumerate() {
                let codes: [__m256i; 8] = ($codes)(blk, j);
                let sc = scale_pairs_u8(&blk.scales[j]);
                let mn = lanes_u8_ps(&blk.mins[j]);
                let (d, dmin) = (scales_f16(&blk.d), scales_f16(&blk.dmin));
                let _ = unroll!($n, |t| {
                    let x = &xs[t][8 * s + j];
                    let sv = ($scaled_sum)(&codes, x, &sc);
                    let dx = _mm256_set1_ps(x.d);
                    let mv = _mm256_mul_ps(mn, _mm256_cvtepi32_ps(_mm256_set1_epi32(x.sum)));
                    let a = _mm256_mul_ps(_mm256_mul_ps(d, dx), sv);
                    let b = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), mv);
                    acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(a, b));
                });
            }
            let _ = unroll!($n, |t| part[t][j] = acc[t]);
        }
        let _ = unroll!($n, |t| out[t][$col..$col + 8].copy_from_slice(&combine_rows(part[t])));
    }};
}

/// One group's Q6_K tile loop for `$n` tokens (module doc): lane k of
/// token t's partial sum j += (d_k·d_x)·S; results into `out[t][$col..$col + 8]`.
macro_rules! tile8_q6k_n {
    ($n:tt, $w:expr, $xs:expr, $out:expr, $col:expr) => {{
        let (w, out): (&[BlockQ6Kx8], &mut [[f32; 16]]) = ($w, $out);
        let xs: [&[BlockQ8Act]; $n] = unroll!($n, |t| &$xs[t].blocks()[..8 * w.len()]);
        let mut part = [[_mm256_setzero_ps(); 8]; $n]; // [token][partial sum]
        for j in 0..8 {
            let mut acc = [_mm256_setzero_ps(); $n];
            for (s, blk) in w.iter().enumerate() {
                let codes = q6k_codes_j(blk, j);
                let (sc0, sc1) = (scale_pairs_i8(&blk.scales[2 * j]), scale_pairs_i8(&blk.scales[2 * j + 1]));
                let both = scales_side_by_side(&blk.scales[2 * j], &blk.scales[2 * j + 1]);
                let d = scales_f16(&blk.d);
                let _ = unroll!($n, |t| {
                    let x = &xs[t][8 * s + j];
                    let m = |g: usize| _mm256_maddubs_epi16(codes[g], bcast4(x, g));
                    let pair = |g: usize, sc| _mm256_madd_epi16(_mm256_add_epi16(m(g), m(g + 1)), sc);
                    let a = _mm256_add_epi32(pair(0, sc0), pair(2, sc0));
                    let b = _mm256_add_epi32(pair(4, sc1), pair(6, sc1));
                    let (h0, h1) = act_halves(x);
                    let halves = _mm256_set1_epi32((h0 as u16 as i32) | (h1 << 16));
                    let fix = _mm256_slli_epi32::<5>(_mm256_madd_epi16(both, halves));
                    let sv = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(a, b), fix));
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(dd, sv));
                });
            }
            let _ = unroll!($n, |t| part[t][j] = acc[t]);
        }
        let _ = unroll!($n, |t| out[t][$col..$col + 8].copy_from_slice(&combine_rows(part[t])));
    }};
}

/// `$loop!(n, group, xs, out, col)` for both groups of a tile (`$nb`
/// blocks or super-blocks each) and the 1 to 8 tokens of `$xs`, after
/// checking that `$w` holds the two groups and `$out` a row per token.
macro_rules! tile_groups {
    ($loop:ident, $w:expr, $nb:expr, $xs:expr, $out:expr $(, $rest:expr)*) => {{
        let (w, nb, xs, out) = ($w, $nb, $xs, $out);
        assert!(w.len() >= 2 * nb && out.len() >= xs.len(), "prompt tile: two groups of {nb} blocks");
        for (g, group) in [&w[..nb], &w[nb..2 * nb]].into_iter().enumerate() {
            match xs.len() {
                1 => $loop!(1, group, xs, out, 8 * g $(, $rest)*),
                2 => $loop!(2, group, xs, out, 8 * g $(, $rest)*),
                3 => $loop!(3, group, xs, out, 8 * g $(, $rest)*),
                4 => $loop!(4, group, xs, out, 8 * g $(, $rest)*),
                5 => $loop!(5, group, xs, out, 8 * g $(, $rest)*),
                6 => $loop!(6, group, xs, out, 8 * g $(, $rest)*),
                7 => $loop!(7, group, xs, out, 8 * g $(, $rest)*),
                8 => $loop!(8, group, xs, out, 8 * g $(, $rest)*),
                n => panic!("prompt tile: {n} tokens (1 to {TILE_TOKENS})"),
            }
        }
    }};
}

isa_features!(
    /// As `scale_pairs_u8` for signed bytes.
    #[inline]
    fn scale_pairs_i8(v: &[i8; 8]) -> __m256i {
        let x = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(v.map(|b| b as u8))));
        _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32::<16>(x))
    }

    /// Two signed bytes per row as i16 pairs: lane k holds (a_k, b_k).
    #[inline]
    fn scales_side_by_side(a: &[i8; 8], b: &[i8; 8]) -> __m256i {
        let (a, b) = (a.map(|v| v as u8), b.map(|v| v as u8));
        let ab = _mm_unpacklo_epi8(_mm_cvtsi64_si128(i64::from_le_bytes(a)), _mm_cvtsi64_si128(i64::from_le_bytes(b)));
        _mm256_cvtepi8_epi16(ab)
    }

    /// The 6-bit codes (bytes 0..63) of sub-block j of an interleaved Q6_K
    /// super-block (`quant::BlockQ6Kx8`; `kquant_rows8::q6k_codes_r8` for
    /// one sub-block): the low bits are nibble j % 2 of part j / 2's `ql`
    /// loads g, the high bits field g % 4 of its `qh` load 2·(j % 2) + g / 4,
    /// moved to bits 4..5 by a 16-bit shift (what crosses into the next
    /// byte is masked off).
    #[inline]
    fn q6k_codes_j(blk: &BlockQ6Kx8, j: usize) -> [__m256i; 8] {
        let (c, p) = (j / 2, j % 2);
        let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
        let (ql, qh) = (&blk.qs[384 * c..384 * c + 256], &blk.qs[384 * c + 256..384 * c + 384]);
        let h = [ld_rows(qh, 2 * p), ld_rows(qh, 2 * p + 1)];
        let high = |g: usize| {
            let x = h[g / 4];
            let at4 = match g % 4 {
                0 => _mm256_slli_epi16::<4>(x),
                1 => _mm256_slli_epi16::<2>(x),
                2 => x,
                _ => _mm256_srli_epi16::<2>(x),
            };
            _mm256_and_si256(at4, m30)
        };
        let shift = _mm_cvtsi32_si128(4 * p as i32);
        unroll!(8, |g| _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(ld_rows(ql, g), shift), m4), high(g)))
    }

    /// Sub-block j's nibbles (bytes 0..15) of an interleaved Q4_K or Q5_K
    /// super-block's `qs`: nibble j % 2 of part j / 2's loads.
    #[inline]
    fn nibbles_j(qs: &[u8; 1024], j: usize) -> [__m256i; 8] {
        let (c, shift) = (j / 2, _mm_cvtsi32_si128(4 * (j % 2) as i32));
        let q = &qs[256 * c..256 * c + 256];
        unroll!(8, |g| _mm256_and_si256(_mm256_srl_epi16(ld_rows(q, g), shift), _mm256_set1_epi8(0x0f)))
    }

    /// Sub-block j's 5-bit codes of an interleaved Q5_K super-block
    /// (`quant::BlockQ5Kx8`): `nibbles_j`, with bit j of `qh` load g moved
    /// to bit 4 (a 16-bit shift right by j brings each byte's bit j to its
    /// bit 0, one left by 4 to bit 4; the rest masked off).
    #[inline]
    fn q5k_codes_j(blk: &BlockQ5Kx8, j: usize) -> [__m256i; 8] {
        let (nib, shift, m10) = (nibbles_j(&blk.qs, j), _mm_cvtsi32_si128(j as i32), _mm256_set1_epi8(0x10));
        unroll!(8, |g| {
            let h = _mm256_slli_epi16::<4>(_mm256_srl_epi16(ld_rows(&blk.qh, g), shift));
            _mm256_or_si256(nib[g], _mm256_and_si256(h, m10))
        })
    }

    /// Two interleaved Q4_K groups (`nb` super-blocks each) · up to eight tokens.
    pub(crate) fn tile_q4k(w: &[BlockQ4Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_groups!(tile8_kmin_n, w, nb, xs, out, |blk: &BlockQ4Kx8, j| nibbles_j(&blk.qs, j), |c, x, sc| {
            q4k_scaled_sum(c, x, sc)
        })
    }

    /// Two interleaved Q5_K groups (`nb` super-blocks each) · up to eight tokens.
    pub(crate) fn tile_q5k(w: &[BlockQ5Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_groups!(tile8_kmin_n, w, nb, xs, out, |blk, j| q5k_codes_j(blk, j), |c, x, sc| q5k_scaled_sum(c, x, sc))
    }

    /// Two interleaved Q6_K groups (`nb` super-blocks each) · up to eight tokens.
    pub(crate) fn tile_q6k(w: &[BlockQ6Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_groups!(tile8_q6k_n, w, nb, xs, out)
    }
);
