//! The x86-64 build variants: the one table of what each per-ISA executable
//! is compiled with and which CPU features it needs. Shared by `cargo xtask`
//! (dist, kernel-tests) and the start-up CPU guard (`variants/src/guard.rs`,
//! through `#[path]`); the launcher is meant to include it the same way.
//! Plain `core` only, so any crate can include it.

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

/// Every feature the guard knows how to check, newest first, so a CPU that
/// lacks several is told about the one that names the build (e.g. `avx2`
/// rather than `ssse3`). Basic CPUID leaves only.
pub const CPU_FEATURES: &[CpuFeature] = &[
    f("avx512vnni", 7, 0, Reg::Ecx, 11, 0),
    f("avx512bw", 7, 0, Reg::Ebx, 30, 0),
    f("avx512vl", 7, 0, Reg::Ebx, 31, 0),
    f("avx512dq", 7, 0, Reg::Ebx, 17, 0),
    f("avx512cd", 7, 0, Reg::Ebx, 28, 0),
    f("avx512f", 7, 0, Reg::Ebx, 16, 0xe6),
    f("avx2", 7, 0, Reg::Ebx, 5, 0),
    f("fma", 1, 0, Reg::Ecx, 12, 0),
    f("f16c", 1, 0, Reg::Ecx, 29, 0),
    f("bmi2", 7, 0, Reg::Ebx, 8, 0),
    f("bmi1", 7, 0, Reg::Ebx, 3, 0),
    f("avx", 1, 0, Reg::Ecx, 28, 0x6),
    f("popcnt", 1, 0, Reg::Ecx, 23, 0),
    f("sse4.2", 1, 0, Reg::Ecx, 20, 0),
    f("sse4.1", 1, 0, Reg::Ecx, 19, 0),
    f("ssse3", 1, 0, Reg::Ecx, 9, 0),
    f("sse3", 1, 0, Reg::Ecx, 0, 0),
];

/// One per-ISA executable.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Build name: `dist/<platform>/ml_<name>`, `krafla::kernels::ISA`.
    pub name: &'static str,
    /// rustc target features on top of the x86-64 baseline (for `-C target-feature=`).
    pub rustc_features: &'static str,
    /// CPU features to check (names in `CPU_FEATURES`): exactly the features
    /// `rustc_features` enables, with the ones they imply.
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

/// The variant called `name`.
pub fn variant(name: &str) -> Option<&'static Variant> {
    X86_64_VARIANTS.iter().find(|v| v.name == name)
}
