//! Macros the ISA modules share: `entry_points!` (the `Kernels` methods of
//! an ISA, each calling the module function compiled with the build's
//! target features), `unroll!` and `f32_rows4!`. Macros rather than
//! functions so that everything is inlined into the target-feature code
//! that uses it.

/// The `Kernels` methods named (or the groups named: `f32_ops`, `kv_rows`,
/// `int8_dots`, `int8_dots_x4`, `mxfp4_dots`, `rows8`, `mxfp4_rows8`, `mxfp4_tiles`, `kquant_dots`, `kquant_dots_x4`, `kquant_rows8`, `tiles`, `kquant_tiles`), each forwarding to the function of
/// the same name in module `$m`, compiled with this build's target features
/// (`isa_features!`), so calling it from the method, which is not, is
/// `unsafe`.
#[allow(unused_macros)]
macro_rules! entry_points {
    ($m:ident: $($name:ident),* $(,)?) => { $( entry_points!(@group $m $name); )* };
    // The groups of kernels an ISA module has or lacks together.
    (@group $m:ident f32_ops) => {
        entry_points!($m: dot_f32, dot_f16_f32, rmsnorm, softmax, axpy, silu_mul, gelu_tanh_mul, f16_to_f32, exp);
    };
    (@group $m:ident kv_rows) => { entry_points!($m: dot_f32_rows, axpy_rows); };
    (@group $m:ident int8_dots) => { entry_points!($m: dot_q8, dot_q4); };
    (@group $m:ident int8_dots_x4) => { entry_points!($m: dot_q8_x4, dot_q4_x4); };
    (@group $m:ident mxfp4_dots) => { entry_points!($m: dot_mxfp4, dot_mxfp4_x4); };
    (@group $m:ident kquant_dots) => { entry_points!($m: dot_q4k, dot_q5k, dot_q6k); };
    (@group $m:ident kquant_dots_x4) => { entry_points!($m: dot_q4k_x4, dot_q5k_x4, dot_q6k_x4); };
    (@group $m:ident rows8) => {
        entry_points!($m: dot_q8_r8, dot_q4_r8, dot_q8_r8_x2, dot_q4_r8_x2, dot_q8_r8_x3, dot_q4_r8_x3, dot_q8_r8_x4, dot_q4_r8_x4);
    };
    (@group $m:ident mxfp4_rows8) => {
        entry_points!($m: dot_mxfp4_r8, dot_mxfp4_r8_x2, dot_mxfp4_r8_x3, dot_mxfp4_r8_x4);
    };
    (@group $m:ident mxfp4_tiles) => { entry_points!(@tile $m tile_mxfp4 BlockMxfp4x8); };
    (@group $m:ident kquant_rows8) => {
        entry_points!($m: dot_q4k_r8, dot_q4k_r8_x2, dot_q4k_r8_x3, dot_q4k_r8_x4);
        entry_points!($m: dot_q5k_r8, dot_q5k_r8_x2, dot_q5k_r8_x3, dot_q5k_r8_x4);
        entry_points!($m: dot_q6k_r8, dot_q6k_r8_x2, dot_q6k_r8_x3, dot_q6k_r8_x4);
    };
    (@group $m:ident tiles) => {
        entry_points!(@group $m kquant_tiles);
        entry_points!(@tile $m tile_q8 BlockQ8_0x8);
        entry_points!(@tile $m tile_q4 BlockQ4_0x8);
    };
    // K-quant tiles only: Q8_0 and Q4_0 keep the trait's defaults.
    (@group $m:ident kquant_tiles) => {
        const TILE_TOKENS: usize = $m::TILE_TOKENS;
        entry_points!(@tile $m tile_q4k BlockQ4Kx8);
        entry_points!(@tile $m tile_q5k BlockQ5Kx8);
        entry_points!(@tile $m tile_q6k BlockQ6Kx8);
    };
    (@tile $m:ident $name:ident $blk:ident) => {
        #[inline]
        fn $name(w: &[crate::quant::$blk], nb: usize, xs: &[crate::quant::ActRef], out: &mut [[f32; 16]]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::$name(w, nb, xs, out) }
        }
    };
    (@group $m:ident $name:ident) => { entry_points!(@one $m $name); };
    // The several-token forms of the eight-row kernels: `$n` activation rows.
    (@rows $m:ident $name:ident $blk:ident $n:literal) => {
        #[inline]
        fn $name(w: &[crate::quant::$blk], xs: [crate::quant::ActRef; $n]) -> [[f32; 8]; $n] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::$name(w, xs) }
        }
    };
    (@one $m:ident dot_q8_r8_x2) => { entry_points!(@rows $m dot_q8_r8_x2 BlockQ8_0x8 2); };
    (@one $m:ident dot_q8_r8_x3) => { entry_points!(@rows $m dot_q8_r8_x3 BlockQ8_0x8 3); };
    (@one $m:ident dot_q8_r8_x4) => { entry_points!(@rows $m dot_q8_r8_x4 BlockQ8_0x8 4); };
    (@one $m:ident dot_q4_r8_x2) => { entry_points!(@rows $m dot_q4_r8_x2 BlockQ4_0x8 2); };
    (@one $m:ident dot_q4_r8_x3) => { entry_points!(@rows $m dot_q4_r8_x3 BlockQ4_0x8 3); };
    (@one $m:ident dot_q4_r8_x4) => { entry_points!(@rows $m dot_q4_r8_x4 BlockQ4_0x8 4); };
    (@one $m:ident dot_q4k_r8_x2) => { entry_points!(@rows $m dot_q4k_r8_x2 BlockQ4Kx8 2); };
    (@one $m:ident dot_q4k_r8_x3) => { entry_points!(@rows $m dot_q4k_r8_x3 BlockQ4Kx8 3); };
    (@one $m:ident dot_q4k_r8_x4) => { entry_points!(@rows $m dot_q4k_r8_x4 BlockQ4Kx8 4); };
    (@one $m:ident dot_q5k_r8_x2) => { entry_points!(@rows $m dot_q5k_r8_x2 BlockQ5Kx8 2); };
    (@one $m:ident dot_q5k_r8_x3) => { entry_points!(@rows $m dot_q5k_r8_x3 BlockQ5Kx8 3); };
    (@one $m:ident dot_q5k_r8_x4) => { entry_points!(@rows $m dot_q5k_r8_x4 BlockQ5Kx8 4); };
    (@one $m:ident dot_mxfp4_r8_x2) => { entry_points!(@rows $m dot_mxfp4_r8_x2 BlockMxfp4x8 2); };
    (@one $m:ident dot_mxfp4_r8_x3) => { entry_points!(@rows $m dot_mxfp4_r8_x3 BlockMxfp4x8 3); };
    (@one $m:ident dot_mxfp4_r8_x4) => { entry_points!(@rows $m dot_mxfp4_r8_x4 BlockMxfp4x8 4); };
    (@one $m:ident dot_q6k_r8_x2) => { entry_points!(@rows $m dot_q6k_r8_x2 BlockQ6Kx8 2); };
    (@one $m:ident dot_q6k_r8_x3) => { entry_points!(@rows $m dot_q6k_r8_x3 BlockQ6Kx8 3); };
    (@one $m:ident dot_q6k_r8_x4) => { entry_points!(@rows $m dot_q6k_r8_x4 BlockQ6Kx8 4); };
    (@one $m:ident dot_f32) => {
        #[inline]
        fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_f32(a, b) }
        }
    };
    (@one $m:ident dot_f16_f32) => {
        #[inline]
        fn dot_f16_f32(w: &[half::f16], x: &[f32]) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_f16_f32(w, x) }
        }
    };
    (@one $m:ident dot_q8) => {
        #[inline]
        fn dot_q8<'a, B: crate::quant::Q8Block>(w: &[B], x: impl Into<crate::quant::ActRef<'a>>) -> f32 {
            // SAFETY: `$m`'s functions enable exactly the target features
            // this whole build was compiled with (`isa_features!`, written by
            // shared/build.rs from the variant table), and the executable's
            // start-up guard (variants/src/guard*.rs) exits before main on a
            // CPU that lacks any of them.
            unsafe { $m::dot_q8(w, x.into()) }
        }
    };
    (@one $m:ident dot_q4) => {
        #[inline]
        fn dot_q4<'a, B: crate::quant::Q4Block>(w: &[B], x: impl Into<crate::quant::ActRef<'a>>) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q4(w, x.into()) }
        }
    };
    (@one $m:ident dot_q8_x4) => {
        #[inline]
        fn dot_q8_x4<B: crate::quant::Q8Block>(w: &[B], xs: [crate::quant::ActRef; 4]) -> [f32; 4] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q8_x4(w, xs) }
        }
    };
    (@one $m:ident dot_q4_x4) => {
        #[inline]
        fn dot_q4_x4<B: crate::quant::Q4Block>(w: &[B], xs: [crate::quant::ActRef; 4]) -> [f32; 4] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q4_x4(w, xs) }
        }
    };
    (@one $m:ident dot_q8_r8) => {
        #[inline]
        fn dot_q8_r8(w: &[crate::quant::BlockQ8_0x8], x: crate::quant::ActRef) -> [f32; 8] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q8_r8(w, x) }
        }
    };
    (@one $m:ident dot_mxfp4_r8) => {
        #[inline]
        fn dot_mxfp4_r8(w: &[crate::quant::BlockMxfp4x8], x: crate::quant::ActRef) -> [f32; 8] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_mxfp4_r8(w, x) }
        }
    };
    (@one $m:ident dot_q4_r8) => {
        #[inline]
        fn dot_q4_r8(w: &[crate::quant::BlockQ4_0x8], x: crate::quant::ActRef) -> [f32; 8] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q4_r8(w, x) }
        }
    };
    (@one $m:ident dot_q4k_r8) => {
        #[inline]
        fn dot_q4k_r8(w: &[crate::quant::BlockQ4Kx8], x: crate::quant::ActRef) -> [f32; 8] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q4k_r8(w, x) }
        }
    };
    (@one $m:ident dot_q5k_r8) => {
        #[inline]
        fn dot_q5k_r8(w: &[crate::quant::BlockQ5Kx8], x: crate::quant::ActRef) -> [f32; 8] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q5k_r8(w, x) }
        }
    };
    (@one $m:ident dot_q6k_r8) => {
        #[inline]
        fn dot_q6k_r8(w: &[crate::quant::BlockQ6Kx8], x: crate::quant::ActRef) -> [f32; 8] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q6k_r8(w, x) }
        }
    };
    (@one $m:ident dot_mxfp4) => {
        #[inline]
        fn dot_mxfp4(w: &[crate::quant::BlockMxfp4], x: crate::quant::ActRef) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_mxfp4(w, x) }
        }
    };
    (@one $m:ident dot_mxfp4_x4) => {
        #[inline]
        fn dot_mxfp4_x4(w: &[crate::quant::BlockMxfp4], xs: [crate::quant::ActRef; 4]) -> [f32; 4] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_mxfp4_x4(w, xs) }
        }
    };
    (@one $m:ident dot_q4k) => {
        #[inline]
        fn dot_q4k(w: &[crate::quant::BlockQ4K], x: crate::quant::ActRef) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q4k(w, x) }
        }
    };
    (@one $m:ident dot_q4k_x4) => {
        #[inline]
        fn dot_q4k_x4(w: &[crate::quant::BlockQ4K], xs: [crate::quant::ActRef; 4]) -> [f32; 4] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q4k_x4(w, xs) }
        }
    };
    (@one $m:ident dot_q5k) => {
        #[inline]
        fn dot_q5k(w: &[crate::quant::BlockQ5K], x: crate::quant::ActRef) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q5k(w, x) }
        }
    };
    (@one $m:ident dot_q5k_x4) => {
        #[inline]
        fn dot_q5k_x4(w: &[crate::quant::BlockQ5K], xs: [crate::quant::ActRef; 4]) -> [f32; 4] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q5k_x4(w, xs) }
        }
    };
    (@one $m:ident dot_q6k) => {
        #[inline]
        fn dot_q6k(w: &[crate::quant::BlockQ6K], x: crate::quant::ActRef) -> f32 {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q6k(w, x) }
        }
    };
    (@one $m:ident dot_q6k_x4) => {
        #[inline]
        fn dot_q6k_x4(w: &[crate::quant::BlockQ6K], xs: [crate::quant::ActRef; 4]) -> [f32; 4] {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_q6k_x4(w, xs) }
        }
    };
    (@one $m:ident int8_peak) => {
        fn int8_peak(rounds: usize) -> (u64, i32) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::int8_peak(rounds) }
        }
    };
    (@one $m:ident dot_f32_rows) => {
        #[inline]
        fn dot_f32_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::dot_f32_rows(q, rows, stride, out) }
        }
    };
    (@one $m:ident axpy_rows) => {
        #[inline]
        fn axpy_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::axpy_rows(w, rows, stride, out) }
        }
    };
    (@one $m:ident rmsnorm) => {
        #[inline]
        fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::rmsnorm(x, w, eps, out) }
        }
    };
    (@one $m:ident softmax) => {
        #[inline]
        fn softmax(x: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::softmax(x) }
        }
    };
    (@one $m:ident axpy) => {
        #[inline]
        fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::axpy(a, x, y) }
        }
    };
    (@one $m:ident silu_mul) => {
        #[inline]
        fn silu_mul(gate: &mut [f32], up: &[f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::silu_mul(gate, up) }
        }
    };
    (@one $m:ident gelu_tanh_mul) => {
        #[inline]
        fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::gelu_tanh_mul(gate, up) }
        }
    };
    (@one $m:ident f16_to_f32) => {
        #[inline]
        fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::f16_to_f32(src, dst) }
        }
    };
    (@one $m:ident exp) => {
        fn exp(x: &mut [f32]) {
            // SAFETY: see `entry_points!(@one $m dot_q8)`.
            unsafe { $m::exp(x) }
        }
    };
}

