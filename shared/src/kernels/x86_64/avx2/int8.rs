//! AVX2 int8 kernels: Q8 and Q4 weights against quantised activations with
//! `vpmaddubsw` + `vpmaddwd`, one row (one token or four) and eight
//! interleaved rows. The block folding (`sum_blocks8_n!`, `q8_dot_n!`,
//! `q4_dot_n!`, `rows8_n!`) is shared with the AVX-512 VNNI build, which
//! gives it `vpdpbusd` block sums instead.

use core::arch::x86_64::*;

use half::f16;

pub(crate) use super::{hsum, st};
use crate::kernels::x86_64::sse2::{halves, ld16};
use crate::quant::{
    ActRef, BlockMxfp4, BlockMxfp4x8, BlockQ4_0x8, BlockQ8Act, BlockQ8_0x8, Q4Block, Q8Block, MXFP4_VALUES, QK,
    ZERO_Q4, ZERO_Q8,
};

/// Σ_b (d_w·d_x)·isum_b in `portable`'s order for one weight row and N
/// activation rows (N = 1: a dot product; N = 4: four tokens of a prompt):
/// block b into lane b % 8 (multiply then add, no FMA), lanes combined as
/// `portable::combine8`. Eight blocks per step: the weight side
/// (`|i, r| wv`: loaded, unpacked registers) and the scales (`|j| bits`:
/// weight block i + j's scale bits, f16 when `$f16`) are made once per step,
/// then each token's lanes take the same operations (`|wv, x| isums`: the
/// exact Σ q_w·q_x of activation row x's blocks as eight i32 lanes; `$q4`
/// adds Q4's −8·Σq), so result t equals the N = 1 result for `xs[t]` bit
/// for bit. The last n % 8 blocks are one more step with r < 8 blocks, the
/// others read as zero blocks (`ZERO_Q4`, `ZERO_Q8`, scale 0) or skipped
/// (`wv` and `isums` give zero vectors for blocks j ≥ r): their lanes add
/// (0·0)·0 = +0, which leaves every lane as it was (a lane sum that starts
/// at +0 is never −0), so every lane holds what `portable` adds into it,
/// without leaving registers. Activation rows without contiguous scales and
/// sums go block by block with the same scalar operations (`|b, x| (isum,
/// scale)`: block b's exact integer sum, offset included, and its weight
/// scale). A macro, so that all of it is inlined into the kernel.
macro_rules! sum_blocks8_n {
    // One step: blocks i..i+r (r ≤ 8) into the N accumulators.
    (@step $n:tt, $acc:ident, $xs:ident, $q4:expr, $f16:expr, $i:ident, $r:ident, $wv:ident, $wprep:expr, $x:ident,
     $isums:expr, $j:ident, $bits:expr) => {{
        use $crate::kernels::x86_64::avx2::int8 as a;
        let $wv = $wprep;
        let dw = a::scales8(
            $f16,
            #[inline(always)]
            |$j: usize| if $j < $r { $bits } else { 0 },
        );
        $acc = unroll!($n, |t| {
            let $x = $xs[t];
            let s = $isums;
            let s = if $q4 { _mm256_add_epi32(s, a::q4_offsets($x, $i, $r)) } else { s };
            a::fold8($acc[t], s, dw, $x, $i, $r)
        });
    }};
    ($n:tt, $xs:expr, $q4:expr, $f16:expr, |$i:ident, $r:ident| $wprep:expr, |$wv:ident, $x:ident| $isums:expr,
     |$j:ident| $bits:expr, |$b:ident, $xb:ident| $one:expr $(,)?) => {{
        use $crate::kernels::x86_64::avx2::int8 as a;
        let xs: [$crate::quant::ActRef; $n] = $xs;
        let n = xs[0].len();
        // (plain loops and `unroll!`, not iterator adapters or `array::map`: a
        // closure handed to std code is not inlined into a target-feature function)
        let mut side = true;
        for x in &xs {
            side &= x.has_side() && x.len() == n;
        }
        if side {
            let mut acc = [_mm256_setzero_ps(); $n];
            let mut $i = 0usize;
            while $i + 8 <= n {
                let $r = 8usize; // a constant: the zero-block choices compile away
                $crate::kernels::x86_64::avx2::int8::sum_blocks8_n!(@step $n, acc, xs, $q4, $f16, $i, $r, $wv, $wprep, $x, $isums, $j, $bits);
                $i += 8;
            }
            if $i < n {
                let $r = n - $i;
                $crate::kernels::x86_64::avx2::int8::sum_blocks8_n!(@step $n, acc, xs, $q4, $f16, $i, $r, $wv, $wprep, $x, $isums, $j, $bits);
            }
            unroll!($n, |t| a::hsum(acc[t]))
        } else {
            xs.map(|$xb| {
                let mut lanes = [0.0f32; 8];
                for $b in 0..$xb.len() {
                    let (isum, scale): (i32, f32) = $one;
                    lanes[$b % 8] += (scale * $xb.blocks()[$b].d) * isum as f32;
                }
                $crate::kernels::portable::combine8(lanes)
            })
        }
    }};
}

