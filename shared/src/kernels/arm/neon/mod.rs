//! 32-bit ARM (armv7hf) NEON kernels, in `asm!`: stable Rust has no armv7
//! NEON intrinsics (and no vector types for `asm!` operands), so every
//! kernel is one `asm!` loop that takes pointers and counts in general
//! registers, loads, computes and stores in fixed NEON registers it declares
//! clobbered, and leaves the scalar remainder to plain Rust (VFP, IEEE).
//!
//! Registers: q0–q3 hold the data, q4–q7 (d8–d15) the constants of the
//! operation, q8–q15 temporaries, accumulators and a few more constants.
//!
//! * Quantised dots: per block, `vmull.s8` (i8 × i8 → i16, exact) and
//!   `vpadal.s16` into four i32 lanes, `vpadd` down to the block's exact
//!   integer sum; four blocks per step, any number of blocks per call (Q4
//!   nibbles become signed `nibble − 8` first, the same integer as
//!   `portable`'s Σ nibble·q − 8·Σq). The sums are then scaled and added
//!   eight blocks at a time in NEON in `portable`'s order (acc[b % 8] +=
//!   (d_w·d_x)·isum, multiply then add, the lanes combined with
//!   `portable::combine8`), the last n % 8 blocks in scalar code. Because
//!   NEON flushes subnormals (below), that pass also checks every scale: if
//!   one is nonzero and below 2^-51 the dot is redone with scalar scaling;
//!   otherwise no product or partial sum can be subnormal (see `scale8`).
//! * f32 / f16 dots: eight partial sums in two vectors (`vmul` then `vadd`),
//!   the tail and the combine as `portable`.
//! * exp (softmax, SiLU, GELU): the Cephes polynomial of `sse2::exp4` /
//!   `neon::exp4`, the same operations in the same order. armv7 NEON has no
//!   round-to-nearest conversion (`vcvt.s32.f32` truncates), so n =
//!   round(x·log2 e) is computed exactly as (t + 1.5·2^23) − 1.5·2^23: for
//!   |t| ≤ 150 (the clamped range) t + 1.5·2^23 lies in [2^23, 2^24), where
//!   the f32 spacing is 1, so the add rounds t to the nearest integer, ties
//!   to even, as `cvtps2dq` / `fcvtns` do (tested against a scalar model).
//! * f16 → f32: integer bit moves (normals, infinities, NaNs quieted) and a
//!   fixed-point `vcvt.f32.u32 #24` for f16 subnormals, which become f32
//!   normals; exact for all 65536 values, as `f16_bits_to_f32`.
//!
//! No fused multiply-add anywhere: NEON `vmla` / VFPv4 `vfma` are not used
//! (the compiler may turn scalar a + b·c into VFP `vmla`, which rounds the
//! product and the sum separately, as `portable` does on every build). No
//! division or square root in NEON (armv7 NEON has only estimates): those
//! run in scalar VFP code, IEEE-exact like `portable` (SiLU's and GELU's
//! divisions, rmsnorm's 1/sqrt, softmax's 1/sum).
//!
//! What differs from `portable` and the other builds: armv7 NEON arithmetic
//! always flushes subnormal inputs and results to zero (VFP scalar code, as
//! Linux sets it up, does not). The quantised dots are unaffected (the
//! check above) and stay bit-identical even for subnormal scales (except
//! for the bits of a NaN result, with infinite or NaN scales). The other
//! NEON float kernels give the same bits whenever no input, product or
//! partial sum is subnormal (|v| < 2^-126): dot_f32 / dot_f16_f32, axpy,
//! rmsnorm's elementwise step, softmax's final scaling. exp gives the same
//! bits except where the true result is subnormal (x < −87.34), where it
//! gives 0; through SiLU and GELU (1 + e) that cannot change a result, in
//! softmax it changes only outputs below 2^-126.
//!
//! * K-quant dots (Q4_K, Q5_K, Q6_K): the exact integer sums of each
//!   32-weight sub-block (and Q6_K's 16-weight groups) in NEON as above,
//!   the scales, mins and float part in scalar VFP code in `portable`'s
//!   order, bit-identical on every input (`kquant.rs`).
//!
//! `float.rs` holds the f32 kernels and exp, `int8.rs` the quantised dots,
//! `kquant.rs` the K-quant dots.

