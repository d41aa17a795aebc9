#!/usr/bin/env python3
"""Convert a model to Krafla's .mlb format (docs/FORMAT.md).

    python3 tools/convert.py SRC -o OUT.mlb --type {q8_0,q4_0,q4_mixed,f32,f16}
                             [--q4-scale {fit,max}] [--scale-type {f16,f32}]

SRC is one of
  * a Hugging Face directory (config.json + *.safetensors, sharded or not),
  * a .gguf file (any tensor type the `gguf` package can dequantise),
  * a llama2.c checkpoint (.bin: legacy v0, v1 fp32 or v2 Q8_0).

All weights are loaded as float32 in Hugging Face layout ([out, in], RoPE rows
in the `half` layout) and then re-encoded; see docs/QUANT.md for the
quantisation choices.  Errors the user can fix (unsupported architecture,
missing tensor, bad file) print one line and exit with status 2, leaving no
output or temp file behind.
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlb  # noqa: E402


class ConvertError(Exception):
    pass


# --------------------------------------------------------------------------
# RoPE row permutations

def unpermute_interleaved(w, n_head):
    """Rows in interleaved RoPE layout (pairs 2i, 2i+1; llama.cpp GGUF, llama2.c)
    -> Hugging Face `half` layout (pairs i, i + hd/2).  Inverse of llama.cpp's
    convert_hf_to_gguf `permute`."""
    rows = w.shape[0]
    hd = rows // n_head
    return (w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def permute_to_interleaved(w, n_head):
    """HF `half` layout -> interleaved (llama.cpp's `permute`)."""
    rows = w.shape[0]
    hd = rows // n_head
    return (w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


# --------------------------------------------------------------------------
# Hugging Face config -> .mlb metadata

HF_ARCH = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "smollm3": "smollm3", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
    "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
}
ARCH_FROM_CLASS = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "SmolLM3ForCausalLM": "smollm3", "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3", "Gemma3ForConditionalGeneration": "gemma3",
    "Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5ForConditionalGeneration": "qwen3_5",
}

LAYER_KIND = {"full_attention": 0, "sliding_attention": 1, "linear_attention": 2}


def _rope_block(params):
    """Normalise one RoPE parameter dict (v4 rope_scaling or v5 rope_parameters)."""
    out = {}
    if not params:
        return out
    if params.get("rope_theta") is not None:
        out["theta"] = float(params["rope_theta"])
    rt = params.get("rope_type", params.get("type", "default")) or "default"
    if rt not in ("default", "linear", "llama3"):
        raise ConvertError(f"unsupported rope_type {rt!r}")
    if rt != "default":
        out["scaling"] = rt
        out["factor"] = float(params.get("factor", 1.0))
        if rt == "llama3":
            out["low"] = float(params.get("low_freq_factor", 1.0))
            out["high"] = float(params.get("high_freq_factor", 4.0))
            out["orig"] = int(params.get("original_max_position_embeddings", 8192))
    if params.get("partial_rotary_factor") is not None:
        out["partial"] = float(params["partial_rotary_factor"])
    return out


