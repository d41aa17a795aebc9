"""The release archives (`cargo xtask release linux-x86_64|windows-x86_64|
linux-aarch64|linux-armv7hf`, which `cargo xtask test` runs first): each is unpacked into a fresh temporary
directory outside the checkout and used as a downloader would, by absolute
path with nothing added to PATH:

* layout: one top folder `krafla-<version>-<platform>/` holding exactly
  ml_run, ml_server, every ml_<isa>, README.md, LICENSE, SHA256SUMS;
* SHA256SUMS lists every other file with its right checksum;
* every executable is static and stripped (`cargo xtask check-static`, the
  `object`-crate checker: no PT_INTERP / DT_NEEDED; on Windows system DLLs only);
* the two real GGUF files run as they are, with nothing but the archive (no
  Python, no converted file): SmolLM2-135M-Instruct's Q4_1 GGUF answers
  "What is the capital of France?" with Paris through ml_run (and through
  ml_server's OpenAI-compatible API), Gemma 3 270M's Q4_K_M GGUF continues
  "Paris is the capital of" with France;
* the ARM tarballs do the same under qemu-user (the launcher emulated too,
  starting its build through ML_RUN_WRAPPER, since an emulated process cannot
  exec a foreign executable without binfmt_misc);
* the Windows zip does the same under wine. Debian's wine 8 lacks
  bcryptprimitives.dll (Rust's std imports ProcessPrng from it), so this test,
  and only this test, builds a stand-in DLL from a few lines of C over
  RtlGenRandom with MinGW and puts it beside the unpacked executables.

Without an archive, wine or MinGW the tests skip, except in CI (env CI set),
where they fail.
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
import zipfile

import pytest

from conftest import REPO, ServerProcess, best_build, isas, missing_feature, unavailable

VERSION = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]
ISAS = isas("x86_64")  # the variant table's, fastest first
# platform -> its CPU architecture (as the variant table names it)
PLATFORM_ARCH = {
    "linux-x86_64": "x86_64",
    "windows-x86_64": "x86_64",
    "linux-aarch64": "aarch64",
    "linux-armv7hf": "arm",
}
PLATFORM_ISAS = {platform: isas(arch) for platform, arch in PLATFORM_ARCH.items()}
QUESTION = "What is the capital of France?"
WINE = shutil.which("wine")
MINGW_GCC = shutil.which("x86_64-w64-mingw32-gcc")


def archive_path(platform):
    ext = "zip" if platform.startswith("windows") else "tar.gz"
    return REPO / "dist" / f"krafla-{VERSION}-{platform}.{ext}"


def expected_files(platform):
    exe = ".exe" if platform.startswith("windows") else ""
    return sorted([f"ml_run{exe}", f"ml_server{exe}", *(f"ml_{i}{exe}" for i in PLATFORM_ISAS[platform]),
                   "README.md", "LICENSE", "SHA256SUMS"])


def unpack(platform, dest):
    """Unpacks the archive into `dest` (a fresh directory outside the checkout); returns the top folder."""
    src = archive_path(platform)
    if not src.is_file():
        unavailable(f"{src} is missing: run `cargo xtask release {platform}`")
    assert REPO not in dest.resolve().parents, "unpack outside the checkout"
    top = f"krafla-{VERSION}-{platform}"
    if src.name.endswith(".zip"):
        with zipfile.ZipFile(src) as z:
            names = z.namelist()
            assert z.testzip() is None, "corrupt zip member"
            z.extractall(dest)
    else:
        with tarfile.open(src) as t:
            names = t.getnames()
            for m in t.getmembers():
                assert m.isdir() or m.isfile(), f"{m.name}: links or devices do not belong in a release"
                if m.isfile() and m.name.split("/")[-1].startswith("ml_"):
                    assert m.mode & 0o111, f"{m.name} is not executable"
            kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            t.extractall(dest, **kw)
    assert {n.split("/")[0] for n in names} == {top}, f"one top folder {top}/ expected: {names}"
    folder = dest / top
    assert sorted(p.name for p in folder.iterdir()) == expected_files(platform)
    return folder


def check_sums(folder):
    lines = (folder / "SHA256SUMS").read_text().splitlines()
    listed = {}
    for line in lines:
        m = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line)
        assert m, f"bad SHA256SUMS line {line!r}"
        listed[m.group(2)] = m.group(1)
    others = sorted(p.name for p in folder.iterdir() if p.name != "SHA256SUMS")
    assert sorted(listed) == others, "SHA256SUMS must list every other file"
    for name, digest in listed.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, f"{name}: checksum mismatch"


def check_static(folder, platform):
    exes = [folder / n for n in expected_files(platform) if n.startswith("ml_")]
    cargo = os.environ.get("CARGO", "cargo")
    p = subprocess.run([cargo, "run", "--quiet", "--release", "--package", "xtask", "--", "check-static",
                        *map(str, exes)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    for exe in exes:
        assert f"{exe}: " in p.stdout and "stripped" in p.stdout, p.stdout


def native_best(folder, run=lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=120), exe=""):
    """The build the launcher says it runs here."""
    p = run([str(folder / f"ml_run{exe}"), "--version"])
    assert p.returncode == 0, p.stderr
    m = re.search(r"ml_(\w+?)(\.exe)?\s*$", p.stdout.strip())
    assert m and m.group(1) in ISAS, p.stdout
    return m.group(1)


# GGUF -> (ml_run's arguments after the model, a word the greedy answer holds). SmolLM2 in the
# built-in ChatML: under its own template (a default system prompt) the 135M model in Q8_0 (what
# the ARM runs under qemu convert to) answers the capital question in French nonsense, on every build
RUNS = {
    "smollm2": (["--chat", "chatml", "-p", QUESTION, "-n", "24"], "Paris"),
    "gemma3": (["-p", "Paris is the capital of", "-n", "8"], "France"),
}


@pytest.fixture(scope="module")
def ggufs(smollm2_gguf, gemma3_gguf):
    """name -> the real GGUF file (as downloaded: SmolLM2 Q4_1, Gemma 3 Q4_K_M)."""
    return {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}


def run_args(name, gguf, *extra):
    return [gguf, *RUNS[name][0], "-T", "0", "-t", "2", *extra]


def clean_env(**extra):
    """The environment as it is (nothing added to PATH), plus `extra`."""
    env = dict(os.environ)
    env.update(extra)
    return env


class Server(ServerProcess):
    """ml_server from an archive on a free loopback port (--port 0, address read from its log)."""

    def __init__(self, cmd, log_path, env, cwd):
        super().__init__(cmd, log_path, start_timeout=120, stop_timeout=20, env=env, cwd=cwd)

    def chat(self, question):
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 24, "temperature": 0}
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        assert r.status == 200, data
        return json.loads(data)["choices"][0]["message"]["content"]


# ---------------------------------------------------------------- Linux


@pytest.fixture(scope="module")
def linux(tmp_path_factory):
    return unpack("linux-x86_64", tmp_path_factory.mktemp("release-linux"))


def test_linux_layout_and_sums(linux):
    check_sums(linux)
    readme = (linux / "README.md").read_text()
    assert f"Krafla {VERSION} (linux-x86_64)" in readme and "--isa" in readme
    assert "Copyright (c) 2026 The Krafla developers" in (linux / "LICENSE").read_text()


def test_linux_executables_are_static_and_stripped(linux):
    check_static(linux, "linux-x86_64")


@pytest.mark.parametrize("name", RUNS)
def test_linux_gguf_runs_through_ml_run(linux, ggufs, name):
    best = native_best(linux)
    answers = []
    for forced in ([], ["--isa", "sse2"]):
        p = subprocess.run([str(linux / "ml_run"), *forced, *map(str, run_args(name, ggufs[name]))],
                           capture_output=True, text=True, timeout=300, cwd=linux.parent, env=clean_env())
        assert p.returncode == 0, p.stderr
        assert RUNS[name][1] in p.stdout, p.stdout
        assert f"krafla: isa {forced[1] if forced else best}," in p.stderr, p.stderr
        answers.append(p.stdout)
    # Any build gives the same greedy answer (the same logits bits).
    assert answers[0] == answers[1]


def test_linux_ml_server_answers(linux, ggufs, tmp_path):
    cmd = [str(linux / "ml_server"), str(ggufs["smollm2"]), "--port", "0", "-t", "2"]
    srv = Server(cmd, tmp_path / "server.log", clean_env(), linux.parent)
    try:
        assert "Paris" in srv.chat(QUESTION)
    finally:
        srv.stop()


# ---------------------------------------------------------------- ARM (under qemu-user)

# platform -> (qemu-user, the CPU models to check the launcher on, the oldest first)
ARM = {
    "linux-aarch64": ("qemu-aarch64", ["cortex-a53", "cortex-a76", "max"]),
    "linux-armv7hf": ("qemu-arm", ["cortex-a7", "cortex-a15"]),
}


@pytest.fixture(scope="module", params=list(ARM))
def arm(request, tmp_path_factory):
    platform = request.param
    qemu = shutil.which(ARM[platform][0])
    if not qemu:
        unavailable(f"{ARM[platform][0]} is needed (apt-get install -y qemu-user)")
    folder = unpack(platform, tmp_path_factory.mktemp(f"release-{platform}"))
    return platform, qemu, folder


def test_arm_layout_sums_and_static(arm):
    platform, _, folder = arm
    check_sums(folder)
    assert f"Krafla {VERSION} ({platform})" in (folder / "README.md").read_text()
    check_static(folder, platform)


def test_arm_launcher_picks_per_cpu_and_answers(arm, ggufs):
    platform, qemu, folder = arm
    for cpu in ARM[platform][1]:
        best = best_build(PLATFORM_ARCH[platform], cpu)
        p = subprocess.run([qemu, "-cpu", cpu, str(folder / "ml_run"), "--version"], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip().endswith(f"ml_{best}"), f"{platform} on {cpu}: {p.stdout}"
    cpu = ARM[platform][1][0]  # the oldest core: a Raspberry Pi 3 / 2
    best = best_build(PLATFORM_ARCH[platform], cpu)
    env = clean_env(ML_RUN_WRAPPER=f"{qemu} -cpu {cpu}")
    for name, gguf in ggufs.items():
        # --type q8_0: under qemu the fitted Q4_0 search of --type auto takes minutes (qemu-arm
        # emulates NEON floating point in software), far beyond its cost on a real core
        args = run_args(name, gguf, "--type", "q8_0")
        p = subprocess.run([qemu, "-cpu", cpu, str(folder / "ml_run"), *map(str, args)], capture_output=True, text=True,
                           timeout=900, cwd=folder.parent, env=env)
        assert p.returncode == 0, p.stderr
        assert RUNS[name][1] in p.stdout and f"krafla: isa {best}," in p.stderr, (name, p.stdout + p.stderr)


# ---------------------------------------------------------------- Windows (under wine)

PROCESS_PRNG_C = r"""
#include <windows.h>
/* RtlGenRandom */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

