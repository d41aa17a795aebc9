//! `cargo xtask fuzz [TARGET] [--seconds N] [--jobs J]`: builds the fuzz
//! targets of tests/fuzz/ with cargo-fuzz (libFuzzer, AddressSanitizer,
//! debug assertions) and runs each (or TARGET) for N seconds, J at a time,
//! from its seeds (tests/fuzz/seeds/TARGET) and dictionary
//! (tests/fuzz/dict/TARGET.dict). The corpus grows in
//! target/fuzz-corpus/TARGET (outside git), crashing inputs land in
//! target/fuzz-artifacts/TARGET/, the fuzzer's output in
//! target/fuzz-logs/TARGET.log. Prints executions, exec/s, coverage (cov, ft)
//! and corpus size per target; fails when a target crashed or one input took
//! longer than its limit (`input_timeout`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{cargo, repo_root, run};

pub const TARGETS: &[&str] = &[
    "mlb",
    "mlt",
    "gguf",
    "http_head",
    "json_request",
    "json_schema",
    "gbnf",
    "imatrix",
    "scaled",
    "import_sources",
    "chat_template",
];

/// Seconds one input may take before libFuzzer calls it a hang: 20, and 3
/// for `scaled`, whose inputs (at most 256 KiB of request text) the linear
/// parsers read in at most 0.7 s under the sanitizer and debug assertions
/// (a pattern of 6,900 copies of a 38-byte piece, 5 December 2026; about
/// 2.6 µs a byte), while a quadratic one would take minutes. (1 s was too
/// tight: that input timed out with another fuzzer beside it.)
fn input_timeout(target: &str) -> u64 {
    if target == "scaled" {
        3
    } else {
        20
    }
}

/// The default run: half an hour per target.
const DEFAULT_SECONDS: u64 = 1800;

struct Options {
    targets: Vec<&'static str>,
    seconds: u64,
    jobs: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let usage = || format!("usage: cargo xtask fuzz [{}] [--seconds N] [--jobs J]", TARGETS.join("|"));
    let mut o = Options { targets: TARGETS.to_vec(), seconds: DEFAULT_SECONDS, jobs: 2 };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = |what: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{what} needs a positive number; {}", usage()))
        };
        match a.as_str() {
            "--seconds" => o.seconds = number("--seconds")?,
            "--jobs" => o.jobs = number("--jobs")? as usize,
            t => match TARGETS.iter().find(|&&k| k == t) {
                Some(k) => o.targets = vec![k],
                None => return Err(format!("unknown fuzz target or option '{t}'; {}", usage())),
            },
        }
    }
    Ok(o)
}

/// `cargo +nightly` when a nightly toolchain is installed, else the default
/// toolchain with RUSTC_BOOTSTRAP=1 (the sanitizer flags are unstable).
fn fuzz_cargo() -> Command {
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = if nightly {
        let mut c = Command::new("cargo");
        c.arg("+nightly");
        c
    } else {
        eprintln!("xtask: no nightly toolchain; building the fuzz targets with RUSTC_BOOTSTRAP=1");
        let mut c = cargo();
        c.env("RUSTC_BOOTSTRAP", "1");
        c
    };
    cmd.env("CARGO_TARGET_DIR", repo_root().join("target/fuzz"));
    cmd
}

/// What libFuzzer reported at the end of a run.
#[derive(Default)]
struct Stats {
    execs: u64,
    exec_per_sec: u64,
    cov: u64,
    ft: u64,
    corpus: u64,
    corpus_bytes: String,
    rss_mb: u64,
}

/// The figures of a libFuzzer log: the last `#N ... cov: C ft: F corp: K/S`
/// line and the `stat::` lines of `-print_final_stats=1`.
fn stats(log: &str) -> Stats {
    let mut s = Stats::default();
    let field = |line: &str, key: &str| -> Option<String> {
        let mut words = line.split_whitespace();
        words.by_ref().find(|w| *w == key)?;
        words.next().map(str::to_string)
    };
    for line in log.lines() {
        if line.starts_with('#') && line.contains(" cov: ") {
            s.cov = field(line, "cov:").and_then(|v| v.parse().ok()).unwrap_or(s.cov);
            s.ft = field(line, "ft:").and_then(|v| v.parse().ok()).unwrap_or(s.ft);
            if let Some((n, bytes)) = field(line, "corp:").as_deref().and_then(|c| c.split_once('/')) {
                s.corpus = n.parse().unwrap_or(s.corpus);
                s.corpus_bytes = bytes.to_string();
            }
        }
        let stat = |name: &str| line.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(v) = stat("stat::number_of_executed_units:") {
            s.execs = v;
        }
        if let Some(v) = stat("stat::average_exec_per_sec:") {
            s.exec_per_sec = v;
        }
        if let Some(v) = stat("stat::peak_rss_mb:") {
            s.rss_mb = v;
        }
    }
    s
}

