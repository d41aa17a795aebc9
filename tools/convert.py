#!/usr/bin/env python3
"""Convert a model to Krafla's .mlb format (docs/FORMAT.md).

    python3 tools/convert.py SRC -o OUT.mlb --type {q8_0,q4_0,q4_mixed,q4_k_m,auto,f32,f16}
                             [--q4-scale {fit,max}] [--k-rule {search,minmax}] [--scale-type {f16,f32}]
                             [--imatrix FILE] [--mixed-budget PERCENT] [--requantize] [--layout {rows8,rows}]

SRC is one of
  * a Hugging Face directory (config.json + *.safetensors, sharded or not),
  * a .gguf file (any tensor type the `gguf` package can dequantise),
  * a llama2.c checkpoint (.bin: legacy v0, v1 fp32 or v2 Q8_0).

Weights are loaded as float32 ([out, in]) and re-encoded; see docs/QUANT.md
for the quantisation choices. From a GGUF file, tensors of the types Krafla
reads as they are (F32, F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) keep their bytes
and llama.cpp's layout conventions are kept (source_gguf.py); `--type auto`
converts the other types by their width.  `--type q4_k_m` makes llama.cpp's
Q4_K_M mix of Q4_K and Q6_K (rows not a multiple of 256: Q8_0) from the
float weights; from a GGUF file it keeps the tensors already in a quantised
type Krafla reads (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) and quantises the rest
(F32/F16/BF16 included).  `--requantize` keeps nothing: every tensor is
quantised from its dequantised values.  `--layout rows8` (the default)
stores Q8_0, Q4_0, Q4_K and Q6_K matrices in the eight-row groups the
kernels read (docs/FORMAT.md, "Tensor layouts"), as `ml_run --save` does;
`--layout rows` writes plain rows only (a version 1 file).  Q4_0 is the
fitted rule, weighted by `--imatrix FILE` when given: the executables
measure one when they load a GGUF file as Q4_0 (`ml_run MODEL --imatrix-out
FILE` writes it), so with it this converter writes their `--save` bytes;
without one the fit is unweighted (docs/QUANT.md: worse).  `--type
q4_mixed` keeps in Q8_0 the matrices most sensitive per byte within
`--mixed-budget` (mixed.rs's rule).  Errors the user can fix
(unsupported architecture, missing tensor, bad file) print one line and
exit with status 2, leaving no output or temp file behind.
"""
import argparse
import os
import pathlib
import re
import struct
import sys

import numpy as np

import mlb
from source_common import ConvertError
from source_gguf import load_gguf
from source_hf import load_hf
from source_llama2c import load_llama2c


def load_source(src):
    """SRC (HF directory, .gguf or llama2.c .bin) -> (meta, tensors) (see source_common)."""
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

# Kinds kept in Q8_0 by --type q4_0, q4_mixed and auto (see docs/QUANT.md).
# Matched against the tensor name with the `blk.N.` removed.
Q4_0_Q8 = ("token_embd", "output")
# --type q4_mixed (shared/src/import/mixed.rs, the same rule): kind -> its measured
# share of the output error, and the default budget (extra bytes of the Q8_0
# matrices, as a share of the q4_0 model's weight bytes).
KIND_SHARE = {"attn_q": 0.034, "attn_k": 0.051, "attn_v": 0.233, "attn_o": 0.078,
              "ffn_gate": 0.129, "ffn_up": 0.205, "ffn_down": 0.270}
MIXED_BUDGET = 0.15

# GGUF tensor types stored as they are (Krafla's block layouts are llama.cpp's),
# and, for --type auto, the types converted to Q8_0 (5 bits a weight or more)
# and to fitted Q4_0 (4 or fewer). The executables load GGUF files by the same
# rule (shared/src/import/), so `ml_run MODEL.gguf --save OUT.mlb` writes the
# same bytes as this converter.
GGUF_KEPT = {"F32": mlb.F32, "F16": mlb.F16, "Q8_0": mlb.Q8_0, "Q4_0": mlb.Q4_0,
             "Q4_K": mlb.Q4_K, "Q5_K": mlb.Q5_K, "Q6_K": mlb.Q6_K}