/* What Rust's std imports from bcryptprimitives.dll (Windows 10+), which wine 8 lacks. */
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk)) return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
"""


class Wine:
    def __init__(self, prefix):
        self.env = clean_env(WINEPREFIX=str(prefix), WINEDEBUG="-all", WINEDLLOVERRIDES="mscoree,mshtml=")

    def run(self, cmd, timeout=300, **kw):
        return subprocess.run([WINE, *map(str, cmd)], capture_output=True, text=True, timeout=timeout,
                              env=self.env, **kw)


def winpath(p):
    """A Unix path as wine's Z: drive shows it."""
    return "Z:" + str(p).replace("/", "\\")


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    if not (WINE and MINGW_GCC):
        unavailable("wine and MinGW-w64 are needed (apt-get install -y wine64 gcc-mingw-w64-x86-64)")
    folder = unpack("windows-x86_64", tmp_path_factory.mktemp("release-windows"))
    check_sums(folder)  # before the test-only DLL joins the folder
    build = tmp_path_factory.mktemp("prng")
    (build / "prng.c").write_text(PROCESS_PRNG_C)
    dll = build / "bcryptprimitives.dll"
    subprocess.run([MINGW_GCC, "-shared", "-O2", "-o", str(dll), str(build / "prng.c"), "-ladvapi32"], check=True)
    shutil.copy(dll, folder / "bcryptprimitives.dll")
    wine = Wine(tmp_path_factory.mktemp("wineprefix"))
    wine.run(["wineboot", "--init"], timeout=180)
    yield folder, wine
    # End this prefix's wine processes (services, any build left behind).
    wineserver = shutil.which("wineserver") or "/usr/lib/wine/wineserver"
    if os.path.exists(wineserver):
        subprocess.run([wineserver, "-k"], env=wine.env, capture_output=True, timeout=60)


