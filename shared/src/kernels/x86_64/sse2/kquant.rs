//! SSE2 K-quant dots: Q4_K, Q5_K and Q6_K super-blocks (256 weights, eight
//! sub-blocks of 32) against quantised activation blocks, one token or four;
//! the algorithm (`kquant_dot!`) is written once here and shared by the
//! SSE4.1 build, which brings its own `pmaddubsw` sub-block dot.
//!
//! Algorithm, per super-block s (activation blocks 8s..8s+8, sub-block j
//! against activation block 8s + j, which adds into lane j of an 8-lane f32
//! accumulator held in two vectors):
//!
//! 1. the weights' codes, sub-block by sub-block, as bytes (`q4k_codes`,
//!    `q5k_codes`, `q6k_codes`: 0..16, 0..32, 0..64), then prepared once for
//!    the ISA's sub-block dot (`$prep`: SSE2 widens them to i16 lanes,
//!    Q6_K's already minus 32 and times its group's scale); the four-token
//!    form prepares them once for the four tokens;
//! 2. per token, the eight sub-block dots (`$dot`: four i32 lanes of exact
//!    partial sums each) reduced to one exact i32 per sub-block (`reduce8`):
//!    Σ q·q_x for Q4_K / Q5_K, S = sc[2j]·Σ (q − 32)·q_x + sc[2j+1]·Σ … for
//!    Q6_K;
//! 3. Q4_K / Q5_K: S = sc[j]·Σ q·q_x and M = m[j]·sum_x (`mul32`, exact),
//!    lane j += (d·d_x)·S − (dmin·d_x)·M (`fold_mins`); Q6_K: lane j +=
//!    (d·d_x)·S (`fold_q6k`). Every product and the difference are rounded
//!    on their own, no FMA: `portable::k_min_term` and `dot_q6k` exactly;
//! 4. at the end `finish`: (lanes 0..4 + lanes 4..8) then `hsum`, which is
//!    `portable::combine8`.
//!
//! So each result is `Portable`'s bit for bit: the integer parts are exact
//! (so is their conversion to f32: |S|, |M| ≤ 2^24) and the float operations
//! are the same operations on the same operands in the same order. The
//! activation scales and sums come from the contiguous side arrays when the
//! `ActRef` has them, else from the blocks (the same values).
//!
//! Exactness of the SSE2 sub-block dots (`madd16`: `pmaddwd` on i16 weights
//! and sign-extended i16 activations, |q_x| ≤ 128): Q4_K / Q5_K codes ≤ 31,
//! a pair sum ≤ 2·31·128 = 7936; Q6_K's (q − 32)·sc has |·| ≤ 32·128 = 4096,
//! so it fits i16 and `pmullw` is exact, a pair sum ≤ 2·4096·128 = 2^20 and
//! a sub-block's |S| ≤ 32·4096·128 = 2^24 (exact in i32 and as f32; below
//! 2^24 for activations in [-127, 127]). No i32 lane overflows.

use core::arch::x86_64::*;

use super::{halves, hsum, ld};
use crate::kernels::portable::f16_bits_to_f32;
use crate::quant::{scales_mins_k4, ActRef, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8Act, QK};

