"""llama2.c source for tools/convert.py: karpathy/llama2.c checkpoints (.bin),
legacy v0 (run.c), v1 float32 and v2 Q8_0 (export.py).  Their q/k rows are in
the interleaved RoPE layout.  tools/llama2c.py writes them (for the tests).
"""
import os
import struct

import numpy as np

import families
from source_common import ConvertError, unpermute_interleaved

LLAMA2C_MAGIC = 0x616B3432


def load_llama2c(path):
    """A llama2.c checkpoint -> (meta, tensors) (see source_common)."""
    size = os.path.getsize(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    if size < 28:
        raise ConvertError(f"{path}: too small for a llama2.c checkpoint")
    (magic,) = struct.unpack("<I", bytes(mm[:4]))
    if magic == LLAMA2C_MAGIC:
        (version,) = struct.unpack("<i", bytes(mm[4:8]))
        if version not in (1, 2):
            raise ConvertError(f"{path}: unsupported llama2.c version {version}")
        dim, hidden, L, H, Hkv, V, seq = struct.unpack("<7i", bytes(mm[8:36]))
        shared = bool(mm[36])
        group = struct.unpack("<i", bytes(mm[37:41]))[0] if version == 2 else 0
        pos = 256
    else:
        version = 0
        dim, hidden, L, H, Hkv, V, seq = struct.unpack("<7i", bytes(mm[:28]))
        shared = V > 0
        V = abs(V)
        pos = 28
    for v in (dim, hidden, L, H, Hkv, V, seq):
        if v <= 0 or v > 1 << 24:
            raise ConvertError(f"{path}: implausible llama2.c header")
    if dim % H or H % Hkv:
        raise ConvertError(f"{path}: bad head counts")
    hd = dim // H
    kvd = Hkv * hd
    fam = families.FAMILIES["llama2c"]
    meta = {
        "arch": fam.arch, "vocab_size": V, "hidden_size": dim, "n_layers": L, "n_heads": H,
        "n_kv_heads": Hkv, "head_dim": hd, "ffn_dim": hidden, "context_length": seq,
        "norm_eps": 1e-5, "rope_theta": 10000.0, "rope_style": "half",
        **fam.traits(dim),
        "tie_embeddings": 1 if shared else 0,
    }
    tensors = {}
    raw = {}

    def f32(shape):
        nonlocal pos
        n = int(np.prod(shape)) * 4
        if pos + n > size:
            raise ConvertError(f"{path}: truncated (needs more weights than the file holds)")
        start = pos
        pos += n
        return lambda: np.array(mm[start:start + n].view("<f4"), dtype=np.float32).reshape(shape)

    def q80(shape):
        nonlocal pos
        n = int(np.prod(shape))
        if n % group:
            raise ConvertError(f"{path}: tensor size not a multiple of group size {group}")
        qn, sn = n, n // group * 4
        if pos + qn + sn > size:
            raise ConvertError(f"{path}: truncated (needs more weights than the file holds)")
        qs, ss = pos, pos + qn
        pos += qn + sn

        def load():
            q = mm[qs:qs + qn].view(np.int8).astype(np.float32).reshape(-1, group)
            s = mm[ss:ss + sn].view("<f4").astype(np.float32)
            return (q * s[:, None]).reshape(shape)
        return load

    if version == 0:
        raw["embd"] = [f32((V, dim))]
        raw["attn_norm"] = [f32((dim,)) for _ in range(L)]
        raw["q"] = [f32((dim, dim)) for _ in range(L)]
        raw["k"] = [f32((kvd, dim)) for _ in range(L)]
        raw["v"] = [f32((kvd, dim)) for _ in range(L)]
        raw["o"] = [f32((dim, dim)) for _ in range(L)]
        raw["ffn_norm"] = [f32((dim,)) for _ in range(L)]
        raw["gate"] = [f32((hidden, dim)) for _ in range(L)]
        raw["down"] = [f32((dim, hidden)) for _ in range(L)]
        raw["up"] = [f32((hidden, dim)) for _ in range(L)]
        raw["norm"] = [f32((dim,))]
        pos += seq * (hd // 2) * 4 * 2  # freq_cis_real, freq_cis_imag (unused)
        if not shared:
            raw["out"] = [f32((V, dim))]
    else:
        mat = f32 if version == 1 else q80
        raw["attn_norm"] = [f32((dim,)) for _ in range(L)]
        raw["ffn_norm"] = [f32((dim,)) for _ in range(L)]
        raw["norm"] = [f32((dim,))]
        raw["embd"] = [mat((V, dim))]
        raw["q"] = [mat((dim, dim)) for _ in range(L)]
        raw["k"] = [mat((kvd, dim)) for _ in range(L)]
        raw["v"] = [mat((kvd, dim)) for _ in range(L)]
        raw["o"] = [mat((dim, dim)) for _ in range(L)]
        raw["gate"] = [mat((hidden, dim)) for _ in range(L)]
        raw["down"] = [mat((dim, hidden)) for _ in range(L)]
        raw["up"] = [mat((hidden, dim)) for _ in range(L)]
        if not shared:
            raw["out"] = [mat((V, dim))]
    if pos > size:
        raise ConvertError(f"{path}: truncated (needs more weights than the file holds)")

    def t(loader, shape, transform=None):
        return (shape, (lambda: transform(loader())) if transform else loader)

    tensors["token_embd"] = t(raw["embd"][0], (V, dim))
    for i in range(L):
        p = f"blk.{i}."
        tensors[p + "attn_norm"] = t(raw["attn_norm"][i], (dim,))
        tensors[p + "attn_q"] = t(raw["q"][i], (dim, dim), lambda a: unpermute_interleaved(a, H))
        tensors[p + "attn_k"] = t(raw["k"][i], (kvd, dim), lambda a: unpermute_interleaved(a, Hkv))
        tensors[p + "attn_v"] = t(raw["v"][i], (kvd, dim))
        tensors[p + "attn_o"] = t(raw["o"][i], (dim, dim))
        tensors[p + "ffn_norm"] = t(raw["ffn_norm"][i], (dim,))
        tensors[p + "ffn_gate"] = t(raw["gate"][i], (hidden, dim))
        tensors[p + "ffn_up"] = t(raw["up"][i], (hidden, dim))
        tensors[p + "ffn_down"] = t(raw["down"][i], (dim, hidden))
    tensors["output_norm"] = t(raw["norm"][0], (dim,))
    if not shared:
        tensors["output"] = t(raw["out"][0], (V, dim))
    return meta, tensors
