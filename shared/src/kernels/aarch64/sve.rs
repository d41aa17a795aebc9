//! AArch64 SVE kernels (the build also has dotprod and i8mm): the integer
//! part of the quantised dots in vector-length-agnostic SVE `asm!` (no SVE
//! intrinsics are stable), the rest NEON's.
//!
//! Per block, one `asm!` loop over up to eight blocks: Q8 loads the 32 quant
//! bytes of weights and activations in predicated chunks of the vector
//! length (`whilelt` / `incb`: two rounds at 128 bits, one at 256 bits and
//! more, the inactive bytes loaded as zero), accumulates them with the SVE
//! `sdot` into i32 lanes, and reduces the lanes with `saddv` (exact in i64,
//! the sum fits i32). Q4 loads the 16 nibble bytes under a 16-byte predicate
//! (any SVE length holds them), splits them into signed `nibble − 8` and
//! does the same against the two 16-byte halves of the activations. The
//! exact block sums are then scaled and summed in `portable`'s lane order by
//! `neon::imp::sum_blocks_n`, so results are bit-identical to `portable` and
//! every other build whatever the vector length (tested at 128, 256 and 512
//! bits under qemu).
//!
//! The K-quant dots are the dotprod build's (`kquant` with the NEON
//! `sdot`; the build includes dotprod): their unit is a sub-block of 32
//! bytes (Q6_K: groups of 16) under its own scale, two 128-bit `sdot`s
//! whatever the SVE vector length; wider SVE vectors would hold several
//! sub-blocks and need a reduction per 16- or 32-byte segment afterwards,
//! and the per-sub-block scaling and lane order are NEON code either way
//! (not measured against an SVE version).

use super::neon::imp as neon_imp;
use super::neon_dotprod::imp as dotprod_imp;
use crate::kernels::Kernels;

/// The SVE (+ dotprod, i8mm) kernel set.
pub struct Sve;

impl Kernels for Sve {
    entry_points!(neon_imp: f32_ops);
    entry_points!(imp: int8_dots);
    entry_points!(dotprod_imp: int8_dots_x4, kquant_dots, kquant_dots_x4, mxfp4_dots);
}

pub mod imp {
    use super::super::neon::imp::{ld_i32, sum_blocks_n};
    use crate::quant::{ActRef, Q4Block, Q8Block, QK};
    use core::arch::asm;

