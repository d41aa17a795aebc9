"""Tiny random-weight models of the families Krafla reads only from GGUF (Mixture-of-Experts
and others), made by transformers' own classes, with transformers' own logits, and converted to
GGUF by llama.cpp's convert_hf_to_gguf.py (the same path a user's file took).

Writes tests/fixtures/gguf-tiny/<name>/model.gguf and reference.json (input ids, the logits of
every position, 16 greedy tokens). The reference is the model run by transformers in float64
(eager attention, eager experts), stored rounded to f32: transformers' own f32 run is up to
1.2e-4 away from it on the Qwen3.5-MoE fixture, as far as Krafla's f32 run is, so an f32
reference could not tell a 1e-4 error from rounding. Each model has a tiny byte-level BPE tokenizer
trained here (convert_hf_to_gguf needs one; the tests feed token ids, so only its size matters),
written with the `qwen2` pre-tokenizer name.

    pip install torch transformers tokenizers    (not in tests/requirements.txt: only this tool)
    python tools/make_gguf_fixtures.py LLAMA_CPP_DIR [NAME ...]

LLAMA_CPP_DIR: vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (tools/bench_llamacpp.sh
unpacks it into .cache/llamacpp). The committed fixtures were made with transformers 5.25.0 and
torch 2.15.0.
"""
import base64
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf-tiny"
VOCAB = 512
# one of the tiny models' token streams: 24 ids drawn once, as the hf-tiny fixtures'
INPUT_IDS = [424, 19, 335, 275, 250, 295, 476, 20, 395, 357, 28, 240, 499, 410, 155, 335, 393, 213, 217, 193,
             314, 306, 509, 248]

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.25, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)

QWEN35 = dict(COMMON, initializer_range=0.2, num_hidden_layers=4, head_dim=32,
              layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
              linear_key_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_value_head_dim=16,
              rope_parameters={"partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rope_type": "default"})


def models():
    """name -> (config class, model class, config keywords)."""
    import transformers as tf
    return {
        # softmax over 8 experts, then the top 2, renormalised; q/k norms
        "qwen3moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, dict(
            COMMON, num_hidden_layers=3, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], rope_theta=1000000.0)),
        # Qwen2-MoE: 6 experts, top 3 not renormalised, a shared expert behind a sigmoid gate, q/k/v biases
        "qwen2moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM, dict(
            COMMON, num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=3, norm_topk_prob=False,
            decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1000000.0)),
        # Mixtral: Llama blocks with 4 experts, top 2
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, dict(
            COMMON, num_hidden_layers=2, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=None, rope_theta=1000000.0)),
        # Qwen3.5: Gated DeltaNet layers and gated full attention (as the hf-tiny qwen3_5-hybrid fixture)
        "qwen35": (tf.Qwen3_5TextConfig, tf.Qwen3_5ForCausalLM, dict(
            QWEN35, intermediate_size=192)),
        # Qwen3.5-MoE: the same hybrid with 8 experts, top 2, and a gated shared expert
        "qwen35moe": (tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM, dict(
            QWEN35, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
            num_experts_per_tok=2)),
        # Phi-3 / Phi-4-mini: fused q/k/v and gate/up, LongRoPE (short and long factors, an
        # attention factor), partial rotary
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(
            COMMON, num_hidden_layers=2, intermediate_size=96, max_position_embeddings=2048,
            original_max_position_embeddings=512, partial_rotary_factor=0.75, sliding_window=None,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                             "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                             "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 8.0],
                             "original_max_position_embeddings": 512})),
        # gpt-oss: 4 experts, top 2 then softmax, router and expert biases, the clamped SwiGLU,
        # attention sinks, q/k/v/o biases, sliding (window 8) and full layers alternating, YaRN
        # RoPE (transformers' untruncated ramp); its experts' gate and up weights tripled (`make`) so
        # that the SwiGLU's clamps at 7 act
        "gptoss": (tf.GptOssConfig, tf.GptOssForCausalLM, dict(
            COMMON, num_hidden_layers=3, head_dim=16, intermediate_size=32, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=8, attention_bias=True,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 64,
                             "rope_theta": 150000.0})),
    }