#[allow(unused_imports)]
pub(crate) use sum_blocks8_n;

/// Σ_b (d_w·d_x)·isum_b for the eight interleaved rows of `quant::BlockQ8_0x8`
/// / `BlockQ4_0x8` blocks (one vector lane per row) and N activation rows,
/// in `portable`'s order: block b into accumulator b % 8 (multiply then
/// add, no FMA), the eight accumulators combined as `portable::combine8`,
/// so row k's result equals the single-row dot of row k bit for bit. Per
/// block the weight side is made once (`|blk| wv`), then each token's exact
/// block sums (`|wv, xb| isums`: eight i32 lanes, Q4's −8·Σq included). No
/// horizontal reduction: the interleave puts four weights of every row in
/// each 32-bit lane, multiplied by the same four activations (broadcast).
/// The last nb % 8 blocks are one more pass with fewer blocks. The
/// `@scaled` form takes the rows' scales from `|blk| scales` (MXFP4's E8M0
/// bytes, `scales_e8m0`). A macro, so that all of it is inlined into the
/// kernel.
macro_rules! rows8_n {
    (@step $n:tt, $acc:ident, $w:ident, $xs:ident, $i:ident, $r:ident, |$sblk:ident| $scales:expr,
     |$blk:ident| $wprep:expr, |$wv:ident, $xb:ident| $isums:expr) => {{
        use $crate::kernels::x86_64::avx2::int8 as a;
        let _ = unroll!(8, |l| if l < $r {
            let $blk = &$w[$i + l];
            let $wv = $wprep;
            let dw = {
                let $sblk = $blk;
                $scales
            };
            let _ = unroll!($n, |t| {
                let $xb = &$xs[t].blocks()[$i + l];
                let s = $isums;
                $acc[t][l] = a::fold_rows($acc[t][l], s, dw, $xb.d);
            });
        });
    }};
    ($n:tt, $w:expr, $xs:expr, |$blk:ident| $wprep:expr, |$wv:ident, $xb:ident| $isums:expr $(,)?) => {
        $crate::kernels::x86_64::avx2::int8::rows8_n!(@scaled $n, $w, $xs,
            |sblk| $crate::kernels::x86_64::avx2::int8::scales_f16(&sblk.d), |$blk| $wprep, |$wv, $xb| $isums)
    };
    // `|blk| scales`: a block's eight row scales as f32 lanes (f16 `d` above).
    (@scaled $n:tt, $w:expr, $xs:expr, |$sblk:ident| $scales:expr, |$blk:ident| $wprep:expr,
     |$wv:ident, $xb:ident| $isums:expr $(,)?) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::int8 as a;
        let w = $w;
        let xs: [$crate::quant::ActRef; $n] = $xs;
        let nb = w.len();
        let mut same_len = true;
        for x in &xs {
            same_len &= x.len() == nb;
        }
        assert!(same_len, "eight-row dot: {nb} weight blocks per row, activations differ");
        let mut acc = [[_mm256_setzero_ps(); 8]; $n];
        let mut i = 0usize;
        while i + 8 <= nb {
            let r = 8usize; // a constant: the block choices compile away
            $crate::kernels::x86_64::avx2::int8::rows8_n!(@step $n, acc, w, xs, i, r, |$sblk| $scales, |$blk| $wprep, |$wv, $xb| $isums);
            i += 8;
        }
        let r = nb - i;
        $crate::kernels::x86_64::avx2::int8::rows8_n!(@step $n, acc, w, xs, i, r, |$sblk| $scales, |$blk| $wprep, |$wv, $xb| $isums);
        unroll!($n, |t| a::combine_rows(acc[t]))
    }};
}

#[allow(unused_imports)]
pub(crate) use rows8_n;

