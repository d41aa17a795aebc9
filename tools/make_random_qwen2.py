#!/usr/bin/env python3
"""Random-weight GGUF at Qwen2.5-1.5B-Instruct's shapes (or Qwen2.5-7B's, 7.6B
parameters, with --shape 7b), for speed measurements.

    python3 tools/make_random_qwen2.py [-o model-f16.gguf] [--shape 1.5b|7b] [--tokenizer DIR] [--seed 0]
    llama-quantize model-f16.gguf qwen2.5-1.5b-random-Q4_K_M.gguf Q4_K_M
    python3 tools/make_random_qwen2.py --shape 7b --q4km -o qwen2.5-7b-random-Q4_K_M.gguf

--q4km writes Q4_K_M's types directly, random codes and scales as
tools/make_random_moe.py does (Q6_K for the output head, the tied
embedding at 1.5B, and for attn_v and ffn_down where llama-quantize puts it): the 7B file is 4.7 GB and takes
a minute, with no 15 GB F16 file and no quantisation.

(docs/PERFORMANCE.md#gguf-files-beside-llamacpp times this file; tools/bench_llamacpp.sh
builds llama-quantize).

Matrices F16 (std 0.02), norms F32 (1.0), q/k/v biases F32 (std 0.002),
tied embeddings (no output.weight) at 1.5B, an output.weight of its own at 7B
(as the real models). Tensors are made and written one at a time, so the
7B file (15 GB) needs no more memory than its largest matrix. Metadata as convert_hf_to_gguf.py writes for
Qwen2ForCausalLM. Tokenizer: SmolLM2's byte-level BPE (gpt2 / pre "smollm"),
padded with "<|pad_N|>" control tokens up to Qwen2.5's 151936 rows.
Needs: pip install gguf numpy
"""
import argparse
import json
from pathlib import Path

import gguf
import numpy as np

ARCH = "qwen2"
# vocabulary rows, embedding, layers, heads, KV heads, feed-forward, tied embeddings
SHAPES = {
    "1.5b": dict(vocab=151936, embd=1536, layers=28, heads=12, heads_kv=2, ff=8960, tied=True),
    "7b": dict(vocab=152064, embd=3584, layers=28, heads=28, heads_kv=4, ff=18944, tied=False),
}
HEAD_DIM = 128
N_CTX = 32768
ROPE_THETA = 1000000.0
RMS_EPS = 1e-6


def add_hparams(w, layers, ctx, embd, ff, heads, heads_kv, rope_theta, rms_eps):
    """The hyperparameters every text model's GGUF has, as TextModel.set_gguf_parameters writes them."""
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads_kv)
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(rms_eps)


