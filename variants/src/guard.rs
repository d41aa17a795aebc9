//! Start-up CPU guard (x86-64 Linux and Windows): a `global_asm!` routine
//! that runs before `main` and before any Rust code compiled with this
//! build's target features. It checks, with CPUID (and XGETBV for the
//! OS-enabled YMM / ZMM register state), every CPU feature of this build's
//! row of the variant table and of the target's own baseline (SSE3 on
//! Windows; build/src/variants.rs; shared/build.rs fails the build if these
//! differ from the features the compiler enables),
//! and on a miss writes one line to stderr and ends the process with exit
//! code 3. The routine uses only baseline x86-64
//! instructions (CPUID, XGETBV only after OSXSAVE is seen).
//!
//! * Linux: registered in `.init_array` (priority 0, before std's own
//!   constructors); the message goes out with a raw `write` syscall, then
//!   `exit_group(3)`.
//! * Windows: a pointer in the `.CRT$XCU` section, which the C runtime's
//!   start-up code runs (`_initterm(__xc_a, __xc_z)`, both mingw-w64 and
//!   MSVC) before `main`; the message goes out with `GetStdHandle` +
//!   `WriteFile`, then `ExitProcess(3)`, called with the Win64 convention
//!   (32-byte shadow space, 16-byte aligned stack). The same routine serves
//!   both: only the failure path and the section directives differ.

use crate::table::{find, str_eq, target_baseline_cpu_features, CpuFeature, Variant, CPU_FEATURES, X86_64_VARIANTS};

/// This build's row of the variant table: the features it needs, in the
/// order they are checked (the one that names the build first).
const VARIANT: &Variant = match find(X86_64_VARIANTS, krafla::kernels::ISA) {
    Some(v) => v,
    None => panic!("this build's kernel set is not a row of X86_64_VARIANTS"),
};
/// Features the target itself assumes in every build (SSE3 on Windows).
const TARGET_BASELINE: &[&str] =
    target_baseline_cpu_features("x86_64", if cfg!(windows) { "windows" } else { "linux" });
const N: usize = VARIANT.cpu_features.len() + TARGET_BASELINE.len();

/// The `CPU_FEATURES` entry called `name`.
const fn feature(name: &str) -> &'static CpuFeature {
    let mut i = 0;
    while i < CPU_FEATURES.len() {
        if str_eq(CPU_FEATURES[i].name, name) {
            return &CPU_FEATURES[i];
        }
        i += 1;
    }
    panic!("X86_64_VARIANTS names a feature CPU_FEATURES lacks")
}

const MSG_CAP: usize = 168;

/// One check as the assembly reads it (offsets 0, 4, 8, 12, 16, 20, 24).
#[repr(C)]
pub struct Check {
    leaf: u32,
    subleaf: u32,
    reg: u32,
    mask: u32,
    xcr0: u32,
    len: u32,
    msg: [u8; MSG_CAP],
}
const CHECK_SIZE: usize = core::mem::size_of::<Check>();
const _: () = assert!(CHECK_SIZE == 24 + MSG_CAP);

/// The refusal message for `feature` (see `guard_message`).
const fn message(feature: &str) -> ([u8; MSG_CAP], u32) {
    let (msg, len) = crate::guard_message::refusal::<MSG_CAP>(feature);
    (msg, len as u32)
}

/// The feature of check `i`: the row's, then the target's baseline.
const fn needed(i: usize) -> &'static str {
    let row = VARIANT.cpu_features;
    if i < row.len() {
        row[i]
    } else {
        TARGET_BASELINE[i - row.len()]
    }
}

/// The checks, in the row's order, then the target's baseline, plus one
/// unused entry so the table is never empty.
#[used]
static CHECKS: [Check; N + 1] = {
    const EMPTY: Check = Check { leaf: 0, subleaf: 0, reg: 0, mask: 0, xcr0: 0, len: 0, msg: [0; MSG_CAP] };
    let mut out = [EMPTY; N + 1];
    let mut i = 0;
    while i < VARIANT.cpu_features.len() + TARGET_BASELINE.len() {
        let f = feature(needed(i));
        let (msg, len) = message(f.name);
        out[i] =
            Check { leaf: f.leaf, subleaf: f.subleaf, reg: f.reg as u32, mask: 1 << f.bit, xcr0: f.xcr0, len, msg };
        i += 1;
    }
    out
};

