#!/usr/bin/env python3
"""Random-weight GGUF at Qwen3-30B-A3B's shapes in Q4_K_M's types, for speed measurements
(docs/PERFORMANCE.md#mixture-of-experts).

    python3 tools/make_random_moe.py [-o qwen3moe-30b-a3b-random-Q4_K_M.gguf] [--layers 48] [--seed 0]

Qwen3-30B-A3B: hidden 2048, 32 query and 4 key/value heads of 128, q/k norms, 128 experts of
768 rows a layer, 8 a token, vocabulary 151936, 48 layers (--layers makes fewer: the full file
is 17.4 GB, more than this machine's 24 GiB holds beside a page cache of it).

The quantised blocks are written directly with random codes and scales (nothing to quantise,
so a 9 GB file takes a minute): Q4_K everywhere but where llama-quantize's Q4_K_M puts Q6_K
(the output, attn_v and ffn_down_exps of the first and last eighth of the layers and of every
third layer between); norms and routers F32 as llama.cpp keeps them. Block scales are chosen
so the weights have a spread of about 0.02 and every activation stays finite. Metadata as
convert_hf_to_gguf.py writes for Qwen3MoeForCausalLM; tokenizer: SmolLM2's, padded.
Needs: pip install gguf numpy
"""
import argparse
from pathlib import Path

import gguf
import numpy as np

from make_random_qwen2 import F32, Q4_K, Q6_K, add_block_info, add_hparams, add_tokenizer, blocks, more_bits

ARCH = "qwen3moe"
N_VOCAB = 151936
N_EMBD = 2048
N_LAYER = 48
N_HEAD = 32
N_HEAD_KV = 4
HEAD_DIM = 128
N_FF = 6144
N_EXPERT = 128
N_EXPERT_USED = 8
N_FF_EXP = 768
N_CTX = 40960
ROPE_THETA = 1000000.0
RMS_EPS = 1e-6


def plan(n_layers):
    """(name, rows-first shape, type) of every tensor, in the converter's order."""
    t = [("token_embd.weight", (N_VOCAB, N_EMBD), Q4_K), ("output_norm.weight", (N_EMBD,), F32),
         ("output.weight", (N_VOCAB, N_EMBD), Q6_K)]
    for i in range(n_layers):
        p, v = f"blk.{i}.", Q6_K if more_bits(i, n_layers) else Q4_K
        t += [(p + "attn_norm.weight", (N_EMBD,), F32),
              (p + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), Q4_K),
              (p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), Q4_K),
              (p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), v),
              (p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), Q4_K),
              (p + "attn_q_norm.weight", (HEAD_DIM,), F32),
              (p + "attn_k_norm.weight", (HEAD_DIM,), F32),
              (p + "ffn_norm.weight", (N_EMBD,), F32),
              (p + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), F32),
              (p + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), Q4_K),
              (p + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), Q4_K),
              (p + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), v)]
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="qwen3moe-30b-a3b-random-Q4_K_M.gguf")
    ap.add_argument("--layers", type=int, default=N_LAYER)
    ap.add_argument("--tokenizer", default=str(Path(__file__).resolve().parents[2] / "shared" / "fixtures" /
                                               "tokenizers" / "smollm2"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    w = gguf.GGUFWriter(args.out, ARCH)
    w.add_type("model")
    w.add_name(f"Qwen3 30B A3B (random weights, {args.layers} of {N_LAYER} layers)")
    add_hparams(w, args.layers, N_CTX, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, ROPE_THETA, RMS_EPS)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    add_tokenizer(w, Path(args.tokenizer), N_VOCAB)

    tensors = plan(args.layers)
    for name, shape, qtype in tensors:  # the table first, then each tensor's data as it is made
        if qtype == F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            add_block_info(w, name, shape, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qtype in tensors:
        if qtype != F32:
            data = blocks(rng, qtype, shape)
        elif "ffn_gate_inp" in name:  # routers: spread like a trained one's, so tokens spread over experts
            data = rng.standard_normal(shape, dtype=np.float32) * 0.05
        else:
            data = np.ones(shape, dtype=np.float32)
        w.write_tensor_data(data)
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