def hf_meta(cfg):
    """config.json (dict) -> (arch, metadata dict). Handles transformers v4
    (`rope_theta` + `rope_scaling`) and v5 (`rope_parameters`) forms."""
    if isinstance(cfg.get("text_config"), dict):
        top = cfg
        cfg = dict(cfg["text_config"])
        for k in ("tie_word_embeddings",):
            if k not in cfg and k in top:
                cfg[k] = top[k]
    mt = cfg.get("model_type")
    arch = HF_ARCH.get(mt)
    if arch is None:
        for c in cfg.get("architectures") or []:
            arch = arch or ARCH_FROM_CLASS.get(c)
    if arch is None:
        name = mt or ",".join(cfg.get("architectures") or []) or "unknown"
        raise ConvertError(f"unsupported architecture {name!r}")

    def req(k):
        if cfg.get(k) is None:
            raise ConvertError(f"config.json lacks {k!r}")
        return cfg[k]

    D = int(req("hidden_size"))
    H = int(req("num_attention_heads"))
    L = int(req("num_hidden_layers"))
    Hkv = int(cfg.get("num_key_value_heads") or H)
    hd = int(cfg.get("head_dim") or D // H)
    m = {
        "arch": arch,
        "vocab_size": int(req("vocab_size")),
        "hidden_size": D,
        "n_layers": L,
        "n_heads": H,
        "n_kv_heads": Hkv,
        "head_dim": hd,
        "ffn_dim": int(req("intermediate_size")),
        "context_length": int(cfg.get("max_position_embeddings") or 2048),
        "norm_eps": float(cfg.get("rms_norm_eps") or 1e-6),
    }
    # ---- RoPE (v5 rope_parameters, possibly per layer type; else v4 keys)
    rp = cfg.get("rope_parameters")
    glob, local = {}, None
    if isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values()):
        glob = _rope_block(rp.get("full_attention") or {})
        if "sliding_attention" in rp:
            local = _rope_block(rp["sliding_attention"])
    elif isinstance(rp, dict):
        glob = _rope_block(rp)
    else:
        glob = _rope_block(cfg.get("rope_scaling") or {})
        if cfg.get("rope_theta") is not None:
            glob["theta"] = float(cfg["rope_theta"])
        if cfg.get("partial_rotary_factor") is not None:
            glob["partial"] = float(cfg["partial_rotary_factor"])
        if cfg.get("rope_local_base_freq") is not None:
            local = {"theta": float(cfg["rope_local_base_freq"])}
    m["rope_theta"] = glob.get("theta", 10000.0)
    if local and "theta" in local:
        m["rope_local_theta"] = local["theta"]
    if "scaling" in glob:
        m["rope_scaling"] = glob["scaling"]
        m["rope_scaling_factor"] = glob["factor"]
        if glob["scaling"] == "llama3":
            m["rope_low_freq_factor"] = glob["low"]
            m["rope_high_freq_factor"] = glob["high"]
            m["rope_original_context"] = glob["orig"]
    if "partial" in glob and glob["partial"] != 1.0:
        m["rope_dim"] = int(round(hd * glob["partial"]))
    m["rope_style"] = "half"

    # ---- layer kinds / sliding window
    kinds = None
    if cfg.get("layer_types"):
        lt = cfg["layer_types"]
        if len(lt) != L:
            raise ConvertError("layer_types length differs from num_hidden_layers")
        try:
            kinds = [LAYER_KIND[t] for t in lt]
        except KeyError as e:
            raise ConvertError(f"unsupported layer type {e.args[0]!r}")
    elif arch == "gemma2":
        kinds = [1 if i % 2 == 0 else 0 for i in range(L)]
    elif arch == "gemma3":
        pat = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        kinds = [0 if (i + 1) % pat == 0 else 1 for i in range(L)]
    elif arch == "mistral" and cfg.get("sliding_window"):
        kinds = [1] * L
    elif arch == "qwen2" and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        mwl = int(cfg.get("max_window_layers") or L)
        kinds = [1 if i >= mwl else 0 for i in range(L)]
    if arch == "mistral" and cfg.get("sliding_window") and kinds and all(k == 0 for k in kinds):
        kinds = [1] * L
    if kinds is not None and any(k == 1 for k in kinds):
        if not cfg.get("sliding_window"):
            raise ConvertError("sliding-window layers but no sliding_window in config.json")
        m["sliding_window"] = int(cfg["sliding_window"])
    if kinds is not None and any(kinds):
        m["layer_kinds"] = kinds

    # ---- NoPE layers (SmolLM3)
    if arch == "smollm3":
        nr = cfg.get("no_rope_layers")
        if nr is None and cfg.get("no_rope_layer_interval"):
            iv = int(cfg["no_rope_layer_interval"])
            nr = [0 if (i + 1) % iv == 0 else 1 for i in range(L)]
        if nr is not None:
            if len(nr) != L:
                raise ConvertError("no_rope_layers length differs from num_hidden_layers")
            m["layer_rope"] = [int(x) for x in nr]

    # ---- family specifics
    if arch in ("qwen3", "gemma3", "qwen3_5"):
        m["qk_norm"] = 1
    if arch in ("gemma2", "gemma3"):
        m["norm_unit_offset"] = 1
        m["norm_sandwich"] = 1
        m["embed_scale"] = math.sqrt(D)
        m["ffn_act"] = "gelu_tanh"
        qpas = cfg.get("query_pre_attn_scalar")
        if qpas:
            m["query_scale"] = float(qpas) ** -0.5
        if cfg.get("attn_logit_softcapping"):
            m["attn_softcap"] = float(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping"):
            m["final_softcap"] = float(cfg["final_logit_softcapping"])
    else:
        act = cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"
        if act not in ("silu", "swish"):
            raise ConvertError(f"unsupported hidden_act {act!r}")
    if arch == "qwen3_5":
        m["norm_unit_offset"] = 1
        m["attn_output_gate"] = 1
        for k, ck in (("linear_n_k_heads", "linear_num_key_heads"),
                      ("linear_n_v_heads", "linear_num_value_heads"),
                      ("linear_k_head_dim", "linear_key_head_dim"),
                      ("linear_v_head_dim", "linear_value_head_dim"),
                      ("linear_conv_kernel", "linear_conv_kernel_dim")):
            if cfg.get(ck) is not None:
                m[k] = int(cfg[ck])
    for k, ck in (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id")):
        v = cfg.get(ck)
        if isinstance(v, list):
            v = v[0] if v else None
        if isinstance(v, int):
            m[k] = v
    m["_tie"] = cfg.get("tie_word_embeddings")
    return arch, m


# --------------------------------------------------------------------------
# safetensors (own reader: handles BF16 without torch)

ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
             "F64": np.dtype("<f8")}


class SafeTensorsFile:
    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            hdr = f.read(8)
            if len(hdr) != 8:
                raise ConvertError(f"{path}: not a safetensors file")
            (n,) = struct.unpack("<Q", hdr)
            if n > size - 8 or n > 100 << 20:
                raise ConvertError(f"{path}: bad safetensors header")
            self.header = json.loads(f.read(n))
        self.base = 8 + n
        self.header.pop("__metadata__", None)
        self._mm = None

    def names(self):
        return self.header.keys()

    def shape(self, name):
        return tuple(self.header[name]["shape"])

    def load(self, name):
        info = self.header[name]
        dt = info["dtype"]
        if dt not in ST_DTYPES:
            raise ConvertError(f"{name}: unsupported safetensors dtype {dt}")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        a, b = info["data_offsets"]
        raw = self._mm[self.base + a:self.base + b].view(ST_DTYPES[dt])
        if dt == "BF16":
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw.astype(np.float32)
        return arr.reshape(info["shape"])


# --------------------------------------------------------------------------
# Sources.  Each returns (meta, tensors) where tensors is an ordered dict
# name -> (shape, loader) and loader() gives float32 in .mlb layout.

HF_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_o",
    "self_attn.q_proj.bias": "attn_q_bias",
    "self_attn.k_proj.bias": "attn_k_bias",
    "self_attn.v_proj.bias": "attn_v_bias",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
}
HF_LAYER_MAP_PLAIN = {"post_attention_layernorm.weight": "ffn_norm"}
HF_LAYER_MAP_SANDWICH = {
    "post_attention_layernorm.weight": "attn_post_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "ffn_post_norm",
}
# Qwen3.5 Gated DeltaNet tensors (docs/FORMAT.md, "Gated DeltaNet layers").
HF_LINEAR_PREFIX = "linear_attn."
HF_LINEAR_MAP = {
    "in_proj_qkv.weight": "ssm_qkv", "in_proj_z.weight": "ssm_z", "in_proj_b.weight": "ssm_b",
    "in_proj_a.weight": "ssm_a", "conv1d.weight": "ssm_conv", "A_log": "ssm_a_log",
    "dt_bias": "ssm_dt_bias", "norm.weight": "ssm_norm", "out_proj.weight": "ssm_out",
}


