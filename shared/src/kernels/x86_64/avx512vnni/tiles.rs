//! Prompt tiles on AVX-512 VNNI (`Kernels::tile_q8`, `tile_q4`, `tile_q4k`,
//! `tile_q5k`, `tile_q6k`): sixteen
//! rows, two interleaved groups side by side in one zmm (a lane per row),
//! against up to eight tokens. Each block's weights are loaded (and for Q4
//! unpacked) once for all the tokens, and each token's broadcast
//! activations serve all sixteen rows: eight `vpdpbusd` per token and block,
//! one exact integer sum per lane, then `portable`'s float steps.
//!
//! The order is `portable::dot_q8`'s: block b adds (d_w·d_x)·isum into
//! partial sum b mod 8, then `combine8`. The blocks are walked partial by
//! partial (b = j, j + 8, ...), so that each token needs one accumulator at
//! a time rather than eight: the additions into each partial sum still come
//! in increasing b, so every result is the same bits.

use core::arch::x86_64::*;

use half::f16;

use super::super::avx2::int8::{ld_rows, MXFP4_PLUS_12};
use super::super::avx2::kquant_rows8::act_halves;
use crate::quant::{ActRef, BlockMxfp4x8, BlockQ4Kx8, BlockQ4_0x8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8Act, BlockQ8_0x8};

/// The loop of `tile_q8` / `tile_q4` / `tile_mxfp4` for `$n` tokens: `|b0, b1| weights`
/// gives a block's eight weight vectors (groups 0 and 1 of block b, four
/// weights of a row per lane, unsigned; vector i pairs with the activation
/// quants 4·i to 4·i + 3), `$bias` what they add to each product's weight
/// (Σ = Σ (w + bias)·q − bias·Σq), `|b0, b1| scales` the sixteen rows'
/// scales (f16 `d` when not given). A macro so that it is inlined into
/// the target-feature functions with `$n` a constant.
macro_rules! tile16_n {
    ($n:tt, $w:expr, $nb:expr, $xs:expr, $out:expr, |$b0:ident, $b1:ident| $weights:expr, $bias:expr) => {
        tile16_n!($n, $w, $nb, $xs, $out, |$b0, $b1| $weights, $bias, |s0, s1| scales16(&s0.d, &s1.d))
    };
    // `|b0, b1| scales`: the two groups' sixteen row scales as f32 lanes.
    ($n:tt, $w:expr, $nb:expr, $xs:expr, $out:expr, |$b0:ident, $b1:ident| $weights:expr, $bias:expr,
     |$s0:ident, $s1:ident| $scales:expr) => {{
        let (nb, xs, out) = ($nb, $xs, $out);
        let (w0, w1) = (&$w[..nb], &$w[nb..2 * nb]);
        let xs: [&[BlockQ8Act]; $n] = unroll!($n, |t| &xs[t].blocks()[..nb]);
        let mut part = [[_mm512_setzero_ps(); 8]; $n]; // [token][partial sum]
        for j in 0..8.min(nb) {
            let mut acc = [_mm512_setzero_ps(); $n];
            let mut b = j;
            while b < nb {
                let ($b0, $b1) = (&w0[b], &w1[b]);
                let wv: [__m512i; 8] = $weights;
                let dw = {
                    let ($s0, $s1) = ($b0, $b1);
                    $scales
                };
                let _ = unroll!($n, |t| {
                    let x = &xs[t][b];
                    let mut s = _mm512_set1_epi32(-$bias * x.sum);
                    let _ = unroll!(8, |i| s = _mm512_dpbusd_epi32(s, wv[i], bcast4(x, i)));
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(x.d));
                    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(s)));
                });
                b += 8;
            }
            let _ = unroll!($n, |t| part[t][j] = acc[t]);
        }
        let _ = unroll!($n, |t| combine_store(&part[t], &mut out[t]));
    }};
}