def train_tokenizer(folder, tokenizer_class="PreTrainedTokenizerFast"):
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tm
    tok = Tokenizer(tm.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|pad|>", "<|bos|>", "<|eos|>"]
    # (room left for the tokens some families' tokenizer classes add)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 16, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = (Path(__file__).resolve().parent.parent / "shared" / "src" / "import" / "calibration.txt").read_text()
    tok.train_from_iterator([text], trainer)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": tokenizer_class, "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>", "model_max_length": 512}))


def convert(llama_cpp, src, out, *extra):
    """convert_hf_to_gguf.py SRC --outtype f32 --outfile OUT, in this process, its BPE
    pre-tokenizer named qwen2 (it recognises pre-tokenizers by a hash of known vocabularies)."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf
    from conversion import base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outtype", "f32", "--outfile", str(out), *extra]
    convert_hf_to_gguf.main()


def make(name, llama_cpp):
    import torch
    import transformers
    config_class, model_class, kw = models()[name]
    torch.manual_seed(sum(map(ord, name)))
    config = config_class(**kw)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    model = model_class(config).eval().float()
    if name == "gptoss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.experts.gate_up_proj.mul_(3.0)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name
        model.save_pretrained(src)
        # (Phi-4's GPT2Tokenizer: llama.cpp's Phi-3 converter takes it as byte-level BPE)
        train_tokenizer(src, "GPT2Tokenizer" if name == "phi3" else "PreTrainedTokenizerFast")
        dest = OUT / name
        dest.mkdir(parents=True, exist_ok=True)
        # (Qwen3.5's converter wants a multi-token-prediction head, which these have not)
        convert(llama_cpp, src, dest / "model.gguf", *(["--no-mtp"] if name.startswith("qwen35") else []))
        shutil.copy(src / "config.json", dest / "config.json")
    ids = torch.tensor([INPUT_IDS])
    model = model.double()
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        greedy = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(INPUT_IDS):].tolist()
    ref = {
        "family": name, "model_type": config.model_type, "input_ids": INPUT_IDS,
        "logits_shape": list(logits.shape),
        "logits_f32_le_base64": base64.b64encode(logits.astype("<f4").tobytes()).decode(),
        "greedy_16": greedy,
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}, float64 (weights "
                   "made in float32), eager attention and experts; GGUF by llama.cpp 0c1e570 "
                   "convert_hf_to_gguf.py --outtype f32",
    }
    rope = kw.get("rope_parameters") or {}
    original = rope.get("original_max_position_embeddings")
    if original and rope.get("rope_type") == "longrope":
        # LongRoPE: transformers takes the short factors up to the original context (the
        # reference above; Krafla and llama.cpp: a context of at most that, `args`), the long
        # ones for a longer sequence: its last 8 positions' logits are `long_logits`
        ref["args"] = ["--ctx", str(original)]
        long_ids = np.random.default_rng(1).integers(3, VOCAB, original + 40).tolist()
        with torch.no_grad():
            long_logits = model(torch.tensor([long_ids])).logits[0, -8:].float().numpy()
        ref["long_input_ids"] = long_ids
        ref["long_logits_f32_le_base64"] = base64.b64encode(long_logits.astype("<f4").tobytes()).decode()
    (dest / "reference.json").write_text(json.dumps(ref))
    print(f"{name}: {dest}, logits {np.abs(logits).max():.2f} max")


def mxfp4(llama_cpp, name):
    """NAME/model-mxfp4.gguf: the fixture through llama.cpp's own `llama-quantize ... MXFP4_MOE`
    (experts in MXFP4, the other matrices Q8_0), for the MXFP4 tests; the tool from the build
    tools/bench_llamacpp.sh makes (LLAMA_QUANTIZE, else build-avx2 beside the sdist)."""
    import os
    import subprocess
    default = llama_cpp.parents[2] / "build-avx2" / "bin" / "llama-quantize"
    tool = os.environ.get("LLAMA_QUANTIZE", str(default))
    subprocess.run([tool, str(OUT / name / "model.gguf"), str(OUT / name / "model-mxfp4.gguf"), "MXFP4_MOE"],
                   check=True)


def main():
    llama_cpp = Path(sys.argv[1]).resolve()
    names = sys.argv[2:] or list(models())
    for name in names:
        make(name, llama_cpp)
    for name in ("qwen3moe", "gptoss"):
        if name in names:
            mxfp4(llama_cpp, name)


if __name__ == "__main__":
    main()
