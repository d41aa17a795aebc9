"""The AArch64 builds (neon, neon_dotprod, i8mm, sve) under qemu-user.

The executables are the release builds `cargo xtask dist linux-aarch64`
puts in dist/linux-aarch64 (`cargo xtask test` makes them before pytest).
The krafla library's unit tests are built here for each variant as dist
builds it (`cargo xtask unit-tests`: the same flags and target dir, so the
dependencies are shared). Then, under qemu-aarch64 with CPU models that have (or lack) the
features:

* the kernel unit tests (every kernel bit for bit against `portable`) pass
  for each variant, the SVE build at 128, 256, 512 and 2048-bit vectors;
* the start-up guard: a build whose features the CPU lacks exits 3 before
  main with one line naming the missing feature; a build that fits runs;
* end to end, every variant's logits are byte-identical to the native x86-64
  build's (target/release/ml_variant): the tiny llama2 fixture as q4_0, q8_0
  and f16, SmolLM2-135M as q4_0 (rows long enough for the kernels'
  eight-block steps), Gemma 3 270M's Q4_K_M GGUF as it is (the K-quant
  dots), and (neon, sve) every fixture family as q8_0;
* the launcher ml_run, itself emulated, picks the best build for each CPU
  model, and answers a SmolLM2 chat on a Cortex-A76 (Raspberry Pi 5) with
  the same greedy text as the x86-64 build. An emulated program cannot exec
  a foreign executable without binfmt_misc, so the launcher starts the
  build through ML_RUN_WRAPPER="qemu-aarch64 -cpu ...".

Needs the Rust target (`rustup target add aarch64-unknown-linux-gnu`), the
cross linker (`apt-get install gcc-aarch64-linux-gnu`) and qemu-user
(`apt-get install qemu-user`). Without them the tests skip, except in CI
(env CI set), where they fail.
"""
import os
import shutil
import subprocess

import pytest

from conftest import (
    QEMU_CPU_FEATURES,
    REPO,
    assert_guard,
    best_build,
    build_unit_tests,
    cross_toolchain,
    isas,
    logits_bytes,
    missing_feature,
    oldest_cpu,
    unavailable,
    under_qemu,
)

TARGET = "aarch64-unknown-linux-gnu"
LINKER = "aarch64-linux-gnu-gcc"
QEMU = shutil.which("qemu-aarch64")
DIST = REPO / "dist" / "linux-aarch64"

# The builds (the variant table's, fastest first) and the qemu CPU models they are checked on.
ARCH = "aarch64"
VARIANTS = isas(ARCH)
CPUS = list(QEMU_CPU_FEATURES[ARCH])
# Where each build runs: the oldest CPU model that has its features; SVE at 256 bits.
RUNS_ON = {name: "max,sve256=on" if name == "sve" else oldest_cpu(ARCH, name) for name in VARIANTS}


@pytest.fixture(scope="module")
def toolchain():
    cross_toolchain(TARGET, LINKER, "gcc-aarch64-linux-gnu", "qemu-aarch64")


@pytest.fixture(scope="module")
def builds(toolchain):
    """variant -> (the krafla unit-test executable, dist/linux-aarch64/ml_<variant>)."""
    out = {}
    for name in VARIANTS:
        exe = DIST / f"ml_{name}"
        if not exe.is_file():
            unavailable(f"no {exe}: run `cargo xtask dist linux-aarch64`")
        out[name] = (build_unit_tests("linux-aarch64", name), exe)
    return out


# Each build on the oldest CPU model that runs it; SVE at four vector lengths instead.
KERNEL_CASES = [(name, oldest_cpu(ARCH, name), None) for name in VARIANTS if name != "sve"]
KERNEL_CASES += [("sve", "max,sve128=on", 128), ("sve", "max,sve256=on", 256), ("sve", "max,sve512=on", 512),
                 ("sve", "max,sve-default-vector-length=256", 2048)]


@pytest.mark.parametrize("name,cpu,sve_bits", KERNEL_CASES)
def test_kernel_unit_tests_under_qemu(builds, name, cpu, sve_bits):
    tests, _ = builds[name]
    p = under_qemu(QEMU, cpu, tests, "kernels", "--nocapture")
    assert p.returncode == 0, f"{name} on {cpu}: exit {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-6000:]}"
    assert "test kernels::tests::compiled_isa_is_the_expected_one ... ok" in p.stdout
    for t in ["quantized_dots_match_exact_reference_and_portable",
              "quantized_dots_on_extreme_values_match_portable_and_exact",
              "dot_f32_matches_f64_and_portable_on_odd_lengths", "f32_ops_match_f64_and_portable",
              "f16_conversion_is_exact_for_every_value", "matmul_is_identical_for_any_batch_and_thread_count"]:
        assert f"test kernels::tests::{t} ... ok" in p.stdout, f"{name}: {t} did not run and pass"
    for t in ["kquant_dots_match_portable_and_exact_on_random_blocks",
              "kquant_dots_on_extreme_values_match_portable_and_exact", "kquant_integer_part_is_exact",
              "kquant_dots_agree_with_the_dequantised_rows"]:
        assert f"test kernels::tests_kquant::{t} ... ok" in p.stdout, f"{name}: {t} did not run and pass"
    for t in ["mxfp4_dots_match_exact_reference_and_portable", "mxfp4_dots_on_extreme_values_match_portable_and_exact",
              "mxfp4_four_token_dots_equal_single_token_dots"]:
        assert f"test kernels::tests_mxfp4::{t} ... ok" in p.stdout, f"{name}: {t} did not run and pass"
    assert "test kernels::aarch64::neon::imp::tests::neon_exp_matches_the_x86_operation_sequence ... ok" in p.stdout
    if sve_bits:
        assert f"SVE vector length: {sve_bits} bits" in p.stderr
        assert "test kernels::aarch64::sve::imp::tests::sve_block_sums_match_scalar ... ok" in p.stdout


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("name", VARIANTS)
def test_guard_on_emulated_cpu(builds, cpu, name):
    _, exe = builds[name]
    assert_guard(under_qemu(QEMU, cpu, exe, "--version", timeout=120), name, missing_feature(ARCH, name, cpu))


