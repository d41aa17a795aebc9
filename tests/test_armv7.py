"""The 32-bit ARM build (armv7hf: armv7-a, NEON, VFPv4) under qemu-arm.

The executable is the one armv7hf variant, `neon`, as `cargo xtask dist
linux-armv7hf` builds it (dist/linux-armv7hf/ml_neon; `cargo xtask test`
makes it before pytest). The krafla library's unit tests are built here as
dist builds it (`cargo xtask unit-tests`: static glibc, `+neon,+vfp4,+d32`,
the same target dir, so the dependencies are shared). Then, under qemu-arm:

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
  SmolLM2-135M as q4_0 (rows long enough for the four-block steps and
  the eight-lane sums), and Gemma 3 270M's Q4_K_M GGUF as it is (the
  K-quant dots). NEON's flushing of subnormals to zero (documented in
  shared/src/kernels/armv7_neon.rs) does not show in these logits.

Needs the Rust target (`rustup target add armv7-unknown-linux-gnueabihf`),
the cross linker (`apt-get install gcc-arm-linux-gnueabihf`) and qemu-user
(`apt-get install qemu-user`). Without them the tests skip, except in CI
(env CI set), where they fail.
"""
import shutil

import pytest

from conftest import REPO, assert_guard, build_unit_tests, cross_toolchain, logits_bytes, unavailable, under_qemu

TARGET = "armv7-unknown-linux-gnueabihf"
LINKER = "arm-linux-gnueabihf-gcc"
QEMU = shutil.which("qemu-arm")
DIST_EXE = REPO / "dist" / "linux-armv7hf" / "ml_neon"

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


@pytest.fixture(scope="module")
def build():
    """(the krafla unit-test executable, dist/linux-armv7hf/ml_neon)."""
    cross_toolchain(TARGET, LINKER, "gcc-arm-linux-gnueabihf", "qemu-arm")
    if not DIST_EXE.is_file():
        unavailable(f"no {DIST_EXE}: run `cargo xtask dist linux-armv7hf`")
    return build_unit_tests("linux-armv7hf", "neon"), DIST_EXE


@pytest.mark.parametrize("cpu", RUNS_ON)
def test_kernel_unit_tests_under_qemu(build, cpu):
    tests, _ = build
    p = under_qemu(QEMU, cpu, tests, "kernels", "--nocapture")
    assert p.returncode == 0, f"{cpu}: exit {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-6000:]}"
    assert "test kernels::tests::compiled_isa_is_the_expected_one ... ok" in p.stdout
    for t in ["tests::quantized_dots_match_exact_reference_and_portable",
              "tests::quantized_dots_on_extreme_values_match_portable_and_exact",
              "tests::quantized_integer_part_is_exact",
              "tests::dot_f32_matches_f64_and_portable_on_odd_lengths", "tests::f32_ops_match_f64_and_portable",
              "tests::f16_conversion_is_exact_for_every_value",
              "tests::matmul_is_identical_for_any_batch_and_thread_count",
              "arm::neon::float::tests::armv7_exp_is_within_1e6_relative",
              "arm::neon::float::tests::armv7_exp_matches_the_x86_operation_sequence",
              "arm::neon::int8::tests::armv7_block_sums_match_scalar",
              "arm::neon::int8::tests::armv7_scale_check_boundary_matches_portable",
              "arm::neon::kquant::tests::armv7_kquant_sums_match_scalar",
              "tests_kquant::kquant_dots_match_portable_and_exact_on_random_blocks",
              "tests_kquant::kquant_dots_on_extreme_values_match_portable_and_exact",
              "tests_kquant::kquant_integer_part_is_exact",
              "tests_kquant::kquant_dots_agree_with_the_dequantised_rows",
              "tests_mxfp4::mxfp4_dots_match_exact_reference_and_portable",
              "tests_mxfp4::mxfp4_dots_on_extreme_values_match_portable_and_exact"]:
        assert f"test kernels::{t} ... ok" in p.stdout, f"{cpu}: {t} did not run and pass"


@pytest.mark.parametrize("cpu", list(EXPECT))
def test_guard_on_emulated_cpu(build, cpu):
    _, exe = build
    assert_guard(under_qemu(QEMU, cpu, exe, "--version", timeout=120), "neon", EXPECT[cpu])


@pytest.mark.parametrize("cpu", RUNS_ON)
def test_tiny_logits_are_byte_identical_to_native_x86(build, tiny_logits_match_native, cpu):
    _, exe = build
    tiny_logits_match_native([QEMU, "-cpu", cpu, exe], cpu)


def test_every_family_is_byte_identical_to_native_x86(build, families_match_native):
    """Every fixture family in Q8_0: the forward pass's scalar math (VFP) as well as the NEON kernels."""
    _, exe = build
    families_match_native([QEMU, "-cpu", RUNS_ON[0], exe], "armv7")


def test_smollm2_logits_are_byte_identical_to_native_x86(build, native, smol, tmp_path):
    """SmolLM2-135M (576 / 1536-wide rows), prompt and four generated tokens."""
    _, exe = build
    mlb = smol("q4_0")
    want, want_ids = logits_bytes([native], mlb, tmp_path / "native.f32", "1,2,3,4,5", 4)
    got, got_ids = logits_bytes([QEMU, "-cpu", "cortex-a15", exe], mlb, tmp_path / "armv7.f32", "1,2,3,4,5", 4)
    assert got == want, "SmolLM2 logits differ from the native x86-64 build's"
    assert got_ids == want_ids, f"generated ids {got_ids} vs native {want_ids}"


def test_gemma3_q4_k_m_gguf_is_byte_identical_to_native_x86(build, native, gemma3_gguf, tmp_path):
    """Gemma 3 270M Q4_K_M run as it is (its Q4_K and Q6_K tensors through the armv7 K-quant
    dots), prompt and one generated token."""
    _, exe = build
    opts = ["--ctx", "64"]
    want, want_ids = logits_bytes([native, *opts], gemma3_gguf, tmp_path / "native.f32", "2,818,5279", 1)
    got, got_ids = logits_bytes([QEMU, "-cpu", "cortex-a15", exe, *opts], gemma3_gguf, tmp_path / "armv7.f32",
                                "2,818,5279", 1)
    assert got == want, "Gemma 3 Q4_K_M logits differ from the native x86-64 build's"
    assert got_ids == want_ids, f"generated ids {got_ids} vs native {want_ids}"