/// `[body(0), body(1), …]` with the index substituted into `body`
/// textually, so every element is inlined (a closure passed through
/// `core::array::from_fn` is not, and loses its target features).
#[allow(unused_macros)]
macro_rules! unroll {
    (@at [$($i:literal)*], |$j:ident| $body:expr) => {
        [$({
            let $j = $i as usize;
            $body
        }),*]
    };
    (1, |$j:ident| $body:expr) => { unroll!(@at [0], |$j| $body) };
    (2, |$j:ident| $body:expr) => { unroll!(@at [0 1], |$j| $body) };
    (3, |$j:ident| $body:expr) => { unroll!(@at [0 1 2], |$j| $body) };
    (4, |$j:ident| $body:expr) => { unroll!(@at [0 1 2 3], |$j| $body) };
    (5, |$j:ident| $body:expr) => { unroll!(@at [0 1 2 3 4], |$j| $body) };
    (6, |$j:ident| $body:expr) => { unroll!(@at [0 1 2 3 4 5], |$j| $body) };
    (7, |$j:ident| $body:expr) => { unroll!(@at [0 1 2 3 4 5 6], |$j| $body) };
    (8, |$j:ident| $body:expr) => { unroll!(@at [0 1 2 3 4 5 6 7], |$j| $body) };
}

