"""Quantisation quality on real models (docs/QUANT.md): the default Q4_0 rule (the fitted
search weighted by the importance matrix measured at load) is never worse than llama.cpp's
max rule, by perplexity on a text no choice was tuned on (King Lear; the importance matrix
comes from the built-in Macbeth text, the rules were chosen on Hamlet). Each source is
requantised from its own blocks (`--requantize`), as a user turning it into Q4_0 would."""
import re

import pytest

import models
from conftest import run_ml

# model -> 512-token chunks scored (the 1.5B model fewer: a minute a run)
EVAL_MODELS = {"smollm2": 8, "gemma3": 8, "qwen-coder": 8}


def perplexity(gguf, chunks, *opts):
    p = run_ml(gguf, "--type", "q4_0", "--requantize", *opts, "--perplexity", models.play("lear"),
               "--ctx", "512", "--chunks", chunks, timeout=1200)
    return float(re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout).group(1))


@pytest.mark.parametrize("name", EVAL_MODELS)
def test_default_q4_rule_is_better_than_the_max_rule(name):
    gguf = models.MODELS[name]()
    default = perplexity(gguf, EVAL_MODELS[name])
    max_rule = perplexity(gguf, EVAL_MODELS[name], "--q4-scale", "max")
    assert default < max_rule, f"{name}: default Q4_0 perplexity {default} >= max rule's {max_rule}"
