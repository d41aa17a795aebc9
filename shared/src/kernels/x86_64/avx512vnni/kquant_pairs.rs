//! Eight interleaved Q4_K rows against two tokens in one zmm register
//! (`dot_q4k_r8_x2`, `dot_q4k_r8_x4`): lanes 0..8 are the eight rows for
//! token a, lanes 8..16 the same rows for token b. The codes are loaded once
//! into both halves (`vbroadcasti64x4`), each group's four activation bytes
//! of a and of b fill one half each, so one `vpdpbusd` on zmm does what two
//! on ymm did in avx2/kquant_rows8.rs's `kmin_rows8_n!`, and so does each
//! float step. A short batch (the server's decode steps, a speculative
//! verification) gains less than that suggests (in cache 74–85 against
//! 70–79 GMAC/s; docs/PERFORMANCE.md, "Four streams against one"): the
//! float step per 32 weights and its operands' set-up stay the larger part.
//!
//! Every lane runs `kmin_rows8_n!`'s steps for its row and token, in the same
//! order: the exact i32 sum of a sub-block (integer, so its order is free),
//! then k = (d·d_x)·(sc·S) − (dmin·d_x)·(m·Σq_x) added into partial sum j,
//! each product rounded, no FMA; the partial sums are then combined in
//! `int8::combine_rows`'s order (tiles.rs's `combine_store`). So each result
//! is `dot_q4k_r8`'s, bit for bit.

use core::arch::x86_64::*;

use super::tiles::{combine_store, lanes16_u8, scales16};
use crate::quant::{ActRef, BlockQ4Kx8, BlockQ8Act};

isa_features!(
    /// 32 bytes of an interleaved block (four codes of each of the eight
    /// rows) in both halves of a zmm.
    #[inline]
    fn ld_rows_both(qs: &[u8], g: usize) -> __m512i {
        let c: &[u8; 32] = qs[32 * g..32 * g + 32].try_into().unwrap();
        // SAFETY: `c` points to 32 readable bytes; loadu needs no alignment.
        _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(c.as_ptr() as *const __m256i) })
    }

    /// `a` in lanes 0..8, `b` in lanes 8..16.
    #[inline]
    fn pair_ps(a: f32, b: f32) -> __m512 {
        _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b))
    }

    /// Activation quants 16·h .. 16·h + 16 of block `a` in both 128-bit
    /// lanes of the low half, of block `b` in both of the high half: the
    /// four bytes of group 4·h + g of each are then dword g of every lane
    /// (`_mm512_shuffle_epi32`).
    #[inline]
    fn quants_pair(a: &BlockQ8Act, b: &BlockQ8Act, h: usize) -> __m512i {
        let part = |x: &BlockQ8Act| {
            let q: &[i8; 16] = x.qs[16 * h..16 * h + 16].try_into().unwrap();
            // SAFETY: `q` points to 16 readable bytes; loadu needs no alignment.
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(q.as_ptr() as *const __m128i) })
        };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(part(a)), part(b))
    }

    /// `kquant_rows8::k_min_rows` for both halves: lane += (d·d_x)·(sc·S) −
    /// (dmin·d_x)·(m·Σq_x), token a's d_x and Σq_x in the low half, b's in
    /// the high, each product rounded, no FMA.
    #[inline]
    fn k_min_pair(
        acc: __m512,
        isum: __m512i,
        (sc, mn): (__m512, __m512),
        (a, b): (&BlockQ8Act, &BlockQ8Act),
        d: __m512,
        dmin: __m512,
    ) -> __m512 {
        let dx = pair_ps(a.d, b.d);
        let s = _mm512_mul_ps(sc, _mm512_cvtepi32_ps(isum));
        let m = _mm512_mul_ps(mn, pair_ps(a.sum as f32, b.sum as f32));
        let p = _mm512_mul_ps(_mm512_mul_ps(d, dx), s);
        let q = _mm512_mul_ps(_mm512_mul_ps(dmin, dx), m);
        _mm512_add_ps(acc, _mm512_sub_ps(p, q))
    }

    /// The exact Σ codes·q over a sub-block (eight groups) for a and b.
    #[inline]
    fn sum_pair(q: &[__m512i; 8], a: &BlockQ8Act, b: &BlockQ8Act) -> __m512i {
        let (x0, x1) = (quants_pair(a, b, 0), quants_pair(a, b, 1));
        let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        s0 = _mm512_dpbusd_epi32(s0, q[0], _mm512_shuffle_epi32::<0x00>(x0));
        s0 = _mm512_dpbusd_epi32(s0, q[1], _mm512_shuffle_epi32::<0x55>(x0));
        s0 = _mm512_dpbusd_epi32(s0, q[2], _mm512_shuffle_epi32::<0xaa>(x0));
        s0 = _mm512_dpbusd_epi32(s0, q[3], _mm512_shuffle_epi32::<0xff>(x0));
        s1 = _mm512_dpbusd_epi32(s1, q[4], _mm512_shuffle_epi32::<0x00>(x1));
        s1 = _mm512_dpbusd_epi32(s1, q[5], _mm512_shuffle_epi32::<0x55>(x1));
        s1 = _mm512_dpbusd_epi32(s1, q[6], _mm512_shuffle_epi32::<0xaa>(x1));
        s1 = _mm512_dpbusd_epi32(s1, q[7], _mm512_shuffle_epi32::<0xff>(x1));
        _mm512_add_epi32(s0, s1)
    }
);