GGUF_AUTO_Q8 = ("Q5_0", "Q5_1", "Q8_K")


def kind_of(name):
    return re.sub(r"^blk\.\d+\.", "", name)


# --type q4_k_m: llama.cpp's Q4_K_M recipe (llama_tensor_get_type). Q4_K by
# default; Q6_K for the LM head (`output`, or `token_embd` when it is tied)
# and for attn_v / ffn_down in the "more bits" layers: the first and last
# eighth of them and every third one between. Counted per kind (the i-th
# attn_v of n), as llama.cpp counts them.
K_QUANT_KEPT = ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_types(names):
    """Tensor names (in file order) -> {name: Q4_K or Q6_K} before the row-length
    fallback (choose_type), for the 2-D weights llama.cpp's recipe names."""
    out = {}
    tied = "output" not in names
    for kind in ("attn_v", "ffn_down"):
        layers = sorted((int(re.match(r"blk\.(\d+)\.", n).group(1)), n)
                        for n in names if n.startswith("blk.") and kind_of(n) == kind)
        for i, (_, n) in enumerate(layers):
            out[n] = mlb.Q6_K if use_more_bits(i, len(layers)) else mlb.Q4_K
    for n in names:
        if n == "output" or (n == "token_embd" and tied):
            out[n] = mlb.Q6_K
        out.setdefault(n, mlb.Q4_K)
    return out


def choose_type(name, shape, qtype, scale_type, q8_kinds=None, source=None, k_type=None):
    """-> mlb tensor type for one tensor; `source` is its GGUF type name, if any;
    `k_type` its q4_k_m_types entry (--type q4_k_m)."""
    if len(shape) != 2 or kind_of(name).endswith(("norm", "bias")) or kind_of(name) == "ssm_conv":
        return mlb.F32
    if qtype == "f32":
        return mlb.F32
    if qtype == "f16":
        return mlb.F16
    q8 = mlb.Q8_0 if scale_type == "f16" else mlb.Q8_0_F32
    q4 = mlb.Q4_0 if scale_type == "f16" else mlb.Q4_0_F32
    if qtype == "q4_k_m":
        if source in K_QUANT_KEPT:
            return GGUF_KEPT[source]
        if shape[-1] % mlb.QK:
            return mlb.F16
        if shape[-1] % mlb.QK_K:  # llama.cpp falls back to Q5_0 / Q8_0; Krafla: Q8_0
            return q8
        return k_type if k_type is not None else mlb.Q4_K
    if source in GGUF_KEPT:
        return GGUF_KEPT[source]
    if source == "BF16":
        return mlb.F32  # exact
    if shape[-1] % mlb.QK:
        return mlb.F16
    if qtype == "q8_0":
        return q8
    if kind_of(name) in (Q4_0_Q8 if q8_kinds is None else q8_kinds):
        return q8
    if qtype == "auto" and source in GGUF_AUTO_Q8:
        return q8
    return q4


# --------------------------------------------------------------------------

IMATRIX_MAGIC = b"KRAFLA-IMATRIX-1\n"