/// Q4_K's and Q5_K's loop for `$n` tokens (`tile_q4k`, `tile_q5k`): as
/// `tile16_n!`, sub-block j of each super-block into partial sum j
/// (`portable::dot_q4k`'s order), lane k += (d_k·d_x)·(sc_k·isum) −
/// (dmin_k·d_x)·(m_k·Σq_x), each product rounded, no FMA
/// (`portable::k_min_term`; avx2/kquant_rows8.rs's `k_min_rows` for sixteen
/// lanes). `$codes(b0, b1, j)` gives sub-block j's codes of both groups
/// (`q4k_codes16`, `q5k_codes16`), unsigned bytes below 32, which
/// `vpdpbusd` sums exactly.
macro_rules! tile16_kmin_n {
    ($n:tt, $w:expr, $nb:expr, $xs:expr, $out:expr, $codes:expr) => {{
        let (nb, xs, out) = ($nb, $xs, $out);
        let (w0, w1) = (&$w[..nb], &$w[nb..2 * nb]);
        let xs: [&[BlockQ8Act]; $n] = unroll!($n, |t| &xs[t].blocks()[..8 * nb]);
        let mut part = [[_mm512_setzero_ps(); 8]; $n]; // [token][partial sum]
        for j in 0..8 {
            let mut acc = [_mm512_setzero_ps(); $n];
            for s in 0..nb {
                let (b0, b1) = (&w0[s], &w1[s]);
                let codes: [__m512i; 8] = ($codes)(b0, b1, j);
                let sc = _mm512_cvtepi32_ps(lanes16_u8(&b0.scales[j], &b1.scales[j]));
                let mn = _mm512_cvtepi32_ps(lanes16_u8(&b0.mins[j], &b1.mins[j]));
                let (d, dmin) = (scales16(&b0.d, &b1.d), scales16(&b0.dmin, &b1.dmin));
                let _ = unroll!($n, |t| {
                    let x = &xs[t][8 * s + j];
                    let mut isum = _mm512_setzero_si512();
                    let _ = unroll!(8, |g| isum = _mm512_dpbusd_epi32(isum, codes[g], bcast4(x, g)));
                    let dx = _mm512_set1_ps(x.d);
                    // sc·isum and m·Σq_x in f32: exact, both factors and the
                    // products being integers below 2^24 (k_min_term's S, M)
                    let sv = _mm512_mul_ps(sc, _mm512_cvtepi32_ps(isum));
                    let mv = _mm512_mul_ps(mn, _mm512_cvtepi32_ps(_mm512_set1_epi32(x.sum)));
                    let a = _mm512_mul_ps(_mm512_mul_ps(d, dx), sv);
                    let b = _mm512_mul_ps(_mm512_mul_ps(dmin, dx), mv);
                    acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(a, b));
                });
            }
            let _ = unroll!($n, |t| part[t][j] = acc[t]);
        }
        let _ = unroll!($n, |t| combine_store(&part[t], &mut out[t]));
    }};
}

/// Q6_K's loop for `$n` tokens (`tile_q6k`): as `tile16_kmin_n!`, sub-block
/// j of each super-block into partial sum j (`portable::dot_q6k`'s order):
/// per half h of the sub-block, Σ (q − 32)·q_x = Σ q·q_x − 32·X_h (X_h the
/// activations' sum over the half, `act_halves`; the chain starts from
/// −32·X_h), S = sc[2j]·(half 0) + sc[2j + 1]·(half 1) taken in f32 (exact,
/// avx2/kquant_rows8.rs's bounds), lane k += (d_k·d_x)·S.
macro_rules! tile16_q6k_n {
    ($n:tt, $w:expr, $nb:expr, $xs:expr, $out:expr) => {{
        let (nb, xs, out) = ($nb, $xs, $out);
        let (w0, w1): (&[BlockQ6Kx8], &[BlockQ6Kx8]) = (&$w[..nb], &$w[nb..2 * nb]);
        let xs: [&[BlockQ8Act]; $n] = unroll!($n, |t| &xs[t].blocks()[..8 * nb]);
        let mut part = [[_mm512_setzero_ps(); 8]; $n]; // [token][partial sum]
        for j in 0..8 {
            let mut acc = [_mm512_setzero_ps(); $n];
            for s in 0..nb {
                let (b0, b1) = (&w0[s], &w1[s]);
                let codes = q6k_codes16(b0, b1, j);
                let sc0 = _mm512_cvtepi32_ps(lanes16_i8(&b0.scales[2 * j], &b1.scales[2 * j]));
                let sc1 = _mm512_cvtepi32_ps(lanes16_i8(&b0.scales[2 * j + 1], &b1.scales[2 * j + 1]));
                let d = scales16(&b0.d, &b1.d);
                let _ = unroll!($n, |t| {
                    let x = &xs[t][8 * s + j];
                    let (h0, h1) = act_halves(x);
                    let mut a = _mm512_set1_epi32(-32 * h0);
                    let mut b = _mm512_set1_epi32(-32 * h1);
                    let _ = unroll!(4, |g| {
                        a = _mm512_dpbusd_epi32(a, codes[g], bcast4(x, g));
                        b = _mm512_dpbusd_epi32(b, codes[4 + g], bcast4(x, 4 + g));
                    });
                    let sa = _mm512_mul_ps(sc0, _mm512_cvtepi32_ps(a));
                    let sb = _mm512_mul_ps(sc1, _mm512_cvtepi32_ps(b));
                    let dd = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
                    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dd, _mm512_add_ps(sa, sb)));
                });
            }
            let _ = unroll!($n, |t| part[t][j] = acc[t]);
        }
        let _ = unroll!($n, |t| combine_store(&part[t], &mut out[t]));
    }};
}

