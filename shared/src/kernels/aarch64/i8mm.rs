//! AArch64 int8 matrix multiply (`FEAT_I8MM`, Linux `i8mm`) kernels: int8
//! dots with `smmla` (a 2×8 by 8×2 i8 matrix product accumulated into a 2×2
//! i32 matrix), written with `asm!` since the i8mm intrinsics are not
//! stable. Two blocks A and B go in together: each `smmla` takes eight bytes
//! of each block's weights as the rows [A | B] and the matching eight bytes
//! of their activations as the columns, so after four of them (32 bytes) the
//! diagonal lanes 0 and 3 hold A's and B's exact integer sums. Eight blocks
//! per step in `portable`'s lane order (`neon::imp::sum_blocks_n`). Q4 weights
//! go in as signed `nibble − 8`. The f32 kernels are NEON's.
//!
//! The K-quant dots are the dotprod build's (`kquant` with `sdot`; the
//! build includes dotprod). A K-quant sub-block is one dot of 32 bytes under
//! its own scale (Q6_K: two of 16), `sdot`'s shape: two `sdot`s per
//! sub-block. `smmla` would pair two sub-blocks: four `smmla`s per pair, the
//! same count, plus the `zip`s interleaving their bytes, with half of its
//! lanes the cross products A·x_B and B·x_A thrown away; nothing is gained
//! for one activation row (not measured).

use super::neon::imp as neon_imp;
use super::neon_dotprod::imp as dotprod_imp;
use crate::kernels::Kernels;

/// The NEON + dotprod + i8mm kernel set.
pub struct I8mm;

impl Kernels for I8mm {
    entry_points!(neon_imp: f32_ops);
    entry_points!(imp: int8_dots);
    entry_points!(dotprod_imp: int8_dots_x4, kquant_dots, kquant_dots_x4, mxfp4_dots);
}

pub mod imp {
    use super::super::neon::imp::{q4_halves, q8_halves, sum_blocks_n};
    use crate::quant::{ActRef, Q4Block, Q8Block};
    use core::arch::aarch64::*;
    use core::arch::asm;