def test_windows_layout_and_static(windows):
    folder, _ = windows
    check_static(folder, "windows-x86_64")
    assert f"Krafla {VERSION} (windows-x86_64)" in (folder / "README.md").read_text()


def test_windows_guard_lets_fitting_builds_run(windows):
    """Each build passes its start-up guard (.CRT$XCU) on this CPU or refuses with exit 3 and one line."""
    folder, wine = windows
    for isa in ISAS:
        p = wine.run([folder / f"ml_{isa}.exe", "--version"], timeout=120)
        if p.returncode == 3:
            assert p.stderr.startswith(f"krafla: this build ({isa}) needs the CPU feature '"), p.stderr
            assert p.stdout == ""
        else:
            assert p.returncode == 0 and "ml_run" in p.stdout, (isa, p.returncode, p.stdout, p.stderr)


# The qemu CPU models the Windows launcher and guards are checked on.
EMULATED = ["core2duo", "Nehalem", "Haswell"]

def test_windows_launcher_and_guard_on_emulated_cpus(windows):
    """wine's loader under qemu-x86_64 -cpu MODEL (WINELOADERNOEXEC keeps it from re-executing
    itself natively), so the Windows code sees the emulated CPUID: the launcher picks the
    build for that CPU and each build's .CRT$XCU guard refuses (exit 3, one line) or runs."""
    folder, wine = windows
    qemu = shutil.which("qemu-x86_64")
    loader = shutil.which("wine64") or "/usr/lib/wine/wine64"
    if not (qemu and os.path.exists(loader)):
        unavailable("qemu-x86_64 (apt-get install qemu-user) and wine's wine64 loader are needed")
    env = dict(wine.env, WINELOADERNOEXEC="1")

    def emulated(cpu, exe, *args):
        p = subprocess.run([qemu, "-cpu", cpu, loader, str(exe), *args], capture_output=True, text=True,
                           timeout=300, env=env)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("qemu-x86_64:")]
        return p, lines

    for cpu in EMULATED:
        p, err = emulated(cpu, folder / "ml_run.exe", "--version")
        assert p.returncode == 0, (cpu, p.stdout, err)
        assert p.stdout.strip().endswith(f"\\ml_{best_build('x86_64', cpu)}.exe"), (cpu, p.stdout)
        for isa in ISAS:
            missing = missing_feature("x86_64", isa, cpu)
            p, err = emulated(cpu, folder / f"ml_{isa}.exe", "--version")
            if missing is None:
                assert p.returncode == 0 and "ml_run" in p.stdout, (cpu, isa, p.returncode, err)
            else:
                assert p.returncode == 3, (cpu, isa, p.returncode, p.stdout, err)
                assert err == [f"krafla: this build ({isa}) needs the CPU feature '{missing}', which this CPU "
                               f"lacks; run ml_run to pick a build that fits"], (cpu, isa, err)
                assert p.stdout == "", "main must not have run"


