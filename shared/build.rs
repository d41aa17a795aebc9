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
//! `cargo xtask` names the variant instead, with the cargo feature
//! `variant-NAME` (shared/Cargo.toml), and its rustc wrapper
//! (build/src/rustc_wrapper.rs) adds the row's target features to this
//! crate's compilation only, not to the build script's environment: then
//! the enabled features are the compiler's (`rustc --print cfg`) with the
//! row's flags, the same checks apply, and `isa_features.rs` also holds
//! `compile_error!`s for a compilation that lacks the row's features (the
//! feature given without the wrapper) or has CPU features of the table
//! beyond them.
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
    let named = named_variant(&arch);
    let enabled: BTreeSet<String> = match named {
        Some(v) => compiler_features(v.rustc_features),
        None => std::env::var("CARGO_CFG_TARGET_FEATURE")
            .unwrap_or_default()
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect(),
    };

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
    if let Some(v) = named {
        if v.name != isa {
            panic!(
                "shared/build.rs: the feature variant-{} asks for variant '{}', but its features select '{isa}'",
                v.name, v.name
            );
        }
    }
    println!("cargo:rustc-cfg=krafla_isa=\"{isa}\"");
    println!("cargo:rustc-env=KRAFLA_ISA={isa}");

    let wrap = match attribute {
        Some(features) => format!("$( #[target_feature(enable = \"{features}\")] $item )*"),
        None => "$( $item )*".to_string(),
    };
    let mut source = format!(
        "/// Gives each function the target features of this build's variant\n\
         /// (written by shared/build.rs from build/src/variants.rs).\n\
         #[allow(unused_macros)]\n\
         macro_rules! isa_features {{\n    ($($item:item)*) => {{ {wrap} }};\n}}\n"
    );
    // The named variant's features must reach the compilation, and no CPU
    // feature of the table beyond them (32-bit ARM's are invisible to cfg).
    if let Some(v) = named.filter(|_| arch != "arm") {
        let cfg = |f: &str| format!("target_feature = \"{f}\"");
        let wanted: Vec<String> = v.rustc_features.split(',').filter_map(|f| f.strip_prefix('+')).map(cfg).collect();
        if !wanted.is_empty() {
            source.push_str(&format!(
                "#[cfg(not(all({})))]\ncompile_error!(\"the feature variant-{} needs -C target-feature={}: build \
                 the variants with `cargo xtask` (its rustc wrapper adds them)\");\n",
                wanted.join(", "),
                v.name,
                v.rustc_features
            ));
        }
        let beyond: Vec<String> =
            table_features(&arch).into_iter().filter(|f| !enabled.contains(*f)).map(cfg).collect();
        if !beyond.is_empty() {
            source.push_str(&format!(
                "#[cfg(any({}))]\ncompile_error!(\"the feature variant-{} is compiled with CPU features beyond its \
                 row's (build/src/variants.rs): the guard would not check them\");\n",
                beyond.join(", "),
                v.name
            ));
        }
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("isa_features.rs");
    std::fs::write(&out, source).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

/// The CPU features of the architecture's table (what the guard can check).
fn table_features(arch: &str) -> Vec<&'static str> {
    match arch {
        "x86_64" => table::CPU_FEATURES.iter().map(|f| f.name).collect(),
        "aarch64" => table::AARCH64_FEATURES.iter().map(|f| f.name).collect(),
        _ => Vec::new(),
    }
}

/// The variant the cargo feature `variant-NAME` names, if one is set.
fn named_variant(arch: &str) -> Option<&'static table::Variant> {
    let names: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| Some(k.strip_prefix("CARGO_FEATURE_VARIANT_")?.to_ascii_lowercase()))
        .collect();
    let name = match &names[..] {
        [] => return None,
        [one] => one,
        _ => panic!("shared/build.rs: more than one variant feature: {names:?}"),
    };
    let found = table::variants_for(arch).iter().find(|v| v.name == name);
    Some(found.unwrap_or_else(|| panic!("shared/build.rs: 'variant-{name}' is not a build variant of {arch}")))
}

/// The target features the compiler enables for this target with the
/// flags cargo passes (RUSTFLAGS) and `-C target-feature=FEATURES`.
fn compiler_features(features: &str) -> BTreeSet<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let mut cmd = std::process::Command::new(&rustc);
    cmd.args(["--print", "cfg", "--target", &target]);
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    if !features.is_empty() {
        cmd.arg(format!("-Ctarget-feature={features}"));
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("shared/build.rs: cannot run {rustc}: {e}"));
    if !out.status.success() {
        panic!("shared/build.rs: {cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| Some(l.strip_prefix("target_feature=\"")?.strip_suffix('"')?.to_string()))
        .collect()
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
    let compiled: BTreeSet<&str> = table_features(arch).into_iter().filter(|f| enabled.contains(*f)).collect();
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
