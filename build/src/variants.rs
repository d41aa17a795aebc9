//! The build variants: the one table of what each per-ISA executable is
//! compiled with and which CPU features it needs. Shared, through `#[path]`,
//! by every crate that needs it, and the only place these lists are spelled:
//!
//! * `cargo xtask` (dist, release, kernel-tests) compiles variant v with
//!   `-C target-feature=v.rustc_features`;
//! * the inference crate's build script (`shared/build.rs`) picks the
//!   variant whose `rustc_features` the compiler was given, selects its
//!   kernel module by that name (`cfg(krafla_isa = "...")`), writes the
//!   `#[target_feature]` attribute of every kernel function from the row,
//!   and fails the build if the features the compiler enables differ from
//!   `cpu_features`;
//! * the start-up CPU guard (`variants/src/guard*.rs`) checks the row's
//!   `cpu_features`;
//! * the launcher `ml_run` (`launcher/src/`) picks the first variant of
//!   `variants_for(ARCH)` whose `cpu_features` this CPU has;
//! * `cargo xtask variants` prints it as JSON for the end-to-end tests
//!   (`tests/conftest.py`) and the benchmark scripts (`tools/*.sh`).
//!
//! Plain `core` only, so any crate (and a build script) can include it.

#![allow(dead_code)]

/// A CPUID register.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum Reg {
    Eax = 0,
    Ebx = 1,
    Ecx = 2,
    Edx = 3,
}

/// Where CPUID reports a feature, and the OS-enabled register state (XCR0
/// bits, read with XGETBV) it also needs.
#[derive(Clone, Copy, Debug)]
pub struct CpuFeature {
    /// rustc's name (`-C target-feature=+NAME`, `cfg(target_feature = "NAME")`).
    pub name: &'static str,
    pub leaf: u32,
    pub subleaf: u32,
    pub reg: Reg,
    pub bit: u32,
    /// XCR0 bits that must all be set (0: none). 0x6 = SSE+YMM state, 0xe0 = opmask+ZMM state.
    pub xcr0: u32,
}

const fn f(name: &'static str, leaf: u32, subleaf: u32, reg: Reg, bit: u32, xcr0: u32) -> CpuFeature {
    CpuFeature { name, leaf, subleaf, reg, bit, xcr0 }
}

/// XCR0: SSE (XMM) and AVX (upper YMM) state enabled by the OS.
pub const XCR0_YMM: u32 = 0x6;
/// XCR0: YMM plus the AVX-512 opmask, ZMM_Hi256 and Hi16_ZMM state.
pub const XCR0_ZMM: u32 = 0xe6;

/// Every feature the guard and the launcher know how to check, newest
/// first, so a CPU that lacks several is told about the one that names the
/// build (e.g. `avx2` rather than `ssse3`). Basic CPUID leaves only. Every
/// VEX/EVEX feature also needs the register state the OS enabled.
pub const CPU_FEATURES: &[CpuFeature] = &[
    f("avx512vnni", 7, 0, Reg::Ecx, 11, XCR0_ZMM),
    f("avx512bw", 7, 0, Reg::Ebx, 30, XCR0_ZMM),
    f("avx512vl", 7, 0, Reg::Ebx, 31, XCR0_ZMM),
    f("avx512dq", 7, 0, Reg::Ebx, 17, XCR0_ZMM),
    f("avx512cd", 7, 0, Reg::Ebx, 28, XCR0_ZMM),
    f("avx512f", 7, 0, Reg::Ebx, 16, XCR0_ZMM),
    f("avx2", 7, 0, Reg::Ebx, 5, XCR0_YMM),
    f("fma", 1, 0, Reg::Ecx, 12, XCR0_YMM),
    f("f16c", 1, 0, Reg::Ecx, 29, XCR0_YMM),
    f("bmi2", 7, 0, Reg::Ebx, 8, 0),
    f("bmi1", 7, 0, Reg::Ebx, 3, 0),
    f("avx", 1, 0, Reg::Ecx, 28, XCR0_YMM),
    f("popcnt", 1, 0, Reg::Ecx, 23, 0),
    f("sse4.2", 1, 0, Reg::Ecx, 20, 0),
    f("sse4.1", 1, 0, Reg::Ecx, 19, 0),
    f("ssse3", 1, 0, Reg::Ecx, 9, 0),
    f("sse3", 1, 0, Reg::Ecx, 0, 0),
];

/// Which word of the Linux auxiliary vector holds an ARM feature bit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hwcap {
    /// `getauxval(AT_HWCAP)`
    Hwcap,
    /// `getauxval(AT_HWCAP2)`
    Hwcap2,
}

/// An ARM CPU feature as Linux reports it (`getauxval`), under rustc's name.
#[derive(Clone, Copy, Debug)]
pub struct HwcapFeature {
    pub name: &'static str,
    pub word: Hwcap,
    pub bit: u32,
}

const fn h(name: &'static str, word: Hwcap, bit: u32) -> HwcapFeature {
    HwcapFeature { name, word, bit }
}

/// AArch64 features (Linux `asm/hwcap.h`), newest first.
pub const AARCH64_FEATURES: &[HwcapFeature] = &[
    h("sve2", Hwcap::Hwcap2, 1),
    h("i8mm", Hwcap::Hwcap2, 13),
    h("bf16", Hwcap::Hwcap2, 14),
    h("sve", Hwcap::Hwcap, 22),
    h("dotprod", Hwcap::Hwcap, 20),
    h("fp16", Hwcap::Hwcap, 10), // HWCAP_ASIMDHP (rustc's fp16 implies it)
    h("neon", Hwcap::Hwcap, 1),  // HWCAP_ASIMD
];

