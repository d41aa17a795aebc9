"""The real SmolLM2-135M-Instruct (GGUF from PyPI) end to end."""
import json

import numpy as np
import pytest

from conftest import FIXTURES, FixtureJson, run_ml

REAL = FixtureJson(FIXTURES / "real" / "smollm2-135m.json")


def test_f32_matches_transformers_top20_and_greedy(smol, tmp_path):
    ids = REAL["input_ids"]
    out = tmp_path / "logits.f32"
    run_ml(smol("f32"), "--prompt-ids", ",".join(map(str, ids)), "--logits-out", out, "-n", "0")
    logits = np.fromfile(out, dtype="<f4").reshape(len(ids), REAL["vocab"])
    for pos, (top_ids, top_vals) in enumerate(zip(REAL["top20_ids"], REAL["top20_logits"], strict=True)):
        got = logits[pos, top_ids]
        diff = np.abs(got - np.array(top_vals)).max()
        assert diff <= 2e-2, f"position {pos}: top-20 logits differ by {diff:.3e}"
        assert int(logits[pos].argmax()) == top_ids[0]
    p = run_ml(smol("f32"), "--prompt-ids", ",".join(map(str, ids)), "-n", "12", "--print-ids")
    assert json.loads(p.stdout.strip()) == REAL["greedy_12"]


def test_text_prompt_tokenizes_like_transformers(smol):
    p = run_ml("-z", smol("mlt"), "-p", REAL["prompt"], "--tokenize")
    assert json.loads(p.stdout) == REAL["input_ids"]


def test_f32_text_generation_matches_greedy_text(smol):
    p = run_ml(smol("f32"), "-z", smol("mlt"), "-p", REAL["prompt"], "-n", "12")
    assert p.stdout.rstrip("\n") == REAL["greedy_text"]


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_chat_answers_paris(smol, qtype):
    p = run_ml(smol(qtype), "-z", smol("mlt"), "--chat", "chatml", "-T", "0", "-n", "40",
               "-p", "What is the capital of France?")
    assert "Paris" in p.stdout, p.stdout
    assert "tokens/s" in p.stderr and "isa" in p.stderr
