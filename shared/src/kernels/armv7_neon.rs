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

use core::arch::asm;

use half::f16;

use super::f16_bits_to_f32;
use super::portable::combine8;
use crate::quant::{ActRef, BlockQ8Act, Q4Block, Q8Block};

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

/// The constants of `exp4!`, loaded into d8–d15 (scalars `vmul` can take).
#[allow(clippy::excessive_precision)]
static EXP_CONSTS: [f32; 16] = [
    88.72283,                 // d8[0]  hi
    -103.97208,               // d8[1]  lo
    std::f32::consts::LOG2_E, // d9[0]
    0.693_359_4,              // d9[1]  ln 2, high part
    -2.121_944_4e-4,          // d10[0] ln 2, low part
    1.987_569_1e-4,           // d10[1] polynomial, from the highest degree
    1.398_199_9e-3,           // d11[0]
    8.333_452e-3,             // d11[1]
    4.166_579_6e-2,           // d12[0]
    1.666_666_5e-1,           // d12[1]
    5.000_000_1e-1,           // d13[0] (the x86 modules' literal; 0.5 in f32)
    1.0,                      // d13[1]
    12_582_912.0,             // d14[0] 1.5·2^23
    f32::INFINITY,            // d14[1]
    0.0,
    0.0,
];

/// `exp4!()`: e^x of the four lanes of q0, into q0; `sse2::exp4`'s
/// operation sequence. Constants `EXP_CONSTS` in d8–d15, temporaries q8–q15.
macro_rules! exp4 {
    () => {
        concat!(
            "vdup.32 q8, d8[0]\n",
            "vdup.32 q9, d8[1]\n",
            "vmax.f32 q10, q0, q9\n",
            "vmin.f32 q10, q10, q8\n",    // xc = min(hi, max(lo, x)); NaN stays NaN
            "vmul.f32 q11, q10, d9[0]\n", // t = xc·log2 e
            "vdup.32 q12, d14[0]\n",
            "vadd.f32 q11, q11, q12\n",
            "vsub.f32 q11, q11, q12\n", // nf = t rounded to nearest, ties to even
            "vcvt.s32.f32 q12, q11\n",  // n (exact: nf is an integer)
            "vmul.f32 q13, q11, d9[1]\n",
            "vsub.f32 q13, q10, q13\n",
            "vmul.f32 q14, q11, d10[0]\n",
            "vsub.f32 q13, q13, q14\n",    // r = (xc − nf·C1) − nf·C2
            "vmul.f32 q14, q13, d10[1]\n", // p = p0·r
            "vdup.32 q15, d11[0]\n",
            "vadd.f32 q14, q14, q15\n",
            "vmul.f32 q14, q14, q13\n",
            "vdup.32 q15, d11[1]\n",
            "vadd.f32 q14, q14, q15\n",
            "vmul.f32 q14, q14, q13\n",
            "vdup.32 q15, d12[0]\n",
            "vadd.f32 q14, q14, q15\n",
            "vmul.f32 q14, q14, q13\n",
            "vdup.32 q15, d12[1]\n",
            "vadd.f32 q14, q14, q15\n",
            "vmul.f32 q14, q14, q13\n",
            "vdup.32 q15, d13[0]\n",
            "vadd.f32 q14, q14, q15\n", // p, after p = p·r + c for each c
            "vmul.f32 q14, q14, q13\n",
            "vmul.f32 q14, q14, q13\n",
            "vadd.f32 q14, q14, q13\n",
            "vdup.32 q10, d13[1]\n",
            "vadd.f32 q14, q14, q10\n", // y = ((p·r)·r + r) + 1
            "vshr.s32 q15, q12, #1\n",  // n1 = n >> 1
            "vsub.i32 q12, q12, q15\n", // n − n1
            "vshl.i32 q15, q15, #23\n",
            "vshl.i32 q12, q12, #23\n",
            "vadd.i32 q15, q15, q10\n", // 2^n1 (1.0's bits are 127 << 23)
            "vadd.i32 q12, q12, q10\n", // 2^(n − n1)
            "vmul.f32 q14, q14, q15\n",
            "vmul.f32 q14, q14, q12\n", // v = (y·2^n1)·2^(n − n1)
            "vcgt.f32 q15, q0, q8\n",
            "vdup.32 q12, d14[1]\n",
            "vbit q14, q12, q15\n", // x > hi: +inf
            "vcgt.f32 q15, q9, q0\n",
            "vbic q0, q14, q15\n", // x < lo: 0
        )
    };
}

