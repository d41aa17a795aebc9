//! AVX-512 VNNI kernels: int8 dots with `vpdpbusd` (four u8 × i8 products
//! summed into each i32 lane in one instruction), in its 256-bit AVX512VL form,
//! eight blocks per step in `portable`'s eight-lane order, through avx2.rs's
//! `q8_dot_n!` / `q4_dot_n!` (`sum_blocks8_n!`), one token or four. For Q4 the unsigned nibbles go in directly, two blocks per
//! vector, and the blocks' −8·Σq is added after the reduction. The
//! eight-row kernels over repacked weights (avx2.rs's `rows8_n!`) take
//! Q8 weights stored as w + 128 (unsigned), so `vpdpbusd` multiplies them by
//! the broadcast activations directly, −128·Σq after. The K-quant dots are
//! avx2/kquant.rs's (`kmin_dot_n!`, `q6k_dot_n!`) with `vpdpbusd` as the
//! block dot, their eight-row forms avx2/kquant_rows8.rs's (`kmin_rows8_n!`,
//! `q6k_rows8_n!`) with a chain of `vpdpbusd`. The f32 kernels are AVX2's.

use core::arch::x86_64::*;

mod kquant_pairs;
mod tiles;

pub(crate) use kquant_pairs::{dot_q4k_r8_x2, dot_q4k_r8_x4};

use super::avx2::float as avx2_float;
use super::avx2::int8::{bcast4, ld_rows, mxfp4_dot_n, mxfp4_r8_n, q4_dot_n, q8_dot_n, rows8_n, rows_nibbles};
use super::avx2::kquant::{kmin_dot_n, q4k_codes, q5k_codes, q6k_dot_n};
use super::avx2::kquant_rows8::{kmin_rows8_n, q4k_codes_r8, q5k_codes_r8, q6k_rows8_n};
use crate::kernels::Kernels;
use crate::quant::{
    ActRef, BlockMxfp4, BlockMxfp4x8, BlockQ4K, BlockQ4Kx8, BlockQ4_0x8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8,
    BlockQ8Act, BlockQ8_0x8, Q4Block, Q8Block,
};

/// The AVX-512 VNNI kernel set (with AVX2's f32 kernels).
pub struct Avx512Vnni;

impl Kernels for Avx512Vnni {
    const ROWS8: bool = true;
    const Q8_X8_BIAS: u8 = Q8_X8_BIAS;
    const INT8_PEAK: &'static str = "vpdpbusd zmm";
    const KQUANT_ROWS8: bool = true;
    const MXFP4_ROWS8: bool = true;
    entry_points!(avx2_float: f32_ops, kv_rows);
    entry_points!(self: int8_dots, int8_dots_x4, mxfp4_dots, rows8, mxfp4_rows8, kquant_dots, kquant_dots_x4, kquant_rows8, int8_peak);
    entry_points!(tiles: tiles, mxfp4_tiles);
    #[inline]
    fn prefetch(bytes: &[u8]) {
        super::prefetch(bytes)
    }
}

