//! SSE2 int8 kernels: Q8 and Q4 weights against quantised activations,
//! one row (one token or four) and eight interleaved rows, with `pmaddwd`
//! on sign-extended even and odd bytes. The SSE4.1 build reuses the block
//! folding here (`sum_blocks8!`, `q8_dot!`, `q4_dot!`, `rows8_sse!`).

use core::arch::x86_64::*;

use half::f16;

pub(crate) use super::{cvt_f16x4, halves, hsum, ld16, st};
use crate::quant::{ActRef, BlockMxfp4, BlockQ4_0x8, BlockQ8Act, BlockQ8_0x8, Q4Block, Q8Block, QK};

/// Σ_i (d_w·d_x)·isum_i in `portable`'s order: block i into lane i % 8 of
/// two 4-lane accumulators (multiply then add), combined as
/// `portable::combine8`. Eight blocks per step: `|i| isums` gives blocks
/// i..i+8's exact Σ q_w·q_x as i32 lanes 0..4 and 4..8, `$q4` adds
/// Q4's −8·Σq, `|j| bits` is weight block i + j's scale bits (f16 when
/// `$f16`). The last n % 8 blocks (all of them for an `ActRef` without
/// contiguous scales and sums) go one by one into their lanes with the same
/// scalar operations: `|b| (isum, scale)` gives block b's exact integer sum
/// (offset included) and its weight scale. A macro, so that all of it is
/// inlined into the kernel.
macro_rules! sum_blocks8 {
    ($x:expr, $q4:expr, $f16:expr, |$i:ident| $isums:expr, |$j:ident| $bits:expr,
     |$b:ident| $one:expr $(,)?) => {{
        use $crate::kernels::x86_64::sse2::int8 as a;
        let x: $crate::quant::ActRef = $x;
        let n = x.len();
        let mut acc = [_mm_setzero_ps(), _mm_setzero_ps()];
        let mut $i = 0usize;
        // Without contiguous scales and sums (`ActRef` from plain blocks) every block takes the one-by-one path.
        let side = x.has_side();
        while side && $i + 8 <= n {
            let s: [__m128i; 2] = $isums;
            let s = if $q4 {
                let o = a::q4_offsets(x, $i);
                [_mm_add_epi32(s[0], o[0]), _mm_add_epi32(s[1], o[1])]
            } else {
                s
            };
            let dw = a::scales8(
                $f16,
                #[inline(always)]
                |$j: usize| $bits,
            );
            acc = a::fold8(acc, s, dw, x, $i);
            $i += 8;
        }
        if side {
            // the last n % 8 blocks into lanes 0..n % 8, in registers (+0 into the others)
            let tail = unroll!(8, |j| if $i + j < n {
                let $b = $i + j;
                let (isum, scale): (i32, f32) = $one;
                (scale * x.blocks()[$b].d) * isum as f32
            } else {
                0.0
            });
            return a::hsum(a::add_tail(acc, tail));
        }
        let mut lanes = a::lanes(acc);
        for $b in $i..n {
            let (isum, scale): (i32, f32) = $one;
            lanes[$b % 8] += (scale * x.blocks()[$b].d) * isum as f32;
        }
        $crate::kernels::portable::combine8(lanes)
    }};
}

#[allow(unused_imports)]
pub(crate) use sum_blocks8;