/// An element-wise NEON pass: `n4` (≥ 1) groups of four lanes, q0 = four of
/// `a`, q1 = four of `b`, q2 / q3 = the parameters `p` broadcast, d8–d15 =
/// `EXP_CONSTS`; `body` leaves the result in q0, stored to `out`.
macro_rules! map4 {
    ($n4:expr, $a:expr, $b:expr, $out:expr, $p:expr, $($body:expr),+ $(,)?) => {
        asm!(
            "vld1.32 {{d8-d11}}, [{k}]!",
            "vld1.32 {{d12-d15}}, [{k}]",
            "vdup.32 q2, {p0}",
            "vdup.32 q3, {p1}",
            "2:",
            "vld1.32 {{d0-d1}}, [{a}]!",
            "vld1.32 {{d2-d3}}, [{b}]!",
            $($body,)+
            "vst1.32 {{d0-d1}}, [{out}]!",
            "subs {n}, {n}, #1",
            "bne 2b",
            k = inout(reg) EXP_CONSTS.as_ptr() => _,
            p0 = in(reg) $p[0].to_bits(),
            p1 = in(reg) $p[1].to_bits(),
            a = inout(reg) $a => _,
            b = inout(reg) $b => _,
            out = inout(reg) $out => _,
            n = inout(reg) $n4 => _,
            out("q0") _, out("q1") _, out("q2") _, out("q3") _,
            out("q4") _, out("q5") _, out("q6") _, out("q7") _,
            out("q8") _, out("q9") _, out("q10") _, out("q11") _,
            out("q12") _, out("q13") _, out("q14") _, out("q15") _,
            options(nostack),
        )
    };
}

/// The element-wise operations (`map4!` bodies); a = the slice updated in
/// place, b = the second operand.
#[derive(Clone, Copy)]
enum Op {
    /// e^a (the test hook `vexp`)
    #[cfg(test)]
    Exp,
    /// e^(a − p)
    ExpSub(f32),
    /// e^(−a)
    ExpNeg,
    /// e^(2t), t = k·(a + c·((a·a)·a)) for (k, c)
    ExpGelu(f32, f32),
    /// a + p·b
    Axpy(f32),
    /// a·p
    Scale(f32),
    /// (a·inv)·(b + offset) for (inv, offset)
    Norm(f32, f32),
}

/// `op` over `n4` ≥ 1 groups of four lanes.
///
/// # Safety
/// `a`, `b` and `out` must be valid for 4·n4 f32 reads (writes for `out`);
/// `out` may equal `a`.
unsafe fn map_raw(op: Op, a: *const f32, b: *const f32, out: *mut f32, n4: usize) {
    debug_assert!(n4 > 0);
    // SAFETY (every arm): the loop reads 4·n4 f32 from `a` and `b` and
    // writes 4·n4 to `out` (valid by this function's contract), reads the
    // 16 f32 of `EXP_CONSTS`, and touches only the NEON registers it
    // declares clobbered and the flags; no stack. NEON is required by this
    // build and checked by the start-up guard (variants/src/guard_arm.rs).
    unsafe {
        match op {
            #[cfg(test)]
            Op::Exp => map4!(n4, a, b, out, [0.0f32; 2], exp4!()),
            Op::ExpSub(m) => map4!(n4, a, b, out, [m, 0.0], "vsub.f32 q0, q0, q2", exp4!()),
            // −a, not 0 − a as x86: they differ only in the sign of a zero, and e^±0 = 1
            Op::ExpNeg => map4!(n4, a, b, out, [0.0f32; 2], "vneg.f32 q0, q0", exp4!()),
            Op::ExpGelu(k, c) => map4!(
                n4,
                a,
                b,
                out,
                [k, c],
                "vmul.f32 q1, q0, q0",
                "vmul.f32 q1, q1, q0",
                "vmul.f32 q1, q3, q1",
                "vadd.f32 q1, q0, q1",
                "vmul.f32 q1, q2, q1",
                "vadd.f32 q0, q1, q1",
                exp4!()
            ),
            Op::Axpy(s) => map4!(n4, a, b, out, [s, 0.0], "vmul.f32 q1, q2, q1", "vadd.f32 q0, q0, q1"),
            Op::Scale(s) => map4!(n4, a, b, out, [s, 0.0], "vmul.f32 q0, q0, q2"),
            Op::Norm(inv, off) => {
                map4!(n4, a, b, out, [inv, off], "vmul.f32 q0, q0, q2", "vadd.f32 q1, q1, q3", "vmul.f32 q0, q0, q1")
            }
        }
    }
}

/// y[i] ← op(y[i], x[i]) for i < min(len): whole groups of four in one pass,
/// the last n % 4 through a zero-padded group.
fn map(op: Op, y: &mut [f32], x: &[f32]) {
    let n = y.len().min(x.len());
    let n4 = n / 4;
    if n4 > 0 {
        // SAFETY: y and x hold n ≥ 4·n4 elements; out = y (allowed).
        unsafe { map_raw(op, y.as_ptr(), x.as_ptr(), y.as_mut_ptr(), n4) };
    }
    let t = n4 * 4;
    if t < n {
        let (mut a, mut b) = ([0.0f32; 4], [0.0f32; 4]);
        a[..n - t].copy_from_slice(&y[t..n]);
        b[..n - t].copy_from_slice(&x[t..n]);
        // SAFETY: a and b hold 4 elements each; out = a.
        unsafe { map_raw(op, a.as_ptr(), b.as_ptr(), a.as_mut_ptr(), 1) };
        y[t..n].copy_from_slice(&a[..n - t]);
    }
}