/// `$loop!(n, args...)` (`tile16_n!`, `tile16_kmin_n!` ...) for the 1 to 8
/// tokens of `$xs`, one arm per count, after checking that `$w` holds the
/// two groups (`$nb` blocks or super-blocks each) and `$out` a row per token.
macro_rules! tile16 {
    ($loop:ident, $w:expr, $nb:expr, $xs:expr, $out:expr $(, $($rest:tt)*)?) => {{
        let (w, nb, xs, out) = ($w, $nb, $xs, $out);
        assert!(w.len() >= 2 * nb && out.len() >= xs.len(), "prompt tile: two groups of {nb} blocks");
        match xs.len() {
            1 => $loop!(1, w, nb, xs, out $(, $($rest)*)?),
            2 => $loop!(2, w, nb, xs, out $(, $($rest)*)?),
            3 => $loop!(3, w, nb, xs, out $(, $($rest)*)?),
            4 => $loop!(4, w, nb, xs, out $(, $($rest)*)?),
            5 => $loop!(5, w, nb, xs, out $(, $($rest)*)?),
            6 => $loop!(6, w, nb, xs, out $(, $($rest)*)?),
            7 => $loop!(7, w, nb, xs, out $(, $($rest)*)?),
            8 => $loop!(8, w, nb, xs, out $(, $($rest)*)?),
            n => panic!("prompt tile: {n} tokens (1 to {TILE_TOKENS})"),
        }
    }};
}

/// Tokens per tile (`Kernels::TILE_TOKENS`).
pub const TILE_TOKENS: usize = 8;

