//! Start-up CPU guard for AArch64 Linux: a `global_asm!` routine in
//! `.init_array` (priority 0, before std's own constructors and so before any
//! Rust code compiled with this build's target features) that asks the
//! kernel's auxiliary vector, through libc's `getauxval(AT_HWCAP)` /
//! `getauxval(AT_HWCAP2)`, for every CPU feature of this build's row of the
//! variant table (build/src/variants.rs; shared/build.rs fails the build if
//! the row differs from the features the compiler enables; bits from
//! `AARCH64_FEATURES`: `dotprod` = HWCAP_ASIMDDP, `sve` = HWCAP_SVE, `i8mm` =
//! HWCAP2_I8MM, ...). On a miss it writes one line to stderr with a
//! raw `write` syscall and ends the process with `exit_group(3)`, the same
//! contract as the x86-64 guard (variants/src/guard.rs). The routine uses only
//! baseline A64 instructions; `getauxval` is plain glibc code, and glibc has
//! set up the auxiliary vector before it runs `.init_array` (static and
//! dynamic executables alike).

use crate::table::{find, str_eq, Hwcap, HwcapFeature, Variant, AARCH64_FEATURES, AARCH64_VARIANTS};

/// This build's row of the variant table: the features it needs, in the
/// order they are checked (the one that names the build first: an SVE
/// build on a CPU without SVE, i8mm and dotprod is told about 'sve').
const VARIANT: &Variant = match find(AARCH64_VARIANTS, krafla::kernels::ISA) {
    Some(v) => v,
    None => panic!("this build's kernel set is not a row of AARCH64_VARIANTS"),
};
const N: usize = VARIANT.cpu_features.len();

/// Linux `AT_HWCAP` / `AT_HWCAP2` (`getauxval`'s argument).
const AT_HWCAP: u64 = 16;
const AT_HWCAP2: u64 = 26;

const MSG_CAP: usize = 168;

/// One check as the assembly reads it (offsets 0, 8, 16, 24).
#[repr(C)]
pub struct Check {
    /// `AT_HWCAP` or `AT_HWCAP2`.
    at: u64,
    /// The feature's bit in that word.
    mask: u64,
    len: u64,
    msg: [u8; MSG_CAP],
}
const CHECK_SIZE: usize = core::mem::size_of::<Check>();
const _: () = assert!(CHECK_SIZE == 24 + MSG_CAP);

/// The `AARCH64_FEATURES` entry called `name`.
const fn feature(name: &str) -> &'static HwcapFeature {
    let mut i = 0;
    while i < AARCH64_FEATURES.len() {
        if str_eq(AARCH64_FEATURES[i].name, name) {
            return &AARCH64_FEATURES[i];
        }
        i += 1;
    }
    panic!("AARCH64_VARIANTS names a feature AARCH64_FEATURES lacks")
}

/// The refusal message for `feature` (see `guard_message`).
const fn message(feature: &str) -> ([u8; MSG_CAP], u64) {
    let (msg, len) = crate::guard_message::refusal::<MSG_CAP>(feature);
    (msg, len as u64)
}

/// The checks, in the row's order, plus one unused entry so the table is never empty.
#[used]
static CHECKS: [Check; N + 1] = {
    const EMPTY: Check = Check { at: 0, mask: 0, len: 0, msg: [0; MSG_CAP] };
    let mut out = [EMPTY; N + 1];
    let mut i = 0;
    while i < N {
        let f = feature(VARIANT.cpu_features[i]);
        let (msg, len) = message(f.name);
        let at = match f.word {
            Hwcap::Hwcap => AT_HWCAP,
            Hwcap::Hwcap2 => AT_HWCAP2,
        };
        out[i] = Check { at, mask: 1 << f.bit, len, msg };
        i += 1;
    }
    out
};

extern "C" {
    /// glibc's `unsigned long getauxval(unsigned long type)`.
    fn getauxval(kind: core::ffi::c_ulong) -> core::ffi::c_ulong;
}

// SAFETY: the routine follows AAPCS64 (it saves x19, x20 and the frame
// record it uses, keeps sp 16-byte aligned, and calls only getauxval, which
// is safe to call once glibc runs constructors), reads only CHECKS (N + 1
// entries of CHECK_SIZE bytes; the loop visits the first N), and on a miss
// only writes CHECKS' message bytes to fd 2 and exits. It runs before any
// Rust code, so it touches no Rust state.
//
// The guard (AAPCS64): x19 = current check, w20 = checks left, both
// callee-saved and so saved with the frame record; the stack stays 16-byte
// aligned. getauxval returns 0 for an unknown AT_* (old kernels without
// AT_HWCAP2), which reads as "feature missing".
core::arch::global_asm!(
    ".pushsection .text.krafla_cpu_guard,\"ax\",@progbits",
    ".p2align 4",
    "krafla_cpu_guard_aarch64:",
    "stp x29, x30, [sp, #-32]!",
    "mov x29, sp",
    "stp x19, x20, [sp, #16]",
    "adrp x19, {checks}",
    "add x19, x19, :lo12:{checks}",
    "mov w20, #{n}",
    "2:",
    "cbz w20, 9f",
    "ldr x0, [x19]",
    "bl {getauxval}",
    "ldr x1, [x19, #8]",
    "and x0, x0, x1",
    "cmp x0, x1",
    "b.ne 8f",
    "add x19, x19, #{size}",
    "sub w20, w20, #1",
    "b 2b",
    "9:",
    "ldp x19, x20, [sp, #16]",
    "ldp x29, x30, [sp], #32",
    "ret",
    // 8: the check at x19 failed: write(2, msg, len), then exit_group(3).
    "8:",
    "mov x0, #2",
    "add x1, x19, #24",
    "ldr x2, [x19, #16]",
    "mov x8, #64",
    "svc #0",
    "mov x0, #3",
    "mov x8, #94",
    "svc #0",
    "brk #0",
    ".popsection",
    // Priority 0: before other constructors (std's own run at 99).
    ".pushsection .init_array.00000,\"aw\"",
    ".p2align 3",
    ".quad krafla_cpu_guard_aarch64",
    ".popsection",
    checks = sym CHECKS,
    getauxval = sym getauxval,
    n = const N,
    size = const CHECK_SIZE,
);
