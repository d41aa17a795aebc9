"""--bench and --perplexity: functional checks (speed itself is measured by benchmarks, not tests)."""
import json
import math
import re

import numpy as np

from conftest import FIXTURES, import_model, read_imatrix, run_ml

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way."
)


def test_bench_prints_llama_bench_rows_and_roofline(tmp_path):
    mlb = tmp_path / "tiny.mlb"
    import_model(FIXTURES / "hf-tiny" / "llama2", mlb, "--type", "q4_0")
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


def test_kl_divergence_against_a_base(smol, tmp_path):
    """--kld-base-out writes the scored positions' distributions; --kld-base compares with them:
    a model against its own base gives 0 and the same top token everywhere, KL(base ‖ other)
    recomputed from --logits-out agrees, and a base of another length or kind is a one-line error."""
    ctx = 32
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    base = tmp_path / "base.kld"
    ppl = ["-z", smol("mlt"), "--perplexity", text_file, "--ctx", ctx]
    run_ml(smol("q8_0"), *ppl, "--kld-base-out", base)
    same = run_ml(smol("q8_0"), *ppl, "--kld-base", base).stdout
    assert re.search(r"KLD = 0\.000000 \+/- 0\.000000, same top token 100\.00 % \(\d+ positions\)", same), same
    other = run_ml(smol("q4_0"), *ppl, "--kld-base", base).stdout
    m = re.search(r"KLD = ([0-9.]+) \+/- [0-9.]+, same top token ([0-9.]+) % \((\d+) positions\)", other)
    assert m, other

    ids = json.loads(run_ml("-z", smol("mlt"), "-p", TEXT, "--tokenize").stdout)
    kl, count = 0.0, 0
    for i in range(len(ids) // ctx):
        chunk = ",".join(map(str, ids[i * ctx:(i + 1) * ctx]))
        rows = []
        for model in (smol("q8_0"), smol("q4_0")):
            out = tmp_path / "l.f32"
            run_ml(model, "--prompt-ids", chunk, "--logits-out", out, "-n", "0")
            lg = np.fromfile(out, dtype="<f4").reshape(ctx, -1).astype(np.float64)[ctx // 2:ctx - 1]
            rows.append(lg - (np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1, keepdims=True))
                              + lg.max(1, keepdims=True)))
        p, q = rows
        kl += (np.exp(p) * (p - q)).sum()
        count += len(p)
    assert int(m.group(3)) == count
    assert abs(float(m.group(1)) - kl / count) <= 2e-3 * kl / count + 1e-5, (m.group(1), kl / count)

    bad = run_ml(smol("q8_0"), *ppl, "--chunks", "1", "--kld-base", base, check=False)
    assert bad.returncode != 0 and "more positions" in bad.stderr, bad.stderr
    junk = tmp_path / "junk.kld"
    junk.write_bytes(b"\x1b[31mnot a base")
    bad = run_ml(smol("q8_0"), *ppl, "--kld-base", junk, check=False)
    assert bad.returncode != 0 and "not a --kld-base-out file" in bad.stderr and "\x1b" not in bad.stderr


def test_imatrix_out_is_what_the_model_reads(smol, tmp_path):
    """--imatrix-out: one entry per matrix of every layer, the mean square of its input columns
    (q, k, v share theirs; gate and up theirs), positive, from the built-in text or a text."""
    out = tmp_path / "m.imatrix"
    run_ml(smol("q8_0"), "-z", smol("mlt"), "--imatrix-out", out)
    raw = out.read_bytes()
    assert raw.startswith(b"KRAFLA-IMATRIX-1\n")
    m = read_imatrix(out)
    kinds = {"attn_q", "attn_k", "attn_v", "attn_o", "ffn_gate", "ffn_up", "ffn_down"}
    assert set(m) == {f"blk.{i}.{k}" for i in range(30) for k in kinds}
    assert (m["blk.3.attn_q"] == m["blk.3.attn_v"]).all() and (m["blk.3.ffn_gate"] == m["blk.3.ffn_up"]).all()
    assert m["blk.0.attn_q"].shape == (576,) and m["blk.0.ffn_down"].shape == (1536,)
    assert all((v >= 0).all() and v.sum() > 0 for v in m.values())