/// y[i] ← op(y[i]) (the second operand unused).
fn map1(op: Op, y: &mut [f32]) {
    let n4 = y.len() / 4;
    if n4 > 0 {
        let p = y.as_mut_ptr();
        // SAFETY: y holds ≥ 4·n4 elements, read through a and b and written through out.
        unsafe { map_raw(op, p, p, p, n4) };
    }
    let t = n4 * 4;
    if t < y.len() {
        let mut a = [0.0f32; 4];
        a[..y.len() - t].copy_from_slice(&y[t..]);
        let p = a.as_mut_ptr();
        // SAFETY: a holds 4 elements.
        unsafe { map_raw(op, p, p, p, 1) };
        let len = y.len() - t;
        y[t..].copy_from_slice(&a[..len]);
    }
}

/// The eight partial sums of Σ a[i]·b[i] over the first 8·n8 elements (lane
/// l gets the elements ≡ l mod 8; multiply then add). `load` puts eight
/// elements of `a` into q0 (lanes 0–3) and q1 (4–7), advancing `{a}`.
macro_rules! dot8 {
    ($n8:expr, $a:expr, $b:expr, $setup:expr, $($load:expr),+ $(,)?) => {{
        let mut acc = [0.0f32; 8];
        asm!(
            $setup,
            "vmov.i32 q12, #0",
            "vmov.i32 q13, #0",
            "2:",
            $($load,)+
            "vld1.32 {{d4-d7}}, [{b}]!",
            "vmul.f32 q0, q0, q2",
            "vmul.f32 q1, q1, q3",
            "vadd.f32 q12, q12, q0",
            "vadd.f32 q13, q13, q1",
            "subs {n}, {n}, #1",
            "bne 2b",
            "vst1.32 {{d24-d27}}, [{acc}]",
            a = inout(reg) $a => _,
            b = inout(reg) $b => _,
            n = inout(reg) $n8 => _,
            acc = in(reg) acc.as_mut_ptr(),
            out("q0") _, out("q1") _, out("q2") _, out("q3") _,
            out("q4") _, out("q5") _, out("q6") _, out("q7") _,
            out("q8") _, out("q9") _, out("q10") _,
            out("q12") _, out("q13") _,
            options(nostack),
        );
        acc
    }};
}

/// Σ a[i]·b[i] in `portable`'s order: eight partial sums, combined pairwise,
/// plus a scalar tail summed from zero.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let n8 = n / 8;
    let acc = if n8 > 0 {
        // SAFETY: a and b hold n ≥ 8·n8 f32, the loop reads 8·n8 of each and
        // writes 8 f32 to `acc`; only the declared NEON registers and the
        // flags are touched; NEON is checked by the start-up guard.
        unsafe { dot8!(n8, a.as_ptr(), b.as_ptr(), "", "vld1.32 {{d0-d3}}, [{a}]!") }
    } else {
        [0.0; 8]
    };
    let mut tail = 0.0f32;
    for i in n8 * 8..n {
        tail += a[i] * b[i];
    }
    combine8(acc) + tail
}

/// Σ w[i]·x[i] for f16 weights (converted exactly), in `dot_f32`'s order.
#[inline]
pub fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len().min(x.len());
    let n8 = n / 8;
    let acc = if n8 > 0 {
        // SAFETY: as `dot_f32`, reading 8·n8 f16 (2 bytes each, `half::f16`
        // is a transparent u16) from w.
        unsafe {
            dot8!(
                n8,
                w.as_ptr() as *const u16,
                x.as_ptr(),
                f16_consts!(),
                "vld1.16 {{d0-d1}}, [{a}]!",
                "vmovl.u16 q1, d1",
                "vmovl.u16 q0, d0",
                f16x4!("q0"),
                f16x4!("q1"),
            )
        }
    } else {
        [0.0; 8]
    };
    let mut tail = 0.0f32;
    for i in n8 * 8..n {
        tail += f16_bits_to_f32(w[i].to_bits()) * x[i];
    }
    combine8(acc) + tail
}

