"""Hugging Face source for tools/convert.py: a directory with config.json and
*.safetensors (sharded or not; F32, F16, BF16 or F64, read without torch).

hf_meta turns config.json (transformers v4 `rope_theta` + `rope_scaling` or v5
`rope_parameters`; a multimodal `text_config` wrapper is unwrapped) into .mlb
metadata; load_hf maps the tensors to .mlb names.  Family knowledge comes from
families.py.
"""
import json
import os
import struct

import numpy as np

import families
from source_common import ConvertError

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
    fam = families.from_hf(mt, cfg.get("architectures"))
    if fam is None:
        name = mt or ",".join(cfg.get("architectures") or []) or "unknown"
        raise ConvertError(f"unsupported architecture {name!r}")
    arch = fam.arch

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

    # ---- layer kinds / sliding window: the config's own list, else the family's pattern
    kinds = None
    window = cfg.get("sliding_window")
    if fam.layers == "window_from" and not cfg.get("use_sliding_window"):
        window = None  # Qwen2 configs carry a sliding_window they do not use
    if cfg.get("layer_types"):
        lt = cfg["layer_types"]
        if len(lt) != L:
            raise ConvertError("layer_types length differs from num_hidden_layers")
        try:
            kinds = [LAYER_KIND[t] for t in lt]
        except KeyError as e:
            raise ConvertError(f"unsupported layer type {e.args[0]!r}") from None
        if fam.layers == "window" and window and not any(kinds):
            kinds = fam.layer_kinds(L, window)  # Mistral slides everywhere, whatever layer_types says
    else:
        kinds = fam.layer_kinds(L, window, period=cfg.get("sliding_window_pattern") or
                                cfg.get("_sliding_window_pattern") or None,
                                window_from=cfg.get("max_window_layers"))
    if kinds is not None and any(k == families.SLIDING for k in kinds):
        if not cfg.get("sliding_window"):
            raise ConvertError("sliding-window layers but no sliding_window in config.json")
        m["sliding_window"] = int(cfg["sliding_window"])
    if kinds is not None and any(kinds):
        m["layer_kinds"] = kinds

    # ---- NoPE layers (SmolLM3)
    if fam.nope_layers:
        nr = cfg.get("no_rope_layers")
        if nr is None and cfg.get("no_rope_layer_interval"):
            iv = int(cfg["no_rope_layer_interval"])
            nr = [0 if (i + 1) % iv == 0 else 1 for i in range(L)]
        if nr is not None:
            if len(nr) != L:
                raise ConvertError("no_rope_layers length differs from num_hidden_layers")
            m["layer_rope"] = [int(x) for x in nr]

    # ---- family traits, then what the config says within the family
    m.update(fam.traits(D))
    if fam.gemma:
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
    if fam.linear_attention:
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
# tensors

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
    """A Hugging Face directory -> (meta, tensors) (see source_common)."""
    cfg_path = os.path.join(src, "config.json")
    if not os.path.exists(cfg_path):
        raise ConvertError(f"{src}: no config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    arch, meta = hf_meta(cfg)
    fam = families.FAMILIES[arch]
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
            elif suffix.startswith(HF_LINEAR_PREFIX) and fam.linear_attention:
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
