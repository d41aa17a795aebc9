"""The per-ISA x86-64 executables (dist/linux-x86_64/ml_<isa>, built by
`cargo xtask dist linux-x86_64`, which `cargo xtask test` runs first) on
emulated older CPUs with qemu-user:

* the start-up guard: a build whose features the CPU lacks exits 3 before main
  with one line naming the missing feature; a build that fits runs;
* the sse2 and sse41 builds end to end on qemu64 / Nehalem give the native
  build's logits (all builds share the integer math) within 1e-4;
* the launcher ml_run picks the fastest build the (emulated) CPU can run,
  natively too; `--isa`, `--list-isas`, `--version`, the ml_server name and
  the `ml_variant` fallback of a plain `cargo build`.

Needs qemu-user (`apt-get install qemu-user`). Without qemu-x86_64 or the dist
builds the tests skip, except in CI (env CI set), where they fail.
"""
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from conftest import (
    QEMU_CPU_FEATURES,
    REPO,
    assert_guard,
    best_build,
    isas,
    krafla_lines,
    missing_feature,
    oldest_cpu,
    unavailable,
    under_qemu,
)

DIST = REPO / "dist" / "linux-x86_64"
ARCH = "x86_64"
VARIANTS = isas(ARCH)  # the variant table's, fastest first
CPUS = list(QEMU_CPU_FEATURES[ARCH])
QEMU = shutil.which("qemu-x86_64")


@pytest.fixture(scope="module")
def qemu():
    if not (QEMU and pathlib.Path(QEMU).is_file()):
        unavailable("qemu-x86_64 is not installed (apt-get install qemu-user)")
    return QEMU


@pytest.fixture(scope="module")
def dist():
    missing = [n for n in VARIANTS + ["run"] if not (DIST / f"ml_{n}").is_file()]
    if missing:
        unavailable(f"no {', '.join('ml_' + n for n in missing)} in {DIST}: run `cargo xtask dist linux-x86_64`")
    return DIST


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("isa", VARIANTS)
def test_guard_on_emulated_cpu(qemu, dist, cpu, isa):
    want = missing_feature(ARCH, isa, cpu)
    assert_guard(under_qemu(qemu, cpu, dist / f"ml_{isa}", "--version", timeout=120), isa, want)


def test_guard_passes_natively(dist):
    """Each build this CPU supports runs; the others fail cleanly with exit 3."""
    for isa in VARIANTS:
        p = subprocess.run([str(dist / f"ml_{isa}"), "--version"], capture_output=True, text=True, timeout=60)
        assert p.returncode in (0, 3), f"ml_{isa}: exit {p.returncode}\n{p.stderr}"
        if p.returncode == 3:
            assert p.stderr.startswith(f"krafla: this build ({isa}) needs the CPU feature '")


def test_builds_are_static(dist):
    for name in VARIANTS + ["run"]:
        out = subprocess.run(["file", "-L", str(dist / f"ml_{name}")], capture_output=True, text=True).stdout
        if not out:
            pytest.skip("`file` is not installed")
        assert "dynamically linked" not in out or "static-pie" in out, f"ml_{name}: {out}"


IDS = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35"


