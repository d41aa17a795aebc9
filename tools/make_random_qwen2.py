#!/usr/bin/env python3
"""Random-weight GGUF at Qwen2.5-1.5B-Instruct's shapes, for speed measurements.

    python3 tools/make_random_qwen2.py [-o model-f16.gguf] [--tokenizer DIR] [--seed 0]
    llama-quantize model-f16.gguf qwen2.5-1.5b-random-Q4_K_M.gguf Q4_K_M

(docs/PERFORMANCE.md#gguf-files-beside-llamacpp times this file; tools/bench_llamacpp.sh
builds llama-quantize).

Matrices F16 (std 0.02), norms F32 (1.0), q/k/v biases F32 (std 0.002),
tied embeddings (no output.weight). Metadata as convert_hf_to_gguf.py writes for
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
N_VOCAB = 151936
N_EMBD = 1536
N_LAYER = 28
N_HEAD = 12
N_HEAD_KV = 2
HEAD_DIM = 128
N_FF = 8960
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



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="model-f16.gguf")
    ap.add_argument("--tokenizer", default=str(Path(__file__).resolve().parents[2] / "shared" / "fixtures" /
                                               "tokenizers" / "smollm2"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    tokdir = Path(args.tokenizer)

    w = gguf.GGUFWriter(args.out, ARCH)
    # general.* as the converter writes them (subset)
    w.add_type("model")
    w.add_name("Qwen2.5 1.5B Instruct (random weights)")
    w.add_size_label("1.5B")
    w.add_finetune("Instruct")
    w.add_basename("Qwen2.5")
    # hparams (TextModel.set_gguf_parameters for Qwen2ForCausalLM)
    add_hparams(w, N_LAYER, N_CTX, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, ROPE_THETA, RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    add_tokenizer(w, tokdir, N_VOCAB)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    def bias(n):
        return rng.standard_normal(n, dtype=np.float32) * 0.002

    n_kv = N_HEAD_KV * HEAD_DIM
    w.add_tensor("token_embd.weight", mat(N_VOCAB, N_EMBD))
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    for b in range(N_LAYER):
        p = f"blk.{b}."
        w.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_HEAD * HEAD_DIM, N_EMBD))
        w.add_tensor(p + "attn_q.bias", bias(N_HEAD * HEAD_DIM))
        w.add_tensor(p + "attn_k.weight", mat(n_kv, N_EMBD))
        w.add_tensor(p + "attn_k.bias", bias(n_kv))
        w.add_tensor(p + "attn_v.weight", mat(n_kv, N_EMBD))
        w.add_tensor(p + "attn_v.bias", bias(n_kv))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