isa_features!(
    /// A block's 32 u8 × i8 products (u = |w|, s = sign(x, w)) in eight exact i32 lanes.
    #[inline]
    fn block_dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }

    /// Σ lo·x0 + hi·x1 (nibbles u8 × activations i8) in eight exact i32 lanes.
    #[inline]
    fn pair_dot(lo: __m256i, hi: __m256i, x0: __m256i, x1: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, x0), hi, x1)
    }

    /// Q8 weights · Q8 activations: |w| × sign(x, w) (activation quants in
    /// [-127, 127], so the sign never overflows) into `vpdpbusd`, exact i32
    /// lanes per block, eight blocks per step (avx2.rs's `q8_dot_n!`).
    #[inline]
    pub(crate) fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q8_dot_n!(1, w, [x], |u, s| block_dot(u, s))[0]
    }

    /// MXFP4 weights · Q8 activations: the values looked up into int8
    /// (avx2's `mxfp4_quants`), then as `dot_q8`.
    #[inline]
    pub(crate) fn dot_mxfp4(w: &[BlockMxfp4], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        mxfp4_dot_n!(1, w, [x], |u, s| block_dot(u, s))[0]
    }

    /// `dot_mxfp4` of one weight row with four activation rows (each result
    /// bit-identical to `dot_mxfp4`'s).
    #[inline]
    pub(crate) fn dot_mxfp4_x4(w: &[BlockMxfp4], xs: [ActRef; 4]) -> [f32; 4] {
        mxfp4_dot_n!(4, w, xs, |u, s| block_dot(u, s))
    }

    /// Q4 weights · Q8 activations: Σ nibble·q (unsigned nibbles straight
    /// into `vpdpbusd`, two blocks per vector) − 8·Σq per block (exact).
    #[inline]
    pub(crate) fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q4_dot_n!(1, w, [x], |lo, hi, x0, x1| pair_dot(lo, hi, x0, x1))[0]
    }

    /// `dot_q8` of one weight row with four activation rows, |w| made once
    /// per block (each result bit-identical to `dot_q8`'s).
    #[inline]
    pub(crate) fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q8_dot_n!(4, w, xs, |u, s| block_dot(u, s))
    }

    /// `dot_q4` of one weight row with four activation rows, the nibbles
    /// unpacked once per block pair (each result bit-identical to `dot_q4`'s).
    #[inline]
    pub(crate) fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q4_dot_n!(4, w, xs, |lo, hi, x0, x1| pair_dot(lo, hi, x0, x1))
    }

    /// Q4_K weights · Q8 activations: avx2/kquant.rs's algorithm, the
    /// sub-blocks' unsigned codes straight into `vpdpbusd`.
    #[inline]
    pub(crate) fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kmin_dot_n!(1, w, [x], |b| q4k_codes(b), |u, s| block_dot(u, s))[0]
    }

    /// Q5_K weights · Q8 activations (as `dot_q4k`).
    #[inline]
    pub(crate) fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kmin_dot_n!(1, w, [x], |b| q5k_codes(b), |u, s| block_dot(u, s))[0]
    }

    /// Q6_K weights · Q8 activations (as `dot_q4k`; the −32 offset as a
    /// second `vpdpbusd` of 32s).
    #[inline]
    pub(crate) fn dot_q6k(w: &[BlockQ6K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        q6k_dot_n!(1, w, [x], |u, s| block_dot(u, s))[0]
    }

    /// `dot_q4k` of one weight row with four activation rows, the codes
    /// unpacked once per super-block (each result bit-identical to `dot_q4k`'s).
    #[inline]
    pub(crate) fn dot_q4k_x4(w: &[BlockQ4K], xs: [ActRef; 4]) -> [f32; 4] {
        kmin_dot_n!(4, w, xs, |b| q4k_codes(b), |u, s| block_dot(u, s))
    }

    /// As `dot_q4k_x4` for Q5_K.
    #[inline]
    pub(crate) fn dot_q5k_x4(w: &[BlockQ5K], xs: [ActRef; 4]) -> [f32; 4] {
        kmin_dot_n!(4, w, xs, |b| q5k_codes(b), |u, s| block_dot(u, s))
    }

    /// As `dot_q4k_x4` for Q6_K.
    #[inline]
    pub(crate) fn dot_q6k_x4(w: &[BlockQ6K], xs: [ActRef; 4]) -> [f32; 4] {
        q6k_dot_n!(4, w, xs, |u, s| block_dot(u, s))
    }

    /// Eight rows' exact Σ (c − BIAS)·q for one interleaved block of unsigned
    /// 4-bit-sized codes c (Q4's nibbles, BIAS 8; MXFP4's values + 12 from
    /// avx2's `rows_mxfp4`, BIAS 12): Σ c·q by `vpdpbusd` in two chains
    /// (|Σ| ≤ 32·24·128, no overflow), then BIAS·Σq off; lanes = rows.
    #[inline]
    fn biased_rows_isums<const BIAS: i32>(n: &[(__m256i, __m256i); 4], x: &BlockQ8Act) -> __m256i {
        let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let _ = unroll!(4, |g| {
            lo = _mm256_dpbusd_epi32(lo, n[g].0, bcast4(x, g));
            hi = _mm256_dpbusd_epi32(hi, n[g].1, bcast4(x, 4 + g));
        });
        _mm256_sub_epi32(_mm256_add_epi32(lo, hi), _mm256_set1_epi32(BIAS * x.sum))
    }
);

/// `kmin_rows8_n!` for Q5_K: the codes with their fifth bits (avx2's
/// `q5k_codes_r8`), their exact sums by `vpdpbusd` (`q4k_scaled_sum`:
/// 5-bit codes go in as they are, |sc·Σ q·q_x| ≤ 63·32·31·128 < 2^24).
macro_rules! q5k_rows8_vnni {
    ($n:tt, $w:expr, $xs:expr) => {
        kmin_rows8_n!(
            $n,
            $w,
            $xs,
            |v| lanes_u8_ps(v),
            |blk, c| q5k_codes_r8(blk, c),
            |q, x, sc| q4k_scaled_sum(q, x, sc),
            |q, x, sc| q4k_scaled_sum(q, x, sc)
        )
    };
}