def load_hf(src):
    cfg_path = os.path.join(src, "config.json")
    if not os.path.exists(cfg_path):
        raise ConvertError(f"{src}: no config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    arch, meta = hf_meta(cfg)
    idx = os.path.join(src, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(p for p in os.listdir(src) if p.endswith(".safetensors"))
    if not files:
        raise ConvertError(f"{src}: no .safetensors files")
    where = {}
    for fn in files:
        st = SafeTensorsFile(os.path.join(src, fn))
        for n in st.names():
            where[n] = st
    prefix = None
    for p in ("model.language_model.", "model.", "language_model.model.", "model.text_model.", ""):
        if p + "embed_tokens.weight" in where:
            prefix = p
            break
    if prefix is None:
        raise ConvertError("missing tensor model.embed_tokens.weight")

    def src_t(name, transform=None):
        if name not in where:
            raise ConvertError(f"missing tensor {name}")
        st = where[name]

        def load():
            a = st.load(name)
            return transform(a) if transform else a
        return (st.shape(name), load)

    L = meta["n_layers"]
    sandwich = meta.get("norm_sandwich", 0) == 1
    tensors = {}
    tensors["token_embd"] = src_t(prefix + "embed_tokens.weight")
    lm = next((n for n in ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")
               if n in where), None)
    tie = meta.pop("_tie")
    if tie is None:
        tie = lm is None
    if not tie:
        if lm is None:
            raise ConvertError("missing tensor lm_head.weight")
        meta["tie_embeddings"] = 0
    else:
        meta["tie_embeddings"] = 1
    lmap = dict(HF_LAYER_MAP)
    lmap.update(HF_LAYER_MAP_SANDWICH if sandwich else HF_LAYER_MAP_PLAIN)
    kinds = meta.get("layer_kinds", [0] * L)
    for i in range(L):
        lp = f"{prefix}layers.{i}."
        present = {n[len(lp):] for n in where if n.startswith(lp)}
        required = ["input_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                    "mlp.down_proj.weight"]
        required += list(HF_LAYER_MAP_SANDWICH if sandwich else HF_LAYER_MAP_PLAIN)
        if kinds[i] == 2:
            required += [HF_LINEAR_PREFIX + k for k in HF_LINEAR_MAP]
        else:
            required += ["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                         "self_attn.v_proj.weight", "self_attn.o_proj.weight"]
            if meta.get("qk_norm"):
                required += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        for r in required:
            if r not in present:
                raise ConvertError(f"missing tensor {lp}{r}")
        for suffix in sorted(present, key=lambda s: (list(lmap).index(s) if s in lmap else 99, s)):
            if suffix in lmap:
                tensors[f"blk.{i}.{lmap[suffix]}"] = src_t(lp + suffix)
            elif suffix.startswith(HF_LINEAR_PREFIX) and arch == "qwen3_5":
                short = suffix[len(HF_LINEAR_PREFIX):]
                if short not in HF_LINEAR_MAP:
                    raise ConvertError(f"unexpected tensor {lp}{suffix} for arch {arch}")
                shape, load = src_t(lp + suffix)
                if short == "conv1d.weight":  # [C, 1, K] -> [C, K]
                    shape, load = (shape[0], shape[-1]), (lambda ld=load: ld().reshape(ld().shape[0], -1))
                tensors[f"blk.{i}.{HF_LINEAR_MAP[short]}"] = (shape, load)
            else:
                raise ConvertError(f"unexpected tensor {lp}{suffix} for arch {arch}")
    tensors["output_norm"] = src_t(prefix + "norm.weight")
    if not tie:
        tensors["output"] = src_t(lm)
    return meta, tensors


# ---- GGUF

GGUF_ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
              "gemma2": "gemma2", "gemma3": "gemma3", "smollm3": "smollm3"}
GGUF_LAYER_MAP = {
    "attn_norm": "attn_norm", "attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v",
    "attn_output": "attn_o", "attn_q_norm": "attn_q_norm", "attn_k_norm": "attn_k_norm",
    "ffn_norm": "ffn_norm", "ffn_gate": "ffn_gate", "ffn_up": "ffn_up", "ffn_down": "ffn_down",
    "post_attention_norm": "attn_post_norm", "post_ffw_norm": "ffn_post_norm",
}


def load_gguf(path):
    try:
        import gguf
    except ImportError:
        raise ConvertError("the `gguf` package is needed for GGUF input (pip install gguf)")
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001
        raise ConvertError(f"{path}: cannot read GGUF ({e})")

    def field(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return v

    ga = field("general.architecture")
    arch = GGUF_ARCHS.get(ga)
    if arch is None:
        raise ConvertError(f"unsupported architecture {ga!r}")

    def af(key, default=None, required=False):
        v = field(f"{ga}.{key}", default)
        if v is None and required:
            raise ConvertError(f"GGUF lacks {ga}.{key}")
        return v

    tinfo = {t.name: t for t in r.tensors}
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
        "rope_style": "half",
    }
    rd = af("rope.dimension_count")
    if rd is not None and int(rd) != hd:
        meta["rope_dim"] = int(rd)
    st = af("rope.scaling.type")
    if st in ("linear",) and af("rope.scaling.factor"):
        meta["rope_scaling"] = "linear"
        meta["rope_scaling_factor"] = float(af("rope.scaling.factor"))
    if "rope_freqs.weight" in tinfo:
        # llama3 scaling is baked into a rope_freqs tensor by llama.cpp; the
        # original factors are not stored, so refuse rather than guess.
        raise ConvertError("GGUF with rope_freqs (llama3 rope scaling) is not supported yet")
    for k, gk in (("bos_id", "tokenizer.ggml.bos_token_id"), ("eos_id", "tokenizer.ggml.eos_token_id")):
        v = field(gk)
        if v is not None:
            meta[k] = int(v)
    if arch in ("qwen3", "gemma3"):
        meta["qk_norm"] = 1
    gemma = arch in ("gemma2", "gemma3")
    if gemma:
        meta.update(norm_unit_offset=1, norm_sandwich=1, embed_scale=math.sqrt(D), ffn_act="gelu_tanh")
        sw = af("attention.sliding_window")
        if sw:
            meta["sliding_window"] = int(sw)
        if arch == "gemma2":
            meta["layer_kinds"] = [1 if i % 2 == 0 else 0 for i in range(L)]
            if af("attn_logit_softcapping"):
                meta["attn_softcap"] = float(af("attn_logit_softcapping"))
            if af("final_logit_softcapping"):
                meta["final_softcap"] = float(af("final_logit_softcapping"))
        else:
            meta["layer_kinds"] = [0 if (i + 1) % 6 == 0 else 1 for i in range(L)]
            meta["rope_local_theta"] = 10000.0  # llama.cpp hard-codes it for gemma3
        meta["query_scale"] = float(hd) ** -0.5  # llama.cpp: query_pre_attn_scalar = head_dim
    if arch == "mistral" and af("attention.sliding_window"):
        meta["sliding_window"] = int(af("attention.sliding_window"))
        meta["layer_kinds"] = [1] * L
    meta["tie_embeddings"] = 0 if "output.weight" in tinfo else 1

    def gt(gname, transform=None):
        if gname not in tinfo:
            raise ConvertError(f"missing tensor {gname}")
        t = tinfo[gname]
        shape = tuple(int(x) for x in reversed(list(t.shape)))

        def load():
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            a = np.asarray(a, dtype=np.float32).reshape(shape)
            return transform(a) if transform else a
        return (shape, load)

    def minus_one(a):
        return a - 1.0

    norm_tf = minus_one if gemma else None
    perm = arch in ("llama", "mistral")  # llama.cpp permutes q/k only for LlamaModel
    tensors = {"token_embd": gt("token_embd.weight")}
    for i in range(L):
        names = {n[len(f"blk.{i}."):] for n in tinfo if n.startswith(f"blk.{i}.")}
        required = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                    "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                    "ffn_down.weight"]
        if gemma:
            required += ["post_attention_norm.weight", "post_ffw_norm.weight"]
        for rq in required:
            if rq not in names:
                raise ConvertError(f"missing tensor blk.{i}.{rq}")
        for n in sorted(names):
            base, _, kind = n.rpartition(".")
            if base not in GGUF_LAYER_MAP or kind not in ("weight", "bias"):
                raise ConvertError(f"unexpected tensor blk.{i}.{n} for arch {ga}")
            out = GGUF_LAYER_MAP[base] + ("_bias" if kind == "bias" else "")
            tf = None
            if base.endswith("norm"):
                tf = norm_tf
            elif perm and base == "attn_q":
                tf = (lambda a: unpermute_interleaved(a, H))
            elif perm and base == "attn_k":
                tf = (lambda a: unpermute_interleaved(a, Hkv))
            tensors[f"blk.{i}.{out}"] = gt(f"blk.{i}.{n}", tf)
    tensors["output_norm"] = gt("output_norm.weight", norm_tf)
    if not meta["tie_embeddings"]:
        tensors["output"] = gt("output.weight")
    return meta, tensors


# ---- llama2.c

LLAMA2C_MAGIC = 0x616B3432


def load_llama2c(path):
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
    meta = {
        "arch": "llama2c", "vocab_size": V, "hidden_size": dim, "n_layers": L, "n_heads": H,
        "n_kv_heads": Hkv, "head_dim": hd, "ffn_dim": hidden, "context_length": seq,
        "norm_eps": 1e-5, "rope_theta": 10000.0, "rope_style": "half",
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


def load_source(src):
    if os.path.isdir(src):
        return load_hf(src)
    if not os.path.exists(src):
        raise ConvertError(f"{src}: no such file or directory")
    with open(src, "rb") as f:
        head = f.read(4)
    if head == b"GGUF":
        return load_gguf(src)
    if src.endswith(".bin") or len(head) == 4:
        return load_llama2c(src)
    raise ConvertError(f"{src}: unrecognised input")


# --------------------------------------------------------------------------
# type selection

# Tensor kinds kept in Q8_0 by --type q4_mixed (chosen by measurement; see
# docs/QUANT.md).  Matched against the tensor name with the `blk.N.` removed.
Q4_MIXED_Q8 = ("token_embd", "output", "attn_v", "ffn_down")
# Kinds kept in Q8_0 by plain --type q4_0 (see docs/QUANT.md).
Q4_0_Q8 = ("token_embd", "output")


def kind_of(name):
    return re.sub(r"^blk\.\d+\.", "", name)


def choose_type(name, shape, qtype, scale_type, q8_kinds=None):
    """-> mlb tensor type for one tensor."""
    if len(shape) != 2 or kind_of(name).endswith(("norm", "bias")) or kind_of(name) == "ssm_conv":
        return mlb.F32
    if qtype == "f32":
        return mlb.F32
    if qtype == "f16":
        return mlb.F16
    if shape[-1] % mlb.QK:
        return mlb.F16
    q8 = mlb.Q8_0 if scale_type == "f16" else mlb.Q8_0_F32
    q4 = mlb.Q4_0 if scale_type == "f16" else mlb.Q4_0_F32
    if qtype == "q8_0":
        return q8
    if q8_kinds is None:
        q8_kinds = Q4_MIXED_Q8 if qtype == "q4_mixed" else Q4_0_Q8
    if kind_of(name) in q8_kinds:
        return q8
    return q4


# --------------------------------------------------------------------------

def load_imatrix(path):
    """npz of .mlb tensor name -> per-column mean squared activation
    (tools/q4_experiment.py imatrix)."""
    try:
        with np.load(path) as z:
            return {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
    except (OSError, ValueError) as e:
        raise ConvertError(f"{path}: cannot read importance matrix ({e})")


def convert(src, out, qtype="q8_0", q4_scale="fit", scale_type="f16", log=sys.stderr, imatrix=None):
    imat = load_imatrix(imatrix) if imatrix else {}
    meta, tensors = load_source(src)
    meta = {k: v for k, v in meta.items() if not k.startswith("_")}
    meta["convert_type"] = qtype
    if qtype in ("q4_0", "q4_mixed"):
        meta["convert_q4_scale"] = q4_scale + ("+imatrix" if imat and q4_scale == "fit" else "")
    for name, (shape, _) in tensors.items():
        if len(shape) == 0 or len(shape) > 4:
            raise ConvertError(f"{name}: unsupported rank {len(shape)}")
    _check_shapes(meta, tensors)
    plan = []
    n = len(tensors)
    for name, (shape, loader) in tensors.items():
        tt = choose_type(name, shape, qtype, scale_type)

        cw = imat.get(name) if tt in (mlb.Q4_0, mlb.Q4_0_F32) and q4_scale == "fit" else None
        if cw is not None and cw.shape != (shape[-1],):
            raise ConvertError(f"importance matrix entry {name} has shape {list(cw.shape)}, expected [{shape[-1]}]")

        def producer(loader=loader, tt=tt, shape=shape, name=name, cw=cw):
            a = loader()
            if tuple(a.shape) != tuple(shape):
                raise ConvertError(f"{name}: loaded shape {a.shape} != {shape}")
            return mlb.encode(a, tt, q4_scale, cw)
        plan.append((name, tt, list(shape), producer))

    def progress(i, name, tt, shape):
        print(f"[{i + 1:4d}/{n}] {name:<24s} {mlb.TYPE_NAMES[tt]:<8s} {list(shape)}", file=log, flush=True)

    tmp = out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            mlb.write_mlb(f, meta, plan, progress)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _check_shapes(meta, tensors):
    D, V, F = meta["hidden_size"], meta["vocab_size"], meta["ffn_dim"]
    H, Hkv, hd = meta["n_heads"], meta["n_kv_heads"], meta["head_dim"]
    qrows = H * hd * (2 if meta.get("attn_output_gate") else 1)
    expect = {"token_embd": (V, D), "output": (V, D), "output_norm": (D,),
              "attn_norm": (D,), "ffn_norm": (D,), "attn_post_norm": (D,), "ffn_post_norm": (D,),
              "attn_q": (qrows, D), "attn_k": (Hkv * hd, D), "attn_v": (Hkv * hd, D),
              "attn_o": (D, H * hd), "attn_q_norm": (hd,), "attn_k_norm": (hd,),
              "attn_q_bias": (qrows,), "attn_k_bias": (Hkv * hd,), "attn_v_bias": (Hkv * hd,),
              "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F)}
    if H % Hkv:
        raise ConvertError(f"n_heads {H} not a multiple of n_kv_heads {Hkv}")
    for name, (shape, _) in tensors.items():
        k = kind_of(name)
        if k in expect and tuple(shape) != expect[k]:
            raise ConvertError(f"{name}: shape {list(shape)}, expected {list(expect[k])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--type", default="q8_0", choices=["q8_0", "q4_0", "q4_mixed", "f32", "f16"])
    ap.add_argument("--q4-scale", default="fit", choices=["fit", "max"])
    ap.add_argument("--scale-type", default="f16", choices=["f16", "f32"])
    ap.add_argument("--imatrix", help="importance matrix (.npz from tools/q4_experiment.py imatrix) "
                    "weighting the Q4 fit per input column")
    a = ap.parse_args(argv)
    try:
        convert(a.src, a.output, a.type, a.q4_scale, a.scale_type, imatrix=a.imatrix)
    except (ConvertError, mlb.MlbError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
