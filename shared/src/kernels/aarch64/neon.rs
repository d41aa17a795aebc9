//! AArch64 NEON (Advanced SIMD) kernels: the AArch64 baseline, so this module
//! is compiled on every AArch64 build (the dotprod, i8mm and SVE builds reuse
//! its f32 half and its block-folding code).
//!
//! Int8 dots widen with `smull`/`smull2` (i8 × i8 → i16, exact) and
//! pairwise-accumulate into i32 lanes with `sadalp`, so every block's integer
//! sum is exact. Q4 nibbles are turned into signed `nibble − 8` before the
//! multiply, which gives the same exact integer as `portable`'s
//! Σ nibble·q − 8·Σq. The K-quant dots are `kquant`'s with `dot16`
//! (`smull` + `sadalp` over 16 bytes) as the int8 dot.
//!
//! Cross-build identity: reductions follow `portable`'s order exactly
//! (quantised dots: acc[i % 8] += (d_w·d_x)·isum, multiply then add; f32
//! dots: eight partial sums as two 4-lane vectors; the lanes combined as
//! `portable::combine8`) and no fused multiply-add is used anywhere (on
//! AArch64 `vmlaq_f32`/`vfmaq_f32` would be `fmla`, one rounding instead of
//! two), so dots, rmsnorm and axpy are bit-identical to `portable` and to the
//! x86 builds. exp (`exp4`) is the x86 modules' Cephes polynomial computed by
//! the same operation sequence as `sse2::exp4` (round-to-nearest-even
//! conversion, same constants and order), so softmax, SiLU and GELU give the
//! same bits as the x86 builds, and a model's logits are byte-identical across
//! x86-64 and AArch64.

use crate::kernels::Kernels;

/// The AArch64 NEON kernel set (every AArch64 CPU).
pub struct Neon;

impl Kernels for Neon {
    entry_points!(imp: f32_ops);
    entry_points!(imp: int8_dots, int8_dots_x4, mxfp4_dots);
    entry_points!(imp: kquant_dots, kquant_dots_x4);
}

