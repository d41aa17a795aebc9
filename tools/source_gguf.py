"""GGUF source for tools/convert.py: a llama.cpp .gguf file, any tensor type the
`gguf` package can dequantise.

llama.cpp's conventions are kept rather than undone, so that the tensors of
the types Krafla reads as they are (F32, F16, Q8_0, Q4_0) keep their bytes and
the executables, which load GGUF files directly, make the same file with
`--save`: q/k rows permuted to interleaved RoPE (LlamaModel families) get
`rope_style = interleaved`, Gemma norms stored as 1 + w are used as stored
(no `norm_unit_offset`). Values llama.cpp hard-codes instead of storing come
from families.py. Each tensor comes with its GGUF type and raw bytes, for
convert.py's type choice.
"""
import math

import numpy as np

import families
from source_common import ConvertError

GGUF_LAYER_MAP = {
    "attn_norm": "attn_norm", "attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v",
    "attn_output": "attn_o", "attn_q_norm": "attn_q_norm", "attn_k_norm": "attn_k_norm",
    "ffn_norm": "ffn_norm", "ffn_gate": "ffn_gate", "ffn_up": "ffn_up", "ffn_down": "ffn_down",
    "post_attention_norm": "attn_post_norm", "post_ffw_norm": "ffn_post_norm",
}


class GgufRows:
    """A GGUF matrix (rows × cols) as float32 rows, dequantised when read
    (`read_rows`), in whichever process reads them: mlb.encode hands pieces
    of it to its worker processes as this small object, not as floats.
    `numpy.asarray` reads it whole."""

    def __init__(self, path, offset, tensor_type, shape):
        self.path, self.offset, self.tensor_type, self.shape = str(path), offset, tensor_type, shape

    def read_rows(self, start, stop):
        import gguf

        qtype = gguf.GGMLQuantizationType(self.tensor_type)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = self.shape[1] // block * size
        raw = np.memmap(self.path, np.uint8, "r", self.offset + start * row_bytes, ((stop - start), row_bytes))
        if qtype == gguf.GGMLQuantizationType.F32:
            return np.array(raw.view(np.float32))
        return np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(stop - start, -1)

    def __array__(self, dtype=None, copy=None):
        a = self.read_rows(0, self.shape[0])
        return a if dtype is None else a.astype(dtype, copy=False)