/// f16 → f32 conversion of a slice (exact).
#[inline]
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let n8 = n / 8;
    if n8 > 0 {
        // SAFETY: src holds ≥ 8·n8 f16 (transparent u16) and dst ≥ 8·n8 f32;
        // the loop reads and writes exactly those, and touches only the
        // declared NEON registers and the flags; NEON is checked at start-up.
        unsafe {
            asm!(
                f16_consts!(),
                "2:",
                "vld1.16 {{d0-d1}}, [{s}]!",
                "vmovl.u16 q1, d1",
                "vmovl.u16 q0, d0",
                f16x4!("q0"),
                f16x4!("q1"),
                "vst1.32 {{d0-d3}}, [{d}]!",
                "subs {n}, {n}, #1",
                "bne 2b",
                s = inout(reg) src.as_ptr() => _,
                d = inout(reg) dst.as_mut_ptr() => _,
                n = inout(reg) n8 => _,
                out("q0") _, out("q1") _,
                out("q4") _, out("q5") _, out("q6") _, out("q7") _,
                out("q8") _, out("q9") _, out("q10") _,
                options(nostack),
            );
        }
    }
    for i in n8 * 8..n {
        dst[i] = f16_bits_to_f32(src[i].to_bits());
    }
}

/// Blocks whose integer sums one `isums` call computes at most (the stack buffer).
const CHUNK: usize = 64;

/// Byte distance between the quants of consecutive activation blocks.
const ACT_STRIDE: usize = core::mem::size_of::<BlockQ8Act>();

/// `isums!(n, w, ws, x, out, setup, block)`: the exact integer sums of `n`
/// blocks into `out` (i32), four blocks per step and then one by one.
/// `block` is the text of one block: it loads the block's weights from
/// `{w}` and its 32 activation quants from `{x}` (advancing each by its
/// stride `{ws}` / `{xs}`) and leaves the 32 products pairwise added in the
/// i32 lanes of q8 (d16, d17).
macro_rules! isums {
    ($n:expr, $w:expr, $ws:expr, $x:expr, $out:expr, $setup:expr, $block:expr) => {
        asm!(
            $setup,
            "movs {n4}, {n}, lsr #2",
            "beq 3f",
            "2:",
            $block,
            "vpadd.i32 d24, d16, d17",
            $block,
            "vpadd.i32 d25, d16, d17",
            $block,
            "vpadd.i32 d26, d16, d17",
            $block,
            "vpadd.i32 d27, d16, d17",
            "vpadd.i32 d24, d24, d25",
            "vpadd.i32 d25, d26, d27",
            "vst1.32 {{d24-d25}}, [{out}]!", // four block sums
            "subs {n4}, {n4}, #1",
            "bne 2b",
            "3:",
            "ands {n}, {n}, #3",
            "beq 5f",
            "4:",
            $block,
            "vpadd.i32 d24, d16, d17",
            "vpadd.i32 d24, d24, d24",
            "vst1.32 {{d24[0]}}, [{out}]!",
            "subs {n}, {n}, #1",
            "bne 4b",
            "5:",
            n = inout(reg) $n => _,
            n4 = out(reg) _,
            w = inout(reg) $w => _,
            ws = in(reg) $ws,
            x = inout(reg) $x => _,
            xs = in(reg) ACT_STRIDE,
            out = inout(reg) $out => _,
            out("q0") _, out("q1") _, out("q2") _, out("q3") _,
            out("q8") _, out("q9") _, out("q10") _, out("q11") _,
            out("q12") _, out("q13") _, out("q14") _, out("q15") _,
            options(nostack),
        )
    };
}

/// One Q8 block: 32 weight and 32 activation quants, four `vmull.s8` (each
/// i8·i8 fits i16) and `vpadal.s16` into the i32 lanes of q8.
macro_rules! q8_block {
    () => {
        concat!(
            "vld1.8 {{d0-d3}}, [{w}], {ws}\n",
            "vld1.8 {{d4-d7}}, [{x}], {xs}\n",
            "vmull.s8 q8, d0, d4\n",
            "vmull.s8 q9, d1, d5\n",
            "vmull.s8 q10, d2, d6\n",
            "vmull.s8 q11, d3, d7\n",
            "vpaddl.s16 q8, q8\n",
            "vpadal.s16 q8, q9\n",
            "vpadal.s16 q8, q10\n",
            "vpadal.s16 q8, q11\n",
        )
    };
}

/// One Q4 block: 16 nibble bytes (byte j: element j low, j + 16 high) as
/// signed `nibble − 8` (q14 = 0x0f bytes, q15 = 8 bytes), then as `q8_block!`.
macro_rules! q4_block {
    () => {
        concat!(
            "vld1.8 {{d0-d1}}, [{w}], {ws}\n",
            "vld1.8 {{d4-d7}}, [{x}], {xs}\n",
            "vand q1, q0, q14\n",
            "vshr.u8 q0, q0, #4\n",
            "vsub.i8 q1, q1, q15\n", // elements 0..16
            "vsub.i8 q0, q0, q15\n", // elements 16..32
            "vmull.s8 q8, d2, d4\n",
            "vmull.s8 q9, d3, d5\n",
            "vmull.s8 q10, d0, d6\n",
            "vmull.s8 q11, d1, d7\n",
            "vpaddl.s16 q8, q8\n",
            "vpadal.s16 q8, q9\n",
            "vpadal.s16 q8, q10\n",
            "vpadal.s16 q8, q11\n",
        )
    };
}

