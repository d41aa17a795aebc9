//! `ml_run` / `ml_server`: the Krafla launcher. It probes the CPU (CPUID and
//! XGETBV on x86-64, the auxiliary vector on Linux ARM), reads the variant
//! table (build/src/variants.rs, the one source of truth shared with
//! `cargo xtask` and the variants' start-up guard), and replaces itself with
//! the fastest build in its own directory that this CPU runs, passing every
//! argument and stdio through (`exec` on Unix; on Windows it starts the
//! build, waits and returns its exit code). It holds no model or kernel code.
//!
//! Builds are named `ml_<isa>` (`ml_<isa>.exe` on Windows). A plain
//! `cargo build` produces the portable host build `ml_variant` instead, used
//! when no per-ISA build is present.
//!
//! Installed under the name `ml_server` (busybox style), it starts the chosen
//! build with `--server` prepended.
//!
//! With ML_RUN_WRAPPER set (e.g. `qemu-aarch64 -cpu cortex-a76`), the chosen
//! build is started through that command (see `command_for`).
//!
//! Own options (anywhere before a `--`; everything else is passed on):
//!   --isa NAME     run that build (error if unknown, absent, or this CPU lacks it)
//!   --list-isas    table of builds: present / supported / selected
//!   --version, -V  launcher version and the build it would run
//!   --help, -h     these options, then the build's own help

use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[path = "../../build/src/variants.rs"]
mod table;

mod cpu;

use table::Variant;

/// Exit code for bad arguments / nothing to run (as the inference binary's).
const EXIT_BAD_INPUT: i32 = 2;

/// The portable host build `cargo build` puts beside `ml_run`.
const FALLBACK: &str = "ml_variant";

/// What the command line asks of the launcher itself.
#[derive(Debug, Default, PartialEq)]
struct Opts {
    isa: Option<String>,
    list: bool,
    version: bool,
    help: bool,
    /// Arguments for the build, in order (launcher options removed).
    rest: Vec<OsString>,
}

/// Splits the launcher's options from the build's. Stops looking at `--`.
fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--") => {
                o.rest.push(a);
                o.rest.extend(it);
                break;
            }
            Some("--isa") => match it.next() {
                Some(v) => o.isa = Some(v.to_string_lossy().into_owned()),
                None => return Err("--isa needs a build name (see --list-isas)".into()),
            },
            Some(s) if s.starts_with("--isa=") => o.isa = Some(s["--isa=".len()..].to_string()),
            Some("--list-isas") => o.list = true,
            Some("--version") | Some("-V") => o.version = true,
            Some("--help") | Some("-h") => {
                o.help = true;
                o.rest.push(a);
            }
            _ => o.rest.push(a),
        }
    }
    Ok(o)
}

fn exe_name(stem: &str) -> String {
    format!("{stem}{}", std::env::consts::EXE_SUFFIX)
}

fn build_file(dir: &Path, isa: &str) -> PathBuf {
    dir.join(exe_name(&format!("ml_{isa}")))
}

/// Which build to run and why not, given the CPU and the directory contents.
fn choose(
    variants: &'static [Variant],
    cpu: &cpu::Features,
    present: &dyn Fn(&str) -> bool,
    fallback_present: bool,
    forced: Option<&str>,
) -> Result<String, String> {
    let names = || variants.iter().map(|v| v.name).collect::<Vec<_>>().join(", ");
    if let Some(name) = forced {
        let Some(v) = variants.iter().find(|v| v.name == name) else {
            return Err(format!("unknown ISA '{name}' (this platform's builds: {})", names()));
        };
        if !present(v.name) {
            return Err(format!("--isa {name}: {} is not in this directory", exe_name(&format!("ml_{name}"))));
        }
        if let Some(f) = cpu.missing(v) {
            return Err(format!("--isa {name}: this CPU lacks the feature '{f}', which ml_{name} needs"));
        }
        return Ok(format!("ml_{}", v.name));
    }
    if let Some(v) = cpu::pick(variants, cpu, present) {
        return Ok(format!("ml_{}", v.name));
    }
    if fallback_present {
        return Ok(FALLBACK.to_string());
    }
    let any_present = variants.iter().any(|v| present(v.name));
    Err(if any_present {
        "none of the Krafla builds in this directory runs on this CPU (see --list-isas)".to_string()
    } else {
        format!(
            "no Krafla build (ml_<isa>{} or {}) in this directory",
            std::env::consts::EXE_SUFFIX,
            exe_name(FALLBACK)
        )
    })
}