/// `sum_blocks8!` for one weight row and four activation rows (four tokens
/// of a prompt). Each step of eight blocks is two halves of four: per half
/// the weight side (`|i, h| wv`: blocks i + 4h..i + 4h + 4, loaded and
/// unpacked once) is used by the four tokens (`|wv, x| isums4`: the four
/// blocks' exact sums as i32 lanes), and the scales are made once per step;
/// each token's lanes then take exactly `sum_blocks8!`'s operations, so
/// result t equals the single-token dot of `xs[t]` bit for bit. Four blocks
/// at a time keep the weights in registers (SSE has sixteen). The last
/// n % 8 blocks, and rows without contiguous scales and sums, go one by one
/// as in `sum_blocks8!`.
macro_rules! sum_blocks8_x4 {
    ($xs:expr, $q4:expr, $f16:expr, |$i:ident, $h:ident| $wprep:expr, |$wv:ident, $x:ident| $isums4:expr,
     |$j:ident| $bits:expr, |$b:ident, $xb:ident| $one:expr $(,)?) => {{
        use $crate::kernels::x86_64::sse2::int8 as a;
        let xs: [$crate::quant::ActRef; 4] = $xs;
        let n = xs[0].len();
        let mut acc = [[_mm_setzero_ps(); 2]; 4];
        let mut $i = 0usize;
        // (plain loops and `unroll!`, not iterator adapters or `array::map`: a
        // closure handed to std code is not inlined into a target-feature function)
        let mut side = true;
        for x in &xs {
            side &= x.has_side() && x.len() == n;
        }
        while side && $i + 8 <= n {
            let halves = unroll!(2, |hh| {
                let $h = hh;
                let $wv = $wprep;
                unroll!(4, |t| {
                    let $x = xs[t];
                    let s: __m128i = $isums4;
                    s
                })
            });
            let dw = a::scales8(
                $f16,
                #[inline(always)]
                |$j: usize| $bits,
            );
            acc = unroll!(4, |t| {
                let s = [halves[0][t], halves[1][t]];
                let s = if $q4 {
                    let o = a::q4_offsets(xs[t], $i);
                    [_mm_add_epi32(s[0], o[0]), _mm_add_epi32(s[1], o[1])]
                } else {
                    s
                };
                a::fold8(acc[t], s, dw, xs[t], $i)
            });
            $i += 8;
        }
        unroll!(4, |t| {
            let $xb = xs[t];
            if side {
                // the last n % 8 blocks into lanes 0..n % 8, in registers (+0 into the others)
                let tail = unroll!(8, |j| if $i + j < n {
                    let $b = $i + j;
                    let (isum, scale): (i32, f32) = $one;
                    (scale * $xb.blocks()[$b].d) * isum as f32
                } else {
                    0.0
                });
                a::hsum(a::add_tail(acc[t], tail))
            } else {
                let mut lanes = a::lanes(acc[t]);
                for $b in $i..$xb.len() {
                    let (isum, scale): (i32, f32) = $one;
                    lanes[$b % 8] += (scale * $xb.blocks()[$b].d) * isum as f32;
                }
                $crate::kernels::portable::combine8(lanes)
            }
        })
    }};
}

#[allow(unused_imports)]
pub(crate) use sum_blocks8_x4;

/// Σ_b (d_w·d_x)·isum_b for the eight interleaved rows of
/// `quant::BlockQ8_0x8` / `BlockQ4_0x8` blocks (rows 0..4 and 4..8 in two
/// vectors of lanes) and N activation rows, in `portable`'s order: block b
/// into accumulator b % 8 (multiply then add), the eight combined as
/// `portable::combine8`, so row k's result equals the single-row dot of row
/// k bit for bit. `|blk, xb| isums` gives one block's exact sums for the
/// eight rows (Q4's −8·Σq included). As avx2.rs's `rows8_n!`, at SSE width;
/// shared by the SSE4.1 build.
macro_rules! rows8_sse {
    (@step $n:tt, $acc:ident, $w:ident, $xs:ident, $i:ident, $r:ident, |$blk:ident, $xb:ident| $isums:expr) => {{
        use $crate::kernels::x86_64::sse2::int8 as a;
        let _ = unroll!(8, |l| if l < $r {
            let $blk = &$w[$i + l];
            let dw = a::scales_rows(&$blk.d);
            let _ = unroll!($n, |t| {
                let $xb = &$xs[t].blocks()[$i + l];
                let s: [__m128i; 2] = $isums;
                $acc[t][l] = a::fold_rows($acc[t][l], s, dw, $xb.d);
            });
        });
    }};
    ($n:tt, $w:expr, $xs:expr, |$blk:ident, $xb:ident| $isums:expr $(,)?) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::sse2::int8 as a;
        let w = $w;
        let xs: [$crate::quant::ActRef; $n] = $xs;
        let nb = w.len();
        let mut same_len = true;
        for x in &xs {
            same_len &= x.len() == nb;
        }
        assert!(same_len, "eight-row dot: {nb} weight blocks per row, activations differ");
        let mut acc = [[[_mm_setzero_ps(); 2]; 8]; $n];
        let mut i = 0usize;
        while i + 8 <= nb {
            let r = 8usize; // a constant: the block choices compile away
            $crate::kernels::x86_64::sse2::int8::rows8_sse!(@step $n, acc, w, xs, i, r, |$blk, $xb| $isums);
            i += 8;
        }
        let r = nb - i;
        $crate::kernels::x86_64::sse2::int8::rows8_sse!(@step $n, acc, w, xs, i, r, |$blk, $xb| $isums);
        unroll!($n, |t| a::combine_rows(acc[t]))
    }};
}