/// out[k] = Σ_j w[k]_j·x[k]_j, exact, for k < out.len().
fn isums_q8<B: Q8Block>(w: &[B], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len();
    assert!(n > 0 && w.len() >= n && x.len() >= n);
    // SAFETY: the loop reads n blocks' 32 quants at stride size_of::<B>()
    // from w[0].quants() and at stride ACT_STRIDE from x[0].qs (both slices
    // hold ≥ n blocks, asserted; the quants are the blocks' trailing 32
    // bytes) and writes n i32 to out; it touches only the declared NEON
    // registers and the flags; NEON is checked by the start-up guard.
    unsafe {
        isums!(
            n,
            w[0].quants().as_ptr(),
            core::mem::size_of::<B>(),
            x[0].qs.as_ptr(),
            out.as_mut_ptr(),
            "",
            q8_block!()
        )
    }
}

/// out[k] = Σ_j (nibble_j − 8)·x[k]_j over w[k]'s nibbles, exact, for k < out.len().
fn isums_q4<B: Q4Block>(w: &[B], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len();
    assert!(n > 0 && w.len() >= n && x.len() >= n);
    // SAFETY: as `isums_q8`, reading 16 nibble bytes per weight block.
    unsafe {
        isums!(
            n,
            w[0].nibbles().as_ptr(),
            core::mem::size_of::<B>(),
            x[0].qs.as_ptr(),
            out.as_mut_ptr(),
            "vmov.i8 q14, #15\nvmov.i8 q15, #8",
            q4_block!()
        )
    }
}

/// `check!("qN")`: marks in q11 the lanes of qN whose magnitude is nonzero
/// and below 2^-51 (q15 = 2^-51's bits shifted left by one; temporaries q10, q14).
#[rustfmt::skip]
macro_rules! check {
    ($q:literal) => {
        concat!(
            "vshl.i32 q10, ", $q, ", #1\n", // the magnitude bits, shifted left
            "vcgt.u32 q14, q15, q10\n",
            "vtst.32 q10, q10, q10\n",
            "vand q14, q14, q10\n",
            "vorr q11, q11, q14\n",
        )
    };
}

/// `lanes[l]` += Σ over the blocks k ≡ l (mod 8) of (d_w·d_x)·isum, in
/// block order, for `sums.len()` (a multiple of 8) blocks in NEON: weight
/// scales from `wbits` (f16 bits when `f16`, else f32 bits), activation
/// scales `dx`. Returns false, leaving `lanes` meaningless, if a scale's
/// magnitude is nonzero and below 2^-51: otherwise every scale is zero or
/// normal, every nonzero d_w·d_x is ≥ 2^-102, and so every product and
/// partial sum is 0 or a multiple of 2^-125, never subnormal, and NEON's
/// flush-to-zero cannot change a bit.
fn scale8(f16: bool, sums: &[i32], wbits: &[u32], dx: &[f32], lanes: &mut [f32; 8]) -> bool {
    let n8 = sums.len() / 8;
    assert!(n8 > 0 && sums.len().is_multiple_of(8) && wbits.len() >= sums.len() && dx.len() >= sums.len());
    let (mut bad0, mut bad1): (u32, u32);
    macro_rules! pass {
        ($($cvt:expr),*) => {
            asm!(
                f16_consts!(),
                "vmov.i32 q15, #0x4c000000",
                "vmov.i32 q11, #0",
                "vld1.32 {{d24-d27}}, [{acc}]",
                "2:",
                "vld1.32 {{d4-d7}}, [{wb}]!",
                $($cvt,)*
                "vld1.32 {{d16-d19}}, [{dx}]!",
                check!("q2"),
                check!("q3"),
                check!("q8"),
                check!("q9"),
                "vmul.f32 q2, q2, q8", // d = d_w·d_x
                "vmul.f32 q3, q3, q9",
                "vld1.32 {{d0-d3}}, [{s}]!",
                "vcvt.f32.s32 q0, q0", // exact: |isum| < 2^24
                "vcvt.f32.s32 q1, q1",
                "vmul.f32 q0, q2, q0",
                "vmul.f32 q1, q3, q1",
                "vadd.f32 q12, q12, q0",
                "vadd.f32 q13, q13, q1",
                "subs {n}, {n}, #1",
                "bne 2b",
                "vst1.32 {{d24-d27}}, [{acc}]",
                "vorr d22, d22, d23",
                "vmov {bad0}, {bad1}, d22",
                acc = in(reg) lanes.as_mut_ptr(),
                wb = inout(reg) wbits.as_ptr() => _,
                dx = inout(reg) dx.as_ptr() => _,
                s = inout(reg) sums.as_ptr() => _,
                n = inout(reg) n8 => _,
                bad0 = out(reg) bad0,
                bad1 = out(reg) bad1,
                out("q0") _, out("q1") _, out("q2") _, out("q3") _,
                out("q4") _, out("q5") _, out("q6") _, out("q7") _,
                out("q8") _, out("q9") _, out("q10") _, out("q11") _,
                out("q12") _, out("q13") _, out("q14") _, out("q15") _,
                options(nostack),
            )
        };
    }
    // SAFETY: the loop reads 8·n8 elements of sums, wbits and dx (each holds
    // at least that many, asserted) and reads and writes the 8 f32 of
    // `lanes`; it touches only the declared NEON registers, the two outputs
    // and the flags; NEON is checked by the start-up guard.
    unsafe {
        if f16 {
            pass!(f16x4!("q2"), f16x4!("q3"))
        } else {
            pass!()
        }
    }
    bad0 | bad1 == 0
}

