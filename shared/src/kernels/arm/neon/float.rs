//! armv7 NEON f32 kernels in `asm!`: dots (f32 and f16 weights), f16
//! conversion, the element-wise passes (exp for softmax / SiLU / GELU, axpy,
//! rmsnorm's scaling). See the module doc (mod.rs) for what armv7 NEON's
//! flush-to-zero changes.

use core::arch::asm;

use half::f16;

use crate::kernels::portable::{combine8, f16_bits_to_f32};

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
    /// e^a (`exp`)
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
    /// (a·inv)·b
    Norm(f32),
}

/// `op` over `n4` ≥ 1 groups of four lanes.
///
/// # Safety
/// `a`, `b` and `out` must be valid for 4·n4 f32 reads (writes for `out`);
/// `out` may equal `a`.
unsafe fn map_raw(op: Op, a: *const f32, b: *const f32, out: *mut f32, n4: usize) {
    debug_assert!(n4 > 0);
    // SAFETY: (every arm) the loop reads 4·n4 f32 from `a` and `b` and
    // writes 4·n4 to `out` (valid by this function's contract), reads the
    // 16 f32 of `EXP_CONSTS`, and touches only the NEON registers it
    // declares clobbered and the flags; no stack. NEON is required by this
    // build and checked by the start-up guard (variants/src/guard_arm.rs).
    unsafe {
        match op {
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
            Op::Norm(inv) => map4!(n4, a, b, out, [inv, 0.0], "vmul.f32 q0, q0, q2", "vmul.f32 q0, q0, q1"),
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
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
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
pub(crate) fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
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
pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
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

/// out = x / sqrt(mean(x²) + eps) · w; elementwise as `portable`.
#[inline]
pub(crate) fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = 1.0 / (dot_f32(x, x) / x.len() as f32 + eps).sqrt();
    let n = x.len().min(w.len()).min(out.len());
    out[..n].copy_from_slice(&x[..n]);
    map(Op::Norm(inv), &mut out[..n], &w[..n]);
}

/// In-place softmax: vector exp, the sum in element order (as the x86 builds).
#[inline]
pub(crate) fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    map1(Op::ExpSub(max), x);
    let sum = x.iter().fold(0.0f32, |s, &e| s + e);
    map1(Op::Scale(1.0 / sum), x);
}

/// y += a·x (multiply then add, as `portable`)
#[inline]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
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
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    with_exp(Op::ExpNeg, gate, up, |g, e, u| {
        for ((g, &e), &u) in g.iter_mut().zip(e).zip(u) {
            *g = *g / (1.0 + e) * u;
        }
    });
}

/// gate ← gelu_tanh(gate) · up, tanh(t) = 1 − 2/(e^{2t} + 1): e^{2t} in
/// NEON, the rest in VFP, in the x86 builds' operation order.
#[inline]
pub(crate) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    with_exp(Op::ExpGelu(0.797_884_6, 0.044715), gate, up, |g, e, u| {
        for ((g, &e), &u) in g.iter_mut().zip(e).zip(u) {
            let th = 1.0 - 2.0 / (e + 1.0);
            *g = 0.5 * *g * (1.0 + th) * u;
        }
    });
}

/// e^x of every element through `exp4!`.
pub(crate) fn exp(x: &mut [f32]) {
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
    /// result, and its special values (kernels/tests.rs's runs on x86 only).
    #[test]
    fn armv7_exp_is_within_1e6_relative() {
        let mut xs: Vec<f32> = (0..100_000).map(|i| -87.3 + i as f32 * (88.72 + 87.3) / 100_000.0).collect();
        xs.extend([0.0, -0.0, 1e-8, -1e-8, 88.72, -87.33, 0.5 * std::f32::consts::LN_2]);
        let mut got = xs.clone();
        exp(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = (x as f64).exp();
            let rel = (g as f64 - want).abs() / want;
            assert!(rel <= 1e-6, "exp({x}) = {g}, want {want} (rel {rel:e})");
        }
        let mut sp = vec![f32::NEG_INFINITY, -200.0, -104.0, f32::INFINITY, 89.0, f32::NAN, 0.0, -90.0, 1e-40];
        exp(&mut sp);
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
        exp(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = model(x);
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "exp({x}) = {g}, model {want}");
        }
    }
}
