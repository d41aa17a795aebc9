//! Start-up CPU guard (Linux x86-64): a `global_asm!` routine registered in
//! `.init_array`, so it runs before `main` and before any Rust code compiled
//! with this build's target features. It checks, with CPUID (and XGETBV for
//! the OS-enabled YMM / ZMM register state), every CPU feature this build was
//! compiled with (`cfg!(target_feature = ...)` over the feature table in
//! build/src/variants.rs), and on a miss writes one line to stderr with a raw
//! `write` syscall and ends the process with `exit_group(3)`. The routine uses
//! only baseline x86-64 instructions (CPUID, XGETBV only after OSXSAVE is seen).

#[path = "../../build/src/variants.rs"]
mod table;

use table::CPU_FEATURES;

/// Whether this build was compiled with the feature `name` (one of `CPU_FEATURES`).
const fn compiled(name: &str) -> bool {
    macro_rules! lookup {
        ($($n:tt)*) => {
            $( if str_eq(name, $n) { return cfg!(target_feature = $n); } )*
        };
    }
    lookup!("avx512vnni" "avx512bw" "avx512vl" "avx512dq" "avx512cd" "avx512f" "avx2" "fma" "f16c" "bmi2" "bmi1"
            "avx" "popcnt" "sse4.2" "sse4.1" "ssse3" "sse3");
    panic!("a feature of CPU_FEATURES is missing from guard.rs's lookup list")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
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

/// Number of features this build needs.
const N: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < CPU_FEATURES.len() {
        if compiled(CPU_FEATURES[i].name) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// `krafla: this build (ISA) needs the CPU feature 'NAME', which this CPU lacks; ...\n`
const fn message(feature: &str) -> ([u8; MSG_CAP], u32) {
    let parts: [&str; 5] = [
        "krafla: this build (",
        krafla::kernels::ISA,
        ") needs the CPU feature '",
        feature,
        "', which this CPU lacks; run ml_run to pick a build that fits\n",
    ];
    let mut out = [0u8; MSG_CAP];
    let mut len = 0;
    let mut p = 0;
    while p < parts.len() {
        let b = parts[p].as_bytes();
        let mut i = 0;
        while i < b.len() {
            out[len] = b[i];
            len += 1;
            i += 1;
        }
        p += 1;
    }
    (out, len as u32)
}

/// The checks, in `CPU_FEATURES` order, plus one unused entry so the table is never empty.
#[used]
static CHECKS: [Check; N + 1] = {
    const EMPTY: Check = Check { leaf: 0, subleaf: 0, reg: 0, mask: 0, xcr0: 0, len: 0, msg: [0; MSG_CAP] };
    let mut out = [EMPTY; N + 1];
    let (mut i, mut k) = (0, 0);
    while i < CPU_FEATURES.len() {
        let f = &CPU_FEATURES[i];
        if compiled(f.name) {
            let (msg, len) = message(f.name);
            out[k] = Check { leaf: f.leaf, subleaf: f.subleaf, reg: f.reg as u32, mask: 1 << f.bit, xcr0: f.xcr0, len, msg };
            k += 1;
        }
        i += 1;
    }
    out
};

// The guard. Registers: r12 = current check, r13d = checks left, r14d = the
// highest basic CPUID leaf; rbx and r12–r15 are callee-saved, so pushed.
core::arch::global_asm!(
    ".pushsection .text.krafla_cpu_guard,\"ax\",@progbits",
    ".p2align 4",
    "krafla_cpu_guard:",
    "push rbx",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "xor eax, eax",
    "xor ecx, ecx",
    "cpuid",
    "mov r14d, eax",
    "lea r12, [rip + {checks}]",
    "mov r13d, {n}",
    "2:",
    "test r13d, r13d",
    "jz 9f",
    "mov eax, dword ptr [r12]",
    "cmp eax, r14d",
    "ja 8f", // leaf not implemented: the feature is missing
    "mov ecx, dword ptr [r12 + 4]",
    "cpuid",
    "mov r15d, dword ptr [r12 + 8]",
    "cmp r15d, 1",
    "cmove eax, ebx",
    "cmp r15d, 2",
    "cmove eax, ecx",
    "cmp r15d, 3",
    "cmove eax, edx",
    "mov r15d, dword ptr [r12 + 12]",
    "and eax, r15d",
    "cmp eax, r15d",
    "jne 8f",
    "mov r15d, dword ptr [r12 + 16]",
    "test r15d, r15d",
    "jz 3f",
    "mov eax, 1", // XGETBV only when CPUID.1:ECX.OSXSAVE[bit 27] says the OS enabled it
    "xor ecx, ecx",
    "cpuid",
    "bt ecx, 27",
    "jnc 8f",
    "xor ecx, ecx",
    "xgetbv",
    "and eax, r15d",
    "cmp eax, r15d",
    "jne 8f",
    "3:",
    "add r12, {size}",
    "dec r13d",
    "jmp 2b",
    "8:",
    "mov eax, 1", // write(2, msg, len)
    "mov edi, 2",
    "lea rsi, [r12 + 24]",
    "mov edx, dword ptr [r12 + 20]",
    "syscall",
    "mov eax, 231", // exit_group(3)
    "mov edi, 3",
    "syscall",
    "ud2",
    "9:",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbx",
    "ret",
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
