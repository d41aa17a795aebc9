//! AVX2 K-quant dots: Q4_K, Q5_K and Q6_K super-blocks of 256 weights
//! against quantised activations, one token or four, in `portable`'s float
//! order bit for bit. The algorithm is written once here (`kmin_dot_n!`,
//! `q6k_dot_n!`) and shared with the AVX-512 VNNI build, which hands it
//! `vpdpbusd` as the 32-byte u8 × i8 block dot instead of `vpmaddubsw` +
//! `vpmaddwd`.
//!
//! One super-block is one step and one __m256 of eight f32 lanes: its
//! sub-block j (32 weights) meets activation block 8·s + j, whose share
//! goes into lane j, as `portable` adds it into partial sum j.
//!
//! * The weights are unpacked once per super-block (for all tokens of the
//!   x4 form) into eight vectors of 32 unsigned codes, one per sub-block:
//!   Q4_K nibbles 0..15, Q5_K 5-bit codes 0..31 (nibble | bit j of `qh`
//!   shifted to bit 4), Q6_K 6-bit codes 0..63 (nibble | two bits of `qh`
//!   shifted to bits 4, 5).
//! * Per token and sub-block, `block_dot(codes, quants)` gives eight i32
//!   lanes, lane k = Σ of the products of bytes 4k..4k+4 (both block dots
//!   have this layout), and a transpose-add tree (`int8::reduce8`) turns the
//!   eight sub-blocks' vectors into one vector whose lane j is sub-block j's
//!   Σ q·q_x.
//! * Q4_K / Q5_K: S = sc·Σ q·q_x and M = m·Σ q_x (the activation blocks'
//!   sums) as i32 lanes (`vpmulld`), then lane j += (d·d_x)·S − (dmin·d_x)·M,
//!   every product rounded on its own and no FMA (`k_min_fold`), as
//!   `portable::k_min_term`.
//! * Q6_K: per sub-block the block dot of the codes minus that of 32s gives
//!   Σ (q − 32)·q_x per four bytes; lanes 0..4 belong to group 2j (bytes
//!   0..16), lanes 4..8 to group 2j + 1, so a transpose-add tree that keeps
//!   the 128-bit halves apart (`reduce8_groups`) gives the even and the odd
//!   groups' sums, S = sc[2j]·even + sc[2j+1]·odd (`vpmulld`, then add),
//!   and lane j += (d·d_x)·S (`k_fold`).
//! * The eight lanes are combined as `portable::combine8` (`hsum`).
//!
//! Integer exactness. Activation quants are any i8 (|q_x| ≤ 128), codes are
//! unsigned below 64. `vpmaddubsw` adds two u8 × i8 products into an i16
//! and saturates above 32767: a pair is at most 2·15·128 = 3840 (Q4_K),
//! 2·31·128 = 7936 (Q5_K), 2·63·128 = 16128 (Q6_K codes) or 2·32·128 = 8192
//! (Q6_K's 32s), so it never saturates; `vpmaddwd` by ones and `vpdpbusd`
//! widen to i32 without loss. The sums then: Q4_K / Q5_K |Σ q·q_x| ≤
//! 32·31·128, times sc ≤ 63 below 2^23; |M| ≤ 63·32·128; Q6_K |Σ_16 (q −
//! 32)·q_x| ≤ 16·32·128 = 2^16, times |sc| ≤ 128, two of them: ≤ 2^24. All
//! i32 arithmetic is exact, so S and M are `portable`'s integers, and their
//! conversions to f32 (round to nearest in both) the same floats.
//!
//! Activation rows with contiguous scales and sums (`ActRef::has_side`)
//! load eight of each at once; plain blocks give theirs one by one into the
//! same vectors, so both take the same float operations.

use core::arch::x86_64::*;

use super::int8::{ld32, ld8};
use super::ld;
use crate::quant::{ActRef, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8Act};