/// 32-bit ARM features (Linux `asm/hwcap.h` for arm), newest first.
pub const ARM_FEATURES: &[HwcapFeature] = &[
    h("dotprod", Hwcap::Hwcap, 24), // HWCAP_ASIMDDP
    h("vfp4", Hwcap::Hwcap, 16),
    h("neon", Hwcap::Hwcap, 12),
];

/// One per-ISA executable.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Build name: `dist/<platform>/ml_<name>`, `krafla::kernels::ISA`.
    pub name: &'static str,
    /// rustc target features on top of the target's baseline (for `-C target-feature=`).
    pub rustc_features: &'static str,
    /// CPU features to check (names in `CPU_FEATURES`, or `AARCH64_FEATURES` /
    /// `ARM_FEATURES` for ARM variants), the one that names the build first:
    /// exactly the features of that table that `rustc_features` enables,
    /// with the ones they imply (`shared/build.rs` checks this against the
    /// compiler on every build).
    pub cpu_features: &'static [&'static str],
}

/// Fastest first (the launcher's order of preference).
pub const X86_64_VARIANTS: &[Variant] = &[
    Variant {
        name: "avx512vnni",
        rustc_features: "+avx,+avx2,+fma,+f16c,+bmi2,+ssse3,+sse4.1,+sse4.2,+popcnt,+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512vnni",
        cpu_features: &[
            "avx512vnni", "avx512bw", "avx512vl", "avx512dq", "avx512f", "avx2", "fma", "f16c", "bmi2", "avx", "popcnt",
            "sse4.2", "sse4.1", "ssse3", "sse3",
        ],
    },
    Variant {
        name: "avx2",
        rustc_features: "+avx,+avx2,+fma,+f16c,+bmi2,+ssse3,+sse4.1,+sse4.2,+popcnt",
        cpu_features: &["avx2", "fma", "f16c", "bmi2", "avx", "popcnt", "sse4.2", "sse4.1", "ssse3", "sse3"],
    },
    Variant { name: "sse41", rustc_features: "+ssse3,+sse4.1", cpu_features: &["sse4.1", "ssse3", "sse3"] },
    Variant { name: "sse2", rustc_features: "", cpu_features: &[] },
];

/// AArch64 variants, fastest first. NEON (ASIMD) is the AArch64 baseline:
/// rustc enables it by default, and every build checks it.
pub const AARCH64_VARIANTS: &[Variant] = &[
    Variant { name: "sve", rustc_features: "+dotprod,+i8mm,+sve", cpu_features: &["sve", "i8mm", "dotprod", "neon"] },
    Variant { name: "i8mm", rustc_features: "+dotprod,+i8mm", cpu_features: &["i8mm", "dotprod", "neon"] },
    Variant { name: "neon_dotprod", rustc_features: "+dotprod", cpu_features: &["dotprod", "neon"] },
    Variant { name: "neon", rustc_features: "", cpu_features: &["neon"] },
];

/// 32-bit ARM (armv7hf) variants: one, armv7-a with NEON and VFPv4 (every
/// Cortex-A7/A15/A53/A72 under a 32-bit OS). rustc calls `neon` and `vfp4`
/// unstable target features on this target (a warning, not an error), and
/// `cfg(target_feature)` does not see them: the kernels are chosen by
/// architecture (shared/src/kernels/armv7_neon.rs) and the start-up guard
/// always checks both features.
pub const ARM_VARIANTS: &[Variant] =
    &[Variant { name: "neon", rustc_features: "+neon,+vfp4,+d32", cpu_features: &["neon", "vfp4"] }];

/// The variants for a CPU architecture (`std::env::consts::ARCH` spelling).
pub fn variants_for(arch: &str) -> &'static [Variant] {
    match arch.as_bytes() {
        b"x86_64" => X86_64_VARIANTS,
        b"aarch64" => AARCH64_VARIANTS,
        b"arm" => ARM_VARIANTS,
        _ => &[],
    }
}

/// The target feature every CPU of an architecture has and rustc enables
/// by default, which the baseline rows leave out of `rustc_features` but a
/// kernel's `#[target_feature]` attribute must still name (x86-64's SSE2
/// intrinsics need `sse2`, AArch64's NEON intrinsics `neon`).
pub fn arch_baseline_feature(arch: &str) -> Option<&'static str> {
    match arch.as_bytes() {
        b"x86_64" => Some("sse2"),
        b"aarch64" => Some("neon"),
        _ => None,
    }
}

/// CPU features of the table that a target enables in every build on its
/// own (no `-C target-feature` needed), beyond any row's `cpu_features`:
/// Rust's x86-64 Windows targets assume SSE3 (with CMPXCHG16B and
/// LAHF/SAHF, which the table does not list), as Windows 10 and later do.
/// The guard checks them too; the build script counts them as expected.
pub const fn target_baseline_cpu_features(arch: &str, os: &str) -> &'static [&'static str] {
    if str_eq(arch, "x86_64") && str_eq(os, "windows") {
        &["sse3"]
    } else {
        &[]
    }
}

/// The variant called `name` among `variants` (usable in `const` code).
pub const fn find(variants: &'static [Variant], name: &str) -> Option<&'static Variant> {
    let mut i = 0;
    while i < variants.len() {
        if str_eq(variants[i].name, name) {
            return Some(&variants[i]);
        }
        i += 1;
    }
    None
}

/// `a == b`, usable in `const` code.
pub const fn str_eq(a: &str, b: &str) -> bool {
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
