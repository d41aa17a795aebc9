#!/usr/bin/env python3
"""Numpy float32 reference forward pass for .mlb models: the oracle the tests
check the Rust runtime (and, through the transformers fixtures, its importer) against.

    python3 tools/reference_forward.py check-real MODEL FIXTURE.json
        compare top-20 logits with a transformers fixture (shared/fixtures/real)
    python3 tools/reference_forward.py check-tiny MODEL REFERENCE.json
        compare full logits with an hf-tiny reference.json

MODEL is an .mlb file, or any model `ml_run` imports (loaded as f32 through `ml_run --save`).

The forward pass implements the .mlb semantics of docs/FORMAT.md for the
attention families (llama, mistral, qwen2, qwen3, smollm3, gemma2, gemma3,
llama2c): RMSNorm (optionally 1+w), GQA, RoPE `half` with partial rotary,
linear / llama3 scaling, NoPE layers, sliding windows, q/k norms, biases,
soft-capping, SwiGLU / GeGLU, sandwich norms.  It is an independent check of
the Rust runtime, not an efficient implementation.
"""
import argparse
import base64
import json
import math
import os
import subprocess
import tempfile

import numpy as np

import mlb

# --------------------------------------------------------------------------
# loading

def ml_variant():
    """The inference executable: $KRAFLA_BIN, else this checkout's release build."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("KRAFLA_BIN", os.path.join(here, "..", "target", "release", "ml_variant"))


def load_model(path):
    """-> (meta, weights dict name -> float32 array). An .mlb is read as it is; any other model
    (a Hugging Face directory, a GGUF file, a llama2.c checkpoint) is imported by the executable
    in f32 (`ml_run PATH --type f32 --save`: its exact values)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(8)
        if magic == mlb.MAGIC:
            r = mlb.MlbReader(path)
            return dict(r.meta), {n: r.get(n) for n in r.tensors}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model.mlb")
        p = subprocess.run([ml_variant(), path, "--type", "f32", "--save", out, "--prompt-ids", "1", "-n", "0"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise ValueError(f"{path}: cannot import: {p.stderr.strip()}")
        return load_model(out)


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
    if not local and "rope_freq_factors" in meta:  # llama.cpp's rope_freqs: a divisor per frequency
        inv = inv / np.asarray(meta["rope_freq_factors"], dtype=np.float64)
    return inv


def _rope(x, pos, inv, interleaved=False):
    """x [T, heads, hd]; rotate the first 2*len(inv) dims, pairs (i, i + r/2),
    or (2i, 2i + 1) when `interleaved` (llama.cpp's layout)."""
    r = 2 * len(inv)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    first, second = (slice(0, r, 2), slice(1, r, 2)) if interleaved else (slice(0, r // 2), slice(r // 2, r))
    x1, x2 = x[..., first], x[..., second]
    out = x.copy()
    out[..., first] = x1 * cos - x2 * sin
    out[..., second] = x2 * cos + x1 * sin
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
    interleaved = meta.get("rope_style", "half") == "interleaved"
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
            q, k = _rope(q, pos, inv, interleaved), _rope(k, pos, inv, interleaved)
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
    with open(fixture) as f:
        fx = json.load(f)
    lg = forward(meta, W, fx["input_ids"])
    worst = 0.0
    top1 = True
    for t, (ids, vals) in enumerate(zip(fx["top20_ids"], fx["top20_logits"])):
        got = lg[t, ids]
        worst = max(worst, float(np.max(np.abs(got - np.asarray(vals)))))
        top1 &= int(np.argmax(lg[t])) == ids[0]
    return worst, top1


def check_tiny(meta, W, ref):
    with open(ref) as f:
        fx = json.load(f)
    want = np.frombuffer(base64.b64decode(fx["logits_f32_le_base64"]), "<f4").reshape(fx["logits_shape"])
    lg = forward(meta, W, fx["input_ids"])
    return float(np.max(np.abs(lg - want)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a1 = sub.add_parser("check-real", help="top-20 logits vs a transformers fixture (shared/fixtures/real)")
    a1.add_argument("model")
    a1.add_argument("fixture")
    a2 = sub.add_parser("check-tiny", help="full logits vs an hf-tiny reference.json")
    a2.add_argument("model")
    a2.add_argument("reference")
    a = ap.parse_args(argv)
    if a.cmd == "check-real":
        worst, top1 = check_real(*load_model(a.model), a.fixture)
        print(f"max |logit diff| over top-20: {worst:.4g}; top-1 agrees: {top1}")
    else:
        print(f"max |logit diff|: {check_tiny(*load_model(a.model), a.reference):.4g}")


if __name__ == "__main__":
    main()