    isa_features!(
        /// out[k] = Σ_j w[k][j]·x[k][j] (exact) for the first `n` (1..=8) block pairs.
        #[inline]
        fn isums_q8(w: &[&[i8; QK]; 8], x: &[&[i8; QK]; 8], n: usize) -> [i32; 8] {
            assert!((1..=8).contains(&n));
            let mut out = [0i32; 8];
            // SAFETY: `w` and `x` are arrays of 8 references (thin pointers) to
            // 32 readable bytes each; the loop reads the first `n` (1 ≤ n ≤ 8,
            // asserted) of each, 32 bytes per pointer under a `whilelt` predicate
            // bounded by 32, and writes `n` i32 to `out`, which holds 8. SVE is a
            // target feature of the whole build, checked by the start-up guard.
            // z0–z3 (aliasing v0–v3) and p0, p1 are declared clobbered; flags
            // are clobbered (no `preserves_flags`); no stack is used.
            unsafe {
                asm!(
                    "ptrue p1.s",
                    "mov {c}, #32",
                    "2:",
                    "ldr {pw}, [{wp}], #8",
                    "ldr {px}, [{xp}], #8",
                    "mov z2.s, #0",
                    "mov {off}, #0",
                    "whilelt p0.b, {off}, {c}",
                    "3:",
                    "ld1b {{z0.b}}, p0/z, [{pw}, {off}]",
                    "ld1b {{z1.b}}, p0/z, [{px}, {off}]",
                    "sdot z2.s, z0.b, z1.b",
                    "incb {off}",
                    "whilelt p0.b, {off}, {c}",
                    "b.mi 3b", // b.first: another chunk of the block
                    "saddv d3, p1, z2.s",
                    "fmov {t}, d3",
                    "str {t:w}, [{out}], #4",
                    "subs {n}, {n}, #1",
                    "b.ne 2b",
                    wp = inout(reg) w.as_ptr() => _,
                    xp = inout(reg) x.as_ptr() => _,
                    out = inout(reg) out.as_mut_ptr() => _,
                    n = inout(reg) n => _,
                    c = out(reg) _,
                    pw = out(reg) _,
                    px = out(reg) _,
                    off = out(reg) _,
                    t = out(reg) _,
                    out("v0") _,
                    out("v1") _,
                    out("v2") _,
                    out("v3") _,
                    out("p0") _,
                    out("p1") _,
                    options(nostack),
                );
            }
            out
        }

        /// out[k] = Σ_j (nibble_j − 8)·x[k][j] (exact) for the first `n` (1..=8)
        /// blocks: nibble byte j holds elements j (low) and j + 16 (high).
        #[inline]
        fn isums_q4(w: &[&[u8; QK / 2]; 8], x: &[&[i8; QK]; 8], n: usize) -> [i32; 8] {
            assert!((1..=8).contains(&n));
            let mut out = [0i32; 8];
            // SAFETY: `w` holds 8 references to 16 readable bytes and `x` 8
            // references to 32; the loop reads the first `n` (1 ≤ n ≤ 8,
            // asserted) of each: 16 bytes of a nibble block and two 16-byte
            // halves of an activation block, all under a `whilelt` predicate
            // bounded by 16, and writes `n` i32 to `out`, which holds 8. SVE is a
            // target feature of the whole build, checked by the start-up guard.
            // z0–z4 (aliasing v0–v4) and p0, p1 are declared clobbered; flags
            // are clobbered (no `preserves_flags`); no stack is used.
            unsafe {
                asm!(
                    "ptrue p1.s",
                    "mov {c}, #16",
                    "whilelt p0.b, xzr, {c}",
                    "2:",
                    "ldr {pw}, [{wp}], #8",
                    "ldr {px}, [{xp}], #8",
                    "ld1b {{z0.b}}, p0/z, [{pw}]",
                    "ld1b {{z1.b}}, p0/z, [{px}]",
                    "ld1b {{z4.b}}, p0/z, [{px}, {c}]",
                    "mov z3.d, z0.d",
                    "and z3.b, z3.b, #0xf",
                    "lsr z0.b, z0.b, #4",
                    "sub z3.b, z3.b, #8",
                    "sub z0.b, z0.b, #8",
                    "mov z2.s, #0",
                    "sdot z2.s, z3.b, z1.b",
                    "sdot z2.s, z0.b, z4.b",
                    "saddv d3, p1, z2.s",
                    "fmov {t}, d3",
                    "str {t:w}, [{out}], #4",
                    "subs {n}, {n}, #1",
                    "b.ne 2b",
                    wp = inout(reg) w.as_ptr() => _,
                    xp = inout(reg) x.as_ptr() => _,
                    out = inout(reg) out.as_mut_ptr() => _,
                    n = inout(reg) n => _,
                    c = out(reg) _,
                    pw = out(reg) _,
                    px = out(reg) _,
                    t = out(reg) _,
                    out("v0") _,
                    out("v1") _,
                    out("v2") _,
                    out("v3") _,
                    out("v4") _,
                    out("p0") _,
                    out("p1") _,
                    options(nostack),
                );
            }
            out
        }

        /// The i32 lanes 0..4, 4..8 of eight block sums.
        #[inline]
        fn halves(s: [i32; 8]) -> [core::arch::aarch64::int32x4_t; 2] {
            [ld_i32(&s[..4]), ld_i32(&s[4..])]
        }

        /// Q8 weights · Q8 activations: exact per-block integer sums with SVE
        /// `sdot`, scaled and summed in `portable`'s order (bit-identical).
        #[inline]
        pub(crate) fn dot_q8<B: Q8Block>(w: &[B], x: ActRef) -> f32 {
            debug_assert_eq!(w.len(), x.len());
            let n = w.len().min(x.len());
            let xb = x.blocks();
            sum_blocks_n(
                n,
                [x],
                B::F16_SCALE,
                |b| w[b].scale_bits(),
                |i| {
                    let ws: [&[i8; QK]; 8] = core::array::from_fn(|j| w[i + j].quants());
                    let xs: [&[i8; QK]; 8] = core::array::from_fn(|j| &xb[i + j].qs);
                    [halves(isums_q8(&ws, &xs, 8))]
                },
                |b| [isums_q8(&[w[b].quants(); 8], &[&xb[b].qs; 8], 1)[0]],
            )[0]
        }

        /// Q4 weights · Q8 activations: Σ (nibble − 8)·q per block with SVE `sdot` (exact), scaled as `dot_q8`.
        #[inline]
        pub(crate) fn dot_q4<B: Q4Block>(w: &[B], x: ActRef) -> f32 {
            debug_assert_eq!(w.len(), x.len());
            let n = w.len().min(x.len());
            let xb = x.blocks();
            sum_blocks_n(
                n,
                [x],
                B::F16_SCALE,
                |b| w[b].scale_bits(),
                |i| {
                    let ws: [&[u8; QK / 2]; 8] = core::array::from_fn(|j| w[i + j].nibbles());
                    let xs: [&[i8; QK]; 8] = core::array::from_fn(|j| &xb[i + j].qs);
                    [halves(isums_q4(&ws, &xs, 8))]
                },
                |b| [isums_q4(&[w[b].nibbles(); 8], &[&xb[b].qs; 8], 1)[0]],
            )[0]
        }
    );

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The SVE vector length this test runs at, in bits (`cntb` × 8).
        fn vector_bits() -> usize {
            let bytes: usize;
            // SAFETY: `cntb` only writes its register; the build has SVE.
            unsafe { asm!("cntb {b}", b = out(reg) bytes, options(pure, nomem, nostack, preserves_flags)) };
            bytes * 8
        }