fn list(variants: &[Variant], cpu: &cpu::Features, dir: &Path, selected: Option<&str>) {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "Krafla builds for {}-{} in {}", std::env::consts::OS, std::env::consts::ARCH, dir.display());
    let _ = writeln!(out, "{:<16} {:<8} {:<10} {:<9} needs", "build", "present", "supported", "selected");
    let yes = |b: bool| if b { "yes" } else { "no" };
    for v in variants {
        let file = format!("ml_{}", v.name);
        let supported = match cpu.missing(v) {
            None => "yes".to_string(),
            Some(f) => format!("no ({f})"),
        };
        let needs = if v.cpu_features.is_empty() { "baseline".to_string() } else { v.cpu_features.join(" ") };
        let _ = writeln!(
            out,
            "{:<16} {:<8} {:<10} {:<9} {}",
            file,
            yes(build_file(dir, v.name).is_file()),
            supported,
            if selected == Some(file.as_str()) { "*" } else { "" },
            needs
        );
    }
    let fallback = dir.join(exe_name(FALLBACK));
    if fallback.is_file() || selected == Some(FALLBACK) {
        let _ = writeln!(
            out,
            "{:<16} {:<8} {:<10} {:<9} host build (used when no ml_<isa> fits)",
            FALLBACK,
            yes(fallback.is_file()),
            "-",
            if selected == Some(FALLBACK) { "*" } else { "" }
        );
    }
    let _ = writeln!(out, "this CPU: {}", if cpu.0.is_empty() { "baseline".to_string() } else { cpu.0.join(" ") });
    print_out(&out);
}

/// Writes `text` to stdout. A reader that has gone away (`ml_run --list-isas
/// | head -1`) ends the launcher quietly with exit 0, as `head` expects.
fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => fail(&format!("cannot write to standard output: {e}")),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("ml_run: {msg}");
    std::process::exit(EXIT_BAD_INPUT);
}