/// `dot_f32_rows`' algorithm, written once for the ISA modules: four rows
/// per step (`|r, full| sums4`: the four rows' `dot_f32` partial sums over
/// columns 0..full, full = n / 8 · 8, combined as the module's `hsum`, as
/// `[f32; 4]`), then each row's scalar tail in column order, exactly as
/// `dot_f32` adds it; rows left over go through `dot_f32` itself. A macro,
/// so that it is inlined into the kernel.
#[allow(unused_macros)]
macro_rules! f32_rows4 {
    ($q:expr, $rows:expr, $stride:expr, $out:expr, |$r:ident, $full:ident| $sums4:expr) => {{
        let (q, rows, stride, out): (&[f32], &[f32], usize, &mut [f32]) = ($q, $rows, $stride, $out);
        let n = q.len();
        let $full = n / 8 * 8;
        let mut p = 0;
        while p + 4 <= out.len() {
            let $r = unroll!(4, |j| &rows[(p + j) * stride..(p + j) * stride + n]);
            let sums: [f32; 4] = $sums4;
            for j in 0..4 {
                let mut tail = 0.0f32;
                for c in $full..n {
                    tail += q[c] * $r[j][c];
                }
                out[p + j] = sums[j] + tail;
            }
            p += 4;
        }
        for p in p..out.len() {
            out[p] = dot_f32(q, &rows[p * stride..p * stride + n]);
        }
    }};
}