def logits(cmd, mlb, out):
    p = subprocess.run([*cmd, str(mlb), "--prompt-ids", IDS, "--logits-out", str(out), "-n", "4", "-t", "2"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stderr}"
    return np.fromfile(out, dtype="<f4"), p.stderr


def native_best(dist):
    for isa in VARIANTS:  # fastest first
        if subprocess.run([str(dist / f"ml_{isa}"), "--version"], capture_output=True).returncode == 0:
            return isa
    raise AssertionError("no build runs natively")


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_emulated_old_builds_match_native_logits(qemu, dist, tiny_llama2, qtype, tmp_path):
    best = native_best(dist)
    want, err = logits([str(dist / f"ml_{best}")], tiny_llama2[qtype], tmp_path / "native.f32")
    assert f"isa {best}," in err
    # the builds every CPU that runs these tests has (Nehalem's features), each on its oldest CPU model
    old = [(isa, oldest_cpu(ARCH, isa)) for isa in VARIANTS if missing_feature(ARCH, isa, "Nehalem") is None]
    for isa, cpu in old:
        got, err = logits([qemu, "-cpu", cpu, str(dist / f"ml_{isa}")], tiny_llama2[qtype], tmp_path / f"{isa}.f32")
        assert f"isa {isa}," in err
        assert got.shape == want.shape
        diff = float(np.abs(got - want).max())
        assert diff <= 1e-4, f"{qtype}: ml_{isa} on {cpu} vs native ml_{best}: max |logit diff| {diff:.2e}"
    # and every native build agrees with the best one
    for isa in VARIANTS:
        if subprocess.run([str(dist / f"ml_{isa}"), "--version"], capture_output=True).returncode != 0:
            continue
        got, _ = logits([str(dist / f"ml_{isa}")], tiny_llama2[qtype], tmp_path / f"n-{isa}.f32")
        diff = float(np.abs(got - want).max())
        assert diff <= 1e-4, f"{qtype}: native ml_{isa} vs ml_{best}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("cpu", CPUS)
def test_launcher_picks_the_fastest_fitting_build(qemu, dist, tiny_llama2, cpu):
    want = best_build(ARCH, cpu)
    # qemu-user emulates ml_run's CPUID; the build it execs runs natively and
    # reports its ISA on the start-up line.
    p = under_qemu(qemu, cpu, dist / "ml_run", tiny_llama2["q8_0"], "--prompt-ids", "1,2", "-n", "0")
    assert p.returncode == 0, p.stderr
    assert f"krafla: isa {want}," in p.stderr, p.stderr
    # --list-isas marks the same build, and names what the others lack.
    p = under_qemu(qemu, cpu, dist / "ml_run", "--list-isas")
    assert p.returncode == 0, p.stderr
    rows = {ln.split()[0]: ln for ln in p.stdout.splitlines() if ln.startswith("ml_")}
    assert sorted(rows) == sorted(f"ml_{i}" for i in VARIANTS), p.stdout
    for isa in VARIANTS:
        row = rows[f"ml_{isa}"].split()
        assert row[1] == "yes", row  # present
        lacks = missing_feature(ARCH, isa, cpu)
        assert row[2] == ("no" if lacks else "yes"), (cpu, row)
        if lacks:
            assert f"no ({lacks})" in rows[f"ml_{isa}"], (cpu, row)
        assert (row[3] == "*") == (isa == want), (cpu, row)


def cpu_flags():
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_launcher_natively_picks_the_best_build(dist, tiny_llama2):
    best = native_best(dist)
    if "avx512_vnni" in cpu_flags() and "avx512bw" in cpu_flags():
        assert best == "avx512vnni"
    p = subprocess.run([str(dist / "ml_run"), "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ml_run ") and p.stdout.strip().endswith(f"/ml_{best}"), p.stdout
    p = subprocess.run([str(dist / "ml_run"), tiny_llama2["q8_0"], "--prompt-ids", "1,2", "-n", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and f"krafla: isa {best}," in p.stderr, p.stderr


def test_launcher_forced_isa(qemu, dist, tiny_llama2, tmp_path):
    def run(*a):
        return subprocess.run([str(dist / "ml_run"), *map(str, a)], capture_output=True, text=True, timeout=120)

    for isa in VARIANTS:
        # every CPU that runs these tests has at least Nehalem's features
        if missing_feature(ARCH, isa, "Nehalem") is None:
            p = run("--isa", isa, tiny_llama2["q8_0"], "--prompt-ids", "1,2", "-n", "0")
            assert p.returncode == 0 and f"krafla: isa {isa}," in p.stderr, p.stderr
    p = run(tiny_llama2["q8_0"], "--isa=sse2", "--prompt-ids", "1,2", "-n", "0")  # anywhere on the line, = form
    assert p.returncode == 0 and "krafla: isa sse2," in p.stderr, p.stderr
    p = run("--isa", "avx9", tiny_llama2["q8_0"])
    assert p.returncode == 2 and "unknown ISA 'avx9'" in p.stderr and ", ".join(VARIANTS) in p.stderr
    p = run("--isa")
    assert p.returncode == 2 and "--isa needs" in p.stderr
    # The CPU lacks it (emulated Nehalem has no AVX2): a clear error, not the guard's exit 3.
    p = under_qemu(qemu, "Nehalem", dist / "ml_run", "--isa", "avx2", tiny_llama2["q8_0"])
    assert p.returncode == 2, p.stderr
    assert krafla_lines(p.stderr) == ["ml_run: --isa avx2: this CPU lacks the feature 'avx2', which ml_avx2 needs"]
    # The file is missing.
    shutil.copy(dist / "ml_run", tmp_path / "ml_run")
    shutil.copy(dist / "ml_sse2", tmp_path / "ml_sse2")
    p = subprocess.run([str(tmp_path / "ml_run"), "--isa", "sse41", tiny_llama2["q8_0"]], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "ml_sse41 is not in this directory" in p.stderr, p.stderr
    # ... and without --isa the one present build that fits is used.
    p = subprocess.run([str(tmp_path / "ml_run"), tiny_llama2["q8_0"], "--prompt-ids", "1,2", "-n", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "krafla: isa sse2," in p.stderr, p.stderr


def test_launcher_without_builds_and_fallback(dist, tiny_llama2, tmp_path):
    shutil.copy(dist / "ml_run", tmp_path / "ml_run")
    p = subprocess.run([str(tmp_path / "ml_run"), tiny_llama2["q8_0"]], capture_output=True, text=True)
    assert p.returncode == 2 and "no Krafla build" in p.stderr, p.stderr
    # A plain `cargo build` leaves ml_variant beside ml_run: the fallback.
    shutil.copy(dist / "ml_sse41", tmp_path / "ml_variant")
    p = subprocess.run([str(tmp_path / "ml_run"), tiny_llama2["q8_0"], "--prompt-ids", "1,2", "-n", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "krafla: isa sse41," in p.stderr, p.stderr
    host = REPO / "target" / "release"
    if (host / "ml_run").is_file() and (host / "ml_variant").is_file():
        p = subprocess.run([str(host / "ml_run"), "--version"], capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.strip().endswith("/ml_variant"), p.stdout + p.stderr


def test_ml_server_name_prepends_server(dist, tmp_path):
    """Installed as ml_server (busybox style) the launcher runs the build with --server first."""
    for name in ["ml_run", "ml_sse2"]:
        shutil.copy(dist / name, tmp_path / name)
    os.symlink("ml_run", tmp_path / "ml_server")
    p = subprocess.run([str(tmp_path / "ml_server"), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    direct = subprocess.run([str(dist / "ml_sse2"), "--server", "--help"], capture_output=True, text=True)
    assert direct.stdout and direct.stdout in p.stdout, (p.stdout, direct.stdout)
    p = subprocess.run([str(tmp_path / "ml_server"), "--version"], capture_output=True, text=True)
    assert p.stdout.startswith("ml_server "), p.stdout