#[allow(unused_imports)]
pub(crate) use rows8_sse;

isa_features!(
    /// The eight lanes of two vectors.
    #[inline]
    pub(crate) fn lanes(v: [__m128; 2]) -> [f32; 8] {
        let mut a = [0.0f32; 8];
        st(&mut a[..4], v[0]);
        st(&mut a[4..], v[1]);
        a
    }

    /// The two lane accumulators plus the last blocks' terms (lanes 0..4 and
    /// 4..8), summed as `portable::combine8` sums its lanes: lane j + 4 is
    /// added to lane j first. A lane without a term gets +0, which changes
    /// nothing (a lane sum that starts at +0 is never −0).
    #[inline]
    pub(crate) fn add_tail(acc: [__m128; 2], t: [f32; 8]) -> __m128 {
        let lo = _mm_add_ps(acc[0], _mm_setr_ps(t[0], t[1], t[2], t[3]));
        let hi = _mm_add_ps(acc[1], _mm_setr_ps(t[4], t[5], t[6], t[7]));
        _mm_add_ps(lo, hi)
    }

    /// Sum of four i32 lanes (exact).
    #[inline]
    pub(crate) fn hsum_i32(v: __m128i) -> i32 {
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v)))
    }

    /// The even bytes of `v` sign-extended to i16 lanes (shifts, no shuffles).
    #[inline]
    fn even_i8(v: __m128i) -> __m128i {
        _mm_srai_epi16::<8>(_mm_slli_epi16::<8>(v))
    }

    /// Σ of 16 i8 × i8 products in four i32 lanes (exact): the even bytes
    /// and the odd bytes (`srai` by 8 sign-extends them in place) multiplied
    /// and pair-summed separately with `pmaddwd`.
    #[inline]
    fn madd_i8(a: __m128i, b: __m128i) -> __m128i {
        let odd = |v| _mm_srai_epi16::<8>(v);
        _mm_add_epi32(_mm_madd_epi16(even_i8(a), even_i8(b)), _mm_madd_epi16(odd(a), odd(b)))
    }

    /// Σ of 16 u8 (< 128) × i8 products in four i32 lanes (exact), as `madd_i8`
    /// with the unsigned bytes zero-extended.
    #[inline]
    fn madd_u8i8(a: __m128i, b: __m128i) -> __m128i {
        let even_a = _mm_and_si128(a, _mm_set1_epi16(0x00ff));
        let odd_a = _mm_srli_epi16::<8>(a);
        _mm_add_epi32(_mm_madd_epi16(even_a, even_i8(b)), _mm_madd_epi16(odd_a, _mm_srai_epi16::<8>(b)))
    }

    /// `v[i..i + 8]` (f32 or i32) as two vectors.
    #[inline]
    fn ld8<T: Copy>(v: &[T], i: usize) -> [__m128i; 2] {
        assert_eq!(core::mem::size_of::<T>(), 4);
        let c: &[T; 8] = v[i..i + 8].try_into().unwrap();
        // SAFETY: `c` points to 8 readable 4-byte values (asserted); loadu needs no alignment.
        let l = |o: usize| unsafe { _mm_loadu_si128(c[o..].as_ptr() as *const __m128i) };
        [l(0), l(4)]
    }

    /// Eight weight scales as two f32 vectors (lanes 0..4, 4..8) from their
    /// bits (f16 when `f16`, converted exactly; else f32).
    #[inline]
    pub(crate) fn scales8(f16: bool, bits: impl Fn(usize) -> u32) -> (__m128, __m128) {
        if f16 {
            let h = |j| bits(j) as u16 as i16;
            cvt_f16x8(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
        } else {
            let f = |j| bits(j) as i32;
            (
                _mm_castsi128_ps(_mm_setr_epi32(f(0), f(1), f(2), f(3))),
                _mm_castsi128_ps(_mm_setr_epi32(f(4), f(5), f(6), f(7))),
            )
        }
    }

    /// Eight f16 (one vector) as two f32 vectors (lanes 0..4, 4..8), exactly.
    #[inline]
    pub(crate) fn cvt_f16x8(v: __m128i) -> (__m128, __m128) {
        let exp_mask = _mm_set1_epi16(0x7c00);
        if _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(v, exp_mask), exp_mask)) == 0 {
            // no infinity or NaN among the eight (weight scales never are): `cvt_f16x4` without its patch-up
            let finite = |h: __m128i| {
                let rest = _mm_slli_epi32::<13>(_mm_and_si128(h, _mm_set1_epi32(0x7fff)));
                let sign = _mm_slli_epi32::<16>(_mm_and_si128(h, _mm_set1_epi32(0x8000)));
                let m = _mm_mul_ps(_mm_castsi128_ps(rest), _mm_set1_ps(f32::from_bits(0x7780_0000)));
                _mm_or_ps(m, _mm_castsi128_ps(sign))
            };
            let z = _mm_setzero_si128();
            return (finite(_mm_unpacklo_epi16(v, z)), finite(_mm_unpackhi_epi16(v, z)));
        }
        (cvt_f16x4(v), cvt_f16x4(_mm_unpackhi_epi64(v, v)))
    }

    /// `rows8_sse!`'s step for one block: acc + (d_w·d_x)·isums, lanes =
    /// rows (0..4, 4..8).
    #[inline]
    pub(crate) fn fold_rows(acc: [__m128; 2], s: [__m128i; 2], dw: (__m128, __m128), dx: f32) -> [__m128; 2] {
        let dx = _mm_set1_ps(dx);
        let (d0, d1) = (_mm_mul_ps(dw.0, dx), _mm_mul_ps(dw.1, dx));
        [
            _mm_add_ps(acc[0], _mm_mul_ps(d0, _mm_cvtepi32_ps(s[0]))),
            _mm_add_ps(acc[1], _mm_mul_ps(d1, _mm_cvtepi32_ps(s[1]))),
        ]
    }

    /// The eight rows' results from their eight accumulators, `portable::combine8` per lane.
    #[inline]
    pub(crate) fn combine_rows(a: [[__m128; 2]; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        for h in 0..2 {
            let p = |x: usize, y: usize| _mm_add_ps(a[x][h], a[y][h]);
            let v = _mm_add_ps(_mm_add_ps(p(0, 4), p(1, 5)), _mm_add_ps(p(2, 6), p(3, 7)));
            st(&mut out[4 * h..4 * h + 4], v);
        }
        out
    }

    /// The eight rows' f16 scales of an interleaved block as f32 lanes.
    #[inline]
    pub(crate) fn scales_rows(d: &[f16; 8]) -> (__m128, __m128) {
        // SAFETY: `d` points to 8 readable f16 (16 bytes); loadu needs no alignment.
        cvt_f16x8(unsafe { _mm_loadu_si128(d.as_ptr() as *const __m128i) })
    }

    /// Activation quants 4·g .. 4·g + 4 of a block, broadcast to every 32-bit lane.
    #[inline]
    pub(crate) fn bcast4(x: &BlockQ8Act, g: usize) -> __m128i {
        let q = &x.qs[4 * g..4 * g + 4];
        _mm_set1_epi32(i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]))
    }

    /// Bytes 16·v .. 16·v + 16 of an interleaved block's quants: four bytes of
    /// each of rows 0..4 (v even) or 4..8 (v odd) of one group.
    #[inline]
    pub(crate) fn ld_rows(qs: &[u8], v: usize) -> __m128i {
        ld16(qs[16 * v..16 * v + 16].try_into().unwrap())
    }

    /// Eight rows' exact Σ w·q for one interleaved Q8 block (bias 0), lanes =
    /// rows: i8 × i8 products through `madd_i8`, the broadcast activations'
    /// even and odd bytes made once for both halves.
    #[inline]
    fn q8_rows_isums(blk: &BlockQ8_0x8, x: &BlockQ8Act) -> [__m128i; 2] {
        let mut s = [_mm_setzero_si128(); 2];
        let _ = unroll!(8, |g| {
            let b = bcast4(x, g);
            let (be, bo) = (even_i8(b), _mm_srai_epi16::<8>(b));
            let _ = unroll!(2, |h| {
                let v = ld_rows(&blk.qs, 2 * g + h);
                let p = _mm_add_epi32(_mm_madd_epi16(even_i8(v), be), _mm_madd_epi16(_mm_srai_epi16::<8>(v), bo));
                s[h] = _mm_add_epi32(s[h], p);
            });
        });
        s
    }

    /// Eight rows' exact Σ nibble·q − 8·Σq for one interleaved Q4 block: each
    /// 16-bit lane's four nibbles (even byte low/high, odd byte low/high)
    /// isolated as i16 and multiplied by the matching activations.
    #[inline]
    fn q4_rows_isums(blk: &BlockQ4_0x8, x: &BlockQ8Act) -> [__m128i; 2] {
        let mut s = [_mm_setzero_si128(); 2];
        let m = _mm_set1_epi16(0x000f);
        let _ = unroll!(4, |g| {
            let (lo, hi) = (bcast4(x, g), bcast4(x, 4 + g));
            let (le, lo_odd, he, ho) = (even_i8(lo), _mm_srai_epi16::<8>(lo), even_i8(hi), _mm_srai_epi16::<8>(hi));
            let _ = unroll!(2, |h| {
                let v = ld_rows(&blk.qs, 2 * g + h);
                let p0 = _mm_madd_epi16(_mm_and_si128(v, m), le);
                let p1 = _mm_madd_epi16(_mm_and_si128(_mm_srli_epi16::<8>(v), m), lo_odd);
                let p2 = _mm_madd_epi16(_mm_and_si128(_mm_srli_epi16::<4>(v), m), he);
                let p3 = _mm_madd_epi16(_mm_srli_epi16::<12>(v), ho);
                s[h] = _mm_add_epi32(s[h], _mm_add_epi32(_mm_add_epi32(p0, p1), _mm_add_epi32(p2, p3)));
            });
        });
        let o = _mm_set1_epi32(8 * x.sum);
        [_mm_sub_epi32(s[0], o), _mm_sub_epi32(s[1], o)]
    }
);