isa_features!(
    /// A 32-byte block of quants as one vector.
    #[inline]
    pub(crate) fn ld32<T: Copy>(q: &[T; QK]) -> __m256i {
        debug_assert_eq!(core::mem::size_of::<T>(), 1);
        // SAFETY: `q` points to 32 readable bytes (T is i8 or u8); loadu needs no alignment.
        unsafe { _mm256_loadu_si256(q.as_ptr() as *const __m256i) }
    }

    /// 16 nibble bytes → 32 bytes 0..15: low nibbles (elements 0..16) then high (16..32).
    #[inline]
    pub(crate) fn unpack_nibbles(n: &[u8; QK / 2]) -> __m256i {
        let n = ld16(n);
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(n), m), _mm_and_si128(n, m))
    }

    /// An MXFP4 block's 32 values (`quant::MXFP4_VALUES`, twice E2M1) as
    /// int8 lanes in element order: the nibbles looked up with `vpshufb`.
    #[inline]
    pub(crate) fn mxfp4_quants(b: &BlockMxfp4) -> __m256i {
        // SAFETY: MXFP4_VALUES is 16 readable bytes; loadu needs no alignment.
        let table = unsafe { _mm_loadu_si128(MXFP4_VALUES.as_ptr() as *const __m128i) };
        _mm256_shuffle_epi8(_mm256_set_m128i(table, table), unpack_nibbles(&b.qs))
    }

    /// Sum of eight i32 lanes (exact).
    #[inline]
    pub(crate) fn hsum_i32(v: __m256i) -> i32 {
        let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v)))
    }

    /// Σ of 32 u8 × i8 products in eight i32 lanes (exact: pair sums fit i16).
    #[inline]
    fn maddubs(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// Eight weight scales as f32 lanes from their bits (f16 when `f16`, else f32).
    #[inline]
    pub(crate) fn scales8(f16: bool, bits: impl Fn(usize) -> u32) -> __m256 {
        if f16 {
            let h = |j| bits(j) as u16 as i16;
            _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
        } else {
            let f = |j| bits(j) as i32;
            _mm256_castsi256_ps(_mm256_setr_epi32(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7)))
        }
    }

    /// `v[i..i + r]` (f32 or i32, r ≤ 8) as lanes 0..r of a vector, zeros above.
    #[inline]
    pub(crate) fn ld8<T: Copy>(v: &[T], i: usize, r: usize) -> __m256i {
        assert_eq!(core::mem::size_of::<T>(), 4);
        if r == 8 {
            let c: &[T; 8] = v[i..i + 8].try_into().unwrap();
            // SAFETY: `c` points to 8 readable 4-byte values (asserted); loadu needs no alignment.
            return unsafe { _mm256_loadu_si256(c.as_ptr() as *const __m256i) };
        }
        let c = &v[i..i + r];
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(r as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        // SAFETY: the mask enables lanes 0..r, which are `c`'s r readable
        // 4-byte values; masked-off lanes are not accessed (cannot fault) and read as 0.
        unsafe { _mm256_maskload_epi32(c.as_ptr() as *const i32, mask) }
    }

    /// −8·Σq of activation blocks i..i+r (r ≤ 8) as i32 lanes 0..r, 0 above: Q4's offset.
    #[inline]
    pub(crate) fn q4_offsets(x: ActRef, i: usize, r: usize) -> __m256i {
        let s = ld8(x.sum, i, r);
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(s))
    }

    /// `sum_blocks8_n!`'s step: acc + (d_w·d_x)·isums for blocks i..i+r
    /// (r ≤ 8; d_x = 0 in lanes r..8).
    #[inline]
    pub(crate) fn fold8(acc: __m256, s: __m256i, dw: __m256, x: ActRef, i: usize, r: usize) -> __m256 {
        let dx = _mm256_castsi256_ps(ld8(x.d, i, r));
        let d = _mm256_mul_ps(dw, dx);
        _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)))
    }
);

/// Nibbles of weight block i + j, or a zero block from j = r on.
#[inline(always)]
pub(crate) fn q4_or_zero<B: Q4Block>(w: &[B], i: usize, j: usize, r: usize) -> &[u8; QK / 2] {
    if j < r {
        w[i + j].nibbles()
    } else {
        &ZERO_Q4
    }
}

/// Quants of activation block i + j, or a zero block from j = r on.
#[inline(always)]
pub(crate) fn act_or_zero(x: ActRef<'_>, i: usize, j: usize, r: usize) -> &[i8; QK] {
    if j < r {
        &x.blocks()[i + j].qs
    } else {
        &ZERO_Q8
    }
}