fn main() {
    let mut argv = std::env::args_os();
    let argv0 = argv.next().unwrap_or_default();
    let opts = parse(argv).unwrap_or_else(|e| fail(&e));

    // Installed as `ml_server` (busybox style): run the chosen build in server mode.
    let server = Path::new(&argv0).file_stem().is_some_and(|s| s.eq_ignore_ascii_case("ml_server"));

    let dir = match std::env::current_exe() {
        Ok(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
        Err(e) => fail(&format!("cannot locate my own executable: {e}")),
    };
    let variants = table::variants_for(std::env::consts::ARCH);
    let cpu = cpu::detect();
    let present = |isa: &str| build_file(&dir, isa).is_file();
    let fallback_present = dir.join(exe_name(FALLBACK)).is_file();
    let chosen = choose(variants, &cpu, &present, fallback_present, opts.isa.as_deref());

    if opts.list {
        list(variants, &cpu, &dir, chosen.as_deref().ok());
        if let Err(e) = &chosen {
            fail(e);
        }
        return;
    }
    if opts.version {
        let name = if server { "ml_server" } else { "ml_run" };
        print_out(&format!(
            "{name} {} (Krafla launcher, {}-{})\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH
        ));
        match &chosen {
            Ok(build) => print_out(&format!("runs {}\n", dir.join(exe_name(build)).display())),
            Err(e) => fail(e),
        }
        return;
    }
    let build = chosen.unwrap_or_else(|e| fail(&e));
    if opts.help {
        print_out(&format!(
            "Launcher options (ml_run / ml_server): --isa NAME (force a build), --list-isas, --version\n\
             Running {} --help:\n\n",
            exe_name(&build)
        ));
    }
    let target = dir.join(exe_name(&build));
    let mut args = opts.rest;
    if server {
        args.insert(0, "--server".into());
    }
    run(&target, args)
}

/// The command that starts `target`: `target` itself, or, when the
/// environment variable ML_RUN_WRAPPER holds a command (split at
/// whitespace), that command with `target` appended, as cargo's
/// `target.<triple>.runner`. It runs the chosen build under an emulator
/// (`ML_RUN_WRAPPER="qemu-aarch64 -cpu cortex-a76"`: an emulated launcher
/// cannot exec a foreign executable without binfmt_misc) or a profiler.
fn command_for(target: &Path, wrapper: Option<OsString>) -> std::process::Command {
    let words: Vec<String> =
        wrapper.map(|w| w.to_string_lossy().split_whitespace().map(str::to_string).collect()).unwrap_or_default();
    match words.split_first() {
        Some((program, rest)) => {
            let mut cmd = std::process::Command::new(program);
            cmd.args(rest).arg(target);
            cmd
        }
        None => std::process::Command::new(target),
    }
}

/// Replaces this process with `target`.
#[cfg(unix)]
fn run(target: &Path, args: Vec<OsString>) -> ! {
    use std::os::unix::process::CommandExt;
    let mut cmd = command_for(target, std::env::var_os("ML_RUN_WRAPPER"));
    let err = cmd.args(args).exec();
    fail(&format!("cannot start {:?}: {err}", cmd.get_program()))
}

/// Starts `target`, waits, and exits with its exit code. Ctrl-C reaches both
/// processes (same console): the launcher ignores it and lets the build
/// decide. The build runs in a job object that is killed when the launcher's
/// handle closes, so ending the launcher (a service manager stopping
/// `ml_server.exe`, say) ends the build too.
#[cfg(windows)]
fn run(target: &Path, args: Vec<OsString>) -> ! {
    use std::os::windows::io::AsRawHandle;
    use std::ptr::null_mut;
    type Handle = *mut core::ffi::c_void;

    #[repr(C)]
    #[derive(Default)]
    struct BasicLimits {
        per_process_user_time: i64,
        per_job_user_time: i64,
        limit_flags: u32,
        min_working_set: usize,
        max_working_set: usize,
        active_process_limit: u32,
        affinity: usize,
        priority_class: u32,
        scheduling_class: u32,
    }
    /// JOBOBJECT_EXTENDED_LIMIT_INFORMATION
    #[repr(C)]
    #[derive(Default)]
    struct ExtendedLimits {
        basic: BasicLimits,
        io_counters: [u64; 6],
        process_memory_limit: usize,
        job_memory_limit: usize,
        peak_process_memory: usize,
        peak_job_memory: usize,
    }
    const JOB_OBJECT_EXTENDED_LIMIT_INFORMATION: i32 = 9;
    const JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: u32 = 0x2000;

    #[link(name = "kernel32")]
    extern "system" {
        fn SetConsoleCtrlHandler(handler: Option<unsafe extern "system" fn(u32) -> i32>, add: i32) -> i32;
        fn CreateJobObjectW(attributes: *mut core::ffi::c_void, name: *const u16) -> Handle;
        fn SetInformationJobObject(job: Handle, class: i32, info: *mut core::ffi::c_void, len: u32) -> i32;
        fn AssignProcessToJobObject(job: Handle, process: Handle) -> i32;
    }
    // SAFETY: a null handler with add=TRUE makes this process ignore Ctrl-C;
    // no pointer is passed.
    unsafe {
        SetConsoleCtrlHandler(None, 1);
    }
    let mut child = match command_for(target, std::env::var_os("ML_RUN_WRAPPER")).args(args).spawn() {
        Ok(c) => c,
        Err(err) => fail(&format!("cannot start {}: {err}", target.display())),
    };
    // Best effort: without the job the build still runs, it just outlives a killed launcher.
    // SAFETY: CreateJobObjectW takes null (default security, no name); the
    // limits struct is a live, correctly laid out JOBOBJECT_EXTENDED_LIMIT_INFORMATION
    // whose size is passed; the process handle is the child's, valid while
    // `child` lives. The job handle is deliberately never closed: it closes
    // (and kills the build) when this process ends.
    unsafe {
        let job = CreateJobObjectW(null_mut(), std::ptr::null());
        if !job.is_null() {
            let mut limits = ExtendedLimits::default();
            limits.basic.limit_flags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
            let ok = SetInformationJobObject(
                job,
                JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
                (&mut limits as *mut ExtendedLimits).cast(),
                core::mem::size_of::<ExtendedLimits>() as u32,
            );
            if ok != 0 {
                AssignProcessToJobObject(job, child.as_raw_handle());
            }
        }
    }
    match child.wait() {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(err) => fail(&format!("waiting for {}: {err}", target.display())),
    }
}

#[cfg(not(any(unix, windows)))]
fn run(target: &Path, args: Vec<OsString>) -> ! {
    match std::process::Command::new(target).args(args).status() {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(err) => fail(&format!("cannot start {}: {err}", target.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Features;
    use table::X86_64_VARIANTS;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn launcher_options_are_taken_out() {
        let o = parse(os(&["--isa", "avx2", "m.mlb", "-p", "hi", "--list-isas"])).unwrap();
        assert_eq!(o.isa.as_deref(), Some("avx2"));
        assert!(o.list);
        assert_eq!(o.rest, os(&["m.mlb", "-p", "hi"]));
        let o = parse(os(&["m.mlb", "--isa=sse2", "-n", "3"])).unwrap();
        assert_eq!(o.isa.as_deref(), Some("sse2"));
        assert_eq!(o.rest, os(&["m.mlb", "-n", "3"]));
        // After `--` nothing is the launcher's.
        let o = parse(os(&["m.mlb", "--", "--isa", "x"])).unwrap();
        assert_eq!(o.isa, None);
        assert_eq!(o.rest, os(&["m.mlb", "--", "--isa", "x"]));
        assert!(parse(os(&["--isa"])).is_err());
        let o = parse(os(&["--help"])).unwrap();
        assert!(o.help && o.rest == os(&["--help"]));
        assert!(parse(os(&["-V"])).unwrap().version);
    }

    fn features(names: &[&'static str]) -> Features {
        Features(names.to_vec())
    }

    const HASWELL: &[&str] =
        &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "f16c", "fma", "avx2", "bmi1", "bmi2"];

    #[test]
    fn choice_and_fallback() {
        let all = |_: &str| true;
        let none = |_: &str| false;
        let cpu = features(HASWELL);
        assert_eq!(choose(X86_64_VARIANTS, &cpu, &all, true, None).unwrap(), "ml_avx2");
        // Only the host build beside ml_run (plain `cargo build`): it is used.
        assert_eq!(choose(X86_64_VARIANTS, &cpu, &none, true, None).unwrap(), "ml_variant");
        let e = choose(X86_64_VARIANTS, &cpu, &none, false, None).unwrap_err();
        assert!(e.contains("no Krafla build"), "{e}");
        // A directory with only builds this CPU cannot run.
        let avx512 = |n: &str| n == "avx512vnni";
        let e = choose(X86_64_VARIANTS, &cpu, &avx512, false, None).unwrap_err();
        assert!(e.contains("none of the Krafla builds"), "{e}");
    }

    #[test]
    fn forced_isa() {
        let all = |_: &str| true;
        let cpu = features(HASWELL);
        assert_eq!(choose(X86_64_VARIANTS, &cpu, &all, true, Some("sse2")).unwrap(), "ml_sse2");
        assert_eq!(choose(X86_64_VARIANTS, &cpu, &all, true, Some("sse41")).unwrap(), "ml_sse41");
        let e = choose(X86_64_VARIANTS, &cpu, &all, true, Some("avx9")).unwrap_err();
        assert!(e.contains("unknown ISA 'avx9'") && e.contains("avx512vnni, avx2, sse41, sse2"), "{e}");
        let e = choose(X86_64_VARIANTS, &cpu, &all, true, Some("avx512vnni")).unwrap_err();
        assert!(e.contains("lacks the feature 'avx512vnni'"), "{e}");
        let no_sse41 = |n: &str| n != "sse41";
        let e = choose(X86_64_VARIANTS, &cpu, &no_sse41, true, Some("sse41")).unwrap_err();
        assert!(e.contains("is not in this directory"), "{e}");
    }

    #[test]
    fn wrapper_prefixes_the_build() {
        let t = Path::new("/opt/krafla/ml_neon");
        let c = command_for(t, None);
        assert_eq!(c.get_program(), t.as_os_str());
        assert_eq!(c.get_args().count(), 0);
        let c = command_for(t, Some("  ".into()));
        assert_eq!(c.get_program(), t.as_os_str());
        let c = command_for(t, Some(" qemu-aarch64  -cpu cortex-a76 ".into()));
        assert_eq!(c.get_program(), "qemu-aarch64");
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(args, ["-cpu", "cortex-a76", "/opt/krafla/ml_neon"]);
    }

    #[test]
    fn arm_tables_pick_the_best_build() {
        let all = |_: &str| true;
        let pick = |names: &[&'static str]| choose(table::AARCH64_VARIANTS, &features(names), &all, false, None);
        assert_eq!(pick(&["neon"]).unwrap(), "ml_neon"); // Cortex-A53/A72 (Pi 3, Pi 4)
        assert_eq!(pick(&["dotprod", "fp16", "neon"]).unwrap(), "ml_neon_dotprod"); // Cortex-A76 (Pi 5)
        assert_eq!(pick(&["i8mm", "bf16", "dotprod", "neon"]).unwrap(), "ml_i8mm"); // Neoverse N2
        assert_eq!(pick(&["sve", "i8mm", "dotprod", "neon"]).unwrap(), "ml_sve"); // Neoverse V1
        assert_eq!(pick(&["sve", "neon", "fp16"]).unwrap(), "ml_neon"); // A64FX: SVE, no dotprod
        let arm = |names: &[&'static str]| choose(table::ARM_VARIANTS, &features(names), &all, false, None);
        assert_eq!(arm(&["vfp4", "neon"]).unwrap(), "ml_neon");
        let e = arm(&["vfp4"]).unwrap_err();
        assert!(e.contains("none of the Krafla builds"), "{e}");
    }
}