/// Bias of the quants in `BlockQ8_0x8` for these kernels: none.
pub const Q8_X8_BIAS: u8 = 0;

isa_features!(
    /// Eight interleaved Q8 rows · one activation row: row k's result is
    /// `dot_q8` of row k, bit for bit (`rows8_sse!`).
    #[inline]
    pub(crate) fn dot_q8_r8(w: &[BlockQ8_0x8], x: ActRef) -> [f32; 8] {
        rows8_sse!(1, w, [x], |blk, xb| q8_rows_isums(blk, xb))[0]
    }

    /// Eight interleaved Q4 rows · one activation row (as `dot_q8_r8`).
    #[inline]
    pub(crate) fn dot_q4_r8(w: &[BlockQ4_0x8], x: ActRef) -> [f32; 8] {
        rows8_sse!(1, w, [x], |blk, xb| q4_rows_isums(blk, xb))[0]
    }

    /// Eight interleaved Q8 rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q8_r8_x2(w: &[BlockQ8_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        rows8_sse!(2, w, xs, |blk, xb| q8_rows_isums(blk, xb))
    }

    /// Eight interleaved Q4 rows · two activation rows.
    #[inline]
    pub(crate) fn dot_q4_r8_x2(w: &[BlockQ4_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        rows8_sse!(2, w, xs, |blk, xb| q4_rows_isums(blk, xb))
    }

    /// Eight interleaved Q8 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q8_r8_x3(w: &[BlockQ8_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        rows8_sse!(3, w, xs, |blk, xb| q8_rows_isums(blk, xb))
    }

    /// Eight interleaved Q4 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q4_r8_x3(w: &[BlockQ4_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        rows8_sse!(3, w, xs, |blk, xb| q4_rows_isums(blk, xb))
    }

    /// Eight interleaved Q8 rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q8_r8_x4(w: &[BlockQ8_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_sse!(4, w, xs, |blk, xb| q8_rows_isums(blk, xb))
    }

    /// Eight interleaved Q4 rows · four activation rows.
    #[inline]
    pub(crate) fn dot_q4_r8_x4(w: &[BlockQ4_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_sse!(4, w, xs, |blk, xb| q4_rows_isums(blk, xb))
    }

    /// −8·Σq of activation blocks i..i+8 as i32 lanes 0..4, 4..8: Q4's offset.
    #[inline]
    pub(crate) fn q4_offsets(x: ActRef, i: usize) -> [__m128i; 2] {
        let neg8 = |v| _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32::<3>(v));
        let [a, b] = ld8(x.sum, i);
        [neg8(a), neg8(b)]
    }

    /// `sum_blocks8!`'s step: acc + (d_w·d_x)·isums for blocks i..i+8.
    #[inline]
    pub(crate) fn fold8(acc: [__m128; 2], s: [__m128i; 2], dw: (__m128, __m128), x: ActRef, i: usize) -> [__m128; 2] {
        let [a, b] = ld8(x.d, i);
        let dx = [_mm_castsi128_ps(a), _mm_castsi128_ps(b)];
        let d0 = _mm_mul_ps(dw.0, dx[0]);
        let d1 = _mm_mul_ps(dw.1, dx[1]);
        [
            _mm_add_ps(acc[0], _mm_mul_ps(d0, _mm_cvtepi32_ps(s[0]))),
            _mm_add_ps(acc[1], _mm_mul_ps(d1, _mm_cvtepi32_ps(s[1]))),
        ]
    }

    /// Four vectors of per-block i32 partial sums → the four block sums (exact).
    #[inline]
    pub(crate) fn reduce4(v: [__m128i; 4]) -> __m128i {
        let pair = |a, b| _mm_add_epi32(_mm_unpacklo_epi32(a, b), _mm_unpackhi_epi32(a, b));
        let (a, b) = (pair(v[0], v[1]), pair(v[2], v[3]));
        _mm_add_epi32(_mm_unpacklo_epi64(a, b), _mm_unpackhi_epi64(a, b))
    }

    /// Eight per-block vectors → the block sums in lanes 0..4 and 4..8.
    #[inline]
    pub(crate) fn reduce8(v: [__m128i; 8]) -> [__m128i; 2] {
        [reduce4([v[0], v[1], v[2], v[3]]), reduce4([v[4], v[5], v[6], v[7]])]
    }
);