/// The quantised dots of an AArch64 set that sums blocks with
/// `sum_blocks_n` and K-quant sub-blocks with `kquant`: `dot_q8`, `dot_q4`,
/// `dot_mxfp4` (one row) and `dot_q8_x4`, `dot_q4_x4`, `dot_mxfp4_x4` (four
/// rows, each weight block loaded once) with `$dot32` as one block's 32
/// products in four i32 lanes;
/// `dot_q4k`, `dot_q5k`, `dot_q6k` and their `_x4` forms (each super-block's
/// codes unpacked once for the four rows) with `$dot16` as the 16-byte dot.
/// Every row's result is the one-row bits. The NEON (`smull` + `sadalp`) and
/// dotprod (`sdot`) sets differ only in those two.
macro_rules! quantised_dots {
    ($dot32:ident, $dot16:ident) => {
        isa_features!(
            /// Q8 weights · Q8 activations: exact per-block integer sums,
            /// scaled and summed in `portable`'s order (bit-identical).
            #[inline]
            pub(crate) fn dot_q8<B: $crate::quant::Q8Block>(w: &[B], x: $crate::quant::ActRef) -> f32 {
                debug_assert_eq!(w.len(), x.len());
                $crate::kernels::aarch64::neon::imp::dot_q8_with(w, [x], |a, b| $dot32(a, b))[0]
            }

            /// Q4 weights · Q8 activations: Σ (nibble − 8)·q per block (exact), scaled as `dot_q8`.
            #[inline]
            pub(crate) fn dot_q4<B: $crate::quant::Q4Block>(w: &[B], x: $crate::quant::ActRef) -> f32 {
                debug_assert_eq!(w.len(), x.len());
                $crate::kernels::aarch64::neon::imp::dot_q4_with(w, [x], |a, b| $dot32(a, b))[0]
            }

            /// `dot_q8` of one weight row with four activation rows.
            #[inline]
            pub(crate) fn dot_q8_x4<B: $crate::quant::Q8Block>(w: &[B], xs: [$crate::quant::ActRef; 4]) -> [f32; 4] {
                $crate::kernels::aarch64::neon::imp::dot_q8_with(w, xs, |a, b| $dot32(a, b))
            }

            /// `dot_q4` of one weight row with four activation rows.
            #[inline]
            pub(crate) fn dot_q4_x4<B: $crate::quant::Q4Block>(w: &[B], xs: [$crate::quant::ActRef; 4]) -> [f32; 4] {
                $crate::kernels::aarch64::neon::imp::dot_q4_with(w, xs, |a, b| $dot32(a, b))
            }

            /// MXFP4 weights · Q8 activations: the values looked up into int8
            /// (`mxfp4_halves`), then as `dot_q8`.
            #[inline]
            pub(crate) fn dot_mxfp4(w: &[$crate::quant::BlockMxfp4], x: $crate::quant::ActRef) -> f32 {
                debug_assert_eq!(w.len(), x.len());
                $crate::kernels::aarch64::neon::imp::dot_mxfp4_with(w, [x], |a, b| $dot32(a, b))[0]
            }

            /// `dot_mxfp4` of one weight row with four activation rows.
            #[inline]
            pub(crate) fn dot_mxfp4_x4(w: &[$crate::quant::BlockMxfp4], xs: [$crate::quant::ActRef; 4]) -> [f32; 4] {
                $crate::kernels::aarch64::neon::imp::dot_mxfp4_with(w, xs, |a, b| $dot32(a, b))
            }

            /// Q4_K weights · Q8 activations (`kquant`).
            #[inline]
            pub(crate) fn dot_q4k(w: &[$crate::quant::BlockQ4K], x: $crate::quant::ActRef) -> f32 {
                $crate::kernels::aarch64::kquant::dot_q4k_with(w, [x], |acc, a, b| $dot16(acc, a, b))[0]
            }

            /// Q5_K weights · Q8 activations (`kquant`).
            #[inline]
            pub(crate) fn dot_q5k(w: &[$crate::quant::BlockQ5K], x: $crate::quant::ActRef) -> f32 {
                $crate::kernels::aarch64::kquant::dot_q5k_with(w, [x], |acc, a, b| $dot16(acc, a, b))[0]
            }

            /// Q6_K weights · Q8 activations (`kquant`).
            #[inline]
            pub(crate) fn dot_q6k(w: &[$crate::quant::BlockQ6K], x: $crate::quant::ActRef) -> f32 {
                $crate::kernels::aarch64::kquant::dot_q6k_with(w, [x], |acc, a, b| $dot16(acc, a, b))[0]
            }

            /// `dot_q4k` of one weight row with four activation rows.
            #[inline]
            pub(crate) fn dot_q4k_x4(w: &[$crate::quant::BlockQ4K], xs: [$crate::quant::ActRef; 4]) -> [f32; 4] {
                $crate::kernels::aarch64::kquant::dot_q4k_with(w, xs, |acc, a, b| $dot16(acc, a, b))
            }

            /// `dot_q5k` of one weight row with four activation rows.
            #[inline]
            pub(crate) fn dot_q5k_x4(w: &[$crate::quant::BlockQ5K], xs: [$crate::quant::ActRef; 4]) -> [f32; 4] {
                $crate::kernels::aarch64::kquant::dot_q5k_with(w, xs, |acc, a, b| $dot16(acc, a, b))
            }

            /// `dot_q6k` of one weight row with four activation rows.
            #[inline]
            pub(crate) fn dot_q6k_x4(w: &[$crate::quant::BlockQ6K], xs: [$crate::quant::ActRef; 4]) -> [f32; 4] {
                $crate::kernels::aarch64::kquant::dot_q6k_with(w, xs, |acc, a, b| $dot16(acc, a, b))
            }
        );
    };
}
#[allow(unused_imports)] // used by the dotprod build
pub(crate) use quantised_dots;