/// The loop of the x86 modules' `int8_peak`, written once: `$n` (≥ 1)
/// rounds of `$step` (assembler lines) once per accumulator, by the
/// `$irp` line (`.irp acc, {a0}, ...` with the operand modifier of the
/// register class), the step naming the accumulator `\acc`, its inputs
/// `{u}`, `{s}`, `{ones}` and two temporaries `{t0}`, `{t1}`. `$a` is the
/// array of accumulators, `$acc = $i` names each operand and its index. In
/// `asm!` so that the compiler can neither hoist the loop-invariant
/// products nor merge the chains. The last template line is an assembler
/// comment naming every operand, so a step need not use all of them.
#[allow(unused_macros)]
macro_rules! peak_asm {
    ($n:expr, $class:ident, ($u:expr, $s:expr, $ones:expr), $a:ident[$($acc:ident = $i:tt),*], $irp:literal,
     [$($step:literal),* $(,)?]) => {
        // SAFETY: register-only arithmetic with instructions of the calling
        // function's target features; `$n` ≥ 1 counts down to 0.
        unsafe {
            core::arch::asm!(
                "2:",
                $irp,
                $($step,)*
                ".endr",
                "dec {n}",
                "jnz 2b",
                "# {u} {s} {ones} {t0} {t1}",
                n = inout(reg) $n => _,
                u = in($class) $u,
                s = in($class) $s,
                ones = in($class) $ones,
                $($acc = inout($class) $a[$i],)*
                t0 = out($class) _,
                t1 = out($class) _,
                options(nomem, nostack),
            )
        }
    };
}