/// Builds every target, then runs the chosen ones `jobs` at a time.
pub fn fuzz(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let root = repo_root();
    if !Command::new("cargo").args(["fuzz", "--version"]).stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        return Err("cargo-fuzz is not installed (cargo install cargo-fuzz --locked)".into());
    }
    run(fuzz_cargo().args(["fuzz", "build", "--fuzz-dir", "tests/fuzz", "--debug-assertions"]))?;
    let bin_dir = root.join("target/fuzz/x86_64-unknown-linux-gnu/release");
    let bin_dir = if bin_dir.is_dir() { bin_dir } else { host_bin_dir(&root)? };

    let mut failed = Vec::new();
    for batch in o.targets.chunks(o.jobs.max(1)) {
        let running = batch
            .iter()
            .map(|&t| start(&root, &bin_dir, t, o.seconds).map(|child| (t, child)))
            .collect::<Result<Vec<_>, String>>()?;
        for (t, mut child) in running {
            let status = child.wait().map_err(|e| format!("{t}: {e}"))?;
            let log = std::fs::read_to_string(log_path(&root, t)).unwrap_or_default();
            let s = stats(&log);
            println!(
                "fuzz {t}: {} executions, {} exec/s, cov {}, ft {}, corpus {} inputs ({}), peak RSS {} MB, {}",
                s.execs,
                s.exec_per_sec,
                s.cov,
                s.ft,
                s.corpus,
                s.corpus_bytes,
                s.rss_mb,
                if status.success() { "no crash".to_string() } else { format!("CRASH ({status})") }
            );
            if !status.success() {
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- {t}: the end of {} ---", log_path(&root, t).display());
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
                failed.push(t);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fuzz targets crashed: {} (inputs in target/fuzz-artifacts/<target>/; \
             each becomes a regression test next to its parser)",
            failed.join(", ")
        ))
    }
}

/// The release directory of the host triple, when it is not x86-64 Linux.
fn host_bin_dir(root: &Path) -> Result<PathBuf, String> {
    let out = Command::new("rustc").arg("-vV").output().map_err(|e| format!("rustc -vV: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let host = text.lines().find_map(|l| l.strip_prefix("host: ")).ok_or("rustc -vV names no host")?;
    Ok(root.join("target/fuzz").join(host.trim()).join("release"))
}

fn log_path(root: &Path, target: &str) -> PathBuf {
    root.join("target/fuzz-logs").join(format!("{target}.log"))
}

/// Starts one libFuzzer run: new inputs go to the first corpus directory
/// (target/fuzz-corpus/TARGET), the committed seeds are read from the second.
fn start(root: &Path, bin_dir: &Path, target: &str, seconds: u64) -> Result<std::process::Child, String> {
    let corpus = root.join("target/fuzz-corpus").join(target);
    let artifacts = root.join("target/fuzz-artifacts").join(target);
    let log = log_path(root, target);
    for d in [&corpus, &artifacts, &log.parent().unwrap().to_path_buf()] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let seeds = root.join("tests/fuzz/seeds").join(target);
    let dict = root.join("tests/fuzz/dict").join(format!("{target}.dict"));
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut cmd = Command::new(bin_dir.join(target));
    cmd.arg(&corpus)
        .arg(&seeds)
        .arg(format!("-dict={}", dict.display()))
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        // An input taking `input_timeout` is a hang; 2 GB is far beyond any input's worth.
        .arg(format!("-timeout={}", input_timeout(target)))
        .args(["-rss_limit_mb=2048", "-malloc_limit_mb=2048", "-print_final_stats=1"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out);
    eprintln!("xtask: fuzz {target} for {seconds} s (log {})", log.display());
    cmd.spawn().map_err(|e| format!("cannot start {}: {e}", bin_dir.join(target).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_figures() {
        let log = "#2\tINITED cov: 10 ft: 12 corp: 3/100b exec/s: 0 rss: 30Mb\n\
                   #4096\tpulse  cov: 250 ft: 900 corp: 120/8Kb lim: 4096 exec/s: 2048 rss: 60Mb\n\
                   Done 5000 runs in 2 second(s)\n\
                   stat::number_of_executed_units: 5000\nstat::average_exec_per_sec:     2500\n\
                   stat::new_units_added:          117\nstat::peak_rss_mb:              61\n";
        let s = stats(log);
        assert_eq!((s.execs, s.exec_per_sec, s.cov, s.ft, s.corpus, s.rss_mb), (5000, 2500, 250, 900, 120, 61));
        assert_eq!(s.corpus_bytes, "8Kb");
    }

    #[test]
    fn parses_arguments() {
        let o = parse(&["gguf".into(), "--seconds".into(), "40".into()]).unwrap();
        assert_eq!((o.targets, o.seconds, o.jobs), (vec!["gguf"], 40, 2));
        assert!(parse(&["nope".into()]).is_err());
        assert!(parse(&["--seconds".into(), "0".into()]).is_err());
    }
}
