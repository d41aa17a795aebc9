"""Forward pass against transformers' own logits (../shared/fixtures/hf-tiny).

Each fixture is imported by the executable (`ml_run DIR --save`) and run through the Krafla
executable with --prompt-ids / --logits-out / --print-ids.
"""
import base64
import json
import re

import numpy as np
import pytest

# tools/ is on sys.path: conftest, which pytest loads before this module, puts it there
import llama2c
import mlb as mlb_file
import reference_forward as rf
from conftest import FIXTURES, import_model, isas, run_ml

# Every family fixture: Llama 2, Llama 3 scaling, SmolLM2 (tied), Mistral (sliding
# window), Qwen2 (biases), Qwen3 (q/k norm), SmolLM3 (NoPE layers), Gemma 2
# (soft-caps, sandwich norms), Gemma 3 (local/global), Qwen3.5 (Gated DeltaNet).
# without the shared fixtures the tests over FAMILIES skip (an empty parameter set)
FAMILIES = sorted(p.name for p in (FIXTURES / "hf-tiny").glob("*") if (p / "reference.json").exists())


def reference(family):
    ref = json.loads((FIXTURES / "hf-tiny" / family / "reference.json").read_text())
    t, v = ref["logits_shape"]
    logits = np.frombuffer(base64.b64decode(ref["logits_f32_le_base64"]), dtype="<f4").reshape(t, v)
    return ref["input_ids"], logits, ref["greedy_16"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(family, type) -> path of the converted .mlb, converted once per module."""
    cache = {}
    root = tmp_path_factory.mktemp("hf-tiny")

    def get(family, qtype):
        key = (family, qtype)
        if key not in cache:
            out = root / f"{family}-{qtype}.mlb"
            import_model(FIXTURES / "hf-tiny" / family, out, "--type", qtype)
            cache[key] = out
        return cache[key]

    return get


def logits_of(mlb, ids, tmp_path, *extra):
    out = tmp_path / "logits.f32"
    run_ml(mlb, "--prompt-ids", ",".join(map(str, ids)), "--logits-out", out, "-n", "0", *extra)
    return np.fromfile(out, dtype="<f4")


def greedy_of(mlb, ids, n):
    p = run_ml(mlb, "--prompt-ids", ",".join(map(str, ids)), "-n", n, "--print-ids", "-T", "0")
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_logits_and_greedy_match_transformers(family, converted, tmp_path):
    ids, want, greedy = reference(family)
    got = logits_of(converted(family, "f32"), ids, tmp_path).reshape(want.shape)
    diff = np.abs(got - want).max()
    assert diff <= 1e-3, f"{family}: max |logit difference| {diff:.2e} > 1e-3"
    assert greedy_of(converted(family, "f32"), ids, 16) == greedy


# The fixtures' random weights make their logits very sensitive: Gaussian noise
# of 0.3 % of each weight matrix's spread (what Q8_0 rounding adds) already moves
# the argmax at 12 % of mistral-swa's positions in exact f32 arithmetic, so the
# issue's 90 % is not reachable by any Q8_0 implementation on every fixture.
# Measured q8_0 agreement: 75 % (smollm2-tied) to 100 % (gemma3, llama3);
# README "Models" lists each. Real models: tests/test_smollm2.py, test_gemma3.py.
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("qtype,min_agree", [("q8_0", 0.70)])
def test_quantized_argmax_agrees(family, qtype, min_agree, converted, tmp_path):
    ids, want, _ = reference(family)
    got = logits_of(converted(family, qtype), ids, tmp_path).reshape(want.shape)
    agree = float(np.mean(got.argmax(1) == want.argmax(1)))
    assert agree >= min_agree, f"{family} {qtype}: argmax agrees at {agree:.0%} of positions"


@pytest.mark.parametrize("family,qtype", [("smollm2-tied", "f32"), ("smollm2-tied", "q8_0"), ("smollm2-tied", "q4_0"),
                                          ("gemma3-local-global", "q8_0"), ("qwen3_5-hybrid", "q4_0")])
def test_logits_identical_across_threads_and_batch_sizes(family, qtype, converted, tmp_path):
    ids, _, _ = reference(family)
    mlb = converted(family, qtype)
    base = logits_of(mlb, ids, tmp_path, "-t", "1", "--batch", "512").tobytes()
    for threads, batch in [(2, 512), (3, 7), (1, 1), (2, 5)]:
        other = logits_of(mlb, ids, tmp_path, "-t", threads, "--batch", batch).tobytes()
        assert other == base, f"{qtype}: logits differ at -t {threads} --batch {batch}"


@pytest.mark.parametrize("family,kv", [("smollm2-tied", "f32"), ("gemma3-local-global", "f32"),
                                       ("gemma3-local-global", "f16"), ("gemma3-local-global", "q8")])
def test_long_prompt_attention_identical_across_threads_and_batch_sizes(family, kv, converted, tmp_path):
    """A 150-token prompt: attention walks the cache in blocks of eight queries and chunks of 32
    positions (past Gemma 3's sliding window too); a decode step with fewer blocks than two per
    thread (`-t 2 --batch 1` here), one query at a time. The same logits bytes for any thread count
    and batch."""
    ids, _, _ = reference(family)
    ids = (ids * (150 // len(ids) + 1))[:150]
    mlb = converted(family, "q8_0")
    base = logits_of(mlb, ids, tmp_path, "-t", "1", "--batch", "512", "--kv", kv).tobytes()
    for threads, batch in [(2, 512), (3, 37), (1, 1), (2, 1), (2, 9)]:
        other = logits_of(mlb, ids, tmp_path, "-t", threads, "--batch", batch, "--kv", kv).tobytes()
        assert other == base, f"{family} --kv {kv}: logits differ at -t {threads} --batch {batch}"


@pytest.mark.parametrize("family,qtype", [("smollm2-tied", "q8_0"), ("smollm2-tied", "q4_0"),
                                          ("qwen3_5-hybrid", "q4_0"), ("gemma3-local-global", "q8_0")])
def test_repacked_weights_give_identical_logits(family, qtype, tmp_path):
    """x86 builds copy Q8_0/Q4_0 matrices stored in plain rows (`mlb.write_plain_rows`) into
    eight-row interleaved groups at load (the startup line counts them); --no-repack keeps only the
    mapped file. Same logits, byte for byte. (Files stored in the groups: tests/test_layout.py.)"""
    ids, _, _ = reference(family)
    mlb = tmp_path / "plain.mlb"
    import_model(FIXTURES / "hf-tiny" / family, tmp_path / "rows8.mlb", "--type", qtype)
    mlb_file.write_plain_rows(tmp_path / "rows8.mlb", mlb)
    ids_arg = ",".join(map(str, ids))
    p = run_ml(mlb, "--prompt-ids", ids_arg, "-n", "0")
    repacked = float(re.search(r"\+ ([0-9.]+) MiB repacked weights", p.stderr).group(1))
    if re.search(rf"isa ({'|'.join(isas('x86_64'))}),", p.stderr):  # the x86-64 builds repack
        assert repacked > 0, p.stderr
    p = run_ml(mlb, "--prompt-ids", ids_arg, "-n", "0", "--no-repack")
    assert float(re.search(r"\+ ([0-9.]+) MiB repacked weights", p.stderr).group(1)) == 0, p.stderr
    for threads, batch in [(1, 512), (2, 5)]:
        packed = logits_of(mlb, ids, tmp_path, "-t", threads, "--batch", batch).tobytes()
        plain = logits_of(mlb, ids, tmp_path, "-t", threads, "--batch", batch, "--no-repack").tobytes()
        assert packed == plain, f"{family} {qtype}: repacked and plain logits differ at -t {threads} --batch {batch}"


@pytest.mark.parametrize("kv", ["f16", "q8"])
def test_kv_cache_types(kv, converted, tmp_path):
    """--kv f16/q8 stay close to the f32 cache and keep logits identical across threads and batches."""
    family = "gemma3-local-global"  # head_dim 32: a whole Q8_0 block per head
    ids, want, _ = reference(family)
    mlb = converted(family, "f32")
    f32 = logits_of(mlb, ids, tmp_path).reshape(want.shape)
    got = logits_of(mlb, ids, tmp_path, "--kv", kv).reshape(want.shape)
    if kv == "f16":
        assert np.abs(got - f32).max() <= 1e-2
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.9
    base = got.tobytes()
    for threads, batch in [(2, 5), (3, 1)]:
        other = logits_of(mlb, ids, tmp_path, "--kv", kv, "-t", threads, "--batch", batch).tobytes()
        assert other == base, f"--kv {kv}: logits differ at -t {threads} --batch {batch}"


def test_kv_memory_matches_the_formula(converted):
    """Startup line: KV bytes = 2 × attention layers × ctx × n_kv_heads × head_dim × bytes per value."""
    mlb = converted("llama2", "q8_0")  # 4 layers, 4 kv heads of 16
    for kv, per_value in [("f32", 4), ("f16", 2)]:
        p = run_ml(mlb, "--prompt-ids", "1,2", "-n", "0", "--ctx", "256", "--kv", kv)
        mib = float(re.search(r"\+ ([0-9.]+) MiB KV cache", p.stderr).group(1))
        assert abs(mib - 2 * 4 * 256 * 4 * 16 * per_value / 2**20) < 0.05, p.stderr
    p = run_ml(mlb, "--prompt-ids", "1,2", "-n", "0", "--kv", "q8", check=False)
    assert p.returncode == 2 and "multiple of 32" in p.stderr


@pytest.mark.parametrize("version", [0, 2])
def test_llama2c_checkpoint_runs_like_the_fixture(version, tmp_path):
    """A llama2.c checkpoint written from the llama2 fixture's weights (v0 float32, v2 Q8_0)
    converts and runs to the fixture's logits (v2 within its Q8 weight error)."""
    meta, weights = rf.load_model(str(FIXTURES / "hf-tiny" / "llama2"))
    ck = tmp_path / "model.bin"
    {0: llama2c.write_v0, 2: llama2c.write_v2}[version](str(ck), meta, weights)
    mlb = tmp_path / "m.mlb"
    import_model(ck, mlb, "--type", "f32")
    ids, want, greedy = reference("llama2")
    got = logits_of(mlb, ids, tmp_path).reshape(want.shape)
    if version == 0:
        assert np.abs(got - want).max() <= 1e-3
        assert greedy_of(mlb, ids, 16) == greedy
    else:
        assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.7