isa_features!(
    /// Groups 0 and 1's 32-byte chunk `i` of a block side by side: four
    /// weights (or nibble bytes) of each of the sixteen rows.
    #[inline]
    fn ld_pair(a: &[u8], b: &[u8], i: usize) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld_rows(a, i)), ld_rows(b, i))
    }

    /// The sixteen rows' f16 scales as f32 (exact).
    #[inline]
    pub(super) fn scales16(a: &[f16; 8], b: &[f16; 8]) -> __m512 {
        // SAFETY: `a` and `b` each point to 8 readable f16 (16 bytes); loadu needs no alignment.
        let (a, b) = unsafe { (_mm_loadu_si128(a.as_ptr().cast()), _mm_loadu_si128(b.as_ptr().cast())) };
        _mm512_cvtph_ps(_mm256_set_m128i(b, a))
    }

    /// Two interleaved nibble blocks (Q4_0's or MXFP4's, 128 bytes each)
    /// as their eight weight vectors: the four 32-byte chunks' low nibbles
    /// (pairing with activation quants 4·i ..), then their high nibbles
    /// (16 + 4·i ..).
    #[inline]
    fn block_nibbles16(a: &[u8], b: &[u8]) -> [__m512i; 8] {
        let m = _mm512_set1_epi8(0x0f);
        let v = unroll!(4, |i| ld_pair(a, b, i));
        let lo = unroll!(4, |i| _mm512_and_si512(v[i], m));
        let hi = unroll!(4, |i| _mm512_and_si512(_mm512_srli_epi16::<4>(v[i]), m));
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    }

    /// Two groups' E8M0 scales as sixteen f32 lanes, `quant::e8m0_half`
    /// bit for bit (avx2's `scales_e8m0`).
    #[inline]
    fn scales16_e8m0(a: &[u8; 8], b: &[u8; 8]) -> __m512 {
        let v = _mm512_cvtepu8_epi32(_mm_set_epi64x(i64::from_le_bytes(*b), i64::from_le_bytes(*a)));
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(v, _mm512_set1_epi32(1)));
        let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), v);
        let is_normal = _mm512_cmpgt_epi32_mask(v, _mm512_set1_epi32(1));
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, subnormal, normal))
    }

    /// Sixteen unsigned bytes (groups 0 and 1's, one per row) as i32 lanes.
    #[inline]
    pub(super) fn lanes16_u8(a: &[u8; 8], b: &[u8; 8]) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_set_epi64x(i64::from_le_bytes(*b), i64::from_le_bytes(*a)))
    }

    /// Sixteen signed bytes (groups 0 and 1's, one per row) as i32 lanes.
    #[inline]
    fn lanes16_i8(a: &[i8; 8], b: &[i8; 8]) -> __m512i {
        let (a, b) = (a.map(|v| v as u8), b.map(|v| v as u8));
        _mm512_cvtepi8_epi32(_mm_set_epi64x(i64::from_le_bytes(b), i64::from_le_bytes(a)))
    }

    /// Sub-block j's nibbles (bytes 0..15) of two interleaved Q4_K or Q5_K
    /// super-blocks' `qs`, groups 0 and 1 side by side: nibble j % 2 of
    /// part j / 2's loads.
    #[inline]
    fn nibbles16(qs0: &[u8; 1024], qs1: &[u8; 1024], j: usize) -> [__m512i; 8] {
        let (c, shift) = (j / 2, _mm_cvtsi32_si128(4 * (j % 2) as i32));
        let (q0, q1) = (&qs0[256 * c..256 * c + 256], &qs1[256 * c..256 * c + 256]);
        let m4 = _mm512_set1_epi8(0x0f);
        unroll!(8, |g| _mm512_and_si512(_mm512_srl_epi16(ld_pair(q0, q1, g), shift), m4))
    }

    /// Sub-block j's codes of two interleaved Q4_K super-blocks (`nibbles16`).
    #[inline]
    fn q4k_codes16(b0: &BlockQ4Kx8, b1: &BlockQ4Kx8, j: usize) -> [__m512i; 8] {
        nibbles16(&b0.qs, &b1.qs, j)
    }

    /// Sub-block j's 5-bit codes of two interleaved Q5_K super-blocks
    /// (`quant::BlockQ5Kx8`): `nibbles16`, with bit j of `qh` load g moved
    /// to bit 4 (a 16-bit shift right by j brings each byte's bit j to its
    /// bit 0, one left by 4 to bit 4; the rest masked off).
    #[inline]
    fn q5k_codes16(b0: &BlockQ5Kx8, b1: &BlockQ5Kx8, j: usize) -> [__m512i; 8] {
        let (nib, shift, m10) = (nibbles16(&b0.qs, &b1.qs, j), _mm_cvtsi32_si128(j as i32), _mm512_set1_epi8(0x10));
        unroll!(8, |g| {
            let h = _mm512_slli_epi16::<4>(_mm512_srl_epi16(ld_pair(&b0.qh, &b1.qh, g), shift));
            _mm512_or_si512(nib[g], _mm512_and_si512(h, m10))
        })
    }

    /// The 6-bit codes (bytes 0..63) of sub-block j of two interleaved Q6_K
    /// super-blocks, groups 0 and 1 side by side (`quant::BlockQ6Kx8`;
    /// avx512vnni's `q6k_codes_r8` for one sub-block of both groups): the
    /// low bits are nibble j % 2 of part j / 2's `ql` loads g, the high bits
    /// field g % 4 of its `qh` load 2·(j % 2) + g / 4, moved to bits 4..5 by
    /// a 16-bit shift (what crosses into the next byte is masked off).
    #[inline]
    fn q6k_codes16(b0: &BlockQ6Kx8, b1: &BlockQ6Kx8, j: usize) -> [__m512i; 8] {
        let (c, p) = (j / 2, j % 2);
        let (m4, m33) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x33));
        let (ql0, ql1) = (&b0.qs[384 * c..384 * c + 256], &b1.qs[384 * c..384 * c + 256]);
        let (qh0, qh1) = (&b0.qs[384 * c + 256..384 * c + 384], &b1.qs[384 * c + 256..384 * c + 384]);
        let h = unroll!(2, |i| {
            let x = ld_pair(qh0, qh1, 2 * p + i);
            [_mm512_and_si512(x, m33), _mm512_and_si512(_mm512_srli_epi16::<2>(x), m33)]
        });
        let high = |g: usize| match g % 4 {
            0 => _mm512_slli_epi16::<4>(h[g / 4][0]),
            1 => _mm512_slli_epi16::<4>(h[g / 4][1]),
            2 => h[g / 4][0],
            _ => h[g / 4][1],
        };
        let shift = _mm_cvtsi32_si128(4 * p as i32);
        // m4 ? nibbles : high bits, bitwise (imm 0xE4: c ? a : b).
        unroll!(8, |g| {
            let nib = _mm512_srl_epi16(ld_pair(ql0, ql1, g), shift);
            _mm512_ternarylogic_epi32::<0xE4>(nib, high(g), m4)
        })
    }

    /// A token's sixteen results from its eight partial sums: ((p0 + p4) +
    /// (p1 + p5)) + ((p2 + p6) + (p3 + p7)) per lane, `portable::combine8`.
    #[inline]
    pub(super) fn combine_store(p: &[__m512; 8], out: &mut [f32; 16]) {
        let h = |x, y| _mm512_add_ps(x, y);
        let v = h(h(h(p[0], p[4]), h(p[1], p[5])), h(h(p[2], p[6]), h(p[3], p[7])));
        // SAFETY: `out` is 16 writable f32; storeu needs no alignment.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
    }

    /// Activation quants 4·i .. 4·i + 4 of a block, broadcast to every lane.
    #[inline]
    fn bcast4(x: &BlockQ8Act, i: usize) -> __m512i {
        let q: &[i8; 4] = x.qs[4 * i..4 * i + 4].try_into().unwrap();
        _mm512_set1_epi32(i32::from_le_bytes(q.map(|v| v as u8)))
    }

    /// Two interleaved Q8 groups (stored w + 128) · up to eight tokens.
    pub(crate) fn tile_q8(w: &[BlockQ8_0x8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile16!(tile16_n, w, nb, xs, out, |b0, b1| unroll!(8, |i| ld_pair(&b0.qs, &b1.qs, i)), 128)
    }

    /// Two interleaved Q4 groups · up to eight tokens: each 32-byte chunk's
    /// low nibbles pair with activation quants 4·i .., its high nibbles
    /// with 16 + 4·i ...
    pub(crate) fn tile_q4(w: &[BlockQ4_0x8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile16!(tile16_n, w, nb, xs, out, |b0, b1| block_nibbles16(&b0.qs, &b1.qs), 8)
    }

    /// Two interleaved MXFP4 groups · up to eight tokens: as `tile_q4`, the
    /// nibbles looked up as v + 12 (`MXFP4_PLUS_12`), the E8M0 scales
    /// (`scales16_e8m0`).
    pub(crate) fn tile_mxfp4(w: &[BlockMxfp4x8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        // SAFETY: MXFP4_PLUS_12 is 16 readable bytes; loadu needs no alignment.
        let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(MXFP4_PLUS_12.as_ptr().cast()) });
        tile16!(
            tile16_n,
            w,
            nb,
            xs,
            out,
            |b0, b1| {
                let n = block_nibbles16(&b0.qs, &b1.qs);
                unroll!(8, |i| _mm512_shuffle_epi8(table, n[i]))
            },
            12,
            |b0, b1| scales16_e8m0(&b0.e, &b1.e)
        )
    }

    /// Two interleaved Q4_K groups (`nb` super-blocks each) · up to eight tokens.
    pub(crate) fn tile_q4k(w: &[BlockQ4Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile16!(tile16_kmin_n, w, nb, xs, out, |b0, b1, j| q4k_codes16(b0, b1, j))
    }

    /// Two interleaved Q5_K groups (`nb` super-blocks each) · up to eight tokens.
    pub(crate) fn tile_q5k(w: &[BlockQ5Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile16!(tile16_kmin_n, w, nb, xs, out, |b0, b1, j| q5k_codes16(b0, b1, j))
    }

    /// Two interleaved Q6_K groups (`nb` super-blocks each) · up to eight tokens.
    pub(crate) fn tile_q6k(w: &[BlockQ6Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile16!(tile16_q6k_n, w, nb, xs, out)
    }
);