def test_windows_ggufs_run_through_ml_run(windows, ggufs):
    folder, wine = windows
    p = wine.run([folder / "ml_run.exe", "--list-isas"])
    assert p.returncode == 0, p.stderr
    selected = [ln.split()[0] for ln in p.stdout.splitlines() if re.match(r"ml_\w+\s+yes\s+yes\s+\*", ln)]
    assert len(selected) == 1 and selected[0].removeprefix("ml_") in ISAS, p.stdout
    best = selected[0].removeprefix("ml_")
    for name, gguf in ggufs.items():
        p = wine.run([folder / "ml_run.exe", *run_args(name, winpath(gguf))], cwd=folder.parent)
        assert p.returncode == 0, p.stderr
        assert RUNS[name][1] in p.stdout, (name, p.stdout)
        assert f"krafla: isa {best}," in p.stderr, p.stderr
    # Errors come back through the launcher's exit code.
    p = wine.run([folder / "ml_run.exe", winpath(folder / "missing.mlb"), "-p", "hi"], cwd=folder.parent)
    assert p.returncode == 2, (p.returncode, p.stderr)
    p = wine.run([folder / "ml_run.exe", "--isa", "avx9"], cwd=folder.parent)
    assert p.returncode == 2 and "unknown ISA 'avx9'" in p.stderr, p.stderr


def test_windows_ml_server_answers(windows, ggufs, tmp_path):
    folder, wine = windows
    cmd = [WINE, str(folder / "ml_server.exe"), winpath(ggufs["smollm2"]), "--port", "0", "-t", "2"]
    srv = Server(cmd, tmp_path / "server.log", wine.env, folder.parent)
    try:
        assert "Paris" in srv.chat(QUESTION)
    finally:
        srv.stop()
