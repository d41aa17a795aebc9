//! Chooses this build's kernel set from the variant table
//! (build/src/variants.rs), so that the table is the one place a variant's
//! target features are written:
//!
//! * the variant is the first row of the target architecture whose
//!   `rustc_features` are all among the features the compiler enables
//!   (`CARGO_CFG_TARGET_FEATURE`: what `-C target-feature` and the target's
//!   defaults turn on, the same set `cfg(target_feature)` sees);
//! * its name becomes `cfg(krafla_isa = "NAME")`, which selects the kernel
//!   module (shared/src/kernels/mod.rs), and `KRAFLA_ISA`, the build's name;
//! * `OUT_DIR/isa_features.rs` defines `isa_features!`, which gives every
//!   kernel function the attribute `#[target_feature(enable = "...")]` with
//!   the row's features (plus the architecture's baseline feature);
//! * the build fails if the features the compiler enables and the row's
//!   `cpu_features` (what the start-up guard and the launcher check), with
//!   the target's own baseline (`target_baseline_cpu_features`: SSE3 on
//!   x86-64 Windows), differ.
//!
//! 32-bit ARM is the exception: rustc keeps `neon` and `vfp4` unstable there
//! and does not report them, so its one row is taken as given (its kernels
//! are `asm!` without target-feature attributes, and its guard always
//! checks both features). Architectures without a row get the portable
//! kernels.

#[path = "../build/src/variants.rs"]
mod table;

use std::collections::BTreeSet;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=../build/src/variants.rs");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let enabled: BTreeSet<String> = std::env::var("CARGO_CFG_TARGET_FEATURE")
        .unwrap_or_default()
        .split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect();

    let names: Vec<String> = [table::X86_64_VARIANTS, table::AARCH64_VARIANTS, table::ARM_VARIANTS]
        .iter()
        .flat_map(|vs| vs.iter().map(|v| format!("\"{}\"", v.name)))
        .chain(["\"portable\"".to_string()])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    println!("cargo:rustc-check-cfg=cfg(krafla_isa, values({}))", names.join(", "));

    let (isa, attribute) = match choose(&arch, &os, &enabled) {
        Ok(chosen) => chosen,
        Err(e) => panic!("shared/build.rs: {e}"),
    };
    println!("cargo:rustc-cfg=krafla_isa=\"{isa}\"");
    println!("cargo:rustc-env=KRAFLA_ISA={isa}");

    let wrap = match attribute {
        Some(features) => format!("$( #[target_feature(enable = \"{features}\")] $item )*"),
        None => "$( $item )*".to_string(),
    };
    let source = format!(
        "/// Gives each function the target features of this build's variant\n\
         /// (written by shared/build.rs from build/src/variants.rs).\n\
         #[allow(unused_macros)]\n\
         macro_rules! isa_features {{\n    ($($item:item)*) => {{ {wrap} }};\n}}\n"
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("isa_features.rs");
    std::fs::write(&out, source).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

/// (the variant's name, the feature list of its kernels' `#[target_feature]`
/// attribute, None for none).
fn choose(arch: &str, os: &str, enabled: &BTreeSet<String>) -> Result<(&'static str, Option<String>), String> {
    let variants = table::variants_for(arch);
    if arch == "arm" {
        return match variants {
            [one] => Ok((one.name, None)),
            _ => Err("32-bit ARM must have exactly one variant (its features are invisible to cfg)".into()),
        };
    }
    let wanted = |v: &table::Variant| -> Vec<&'static str> {
        v.rustc_features.split(',').filter(|f| !f.is_empty()).map(|f| f.trim_start_matches('+')).collect()
    };
    let Some(v) = variants.iter().find(|v| wanted(v).iter().all(|f| enabled.contains(*f))) else {
        return Ok(("portable", None));
    };

    // The guard checks `cpu_features` and the target's own baseline
    // features, the launcher `cpu_features`: together they must be exactly
    // the CPU features of the table that this compilation enables.
    let table_names: Vec<&str> = match arch {
        "x86_64" => table::CPU_FEATURES.iter().map(|f| f.name).collect(),
        "aarch64" => table::AARCH64_FEATURES.iter().map(|f| f.name).collect(),
        _ => Vec::new(),
    };
    let compiled: BTreeSet<&str> = table_names.into_iter().filter(|f| enabled.contains(*f)).collect();
    let listed: BTreeSet<&str> =
        v.cpu_features.iter().chain(table::target_baseline_cpu_features(arch, os)).copied().collect();
    if compiled != listed {
        return Err(format!(
            "variant '{}' (build/src/variants.rs) lists cpu_features {listed:?} (with the target's baseline), but \
             this compilation enables {compiled:?} of the table's CPU features: the guard would check the wrong ones",
            v.name
        ));
    }
    let mut features: Vec<&str> = table::arch_baseline_feature(arch).into_iter().collect();
    features.extend(wanted(v));
    Ok((v.name, Some(features.join(","))))
}
