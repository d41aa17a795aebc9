//! The rustc wrapper of the variant builds: `cargo xtask` runs cargo with
//! `RUSTC_WRAPPER` set to its own executable and `KRAFLA_RUSTC_WRAPPER`
//! set, and builds variant NAME with the cargo feature `variant-NAME` of
//! the krafla and krafla-variant crates. Cargo then runs this for every
//! compilation as `xtask RUSTC ARGS...`; a compilation for a `--target`
//! whose arguments enable `feature="variant-NAME"` gets that row's
//! `-C target-feature` (build/src/variants.rs) added, every other one (the
//! dependencies, build scripts, the launcher) runs unchanged. A
//! `RUSTC_WRAPPER` of the user's own (sccache, say) is kept: it is passed
//! in `KRAFLA_RUSTC_WRAPPER` and run in front of the compiler.
//!
//! Why: with the target features in RUSTFLAGS, every variant compiled all
//! the dependencies again (about 45 s each, 13 variants); here they are
//! compiled once per target, and the feature keeps each variant's own
//! compilation of the two crates apart in the target directory. The crates
//! check at compile time that the features arrived (shared/build.rs).

use std::ffi::OsString;
use std::process::Command;

use crate::variants::Variant;
use crate::PLATFORMS;

/// Set in the environment of the cargo the variant builds run: empty, or
/// the user's own rustc wrapper to run the compiler through.
pub const ENV: &str = "KRAFLA_RUSTC_WRAPPER";

/// What the name of a variant's feature starts with.
const FEATURE_PREFIX: &str = "variant-";

/// The feature that selects variant `name`.
pub fn feature(name: &str) -> String {
    format!("{FEATURE_PREFIX}{name}")
}

/// Runs `args` (the compiler and its arguments) with the variant's target
/// features added where they apply; exits with its status.
pub fn run(args: &[OsString]) -> ! {
    let Some((compiler, rest)) = args.split_first() else {
        eprintln!("xtask: rustc wrapper: no compiler to run");
        std::process::exit(2);
    };
    let text: Vec<String> = rest.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut cmd = match std::env::var_os(ENV).filter(|w| !w.is_empty()) {
        Some(users) => {
            let mut cmd = Command::new(users);
            cmd.arg(compiler);
            cmd
        }
        None => Command::new(compiler),
    };
    cmd.args(rest);
    match variant_of(&text) {
        Ok(Some(v)) if !v.rustc_features.is_empty() => {
            cmd.arg(format!("-Ctarget-feature={}", v.rustc_features));
        }
        Ok(_) => {}
        Err(e) => {
            eprintln!("xtask: rustc wrapper: {e}");
            std::process::exit(2);
        }
    }
    match cmd.status() {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: rustc wrapper: cannot run {}: {e}", compiler.to_string_lossy());
            std::process::exit(2);
        }
    }
}

/// The variant a compilation with arguments `args` is for: None unless it
/// has a `--target` and enables a `variant-NAME` feature.
fn variant_of(args: &[String]) -> Result<Option<&'static Variant>, String> {
    let value_of = |flag: &str| args.windows(2).find(|w| w[0] == flag).map(|w| w[1].as_str());
    let Some(triple) = value_of("--target") else { return Ok(None) };
    let names: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--cfg")
        .filter_map(|w| w[1].strip_prefix("feature=\"")?.strip_prefix(FEATURE_PREFIX)?.strip_suffix('"'))
        .collect();
    let name = match names[..] {
        [] => return Ok(None),
        [one] => one,
        _ => return Err(format!("more than one variant feature: {names:?}")),
    };
    let platform =
        PLATFORMS.iter().find(|p| p.triple == triple).ok_or_else(|| format!("no platform builds {triple}"))?;
    platform
        .variants
        .iter()
        .find(|v| v.name == name)
        .map(Some)
        .ok_or_else(|| format!("'{name}' is not a build variant of {triple} (build/src/variants.rs)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_variant_comes_from_the_feature_and_the_target() {
        let v =
            variant_of(&args("--crate-name krafla --cfg feature=\"variant-avx2\" --target x86_64-unknown-linux-gnu"));
        assert_eq!(v.unwrap().unwrap().name, "avx2");
        let v = variant_of(&args("--cfg feature=\"variant-neon\" --target armv7-unknown-linux-gnueabihf"));
        assert_eq!(v.unwrap().unwrap().rustc_features, "+neon,+vfp4,+d32");
        let v = variant_of(&args("--cfg feature=\"variant-neon\" --target aarch64-unknown-linux-gnu"));
        assert_eq!(v.unwrap().unwrap().rustc_features, "");
        // a dependency, a build script (no --target), another feature
        assert!(variant_of(&args("--crate-name half --target x86_64-unknown-linux-gnu")).unwrap().is_none());
        assert!(variant_of(&args("--cfg feature=\"variant-avx2\" --crate-type bin")).unwrap().is_none());
        assert!(variant_of(&args("--cfg feature=\"std\" --target x86_64-unknown-linux-gnu")).unwrap().is_none());
        // a name of another architecture, two variants
        assert!(variant_of(&args("--cfg feature=\"variant-sve\" --target x86_64-pc-windows-gnu")).is_err());
        let two = "--cfg feature=\"variant-avx2\" --cfg feature=\"variant-sse2\" --target x86_64-unknown-linux-gnu";
        assert!(variant_of(&args(two)).is_err());
    }

    /// Every row of the table has its feature in both crates, and no other.
    #[test]
    fn the_crates_declare_one_feature_per_variant() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut want: Vec<String> =
            crate::ARCH_VARIANTS.iter().flat_map(|(_, vs)| vs.iter().map(|v| feature(v.name))).collect();
        want.sort();
        want.dedup();
        for manifest in ["shared/Cargo.toml", "variants/Cargo.toml"] {
            let text = std::fs::read_to_string(root.join(manifest)).unwrap();
            let mut got: Vec<String> = text
                .lines()
                .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim().to_string()))
                .filter(|k| k.starts_with("variant-"))
                .collect();
            got.sort();
            assert_eq!(got, want, "{manifest}");
        }
    }
}