/// The Q8 · Q8 and Q4 · Q8 dots for one token (`sum_blocks8!`) or four
/// (`sum_blocks8_x4!`), shared by the SSE2 and SSE4.1 kernels, which
/// differ only in `$block_dot(weight halves, activation block)` (a Q8
/// block's exact sums in four i32 lanes) and `$nib_dot(low nibbles, high
/// nibbles, activation block)` (a Q4 block's Σ nibble·q likewise).
macro_rules! q8_dot {
    ($n:tt, $w:expr, $x:expr, $block_dot:expr) => {
        $crate::kernels::x86_64::sse2::int8::q8_dot!(@with $n, $w, $x, $block_dot, B::F16_SCALE,
            |blk| $crate::kernels::x86_64::sse2::int8::halves(blk.quants()), |blk| blk.scale_bits(), |blk| blk.scale())
    };
    // Any block of 32 int8 weights: `|blk| halves` (its quants as two
    // vectors), `$f16`, `|blk| bits` and `|blk| scale` (its scale's bits and
    // value), so MXFP4's decoded values take the same path (`mxfp4_dot!`).
    (@with 1, $w:expr, $x:expr, $block_dot:expr, $f16:expr, |$b1:ident| $load:expr, |$b2:ident| $bits:expr,
     |$b3:ident| $scale:expr) => {{
        use $crate::kernels::x86_64::sse2::int8::{hsum_i32, reduce8};
        let w = $w;
        let x: ActRef = $x;
        let x = x.range(0, w.len().min(x.len()));
        let block_dot = $block_dot;
        $crate::kernels::x86_64::sse2::int8::sum_blocks8!(
            x,
            false,
            $f16,
            |i| reduce8(unroll!(8, |j| {
                let $b1 = &w[i + j];
                block_dot($load, &x.blocks()[i + j].qs)
            })),
            |j| {
                let $b2 = &w[i + j];
                $bits
            },
            |b| (
                {
                    let $b1 = &w[b];
                    hsum_i32(block_dot($load, &x.blocks()[b].qs))
                },
                {
                    let $b3 = &w[b];
                    $scale
                }
            ),
        )
    }};
    (@with 4, $w:expr, $xs:expr, $block_dot:expr, $f16:expr, |$b1:ident| $load:expr, |$b2:ident| $bits:expr,
     |$b3:ident| $scale:expr) => {{
        use $crate::kernels::x86_64::sse2::int8::{hsum_i32, reduce4};
        let w = $w;
        let xs: [ActRef; 4] = $xs;
        let xs = unroll!(4, |t| xs[t].range(0, w.len().min(xs[t].len())));
        let block_dot = $block_dot;
        $crate::kernels::x86_64::sse2::int8::sum_blocks8_x4!(
            xs,
            false,
            $f16,
            |i, h| unroll!(4, |j| {
                let $b1 = &w[i + 4 * h + j];
                $load
            }),
            |wv, x| reduce4(unroll!(4, |j| block_dot(wv[j], &x.blocks()[i + 4 * h + j].qs))),
            |j| {
                let $b2 = &w[i + j];
                $bits
            },
            |b, x| (
                {
                    let $b1 = &w[b];
                    hsum_i32(block_dot($load, &x.blocks()[b].qs))
                },
                {
                    let $b3 = &w[b];
                    $scale
                }
            ),
        )
    }};
}
#[allow(unused_imports)] // used by the SSE4.1 build
pub(crate) use q8_dot;

