//! Start-up CPU guard for 32-bit ARM (armv7hf) Linux: a `global_asm!`
//! routine in `.init_array` (priority 0, before std's own constructors and
//! so before any Rust code compiled with NEON) that asks the kernel's
//! auxiliary vector, through glibc's `getauxval(AT_HWCAP)`, for the CPU
//! features of the one armv7hf build (`ARM_VARIANTS[0].cpu_features` in
//! build/src/variants.rs, in that order: `neon` = HWCAP_NEON, `vfp4` =
//! HWCAP_VFPv4, bits from `ARM_FEATURES`), as the other guards check their
//! build's row. rustc's `neon` and `vfp4` are unstable on this target and
//! invisible to `cfg!`, so the build script cannot compare the row with the
//! compiler's features here: every armv7hf build needs both, and they are
//! always checked.
//! On a miss it writes one line to stderr with a raw `write` syscall and ends
//! the process with `exit_group(3)` (EABI: `svc #0`, syscall number in r7),
//! the same contract as the other guards. The routine is A32 code using only
//! ARMv5T-level instructions (no VFP, no NEON, no Thumb-2), marked as a
//! function so the linker and `.init_array` interwork with glibc's Thumb-2
//! code; `getauxval` is plain glibc code, and glibc has set up the auxiliary
//! vector before it runs `.init_array` (static and dynamic executables alike).

use crate::table::{self, str_eq, Hwcap, ARM_FEATURES, ARM_VARIANTS};

/// The features checked, in order: the armv7hf build's.
const NEEDED: &[&str] = ARM_VARIANTS[0].cpu_features;
const N: usize = NEEDED.len();

/// Linux `AT_HWCAP` (`getauxval`'s argument).
const AT_HWCAP: u32 = 16;

const MSG_CAP: usize = 168;

/// One check as the assembly reads it (offsets 0, 4, 8).
#[repr(C)]
pub struct Check {
    /// The feature's bit in `AT_HWCAP`.
    mask: u32,
    /// Bytes of `msg` to write.
    len: u32,
    msg: [u8; MSG_CAP],
}
const CHECK_SIZE: usize = core::mem::size_of::<Check>();
const _: () = assert!(CHECK_SIZE == 8 + MSG_CAP);
// `add r4, r4, #CHECK_SIZE` needs an 8-bit immediate.
const _: () = assert!(CHECK_SIZE < 256);
const _: () = assert!(N > 0);

/// The `ARM_FEATURES` entry called `name` (an `AT_HWCAP` bit).
const fn feature(name: &str) -> &'static table::HwcapFeature {
    let mut i = 0;
    while i < ARM_FEATURES.len() {
        if str_eq(ARM_FEATURES[i].name, name) {
            assert!(matches!(ARM_FEATURES[i].word, Hwcap::Hwcap), "guard_arm.rs reads AT_HWCAP only");
            return &ARM_FEATURES[i];
        }
        i += 1;
    }
    panic!("ARM_VARIANTS names a feature ARM_FEATURES lacks")
}

/// The checks, in `NEEDED`'s order.
#[used]
static CHECKS: [Check; N] = {
    const EMPTY: Check = Check { mask: 0, len: 0, msg: [0; MSG_CAP] };
    let mut out = [EMPTY; N];
    let mut i = 0;
    while i < N {
        let f = feature(NEEDED[i]);
        let (msg, len) = crate::guard_message::refusal::<MSG_CAP>(f.name);
        out[i] = Check { mask: 1 << f.bit, len: len as u32, msg };
        i += 1;
    }
    out
};

extern "C" {
    /// glibc's `unsigned long getauxval(unsigned long type)`.
    fn getauxval(kind: core::ffi::c_ulong) -> core::ffi::c_ulong;
}

// SAFETY: the routine follows the AAPCS (it saves r4–r6 and lr, keeps sp
// 8-byte aligned, and calls only getauxval, which is safe to call once glibc
// runs constructors), reads only CHECKS (N entries of CHECK_SIZE bytes,
// addressed PC-relative so it works in static and PIE executables), and on
// a miss only writes CHECKS' message bytes to fd 2 and exits. It runs before
// any Rust code, so it touches no Rust state.
//
// The guard: r4 = current check, r5 = checks left, r6 = AT_HWCAP's word
// (asked once). getauxval returns 0 if the kernel gives no AT_HWCAP, which
// reads as "feature missing".
core::arch::global_asm!(
    ".pushsection .text.krafla_cpu_guard,\"ax\",%progbits",
    ".p2align 2",
    ".arm",
    ".type krafla_cpu_guard_arm, %function",
    "krafla_cpu_guard_arm:",
    "push {{r4, r5, r6, lr}}",
    "mov r0, #{at_hwcap}",
    "bl {getauxval}",
    "mov r6, r0",
    "ldr r4, .Lkrafla_guard_checks",
    ".Lkrafla_guard_pc:",
    "add r4, pc, r4", // pc reads as this instruction + 8
    "mov r5, #{n}",
    ".Lkrafla_guard_next:",
    "ldr r1, [r4]",
    "and r0, r6, r1",
    "cmp r0, r1",
    "bne .Lkrafla_guard_fail",
    "add r4, r4, #{size}",
    "subs r5, r5, #1",
    "bne .Lkrafla_guard_next",
    "pop {{r4, r5, r6, pc}}", // ARMv5T+: returns to Thumb or ARM callers
    // The check at r4 failed: write(2, msg, len), then exit_group(3).
    ".Lkrafla_guard_fail:",
    "mov r0, #2",
    "add r1, r4, #8",
    "ldr r2, [r4, #4]",
    "mov r7, #4",
    "svc #0",
    "mov r0, #3",
    "mov r7, #248",
    "svc #0",
    ".Lkrafla_guard_hang:",
    "b .Lkrafla_guard_hang",
    ".p2align 2",
    ".Lkrafla_guard_checks:",
    ".word {checks} - (.Lkrafla_guard_pc + 8)",
    ".size krafla_cpu_guard_arm, . - krafla_cpu_guard_arm",
    ".popsection",
    // Priority 0: before other constructors (std's own run at 99).
    ".pushsection .init_array.00000,\"aw\",%init_array",
    ".p2align 2",
    ".word krafla_cpu_guard_arm",
    ".popsection",
    checks = sym CHECKS,
    getauxval = sym getauxval,
    at_hwcap = const AT_HWCAP,
    n = const N,
    size = const CHECK_SIZE,
);