        /// Both block-sum loops against the scalar definition, for every
        /// count 1..=8, on extreme and random quants.
        #[test]
        fn sve_block_sums_match_scalar() {
            eprintln!("SVE vector length: {} bits", vector_bits());
            let mut s = 0x5eed_5eed_1234_5678u64;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            };
            for round in 0..50 {
                let mut wq = [[0i8; QK]; 8];
                let mut wn = [[0u8; QK / 2]; 8];
                let mut xq = [[0i8; QK]; 8];
                for k in 0..8 {
                    for j in 0..QK {
                        (wq[k][j], xq[k][j]) = match round {
                            0 => (-128, -128),
                            1 => (-128, 127),
                            _ => (next() as i8, next() as i8),
                        };
                    }
                    for v in wn[k].iter_mut() {
                        *v = if round < 2 { [0x00, 0xff][round] } else { next() as u8 };
                    }
                }
                let ws: [&[i8; QK]; 8] = core::array::from_fn(|k| &wq[k]);
                let ns: [&[u8; QK / 2]; 8] = core::array::from_fn(|k| &wn[k]);
                let xs: [&[i8; QK]; 8] = core::array::from_fn(|k| &xq[k]);
                for n in 1..=8 {
                    // SAFETY: the build has SVE (this module is compiled only then).
                    let (g8, g4) = unsafe { (isums_q8(&ws, &xs, n), isums_q4(&ns, &xs, n)) };
                    for k in 0..8 {
                        let want8: i32 = (0..QK).map(|j| wq[k][j] as i32 * xq[k][j] as i32).sum();
                        let want4: i32 = (0..QK / 2)
                            .map(|j| {
                                ((wn[k][j] & 15) as i32 - 8) * xq[k][j] as i32
                                    + ((wn[k][j] >> 4) as i32 - 8) * xq[k][j + 16] as i32
                            })
                            .sum();
                        let (w8, w4) = if k < n { (want8, want4) } else { (0, 0) };
                        assert_eq!(g8[k], w8, "q8 round {round} n {n} block {k}");
                        assert_eq!(g4[k], w4, "q4 round {round} n {n} block {k}");
                    }
                }
            }
        }
    }
}