/// `lanes[b % 8]` += (d_w·d_x)·isum for blocks b = b0.. (one per `sums`
/// element) in scalar IEEE arithmetic, in block order.
fn scale_scalar(lanes: &mut [f32; 8], b0: usize, sums: &[i32], dw: impl Fn(usize) -> f32, dx: impl Fn(usize) -> f32) {
    for (k, &s) in sums.iter().enumerate() {
        let b = b0 + k;
        lanes[b % 8] += (dw(b) * dx(b)) * s as f32;
    }
}

/// Σ_b (d_w·d_x)·isum_b over `n` blocks in `portable`'s order: block b into
/// lane b % 8 (multiply, multiply, add), the lanes combined as
/// `portable::combine8`. The exact sums come `CHUNK` blocks at a time from
/// `isums(b0, out)`; `bits(b)` is weight block b's scale (f16 bits when
/// `f16`); the activation scales come from `x`'s contiguous array when it
/// has one, else from its blocks. Whole groups of eight blocks are scaled in
/// NEON (`scale8`), the last n % 8 in scalar code; if `scale8` finds a scale
/// that NEON's flush-to-zero could misread, the whole sum is redone in
/// scalar code.
#[inline]
fn scaled_sum(
    n: usize,
    x: ActRef,
    f16: bool,
    bits: impl Fn(usize) -> u32,
    mut isums: impl FnMut(usize, &mut [i32]),
) -> f32 {
    let (side, xb) = (x.has_side(), x.blocks());
    let dw = |b: usize| if f16 { f16_bits_to_f32(bits(b) as u16) } else { f32::from_bits(bits(b)) };
    let dx = |b: usize| if side { x.d[b] } else { xb[b].d };
    let mut lanes = [0.0f32; 8];
    let (mut sums, mut wbits, mut dxs) = ([0i32; CHUNK], [0u32; CHUNK], [0.0f32; CHUNK]);
    let n8 = n / 8 * 8;
    let mut exact = true;
    for b0 in (0..n8).step_by(CHUNK) {
        let m = CHUNK.min(n8 - b0);
        isums(b0, &mut sums[..m]);
        for (k, v) in wbits[..m].iter_mut().enumerate() {
            *v = bits(b0 + k);
        }
        let d = if side {
            &x.d[b0..b0 + m]
        } else {
            for (v, b) in dxs[..m].iter_mut().zip(&xb[b0..b0 + m]) {
                *v = b.d;
            }
            &dxs[..m]
        };
        exact &= scale8(f16, &sums[..m], &wbits[..m], d, &mut lanes);
    }
    if !exact {
        lanes = [0.0; 8];
        for b0 in (0..n8).step_by(CHUNK) {
            let sums = &mut sums[..CHUNK.min(n8 - b0)];
            isums(b0, sums);
            scale_scalar(&mut lanes, b0, sums, dw, dx);
        }
    }
    if n8 < n {
        let sums = &mut sums[..n - n8];
        isums(n8, sums);
        scale_scalar(&mut lanes, n8, sums, dw, dx);
    }
    combine8(lanes)
}

/// Q8 weights · Q8 activations: exact per-block integer sums in NEON, scaled
/// and summed in `portable`'s order (bit-identical).
#[inline]
pub fn dot_q8<'a, B: Q8Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32 {
    let x = x.into();
    debug_assert_eq!(w.len(), x.len());
    let (n, xb) = (w.len().min(x.len()), x.blocks());
    scaled_sum(n, x, B::F16_SCALE, |b| w[b].scale_bits(), |b0, out| isums_q8(&w[b0..], &xb[b0..], out))
}

