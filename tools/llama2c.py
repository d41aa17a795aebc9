"""Write llama2.c checkpoints (legacy v0, v1 fp32, v2 Q8_0) from .mlb-layout
weights — the inverse of the executables' llama2.c reader
(shared/src/import/llama2c.rs), following karpathy/llama2.c's run.c (v0) and export.py
(version1_export / version2_export).  Used by the tests to round-trip the
converter.

weights: dict of .mlb names -> float32 arrays in Hugging Face layout (q/k rows
in the `half` RoPE layout; they are permuted to llama2.c's interleaved layout
here).
"""
import struct

import numpy as np

LLAMA2C_MAGIC = 0x616B3432  # "ak42"


def permute_to_interleaved(w, n_head):
    """Rows in Hugging Face's `half` RoPE layout (pairs i, i + hd/2) -> llama2.c's
    interleaved layout (pairs 2i, 2i + 1): llama.cpp's convert_hf_to_gguf `permute`."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _layers(meta, W):
    L, H, Hkv = meta["n_layers"], meta["n_heads"], meta["n_kv_heads"]

    def g(k):
        return [W[f"blk.{i}.{k}"] for i in range(L)]

    return {
        "attn_norm": g("attn_norm"), "ffn_norm": g("ffn_norm"),
        "q": [permute_to_interleaved(a, H) for a in g("attn_q")],
        "k": [permute_to_interleaved(a, Hkv) for a in g("attn_k")],
        "v": g("attn_v"), "o": g("attn_o"),
        "w1": g("ffn_gate"), "w2": g("ffn_down"), "w3": g("ffn_up"),
    }


def _params(meta, shared):
    return (meta["hidden_size"], meta["ffn_dim"], meta["n_layers"], meta["n_heads"],
            meta["n_kv_heads"], meta["vocab_size"], meta["context_length"])


def write_v0(path, meta, W):
    shared = bool(meta.get("tie_embeddings", 0))
    p = list(_params(meta, shared))
    if not shared:
        p[5] = -p[5]
    ly = _layers(meta, W)
    hd = meta["hidden_size"] // meta["n_heads"]
    seq = meta["context_length"]
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", *p))

        def w(a):
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())

        w(W["token_embd"])
        for key in ("attn_norm", "q", "k", "v", "o", "ffn_norm", "w1", "w2", "w3"):
            for a in ly[key]:
                w(a)
        w(W["output_norm"])
        # freq_cis_real / freq_cis_imag (ignored by readers)
        pos = np.arange(seq)[:, None]
        freqs = 1.0 / (10000.0 ** (np.arange(0, hd, 2)[: hd // 2] / hd))
        w(np.cos(pos * freqs))
        w(np.sin(pos * freqs))
        if not shared:
            w(W["output"])


def _header(f, version, meta, shared, group=None):
    hdr = struct.pack("<Ii", LLAMA2C_MAGIC, version) + struct.pack("<7i", *_params(meta, shared))
    hdr += struct.pack("<B", int(shared))
    if group is not None:
        hdr += struct.pack("<i", group)
    f.write(hdr + b"\0" * (256 - len(hdr)))


def _order(meta, W, ly, shared):
    mats = [W["token_embd"]]
    for key in ("q", "k", "v", "o", "w1", "w2", "w3"):
        mats += ly[key]
    if not shared:
        mats.append(W["output"])
    return mats


def write_v1(path, meta, W):
    shared = bool(meta.get("tie_embeddings", 0))
    ly = _layers(meta, W)
    with open(path, "wb") as f:
        _header(f, 1, meta, shared)

        def w(a):
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())

        for a in ly["attn_norm"] + ly["ffn_norm"] + [W["output_norm"]]:
            w(a)
        for a in _order(meta, W, ly, shared):
            w(a)


def quantize_q80(a, group):
    """export.py's quantize_q80: symmetric int8 per group, scale = max|w| / 127."""
    w = np.asarray(a, dtype=np.float32).reshape(-1, group)
    wmax = np.abs(w).max(axis=1)
    scale = wmax / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[:, None] > 0, np.round(w / scale[:, None]), 0).astype(np.int8)
    return q, scale.astype(np.float32)


def write_v2(path, meta, W, group=64):
    shared = bool(meta.get("tie_embeddings", 0))
    while meta["hidden_size"] % group:
        group //= 2
    ly = _layers(meta, W)
    with open(path, "wb") as f:
        _header(f, 2, meta, shared, group)
        for a in ly["attn_norm"] + ly["ffn_norm"] + [W["output_norm"]]:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
        for a in _order(meta, W, ly, shared):
            q, s = quantize_q80(a, group)
            f.write(q.tobytes())
            f.write(s.astype("<f4").tobytes())
