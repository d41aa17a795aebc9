"""--bench and --perplexity: functional checks (speed itself is measured by benchmarks, not tests)."""
import json
import math
import re

import numpy as np

from conftest import FIXTURES, run_ml, run_tool

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way."
)


def test_bench_prints_llama_bench_rows_and_roofline(tmp_path):
    mlb = tmp_path / "tiny.mlb"
    run_tool("convert.py", FIXTURES / "hf-tiny" / "llama2", "-o", mlb, "--type", "q4_0")
    p = run_ml(mlb, "--bench", "-pp", "16", "-tg", "8", "-r", "2", "-t", "1")
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| tiny")]
    assert [r.split("|")[6].strip() for r in rows] == ["pp16", "tg8"], p.stdout
    for r in rows:
        assert re.search(r"\| [0-9.]+ ± [0-9.]+ \|$", r), r
    assert re.search(r"roofline: [0-9.]+ MB of weights read per generated token; "
                     r"memory read bandwidth [0-9.]+ GB/s", p.stdout)


def test_perplexity_follows_llama_cpp_protocol(smol, tmp_path):
    ctx = 32
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    p = run_ml(smol("q8_0"), "-z", smol("mlt"), "--perplexity", text_file, "--ctx", ctx)
    got = float(re.search(r"Final estimate: PPL = ([0-9.]+) \+/- [0-9.]+", p.stdout).group(1))

    # The same protocol recomputed from --logits-out of each chunk.
    ids = json.loads(run_ml("-z", smol("mlt"), "-p", TEXT, "--tokenize").stdout)
    n_chunks = len(ids) // ctx
    assert n_chunks >= 2
    nll, count = 0.0, 0
    for i in range(n_chunks):
        chunk = ids[i * ctx:(i + 1) * ctx]  # SmolLM2 adds no BOS, so nothing is replaced
        out = tmp_path / f"chunk{i}.f32"
        run_ml(smol("q8_0"), "--prompt-ids", ",".join(map(str, chunk)), "--logits-out", out, "-n", "0")
        logits = np.fromfile(out, dtype="<f4").reshape(ctx, -1).astype(np.float64)
        for j in range(ctx // 2, ctx - 1):
            row = logits[j]
            lse = np.log(np.exp(row - row.max()).sum()) + row.max()
            nll += lse - row[chunk[j + 1]]
            count += 1
    want = math.exp(nll / count)
    assert abs(got - want) <= 1e-3 * want, (got, want)