/// MXFP4 weights · Q8 activations for one token or four: `q8_dot!` of the
/// values `$decode(block)` gives (two vectors of int8, elements 0..16 and
/// 16..32) with the E8M0 scales. Shared by the SSE2 and SSE4.1 kernels,
/// which decode differently (arithmetic, or a `pshufb` table).
macro_rules! mxfp4_dot {
    ($n:tt, $w:expr, $x:expr, $decode:expr, $block_dot:expr) => {{
        let w: &[$crate::quant::BlockMxfp4] = $w;
        let decode = $decode;
        $crate::kernels::x86_64::sse2::int8::q8_dot!(@with $n, w, $x, $block_dot, false, |blk| decode(blk),
            |blk| $crate::quant::e8m0_half_bits(blk.e), |blk| $crate::quant::e8m0_half(blk.e))
    }};
}
#[allow(unused_imports)] // used by the SSE4.1 build
pub(crate) use mxfp4_dot;

/// See `q8_dot!`.
macro_rules! q4_dot {
    (1, $w:expr, $x:expr, $nib_dot:expr) => {{
        use $crate::kernels::x86_64::sse2::int8::{hsum_i32, nibbles, reduce8};
        let w = $w;
        let x: ActRef = $x;
        let x = x.range(0, w.len().min(x.len()));
        let nib_dot = $nib_dot;
        $crate::kernels::x86_64::sse2::int8::sum_blocks8!(
            x,
            true,
            B::F16_SCALE,
            |i| reduce8(unroll!(8, |j| {
                let (lo, hi) = nibbles(w[i + j].nibbles());
                nib_dot(lo, hi, &x.blocks()[i + j].qs)
            })),
            |j| w[i + j].scale_bits(),
            |b| (
                {
                    let (lo, hi) = nibbles(w[b].nibbles());
                    hsum_i32(nib_dot(lo, hi, &x.blocks()[b].qs)) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }};
    (4, $w:expr, $xs:expr, $nib_dot:expr) => {{
        use $crate::kernels::x86_64::sse2::int8::{hsum_i32, nibbles, reduce4};
        let w = $w;
        let xs: [ActRef; 4] = $xs;
        let xs = unroll!(4, |t| xs[t].range(0, w.len().min(xs[t].len())));
        let nib_dot = $nib_dot;
        $crate::kernels::x86_64::sse2::int8::sum_blocks8_x4!(
            xs,
            true,
            B::F16_SCALE,
            |i, h| unroll!(4, |j| nibbles(w[i + 4 * h + j].nibbles())),
            |wv, x| reduce4(unroll!(4, |j| nib_dot(wv[j].0, wv[j].1, &x.blocks()[i + 4 * h + j].qs))),
            |j| w[i + j].scale_bits(),
            |b, x| (
                {
                    let (lo, hi) = nibbles(w[b].nibbles());
                    hsum_i32(nib_dot(lo, hi, &x.blocks()[b].qs)) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }};
}
#[allow(unused_imports)] // used by the SSE4.1 build
pub(crate) use q4_dot;

isa_features!(
    /// Σ of a Q8 block's 32 products in four i32 lanes (exact).
    #[inline]
    fn block_dot(w: (__m128i, __m128i), x: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(x);
        _mm_add_epi32(madd_i8(w.0, x0), madd_i8(w.1, x1))
    }

    /// An MXFP4 block's 32 values (`quant::MXFP4_VALUES`) as int8, elements
    /// 0..16 and 16..32, without a byte shuffle: magnitude code m gives m +
    /// max(m − 4, 0) + (2 if m = 7) (0, 1, 2, 3, 4, 6, 8, 12), negated where
    /// the sign bit is set.
    #[inline]
    pub(crate) fn mxfp4_halves(b: &BlockMxfp4) -> (__m128i, __m128i) {
        let n = ld16(&b.qs);
        let low4 = _mm_set1_epi8(0x0f);
        let value = |nib: __m128i| {
            let m = _mm_and_si128(nib, _mm_set1_epi8(7));
            let seven = _mm_and_si128(_mm_cmpeq_epi8(m, _mm_set1_epi8(7)), _mm_set1_epi8(2));
            let v = _mm_add_epi8(_mm_add_epi8(m, _mm_subs_epu8(m, _mm_set1_epi8(4))), seven);
            let neg = _mm_cmpeq_epi8(_mm_and_si128(nib, _mm_set1_epi8(8)), _mm_set1_epi8(8));
            _mm_sub_epi8(_mm_xor_si128(v, neg), neg)
        };
        (value(_mm_and_si128(n, low4)), value(_mm_and_si128(_mm_srli_epi16::<4>(n), low4)))
    }

    /// MXFP4 weights · Q8 activations: the values decoded into int8
    /// (`mxfp4_halves`), then as `dot_q8`.
    #[inline]
    pub(crate) fn dot_mxfp4(w: &[BlockMxfp4], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        mxfp4_dot!(1, w, x, |b| mxfp4_halves(b), |w, x| block_dot(w, x))
    }

    /// `dot_mxfp4` of one weight row with four activation rows, each block
    /// decoded once (each result bit-identical to `dot_mxfp4`'s).
    #[inline]
    pub(crate) fn dot_mxfp4_x4(w: &[BlockMxfp4], xs: [ActRef; 4]) -> [f32; 4] {
        mxfp4_dot!(4, w, xs, |b| mxfp4_halves(b), |w, x| block_dot(w, x))
    }

    /// Σ nibble·q of a Q4 block in four i32 lanes (exact).
    #[inline]
    fn nib_dot(lo: __m128i, hi: __m128i, x: &[i8; QK]) -> __m128i {
        let (x0, x1) = halves(x);
        _mm_add_epi32(madd_u8i8(lo, x0), madd_u8i8(hi, x1))
    }

    /// Q8 weights · Q8 activations: per block the exact integer sum, eight
    /// blocks per step in `portable`'s lane order (bit-identical).
    #[inline]
    pub(crate) fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q8_dot!(1, w, x, |w, x| block_dot(w, x))
    }

    /// Q4 weights · Q8 activations: Σ nibble·q − 8·Σq per block (exact), scaled as `dot_q8`.
    #[inline]
    pub(crate) fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q4_dot!(1, w, x, |lo, hi, x| nib_dot(lo, hi, x))
    }

    /// `dot_q8` of one weight row with four activation rows, each weight
    /// block loaded once (each result bit-identical to `dot_q8`'s).
    #[inline]
    pub(crate) fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q8_dot!(4, w, xs, |w, x| block_dot(w, x))
    }

    /// `dot_q4` of one weight row with four activation rows, each block's
    /// nibbles unpacked once (each result bit-identical to `dot_q4`'s).
    #[inline]
    pub(crate) fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q4_dot!(4, w, xs, |lo, hi, x| nib_dot(lo, hi, x))
    }

    /// A Q4 block's nibbles as bytes 0..15: (low nibbles: elements 0..16, high: 16..32).
    #[inline]
    pub(crate) fn nibbles(n: &[u8; QK / 2]) -> (__m128i, __m128i) {
        let (n, m) = (ld16(n), _mm_set1_epi8(0x0f));
        (_mm_and_si128(n, m), _mm_and_si128(_mm_srli_epi16::<4>(n), m))
    }
);

isa_features!(
    /// The int8 peak (`Kernels::int8_peak`): SSE2 has no 8-bit multiply, so
    /// its kernels widen the quants to i16 and use `pmaddwd` (8 products,
    /// then `paddd`); that step
    /// in independent chains (`peak_asm!`).
    pub(crate) fn int8_peak(rounds: usize) -> (u64, i32) {
        let (u, s) = (_mm_set1_epi16(3), _mm_set1_epi16(-2));
        let mut a = [_mm_setzero_si128(); 8];
        let n = rounds.max(1);
        peak_asm!(
            n,
            xmm_reg,
            (u, s, u),
            a[a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6, a7 = 7],
            ".irp acc, {a0}, {a1}, {a2}, {a3}, {a4}, {a5}, {a6}, {a7}",
            [
            "movdqa {t0}, {u}",
            "pmaddwd {t0}, {s}",
            "paddd \\acc, {t0}"
            ]
        );
        ((n * 8 * 8) as u64, sum_lanes(a))
    }

    /// The sum of every i32 lane of eight vectors (wrapping): `int8_peak`'s checksum.
    #[inline]
    pub(crate) fn sum_lanes(a: [__m128i; 8]) -> i32 {
        let v = a[1..].iter().fold(a[0], |v, x| _mm_add_epi32(v, *x));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v)))
    }
);
