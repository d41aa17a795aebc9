//! `ml_run`: finds the Krafla inference executables beside itself, picks the
//! fastest one this CPU can run, and replaces itself with it, passing every
//! argument and stdio through. It holds no model or kernel code.
//!
//! Builds are named `ml_<isa>`; a plain `cargo build` produces the portable
//! `ml_variant`, used when no per-ISA build is present.

use std::path::{Path, PathBuf};

/// A build and whether this CPU can run it, fastest first.
fn candidates() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512vnni = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("bmi2");
        let sse41 = std::arch::is_x86_feature_detected!("ssse3") && std::arch::is_x86_feature_detected!("sse4.1");
        vec![
            ("ml_avx512vnni", avx512vnni && avx2),
            ("ml_avx2", avx2),
            ("ml_sse41", sse41),
            ("ml_sse2", true),
            ("ml_variant", true),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec![("ml_variant", true)]
    }
}

fn pick(dir: &Path) -> Option<PathBuf> {
    let suffix = std::env::consts::EXE_SUFFIX;
    candidates()
        .into_iter()
        .filter(|&(_, supported)| supported)
        .map(|(name, _)| dir.join(format!("{name}{suffix}")))
        .find(|p| p.is_file())
}

fn main() {
    let dir = match std::env::current_exe() {
        Ok(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
        Err(e) => {
            eprintln!("ml_run: cannot locate my own executable: {e}");
            std::process::exit(2);
        }
    };
    let Some(target) = pick(&dir) else {
        eprintln!("ml_run: no Krafla build (ml_<isa>) found beside {}", dir.display());
        std::process::exit(2);
    };
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // Installed as `ml_server` (busybox style): run the chosen build in server mode.
    let invoked_as = std::env::args_os()
        .next()
        .and_then(|a| Path::new(&a).file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    if invoked_as == "ml_server" {
        args.insert(0, "--server".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = std::process::Command::new(&target).args(&args).exec();
        eprintln!("ml_run: cannot start {}: {err}", target.display());
        std::process::exit(2);
    }
    #[cfg(not(unix))]
    {
        match std::process::Command::new(&target).args(&args).status() {
            Ok(status) => std::process::exit(status.code().unwrap_or(1)),
            Err(err) => {
                eprintln!("ml_run: cannot start {}: {err}", target.display());
                std::process::exit(2);
            }
        }
    }
}