def load_gguf(path):
    """A .gguf file -> (meta, tensors) (see source_common)."""
    try:
        import gguf

        import gguf_file
    except ImportError:
        raise ConvertError("the `gguf` package is needed for GGUF input (pip install gguf)") from None
    try:
        fields, table = gguf_file.read(path)
    except (OSError, gguf_file.GgufError) as e:
        raise ConvertError(f"{path}: cannot read GGUF ({e})") from e

    def field(key, default=None):
        return fields.get(key, default)

    ga = field("general.architecture")
    fam = families.from_gguf(ga)
    if fam is None:
        raise ConvertError(f"unsupported architecture {ga!r}")
    arch = fam.arch

    def af(key, default=None, required=False):
        v = field(f"{ga}.{key}", default)
        if v is None and required:
            raise ConvertError(f"GGUF lacks {ga}.{key}")
        return v

    tinfo = {t.name: t for t in table}
    D = int(af("embedding_length", required=True))
    H = int(af("attention.head_count", required=True))
    L = int(af("block_count", required=True))
    Hkv = af("attention.head_count_kv", H)
    if isinstance(Hkv, list):
        Hkv = Hkv[0]
    Hkv = int(Hkv)
    hd = int(af("attention.key_length", D // H))
    F = af("feed_forward_length", required=True)
    if isinstance(F, list):
        F = F[0]
    if "token_embd.weight" not in tinfo:
        raise ConvertError("missing tensor token_embd.weight")
    V = int(af("vocab_size", 0) or tinfo["token_embd.weight"].shape[-1])
    meta = {
        "arch": arch, "vocab_size": V, "hidden_size": D, "n_layers": L, "n_heads": H,
        "n_kv_heads": Hkv, "head_dim": hd, "ffn_dim": int(F),
        "context_length": int(af("context_length", 2048)),
        "norm_eps": float(af("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(af("rope.freq_base", 10000.0)),
        "rope_style": "interleaved" if fam.gguf_qk_permuted else "half",
    }
    rd = af("rope.dimension_count")
    if rd is not None and int(rd) != hd:
        meta["rope_dim"] = int(rd)
    st = af("rope.scaling.type")
    if st in ("linear",) and af("rope.scaling.factor"):
        meta["rope_scaling"] = "linear"
        meta["rope_scaling_factor"] = float(af("rope.scaling.factor"))
    if "rope_freqs.weight" in tinfo:
        # llama.cpp's form of llama3 RoPE scaling: one divisor per frequency
        t = tinfo["rope_freqs.weight"]
        if t.tensor_type.name != "F32" or len(t.shape) != 1:
            raise ConvertError(f"rope_freqs.weight should be a vector of F32, not {t.tensor_type.name} "
                               f"{list(t.shape)}")
        meta["rope_freq_factors"] = [float(v) for v in np.asarray(t.data, dtype=np.float32).reshape(-1)]
    for k, gk in (("bos_id", "tokenizer.ggml.bos_token_id"), ("eos_id", "tokenizer.ggml.eos_token_id")):
        v = field(gk)
        if v is not None:
            meta[k] = int(v)
    meta.update(fam.traits(D))
    if fam.gemma:
        del meta["norm_unit_offset"]  # convert_hf_to_gguf stores Gemma norms as 1 + w: used as stored

    # ---- layer kinds: the GGUF's own pattern if it has one, else the family's
    window = af("attention.sliding_window")
    pattern = af("attention.sliding_window_pattern")  # a period, or one bool per layer (true: sliding)
    if isinstance(pattern, list):
        if len(pattern) != L:
            raise ConvertError(f"{ga}.attention.sliding_window_pattern has {len(pattern)} entries, not {L}")
        kinds = [families.SLIDING if b else families.FULL for b in pattern]
    else:
        kinds = fam.layer_kinds(L, window, period=pattern)
    if kinds is not None and any(kinds):
        if window:
            meta["sliding_window"] = int(window)
        meta["layer_kinds"] = kinds

    if fam.gguf_softcaps:
        if af("attn_logit_softcapping"):
            meta["attn_softcap"] = float(af("attn_logit_softcapping"))
        if af("final_logit_softcapping"):
            meta["final_softcap"] = float(af("final_logit_softcapping"))
    if fam.gguf_local_rope_theta is not None:
        meta["rope_local_theta"] = fam.gguf_local_rope_theta
    if fam.gemma:
        meta["query_scale"] = 1.0 / math.sqrt(hd)  # llama.cpp: query_pre_attn_scalar = head_dim
    meta["tie_embeddings"] = 0 if "output.weight" in tinfo else 1

    def gt(gname):
        """(shape, loader of float32, GGUF type name, loader of the raw bytes)."""
        if gname not in tinfo:
            raise ConvertError(f"missing tensor {gname}")
        t = tinfo[gname]
        shape = tuple(int(x) for x in reversed(list(t.shape)))

        def load():
            if len(shape) == 2:
                return GgufRows(path, t.offset, int(t.tensor_type), shape)
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            return np.asarray(a, dtype=np.float32).reshape(shape)

        def raw():
            return np.ascontiguousarray(t.data).tobytes()
        return (shape, load, t.tensor_type.name, raw)

    tensors = {"token_embd": gt("token_embd.weight")}
    for i in range(L):
        names = {n[len(f"blk.{i}."):] for n in tinfo if n.startswith(f"blk.{i}.")}
        required = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                    "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                    "ffn_down.weight"]
        if fam.gemma:
            required += ["post_attention_norm.weight", "post_ffw_norm.weight"]
        for rq in required:
            if rq not in names:
                raise ConvertError(f"missing tensor blk.{i}.{rq}")
        for n in sorted(names):
            base, _, kind = n.rpartition(".")
            if base not in GGUF_LAYER_MAP or kind not in ("weight", "bias"):
                raise ConvertError(f"unexpected tensor blk.{i}.{n} for arch {ga}")
            out = GGUF_LAYER_MAP[base] + ("_bias" if kind == "bias" else "")
            tensors[f"blk.{i}.{out}"] = gt(f"blk.{i}.{n}")
    tensors["output_norm"] = gt("output_norm.weight")
    if not meta["tie_embeddings"]:
        tensors["output"] = gt("output.weight")
    return meta, tensors