pub mod imp {
    use crate::kernels::portable::combine8;
    use crate::kernels::portable::f16_bits_to_f32;
    use crate::quant::{e8m0_half_bits, ActRef, BlockMxfp4, Q4Block, Q8Block, MXFP4_VALUES, QK};
    use core::arch::aarch64::*;
    use half::f16;

    quantised_dots!(dot32, dot16);

    isa_features!(
        /// Four f32 as a vector.
        #[inline]
        pub(crate) fn ld(c: &[f32]) -> float32x4_t {
            let c: &[f32; 4] = c.try_into().unwrap();
            // SAFETY: `c` is a reference to 4 readable f32; `ld1` needs only f32 alignment.
            unsafe { vld1q_f32(c.as_ptr()) }
        }

        #[inline]
        pub(crate) fn st(c: &mut [f32], v: float32x4_t) {
            let c: &mut [f32; 4] = c.try_into().unwrap();
            // SAFETY: `c` is a unique reference to 4 writable f32; `st1` needs only f32 alignment.
            unsafe { vst1q_f32(c.as_mut_ptr(), v) }
        }

        /// Four i32 as a vector (the SVE block sums, the K-quant activation sums).
        #[inline]
        pub(crate) fn ld_i32(c: &[i32]) -> int32x4_t {
            let c: &[i32; 4] = c.try_into().unwrap();
            // SAFETY: `c` is a reference to 4 readable i32; `ld1` needs only i32 alignment.
            unsafe { vld1q_s32(c.as_ptr()) }
        }

        /// 16 bytes (i8 or u8) as a signed byte vector.
        #[inline]
        pub(crate) fn ld16<T: Copy>(c: &[T; 16]) -> int8x16_t {
            assert_eq!(core::mem::size_of::<T>(), 1);
            // SAFETY: `c` points to 16 readable bytes (T is one byte, asserted); `ld1` of bytes needs no alignment.
            unsafe { vld1q_s8(c.as_ptr() as *const i8) }
        }

        /// The two 16-byte halves of a block of 32 i8 quants.
        #[inline]
        pub(crate) fn q8_halves(q: &[i8; QK]) -> [int8x16_t; 2] {
            [ld16(q[..16].try_into().unwrap()), ld16(q[16..].try_into().unwrap())]
        }

        /// A Q4 block's 16 nibble bytes as signed `nibble − 8`: elements 0..16
        /// (low nibbles) and 16..32 (high nibbles).
        #[inline]
        pub(crate) fn q4_halves(n: &[u8; QK / 2]) -> [int8x16_t; 2] {
            let n = vreinterpretq_u8_s8(ld16(n));
            let eight = vdupq_n_s8(8);
            let lo = vreinterpretq_s8_u8(vandq_u8(n, vdupq_n_u8(0x0f)));
            let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(n));
            [vsubq_s8(lo, eight), vsubq_s8(hi, eight)]
        }

        /// An MXFP4 block's 32 values (`quant::MXFP4_VALUES`) as int8:
        /// elements 0..16 and 16..32, the nibbles looked up with `tbl`.
        #[inline]
        pub(crate) fn mxfp4_halves(b: &BlockMxfp4) -> [int8x16_t; 2] {
            let (table, n) = (ld16(&MXFP4_VALUES), vreinterpretq_u8_s8(ld16(&b.qs)));
            [vqtbl1q_s8(table, vandq_u8(n, vdupq_n_u8(0x0f))), vqtbl1q_s8(table, vshrq_n_u8::<4>(n))]
        }

        /// Σ of the 32 products w·x of one block in four i32 lanes (exact:
        /// each i8·i8 product fits i16, pairs are widened before they are added).
        #[inline]
        pub(crate) fn dot32(w: [int8x16_t; 2], x: [int8x16_t; 2]) -> int32x4_t {
            let a = vpaddlq_s16(vmull_s8(vget_low_s8(w[0]), vget_low_s8(x[0])));
            let a = vpadalq_s16(a, vmull_high_s8(w[0], x[0]));
            let a = vpadalq_s16(a, vmull_s8(vget_low_s8(w[1]), vget_low_s8(x[1])));
            vpadalq_s16(a, vmull_high_s8(w[1], x[1]))
        }