def add_tokenizer(w, tokdir, n_vocab):
    """SmolLM2's byte-level BPE as convert_hf_to_gguf.py's _set_vocab_gpt2 writes it, padded with
    "<|pad_N|>" control tokens up to `n_vocab` rows."""
    tj = json.loads((tokdir / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    n_base = max(vocab.values()) + 1
    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    n_base = max(n_base, max(added) + 1 if added else 0)
    rev = {i: s for s, i in vocab.items()}
    for i, t in added.items():
        rev[i] = t["content"]
    tokens, types = [], []
    for i in range(n_base):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(rev[i])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
    for i in range(n_base, n_vocab):
        tokens.append(f"<|pad_{i}|>")
        types.append(gguf.TokenType.CONTROL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # merges, bos/eos/unk/pad ids, chat template from tokenizer(_config).json
    special = gguf.SpecialVocab(tokdir, load_merges=True, n_vocab=n_vocab)
    special.add_to_gguf(w)


Q4_K, Q6_K, F32 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.F32
F16 = gguf.GGMLQuantizationType.F16


def more_bits(layer, n_layers):
    """llama-quantize's use_more_bits: the layers Q4_K_M gives Q6_K for attn_v and ffn_down."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def blocks(rng, qtype, shape):
    """Random blocks of `qtype` for a tensor of `shape` (rows first, the last a multiple of 256),
    as the uint8 array GGUFWriter takes."""
    rows = int(np.prod(shape[:-1]))
    nb = rows * shape[-1] // 256
    if qtype == Q4_K:  # d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit codes
        b = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
        b[:, 0:2] = np.frombuffer(np.float16(6e-5).tobytes(), np.uint8)
        b[:, 2:4] = np.frombuffer(np.float16(4e-5).tobytes(), np.uint8)
    else:  # Q6_K: 128 bytes low bits, 64 high bits, 16 int8 scales, d (f16)
        b = rng.integers(0, 256, size=(nb, 210), dtype=np.uint8)
        b[:, 192:208] = rng.integers(-40, 40, size=(nb, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = np.frombuffer(np.float16(3e-5).tobytes(), np.uint8)
    return b.reshape(*shape[:-1], shape[-1] // 256 * b.shape[1])


def add_block_info(w, name, shape, qtype):
    """The table entry of a tensor of `shape` (rows first) stored as `qtype` blocks of 256 weights."""
    byte_shape = (*shape[:-1], shape[-1] // 256 * gguf.GGML_QUANT_SIZES[qtype][1])
    w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="model-f16.gguf")
    ap.add_argument("--tokenizer", default=str(Path(__file__).resolve().parents[2] / "shared" / "fixtures" /
                                               "tokenizers" / "smollm2"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    ap.add_argument("--q4km", action="store_true", help="Q4_K_M's types, random blocks")
    args = ap.parse_args()
    sh = SHAPES[args.shape]
    rng = np.random.default_rng(args.seed)
    tokdir = Path(args.tokenizer)

    w = gguf.GGUFWriter(args.out, ARCH)
    # general.* as the converter writes them (subset)
    w.add_type("model")
    w.add_name(f"Qwen2.5 {args.shape.upper()} Instruct (random weights)")
    w.add_size_label(args.shape.upper())
    w.add_finetune("Instruct")
    w.add_basename("Qwen2.5")
    # hparams (TextModel.set_gguf_parameters for Qwen2ForCausalLM)
    add_hparams(w, sh["layers"], N_CTX, sh["embd"], sh["ff"], sh["heads"], sh["heads_kv"], ROPE_THETA, RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if args.q4km else gguf.LlamaFileType.MOSTLY_F16)

    add_tokenizer(w, tokdir, sh["vocab"])

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    def bias(n):
        return rng.standard_normal(n, dtype=np.float32) * 0.002

    # (name, shape, make, type): listed first, made and written one by one. Matrices are F16, or
    # with --q4km Q4_K but where llama-quantize's Q4_K_M puts Q6_K: the output head (the tied
    # embedding when there is no output.weight), attn_v and ffn_down of the more_bits layers
    embd, ff, q, n_kv = sh["embd"], sh["ff"], sh["heads"] * HEAD_DIM, sh["heads_kv"] * HEAD_DIM

    def matrix(more_bits_here=False):
        return mat, ((Q6_K if more_bits_here else Q4_K) if args.q4km else F16)

    tensors = [("token_embd.weight", (sh["vocab"], embd), *matrix(sh["tied"])),
               ("output_norm.weight", (embd,), ones, F32)]
    if not sh["tied"]:
        tensors.append(("output.weight", (sh["vocab"], embd), *matrix(True)))
    for b in range(sh["layers"]):
        p, more = f"blk.{b}.", more_bits(b, sh["layers"])
        tensors += [
            (p + "attn_norm.weight", (embd,), ones, F32),
            (p + "attn_q.weight", (q, embd), *matrix()),
            (p + "attn_q.bias", (q,), bias, F32),
            (p + "attn_k.weight", (n_kv, embd), *matrix()),
            (p + "attn_k.bias", (n_kv,), bias, F32),
            (p + "attn_v.weight", (n_kv, embd), *matrix(more)),
            (p + "attn_v.bias", (n_kv,), bias, F32),
            (p + "attn_output.weight", (embd, q), *matrix()),
            (p + "ffn_norm.weight", (embd,), ones, F32),
            (p + "ffn_gate.weight", (ff, embd), *matrix()),
            (p + "ffn_up.weight", (ff, embd), *matrix()),
            (p + "ffn_down.weight", (embd, ff), *matrix(more)),
        ]
    for name, shape, _, qtype in tensors:
        if qtype in (Q4_K, Q6_K):
            add_block_info(w, name, shape, qtype)
        else:
            dtype = np.float16 if qtype == F16 else np.float32
            w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, shape, make, qtype in tensors:
        w.write_tensor_data(blocks(rng, qtype, shape) if qtype in (Q4_K, Q6_K) else make(*shape))
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