/// The K-quant dot of one weight row (`$w`, K-quant super-blocks of kind
/// `$kind`: `q4k`, `q5k` or `q6k`) with `$n` activation rows (`$xs`, an
/// array of `ActRef`), as the module doc describes: `|b, c, j| prep`
/// prepares sub-block j's codes `c` (two vectors of 16 code bytes) of
/// super-block `b` once for all tokens, `|wv, qs| dot` is one prepared
/// sub-block (`&W`) · one activation block's quants (`&[i8; 32]`) as four
/// i32 lanes whose sum is exact (Q6_K: with the group scales in). Returns
/// `[f32; $n]`, each `Portable`'s result bit for bit. A macro, so that the
/// ISA's block dot is inlined into the kernel.
macro_rules! kquant_dot {
    ($kind:ident, $n:tt, $w:expr, $xs:expr, |$b:ident, $c:ident, $j:ident| $prep:expr,
     |$wv:ident, $qs:ident| $dot:expr $(,)?) => {{
        use $crate::kernels::x86_64::sse2::kquant as k;
        let w = $w;
        let xs: [$crate::quant::ActRef; $n] = $xs;
        // (plain loops and `unroll!`, not iterator adapters or `array::map`: a
        // closure handed to std code is not inlined into a target-feature function)
        let side = unroll!($n, |t| xs[t].has_side());
        let mut acc = [[_mm_setzero_ps(); 2]; $n];
        for (s, blk) in w.iter().enumerate() {
            let codes = $crate::kernels::x86_64::sse2::kquant::kquant_dot!(@codes $kind, blk);
            // the weights, prepared once for the $n tokens
            let wv = unroll!(8, |jj| {
                let $b = blk;
                let $c = codes[jj];
                let $j = jj;
                $prep
            });
            let scales = $crate::kernels::x86_64::sse2::kquant::kquant_dot!(@scales $kind, blk);
            // the tokens one after another in a loop, not `unroll!`ed: the
            // prepared weights are reloaded per token instead of spilled
            // (four tokens' Q4_K and Q5_K dots ~20% faster so, Q6_K's the same)
            #[allow(clippy::needless_range_loop)]
            for t in 0..$n {
                let x = xs[t];
                let xb: &[$crate::quant::BlockQ8Act; 8] = x.blocks()[8 * s..8 * s + 8].try_into().unwrap();
                let isums = $crate::kernels::x86_64::sse2::int8::reduce8(unroll!(8, |jj| {
                    let $wv = &wv[jj];
                    let $qs = &xb[jj].qs;
                    $dot
                }));
                let dx = k::act_d8(x, xb, side[t], 8 * s);
                acc[t] = $crate::kernels::x86_64::sse2::kquant::kquant_dot!(@fold $kind, acc[t], isums, scales, dx, x, xb, side[t], s);
            }
        }
        unroll!($n, |t| k::finish(acc[t]))
    }};
    (@codes q4k, $blk:expr) => { $crate::kernels::x86_64::sse2::kquant::q4k_codes($blk) };
    (@codes q5k, $blk:expr) => { $crate::kernels::x86_64::sse2::kquant::q5k_codes($blk) };
    (@codes q6k, $blk:expr) => { $crate::kernels::x86_64::sse2::kquant::q6k_codes($blk) };
    (@scales q6k, $blk:expr) => { $crate::kernels::portable::f16_bits_to_f32($blk.d.to_bits()) };
    (@scales $kind:ident, $blk:expr) => {
        $crate::kernels::x86_64::sse2::kquant::scales_mins($blk.d.to_bits(), $blk.dmin.to_bits(), &$blk.scales)
    };
    (@fold q6k, $acc:expr, $isums:expr, $scales:expr, $dx:expr, $x:expr, $xb:expr, $side:expr, $s:expr) => {
        $crate::kernels::x86_64::sse2::kquant::fold_q6k($acc, $isums, $scales, $dx)
    };
    (@fold $kind:ident, $acc:expr, $isums:expr, $scales:expr, $dx:expr, $x:expr, $xb:expr, $side:expr, $s:expr) => {{
        let sums = $crate::kernels::x86_64::sse2::kquant::act_sum8($x, $xb, $side, 8 * $s);
        $crate::kernels::x86_64::sse2::kquant::fold_mins($acc, $isums, $scales, sums, $dx)
    }};
}

#[allow(unused_imports)] // used by the SSE4.1 build
pub(crate) use kquant_dot;

/// d, dmin (broadcast) and the eight 6-bit scales and mins (i32 lanes 0..4,
/// 4..8) of a Q4_K / Q5_K super-block.
pub(crate) type ScalesMins = (__m128, __m128, [__m128i; 2], [__m128i; 2]);