        /// acc + the 16 products a[k]·b[k] in four i32 lanes: `smull`/`smull2`
        /// (i8 × i8 → i16, exact: |a·b| ≤ 2^14) and `sadalp` (pairs widened
        /// to i32 before they are added).
        #[inline]
        pub(crate) fn dot16(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            vpadalq_s16(acc, vmull_high_s8(a, b))
        }

        /// Four vectors of per-block i32 partial sums → the four block sums in order (exact).
        #[inline]
        pub(crate) fn reduce4(v: [int32x4_t; 4]) -> int32x4_t {
            vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]))
        }

        /// Exact f16 → f32 of four halves (zero-extended in u32 lanes), as
        /// `f16_bits_to_f32`: the magnitude bits moved into f32 position and
        /// multiplied by 2^112, infinities and NaNs (quieted) patched in.
        #[inline]
        pub(crate) fn cvt_f16x4(h: uint32x4_t) -> float32x4_t {
            let rest = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7fff)));
            let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
            let v =
                vreinterpretq_u32_f32(vmulq_f32(vreinterpretq_f32_u32(rest), vdupq_n_f32(f32::from_bits(0x7780_0000))));
            let special = vcgtq_u32(rest, vdupq_n_u32(0x0f7f_ffff)); // exponent all ones
            let nan = vandq_u32(vcgtq_u32(rest, vdupq_n_u32(0x0f80_0000)), vdupq_n_u32(0x0040_0000));
            let inf_nan = vorrq_u32(vorrq_u32(rest, vdupq_n_u32(0x7f80_0000)), nan);
            vreinterpretq_f32_u32(vorrq_u32(vbslq_u32(special, inf_nan, v), sign))
        }

        /// Four f16 as f32 (exact).
        #[inline]
        fn ld_f16x4(c: &[f16]) -> float32x4_t {
            let c: &[f16; 4] = c.try_into().unwrap();
            // SAFETY: `c` points to 4 readable f16 (8 bytes, `half::f16` is a transparent u16); `ld1` needs only u16 alignment.
            let h = unsafe { vld1_u16(c.as_ptr() as *const u16) };
            cvt_f16x4(vmovl_u16(h))
        }

        /// A weight block's scale from `scale_bits` (f16 when `f16`, else f32), exact.
        #[inline]
        pub(crate) fn scale_of(f16: bool, bits: u32) -> f32 {
            if f16 {
                f16_bits_to_f32(bits as u16)
            } else {
                f32::from_bits(bits)
            }
        }

        /// Eight weight scales as f32 lanes 0..4, 4..8 from their bits (f16 when `f16`).
        #[inline]
        pub(crate) fn scales8(f16: bool, bits: impl Fn(usize) -> u32) -> [float32x4_t; 2] {
            let mut b = [0u32; 8];
            for (j, v) in b.iter_mut().enumerate() {
                *v = bits(j);
            }
            // SAFETY: `b` is 8 readable u32; each load reads 4 of them.
            let (lo, hi) = unsafe { (vld1q_u32(b.as_ptr()), vld1q_u32(b[4..].as_ptr())) };
            if f16 {
                [cvt_f16x4(lo), cvt_f16x4(hi)]
            } else {
                [vreinterpretq_f32_u32(lo), vreinterpretq_f32_u32(hi)]
            }
        }

        /// Activation scales of blocks i..i+8: from the contiguous array when the
        /// `ActRef` has one, else gathered from the blocks (the same values).
        #[inline]
        fn act_scales8(x: ActRef, i: usize) -> [float32x4_t; 2] {
            if x.has_side() {
                [ld(&x.d[i..i + 4]), ld(&x.d[i + 4..i + 8])]
            } else {
                let mut d = [0.0f32; 8];
                for (j, v) in d.iter_mut().enumerate() {
                    *v = x.blocks()[i + j].d;
                }
                [ld(&d[..4]), ld(&d[4..])]
            }
        }

        /// Σ_b (d_w·d_x)·isum_b over `n` blocks in `portable`'s order, for N
        /// activation rows: block b into lane b % 8 (lanes 0..4 and 4..8 of
        /// two vectors; multiply, multiply, then add, no FMA), the lanes
        /// combined as `portable::combine8`. Eight blocks per step:
        /// `isums8(i)` gives each row's exact integer sums of blocks i..i+8
        /// (Q4 offset included) as lanes 0..4, 4..8 (so that a caller can
        /// load each weight block once for all N rows) and `bits(b)` weight
        /// block b's scale bits (f16 when `f16`); the last n % 8 blocks go one
        /// by one into their lanes with the same scalar operations, `one(b)`
        /// giving each row's exact integer sum of block b. Row t's result is
        /// the same operations as for row t alone.
        #[inline]
        pub(crate) fn sum_blocks_n<const N: usize>(
            n: usize,
            xs: [ActRef; N],
            f16: bool,
            bits: impl Fn(usize) -> u32,
            mut isums8: impl FnMut(usize) -> [[int32x4_t; 2]; N],
            mut one: impl FnMut(usize) -> [i32; N],
        ) -> [f32; N] {
            let mut acc = [[vdupq_n_f32(0.0); 2]; N];
            let mut i = 0;
            while i + 8 <= n {
                let s = isums8(i);
                let dw = scales8(f16, |j| bits(i + j));
                for ((acc, x), s) in acc.iter_mut().zip(&xs).zip(&s) {
                    let dx = act_scales8(*x, i);
                    for h in 0..2 {
                        let d = vmulq_f32(dw[h], dx[h]);
                        acc[h] = vaddq_f32(acc[h], vmulq_f32(d, vcvtq_f32_s32(s[h])));
                    }
                }
                i += 8;
            }
            let mut lanes = [[0.0f32; 8]; N];
            for (l, a) in lanes.iter_mut().zip(&acc) {
                st(&mut l[..4], a[0]);
                st(&mut l[4..], a[1]);
            }
            for b in i..n {
                let isum = one(b);
                for ((l, x), &v) in lanes.iter_mut().zip(&xs).zip(&isum) {
                    l[b % 8] += (scale_of(f16, bits(b)) * x.blocks()[b].d) * v as f32;
                }
            }
            lanes.map(combine8)
        }

        /// Σ_b (d_w·d_x)·(Σ w·x) over `n` blocks for N activation rows
        /// (`sum_blocks_n`), `wq(b)` giving weight block b as signed bytes
        /// (two 16-byte halves, made once for the N rows) and `blk(w, x)` one
        /// block's products summed in four i32 lanes.
        #[inline]
        fn dot_blocks<const N: usize>(
            n: usize,
            xs: [ActRef; N],
            f16: bool,
            bits: impl Fn(usize) -> u32,
            wq: impl Fn(usize) -> [int8x16_t; 2],
            blk: impl Fn([int8x16_t; 2], [int8x16_t; 2]) -> int32x4_t,
        ) -> [f32; N] {
            let xb = xs.map(|x| x.blocks());
            sum_blocks_n(
                n,
                xs,
                f16,
                bits,
                |i| {
                    let w: [[int8x16_t; 2]; 8] = unroll!(8, |j| wq(i + j));
                    xb.map(|xb| {
                        let one = |j: usize| blk(w[j], q8_halves(&xb[i + j].qs));
                        [reduce4([one(0), one(1), one(2), one(3)]), reduce4([one(4), one(5), one(6), one(7)])]
                    })
                },
                |b| {
                    let w = wq(b);
                    xb.map(|xb| vaddvq_s32(blk(w, q8_halves(&xb[b].qs))))
                },
            )
        }

        /// `dot_q8` with `blk(w, x)` giving one block's products summed in four i32 lanes.
        #[inline]
        pub(crate) fn dot_q8_with<B: Q8Block, const N: usize>(
            w: &[B],
            xs: [ActRef; N],
            blk: impl Fn([int8x16_t; 2], [int8x16_t; 2]) -> int32x4_t,
        ) -> [f32; N] {
            let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
            dot_blocks(n, xs, B::F16_SCALE, |b| w[b].scale_bits(), |b| q8_halves(w[b].quants()), blk)
        }

        /// `dot_mxfp4` with `blk(w, x)` as in `dot_q8_with` (weights as their
        /// looked-up values, the E8M0 scales as f32 bits).
        #[inline]
        pub(crate) fn dot_mxfp4_with<const N: usize>(
            w: &[BlockMxfp4],
            xs: [ActRef; N],
            blk: impl Fn([int8x16_t; 2], [int8x16_t; 2]) -> int32x4_t,
        ) -> [f32; N] {
            let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
            dot_blocks(n, xs, false, |b| e8m0_half_bits(w[b].e), |b| mxfp4_halves(&w[b]), blk)
        }

        /// `dot_q4` with `blk(w, x)` as in `dot_q8_with` (weights as `nibble − 8`).
        #[inline]
        pub(crate) fn dot_q4_with<B: Q4Block, const N: usize>(
            w: &[B],
            xs: [ActRef; N],
            blk: impl Fn([int8x16_t; 2], [int8x16_t; 2]) -> int32x4_t,
        ) -> [f32; N] {
            let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
            dot_blocks(n, xs, B::F16_SCALE, |b| w[b].scale_bits(), |b| q4_halves(w[b].nibbles()), blk)
        }

        /// ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)) of lanes 0..4 in
        /// `lo` and 4..8 in `hi`: `portable::combine8`.
        #[inline]
        pub(crate) fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
            let t = vaddq_f32(lo, hi);
            let p = vpaddq_f32(t, t); // [t0 + t1, t2 + t3, ..]
            vgetq_lane_f32::<0>(p) + vgetq_lane_f32::<1>(p)
        }

        /// Σ a[i]·b[i] in `portable`'s order exactly: eight partial sums (two
        /// 4-lane vectors, multiply then add), combined pairwise, plus a scalar
        /// tail summed from zero.
        #[inline]
        fn dot_with<T: Copy>(a: &[T], b: &[f32], load: impl Fn(&[T]) -> float32x4_t, one: impl Fn(T) -> f32) -> f32 {
            let n = a.len().min(b.len());
            let (a, b) = (&a[..n], &b[..n]);
            let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
            let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
            for (x, y) in (&mut ca).zip(&mut cb) {
                lo = vaddq_f32(lo, vmulq_f32(load(&x[..4]), ld(&y[..4])));
                hi = vaddq_f32(hi, vmulq_f32(load(&x[4..]), ld(&y[4..])));
            }
            let mut tail = 0.0f32;
            for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
                tail += one(x) * y;
            }
            hsum8(lo, hi) + tail
        }

        #[inline]
        pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            debug_assert_eq!(a.len(), b.len());
            dot_with(a, b, |c| ld(c), |v| v)
        }

        /// Σ w[i]·x[i] for f16 weights, same order as `dot_f32`.
        #[inline]
        pub(crate) fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
            debug_assert_eq!(w.len(), x.len());
            dot_with(w, x, |c| ld_f16x4(c), |v| f16_bits_to_f32(v.to_bits()))
        }

        /// out = x / sqrt(mean(x²) + eps) · w; elementwise as `portable`.
        #[inline]
        pub(crate) fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
            let inv = 1.0 / (dot_f32(x, x) / x.len() as f32 + eps).sqrt();
            let n = x.len().min(w.len()).min(out.len());
            let vi = vdupq_n_f32(inv);
            let mut i = 0;
            while i + 4 <= n {
                let v = vmulq_f32(vmulq_f32(ld(&x[i..i + 4]), vi), ld(&w[i..i + 4]));
                st(&mut out[i..i + 4], v);
                i += 4;
            }
            for j in i..n {
                out[j] = x[j] * inv * w[j];
            }
        }

        /// Applies `f` four lanes at a time to `y`, the tail through a zero-padded vector.
        #[inline]
        fn map1(y: &mut [f32], f: impl Fn(float32x4_t) -> float32x4_t) {
            let n = y.len();
            let mut i = 0;
            while i + 4 <= n {
                let v = f(ld(&y[i..i + 4]));
                st(&mut y[i..i + 4], v);
                i += 4;
            }
            if i < n {
                let mut a = [0.0f32; 4];
                a[..n - i].copy_from_slice(&y[i..n]);
                let v = f(ld(&a));
                st(&mut a, v);
                y[i..n].copy_from_slice(&a[..n - i]);
            }
        }

        /// Applies `f` four lanes at a time to `y` and `x`, the tail through a zero-padded vector.
        #[inline]
        fn map2(y: &mut [f32], x: &[f32], f: impl Fn(float32x4_t, float32x4_t) -> float32x4_t) {
            let n = y.len().min(x.len());
            let mut i = 0;
            while i + 4 <= n {
                let v = f(ld(&y[i..i + 4]), ld(&x[i..i + 4]));
                st(&mut y[i..i + 4], v);
                i += 4;
            }
            if i < n {
                let (mut a, mut b) = ([0.0f32; 4], [0.0f32; 4]);
                a[..n - i].copy_from_slice(&y[i..n]);
                b[..n - i].copy_from_slice(&x[i..n]);
                let v = f(ld(&a), ld(&b));
                st(&mut a, v);
                y[i..n].copy_from_slice(&a[..n - i]);
            }
        }

        /// e^x, four lanes: `sse2::exp4`'s Cephes expf with the same operation
        /// sequence (no FMA; `fcvtns` rounds to nearest even like `cvtps2dq`), so
        /// AArch64 and x86 builds compute the same values. Relative error ≤ 1e-6
        /// against f64 on [-87.3, 88.72] (tested); below −103.97 gives 0, above
        /// 88.7228 gives +inf, NaN stays NaN.
        #[inline]
        pub(crate) fn exp4(x: float32x4_t) -> float32x4_t {
            let (hi, lo) = (vdupq_n_f32(88.72283), vdupq_n_f32(-103.97208));
            let xc = vminq_f32(hi, vmaxq_f32(lo, x)); // NaN propagates
            let n = vcvtnq_s32_f32(vmulq_f32(xc, vdupq_n_f32(std::f32::consts::LOG2_E)));
            let nf = vcvtq_f32_s32(n);
            let r = vsubq_f32(
                vsubq_f32(xc, vmulq_f32(nf, vdupq_n_f32(0.693_359_4))),
                vmulq_f32(nf, vdupq_n_f32(-2.121_944_4e-4)),
            );
            let mut p = vdupq_n_f32(1.987_569_1e-4);
            // the x86 modules' literals, kept as written there (5.000_000_1e-1 rounds to 0.5 in f32)
            #[allow(clippy::excessive_precision)]
            for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1] {
                p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(c));
            }
            let y = vaddq_f32(vaddq_f32(vmulq_f32(vmulq_f32(p, r), r), r), vdupq_n_f32(1.0));
            let n1 = vshrq_n_s32::<1>(n);
            let pow2 = |k| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(k, vdupq_n_s32(127))));
            let v = vmulq_f32(vmulq_f32(y, pow2(n1)), pow2(vsubq_s32(n, n1)));
            let v = vbslq_f32(vcgtq_f32(x, hi), vdupq_n_f32(f32::INFINITY), v);
            vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), vcltq_f32(x, lo)))
        }

        /// e^x of every element through `exp4`.
        pub(crate) fn exp(x: &mut [f32]) {
            map1(x, |v| exp4(v));
        }

        /// In-place softmax: vector exp, the sum in element order (as the x86 builds).
        #[inline]
        pub(crate) fn softmax(x: &mut [f32]) {
            let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let vm = vdupq_n_f32(max);
            map1(x, |v| exp4(vsubq_f32(v, vm)));
            let sum = x.iter().fold(0.0f32, |s, &e| s + e);
            let inv = vdupq_n_f32(1.0 / sum);
            map1(x, |v| vmulq_f32(v, inv));
        }

        /// y += a·x (multiply then add, as `portable`)
        #[inline]
        pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
            let va = vdupq_n_f32(a);
            map2(y, x, |yv, xv| vaddq_f32(yv, vmulq_f32(va, xv)));
        }

        /// gate ← silu(gate) · up
        #[inline]
        pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
            let one = vdupq_n_f32(1.0);
            map2(gate, up, |g, u| {
                let e = exp4(vsubq_f32(vdupq_n_f32(0.0), g));
                vmulq_f32(vdivq_f32(g, vaddq_f32(one, e)), u)
            });
        }

        /// gate ← gelu_tanh(gate) · up, tanh(t) = 1 − 2/(e^{2t} + 1).
        #[inline]
        pub(crate) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
            let (one, two, half) = (vdupq_n_f32(1.0), vdupq_n_f32(2.0), vdupq_n_f32(0.5));
            let (k, c) = (vdupq_n_f32(0.797_884_6), vdupq_n_f32(0.044715));
            map2(gate, up, |x, u| {
                let t = vmulq_f32(k, vaddq_f32(x, vmulq_f32(c, vmulq_f32(vmulq_f32(x, x), x))));
                let th = vsubq_f32(one, vdivq_f32(two, vaddq_f32(exp4(vaddq_f32(t, t)), one)));
                vmulq_f32(vmulq_f32(vmulq_f32(half, x), vaddq_f32(one, th)), u)
            });
        }

        /// f16 → f32 conversion of a slice (exact).
        #[inline]
        pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
            let n = src.len().min(dst.len());
            let mut i = 0;
            while i + 4 <= n {
                st(&mut dst[i..i + 4], ld_f16x4(&src[i..i + 4]));
                i += 4;
            }
            for j in i..n {
                dst[j] = f16_bits_to_f32(src[j].to_bits());
            }
        }
    );

    #[cfg(test)]
    mod tests {
        use super::*;

        /// `exp4` within 1e-6 relative of f64 on the whole finite range, and its
        /// special values (mod.rs's `vector_exp_is_within_1e6_relative` runs on x86 only).
        #[test]
        fn neon_exp_is_within_1e6_relative() {
            let mut xs: Vec<f32> = (0..100_000).map(|i| -87.3 + i as f32 * (88.72 + 87.3) / 100_000.0).collect();
            xs.extend([0.0, -0.0, 1e-8, -1e-8, 88.72, -87.33, 0.5 * std::f32::consts::LN_2]);
            let mut got = xs.clone();
            // SAFETY: NEON is the AArch64 baseline.
            unsafe { exp(&mut got) };
            for (&x, &g) in xs.iter().zip(&got) {
                let want = (x as f64).exp();
                let rel = (g as f64 - want).abs() / want;
                assert!(rel <= 1e-6, "exp({x}) = {g}, want {want} (rel {rel:e})");
            }
            let mut sp = vec![f32::NEG_INFINITY, -200.0, -104.0, f32::INFINITY, 89.0, f32::NAN, 0.0];
            // SAFETY: as above.
            unsafe { exp(&mut sp) };
            assert_eq!(&sp[..5], &[0.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY]);
            assert!(sp[5].is_nan());
            assert_eq!(sp[6], 1.0);
        }

        /// `exp4` gives exactly the bits of the x86 builds' `exp4`: a scalar
        /// model of its operation sequence (one rounding per operation, as
        /// SSE2 computes it) on a sweep of inputs.
        #[test]
        fn neon_exp_matches_the_x86_operation_sequence() {
            let mut xs: Vec<f32> = (0..200_003).map(|i| -110.0 + i as f32 * 0.001).collect();
            xs.extend([f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE, -1e-30, 88.72283, -103.97208]);
            let mut got = xs.clone();
            // SAFETY: NEON is the AArch64 baseline.
            unsafe { exp(&mut got) };
            for (&x, &g) in xs.iter().zip(&got) {
                assert_eq!(g.to_bits(), crate::kernels::portable::exp4_model(x).to_bits(), "exp4({x})");
            }
        }
    }
}
