//! AArch64 NEON + dot product (`FEAT_DotProd`, Linux `asimddp`) kernels:
//! int8 dots with `sdot` (four i8 × i8 products summed into each i32 lane in
//! one instruction), written with `asm!` since the dotprod intrinsics are not
//! stable. Per block, two `sdot`s (one per 16-byte half) give four i32 lanes
//! that add up to the block's exact integer sum; eight blocks per step in
//! `portable`'s lane order (`neon::imp::sum_blocks_n`). Q4 weights go in as
//! signed `nibble − 8`. The K-quant dots are `kquant`'s with `sdot` as
//! the 16-byte dot (one `sdot` per half of a Q4_K / Q5_K sub-block, one per
//! Q6_K group of 16); the i8mm and SVE builds, which include dotprod, use
//! them too. The f32 kernels are NEON's.

use super::neon::imp as neon_imp;
use crate::kernels::Kernels;

/// The NEON + dot product kernel set.
pub struct NeonDotprod;

impl Kernels for NeonDotprod {
    entry_points!(neon_imp: f32_ops);
    entry_points!(imp: int8_dots, int8_dots_x4, mxfp4_dots);
    entry_points!(imp: kquant_dots, kquant_dots_x4);
}

pub mod imp {
    use super::super::neon::quantised_dots;
    use core::arch::aarch64::*;
    use core::arch::asm;

    // the i8mm and SVE builds take the four-row forms, the MXFP4 dots and the K-quant dots too
    quantised_dots!(dot32, sdot);

    isa_features!(
        /// acc + `sdot`(a, b): lane k of acc gains Σ_{j<4} a[4k + j]·b[4k + j] (exact in i32).
        #[inline]
        pub(crate) fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            let mut acc = acc;
            // SAFETY: `sdot` only reads the two vector registers and updates the
            // accumulator register; no memory, stack or flags are touched, and
            // the instruction exists on this build's CPUs (`dotprod` is a target
            // feature of the whole build, checked by the start-up guard).
            unsafe {
                asm!(
                    "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                    acc = inout(vreg) acc,
                    a = in(vreg) a,
                    b = in(vreg) b,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }

        /// One block's 32 products summed in four i32 lanes: two `sdot`s.
        #[inline]
        pub(crate) fn dot32(w: [int8x16_t; 2], x: [int8x16_t; 2]) -> int32x4_t {
            sdot(sdot(vdupq_n_s32(0), w[0], x[0]), w[1], x[1])
        }
    );

    #[cfg(test)]
    mod tests {
        use super::*;

        /// `sdot` against the scalar definition on extreme and random bytes.
        #[test]
        fn sdot_matches_scalar() {
            let mut s = 0x1234_5678_9abc_def0u64;
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
                let acc0 = [7i32, -3, i32::MAX - 70_000, i32::MIN + 70_000];
                // SAFETY: the arrays are 16 readable bytes / 4 readable i32; the build has dotprod.
                let got = unsafe {
                    let r = sdot(vld1q_s32(acc0.as_ptr()), vld1q_s8(a.as_ptr()), vld1q_s8(b.as_ptr()));
                    let mut out = [0i32; 4];
                    vst1q_s32(out.as_mut_ptr(), r);
                    out
                };
                for k in 0..4 {
                    let want: i32 = acc0[k] + (0..4).map(|j| a[4 * k + j] as i32 * b[4 * k + j] as i32).sum::<i32>();
                    assert_eq!(got[k], want, "round {round} lane {k}");
                }
            }
        }
    }
}