/// Q4 weights · Q8 activations: Σ (nibble − 8)·q per block (exact), scaled as `dot_q8`.
#[inline]
pub fn dot_q4<'a, B: Q4Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32 {
    let x = x.into();
    debug_assert_eq!(w.len(), x.len());
    let (n, xb) = (w.len().min(x.len()), x.blocks());
    scaled_sum(n, x, B::F16_SCALE, |b| w[b].scale_bits(), |b0, out| isums_q4(&w[b0..], &xb[b0..], out))
}

/// out = x / sqrt(mean(x²) + eps) · (w + offset); elementwise as `portable`.
#[inline]
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    let inv = 1.0 / (dot_f32(x, x) / x.len() as f32 + eps).sqrt();
    let n = x.len().min(w.len()).min(out.len());
    out[..n].copy_from_slice(&x[..n]);
    map(Op::Norm(inv, offset), &mut out[..n], &w[..n]);
}

/// In-place softmax: vector exp, the sum in element order (as the x86 builds).
#[inline]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    map1(Op::ExpSub(max), x);
    let sum = x.iter().fold(0.0f32, |s, &e| s + e);
    map1(Op::Scale(1.0 / sum), x);
}

/// y += a·x (multiply then add, as `portable`)
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    map(Op::Axpy(a), y, x);
}

/// `f(gate chunk, e chunk, up chunk)` with e = `op` applied (NEON) to a copy
/// of the gate chunk, in chunks of 256.
fn with_exp(op: Op, gate: &mut [f32], up: &[f32], f: impl Fn(&mut [f32], &[f32], &[f32])) {
    let n = gate.len().min(up.len());
    let mut e = [0.0f32; 256];
    for (g, u) in gate[..n].chunks_mut(256).zip(up[..n].chunks(256)) {
        let e = &mut e[..g.len()];
        e.copy_from_slice(g);
        map1(op, e);
        f(g, e, u);
    }
}

/// gate ← silu(gate) · up: e^(−g) in NEON, g / (1 + e) · u in VFP (IEEE division).
#[inline]
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    with_exp(Op::ExpNeg, gate, up, |g, e, u| {
        for ((g, &e), &u) in g.iter_mut().zip(e).zip(u) {
            *g = *g / (1.0 + e) * u;
        }
    });
}

/// gate ← gelu_tanh(gate) · up, tanh(t) = 1 − 2/(e^{2t} + 1): e^{2t} in
/// NEON, the rest in VFP, in the x86 builds' operation order.
#[inline]
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    with_exp(Op::ExpGelu(0.797_884_6, 0.044715), gate, up, |g, e, u| {
        for ((g, &e), &u) in g.iter_mut().zip(e).zip(u) {
            let th = 1.0 - 2.0 / (e + 1.0);
            *g = 0.5 * *g * (1.0 + th) * u;
        }
    });
}