// The guard. Registers: r12 = current check, r13d = checks left, r14d = the
// highest basic CPUID leaf; rbx and r12–r15 are callee-saved (System V and
// Win64), so pushed. After the five pushes the stack is 16-byte aligned
// (entry: 8 mod 16), which the Win64 failure path relies on.
macro_rules! check_loop {
    () => {
        concat!(
            ".p2align 4\n",
            "krafla_cpu_guard:\n",
            "push rbx\n",
            "push r12\n",
            "push r13\n",
            "push r14\n",
            "push r15\n",
            "xor eax, eax\n",
            "xor ecx, ecx\n",
            "cpuid\n",
            "mov r14d, eax\n",
            "lea r12, [rip + {checks}]\n",
            "mov r13d, {n}\n",
            "2:\n",
            "test r13d, r13d\n",
            "jz 9f\n",
            "mov eax, dword ptr [r12]\n",
            "cmp eax, r14d\n",
            "ja 8f\n", // leaf not implemented: the feature is missing
            "mov ecx, dword ptr [r12 + 4]\n",
            "cpuid\n",
            "mov r15d, dword ptr [r12 + 8]\n",
            "cmp r15d, 1\n",
            "cmove eax, ebx\n",
            "cmp r15d, 2\n",
            "cmove eax, ecx\n",
            "cmp r15d, 3\n",
            "cmove eax, edx\n",
            "mov r15d, dword ptr [r12 + 12]\n",
            "and eax, r15d\n",
            "cmp eax, r15d\n",
            "jne 8f\n",
            "mov r15d, dword ptr [r12 + 16]\n",
            "test r15d, r15d\n",
            "jz 3f\n",
            "mov eax, 1\n", // XGETBV only when CPUID.1:ECX.OSXSAVE[bit 27] says the OS enabled it
            "xor ecx, ecx\n",
            "cpuid\n",
            "bt ecx, 27\n",
            "jnc 8f\n",
            "xor ecx, ecx\n",
            "xgetbv\n",
            "and eax, r15d\n",
            "cmp eax, r15d\n",
            "jne 8f\n",
            "3:\n",
            "add r12, {size}\n",
            "dec r13d\n",
            "jmp 2b\n",
            "9:\n",
            "pop r15\n",
            "pop r14\n",
            "pop r13\n",
            "pop r12\n",
            "pop rbx\n",
            "ret\n",
            // 8: the check at r12 failed; the failure path follows this text.
            "8:\n",
        )
    };
}

// SAFETY: the routine follows the System V ABI (it saves rbx and r12–r15,
// which it uses, and returns with the stack as it found it), reads only
// CHECKS (N + 1 entries of CHECK_SIZE bytes; the loop visits the first N),
// runs CPUID, and XGETBV only after CPUID says the OS enabled it; on a miss
// it only writes CHECKS' message bytes to fd 2 and exits. It runs before any
// Rust code, so it touches no Rust state.
#[cfg(target_os = "linux")]
core::arch::global_asm!(
    ".pushsection .text.krafla_cpu_guard,\"ax\",@progbits",
    check_loop!(),
    "mov eax, 1", // write(2, msg, len)
    "mov edi, 2",
    "lea rsi, [r12 + 24]",
    "mov edx, dword ptr [r12 + 20]",
    "syscall",
    "mov eax, 231", // exit_group(3)
    "mov edi, 3",
    "syscall",
    "ud2",
    ".popsection",
    // Priority 0: before other constructors (std's own run at 99).
    ".pushsection .init_array.00000,\"aw\"",
    ".p2align 3",
    ".quad krafla_cpu_guard",
    ".popsection",
    checks = sym CHECKS,
    n = const N,
    size = const CHECK_SIZE,
);

#[cfg(windows)]
#[link(name = "kernel32")]
extern "system" {
    fn GetStdHandle(which: u32) -> *mut core::ffi::c_void;
    fn WriteFile(
        file: *mut core::ffi::c_void,
        buf: *const u8,
        len: u32,
        written: *mut u32,
        overlapped: *mut core::ffi::c_void,
    ) -> i32;
    fn ExitProcess(code: u32) -> !;
}

// SAFETY: as the Linux routine; the failure path calls GetStdHandle,
// WriteFile and ExitProcess with the Win64 convention (32-byte shadow space,
// a 16-byte aligned stack, the fifth argument on the stack).
#[cfg(windows)]
core::arch::global_asm!(
    ".pushsection .text$krafla_cpu_guard,\"xr\"",
    check_loop!(),
    "sub rsp, 48", // shadow space (32) + WriteFile's 5th argument + `written`; stays 16-byte aligned
    "mov ecx, -12", // STD_ERROR_HANDLE
    "call {get_std_handle}",
    "mov rcx, rax",
    "lea rdx, [r12 + 24]",
    "mov r8d, dword ptr [r12 + 20]",
    "lea r9, [rsp + 40]",
    "mov qword ptr [rsp + 32], 0",
    "call {write_file}",
    "mov ecx, 3",
    "call {exit_process}",
    "ud2",
    ".popsection",
    // Sorted between mingw-w64's __xc_a (.CRT$XCA) and __xc_z (.CRT$XCZ).
    ".pushsection .CRT$XCU,\"dr\"",
    ".p2align 3",
    ".quad krafla_cpu_guard",
    ".popsection",
    checks = sym CHECKS,
    n = const N,
    size = const CHECK_SIZE,
    get_std_handle = sym GetStdHandle,
    write_file = sym WriteFile,
    exit_process = sym ExitProcess,
);
