//! What this CPU (and its OS) can run: the features of the variant table
//! (build/src/variants.rs) it has, and which variant to pick. Detection is
//! split from decoding so the decoding and the choice are unit-tested against
//! faked CPUs.

use crate::table::{self, Variant};

/// Feature names (as in the variant table) this CPU has, OS state included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features(pub Vec<&'static str>);

impl Features {
    pub fn has(&self, name: &str) -> bool {
        self.0.contains(&name)
    }

    /// The first feature `v` needs that this CPU lacks, if any.
    pub fn missing(&self, v: &Variant) -> Option<&'static str> {
        v.cpu_features.iter().copied().find(|f| !self.has(f))
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
/// Raw x86 CPUID answers: `cpuid(leaf, subleaf) -> [eax, ebx, ecx, edx]`,
/// and `xgetbv()` (XCR0), which is only asked when CPUID says OSXSAVE.
pub fn decode_x86(cpuid: &mut dyn FnMut(u32, u32) -> [u32; 4], xgetbv: &mut dyn FnMut() -> u64) -> Features {
    let max_leaf = cpuid(0, 0)[0];
    if max_leaf < 1 {
        return Features::default();
    }
    let osxsave = cpuid(1, 0)[2] & (1 << 27) != 0;
    let xcr0 = if osxsave { xgetbv() } else { 0 };
    let mut out = Vec::new();
    for f in table::CPU_FEATURES {
        if f.leaf > max_leaf {
            continue;
        }
        let word = cpuid(f.leaf, f.subleaf)[f.reg as usize];
        let state = u64::from(f.xcr0);
        if word & (1 << f.bit) != 0 && xcr0 & state == state {
            out.push(f.name);
        }
    }
    Features(out)
}

/// ARM features from the Linux auxiliary vector words AT_HWCAP and AT_HWCAP2.
#[cfg_attr(not(all(target_os = "linux", any(target_arch = "aarch64", target_arch = "arm"))), allow(dead_code))]
pub fn decode_hwcap(features: &[table::HwcapFeature], hwcap: u64, hwcap2: u64) -> Features {
    Features(
        features
            .iter()
            .filter(|f| {
                let word = match f.word {
                    table::Hwcap::Hwcap => hwcap,
                    table::Hwcap::Hwcap2 => hwcap2,
                };
                word & (1 << f.bit) != 0
            })
            .map(|f| f.name)
            .collect(),
    )
}

/// This machine's features.
#[cfg(target_arch = "x86_64")]
pub fn detect() -> Features {
    use core::arch::x86_64::__cpuid_count;
    let mut cpuid = |leaf: u32, subleaf: u32| {
        // SAFETY: CPUID exists on every x86-64 CPU; leaves above the maximum
        // are never asked for by decode_x86 (it reads leaf 0 first).
        #[allow(unused_unsafe)]
        let r = unsafe { __cpuid_count(leaf, subleaf) };
        [r.eax, r.ebx, r.ecx, r.edx]
    };
    let mut xgetbv = || {
        let (lo, hi): (u32, u32);
        // SAFETY: decode_x86 calls this only when CPUID.1:ECX.OSXSAVE is set,
        // i.e. the OS enabled XSAVE and XGETBV with ECX=0 (XCR0) is valid.
        // It reads a register and touches no memory.
        unsafe {
            core::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
                             options(nomem, nostack, preserves_flags));
        }
        (u64::from(hi) << 32) | u64::from(lo)
    };
    decode_x86(&mut cpuid, &mut xgetbv)
}

#[cfg(all(target_os = "linux", any(target_arch = "aarch64", target_arch = "arm")))]
#[allow(clippy::useless_conversion)] // c_ulong is u64 on aarch64, u32 on arm
pub fn detect() -> Features {
    extern "C" {
        fn getauxval(kind: core::ffi::c_ulong) -> core::ffi::c_ulong;
    }
    const AT_HWCAP: core::ffi::c_ulong = 16;
    const AT_HWCAP2: core::ffi::c_ulong = 26;
    // SAFETY: getauxval (glibc ≥ 2.16, musl, bionic) reads the auxiliary
    // vector; it takes a plain integer and returns 0 for absent entries.
    let (hwcap, hwcap2) = unsafe { (getauxval(AT_HWCAP), getauxval(AT_HWCAP2)) };
    let table = if cfg!(target_arch = "aarch64") { table::AARCH64_FEATURES } else { table::ARM_FEATURES };
    decode_hwcap(table, u64::from(hwcap), u64::from(hwcap2))
}

#[cfg(not(any(target_arch = "x86_64", all(target_os = "linux", any(target_arch = "aarch64", target_arch = "arm")))))]
pub fn detect() -> Features {
    Features::default()
}

