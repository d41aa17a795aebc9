//! SSSE3 + SSE4.1 kernels: int8 dots with `pmaddubsw` (u8 × i8 pairs to i16)
//! then `pmaddwd` by ones; for Q8 the sign trick |w| × sign(x, w). The f32
//! kernels are SSE2's (nothing in SSE4.1 speeds them up). The K-quant dots
//! run SSE2's algorithm (`sse2/kquant.rs`'s `kquant_dot!`) with a
//! `pmaddubsw` sub-block dot on the unsigned codes.

use core::arch::x86_64::*;

use super::sse2::float as sse2_float;
use super::sse2::int8 as sse2_int8;
use super::sse2::int8::{bcast4, halves, ld_rows, mxfp4_dot, q4_dot, q8_dot, rows8_sse};
use super::sse2::kquant::kquant_dot;
use super::sse2::ld16;
use crate::kernels::Kernels;
use crate::quant::{
    ActRef, BlockMxfp4, BlockQ4K, BlockQ4_0x8, BlockQ5K, BlockQ6K, BlockQ8Act, BlockQ8_0x8, Q4Block, Q8Block,
    MXFP4_VALUES, QK,
};

/// The SSSE3 + SSE4.1 kernel set.
pub struct Sse41;

impl Kernels for Sse41 {
    const ROWS8: bool = true;
    const Q8_X8_BIAS: u8 = sse2_int8::Q8_X8_BIAS;
    const INT8_PEAK: &'static str = "pmaddubsw + pmaddwd xmm";
    entry_points!(sse2_float: f32_ops, kv_rows);
    entry_points!(self: int8_dots, int8_dots_x4, mxfp4_dots, dot_q4_r8, dot_q8_r8_x4, dot_q4_r8_x4);
    entry_points!(self: kquant_dots, kquant_dots_x4, int8_peak);
    // Eight interleaved Q8 rows, one token: SSE2's even/odd `pmaddwd` kernel
    // measured faster here (SmolLM2 tg128 99 against 80 tokens/s) than |w| ×
    // sign(q, w) through `pmaddubsw`, which needs a `pmaddwd` per group anyway;
    // for four tokens, where |w| is made once for the four, the reverse.
    entry_points!(sse2_int8: dot_q8_r8);
}