isa_features!(
    /// Eight vectors of per-block i32 partial sums → one vector of the eight block sums (exact).
    #[inline]
    pub(crate) fn reduce8(v: [__m256i; 8]) -> __m256i {
        let h = |a, b| _mm256_hadd_epi32(a, b);
        let a = h(h(v[0], v[1]), h(v[2], v[3])); // [0..4 low halves | 0..4 high halves]
        let b = h(h(v[4], v[5]), h(v[6], v[7]));
        _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(a, b), _mm256_permute2x128_si256::<0x31>(a, b))
    }

    /// Four vectors [block 2p's four partial sums | block 2p+1's] → the eight block sums in order (exact).
    #[inline]
    pub(crate) fn reduce_pairs(p: [__m256i; 4]) -> __m256i {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        // h holds blocks 0, 2, 4, 6 | 1, 3, 5, 7
        _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Nibbles of two Q4 blocks [a | b] → (low nibbles, high nibbles), bytes 0..15.
    #[inline]
    pub(crate) fn nibble_pair(a: &[u8; QK / 2], b: &[u8; QK / 2]) -> (__m256i, __m256i) {
        let n = _mm256_set_m128i(ld16(b), ld16(a));
        let m = _mm256_set1_epi8(0x0f);
        (_mm256_and_si256(n, m), _mm256_and_si256(_mm256_srli_epi16::<4>(n), m))
    }

    /// Activations of two blocks as ([a 0..16 | b 0..16], [a 16..32 | b 16..32]).
    #[inline]
    pub(crate) fn act_pair(a: &[i8; QK], b: &[i8; QK]) -> (__m256i, __m256i) {
        let ((a0, a1), (b0, b1)) = (halves(a), halves(b));
        (_mm256_set_m128i(b0, a0), _mm256_set_m128i(b1, a1))
    }
);

/// Q8 weights · Q8 activations for N activation rows (`sum_blocks8_n!`):
/// |w| × sign(x, w) (activation quants in [-127, 127]), `$pair_dot(|w|,
/// sign(x, w))` giving a block's exact sums in eight i32 lanes. Shared by
/// the AVX2 and AVX-512 VNNI kernels. The `@with` form takes any block of
/// 32 int8 weights: `|blk| quants` (its quants as one vector), `$f16`, `|blk|
/// bits` and `|blk| scale` (its scale's bits and value): MXFP4's decoded
/// values (`mxfp4_quants`) take the same path.
macro_rules! q8_dot_n {
    ($n:tt, $w:expr, $xs:expr, $block_dot:expr) => {
        $crate::kernels::x86_64::avx2::int8::q8_dot_n!(@with $n, $w, $xs, $block_dot, B::F16_SCALE,
            |blk| $crate::kernels::x86_64::avx2::int8::ld32(blk.quants()), |blk| blk.scale_bits(), |blk| blk.scale())
    };
    (@with $n:tt, $w:expr, $xs:expr, $block_dot:expr, $f16:expr, |$b1:ident| $load:expr, |$b2:ident| $bits:expr,
     |$b3:ident| $scale:expr) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::int8::{hsum_i32, ld32, reduce8};
        use $crate::quant::ActRef;
        let w = $w;
        let xs: [ActRef; $n] = $xs;
        let xs = unroll!($n, |t| xs[t].range(0, w.len().min(xs[t].len())));
        let block_dot = $block_dot;
        $crate::kernels::x86_64::avx2::int8::sum_blocks8_n!(
            $n,
            xs,
            false,
            $f16,
            |i, r| unroll!(8, |j| if j < r {
                let $b1 = &w[i + j];
                $load
            } else {
                _mm256_setzero_si256()
            }),
            |wv, x| {
                reduce8(unroll!(8, |j| if j < r {
                    let (a, b) = (wv[j], ld32(&x.blocks()[i + j].qs));
                    block_dot(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
                } else {
                    _mm256_setzero_si256()
                }))
            },
            |j| {
                let $b2 = &w[i + j];
                $bits
            },
            |b, x| (
                {
                    let $b1 = &w[b];
                    let (a, q) = ($load, ld32(&x.blocks()[b].qs));
                    hsum_i32(block_dot(_mm256_sign_epi8(a, a), _mm256_sign_epi8(q, a)))
                },
                {
                    let $b3 = &w[b];
                    $scale
                }
            ),
        )
    }};
}