/// Test hook: e^x of every element through `exp4!`.
#[cfg(test)]
pub fn vexp(x: &mut [f32]) {
    map1(Op::Exp, x);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `portable::exp4_model` (the x86 builds' `exp4`) with armv7 NEON's one
    /// difference: a subnormal result is flushed to zero.
    fn model(x: f32) -> f32 {
        let v = crate::kernels::portable::exp4_model(x);
        if v < f32::MIN_POSITIVE {
            0.0
        } else {
            v
        }
    }

    /// exp within 1e-6 relative of f64 on the whole range with a normal
    /// result, and its special values (mod.rs's test runs on x86 only).
    #[test]
    fn armv7_exp_is_within_1e6_relative() {
        let mut xs: Vec<f32> = (0..100_000).map(|i| -87.3 + i as f32 * (88.72 + 87.3) / 100_000.0).collect();
        xs.extend([0.0, -0.0, 1e-8, -1e-8, 88.72, -87.33, 0.5 * std::f32::consts::LN_2]);
        let mut got = xs.clone();
        vexp(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = (x as f64).exp();
            let rel = (g as f64 - want).abs() / want;
            assert!(rel <= 1e-6, "exp({x}) = {g}, want {want} (rel {rel:e})");
        }
        let mut sp = vec![f32::NEG_INFINITY, -200.0, -104.0, f32::INFINITY, 89.0, f32::NAN, 0.0, -90.0, 1e-40];
        vexp(&mut sp);
        assert_eq!(&sp[..5], &[0.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY]);
        assert!(sp[5].is_nan());
        assert_eq!(sp[6], 1.0);
        assert_eq!(sp[7], 0.0, "a subnormal result is flushed to zero");
        assert_eq!(sp[8], 1.0, "a subnormal input is read as zero");
    }

    /// The magic-number rounding and the whole exp give the x86 builds' bits
    /// (the model, FTZ aside) on a sweep, and at every half-integer of
    /// x·log2 e in the clamped range and its neighbours, where rounding to
    /// nearest even decides n.
    #[test]
    fn armv7_exp_matches_the_x86_operation_sequence() {
        let mut xs: Vec<f32> = (0..200_003).map(|i| -110.0 + i as f32 * 0.001).collect();
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE, -1e-30, 88.72283, -103.97208]);
        for k in -151..=128 {
            let x = ((k as f64 + 0.5) / std::f64::consts::LOG2_E) as f32;
            let b = x.to_bits();
            for d in 0..=16u32 {
                xs.extend([f32::from_bits(b.wrapping_add(d)), f32::from_bits(b.wrapping_sub(d))]);
            }
        }
        // inputs whose product with log2 e is exactly a half-integer
        let ties = xs.iter().filter(|&&x| {
            let t = x * std::f32::consts::LOG2_E;
            t.abs() < 150.0 && t.fract().abs() == 0.5
        });
        assert!(ties.count() > 0, "the sweep must include exact ties");
        let mut got = xs.clone();
        vexp(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = model(x);
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "exp({x}) = {g}, model {want}");
        }
    }

    /// The quantised dots at the edge of `scale8`'s flush-to-zero check
    /// (scales of 2^-51, one ulp below, f32 subnormals, mixed signs) give
    /// `portable`'s bits, whichever path computes them.
    #[test]
    fn armv7_scale_check_boundary_matches_portable() {
        use super::super::portable;
        use crate::quant::{ActQ8, BlockQ8_0F32};
        let t = f32::powi(2.0, -51);
        let below = f32::from_bits(t.to_bits() - 1);
        let scales = [t, -t, below, -below, 1.0, 3.0e-39, f32::MIN_POSITIVE, 0.0];
        for nb in [8, 16, 19, 64, 72] {
            for (i, &sw) in scales.iter().enumerate() {
                for &sx in &scales {
                    let mut s = (nb * 131 + i) as u32 | 1;
                    let mut next = move || {
                        s ^= s << 13;
                        s ^= s >> 17;
                        s ^= s << 5;
                        s
                    };
                    let x: Vec<BlockQ8Act> = (0..nb)
                        .map(|k| {
                            let mut b = BlockQ8Act { d: if k % 3 == 0 { sx } else { 0.37 }, ..Default::default() };
                            b.qs.iter_mut().for_each(|q| *q = ((next() % 255) as i32 - 127) as i8);
                            b.sum = b.qs.iter().map(|&q| q as i32).sum();
                            b
                        })
                        .collect();
                    let w: Vec<BlockQ8_0F32> = (0..nb)
                        .map(|k| {
                            let mut b = BlockQ8_0F32 { d: if k % 2 == 0 { sw } else { t }, qs: [0; 32] };
                            b.qs.iter_mut().for_each(|q| *q = next() as i8);
                            b
                        })
                        .collect();
                    let xq = ActQ8::from_blocks(x);
                    let (got, want) = (dot_q8(&w, &xq), portable::dot_q8(&w, &xq));
                    assert_eq!(got.to_bits(), want.to_bits(), "nb={nb} w scale {sw:e} x scale {sx:e}");
                }
            }
        }
    }

    /// The Q4 nibble unpacking and the four-block / one-block paths of the
    /// integer sums, against a scalar sum, for every count 1..=70.
    #[test]
    fn armv7_block_sums_match_scalar() {
        use crate::quant::{BlockQ4_0, BlockQ8_0};
        let mut s = 0x1234_5678u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for n in 1..=70 {
            let x: Vec<BlockQ8Act> = (0..n)
                .map(|_| {
                    let mut b = BlockQ8Act::default();
                    b.qs.iter_mut().for_each(|q| *q = (next() % 255) as i8);
                    b.qs.iter_mut().for_each(|q| *q = (*q).max(-127));
                    b
                })
                .collect();
            let w8: Vec<BlockQ8_0> = (0..n)
                .map(|_| {
                    let mut b = BlockQ8_0::default();
                    b.qs.iter_mut().for_each(|q| *q = next() as i8);
                    b
                })
                .collect();
            let w4: Vec<BlockQ4_0> = (0..n)
                .map(|_| {
                    let mut b = BlockQ4_0::default();
                    b.qs.iter_mut().for_each(|q| *q = next() as u8);
                    b
                })
                .collect();
            let (mut g8, mut g4) = (vec![0; n], vec![0; n]);
            isums_q8(&w8, &x, &mut g8);
            isums_q4(&w4, &x, &mut g4);
            for k in 0..n {
                let want8: i32 = w8[k].qs.iter().zip(&x[k].qs).map(|(&a, &b)| a as i32 * b as i32).sum();
                let want4: i32 = (0..16)
                    .map(|j| {
                        let byte = w4[k].qs[j] as i32;
                        ((byte & 15) - 8) * x[k].qs[j] as i32 + ((byte >> 4) - 8) * x[k].qs[j + 16] as i32
                    })
                    .sum();
                assert_eq!(g8[k], want8, "q8 n={n} block {k}");
                assert_eq!(g4[k], want4, "q4 n={n} block {k}");
            }
        }
    }
}