/// Eight interleaved Q4_K rows · `2·$p` activation rows, tokens taken in
/// pairs (module doc): `[[f32; 8]; 2·$p]`, row k of token t bit for bit
/// `dot_q4k_r8`'s.
macro_rules! q4k_rows8_pairs {
    ($p:tt, $w:expr, $xs:expr) => {{
        let w: &[BlockQ4Kx8] = $w;
        let xs: [ActRef; 2 * $p] = $xs;
        assert!(
            xs.iter().all(|x| x.len() == 8 * w.len()),
            "eight-row Q4_K dot: {} super-blocks per row, activations differ",
            w.len()
        );
        let (m4, mf0) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0xf0u8 as i8));
        let mut acc = [[_mm512_setzero_ps(); 8]; $p];
        for (s, blk) in w.iter().enumerate() {
            super::super::avx2::kquant_rows8::prefetch_ahead(blk);
            // (the same eight rows in both halves)
            let (d, dmin) = (scales16(&blk.d, &blk.d), scales16(&blk.dmin, &blk.dmin));
            let lanes_u8 = |v: &[u8; 8]| _mm512_cvtepi32_ps(lanes16_u8(v, v));
            let _ = unroll!(4, |c| {
                let v = unroll!(8, |g| ld_rows_both(&blk.qs[256 * c..256 * c + 256], g));
                let lo = unroll!(8, |g| _mm512_and_si512(v[g], m4));
                // high nibbles in place, as 16·q: the exact sum is then 16·Σ q·q_x
                // (< 2^20), shifted back by 4 (avx512vnni's `q4k_scaled_sum_x16`)
                let hi = unroll!(8, |g| _mm512_and_si512(v[g], mf0));
                let k0 = (lanes_u8(&blk.scales[2 * c]), lanes_u8(&blk.mins[2 * c]));
                let k1 = (lanes_u8(&blk.scales[2 * c + 1]), lanes_u8(&blk.mins[2 * c + 1]));
                let _ = unroll!($p, |p| {
                    let a: &[BlockQ8Act; 8] = xs[2 * p].blocks()[8 * s..8 * s + 8].try_into().unwrap();
                    let b: &[BlockQ8Act; 8] = xs[2 * p + 1].blocks()[8 * s..8 * s + 8].try_into().unwrap();
                    let (a0, b0, a1, b1) = (&a[2 * c], &b[2 * c], &a[2 * c + 1], &b[2 * c + 1]);
                    acc[p][2 * c] = k_min_pair(acc[p][2 * c], sum_pair(&lo, a0, b0), k0, (a0, b0), d, dmin);
                    acc[p][2 * c + 1] = k_min_pair(
                        acc[p][2 * c + 1],
                        _mm512_srai_epi32::<4>(sum_pair(&hi, a1, b1)),
                        k1,
                        (a1, b1),
                        d,
                        dmin,
                    );
                });
            });
        }
        // each lane's partial sums combined as `int8::combine_rows`: token
        // 2p's rows in lanes 0..8, token 2p + 1's in lanes 8..16
        let mut out = [[0.0f32; 8]; 2 * $p];
        for (p, acc) in acc.iter().enumerate() {
            let mut both = [0.0f32; 16];
            combine_store(acc, &mut both);
            out[2 * p].copy_from_slice(&both[..8]);
            out[2 * p + 1].copy_from_slice(&both[8..]);
        }
        out
    }};
}

isa_features!(
    /// Eight interleaved Q4_K rows · two activation rows.
    pub(crate) fn dot_q4k_r8_x2(w: &[BlockQ4Kx8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        q4k_rows8_pairs!(1, w, xs)
    }

    /// Eight interleaved Q4_K rows · four activation rows.
    pub(crate) fn dot_q4k_r8_x4(w: &[BlockQ4Kx8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        q4k_rows8_pairs!(2, w, xs)
    }
);