/// MXFP4 weights · Q8 activations for N activation rows: `q8_dot_n!` of
/// the decoded values (`mxfp4_quants`) with the E8M0 scales. Shared by the
/// AVX2 and AVX-512 VNNI kernels.
macro_rules! mxfp4_dot_n {
    ($n:tt, $w:expr, $xs:expr, $block_dot:expr) => {{
        let w: &[$crate::quant::BlockMxfp4] = $w;
        $crate::kernels::x86_64::avx2::int8::q8_dot_n!(@with $n, w, $xs, $block_dot, false,
            |blk| $crate::kernels::x86_64::avx2::int8::mxfp4_quants(blk),
            |blk| $crate::quant::e8m0_half_bits(blk.e),
            |blk| $crate::quant::e8m0_half(blk.e))
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use mxfp4_dot_n;
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use q8_dot_n;

/// Q4 weights · Q8 activations for N activation rows (`sum_blocks8_n!`):
/// Σ nibble·q − 8·Σq per block (exact), two blocks per vector,
/// `$pair_dot(low nibbles, high nibbles, activations 0..16, 16..32)`
/// giving the pair's exact sums as [block 2p's four | block 2p+1's].
/// Shared by the AVX2 and AVX-512 VNNI kernels.
macro_rules! q4_dot_n {
    ($n:tt, $w:expr, $xs:expr, $pair_dot:expr) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::int8::{
            act_or_zero, act_pair, hsum_i32, ld32, nibble_pair, q4_or_zero, reduce_pairs, unpack_nibbles,
        };
        use $crate::quant::ActRef;
        let w = $w;
        let xs: [ActRef; $n] = $xs;
        let xs = unroll!($n, |t| xs[t].range(0, w.len().min(xs[t].len())));
        let pair_dot = $pair_dot;
        let zero = _mm256_setzero_si256();
        $crate::kernels::x86_64::avx2::int8::sum_blocks8_n!(
            $n,
            xs,
            true,
            B::F16_SCALE,
            |i, r| unroll!(4, |p| if 2 * p < r {
                nibble_pair(w[i + 2 * p].nibbles(), q4_or_zero(w, i, 2 * p + 1, r))
            } else {
                (zero, zero)
            }),
            |wv, x| {
                reduce_pairs(unroll!(4, |p| if 2 * p < r {
                    let (lo, hi) = wv[p];
                    let (x0, x1) = act_pair(&x.blocks()[i + 2 * p].qs, act_or_zero(x, i, 2 * p + 1, r));
                    pair_dot(lo, hi, x0, x1)
                } else {
                    zero
                }))
            },
            |j| w[i + j].scale_bits(),
            |b, x| (
                {
                    let (n, q) = (unpack_nibbles(w[b].nibbles()), ld32(&x.blocks()[b].qs));
                    hsum_i32(pair_dot(n, zero, q, zero)) - 8 * x.blocks()[b].sum
                },
                w[b].scale()
            ),
        )
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use q4_dot_n;

isa_features!(
    /// A block's 32 u8 × i8 products (u = |w|, s = sign(x, w)) in eight exact i32 lanes.
    #[inline]
    fn block_dot(u: __m256i, s: __m256i) -> __m256i {
        maddubs(u, s)
    }

    /// Σ lo·x0 + hi·x1 (nibbles u8 × activations i8) in eight exact i32 lanes.
    #[inline]
    fn pair_dot(lo: __m256i, hi: __m256i, x0: __m256i, x1: __m256i) -> __m256i {
        // pair sums ≤ 2·15·127 each, two of them: the i16 add is exact
        let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }

    /// Q8 weights · Q8 activations: exact per-block sums, eight blocks per step.
    #[inline]
    pub(crate) fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q8_dot_n!(1, w, [x], |u, s| block_dot(u, s))[0]
    }

    /// Q4 weights · Q8 activations: Σ nibble·q − 8·Σq per block (exact), two blocks per vector.
    #[inline]
    pub(crate) fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        q4_dot_n!(1, w, [x], |lo, hi, x0, x1| pair_dot(lo, hi, x0, x1))[0]
    }

    /// `dot_q8` of one weight row with four activation rows, the weights
    /// loaded once per block (each result bit-identical to `dot_q8`'s).
    #[inline]
    pub(crate) fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q8_dot_n!(4, w, xs, |u, s| block_dot(u, s))
    }

    /// MXFP4 weights · Q8 activations: the values looked up into int8
    /// (`mxfp4_quants`), then as `dot_q8`.
    #[inline]
    pub(crate) fn dot_mxfp4(w: &[BlockMxfp4], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        mxfp4_dot_n!(1, w, [x], |u, s| block_dot(u, s))[0]
    }

    /// `dot_mxfp4` of one weight row with four activation rows, each block
    /// decoded once (each result bit-identical to `dot_mxfp4`'s).
    #[inline]
    pub(crate) fn dot_mxfp4_x4(w: &[BlockMxfp4], xs: [ActRef; 4]) -> [f32; 4] {
        mxfp4_dot_n!(4, w, xs, |u, s| block_dot(u, s))
    }

    /// `dot_q4` of one weight row with four activation rows, the nibbles
    /// unpacked once per block pair (each result bit-identical to `dot_q4`'s).
    #[inline]
    pub(crate) fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        q4_dot_n!(4, w, xs, |lo, hi, x0, x1| pair_dot(lo, hi, x0, x1))
    }

    /// Eight f16 scales as f32 lanes.
    #[inline]
    pub(crate) fn scales_f16(d: &[f16; 8]) -> __m256 {
        // SAFETY: `d` points to 8 readable f16 (16 bytes); loadu needs no alignment.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(d.as_ptr() as *const __m128i) })
    }

    /// `rows8_n!`'s step for one block: acc + (d_w·d_x)·isums, lanes = rows.
    #[inline]
    pub(crate) fn fold_rows(acc: __m256, s: __m256i, dw: __m256, dx: f32) -> __m256 {
        let d = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
        _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)))
    }

    /// The eight rows' results from their eight accumulators: ((a0 + a4) +
    /// (a1 + a5)) + ((a2 + a6) + (a3 + a7)) per lane, `portable::combine8`.
    #[inline]
    pub(crate) fn combine_rows(a: [__m256; 8]) -> [f32; 8] {
        let h = |x, y| _mm256_add_ps(x, y);
        let v = h(h(h(a[0], a[4]), h(a[1], a[5])), h(h(a[2], a[6]), h(a[3], a[7])));
        let mut out = [0.0f32; 8];
        st(&mut out, v);
        out
    }

    /// Activation quants 4·g .. 4·g + 4 of a block, broadcast to every 32-bit lane.
    #[inline]
    pub(crate) fn bcast4(x: &BlockQ8Act, g: usize) -> __m256i {
        let q = &x.qs[4 * g..4 * g + 4];
        _mm256_set1_epi32(i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]))
    }

    /// 32 bytes of an interleaved block: four weights (or nibble bytes) of each of the eight rows.
    #[inline]
    pub(crate) fn ld_rows(qs: &[u8], g: usize) -> __m256i {
        let c: &[u8; 32] = qs[32 * g..32 * g + 32].try_into().unwrap();
        // SAFETY: `c` points to 32 readable bytes; loadu needs no alignment.
        unsafe { _mm256_loadu_si256(c.as_ptr() as *const __m256i) }
    }

    /// An interleaved nibble block's nibbles (`BlockQ4_0x8`'s or
    /// `BlockMxfp4x8`'s `qs`): (low, high) of each 32-byte group.
    #[inline]
    pub(crate) fn rows_nibbles(qs: &[u8; 128]) -> [(__m256i, __m256i); 4] {
        let m = _mm256_set1_epi8(0x0f);
        unroll!(4, |g| {
            let v = ld_rows(qs, g);
            (_mm256_and_si256(v, m), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m))
        })
    }

    /// Eight rows' exact Σ nibble·q − 8·Σq for one block: u8 × i8 pair sums
    /// (≤ 2·15·127 each) added in i16, eight of them per lane (≤ 30480, no
    /// overflow), then widened.
    #[inline]
    fn q4_rows_isums(n: &[(__m256i, __m256i); 4], x: &BlockQ8Act) -> __m256i {
        let mut s = _mm256_setzero_si256();
        let _ = unroll!(4, |g| {
            let lo = _mm256_maddubs_epi16(n[g].0, bcast4(x, g));
            let hi = _mm256_maddubs_epi16(n[g].1, bcast4(x, 4 + g));
            s = _mm256_add_epi16(s, _mm256_add_epi16(lo, hi));
        });
        let s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
        _mm256_sub_epi32(s, _mm256_set1_epi32(8 * x.sum))
    }

    /// Eight rows' E8M0 scales as f32 lanes, `quant::e8m0_half` bit for
    /// bit: (e − 1)·2^23 as the bits for e ≥ 2, the subnormal 2^21 << e below.
    #[inline]
    pub(crate) fn scales_e8m0(e: &[u8; 8]) -> __m256 {
        let v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(*e)));
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(v, _mm256_set1_epi32(1)));
        let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), v);
        let is_normal = _mm256_cmpgt_epi32(v, _mm256_set1_epi32(1));
        _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, is_normal))
    }

    /// An interleaved MXFP4 block's codes as the unsigned bytes v + 12
    /// (`MXFP4_PLUS_12`, looked up with `vpshufb`): (low, high) of each
    /// 32-byte group, from `rows_nibbles`.
    #[inline]
    pub(crate) fn rows_mxfp4(blk: &BlockMxfp4x8) -> [(__m256i, __m256i); 4] {
        // SAFETY: MXFP4_PLUS_12 is 16 readable bytes; loadu needs no alignment.
        let table = unsafe { _mm_loadu_si128(MXFP4_PLUS_12.as_ptr() as *const __m128i) };
        let table = _mm256_set_m128i(table, table);
        let n = rows_nibbles(&blk.qs);
        unroll!(4, |g| (_mm256_shuffle_epi8(table, n[g].0), _mm256_shuffle_epi8(table, n[g].1)))
    }

    /// Eight rows' exact Σ v·q for one MXFP4 block: Σ (v + 12)·q − 12·Σq,
    /// the u8 × i8 pair sums (≤ 2·24·128 = 6144) added four to an i16
    /// (≤ 24576, no overflow), each half widened.
    #[inline]
    fn mxfp4_rows_isums(n: &[(__m256i, __m256i); 4], x: &BlockQ8Act) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let half = unroll!(2, |h| {
            let g = 2 * h;
            let a = _mm256_add_epi16(
                _mm256_maddubs_epi16(n[g].0, bcast4(x, g)),
                _mm256_maddubs_epi16(n[g].1, bcast4(x, 4 + g)),
            );
            let b = _mm256_add_epi16(
                _mm256_maddubs_epi16(n[g + 1].0, bcast4(x, g + 1)),
                _mm256_maddubs_epi16(n[g + 1].1, bcast4(x, 5 + g)),
            );
            _mm256_madd_epi16(_mm256_add_epi16(a, b), ones)
        });
        _mm256_sub_epi32(_mm256_add_epi32(half[0], half[1]), _mm256_set1_epi32(12 * x.sum))
    }

    /// An interleaved Q8 block (bias 0: signed quants): (|w|, w) of each 32-byte group.
    #[inline]
    fn rows_q8(blk: &BlockQ8_0x8) -> [(__m256i, __m256i); 8] {
        unroll!(8, |g| {
            let v = ld_rows(&blk.qs, g);
            (_mm256_sign_epi8(v, v), v)
        })
    }

    /// Eight rows' exact Σ w·q for one block: |w| × sign(q, w) pair sums
    /// (≤ 2·128·127, activation quants in [-127, 127]) widened per group.
    #[inline]
    fn q8_rows_isums(w: &[(__m256i, __m256i); 8], x: &BlockQ8Act) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let p = unroll!(8, |g| {
            let (u, v) = w[g];
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(bcast4(x, g), v)), ones)
        });
        let h = |a, b| _mm256_add_epi32(a, b);
        h(h(h(p[0], p[1]), h(p[2], p[3])), h(h(p[4], p[5]), h(p[6], p[7])))
    }
);