/// Q4_K / Q5_K weights · Q8 activations for N activation rows (module doc):
/// per super-block `|$b| codes` (`$b` the `BlockQ4K` / `BlockQ5K`) unpacks
/// the eight sub-blocks' codes once, `$block_dot(codes, quants)` gives a
/// sub-block's exact sums in eight i32 lanes. Result t is the single-row
/// dot of `xs[t]`, bit for bit (the same operations on the same values).
/// Shared by the AVX2 and AVX-512 VNNI kernels; a macro, so that all of it
/// is inlined into the kernel.
macro_rules! kmin_dot_n {
    ($n:tt, $w:expr, $xs:expr, |$b:ident| $codes:expr, $block_dot:expr $(,)?) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::hsum;
        use $crate::kernels::x86_64::avx2::int8::{ld32, reduce8};
        use $crate::kernels::x86_64::avx2::kquant::{act8, f16x8, k4_scales, k_min_fold};
        use $crate::quant::{ActRef, BlockQ8Act};
        let w = $w;
        let xs: [ActRef; $n] = $xs;
        let block_dot = $block_dot;
        let side = unroll!($n, |t| xs[t].has_side());
        let mut acc = [_mm256_setzero_ps(); $n];
        // (a plain loop and `unroll!`, no iterator adapters with closures:
        // those would not be inlined into the target-feature function)
        for (s, $b) in w.iter().enumerate() {
            let codes: [__m256i; 8] = $codes;
            let (sc, mn) = k4_scales(&$b.scales);
            let (d, dmin) = (f16x8($b.d), f16x8($b.dmin));
            acc = unroll!($n, |t| {
                let xb: &[BlockQ8Act; 8] = xs[t].blocks()[8 * s..8 * s + 8].try_into().unwrap();
                let v = unroll!(8, |j| block_dot(codes[j], ld32(&xb[j].qs)));
                let (dx, sums) = act8(xs[t], xb, 8 * s, side[t]);
                let isum = _mm256_mullo_epi32(sc, reduce8(v));
                k_min_fold(acc[t], isum, _mm256_mullo_epi32(mn, sums), d, dmin, dx)
            });
        }
        unroll!($n, |t| hsum(acc[t]))
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use kmin_dot_n;

/// Q6_K weights · Q8 activations for N activation rows (module doc), as
/// `kmin_dot_n!`: per sub-block Σ (q − 32)·q_x as `$block_dot(codes, q_x)`
/// − `$block_dot(32s, q_x)`, the groups' sums kept apart, times their
/// scales. Shared by the AVX2 and AVX-512 VNNI kernels.
macro_rules! q6k_dot_n {
    ($n:tt, $w:expr, $xs:expr, $block_dot:expr $(,)?) => {{
        use core::arch::x86_64::*;
        use $crate::kernels::x86_64::avx2::hsum;
        use $crate::kernels::x86_64::avx2::int8::ld32;
        use $crate::kernels::x86_64::avx2::kquant::{act_d8, f16x8, k_fold, q6k_codes, q6k_scales, reduce8_groups};
        use $crate::quant::{ActRef, BlockQ8Act};
        let w = $w;
        let xs: [ActRef; $n] = $xs;
        let block_dot = $block_dot;
        let side = unroll!($n, |t| xs[t].has_side());
        let c32 = _mm256_set1_epi8(32);
        let mut acc = [_mm256_setzero_ps(); $n];
        for (s, b) in w.iter().enumerate() {
            let codes = q6k_codes(b);
            let (sc_even, sc_odd) = q6k_scales(&b.scales);
            let d = f16x8(b.d);
            acc = unroll!($n, |t| {
                let xb: &[BlockQ8Act; 8] = xs[t].blocks()[8 * s..8 * s + 8].try_into().unwrap();
                let v = unroll!(8, |j| {
                    let q = ld32(&xb[j].qs);
                    _mm256_sub_epi32(block_dot(codes[j], q), block_dot(c32, q))
                });
                let (even, odd) = reduce8_groups(v);
                let isum = _mm256_add_epi32(_mm256_mullo_epi32(sc_even, even), _mm256_mullo_epi32(sc_odd, odd));
                k_fold(acc[t], isum, d, act_d8(xs[t], xb, 8 * s, side[t]))
            });
        }
        unroll!($n, |t| hsum(acc[t]))
    }};
}
#[allow(unused_imports)] // used by the AVX-512 VNNI build
pub(crate) use q6k_dot_n;

/// 32 bytes of `v` from `off` as one vector.
#[inline(always)]
fn chunk32(v: &[u8], off: usize) -> &[u8; 32] {
    v[off..off + 32].try_into().unwrap()
}

isa_features!(
    /// An f16 broadcast to eight f32 lanes (exact).
    #[inline]
    pub(crate) fn f16x8(h: half::f16) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16))
    }

    /// Q4_K / Q5_K's eight 6-bit scales and eight mins (`quant::scales_mins_k4`)
    /// as i32 lanes: the 12 bytes as three u32 words, rearranged so that two
    /// words hold the eight scales and two the eight mins, one per byte.
    #[inline]
    pub(crate) fn k4_scales(s: &[u8; 12]) -> (__m256i, __m256i) {
        let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
        let (u0, u1, u2) = (u(0), u(1), u(2));
        let (low6, low4, top2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        // per byte i < 4: sc[i] = s[i] & 63, sc[4 + i] = (s[8 + i] & 15) | (s[i] >> 6) << 4,
        // mn[i] = s[4 + i] & 63, mn[4 + i] = (s[8 + i] >> 4) | (s[4 + i] >> 6) << 4
        // (the u32 shifts move bits between bytes only where the masks drop them)
        let sc = (u0 & low6) as u64 | (((u2 & low4) | (((u0 >> 6) & top2) << 4)) as u64) << 32;
        let mn = (u1 & low6) as u64 | ((((u2 >> 4) & low4) | (((u1 >> 6) & top2) << 4)) as u64) << 32;
        let widen = |v: u64| _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64));
        (widen(sc), widen(mn))
    }

    /// Activation blocks b..b + 8 (`xb`)' scales as f32 lanes and sums as
    /// i32 lanes: from the contiguous arrays when `side`, else block by block.
    #[inline]
    pub(crate) fn act8(x: ActRef, xb: &[BlockQ8Act; 8], b: usize, side: bool) -> (__m256, __m256i) {
        if side {
            (act_d8(x, xb, b, side), ld8(x.sum, b, 8))
        } else {
            let s = |j: usize| xb[j].sum;
            (act_d8(x, xb, b, side), _mm256_setr_epi32(s(0), s(1), s(2), s(3), s(4), s(5), s(6), s(7)))
        }
    }

    /// Activation blocks b..b + 8 (`xb`)' scales as f32 lanes (as `act8`).
    #[inline]
    pub(crate) fn act_d8(x: ActRef, xb: &[BlockQ8Act; 8], b: usize, side: bool) -> __m256 {
        if side {
            ld(&x.d[b..b + 8])
        } else {
            let d = |j: usize| xb[j].d;
            _mm256_setr_ps(d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(7))
        }
    }

    /// lane j += (d·d_x)·S − (dmin·d_x)·M, each product rounded, no FMA
    /// (`portable::k_min_term`).
    #[inline]
    pub(crate) fn k_min_fold(acc: __m256, s: __m256i, m: __m256i, d: __m256, dmin: __m256, dx: __m256) -> __m256 {
        let a = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(s));
        let b = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(m));
        _mm256_add_ps(acc, _mm256_sub_ps(a, b))
    }

    /// lane j += (d·d_x)·S, no FMA (`portable`'s Q6_K step).
    #[inline]
    pub(crate) fn k_fold(acc: __m256, s: __m256i, d: __m256, dx: __m256) -> __m256 {
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(s)))
    }

    /// A Q4_K super-block's eight sub-blocks' codes: sub-block 2c is the low
    /// nibbles of `qs[32c..32c + 32]`, 2c + 1 the high ones.
    #[inline]
    pub(crate) fn q4k_codes(b: &BlockQ4K) -> [__m256i; 8] {
        nibble_codes(&b.qs)
    }

    /// `q4k_codes` of the nibbles `qs` (Q4_K's and Q5_K's layout).
    #[inline]
    fn nibble_codes(qs: &[u8; 128]) -> [__m256i; 8] {
        let m = _mm256_set1_epi8(0x0f);
        let q = unroll!(4, |c| ld32(chunk32(qs, 32 * c)));
        let lo = |v| _mm256_and_si256(v, m);
        let hi = |v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
        [lo(q[0]), hi(q[0]), lo(q[1]), hi(q[1]), lo(q[2]), hi(q[2]), lo(q[3]), hi(q[3])]
    }

    /// A Q5_K super-block's eight sub-blocks' codes: Q4_K's nibbles with bit
    /// j of `qh[l]` as bit 4. With h = `qh` shifted right by 2c in 16-bit
    /// lanes, bits 0 and 1 of every byte are its bits 2c and 2c + 1 (2c + 1
    /// < 8: nothing from the neighbouring byte), moved to bit 4 by a left
    /// shift of 4 or 3 within the byte.
    #[inline]
    pub(crate) fn q5k_codes(b: &BlockQ5K) -> [__m256i; 8] {
        let n = nibble_codes(&b.qs);
        let h = ld32(&b.qh);
        let h = [h, _mm256_srli_epi16::<2>(h), _mm256_srli_epi16::<4>(h), _mm256_srli_epi16::<6>(h)];
        let bit4 = _mm256_set1_epi8(0x10);
        let lo = |c: usize| _mm256_and_si256(_mm256_slli_epi16::<4>(h[c]), bit4);
        let hi = |c: usize| _mm256_and_si256(_mm256_slli_epi16::<3>(h[c]), bit4);
        let or = |a, b| _mm256_or_si256(a, b);
        [
            or(n[0], lo(0)),
            or(n[1], hi(0)),
            or(n[2], lo(1)),
            or(n[3], hi(1)),
            or(n[4], lo(2)),
            or(n[5], hi(2)),
            or(n[6], lo(3)),
            or(n[7], hi(3)),
        ]
    }

    /// A Q6_K super-block's eight sub-blocks' codes (`quant::q6k_code`):
    /// sub-block 4h + r takes the low (r < 2) or high nibbles of
    /// `ql[64h + 32·(r mod 2)..]` and bits 2r, 2r + 1 of `qh[32h..]` as bits
    /// 4, 5 (shifts within 16-bit lanes, the bits crossing bytes masked off).
    #[inline]
    pub(crate) fn q6k_codes(b: &BlockQ6K) -> [__m256i; 8] {
        let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
        let and = |a, b| _mm256_and_si256(a, b);
        let or = |a, b| _mm256_or_si256(a, b);
        let part = |h: usize| {
            let (a, c) = (ld32(chunk32(&b.ql, 64 * h)), ld32(chunk32(&b.ql, 64 * h + 32)));
            let q = ld32(chunk32(&b.qh, 32 * h));
            [
                or(and(a, m4), and(_mm256_slli_epi16::<4>(q), m2)),
                or(and(c, m4), and(_mm256_slli_epi16::<2>(q), m2)),
                or(and(_mm256_srli_epi16::<4>(a), m4), and(q, m2)),
                or(and(_mm256_srli_epi16::<4>(c), m4), and(_mm256_srli_epi16::<2>(q), m2)),
            ]
        };
        let (p, q) = (part(0), part(1));
        [p[0], p[1], p[2], p[3], q[0], q[1], q[2], q[3]]
    }

    /// Q6_K's sixteen group scales as i32 lanes: (groups 0, 2, .., 14; groups 1, 3, .., 15).
    #[inline]
    pub(crate) fn q6k_scales(s: &[i8; 16]) -> (__m256i, __m256i) {
        // SAFETY: `s` points to 16 readable bytes; loadu needs no alignment.
        let v = unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) };
        let v = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
        (_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)))
    }

    /// Eight sub-blocks' i32 vectors (lanes 0..4 group 2j's partial sums,
    /// 4..8 group 2j + 1's) → (lane j = group 2j's sum, lane j = group
    /// 2j + 1's), exact: `int8::reduce8` without its final add of the halves.
    #[inline]
    pub(crate) fn reduce8_groups(v: [__m256i; 8]) -> (__m256i, __m256i) {
        let h = |a, b| _mm256_hadd_epi32(a, b);
        let a = h(h(v[0], v[1]), h(v[2], v[3])); // [sub-blocks 0..4's even groups | their odd groups]
        let b = h(h(v[4], v[5]), h(v[6], v[7]));
        (_mm256_permute2x128_si256::<0x20>(a, b), _mm256_permute2x128_si256::<0x31>(a, b))
    }

    /// A block's 32 u8 × i8 products in eight exact i32 lanes (lane k: bytes
    /// 4k..4k + 4): `vpmaddubsw` pairs (never saturating here, module doc),
    /// `vpmaddwd` by ones.
    #[inline]
    fn block_dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// Q4_K weights · Q8 activations (module doc).
    #[inline]
    pub(crate) fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kmin_dot_n!(1, w, [x], |b| q4k_codes(b), |u, s| block_dot(u, s))[0]
    }

    /// Q5_K weights · Q8 activations (module doc).
    #[inline]
    pub(crate) fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        kmin_dot_n!(1, w, [x], |b| q5k_codes(b), |u, s| block_dot(u, s))[0]
    }

    /// Q6_K weights · Q8 activations (module doc).
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
);
