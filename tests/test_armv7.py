"""The 32-bit ARM build (armv7hf: armv7-a, NEON, VFPv4) under qemu-arm.

The executable is the one armv7hf variant, `neon`, as `cargo xtask dist
linux-armv7hf` builds it (dist/linux-armv7hf/ml_neon; `cargo xtask test`
makes it before pytest). The krafla library's unit tests are built here with
the same flags (static glibc, `+neon,+vfp4,+d32`) and target dir
(target/neon), so the dependencies are shared. Then, under qemu-arm:

* the kernel unit tests (every kernel bit for bit against `portable`, the
  asm exp against the x86 operation sequence, the block sums against a
  scalar sum) pass on a Cortex-A7 and a Cortex-A15;
* the start-up guard: on a Cortex-A8 or A9 (NEON, but VFPv3) the build exits
  3 before main naming 'vfp4', on a Cortex-R5F (VFPv3-D16, no NEON) naming
  'neon'; on the A7, A15 and `max` it runs. (CPUs without VFP at all, e.g.
  arm1176 or cortex-r5, cannot start any armhf executable: glibc's own
  start-up code uses VFP before the guard runs.)
* end to end, the logits are byte-identical to the native x86-64 build's
  (target/release/ml_variant): the tiny llama2 fixture as q4_0, q8_0 and f16,
  and SmolLM2-135M as q4_0 (rows long enough for the four-block steps and
  the eight-lane sums). NEON's flushing of subnormals to zero (documented in
  shared/src/kernels/armv7_neon.rs) does not show in these logits.

Needs the Rust target (`rustup target add armv7-unknown-linux-gnueabihf`),
the cross linker (`apt-get install gcc-arm-linux-gnueabihf`) and qemu-user
(`apt-get install qemu-user`). Without them the tests skip, except in CI
(env CI set), where they fail.
"""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import FIXTURES, REPO, run_tool

TARGET = "armv7-unknown-linux-gnueabihf"
LINKER = "arm-linux-gnueabihf-gcc"
QEMU = shutil.which("qemu-arm")
NATIVE = REPO / "target" / "release" / "ml_variant"
TARGET_DIR = REPO / "target" / "neon"
DIST_EXE = REPO / "dist" / "linux-armv7hf" / "ml_neon"
RUSTFLAGS = "-C target-feature=+crt-static,+neon,+vfp4,+d32"

# CPUs with NEON and VFPv4: the build runs there.
RUNS_ON = ["cortex-a7", "cortex-a15"]
# qemu CPU model -> None (runs) or the feature the guard must name.
EXPECT = {
    "cortex-a7": None,
    "cortex-a15": None,
    "max": None,
    "cortex-a8": "vfp4",   # NEON, VFPv3
    "cortex-a9": "vfp4",   # NEON, VFPv3
    "cortex-r5f": "neon",  # VFPv3-D16, no NEON
}


def _unavailable(reason):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


def _target_installed():
    p = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True)
    return p.returncode == 0 and (pathlib.Path(p.stdout.strip()) / "lib" / "rustlib" / TARGET / "lib").is_dir()


@pytest.fixture(scope="module")
def toolchain():
    missing = []
    if not _target_installed():
        missing.append(f"the Rust target (rustup target add {TARGET})")
    if not shutil.which(LINKER):
        missing.append(f"{LINKER} (apt-get install gcc-arm-linux-gnueabihf)")
    if not QEMU:
        missing.append("qemu-arm (apt-get install qemu-user)")
    if missing:
        _unavailable("missing " + ", ".join(missing))


@pytest.fixture(scope="module")
def build(toolchain):
    """(the krafla unit-test executable, dist/linux-armv7hf/ml_neon)."""
    if not DIST_EXE.is_file():
        _unavailable(f"no {DIST_EXE}: run `cargo xtask dist linux-armv7hf`")
    env = dict(os.environ)
    env.pop("CARGO_ENCODED_RUSTFLAGS", None)
    env.update({
        "CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_LINKER": LINKER,
        "RUSTFLAGS": RUSTFLAGS,
        "KRAFLA_EXPECT_ISA": "neon",
    })
    cmd = ["cargo", "test", "--no-run", "--release", "--target", TARGET, "--target-dir", str(TARGET_DIR),
           "-p", "krafla", "--lib", "--message-format=json"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr[-4000:]}")
    tests = [m["executable"] for m in map(json.loads, filter(None, p.stdout.splitlines()))
             if m.get("reason") == "compiler-artifact" and m.get("executable")
             and m["target"]["name"] == "krafla" and m["profile"]["test"]]
    assert len(tests) == 1, f"unit-test executables {tests}"
    return pathlib.Path(tests[0]), DIST_EXE