    isa_features!(
        /// acc + `smmla`(a, b): with a = rows [a0 | a1] and b = rows [b0 | b1]
        /// (eight i8 each), lane 2i + j of acc gains a_i · b_j (exact in i32).
        #[inline]
        pub(crate) fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            let mut acc = acc;
            // SAFETY: `smmla` only reads the two vector registers and updates the
            // accumulator register; no memory, stack or flags are touched, and
            // the instruction exists on this build's CPUs (`i8mm` is a target
            // feature of the whole build, checked by the start-up guard).
            unsafe {
                asm!(
                    "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                    acc = inout(vreg) acc,
                    a = in(vreg) a,
                    b = in(vreg) b,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }

        /// [low 8 bytes of a | low 8 bytes of b], [high of a | high of b].
        #[inline]
        fn zip64(a: int8x16_t, b: int8x16_t) -> [int8x16_t; 2] {
            let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
            [vreinterpretq_s8_s64(vzip1q_s64(a, b)), vreinterpretq_s8_s64(vzip2q_s64(a, b))]
        }

        /// Blocks A and B (weights `wa`, `wb`, activations `xa`, `xb` as 16-byte
        /// halves) through four `smmla`s: lane 0 = A's exact sum, lane 3 = B's
        /// (lanes 1, 2 are the cross products A·x_B, B·x_A).
        #[inline]
        fn pair(wa: [int8x16_t; 2], wb: [int8x16_t; 2], xa: [int8x16_t; 2], xb: [int8x16_t; 2]) -> int32x4_t {
            let mut acc = vdupq_n_s32(0);
            for h in 0..2 {
                let (w, x) = (zip64(wa[h], wb[h]), zip64(xa[h], xb[h]));
                acc = smmla(acc, w[0], x[0]);
                acc = smmla(acc, w[1], x[1]);
            }
            acc
        }

        /// The diagonals of two `pair` results: [A0, B0, A1, B1] (lanes 0, 3 of each).
        #[inline]
        fn diagonals(p0: int32x4_t, p1: int32x4_t) -> int32x4_t {
            // even = p0[0], p0[2], p1[0], p1[2]; odd = p0[1], p0[3], p1[1], p1[3]
            let (even, odd) = (vuzp1q_s32(p0, p1), vuzp2q_s32(p0, p1));
            // SAFETY: reads 4 readable u32 from a local array.
            let mask = unsafe { vld1q_u32([u32::MAX, 0, u32::MAX, 0].as_ptr()) };
            vbslq_s32(mask, even, odd)
        }

        /// Σ (d_w·d_x)·isum in `portable`'s order, the integer sums with
        /// `smmla`: `wq(b)` is weight block b's signed quants as 16-byte halves.
        #[inline]
        fn dot_with(
            n: usize,
            x: ActRef,
            f16: bool,
            bits: impl Fn(usize) -> u32,
            wq: impl Fn(usize) -> [int8x16_t; 2],
        ) -> f32 {
            let xb = x.blocks();
            let xq = |b: usize| q8_halves(&xb[b].qs);
            let two = |a: usize| pair(wq(a), wq(a + 1), xq(a), xq(a + 1));
            sum_blocks_n(
                n,
                [x],
                f16,
                bits,
                |i| [[diagonals(two(i), two(i + 2)), diagonals(two(i + 4), two(i + 6))]],
                // a block alone goes in as the pair (b, b): its sum is lane 0
                |b| [vgetq_lane_s32::<0>(pair(wq(b), wq(b), xq(b), xq(b)))],
            )[0]
        }

        /// Q8 weights · Q8 activations: exact per-block integer sums with
        /// `smmla`, scaled and summed in `portable`'s order (bit-identical).
        #[inline]
        pub(crate) fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
            debug_assert_eq!(w.len(), x.len());
            let n = w.len().min(x.len());
            dot_with(n, x, B::F16_SCALE, |b| w[b].scale_bits(), |b| q8_halves(w[b].quants()))
        }

        /// Q4 weights · Q8 activations: Σ (nibble − 8)·q per block with `smmla` (exact), scaled as `dot_q8`.
        #[inline]
        pub(crate) fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
            debug_assert_eq!(w.len(), x.len());
            let n = w.len().min(x.len());
            dot_with(n, x, B::F16_SCALE, |b| w[b].scale_bits(), |b| q4_halves(w[b].nibbles()))
        }
    );

    #[cfg(test)]
    mod tests {
        use super::*;

        /// `smmla` against the scalar definition on extreme and random bytes.
        #[test]
        fn smmla_matches_scalar() {
            let mut s = 0x0bad_cafe_f00d_1234u64;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as i8
            };
            for round in 0..200 {
                let mut a = [0i8; 16];
                let mut b = [0i8; 16];
                for j in 0..16 {
                    (a[j], b[j]) = match round {
                        0 => (-128, -128),
                        1 => (127, -128),
                        _ => (next(), next()),
                    };
                }
                let acc0 = [11i32, -5, i32::MAX - 140_000, i32::MIN + 140_000];
                // SAFETY: the arrays are 16 readable bytes / 4 readable i32; the build has i8mm.
                let got = unsafe {
                    let r = smmla(vld1q_s32(acc0.as_ptr()), vld1q_s8(a.as_ptr()), vld1q_s8(b.as_ptr()));
                    let mut out = [0i32; 4];
                    vst1q_s32(out.as_mut_ptr(), r);
                    out
                };
                for i in 0..2 {
                    for j in 0..2 {
                        let dot: i32 = (0..8).map(|k| a[8 * i + k] as i32 * b[8 * j + k] as i32).sum();
                        assert_eq!(got[2 * i + j], acc0[2 * i + j] + dot, "round {round} lane {}", 2 * i + j);
                    }
                }
            }
        }
    }
}
