//! AVX2 eight-row K-quant dots: eight interleaved Q4_K, Q5_K or Q6_K rows
//! (`quant::BlockQ4Kx8`, `BlockQ5Kx8`, `BlockQ6Kx8`) against quantised
//! activations, one to four tokens, one vector lane per row and no
//! horizontal reduction, each row in `portable`'s float order bit for bit.
//! Written once here (`kmin_rows8_n!` for Q4_K and Q5_K, `q6k_rows8_n!`)
//! and shared with the AVX-512 VNNI
//! build, which hands them `vpdpbusd` chains as the integer sums instead of
//! `vpmaddubsw` + `vpmaddwd`.
//!
//! Per super-block s and sub-block j (activation block 8·s + j): one
//! 32-byte load per group g of four weights holds row k's four codes in
//! 32-bit lane k; each group's codes against its four activation bytes
//! broadcast give the eight rows' exact Σ q·q_x as integer lanes.
//!
//! * Q4_K: S = sc[k][j]·Σ q·q_x (`$scaled_sum`: on AVX2 the eight
//!   `vpmaddubsw` add in i16 and one `vpmaddwd` by the scale gives S in
//!   i32; AVX-512 VNNI takes the i32 sum times the scale in f32; both
//!   exact, so the same float), M = m[k][j]·Σ q_x (the block's `sum`, a
//!   product of integers taken in f32, exact); lane k of accumulator j +=
//!   (d_k·d_x)·S − (dmin_k·d_x)·M, every product rounded on its own, no FMA
//!   (`portable::k_min_term`). The codes are nibbles: (c, g)'s load holds
//!   sub-block 2c (low nibbles) and 2c + 1 (high), unpacked in registers.
//! * Q5_K: as Q4_K, each code with its fifth bit from `qh` load g (bit j
//!   of a byte for sub-block j, moved to bit 4: `fifth_bit`), codes ≤ 31.
//! * Q6_K: the codes are bytes 0..63; per half h, Σ (q − 32)·q_x =
//!   Σ q·q_x − 32·X_h, X_h the activations' sum over the half (computed
//!   from the quants, `act_halves`); S = sc[k][2j]·(half 0) +
//!   sc[k][2j+1]·(half 1), lane k of accumulator j += (d_k·d_x)·S.
//! * Accumulator j takes the blocks with index ≡ j mod 8, as `portable`'s
//!   partial sum j; the eight are combined per lane as `portable::combine8`
//!   (`int8::combine_rows`).
//!
//! Integer exactness. Activation quants are any i8 (|q_x| ≤ 128), codes
//! unsigned, ≤ 15 (Q4_K) or ≤ 63 (Q6_K). AVX2's `vpmaddubsw` adds two u8 ×
//! i8 products in an i16: ≤ 2·63·128 = 16128; two such pairs are added in
//! i16 before `vpmaddwd` (≤ 32256 < 32767), so nothing saturates (Q4_K's
//! are ≤ 2·15·128 = 3840, and all eight of a sub-block add to ≤ 30720;
//! Q5_K's ≤ 2·31·128 = 7936, four add to ≤ 31744, so a sub-block's two
//! halves go through `vpmaddwd` apart: `q5k_scaled_sum`);
//! `vpmaddwd` and `vpdpbusd` widen to i32 without loss. Sums: Q4_K
//! |Σ q·q_x| ≤ 32·15·128, times sc ≤ 63: < 2^22 (Q5_K: 32·31·128·63 <
//! 2^24); |M| ≤ 63·32·128 < 2^18;
//! Q6_K |Σ_16 q·q_x| ≤ 16·63·128 < 2^17, |32·X_h| ≤ 32·16·128 = 2^16,
//! |Σ_16 (q − 32)·q_x| ≤ 16·32·128 = 2^16, times |sc| ≤ 128, two of them:
//! ≤ 2^24. All i32 arithmetic is exact, and so is the f32 arithmetic on
//! these integers (every factor, product and sum an integer of at most
//! 2^24 in magnitude), so S and M are `portable`'s integers as the same
//! floats.

use core::arch::x86_64::*;

use super::int8::{bcast4, ld32, ld_rows};
use crate::quant::BlockQ8Act;