def under_qemu(cpu, exe, *args, timeout=600):
    return subprocess.run([QEMU, "-cpu", cpu, str(exe), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def krafla_lines(stderr):
    """stderr without qemu's own warnings."""
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith("qemu-arm:")]


@pytest.mark.parametrize("cpu", RUNS_ON)
def test_kernel_unit_tests_under_qemu(build, cpu):
    tests, _ = build
    p = under_qemu(cpu, tests, "kernels", "--nocapture")
    assert p.returncode == 0, f"{cpu}: exit {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-6000:]}"
    assert "test kernels::tests::compiled_isa_is_the_expected_one ... ok" in p.stdout
    for t in ["tests::quantized_dots_match_exact_reference_and_portable",
              "tests::quantized_dots_on_extreme_values_match_portable_and_exact",
              "tests::quantized_integer_part_is_exact",
              "tests::dot_f32_matches_f64_and_portable_on_odd_lengths", "tests::f32_ops_match_f64_and_portable",
              "tests::f16_conversion_is_exact_for_every_value",
              "tests::matmul_is_identical_for_any_batch_and_thread_count",
              "armv7_neon::tests::armv7_exp_is_within_1e6_relative",
              "armv7_neon::tests::armv7_exp_matches_the_x86_operation_sequence",
              "armv7_neon::tests::armv7_block_sums_match_scalar"]:
        assert f"test kernels::{t} ... ok" in p.stdout, f"{cpu}: {t} did not run and pass"


@pytest.mark.parametrize("cpu", list(EXPECT))
def test_guard_on_emulated_cpu(build, cpu):
    _, exe = build
    p = under_qemu(cpu, exe, "--version", timeout=120)
    missing = EXPECT[cpu]
    if missing is None:
        assert p.returncode == 0, f"ml_neon on {cpu}: exit {p.returncode}\n{p.stderr}"
        assert "ml_run" in p.stdout  # clap's --version: main was reached
    else:
        want = (f"krafla: this build (neon) needs the CPU feature '{missing}', which this CPU lacks; "
                f"run ml_run to pick a build that fits")
        assert p.returncode == 3, f"neon on {cpu}: exit {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}"
        assert krafla_lines(p.stderr) == [want]
        assert p.stdout == ""


@pytest.fixture(scope="module")
def native():
    if not NATIVE.is_file():
        _unavailable(f"no native build {NATIVE}: run `cargo build --release`")
    return NATIVE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("armv7-tiny")
    models = {}
    for qtype in ["q4_0", "q8_0", "f16"]:
        models[qtype] = out / f"llama2-{qtype}.mlb"
        run_tool("convert.py", FIXTURES / "hf-tiny" / "llama2", "-o", models[qtype], "--type", qtype)
    return models


def _logits(cmd, mlb, out, ids, n):
    p = subprocess.run([*map(str, cmd), str(mlb), "--prompt-ids", ids, "--logits-out", str(out), "-n", str(n),
                        "-t", "2", "--print-ids"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stderr}"
    data = out.read_bytes()
    assert len(data) > 0 and len(data) % 4 == 0
    return data, p.stdout


@pytest.mark.parametrize("cpu", RUNS_ON)
def test_tiny_logits_are_byte_identical_to_native_x86(build, native, tiny, cpu, tmp_path):
    _, exe = build
    for qtype, mlb in tiny.items():
        want, want_ids = _logits([native], mlb, tmp_path / f"native-{qtype}.f32", "1,2,3", 0)
        got, got_ids = _logits([QEMU, "-cpu", cpu, exe], mlb, tmp_path / f"{cpu}-{qtype}.f32", "1,2,3", 0)
        assert got == want, f"{cpu} {qtype}: logits differ from the native x86-64 build's"
        assert got_ids == want_ids


def test_smollm2_logits_are_byte_identical_to_native_x86(build, native, smol, tmp_path):
    """SmolLM2-135M (576 / 1536-wide rows), prompt and four generated tokens."""
    _, exe = build
    mlb = smol("q4_0")
    want, want_ids = _logits([native], mlb, tmp_path / "native.f32", "1,2,3,4,5", 4)
    got, got_ids = _logits([QEMU, "-cpu", "cortex-a15", exe], mlb, tmp_path / "armv7.f32", "1,2,3,4,5", 4)
    assert got == want, "SmolLM2 logits differ from the native x86-64 build's"
    assert got_ids == want_ids, f"generated ids {got_ids} vs native {want_ids}"