isa_features!(
    /// Σ of 16 u8 × i8 products in four i32 lanes. Exact while each pair sum
    /// fits i16: |u| ≤ 128 with |s| ≤ 127, or u ≤ 15.
    #[inline]
    fn maddubs(u: __m128i, s: __m128i) -> __m128i {
        _mm_madd_epi16(_mm_maddubs_epi16(u, s), _mm_set1_epi16(1))
    }

    /// Σ of a Q8 block's 32 products in four i32 lanes (exact): |w| × sign(x, w).
    /// Activation quants are in [-127, 127] (`quantize_act`), so sign(x, w)
    /// never overflows and |w| ≤ 128 is exact.
    #[inline]
    fn block_dot(w: (__m128i, __m128i), x: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(x);
        let s0 = maddubs(_mm_abs_epi8(w.0), _mm_sign_epi8(x0, w.0));
        _mm_add_epi32(s0, maddubs(_mm_abs_epi8(w.1), _mm_sign_epi8(x1, w.1)))
    }

    /// Σ nibble·q of a Q4 block in four i32 lanes (exact).
    #[inline]
    fn nib_dot(lo: __m128i, hi: __m128i, x: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(x);
        // pair sums ≤ 2·15·127, twice: the i16 add is exact
        let s = _mm_add_epi16(_mm_maddubs_epi16(lo, x0), _mm_maddubs_epi16(hi, x1));
        _mm_madd_epi16(s, _mm_set1_epi16(1))
    }

    /// Q8 weights · Q8 activations, eight blocks per step in `portable`'s
    /// lane order (sse2.rs's `q8_dot!`).
    #[inline]
    pub(crate) fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q8_dot!(1, w, x, |w, x| block_dot(w, x))
    }

    /// An MXFP4 block's 32 values (`quant::MXFP4_VALUES`) as int8, elements
    /// 0..16 and 16..32: the nibbles looked up with `pshufb`.
    #[inline]
    fn mxfp4_halves(b: &BlockMxfp4) -> (__m128i, __m128i) {
        let (table, n, low4) = (ld16(&MXFP4_VALUES), ld16(&b.qs), _mm_set1_epi8(0x0f));
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(n, low4));
        (lo, _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(n), low4)))
    }

    /// MXFP4 weights · Q8 activations: the values looked up into int8
    /// (`mxfp4_halves`), then as `dot_q8`.
    #[inline]
    pub(crate) fn dot_mxfp4(w: &[BlockMxfp4], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        mxfp4_dot!(1, w, x, |b| mxfp4_halves(b), |w, x| block_dot(w, x))
    }

    /// `dot_mxfp4` of one weight row with four activation rows (each result
    /// bit-identical to `dot_mxfp4`'s).
    #[inline]
    pub(crate) fn dot_mxfp4_x4(w: &[BlockMxfp4], xs: [ActRef; 4]) -> [f32; 4] {
        mxfp4_dot!(4, w, xs, |b| mxfp4_halves(b), |w, x| block_dot(w, x))
    }

    /// Q4 weights · Q8 activations: Σ nibble·q − 8·Σq per block (exact).
    #[inline]
    pub(crate) fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q4_dot!(1, w, x, |lo, hi, x| nib_dot(lo, hi, x))
    }

    /// `dot_q8` of one weight row with four activation rows (each result bit-identical to `dot_q8`'s).
    #[inline]
    pub(crate) fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q8_dot!(4, w, xs, |w, x| block_dot(w, x))
    }

    /// `dot_q4` of one weight row with four activation rows (each result bit-identical to `dot_q4`'s).
    #[inline]
    pub(crate) fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q4_dot!(4, w, xs, |lo, hi, x| nib_dot(lo, hi, x))
    }

    /// Eight rows' exact Σ w·q for one interleaved Q8 block (bias 0), lanes =
    /// rows: |w| × sign(q, w) (`maddubs`, pair sums ≤ 2·128·127) per group.
    #[inline]
    fn q8_rows_isums(w: &[[(__m128i, __m128i); 2]; 8], x: &BlockQ8Act) -> [__m128i; 2] {
        let mut s = [_mm_setzero_si128(); 2];
        let _ = unroll!(8, |g| {
            let b = bcast4(x, g);
            let _ = unroll!(2, |h| {
                let (u, v) = w[g][h];
                s[h] = _mm_add_epi32(s[h], maddubs(u, _mm_sign_epi8(b, v)));
            });
        });
        s
    }

    /// Eight interleaved Q8 rows · four activation rows: row k's result for
    /// token t is `dot_q8` of row k, bit for bit (sse2.rs's `rows8_sse!`),
    /// |w| made once per block for the four tokens.
    #[inline]
    pub(crate) fn dot_q8_r8_x4(w: &[BlockQ8_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_sse!(4, w, xs, |blk, xb| {
            let wv = unroll!(8, |g| unroll!(2, |h| {
                let v = ld_rows(&blk.qs, 2 * g + h);
                (_mm_abs_epi8(v), v)
            }));
            q8_rows_isums(&wv, xb)
        })
    }

    /// Eight rows' exact Σ nibble·q − 8·Σq for one interleaved Q4 block:
    /// nibbles × activations by `maddubs`, pair sums (≤ 2·15·127) added in
    /// i16, eight per lane (≤ 30480, no overflow), widened once.
    #[inline]
    fn q4_rows_isums(blk: &BlockQ4_0x8, x: &BlockQ8Act) -> [__m128i; 2] {
        let mut s = [_mm_setzero_si128(); 2];
        let m = _mm_set1_epi8(0x0f);
        let _ = unroll!(4, |g| {
            let (lo, hi) = (bcast4(x, g), bcast4(x, 4 + g));
            let _ = unroll!(2, |h| {
                let v = ld_rows(&blk.qs, 2 * g + h);
                let p = _mm_add_epi16(
                    _mm_maddubs_epi16(_mm_and_si128(v, m), lo),
                    _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16::<4>(v), m), hi),
                );
                s[h] = _mm_add_epi16(s[h], p);
            });
        });
        let (ones, o) = (_mm_set1_epi16(1), _mm_set1_epi32(8 * x.sum));
        [_mm_sub_epi32(_mm_madd_epi16(s[0], ones), o), _mm_sub_epi32(_mm_madd_epi16(s[1], ones), o)]
    }

    /// Eight interleaved Q4 rows · one activation row: row k's result is
    /// `dot_q4` of row k, bit for bit (sse2.rs's `rows8_sse!`).
    #[inline]
    pub(crate) fn dot_q4_r8(w: &[BlockQ4_0x8], x: ActRef) -> [f32; 8] {
        rows8_sse!(1, w, [x], |blk, xb| q4_rows_isums(blk, xb))[0]
    }

    /// Eight interleaved Q4 rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q4_r8_x4(w: &[BlockQ4_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_sse!(4, w, xs, |blk, xb| q4_rows_isums(blk, xb))
    }

    /// A Q4_K / Q5_K sub-block's 32 codes (two vectors of bytes ≤ 31) · an
    /// activation block's quants, four i32 lanes (exact): each `pmaddubsw`
    /// pair sum is ≤ 2·31·128 = 7936 (no saturation), two of them added in
    /// i16 ≤ 15872 < 2^15, then widened by `pmaddwd` with ones.
    #[inline]
    fn kq_dot(c: &[__m128i; 2], q: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(q);
        let s = _mm_add_epi16(_mm_maddubs_epi16(c[0], x0), _mm_maddubs_epi16(c[1], x1));
        _mm_madd_epi16(s, _mm_set1_epi16(1))
    }

    /// A Q6_K sub-block (codes 0..64, bytes 0..16 with group scale `s0`,
    /// 16..32 with `s1`, both broadcast to i16) · an activation block's
    /// quants: Σ sc·(q − 32)·q_x in four i32 lanes (exact). Per 16 bytes
    /// `pmaddubsw`(q, q_x) − `pmaddubsw`(32, q_x): the pair sums are ≤
    /// 2·63·128 = 16128 and ≤ 2·32·128 = 8192 (no saturation), their
    /// difference Σ (q − 32)·q_x over the pair has |·| ≤ 2·32·128 = 8192
    /// (so the i16 subtraction is exact), then `pmaddwd` by the scale:
    /// pairs ≤ 2·8192·128 = 2^21, the sub-block's |S| ≤ 2^24 (see sse2/kquant.rs).
    #[inline]
    fn q6k_dot(w: &([__m128i; 2], __m128i, __m128i), q: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(q);
        let off = _mm_set1_epi8(32);
        let centred = |c, x| _mm_sub_epi16(_mm_maddubs_epi16(c, x), _mm_maddubs_epi16(off, x));
        let (c, s0, s1) = w;
        _mm_add_epi32(_mm_madd_epi16(centred(c[0], x0), *s0), _mm_madd_epi16(centred(c[1], x1), *s1))
    }

    /// Q4_K weights · Q8 activations, bit for bit `Portable::dot_q4k`
    /// (sse2/kquant.rs's `kquant_dot!`).
    #[inline]
    pub(crate) fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kquant_dot!(q4k, 1, w, [x], |_b, c, _j| c, |wv, qs| kq_dot(wv, qs))[0]
    }

    /// Q5_K weights · Q8 activations, bit for bit `Portable::dot_q5k`.
    #[inline]
    pub(crate) fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kquant_dot!(q5k, 1, w, [x], |_b, c, _j| c, |wv, qs| kq_dot(wv, qs))[0]
    }

    /// Q6_K weights · Q8 activations, bit for bit `Portable::dot_q6k`.
    #[inline]
    pub(crate) fn dot_q6k(w: &[BlockQ6K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kquant_dot!(q6k, 1, w, [x], |b, c, j| q6k_prep(b, c, j), |wv, qs| q6k_dot(wv, qs))[0]
    }

    /// A Q6_K sub-block j's codes with its two group scales broadcast to i16.
    #[inline]
    fn q6k_prep(b: &BlockQ6K, c: [__m128i; 2], j: usize) -> ([__m128i; 2], __m128i, __m128i) {
        (c, _mm_set1_epi16(b.scales[2 * j] as i16), _mm_set1_epi16(b.scales[2 * j + 1] as i16))
    }

    /// `dot_q4k` of one weight row with four activation rows, the weights
    /// unpacked once per super-block (each result bit-identical to `dot_q4k`'s).
    #[inline]
    pub(crate) fn dot_q4k_x4(w: &[BlockQ4K], xs: [ActRef; 4]) -> [f32; 4] {
        kquant_dot!(q4k, 4, w, xs, |_b, c, _j| c, |wv, qs| kq_dot(wv, qs))
    }

    /// As `dot_q4k_x4` for Q5_K.
    #[inline]
    pub(crate) fn dot_q5k_x4(w: &[BlockQ5K], xs: [ActRef; 4]) -> [f32; 4] {
        kquant_dot!(q5k, 4, w, xs, |_b, c, _j| c, |wv, qs| kq_dot(wv, qs))
    }

    /// As `dot_q4k_x4` for Q6_K.
    #[inline]
    pub(crate) fn dot_q6k_x4(w: &[BlockQ6K], xs: [ActRef; 4]) -> [f32; 4] {
        kquant_dot!(q6k, 4, w, xs, |b, c, j| q6k_prep(b, c, j), |wv, qs| q6k_dot(wv, qs))
    }
);

isa_features!(
    /// The int8 peak (`Kernels::int8_peak`): the kernels' `pmaddubsw` step
    /// (two `pmaddubsw`, `paddw`, `pmaddwd` by ones, `paddd`: 32 products)
    /// in independent chains (`peak_asm!`).
    pub(crate) fn int8_peak(rounds: usize) -> (u64, i32) {
        let (u, s, ones) = (_mm_set1_epi8(3), _mm_set1_epi8(-2), _mm_set1_epi16(1));
        let mut a = [_mm_setzero_si128(); 8];
        let n = rounds.max(1);
        peak_asm!(
            n,
            xmm_reg,
            (u, s, ones),
            a[a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6, a7 = 7],
            ".irp acc, {a0}, {a1}, {a2}, {a3}, {a4}, {a5}, {a6}, {a7}",
            [
            "movdqa {t0}, {u}",
            "pmaddubsw {t0}, {s}",
            "movdqa {t1}, {u}",
            "pmaddubsw {t1}, {s}",
            "paddw {t0}, {t1}",
            "pmaddwd {t0}, {ones}",
            "paddd \\acc, {t0}"
            ]
        );
        ((n * 8 * 32) as u64, sse2_int8::sum_lanes(a))
    }
);
