"""The real Gemma 3 270M (GGUF reassembled from PyPI parts) against transformers."""
import json

import numpy as np
import pytest

from conftest import FIXTURES, run_ml, run_tool

REAL = json.loads((FIXTURES / "real" / "gemma3-270m.json").read_text())


@pytest.fixture(scope="module")
def gemma(gem, tmp_path_factory):
    """kind -> Gemma 3 converted from the GGUF (.mlb), or 'mlt' (the tokenizer, from its tokenizer.json)."""
    mlt = tmp_path_factory.mktemp("gemma3-hf") / "gemma3.mlt"
    run_tool("convert_tokenizer.py", FIXTURES / "tokenizers" / "gemma3" / "tokenizer.json", "-o", mlt)
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