def load_imatrix(path):
    """.mlb tensor name -> per-column mean squared activation: the executables'
    file (`ml_run MODEL --imatrix-out FILE`, shared/src/import/imatrix.rs) or an
    npz (tools/q4_experiment.py imatrix)."""
    try:
        raw = pathlib.Path(path).read_bytes()
        if not raw.startswith(IMATRIX_MAGIC):
            with np.load(path) as z:
                return {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
        out, at = {}, len(IMATRIX_MAGIC)
        (n,) = struct.unpack_from("<I", raw, at)
        at += 4
        for _ in range(n):
            (ln,) = struct.unpack_from("<I", raw, at)
            name = raw[at + 4:at + 4 + ln].decode()
            _rows, cols = struct.unpack_from("<QI", raw, at + 4 + ln)
            at += 4 + ln + 12
            w = np.frombuffer(raw, "<f4", cols, at)
            at += 4 * cols
            if not np.all(np.isfinite(w)) or np.any(w < 0):
                raise ValueError(f"{name!r} has a negative or non-finite weight")
            out[name] = w.astype(np.float32)
        if at != len(raw):
            raise ValueError("trailing bytes")
        return out
    except (OSError, ValueError, UnicodeDecodeError, struct.error) as e:
        raise ConvertError(f"{path}: cannot read importance matrix ({e})") from e


def choose_q8(candidates, budget):
    """q4_mixed: indices of the candidates (kind, relative Q4 error, extra bytes in Q8_0) that
    go to Q8_0 within `budget` extra bytes: the kind's measured share of the output error spread
    over its matrices by their errors, per extra byte, best first (mixed.rs's `choose_q8`)."""
    def kind_total(kind):
        t = 0.0
        for k, e, _ in candidates:
            if k == kind:
                t += e
        return t

    order = []
    for i, (kind, err, extra) in enumerate(candidates):
        total = kind_total(kind)
        score = KIND_SHARE.get(kind, 0.05) * err / total if total > 0 else 0.0
        order.append((-(score / max(extra, 1)), i))
    spent, chosen = 0, []
    for neg, i in sorted(order):
        extra = candidates[i][2]
        if -neg > 0 and spent + extra <= budget:
            spent += extra
            chosen.append(i)
    return sorted(chosen)


def q4_relative_error(a, q4_scale, col_weights):
    """sum w (x - x')^2 / sum w x^2 of a tensor's Q4_0 blocks x' (w: column importance or 1)."""
    raw = mlb.encode(a, mlb.Q4_0, q4_scale, col_weights)  # a GGUF matrix: dequantised in the workers
    x = np.asarray(a, dtype=np.float32).reshape(-1, a.shape[-1])
    y = mlb.decode(raw, mlb.Q4_0, x.shape)
    w = np.ones(x.shape[-1]) if col_weights is None else col_weights.astype(np.float64)
    d = x.astype(np.float64) - y.astype(np.float64)
    err = float((d * d * w).sum())
    sig = float((x.astype(np.float64) ** 2 * w).sum())
    return err / sig if sig > 0 and np.isfinite(err) else 0.0


def convert(src, out, qtype="q8_0", q4_scale="fit", scale_type="f16", log=sys.stderr, imatrix=None,
            k_rule=None, requantize=False, layout="rows8", mixed_budget=MIXED_BUDGET):
    imat = load_imatrix(imatrix) if imatrix else {}
    meta, tensors = load_source(src)
    gguf_source = any(len(t) > 2 for t in tensors.values())
    if qtype == "auto" and requantize:
        raise ConvertError("--type auto chooses by the GGUF tensor types: it cannot --requantize them")
    if qtype == "auto" and not gguf_source:
        raise ConvertError("--type auto chooses by the GGUF tensor types: it needs a .gguf source")
    meta = {k: v for k, v in meta.items() if not k.startswith("_")}
    meta["convert_type"] = qtype
    if qtype in ("q4_0", "q4_mixed", "auto"):
        meta["convert_q4_scale"] = q4_scale + ("+imatrix" if imat and q4_scale == "fit" else "")
    k_rule = k_rule or mlb.K_RULE
    if qtype == "q4_k_m":
        meta["convert_k_rule"] = k_rule
    k_types = q4_k_m_types(list(tensors)) if qtype == "q4_k_m" else {}
    for name, (shape, *_) in tensors.items():
        if len(shape) == 0 or len(shape) > 4:
            raise ConvertError(f"{name}: unsupported rank {len(shape)}")
    _check_shapes(meta, tensors)
    plan = []
    n = len(tensors)
    types = {}
    for name, (shape, _loader, *source) in tensors.items():
        source_type = source[0] if source and not requantize else None
        types[name] = choose_type(name, shape, qtype, scale_type, source=source_type, k_type=k_types.get(name))
    if qtype == "q4_mixed":
        q4 = mlb.Q4_0 if scale_type == "f16" else mlb.Q4_0_F32
        q8 = mlb.Q8_0 if scale_type == "f16" else mlb.Q8_0_F32
        total = sum(mlb.tensor_nbytes(tt, tensors[nm][0]) for nm, tt in types.items() if tt != mlb.F32)
        names = [nm for nm, tt in types.items() if tt == q4]
        cands = [(kind_of(nm), q4_relative_error(tensors[nm][1](), q4_scale, imat.get(nm)),
                  mlb.tensor_nbytes(q8, tensors[nm][0]) - mlb.tensor_nbytes(q4, tensors[nm][0])) for nm in names]
        for i in choose_q8(cands, int(total * mixed_budget)):
            types[names[i]] = q8
    for name, (shape, loader, *source) in tensors.items():
        source_type, raw = source if source and not requantize else (None, None)
        tt = types[name]
        kept = source_type in GGUF_KEPT and GGUF_KEPT[source_type] == tt

        cw = imat.get(name) if tt in (mlb.Q4_0, mlb.Q4_0_F32) and not kept else None
        if cw is not None and cw.shape != (shape[-1],):
            raise ConvertError(f"importance matrix entry {name} has shape {list(cw.shape)}, expected [{shape[-1]}]")
        if imat and cw is None and tt in (mlb.Q4_0, mlb.Q4_0_F32) and not kept:
            raise ConvertError(f"the importance matrix has no entry for {name} (made for another model?)")
        if q4_scale != "fit":
            cw = None

        def producer(loader=loader, tt=tt, shape=shape, name=name, cw=cw, raw=raw if kept else None):
            if raw is not None:
                return raw()
            a = loader()
            if tuple(a.shape) != tuple(shape):
                raise ConvertError(f"{name}: loaded shape {a.shape} != {shape}")
            if tt in mlb.K_BLOCK_BYTES:
                return mlb.encode_k(a, tt, k_rule)
            return mlb.encode(a, tt, q4_scale, cw)
        plan.append((name, tt, list(shape), producer))

    def progress(i, name, tt, shape):
        print(f"[{i + 1:4d}/{n}] {name:<24s} {mlb.TYPE_NAMES[tt]:<8s} {list(shape)}", file=log, flush=True)

    tmp = out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            mlb.write_mlb(f, meta, plan, progress, rows8=layout == "rows8")
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
    for name, (shape, *_) in tensors.items():
        k = kind_of(name)
        if k in expect and tuple(shape) != expect[k]:
            raise ConvertError(f"{name}: shape {list(shape)}, expected {list(expect[k])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--type", default="q8_0", choices=["q8_0", "q4_0", "q4_mixed", "q4_k_m", "auto", "f32", "f16"],
                    help="auto (GGUF sources): 5-bit and wider types to Q8_0, 4-bit and narrower to Q4_0; "
                    "q4_k_m: llama.cpp's Q4_K_M mix of Q4_K and Q6_K")
    ap.add_argument("--q4-scale", default="fit", choices=["fit", "max"])
    ap.add_argument("--k-rule", default=mlb.K_RULE, choices=list(mlb.K_RULES),
                    help="how --type q4_k_m picks the K-quant sub-block scales (docs/QUANT.md)")
    ap.add_argument("--scale-type", default="f16", choices=["f16", "f32"])
    ap.add_argument("--mixed-budget", type=float, default=MIXED_BUDGET * 100, metavar="PERCENT",
                    help="--type q4_mixed: extra bytes of its Q8_0 matrices, in percent of the q4_0 weights")
    ap.add_argument("--imatrix", help="importance matrix weighting the Q4 fit per input column "
                    "(`ml_run MODEL --imatrix-out FILE`, or an .npz from tools/q4_experiment.py imatrix)")
    ap.add_argument("--requantize", action="store_true",
                    help="GGUF sources: keep no tensor as it is; quantise each from its dequantised floats")
    ap.add_argument("--layout", default="rows8", choices=["rows8", "rows"],
                    help="rows8: Q8_0/Q4_0/Q4_K/Q6_K matrices in the eight-row groups the kernels read, used in "
                    "place at load; rows: plain rows only (docs/FORMAT.md)")
    a = ap.parse_args(argv)
    try:
        convert(a.src, a.output, a.type, a.q4_scale, a.scale_type, imatrix=a.imatrix, k_rule=a.k_rule,
                mixed_budget=a.mixed_budget / 100,
                requantize=a.requantize, layout=a.layout)
    except (ConvertError, mlb.MlbError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