@pytest.mark.parametrize("name", VARIANTS)
def test_tiny_logits_are_byte_identical_to_native_x86(builds, tiny_logits_match_native, name):
    _, exe = builds[name]
    tiny_logits_match_native([QEMU, "-cpu", RUNS_ON[name], exe], name)


# the baseline and the fastest build
@pytest.mark.parametrize("name", [VARIANTS[-1], VARIANTS[0]])
def test_every_family_is_byte_identical_to_native_x86(builds, families_match_native, name):
    """Every fixture family in Q8_0 (Gemma 2's soft-caps, Qwen3.5's Gated DeltaNet, ...), so the
    forward pass's scalar math (exp, tanh, log1p, RoPE's sin and cos) is checked as well as the kernels."""
    _, exe = builds[name]
    families_match_native([QEMU, "-cpu", RUNS_ON[name], exe], name)


def test_smollm2_logits_are_byte_identical_to_native_x86(builds, native, smol, tmp_path):
    """SmolLM2-135M (576 / 1536-wide rows: the eight-block steps of every
    kernel), prompt and four generated tokens, all four variants."""
    mlb = smol("q4_0")
    want, want_ids = logits_bytes([native], mlb, tmp_path / "native.f32", "1,2,3,4,5", 4)
    for name, (_, exe) in builds.items():
        got, got_ids = logits_bytes([QEMU, "-cpu", RUNS_ON[name], exe], mlb, tmp_path / f"{name}.f32", "1,2,3,4,5", 4)
        assert got == want, f"{name}: SmolLM2 logits differ from the native x86-64 build's"
        assert got_ids == want_ids, f"{name}: generated ids {got_ids} vs native {want_ids}"


def test_gemma3_q4_k_m_gguf_is_byte_identical_to_native_x86(builds, native, gemma3_gguf, tmp_path):
    """Gemma 3 270M Q4_K_M run as it is (its Q4_K and Q6_K tensors through each build's K-quant
    dots; 640-wide rows: odd numbers of super-blocks), prompt and one generated token."""
    opts = ["--ctx", "64"]
    want, want_ids = logits_bytes([native, *opts], gemma3_gguf, tmp_path / "native.f32", "2,818,5279", 1)
    for name, (_, exe) in builds.items():
        got, got_ids = logits_bytes([QEMU, "-cpu", RUNS_ON[name], exe, *opts], gemma3_gguf, tmp_path / f"{name}.f32",
                                    "2,818,5279", 1)
        assert got == want, f"{name}: Gemma 3 Q4_K_M logits differ from the native x86-64 build's"
        assert got_ids == want_ids, f"{name}: generated ids {got_ids} vs native {want_ids}"


@pytest.mark.parametrize("cpu", CPUS)
def test_launcher_picks_the_best_build_for_the_cpu(toolchain, cpu):
    launcher = DIST / "ml_run"
    if not launcher.is_file():
        unavailable(f"no {launcher}: run `cargo xtask dist linux-aarch64`")
    p = under_qemu(QEMU, cpu, launcher, "--version", timeout=120)
    assert p.returncode == 0, f"ml_run on {cpu}: exit {p.returncode}\n{p.stderr}"
    assert f"runs {DIST / ('ml_' + best_build(ARCH, cpu))}\n" in p.stdout, p.stdout
    p = under_qemu(QEMU, cpu, launcher, "--list-isas", timeout=120)
    selected = [ln.split()[0] for ln in p.stdout.splitlines() if ln.startswith("ml_") and " * " in f" {ln} "]
    assert selected == [f"ml_{best_build(ARCH, cpu)}"], p.stdout


def test_smollm2_chat_through_ml_run_on_cortex_a76(builds, native, smol):
    """The Raspberry Pi 5 case: ml_run (emulated Cortex-A76) picks
    neon_dotprod (the table's best build for it), which answers with the x86-64 build's greedy text."""
    mlb, mlt = smol("q4_0"), smol("mlt")
    args = [str(mlb), "-z", str(mlt), "--chat", "chatml", "-n", "24", "-p", "What is the capital of France?"]
    want = subprocess.run([str(native), *args], capture_output=True, text=True, timeout=600)
    assert want.returncode == 0, want.stderr
    env = dict(os.environ, ML_RUN_WRAPPER=f"{QEMU} -cpu cortex-a76")
    got = subprocess.run([QEMU, "-cpu", "cortex-a76", str(DIST / "ml_run"), *args],
                         capture_output=True, text=True, timeout=900, env=env)
    assert got.returncode == 0, got.stderr
    assert f"krafla: isa {best_build(ARCH, 'cortex-a76')}," in got.stderr, got.stderr
    assert "Paris" in want.stdout
    assert got.stdout == want.stdout