/// Q4_K or Q5_K eight interleaved rows · N activation rows (module doc).
/// `$scale(&[u8; 8])` takes a sub-block's eight 6-bit scales into whatever
/// form `$scaled_sum(codes: &[__m256i; 8], x: &BlockQ8Act, &scale)` wants,
/// which gives S = sc·Σ q·q_x per lane as f32 (exact: module doc).
/// `$codes(blk, c)` gives the codes of sub-blocks 2c and 2c + 1 of a
/// super-block, eight loads' worth each, in the forms `$scaled_sum` and
/// `$scaled_sum_high` take: for Q4_K the low nibbles of `qs` part c and
/// its high nibbles (bytes 0..15 on AVX2, `high_nibbles`, with
/// `$scaled_sum` again; left in place as 16·q on AVX-512 VNNI, whose sum
/// is then shifted back: one AND per load instead of a shift and an AND);
/// for Q5_K each with its fifth bit (`q5k_codes_r8`). A macro, so that all
/// of it is inlined into the kernel.
macro_rules! kmin_rows8_n {
    ($n:tt, $w:expr, $xs:expr, $scale:expr, $codes:expr, $scaled_sum:expr, $scaled_sum_high:expr $(,)?) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::int8::{combine_rows, scales_f16};
        use $crate::kernels::x86_64::avx2::kquant_rows8::{k_min_rows, lanes_u8_ps};
        use $crate::quant::{ActRef, BlockQ8Act};
        let w = $w;
        let xs: [ActRef; $n] = $xs;
        let mut same_len = true;
        for x in &xs {
            same_len &= x.len() == 8 * w.len();
        }
        assert!(same_len, "eight-row K-quant dot: {} super-blocks per row, activations differ", w.len());
        let mut acc = [[_mm256_setzero_ps(); 8]; $n];
        for (s, blk) in w.iter().enumerate() {
            $crate::kernels::x86_64::avx2::kquant_rows8::prefetch_ahead(blk);
            let (d, dmin) = (scales_f16(&blk.d), scales_f16(&blk.dmin));
            let _ = unroll!(4, |c| {
                let (lo, hi): ([__m256i; 8], [__m256i; 8]) = ($codes)(blk, c);
                let (sc0, mn0) = (($scale)(&blk.scales[2 * c]), lanes_u8_ps(&blk.mins[2 * c]));
                let (sc1, mn1) = (($scale)(&blk.scales[2 * c + 1]), lanes_u8_ps(&blk.mins[2 * c + 1]));
                let _ = unroll!($n, |t| {
                    let xb: &[BlockQ8Act; 8] = xs[t].blocks()[8 * s..8 * s + 8].try_into().unwrap();
                    let (x0, x1) = (&xb[2 * c], &xb[2 * c + 1]);
                    let (s0, s1) = (($scaled_sum)(&lo, x0, &sc0), ($scaled_sum_high)(&hi, x1, &sc1));
                    acc[t][2 * c] = k_min_rows(acc[t][2 * c], s0, mn0, x0, d, dmin);
                    acc[t][2 * c + 1] = k_min_rows(acc[t][2 * c + 1], s1, mn1, x1, d, dmin);
                });
            });
        }
        unroll!($n, |t| combine_rows(acc[t]))
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use kmin_rows8_n;

/// The nibbles of `qs` part c of an interleaved Q4_K (or Q5_K) super-block,
/// eight loads: sub-block 2c's (the low nibbles, as bytes 0..15) and
/// sub-block 2c + 1's in the form `$high(load)` gives (`high_nibbles`: bytes
/// 0..15; AVX-512 VNNI's `high_nibbles_x16`: in place, as 16·q). A macro,
/// so that the sixteen vectors stay in registers in the kernel.
macro_rules! q4k_codes_r8 {
    ($blk:expr, $c:expr, $high:expr) => {{
        use $crate::kernels::x86_64::avx2::int8::ld_rows;
        use $crate::kernels::x86_64::avx2::kquant_rows8::low_nibbles;
        let (blk, c) = ($blk, $c);
        let v = unroll!(8, |g| ld_rows(&blk.qs[256 * c..256 * c + 256], g));
        (unroll!(8, |g| low_nibbles(v[g])), unroll!(8, |g| ($high)(v[g])))
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use q4k_codes_r8;

/// Q6_K eight interleaved rows · N activation rows (module doc), `$dot16`
/// as for `kmin_rows8_n!`; `$codes6(ql, qh)` unpacks the codes of sub-blocks
/// 2c and 2c + 1 from their 256 low-bit and 128 high-bit bytes
/// (`quant::BlockQ6Kx8`) into bytes 0..63, eight 32-byte groups each.
macro_rules! q6k_rows8_n {
    ($n:tt, $w:expr, $xs:expr, $dot16:expr, $codes6:expr $(,)?) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::int8::{bcast4, combine_rows, scales_f16};
        use $crate::kernels::x86_64::avx2::kquant_rows8::{act_halves, lanes_i8_ps};
        use $crate::quant::{ActRef, BlockQ6Kx8, BlockQ8Act};
        let w: &[BlockQ6Kx8] = $w;
        let xs: [ActRef; $n] = $xs;
        let dot16 = $dot16;
        let codes6 = $codes6;
        let mut same_len = true;
        for x in &xs {
            same_len &= x.len() == 8 * w.len();
        }
        assert!(same_len, "eight-row Q6_K dot: {} super-blocks per row, activations differ", w.len());
        let mut acc = [[_mm256_setzero_ps(); 8]; $n];
        for (s, blk) in w.iter().enumerate() {
            $crate::kernels::x86_64::avx2::kquant_rows8::prefetch_ahead(blk);
            let d = scales_f16(&blk.d);
            let _ = unroll!(4, |c| {
                let codes: [[__m256i; 8]; 2] =
                    codes6(&blk.qs[384 * c..384 * c + 256], &blk.qs[384 * c + 256..384 * c + 384]);
                let _ = unroll!(2, |p| {
                    let (j, q) = (2 * c + p, &codes[p]);
                    let (sc0, sc1) = (lanes_i8_ps(&blk.scales[2 * j]), lanes_i8_ps(&blk.scales[2 * j + 1]));
                    let _ = unroll!($n, |t| {
                        let x: &BlockQ8Act = &xs[t].blocks()[8 * s + j];
                        let (h0, h1) = act_halves(x);
                        let a = dot16([q[0], q[1], q[2], q[3]], unroll!(4, |g| bcast4(x, g)));
                        let b = dot16([q[4], q[5], q[6], q[7]], unroll!(4, |g| bcast4(x, 4 + g)));
                        let a = _mm256_sub_epi32(a, _mm256_set1_epi32(32 * h0));
                        let b = _mm256_sub_epi32(b, _mm256_set1_epi32(32 * h1));
                        // S in f32, exact (module doc): sc·half ≤ 2^23, S ≤ 2^24
                        let sa = _mm256_mul_ps(sc0, _mm256_cvtepi32_ps(a));
                        let sb = _mm256_mul_ps(sc1, _mm256_cvtepi32_ps(b));
                        let dd = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                        acc[t][j] = _mm256_add_ps(acc[t][j], _mm256_mul_ps(dd, _mm256_add_ps(sa, sb)));
                    });
                });
            });
        }
        unroll!($n, |t| combine_rows(acc[t]))
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use q6k_rows8_n;

/// How far ahead of the super-block being read `prefetch_ahead` asks for
/// cache lines, in bytes, into L2 (`_MM_HINT_T1`). Chosen on the 1.5B
/// Q4_K_M file's decode (docs/PERFORMANCE.md#q4_k_m-files-run-as-they-are): 6–12 KiB into L2 gained
/// ~10 % over none at one thread; into L1 (`T0`) lost 25 %.
pub(crate) const PREFETCH_AHEAD: usize = 12288;

/// `kmin_rows8_n!` for Q4_K with AVX2's steps: the scale as i16 pairs, S
/// by `q4k_scaled_sum` for both nibbles (the high ones shifted down).
macro_rules! q4k_rows8_avx2 {
    ($n:tt, $w:expr, $xs:expr) => {{
        let w: &[crate::quant::BlockQ4Kx8] = $w;
        kmin_rows8_n!(
            $n,
            w,
            $xs,
            |v| scale_pairs_u8(v),
            |blk: &crate::quant::BlockQ4Kx8, c: usize| q4k_codes_r8!(blk, c, high_nibbles),
            |q, x, sc| q4k_scaled_sum(q, x, sc),
            |q, x, sc| q4k_scaled_sum(q, x, sc)
        )
    }};
}

/// `kmin_rows8_n!` for Q5_K with AVX2's steps: the codes with their fifth
/// bits (`q5k_codes_r8`), S by `q5k_scaled_sum` (sums split in two, since
/// 5-bit codes would saturate the i16 of eight `vpmaddubsw`).
macro_rules! q5k_rows8_avx2 {
    ($n:tt, $w:expr, $xs:expr) => {{
        let w: &[crate::quant::BlockQ5Kx8] = $w;
        kmin_rows8_n!(
            $n,
            w,
            $xs,
            |v| scale_pairs_u8(v),
            |blk, c| q5k_codes_r8(blk, c),
            |q, x, sc| q5k_scaled_sum(q, x, sc),
            |q, x, sc| q5k_scaled_sum(q, x, sc)
        )
    }};
}

isa_features!(
    /// Asks for the cache lines `PREFETCH_AHEAD` bytes past `blk`'s (an
    /// interleaved super-block; the matrix is read in address order), so
    /// that more of them are in flight than the hardware prefetcher keeps.
    #[inline]
    pub(crate) fn prefetch_ahead<B>(blk: &B) {
        let p = (blk as *const B as *const i8).wrapping_add(PREFETCH_AHEAD);
        for line in 0..std::mem::size_of::<B>().div_ceil(64) {
            // A prefetch never faults and reads nothing back, so an address
            // past the matrix's end is harmless.
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * line));
        }
    }

    /// Eight unsigned bytes (one per row) as f32 lanes (exact).
    #[inline]
    pub(crate) fn lanes_u8_ps(v: &[u8; 8]) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(*v))))
    }

    /// Eight signed bytes (one per row) as f32 lanes (exact).
    #[inline]
    pub(crate) fn lanes_i8_ps(v: &[i8; 8]) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(v.map(|b| b as u8)))))
    }

    /// Lane k += (d_k·d_x)·S_k − (dmin_k·d_x)·M_k with S = sc·isum (given,
    /// as f32) and M = m·Σq_x, each product rounded, no FMA
    /// (`portable::k_min_term`). M is a product of integers taken in f32
    /// (`mn` as f32 lanes): exact, factors and product being below 2^24
    /// (module doc), and cheaper than `vpmulld`.
    #[inline]
    pub(crate) fn k_min_rows(acc: __m256, s: __m256, mn: __m256, x: &BlockQ8Act, d: __m256, dmin: __m256) -> __m256 {
        let dx = _mm256_set1_ps(x.d);
        let m = _mm256_mul_ps(mn, _mm256_cvtepi32_ps(_mm256_set1_epi32(x.sum)));
        let a = _mm256_mul_ps(_mm256_mul_ps(d, dx), s);
        let b = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), m);
        _mm256_add_ps(acc, _mm256_sub_ps(a, b))
    }

    /// The sums of an activation block's quants 0..16 and 16..32 (exact):
    /// `vpsadbw` of the quants + 128 (as unsigned bytes) against zero gives
    /// four sums of eight, 16·128 is taken off each half.
    #[inline]
    pub(crate) fn act_halves(x: &BlockQ8Act) -> (i32, i32) {
        let v = _mm256_xor_si256(ld32(&x.qs), _mm256_set1_epi8(-128));
        let s = _mm256_sad_epu8(v, _mm256_setzero_si256());
        let (lo, hi) = (_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let half = |h: __m128i| _mm_cvtsi128_si32(h) + _mm_extract_epi32::<2>(h) - 16 * 128;
        (half(lo), half(hi))
    }

    /// The 6-bit codes of sub-blocks 2c and 2c + 1 of an interleaved Q6_K
    /// super-block from its part c's low-bit (256 bytes, `ql`) and high-bit
    /// (128, `qh`) bytes (`quant::BlockQ6Kx8`): group g's low bits are
    /// nibble p of `ql` load g, its high bits field g % 4 of `qh` load
    /// 2p + g / 4, moved to bits 4..5 by a 16-bit shift and masked (bits
    /// that cross into the next byte are masked off).
    #[inline]
    pub(crate) fn q6k_codes_r8(ql: &[u8], qh: &[u8]) -> [[__m256i; 8]; 2] {
        let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
        let v = unroll!(8, |g| ld_rows(ql, g));
        let h = unroll!(4, |i| ld_rows(qh, i));
        let high = |x: __m256i, f: usize| {
            let at4 = match f {
                0 => _mm256_slli_epi16::<4>(x),
                1 => _mm256_slli_epi16::<2>(x),
                2 => x,
                _ => _mm256_srli_epi16::<2>(x),
            };
            _mm256_and_si256(at4, m30)
        };
        let lo = unroll!(8, |g| _mm256_or_si256(_mm256_and_si256(v[g], m4), high(h[g / 4], g % 4)));
        let hi = unroll!(8, |g| {
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v[g]), m4), high(h[2 + g / 4], g % 4))
        });
        [lo, hi]
    }

    /// A Q4_K load's low nibbles as bytes 0..15.
    #[inline]
    pub(crate) fn low_nibbles(v: __m256i) -> __m256i {
        _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
    }

    /// Bit j (0..8) of every byte of `h`, moved to bit 4 (16-bit shifts:
    /// bit 4 of a byte comes from bit j of the same byte), the rest zero:
    /// a Q5_K code's 16 from its `qh` byte.
    #[inline]
    pub(crate) fn fifth_bit(h: __m256i, j: usize) -> __m256i {
        let at4 = match j {
            0 => _mm256_slli_epi16::<4>(h),
            1 => _mm256_slli_epi16::<3>(h),
            2 => _mm256_slli_epi16::<2>(h),
            3 => _mm256_slli_epi16::<1>(h),
            4 => h,
            5 => _mm256_srli_epi16::<1>(h),
            6 => _mm256_srli_epi16::<2>(h),
            _ => _mm256_srli_epi16::<3>(h),
        };
        _mm256_and_si256(at4, _mm256_set1_epi8(0x10))
    }

    /// The 5-bit codes (bytes 0..31) of sub-blocks 2c and 2c + 1 of an
    /// interleaved Q5_K super-block (`quant::BlockQ5Kx8`): the nibbles of
    /// `qs` part c's loads g, each with bit 2c (low nibbles) or 2c + 1
    /// (high) of `qh` load g as its bit 4.
    #[inline]
    pub(crate) fn q5k_codes_r8(blk: &crate::quant::BlockQ5Kx8, c: usize) -> ([__m256i; 8], [__m256i; 8]) {
        let (lo, hi) = q4k_codes_r8!(blk, c, high_nibbles);
        let h = unroll!(8, |g| ld_rows(&blk.qh, g));
        let lo = unroll!(8, |g| _mm256_or_si256(lo[g], fifth_bit(h[g], 2 * c)));
        let hi = unroll!(8, |g| _mm256_or_si256(hi[g], fifth_bit(h[g], 2 * c + 1)));
        (lo, hi)
    }

    /// S = sc·Σ q·q_x per lane over a Q5_K sub-block (codes ≤ 31, `sc` from
    /// `scale_pairs_u8`), as f32: the `vpmaddubsw` of groups 0..4 and of
    /// 4..8 add in i16 apart (each at most 4·2·31·128 = 31744, no
    /// saturation), each taken by `vpmaddwd` with the scale into i32 (|S| ≤
    /// 63·32·31·128 < 2^24, exact, so the same float as sc·isum in f32).
    #[inline]
    pub(crate) fn q5k_scaled_sum(codes: &[__m256i; 8], x: &BlockQ8Act, sc: &__m256i) -> __m256 {
        let half = |g0: usize| {
            let p = unroll!(4, |i| _mm256_maddubs_epi16(codes[g0 + i], bcast4(x, g0 + i)));
            let s16 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
            _mm256_madd_epi16(s16, *sc)
        };
        _mm256_cvtepi32_ps(_mm256_add_epi32(half(0), half(4)))
    }

    /// A Q4_K load's high nibbles as bytes 0..15 (the AVX-512 VNNI build
    /// keeps Q4_K's in place instead).
    #[inline]
    pub(crate) fn high_nibbles(v: __m256i) -> __m256i {
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), _mm256_set1_epi8(0x0f))
    }

    /// Eight unsigned bytes (one per row) as i16 pairs: lane k holds row
    /// k's byte in both halves (`vpmaddwd` by it scales both of a lane's i16).
    #[inline]
    pub(crate) fn scale_pairs_u8(v: &[u8; 8]) -> __m256i {
        let x = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(*v)));
        _mm256_or_si256(x, _mm256_slli_epi32::<16>(x))
    }

    /// S = sc·Σ q·q_x per lane over a Q4_K sub-block (eight groups of
    /// codes ≤ 15, `sc` from `scale_pairs_u8`), as f32: the eight
    /// `vpmaddubsw` add in i16 (at most 8·2·15·128 = 30720, no saturation),
    /// `vpmaddwd` by the scale widens and scales them in one step (|S| <
    /// 2^22, exact, so the same float as sc·isum taken in f32).
    #[inline]
    pub(crate) fn q4k_scaled_sum(codes: &[__m256i; 8], x: &BlockQ8Act, sc: &__m256i) -> __m256 {
        let mut s16 = _mm256_maddubs_epi16(codes[0], bcast4(x, 0));
        for (g, &c) in codes.iter().enumerate().skip(1) {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(c, bcast4(x, g)));
        }
        _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, *sc))
    }

    /// Four groups' u8 × i8 products per lane, exact (module doc): pairs
    /// of `vpmaddubsw` added in i16, then `vpmaddwd` by ones.
    #[inline]
    fn dot16(u: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
        let p = |g: usize| _mm256_maddubs_epi16(u[g], x[g]);
        let ones = _mm256_set1_epi16(1);
        let a = _mm256_madd_epi16(_mm256_add_epi16(p(0), p(1)), ones);
        let b = _mm256_madd_epi16(_mm256_add_epi16(p(2), p(3)), ones);
        _mm256_add_epi32(a, b)
    }

    /// Eight interleaved Q4_K rows · one activation row: row k's result is
    /// `dot_q4k` of row k, bit for bit.
    #[inline]
    pub(crate) fn dot_q4k_r8(w: &[crate::quant::BlockQ4Kx8], x: crate::quant::ActRef) -> [f32; 8] {
        q4k_rows8_avx2!(1, w, [x])[0]
    }

    /// Eight interleaved Q4_K rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q4k_r8_x2(w: &[crate::quant::BlockQ4Kx8], xs: [crate::quant::ActRef; 2]) -> [[f32; 8]; 2] {
        q4k_rows8_avx2!(2, w, xs)
    }

    /// Eight interleaved Q4_K rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q4k_r8_x3(w: &[crate::quant::BlockQ4Kx8], xs: [crate::quant::ActRef; 3]) -> [[f32; 8]; 3] {
        q4k_rows8_avx2!(3, w, xs)
    }

    /// Eight interleaved Q4_K rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q4k_r8_x4(w: &[crate::quant::BlockQ4Kx8], xs: [crate::quant::ActRef; 4]) -> [[f32; 8]; 4] {
        q4k_rows8_avx2!(4, w, xs)
    }

    /// Eight interleaved Q5_K rows · one activation row: row k's result is
    /// `dot_q5k` of row k, bit for bit.
    #[inline]
    pub(crate) fn dot_q5k_r8(w: &[crate::quant::BlockQ5Kx8], x: crate::quant::ActRef) -> [f32; 8] {
        q5k_rows8_avx2!(1, w, [x])[0]
    }

    /// Eight interleaved Q5_K rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q5k_r8_x2(w: &[crate::quant::BlockQ5Kx8], xs: [crate::quant::ActRef; 2]) -> [[f32; 8]; 2] {
        q5k_rows8_avx2!(2, w, xs)
    }

    /// Eight interleaved Q5_K rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q5k_r8_x3(w: &[crate::quant::BlockQ5Kx8], xs: [crate::quant::ActRef; 3]) -> [[f32; 8]; 3] {
        q5k_rows8_avx2!(3, w, xs)
    }

    /// Eight interleaved Q5_K rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q5k_r8_x4(w: &[crate::quant::BlockQ5Kx8], xs: [crate::quant::ActRef; 4]) -> [[f32; 8]; 4] {
        q5k_rows8_avx2!(4, w, xs)
    }

    /// Eight interleaved Q6_K rows · one activation row: row k's result is
    /// `dot_q6k` of row k, bit for bit.
    #[inline]
    pub(crate) fn dot_q6k_r8(w: &[crate::quant::BlockQ6Kx8], x: crate::quant::ActRef) -> [f32; 8] {
        q6k_rows8_n!(1, w, [x], |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))[0]
    }

    /// Eight interleaved Q6_K rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q6k_r8_x2(w: &[crate::quant::BlockQ6Kx8], xs: [crate::quant::ActRef; 2]) -> [[f32; 8]; 2] {
        q6k_rows8_n!(2, w, xs, |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))
    }

    /// Eight interleaved Q6_K rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q6k_r8_x3(w: &[crate::quant::BlockQ6Kx8], xs: [crate::quant::ActRef; 3]) -> [[f32; 8]; 3] {
        q6k_rows8_n!(3, w, xs, |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))
    }

    /// Eight interleaved Q6_K rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q6k_r8_x4(w: &[crate::quant::BlockQ6Kx8], xs: [crate::quant::ActRef; 4]) -> [[f32; 8]; 4] {
        q6k_rows8_n!(4, w, xs, |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))
    }
);