isa_features!(
    /// The low nibbles (bytes 0..16 of each vector) and high nibbles of 32 bytes.
    #[inline]
    fn nibbles32(q: &[u8]) -> ([__m128i; 2], [__m128i; 2]) {
        let (a, b) = halves::<u8>(q.try_into().unwrap());
        let m = _mm_set1_epi8(0x0f);
        let lo = |v| _mm_and_si128(v, m);
        let hi = |v| _mm_and_si128(_mm_srli_epi16::<4>(v), m);
        ([lo(a), lo(b)], [hi(a), hi(b)])
    }

    /// A Q4_K super-block's codes (0..16), sub-block j's 32 as two vectors:
    /// the low (j even) or high (j odd) nibbles of `qs[32·⌊j/2⌋..][..32]`.
    #[inline]
    pub(crate) fn q4k_codes(b: &BlockQ4K) -> [[__m128i; 2]; 8] {
        let p = unroll!(4, |h| nibbles32(&b.qs[32 * h..32 * h + 32]));
        unroll!(8, |j| if j.is_multiple_of(2) { p[j / 2].0 } else { p[j / 2].1 })
    }

    /// A Q5_K super-block's codes (0..32): `q4k_codes`' nibbles with bit j
    /// of `qh[l]` as bit 4.
    #[inline]
    pub(crate) fn q5k_codes(b: &BlockQ5K) -> [[__m128i; 2]; 8] {
        let p = unroll!(4, |h| nibbles32(&b.qs[32 * h..32 * h + 32]));
        let qh = halves(&b.qh);
        let sixteen = _mm_set1_epi8(16);
        unroll!(8, |j| {
            let nib = if j.is_multiple_of(2) { p[j / 2].0 } else { p[j / 2].1 };
            let bit = _mm_set1_epi8((1u8 << j) as i8);
            // 16 where bit j is set: (qh & bit == bit) & 16
            let high = |v| _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, bit), bit), sixteen);
            [_mm_or_si128(nib[0], high(qh.0)), _mm_or_si128(nib[1], high(qh.1))]
        })
    }

    /// A Q6_K super-block's codes (0..64, the weight is d·scale·(code − 32)):
    /// sub-block j = 4h + r holds elements 32j..32j+32, the low (r < 2) or
    /// high nibbles of `ql[64h + 32·(r mod 2)..][..32]` with bits 2r, 2r+1 of
    /// `qh[32h..][..32]` as bits 4, 5 (`quant::q6k_code`).
    #[inline]
    pub(crate) fn q6k_codes(b: &BlockQ6K) -> [[__m128i; 2]; 8] {
        let m = _mm_set1_epi8(0x30);
        unroll!(8, |j| {
            let (h, r) = (j / 4, j % 4);
            let nib = nibbles32(&b.ql[64 * h + 32 * (r % 2)..64 * h + 32 * (r % 2) + 32]);
            let lo = if r < 2 { nib.0 } else { nib.1 };
            let qh = halves::<u8>(b.qh[32 * h..32 * h + 32].try_into().unwrap());
            // bits 2r, 2r+1 to bits 4, 5 of each byte: a 16-bit shift, then the
            // mask drops the bits that crossed from the neighbouring byte
            let hi = |v| {
                let v = match r {
                    0 => _mm_slli_epi16::<4>(v),
                    1 => _mm_slli_epi16::<2>(v),
                    2 => v,
                    _ => _mm_srli_epi16::<2>(v),
                };
                _mm_and_si128(v, m)
            };
            [_mm_or_si128(lo[0], hi(qh.0)), _mm_or_si128(lo[1], hi(qh.1))]
        })
    }

    /// d and dmin (exact from their f16 bits, broadcast) and the eight scales
    /// and mins as i32 lanes (`quant::scales_mins_k4`).
    #[inline]
    pub(crate) fn scales_mins(d: u16, dmin: u16, packed: &[u8; 12]) -> ScalesMins {
        let (sc, mn) = scales_mins_k4(packed);
        let v = |a: [u8; 8]| {
            let a = |j: usize| a[j] as i32;
            [_mm_setr_epi32(a(0), a(1), a(2), a(3)), _mm_setr_epi32(a(4), a(5), a(6), a(7))]
        };
        (_mm_set1_ps(f16_bits_to_f32(d)), _mm_set1_ps(f16_bits_to_f32(dmin)), v(sc), v(mn))
    }

    /// The scales d_x of activation blocks i..i+8 (`xb`): from the side
    /// array when `side`, else from the blocks.
    #[inline]
    pub(crate) fn act_d8(x: ActRef, xb: &[BlockQ8Act; 8], side: bool, i: usize) -> [__m128; 2] {
        if side {
            [ld(&x.d[i..i + 4]), ld(&x.d[i + 4..i + 8])]
        } else {
            let d = |j: usize| xb[j].d;
            [_mm_setr_ps(d(0), d(1), d(2), d(3)), _mm_setr_ps(d(4), d(5), d(6), d(7))]
        }
    }

    /// The sums Σ q_x of activation blocks i..i+8 (`xb`), as `act_d8`.
    #[inline]
    pub(crate) fn act_sum8(x: ActRef, xb: &[BlockQ8Act; 8], side: bool, i: usize) -> [__m128i; 2] {
        let s = |j: usize| if side { x.sum[i + j] } else { xb[j].sum };
        [_mm_setr_epi32(s(0), s(1), s(2), s(3)), _mm_setr_epi32(s(4), s(5), s(6), s(7))]
    }

    /// The low 32 bits of a·b per i32 lane (`pmulld`, which SSE2 lacks):
    /// `pmuludq` of lanes 0, 2 and of lanes 1, 3 (the low 32 bits of a
    /// product do not depend on the signedness), interleaved back. Exact
    /// whenever the product fits i32.
    #[cfg(not(target_feature = "sse4.1"))]
    #[inline]
    pub(crate) fn mul32(a: __m128i, b: __m128i) -> __m128i {
        let even = _mm_mul_epu32(a, b);
        let odd = _mm_mul_epu32(_mm_srli_epi64::<32>(a), _mm_srli_epi64::<32>(b));
        let low = |v| _mm_shuffle_epi32::<0b00_00_10_00>(v); // lanes 0, 2 to 0, 1
        _mm_unpacklo_epi32(low(even), low(odd))
    }

    /// The low 32 bits of a·b per i32 lane (`pmulld`).
    #[cfg(target_feature = "sse4.1")]
    #[inline]
    pub(crate) fn mul32(a: __m128i, b: __m128i) -> __m128i {
        _mm_mullo_epi32(a, b)
    }

    /// Q4_K / Q5_K: lane j += (d·d_x)·S − (dmin·d_x)·M with S = sc[j]·isum[j]
    /// and M = m[j]·sum[j] (exact: |isum| ≤ 32·31·128, sc, m ≤ 63, |sum| ≤
    /// 32·128, all below 2^24), each product rounded on its own
    /// (`portable::k_min_term`).
    #[inline]
    pub(crate) fn fold_mins(
        acc: [__m128; 2],
        isums: [__m128i; 2],
        (d, dmin, sc, mn): ScalesMins,
        sums: [__m128i; 2],
        dx: [__m128; 2],
    ) -> [__m128; 2] {
        unroll!(2, |h| {
            let s = _mm_cvtepi32_ps(mul32(isums[h], sc[h]));
            let m = _mm_cvtepi32_ps(mul32(sums[h], mn[h]));
            let term = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d, dx[h]), s), _mm_mul_ps(_mm_mul_ps(dmin, dx[h]), m));
            _mm_add_ps(acc[h], term)
        })
    }

    /// Q6_K: lane j += (d·d_x)·S (S exact and below 2^24, `portable`'s `dot_q6k`).
    #[inline]
    pub(crate) fn fold_q6k(acc: [__m128; 2], isums: [__m128i; 2], d: f32, dx: [__m128; 2]) -> [__m128; 2] {
        let d = _mm_set1_ps(d);
        unroll!(2, |h| _mm_add_ps(acc[h], _mm_mul_ps(_mm_mul_ps(d, dx[h]), _mm_cvtepi32_ps(isums[h]))))
    }

    /// The eight lanes combined as `portable::combine8`: lane j + 4 added to
    /// lane j, then `hsum`'s (v0 + v1) + (v2 + v3).
    #[inline]
    pub(crate) fn finish(acc: [__m128; 2]) -> f32 {
        hsum(_mm_add_ps(acc[0], acc[1]))
    }

    /// Even and odd bytes of `v` sign-extended to i16 lanes.
    #[inline]
    fn widen_i8(v: __m128i) -> [__m128i; 2] {
        [_mm_srai_epi16::<8>(_mm_slli_epi16::<8>(v)), _mm_srai_epi16::<8>(v)]
    }

    /// Even and odd bytes of `v` zero-extended to i16 lanes.
    #[inline]
    fn widen_u8(v: __m128i) -> [__m128i; 2] {
        [_mm_and_si128(v, _mm_set1_epi16(0x00ff)), _mm_srli_epi16::<8>(v)]
    }

    /// SSE2's prepared Q4_K / Q5_K sub-block: the 32 codes (< 128) as i16,
    /// [even, odd] of bytes 0..16, then of bytes 16..32.
    #[inline]
    fn prep_codes(c: [__m128i; 2]) -> [__m128i; 4] {
        let ([a, b], [e, f]) = (widen_u8(c[0]), widen_u8(c[1]));
        [a, b, e, f]
    }

    /// SSE2's prepared Q6_K sub-block: (code − 32)·scale as i16 (|·| ≤
    /// 32·128, so `pmullw` is exact), bytes 0..16 with the group scale `sc0`,
    /// bytes 16..32 with `sc1`, laid out as `prep_codes`.
    #[inline]
    fn prep_q6k(c: [__m128i; 2], sc0: i8, sc1: i8) -> [__m128i; 4] {
        let (off, s0, s1) = (_mm_set1_epi16(32), _mm_set1_epi16(sc0 as i16), _mm_set1_epi16(sc1 as i16));
        let m = |v, s| _mm_mullo_epi16(_mm_sub_epi16(v, off), s);
        let w = prep_codes(c);
        [m(w[0], s0), m(w[1], s0), m(w[2], s1), m(w[3], s1)]
    }

    /// A prepared sub-block (i16 weights, `prep_codes` / `prep_q6k`) · an
    /// activation block's quants: `pmaddwd` with the sign-extended even and
    /// odd quants, four i32 lanes (exact, see the module doc).
    #[inline]
    fn madd16(w: &[__m128i; 4], q: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(q);
        let ([e0, o0], [e1, o1]) = (widen_i8(x0), widen_i8(x1));
        let lo = _mm_add_epi32(_mm_madd_epi16(w[0], e0), _mm_madd_epi16(w[1], o0));
        let hi = _mm_add_epi32(_mm_madd_epi16(w[2], e1), _mm_madd_epi16(w[3], o1));
        _mm_add_epi32(lo, hi)
    }

    /// Q4_K weights · Q8 activations, bit for bit `Portable::dot_q4k`.
    #[inline]
    pub(crate) fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kquant_dot!(q4k, 1, w, [x], |_b, c, _j| prep_codes(c), |wv, qs| madd16(wv, qs))[0]
    }

    /// Q5_K weights · Q8 activations, bit for bit `Portable::dot_q5k`.
    #[inline]
    pub(crate) fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kquant_dot!(q5k, 1, w, [x], |_b, c, _j| prep_codes(c), |wv, qs| madd16(wv, qs))[0]
    }

    /// Q6_K weights · Q8 activations, bit for bit `Portable::dot_q6k`.
    #[inline]
    pub(crate) fn dot_q6k(w: &[BlockQ6K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kquant_dot!(q6k, 1, w, [x], |b, c, j| prep_q6k(c, b.scales[2 * j], b.scales[2 * j + 1]), |wv, qs| {
            madd16(wv, qs)
        })[0]
    }

    /// `dot_q4k` of one weight row with four activation rows, the weights
    /// unpacked once per super-block (each result bit-identical to `dot_q4k`'s).
    #[inline]
    pub(crate) fn dot_q4k_x4(w: &[BlockQ4K], xs: [ActRef; 4]) -> [f32; 4] {
        kquant_dot!(q4k, 4, w, xs, |_b, c, _j| prep_codes(c), |wv, qs| madd16(wv, qs))
    }

    /// As `dot_q4k_x4` for Q5_K.
    #[inline]
    pub(crate) fn dot_q5k_x4(w: &[BlockQ5K], xs: [ActRef; 4]) -> [f32; 4] {
        kquant_dot!(q5k, 4, w, xs, |_b, c, _j| prep_codes(c), |wv, qs| madd16(wv, qs))
    }

    /// As `dot_q4k_x4` for Q6_K.
    #[inline]
    pub(crate) fn dot_q6k_x4(w: &[BlockQ6K], xs: [ActRef; 4]) -> [f32; 4] {
        kquant_dot!(q6k, 4, w, xs, |b, c, j| prep_q6k(c, b.scales[2 * j], b.scales[2 * j + 1]), |wv, qs| {
            madd16(wv, qs)
        })
    }
);