/// Twice E2M1 plus 12 (`MXFP4_VALUES` + 12, 0 to 24): MXFP4 codes as
/// unsigned bytes for `vpmaddubsw` and `vpdpbusd`, which need an unsigned
/// operand: Σ (v + 12)·q − 12·Σq = Σ v·q.
pub(crate) const MXFP4_PLUS_12: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (MXFP4_VALUES[i] + 12) as u8;
        i += 1;
    }
    t
};

/// Eight interleaved MXFP4 rows · `$n` activation rows: `rows8_n!` with
/// the E8M0 scales (`scales_e8m0`) and the codes as v + 12 (`rows_mxfp4`),
/// `$isums` the exact block sums of the build (`mxfp4_rows_isums`).
macro_rules! mxfp4_r8_n {
    ($n:tt, $w:expr, $xs:expr, $isums:path) => {
        $crate::kernels::x86_64::avx2::int8::rows8_n!(@scaled $n, $w, $xs,
            |blk| $crate::kernels::x86_64::avx2::int8::scales_e8m0(&blk.e),
            |blk| $crate::kernels::x86_64::avx2::int8::rows_mxfp4(blk),
            |wv, xb| $isums(&wv, xb))
    };
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use mxfp4_r8_n;

/// Bias of the quants in `BlockQ8_0x8` for these kernels: none (they need signed weights).
pub const Q8_X8_BIAS: u8 = 0;

isa_features!(
    /// Eight interleaved Q8 rows · one activation row: row k's result is
    /// `dot_q8` of row k, bit for bit (`rows8_n!`).
    #[inline]
    pub(crate) fn dot_q8_r8(w: &[BlockQ8_0x8], x: ActRef) -> [f32; 8] {
        rows8_n!(1, w, [x], |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))[0]
    }

    /// Eight interleaved Q4 rows · one activation row (as `dot_q8_r8`).
    #[inline]
    pub(crate) fn dot_q4_r8(w: &[BlockQ4_0x8], x: ActRef) -> [f32; 8] {
        rows8_n!(1, w, [x], |blk| rows_nibbles(&blk.qs), |wv, xb| q4_rows_isums(&wv, xb))[0]
    }

    /// Eight interleaved Q8 rows · two activation rows, the weights loaded once per block.
    #[inline]
    pub(crate) fn dot_q8_r8_x2(w: &[BlockQ8_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        rows8_n!(2, w, xs, |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q4 rows · two activation rows, the nibbles unpacked once per block.
    #[inline]
    pub(crate) fn dot_q4_r8_x2(w: &[BlockQ4_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        rows8_n!(2, w, xs, |blk| rows_nibbles(&blk.qs), |wv, xb| q4_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q8 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q8_r8_x3(w: &[BlockQ8_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        rows8_n!(3, w, xs, |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q4 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_q4_r8_x3(w: &[BlockQ4_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        rows8_n!(3, w, xs, |blk| rows_nibbles(&blk.qs), |wv, xb| q4_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q8 rows · four activation rows, the weights loaded once per block.
    #[inline]
    pub(crate) fn dot_q8_r8_x4(w: &[BlockQ8_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_n!(4, w, xs, |blk| rows_q8(blk), |wv, xb| q8_rows_isums(&wv, xb))
    }

    /// Eight interleaved Q4 rows · four activation rows, the nibbles unpacked once per block.
    #[inline]
    pub(crate) fn dot_q4_r8_x4(w: &[BlockQ4_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        rows8_n!(4, w, xs, |blk| rows_nibbles(&blk.qs), |wv, xb| q4_rows_isums(&wv, xb))
    }

    /// Eight interleaved MXFP4 rows · one activation row: row k's result
    /// is `dot_mxfp4` of row k, bit for bit (`mxfp4_r8_n!`).
    #[inline]
    pub(crate) fn dot_mxfp4_r8(w: &[BlockMxfp4x8], x: ActRef) -> [f32; 8] {
        mxfp4_r8_n!(1, w, [x], mxfp4_rows_isums)[0]
    }

    /// Eight interleaved MXFP4 rows · two activation rows.
    #[inline]
    pub(crate) fn dot_mxfp4_r8_x2(w: &[BlockMxfp4x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        mxfp4_r8_n!(2, w, xs, mxfp4_rows_isums)
    }

    /// Eight interleaved MXFP4 rows · three activation rows.
    #[inline]
    pub(crate) fn dot_mxfp4_r8_x3(w: &[BlockMxfp4x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        mxfp4_r8_n!(3, w, xs, mxfp4_rows_isums)
    }

    /// Eight interleaved MXFP4 rows · four activation rows.
    #[inline]
    pub(crate) fn dot_mxfp4_r8_x4(w: &[BlockMxfp4x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        mxfp4_r8_n!(4, w, xs, mxfp4_rows_isums)
    }
);

isa_features!(
    /// The int8 peak (`Kernels::int8_peak`): the kernels' 16-weight step
    /// (`dot16`: two `vpmaddubsw`, `vpaddw`, `vpmaddwd` by ones, `vpaddd`:
    /// 64 products)
    /// in independent chains (`peak_asm!`).
    pub(crate) fn int8_peak(rounds: usize) -> (u64, i32) {
        let (u, s, ones) = (_mm256_set1_epi8(3), _mm256_set1_epi8(-2), _mm256_set1_epi16(1));
        let mut a = [_mm256_setzero_si256(); 8];
        let n = rounds.max(1);
        peak_asm!(
            n,
            ymm_reg,
            (u, s, ones),
            a[a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6, a7 = 7],
            ".irp acc, {a0:y}, {a1:y}, {a2:y}, {a3:y}, {a4:y}, {a5:y}, {a6:y}, {a7:y}",
            [
            "vpmaddubsw {t0:y}, {u:y}, {s:y}",
            "vpmaddubsw {t1:y}, {u:y}, {s:y}",
            "vpaddw {t0:y}, {t0:y}, {t1:y}",
            "vpmaddwd {t0:y}, {t0:y}, {ones:y}",
            "vpaddd \\acc, \\acc, {t0:y}"
            ]
        );
        let h = |x, y| _mm256_add_epi32(x, y);
        let v = h(h(h(a[0], a[1]), h(a[2], a[3])), h(h(a[4], a[5]), h(a[6], a[7])));
        ((n * 8 * 64) as u64, hsum_i32(v))
    }
);