/// Bias of the quants in `BlockQ8_0x8` for these kernels: 0x80, each
/// weight stored as w + 128 in an unsigned byte, so `vpdpbusd` takes it directly.
pub const Q8_X8_BIAS: u8 = 0x80;

isa_features!(
    /// An interleaved Q8 block's eight 32-byte groups (w + 128, unsigned).
    #[inline]
    fn rows_q8(blk: &BlockQ8_0x8) -> [__m256i; 8] {
        unroll!(8, |g| ld_rows(&blk.qs, g))
    }

    /// Eight rows' exact Σ w·q for one block: Σ (w + 128)·q − 128·Σq, the
    /// first by `vpdpbusd` in two chains (|Σ| ≤ 32·255·127, no overflow).
    #[inline]
    fn q8_rows_isums(w: &[__m256i; 8], x: &BlockQ8Act) -> __m256i {
        let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let _ = unroll!(4, |g| {
            a = _mm256_dpbusd_epi32(a, w[2 * g], bcast4(x, 2 * g));
            b = _mm256_dpbusd_epi32(b, w[2 * g + 1], bcast4(x, 2 * g + 1));
        });
        _mm256_sub_epi32(_mm256_add_epi32(a, b), _mm256_set1_epi32(128 * x.sum))
    }

    /// Eight interleaved Q8 rows · one activation row: row k's result is
    /// `dot_q8` of row k, bit for bit (avx2.rs's `rows8_n!`).
    #[inline]
    pub(crate) fn dot_q8_r8(w: &[BlockQ8_0x8], x: ActRef) -> [f32; 8] {
        rows8_n!(1, w, [x], |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))[0]
    }

    /// Eight interleaved Q4 rows · one activation row (as `dot_q8_r8`).
    #[inline]
    pub(crate) fn dot_q4_r8(w: &[BlockQ4_0x8], x: ActRef) -> [f32; 8] {
        rows8_n!(1, w, [x], |blk| rows_nibbles(&blk.qs), |wv, xb| biased_rows_isums::<8>(&wv, xb))[0]
    }

    /// Eight interleaved Q8 rows · two activation rows, the weights loaded once per block.
    #[inline]
    pub(crate) fn dot_q8_r8_x2(w: &[BlockQ8_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        rows8_n!(2, w, xs, |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q4 rows · two activation rows, the nibbles unpacked once per block.
    #[inline]
    pub(crate) fn dot_q4_r8_x2(w: &[BlockQ4_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        rows8_n!(2, w, xs, |blk| rows_nibbles(&blk.qs), |wv, xb| biased_rows_isums::<8>(&wv, xb))
    }

    /// Eight interleaved Q8 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q8_r8_x3(w: &[BlockQ8_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        rows8_n!(3, w, xs, |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q4 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q4_r8_x3(w: &[BlockQ4_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        rows8_n!(3, w, xs, |blk| rows_nibbles(&blk.qs), |wv, xb| biased_rows_isums::<8>(&wv, xb))
    }

    /// Eight interleaved Q8 rows · four activation rows, the weights loaded once per block.
    #[inline]
    pub(crate) fn dot_q8_r8_x4(w: &[BlockQ8_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_n!(4, w, xs, |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q4 rows · four activation rows, the nibbles unpacked once per block.
    #[inline]
    pub(crate) fn dot_q4_r8_x4(w: &[BlockQ4_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_n!(4, w, xs, |blk| rows_nibbles(&blk.qs), |wv, xb| biased_rows_isums::<8>(&wv, xb))
    }

    /// Eight interleaved MXFP4 rows · one activation row: row k's result
    /// is `dot_mxfp4` of row k, bit for bit (avx2's `mxfp4_r8_n!`).
    #[inline]
    pub(crate) fn dot_mxfp4_r8(w: &[BlockMxfp4x8], x: ActRef) -> [f32; 8] {
        mxfp4_r8_n!(1, w, [x], biased_rows_isums::<12>)[0]
    }

    /// Eight interleaved MXFP4 rows · two activation rows.
    #[inline]
    pub(crate) fn dot_mxfp4_r8_x2(w: &[BlockMxfp4x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        mxfp4_r8_n!(2, w, xs, biased_rows_isums::<12>)
    }

    /// Eight interleaved MXFP4 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_mxfp4_r8_x3(w: &[BlockMxfp4x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        mxfp4_r8_n!(3, w, xs, biased_rows_isums::<12>)
    }

    /// Eight interleaved MXFP4 rows · four activation rows.
    #[inline]
    pub(crate) fn dot_mxfp4_r8_x4(w: &[BlockMxfp4x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        mxfp4_r8_n!(4, w, xs, biased_rows_isums::<12>)
    }
);

isa_features!(
    /// Four groups' u8 × i8 products per lane, exact: a chain of four `vpdpbusd`.
    #[inline]
    fn dot16(u: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
        let mut s = _mm256_setzero_si256();
        let _ = unroll!(4, |g| s = _mm256_dpbusd_epi32(s, u[g], x[g]));
        s
    }

    /// The exact i32 Σ q·q_x per lane over a Q4_K sub-block (eight groups,
    /// two `dot16`).
    #[inline]
    fn q4k_isum(q: &[__m256i; 8], x: &BlockQ8Act) -> __m256i {
        let a = dot16([q[0], q[1], q[2], q[3]], unroll!(4, |g| bcast4(x, g)));
        let b = dot16([q[4], q[5], q[6], q[7]], unroll!(4, |g| bcast4(x, 4 + g)));
        _mm256_add_epi32(a, b)
    }

    /// S = sc·Σ q·q_x per lane over a Q4_K sub-block (`sc` as f32 lanes):
    /// the exact i32 sum (`q4k_isum`) times the scale in f32, exact
    /// (avx2/kquant_rows8.rs's module doc).
    #[inline]
    fn q4k_scaled_sum(q: &[__m256i; 8], x: &BlockQ8Act, sc: &__m256) -> __m256 {
        _mm256_mul_ps(*sc, _mm256_cvtepi32_ps(q4k_isum(q, x)))
    }

    /// `q4k_scaled_sum` for codes given as 16·q (`high_nibbles_x16`): the
    /// exact i32 sum is 16·Σ q·q_x (at most 16·32·15·128 < 2^20), so an
    /// arithmetic shift right by 4 gives Σ q·q_x exactly.
    #[inline]
    fn q4k_scaled_sum_x16(q: &[__m256i; 8], x: &BlockQ8Act, sc: &__m256) -> __m256 {
        _mm256_mul_ps(*sc, _mm256_cvtepi32_ps(_mm256_srai_epi32::<4>(q4k_isum(q, x))))
    }

    /// A Q4_K load's high nibbles in place, as 16·q (one AND instead of a
    /// shift and an AND; `q4k_scaled_sum_x16` takes the 16 off the sum).
    #[inline]
    fn high_nibbles_x16(v: __m256i) -> __m256i {
        _mm256_and_si256(v, _mm256_set1_epi8(0xf0u8 as i8))
    }

    /// The 6-bit codes of sub-blocks 2c and 2c + 1 of an interleaved Q6_K
    /// super-block (as avx2/kquant_rows8.rs's `q6k_codes_r8`, same bytes):
    /// each `qh` load masked by 0x33 once keeps fields 0 and 2 at bits 0..1
    /// and 4..5, shifted right by 2 first fields 1 and 3, with zeros in bits
    /// 2..3 and 6..7; fields 0 and 1 move to bits 4..5 by a 16-bit left
    /// shift of 4 (what crosses into the next byte lands in its bits 0..1).
    /// One `vpternlogd` then takes bits 0..3 from the nibble source and
    /// bits 4..7 from the high-bit source.
    #[inline]
    fn q6k_codes_r8(ql: &[u8], qh: &[u8]) -> [[__m256i; 8]; 2] {
        let (m4, m33) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x33));
        let h = unroll!(4, |i| {
            let x = ld_rows(qh, i);
            [_mm256_and_si256(x, m33), _mm256_and_si256(_mm256_srli_epi16::<2>(x), m33)]
        });
        let high = |i: usize, f: usize| match f {
            0 => _mm256_slli_epi16::<4>(h[i][0]),
            1 => _mm256_slli_epi16::<4>(h[i][1]),
            2 => h[i][0],
            _ => h[i][1],
        };
        // m4 ? nibbles : high bits, bitwise (imm 0xE4: c ? a : b).
        let select = |nib: __m256i, hb: __m256i| _mm256_ternarylogic_epi32::<0xE4>(nib, hb, m4);
        let v = unroll!(8, |g| ld_rows(ql, g));
        let lo = unroll!(8, |g| select(v[g], high(g / 4, g % 4)));
        let hi = unroll!(8, |g| select(_mm256_srli_epi16::<4>(v[g]), high(2 + g / 4, g % 4)));
        [lo, hi]
    }

    /// Eight interleaved Q4_K rows · one activation row: row k's result is
    /// `dot_q4k` of row k, bit for bit (avx2/kquant_rows8.rs).
    #[inline]
    pub(crate) fn dot_q4k_r8(w: &[BlockQ4Kx8], x: ActRef) -> [f32; 8] {
        kmin_rows8_n!(
            1,
            w,
            [x],
            |v| lanes_u8_ps(v),
            |blk: &BlockQ4Kx8, c: usize| q4k_codes_r8!(blk, c, high_nibbles_x16),
            |q, x, sc| q4k_scaled_sum(q, x, sc),
            |q, x, sc| q4k_scaled_sum_x16(q, x, sc)
        )[0]
    }

    /// Eight interleaved Q4_K rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q4k_r8_x3(w: &[BlockQ4Kx8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        kmin_rows8_n!(
            3,
            w,
            xs,
            |v| lanes_u8_ps(v),
            |blk: &BlockQ4Kx8, c: usize| q4k_codes_r8!(blk, c, high_nibbles_x16),
            |q, x, sc| q4k_scaled_sum(q, x, sc),
            |q, x, sc| q4k_scaled_sum_x16(q, x, sc)
        )
    }

    /// Eight interleaved Q5_K rows · one activation row: row k's result is
    /// `dot_q5k` of row k, bit for bit (`q5k_rows8_vnni!`).
    #[inline]
    pub(crate) fn dot_q5k_r8(w: &[BlockQ5Kx8], x: ActRef) -> [f32; 8] {
        q5k_rows8_vnni!(1, w, [x])[0]
    }

    /// Eight interleaved Q5_K rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q5k_r8_x2(w: &[BlockQ5Kx8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        q5k_rows8_vnni!(2, w, xs)
    }

    /// Eight interleaved Q5_K rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q5k_r8_x3(w: &[BlockQ5Kx8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        q5k_rows8_vnni!(3, w, xs)
    }

    /// Eight interleaved Q5_K rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q5k_r8_x4(w: &[BlockQ5Kx8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        q5k_rows8_vnni!(4, w, xs)
    }

    /// Eight interleaved Q6_K rows · one activation row (as `dot_q4k_r8`).
    #[inline]
    pub(crate) fn dot_q6k_r8(w: &[BlockQ6Kx8], x: ActRef) -> [f32; 8] {
        q6k_rows8_n!(1, w, [x], |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))[0]
    }

    /// Eight interleaved Q6_K rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q6k_r8_x2(w: &[BlockQ6Kx8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        q6k_rows8_n!(2, w, xs, |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))
    }

    /// Eight interleaved Q6_K rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q6k_r8_x3(w: &[BlockQ6Kx8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        q6k_rows8_n!(3, w, xs, |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))
    }

    /// Eight interleaved Q6_K rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q6k_r8_x4(w: &[BlockQ6Kx8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        q6k_rows8_n!(4, w, xs, |u, x| dot16(u, x), |l, h| q6k_codes_r8(l, h))
    }
);

isa_features!(
    /// The int8 peak (`Kernels::int8_peak`): `vpdpbusd` on zmm registers
    /// (64 u8 × i8 products each) in twelve independent chains, enough for
    /// its latency on two ports (`peak_asm!`).
    pub(crate) fn int8_peak(rounds: usize) -> (u64, i32) {
        let (u, s) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
        let mut a = [_mm512_setzero_si512(); 12];
        let n = rounds.max(1);
        peak_asm!(
            n,
            zmm_reg,
            (u, s, u),
            a[a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6, a7 = 7, a8 = 8, a9 = 9, a10 = 10, a11 = 11],
            ".irp acc, {a0}, {a1}, {a2}, {a3}, {a4}, {a5}, {a6}, {a7}, {a8}, {a9}, {a10}, {a11}",
            [
            "vpdpbusd \\acc, {u}, {s}"
            ]
        );
        let v = a[1..].iter().fold(a[0], |v, x| _mm512_add_epi32(v, *x));
        ((n * 12 * 64) as u64, _mm512_reduce_add_epi32(v))
    }
);