use half::f16;

use crate::kernels::Kernels;
use crate::quant::{ActRef, Q4Block, Q8Block};

/// `f16x4!("qN")`: the four f16 zero-extended in the u32 lanes of qN → their
/// exact f32 values in qN. Constants: q4 = 0x3800_0000 (exponent rebias
/// 112 << 23), q5 = 0x7c00 (f16 exponent all ones), q6 = 0x0040_0000 (quiet
/// bit), q7 = 0x400 (the smallest normal f16); temporaries q8–q10.
#[rustfmt::skip]
macro_rules! f16x4 {
    ($q:literal) => {
        concat!(
            "vshl.i32 q8, ", $q, ", #17\n",
            "vshr.u32 q8, q8, #17\n",        // m = h & 0x7fff
            "vshl.i32 q9, q8, #13\n",
            "vadd.i32 q9, q9, q4\n",         // normal: (m << 13) + (112 << 23)
            "vcge.u32 q10, q8, q5\n",
            "vand q10, q10, q4\n",
            "vadd.i32 q9, q9, q10\n",        // inf / NaN: exponent 255 (rebiased twice)
            "vcgt.u32 q10, q8, q5\n",
            "vand q10, q10, q6\n",
            "vorr q9, q9, q10\n",            // NaN: quieted, payload kept
            "vcvt.f32.u32 q10, q8, #24\n",   // m·2^-24: the value when the exponent is 0
            "vcgt.u32 q8, q7, q8\n",
            "vbit q9, q10, q8\n",            // zero / subnormal f16
            "vshr.u32 ", $q, ", ", $q, ", #15\n",
            "vshl.i32 ", $q, ", ", $q, ", #31\n",
            "vorr ", $q, ", ", $q, ", q9\n", // sign
        )
    };
}

/// The constants of `f16x4!`.
macro_rules! f16_consts {
    () => {
        concat!(
            "vmov.i32 q4, #0x38000000\n",
            "vmov.i32 q5, #0x7c00\n",
            "vmov.i32 q6, #0x400000\n",
            "vmov.i32 q7, #0x400\n",
        )
    };
}

pub mod float;
pub mod int8;
pub mod kquant;

/// The armv7 NEON + VFPv4 kernel set (32-bit ARM). Its kernels are plain
/// functions around `asm!` (no target-feature attributes: rustc keeps NEON
/// unstable on this target), so the methods call them directly; the K-quant
/// dots are `unsafe fn`s whose contract is NEON (the start-up guard's), so
/// `entry_points!` calls them.
pub struct Armv7Neon;

impl Kernels for Armv7Neon {
    fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        float::dot_f32(a, b)
    }
    fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
        float::dot_f16_f32(w, x)
    }
    fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        float::rmsnorm(x, w, eps, out)
    }
    fn softmax(x: &mut [f32]) {
        float::softmax(x)
    }
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        float::axpy(a, x, y)
    }
    fn silu_mul(gate: &mut [f32], up: &[f32]) {
        float::silu_mul(gate, up)
    }
    fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
        float::gelu_tanh_mul(gate, up)
    }
    fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        float::f16_to_f32(src, dst)
    }
    fn exp(x: &mut [f32]) {
        float::exp(x)
    }
    fn dot_q8<'a, B: Q8Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32 {
        int8::dot_q8_n(w, [x.into()])[0]
    }
    fn dot_q4<'a, B: Q4Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32 {
        int8::dot_q4_n(w, [x.into()])[0]
    }
    fn dot_mxfp4(w: &[crate::quant::BlockMxfp4], x: ActRef) -> f32 {
        int8::dot_mxfp4_n(w, [x])[0]
    }
    fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        int8::dot_q8_n(w, xs)
    }
    fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        int8::dot_q4_n(w, xs)
    }
    fn dot_mxfp4_x4(w: &[crate::quant::BlockMxfp4], xs: [ActRef; 4]) -> [f32; 4] {
        int8::dot_mxfp4_n(w, xs)
    }
    entry_points!(kquant: kquant_dots, kquant_dots_x4);
}