/// The first (fastest) variant that the CPU supports and `present` finds.
pub fn pick<'a>(variants: &'a [Variant], cpu: &Features, present: &dyn Fn(&str) -> bool) -> Option<&'a Variant> {
    variants.iter().find(|v| cpu.missing(v).is_none() && present(v.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Reg, CPU_FEATURES, X86_64_VARIANTS, XCR0_YMM, XCR0_ZMM};

    /// XCR0 with x87 + SSE (what every 64-bit OS enables).
    const XCR0_SSE: u64 = 0x3;

    /// A fake x86 CPU: the features it has (table names), its maximum basic
    /// leaf, whether the OS set CR4.OSXSAVE, and XCR0.
    struct FakeX86 {
        regs: std::collections::HashMap<(u32, u32), [u32; 4]>,
        max_leaf: u32,
        xcr0: u64,
        osxsave: bool,
    }

    impl FakeX86 {
        fn new(features: &[&str], xcr0: u64) -> Self {
            let mut regs = std::collections::HashMap::new();
            for name in features {
                let f = CPU_FEATURES.iter().find(|f| f.name == *name).unwrap_or_else(|| panic!("no feature {name}"));
                let r: &mut [u32; 4] = regs.entry((f.leaf, f.subleaf)).or_default();
                r[f.reg as usize] |= 1 << f.bit;
            }
            let max_leaf = if regs.contains_key(&(7, 0)) { 0xd } else { 0x5 };
            FakeX86 { regs, max_leaf, xcr0, osxsave: xcr0 != 0 }
        }

        fn features(&self) -> Features {
            let mut xgetbv_calls = 0;
            let f = decode_x86(
                &mut |leaf, sub| {
                    let mut r = match leaf {
                        0 => [self.max_leaf, 0x756e_6547, 0x6c65_746e, 0x4965_6e69],
                        // A real CPU answers leaves above the maximum with the highest one's data;
                        // make that look like "everything set" so ignoring it is tested.
                        l if l > self.max_leaf => [!0; 4],
                        _ => self.regs.get(&(leaf, sub)).copied().unwrap_or_default(),
                    };
                    if leaf == 1 && self.osxsave {
                        r[Reg::Ecx as usize] |= 1 << 27;
                    }
                    r
                },
                &mut || {
                    xgetbv_calls += 1;
                    self.xcr0
                },
            );
            assert!(self.osxsave || xgetbv_calls == 0, "XGETBV without OSXSAVE would fault");
            f
        }
    }

    fn choice(cpu: &FakeX86) -> &'static str {
        pick(X86_64_VARIANTS, &cpu.features(), &|_| true).map_or("none", |v| v.name)
    }

    const CORE2: &[&str] = &["sse3", "ssse3"];
    const PENRYN: &[&str] = &["sse3", "ssse3", "sse4.1"];
    const NEHALEM: &[&str] = &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"];
    const SANDY_BRIDGE: &[&str] = &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx"];
    const IVY_BRIDGE: &[&str] = &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "f16c"];
    const HASWELL: &[&str] =
        &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "f16c", "fma", "avx2", "bmi1", "bmi2"];
    const SKYLAKE_X: &[&str] = &[
        "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "f16c", "fma", "avx2", "bmi1", "bmi2", "avx512f",
        "avx512cd", "avx512bw", "avx512dq", "avx512vl",
    ];
    const CASCADE_LAKE: &[&str] = &[
        "sse3",
        "ssse3",
        "sse4.1",
        "sse4.2",
        "popcnt",
        "avx",
        "f16c",
        "fma",
        "avx2",
        "bmi1",
        "bmi2",
        "avx512f",
        "avx512cd",
        "avx512bw",
        "avx512dq",
        "avx512vl",
        "avx512vnni",
    ];

    #[test]
    fn every_cpu_generation_gets_its_build() {
        let cases: &[(&str, &[&str], u64, &str)] = &[
            ("Athlon 64 / baseline x86-64", &[], XCR0_SSE, "sse2"),
            ("Athlon 64 X2 (SSE3)", &["sse3"], XCR0_SSE, "sse2"),
            ("Core 2 Merom (no SSE4.1)", CORE2, XCR0_SSE, "sse2"),
            ("Penryn", PENRYN, XCR0_SSE, "sse41"),
            ("Nehalem", NEHALEM, XCR0_SSE, "sse41"),
            ("Sandy Bridge (AVX, no AVX2)", SANDY_BRIDGE, 0x7, "sse41"),
            ("Ivy Bridge", IVY_BRIDGE, 0x7, "sse41"),
            ("Haswell", HASWELL, 0x7, "avx2"),
            ("Zen 1..3", HASWELL, 0x7, "avx2"),
            ("Alder Lake (AVX-512 fused off)", HASWELL, 0x7, "avx2"),
            ("Skylake-X (AVX-512, no VNNI)", SKYLAKE_X, 0xe7, "avx2"),
            ("Cascade Lake", CASCADE_LAKE, 0xe7, "avx512vnni"),
            ("Ice Lake / Zen 4", CASCADE_LAKE, 0x2e7, "avx512vnni"),
        ];
        for &(name, features, xcr0, want) in cases {
            assert_eq!(choice(&FakeX86::new(features, xcr0)), want, "{name}");
        }
    }

    #[test]
    fn os_state_decides_too() {
        // AVX2 but the OS has not enabled YMM state (XCR0 = x87|SSE).
        assert_eq!(choice(&FakeX86::new(HASWELL, XCR0_SSE)), "sse41");
        // AVX2 but no OSXSAVE at all (XGETBV must not even be tried).
        assert_eq!(choice(&FakeX86::new(HASWELL, 0)), "sse41");
        // AVX-512 VNNI but the OS enabled only YMM, not the ZMM/opmask state.
        assert_eq!(choice(&FakeX86::new(CASCADE_LAKE, 0x7)), "avx2");
        // ZMM_Hi256 but not Hi16_ZMM: not enough.
        assert_eq!(choice(&FakeX86::new(CASCADE_LAKE, 0x67)), "avx2");
        let f = FakeX86::new(HASWELL, XCR0_SSE).features();
        assert!(f.has("sse4.1") && !f.has("avx") && !f.has("avx2") && !f.has("fma"));
        assert_eq!(u64::from(XCR0_YMM) & 0x7, 0x6);
        assert_eq!(u64::from(XCR0_ZMM) & 0xe7, 0xe6);
    }

    #[test]
    fn leaves_above_the_maximum_are_ignored() {
        let mut cpu = FakeX86::new(NEHALEM, XCR0_SSE);
        cpu.max_leaf = 6; // leaf 7 answered with all ones by the fake: must not count
        let f = cpu.features();
        assert!(!f.has("avx2") && !f.has("avx512f"));
        assert_eq!(choice(&cpu), "sse41");
    }

    #[test]
    fn missing_names_the_first_lacking_feature() {
        let f = FakeX86::new(NEHALEM, XCR0_SSE).features();
        let avx2 = X86_64_VARIANTS.iter().find(|v| v.name == "avx2").unwrap();
        assert_eq!(f.missing(avx2), Some("avx2"));
        let sse41 = X86_64_VARIANTS.iter().find(|v| v.name == "sse41").unwrap();
        assert_eq!(f.missing(sse41), None);
        let core2 = FakeX86::new(CORE2, XCR0_SSE).features();
        assert_eq!(core2.missing(sse41), Some("sse4.1"));
    }

    #[test]
    fn absent_builds_are_skipped() {
        let cpu = FakeX86::new(CASCADE_LAKE, 0xe7).features();
        let only = |names: &'static [&'static str]| move |n: &str| names.contains(&n);
        assert_eq!(pick(X86_64_VARIANTS, &cpu, &only(&["avx2", "sse2"])).unwrap().name, "avx2");
        assert_eq!(pick(X86_64_VARIANTS, &cpu, &only(&["sse2"])).unwrap().name, "sse2");
        assert!(pick(X86_64_VARIANTS, &cpu, &only(&[])).is_none());
        let core2 = FakeX86::new(CORE2, XCR0_SSE).features();
        assert!(pick(X86_64_VARIANTS, &core2, &only(&["avx2", "sse41"])).is_none());
    }

    #[test]
    fn every_variant_feature_is_in_the_feature_table() {
        for v in X86_64_VARIANTS {
            for f in v.cpu_features {
                assert!(CPU_FEATURES.iter().any(|c| c.name == *f), "{}: unknown feature {f}", v.name);
            }
        }
        for (variants, features) in
            [(table::AARCH64_VARIANTS, table::AARCH64_FEATURES), (table::ARM_VARIANTS, table::ARM_FEATURES)]
        {
            for v in variants {
                for f in v.cpu_features {
                    assert!(features.iter().any(|c| c.name == *f), "{}: unknown feature {f}", v.name);
                }
            }
        }
        assert_eq!(X86_64_VARIANTS.last().unwrap().cpu_features, &[] as &[&str], "the last x86-64 build is baseline");
    }

    #[test]
    fn hwcap_decoding() {
        // An AArch64 core with ASIMD and dot product (HWCAP bits 1 and 20) and I8MM (HWCAP2 bit 13).
        let f = decode_hwcap(table::AARCH64_FEATURES, (1 << 1) | (1 << 20), 1 << 13);
        assert_eq!(f.0, vec!["i8mm", "dotprod", "neon"]);
        let f = decode_hwcap(table::ARM_FEATURES, 1 << 12, 0);
        assert_eq!(f.0, vec!["neon"]);
        assert!(decode_hwcap(table::AARCH64_FEATURES, 0, 0).0.is_empty());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn native_detection_agrees_with_std() {
        let f = detect();
        macro_rules! same {
            ($($name:tt)*) => { $( assert_eq!(f.has($name), std::arch::is_x86_feature_detected!($name), $name); )* };
        }
        same!("avx512vnni" "avx512bw" "avx512vl" "avx512dq" "avx512cd" "avx512f" "avx2" "fma" "f16c" "bmi2" "bmi1"
              "avx" "popcnt" "sse4.2" "sse4.1" "ssse3" "sse3");
    }
}
