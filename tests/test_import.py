"""The executables' importer (shared/src/import/): Hugging Face directories (config.json and
safetensors, sharded or not, F32 or BF16, multimodal wrappers), llama2.c checkpoints (v0, v1,
v2) and GGUF files become the .mlb `--save` writes, checked against transformers' own logits
(../shared/fixtures) with the numpy reference forward, and bad inputs are one-line errors that
leave nothing behind."""
import base64
import json
import os
import shutil
import struct

import numpy as np
import pytest

import llama2c
import mlb
import reference_forward as rf
from conftest import FIXTURES, run_ml, write_imatrix

TINY = FIXTURES / "hf-tiny"
FAMILIES = sorted(p.name for p in TINY.iterdir() if (p / "config.json").exists()) if TINY.exists() else []
pytestmark = pytest.mark.skipif(not FAMILIES, reason=f"no hf-tiny fixtures in {TINY}")


def save(src, out, *args, check=True):
    """`ml_run SRC ARGS --save OUT` (the CompletedProcess)."""
    return run_ml(src, *args, "--save", out, "--prompt-ids", "1", "-n", "0", check=check)


def assert_clean_failure(p, out):
    """Exit 2, one line, no output or temporary file: -> the line."""
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert not os.path.exists(out)
    assert not list(out.parent.glob(f".{out.name}*")), "temporary file left behind"
    return lines[0]


def reference_logits(family):
    fx = json.loads((TINY / family / "reference.json").read_text())
    return fx["input_ids"], np.frombuffer(base64.b64decode(fx["logits_f32_le_base64"]), "<f4").reshape(
        fx["logits_shape"])


# --------------------------------------------------------------------------
# errors

def test_unknown_architecture(tmp_path):
    src = tmp_path / "m"
    shutil.copytree(TINY / "llama2", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "o.mlb"
    line = assert_clean_failure(save(src, out, check=False), out)
    assert "gpt_neox" in line and "unsupported architecture" in line and "qwen3" in line  # the supported ones


def without_tensor(tmp_path, name):
    """A copy of the tiny llama2 checkpoint (config.json, model.safetensors) without tensor `name`."""
    from safetensors.numpy import load_file, save_file
    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(TINY / "llama2" / "config.json", src / "config.json")
    t = load_file(str(TINY / "llama2" / "model.safetensors"))
    del t[name]
    save_file(t, str(src / "model.safetensors"))
    return src


def test_missing_tensor(tmp_path):
    src = without_tensor(tmp_path, "model.layers.2.mlp.up_proj.weight")
    out = tmp_path / "o.mlb"
    line = assert_clean_failure(save(src, out, "--type", "q4_0", check=False), out)
    assert "model.layers.2.mlp.up_proj.weight" in line


def test_missing_lm_head_untied(tmp_path):
    src = without_tensor(tmp_path, "lm_head.weight")
    out = tmp_path / "o.mlb"
    assert "lm_head.weight" in assert_clean_failure(save(src, out, check=False), out)


@pytest.mark.parametrize("config,message", [
    ("{", "config.json"),
    ("[]", "should be an object"),
    ('{"model_type": "llama", "hidden_size": 64}', "lacks \"num_attention_heads\""),
    ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 99999999,'
     ' "vocab_size": 10, "intermediate_size": 8}', "num_hidden_layers"),
    ('{"model_type": "llama\\u001b[2J", "hidden_size": 1}', "unsupported architecture"),
])
def test_bad_configs(tmp_path, config, message):
    src = tmp_path / "m"
    shutil.copytree(TINY / "llama2", src)
    (src / "config.json").write_text(config)
    out = tmp_path / "o.mlb"
    line = assert_clean_failure(save(src, out, check=False), out)
    assert message in line and "\x1b" not in line


def test_bad_safetensors(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(TINY / "llama2" / "config.json", src / "config.json")
    data = (TINY / "llama2" / "model.safetensors").read_bytes()
    out = tmp_path / "o.mlb"
    for cut in (7, 100, len(data) - 1):
        (src / "model.safetensors").write_bytes(data[:cut])
        assert "model.safetensors" in assert_clean_failure(save(src, out, check=False), out)
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + data[8:])
    assert_clean_failure(save(src, out, check=False), out)


def test_a_directory_without_config_is_not_a_model(tmp_path):
    p = run_ml(tmp_path, "--prompt-ids", "1", "-n", "0", check=False)
    assert p.returncode == 2 and "config.json" in p.stderr and p.stderr.count("\n") == 1


# --------------------------------------------------------------------------
# Hugging Face checkpoints

def write_safetensors(path, tensors):
    """Minimal safetensors writer (F32, or BF16 given as uint16 arrays)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt = "BF16" if a.dtype == np.uint16 else "F32"
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_hf_sharded_bf16_multimodal_layout(tmp_path):
    """A sharded BF16 checkpoint with the `model.language_model.` prefix, a text_config wrapper and
    vision / mtp tensors that are skipped: the weights of the F32 fixture, rounded to BF16."""
    from safetensors.numpy import load_file
    t = load_file(str(TINY / "llama2" / "model.safetensors"))
    bf = {}
    for n, a in t.items():
        u = a.astype(np.float32).view(np.uint32)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
        bf[n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n] = b
    bf["model.vision_tower.patch_embed.weight"] = np.zeros((4, 4), np.uint16)
    bf["mtp.layers.0.mlp.up_proj.weight"] = np.zeros((4, 4), np.uint16)
    names = sorted(bf)
    src = tmp_path / "mm"
    src.mkdir()
    half = len(names) // 2
    weight_map = {}
    for k, part in enumerate((names[:half], names[half:])):
        fn = f"model-0000{k + 1}-of-00002.safetensors"
        write_safetensors(src / fn, {n: bf[n] for n in part})
        weight_map.update({n: fn for n in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    inner = json.loads((TINY / "llama2" / "config.json").read_text())
    cfg = {"model_type": "llava_like", "architectures": ["SomethingForConditionalGeneration"],
           "text_config": inner, "vision_config": {"hidden_size": 4}}
    (src / "config.json").write_text(json.dumps(cfg))
    m, W = rf.load_model(src)
    m0, W0 = rf.load_model(TINY / "llama2")
    assert set(W) == set(W0)
    for n in W0:
        np.testing.assert_allclose(W[n], W0[n], rtol=2 ** -8, atol=1e-30, err_msg=n)
    assert m["arch"] == "llama" and m["tie_embeddings"] == 0


def to_v4(cfg):
    """A transformers v5 config (rope_parameters) in the v4 form."""
    c = dict(cfg)
    rp = c.pop("rope_parameters")
    if "full_attention" in rp:  # gemma3: per layer type
        full, local = rp["full_attention"], rp["sliding_attention"]
        c["rope_theta"] = full["rope_theta"]
        c["rope_local_base_freq"] = local["rope_theta"]
        if full.get("rope_type", "default") != "default":
            c["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
        c.pop("layer_types", None)
        c["sliding_window_pattern"] = c.pop("_sliding_window_pattern", 6)
    else:
        c["rope_theta"] = rp["rope_theta"]
        if "partial_rotary_factor" in rp:
            c["partial_rotary_factor"] = rp["partial_rotary_factor"]
        rest = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if rest.get("rope_type", "default") != "default":
            rest["type"] = rest.pop("rope_type")  # the older v4 spelling
            c["rope_scaling"] = rest
        else:
            c["rope_scaling"] = None
    return c


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_v4_and_v5_config_forms_give_the_same_file(family, tmp_path):
    v5 = tmp_path / "v5.mlb"
    save(TINY / family, v5, "--type", "q8_0")
    configs = [to_v4(json.loads((TINY / family / "config.json").read_text()))]
    if family == "gemma2-softcap":  # v4 Gemma 2 configs have no layer_types
        configs.append({k: v for k, v in configs[0].items() if k != "layer_types"})
    for i, cfg in enumerate(configs):
        src = tmp_path / f"v4-{i}"
        src.mkdir()
        (src / "config.json").write_text(json.dumps(cfg))
        os.symlink(TINY / family / "model.safetensors", src / "model.safetensors")
        save(src, tmp_path / "v4.mlb", "--type", "q8_0")
        assert (tmp_path / "v4.mlb").read_bytes() == v5.read_bytes(), f"{family}: v4 config {i}"


def meta_of(family, tmp_path):
    out = tmp_path / f"{family}.mlb"
    save(TINY / family, out, "--type", "q8_0")
    return mlb.MlbReader(out).meta


def test_hf_metadata_details(tmp_path):
    m = meta_of("llama3-scaled", tmp_path)
    assert (m["rope_scaling"], m["rope_scaling_factor"], m["rope_original_context"]) == ("llama3", 32.0, 16)
    m = meta_of("gemma3-local-global", tmp_path)
    assert m["layer_kinds"] == [1, 1, 1, 1, 1, 0] and m["rope_local_theta"] == 10000.0
    assert m["rope_theta"] == 1e6 and m["rope_scaling"] == "linear" and m["norm_unit_offset"] == 1
    m = meta_of("qwen3_5-hybrid", tmp_path)
    assert m["rope_dim"] == 8 and m["layer_kinds"] == [2, 2, 2, 0] and m["attn_output_gate"] == 1
    assert meta_of("smollm3-nope", tmp_path)["layer_rope"] == [1, 1, 1, 0]
    m = meta_of("smollm2-tied", tmp_path)
    assert m["tie_embeddings"] == 1 and m["convert_type"] == "q8_0"


def test_the_default_type_of_a_float_checkpoint_is_q8_0(tmp_path):
    """Without --type, a checkpoint of floats becomes Q8_0 (auto: 16 bits a weight and more go to
    Q8_0), as a GGUF file's F16 tensors would not: they stay F16."""
    a, b = tmp_path / "a.mlb", tmp_path / "b.mlb"
    save(TINY / "llama2", a)
    save(TINY / "llama2", b, "--type", "q8_0")
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "qwen3_5-hybrid"])
def test_hf_tiny_f32_matches_transformers(family):
    """The f32 import, run by the numpy reference forward, gives transformers' logits."""
    diff = rf.check_tiny(*rf.load_model(TINY / family), TINY / family / "reference.json")
    assert diff < 1e-3


def test_qwen3_5_imports(tmp_path):
    out = tmp_path / "m.mlb"
    save(TINY / "qwen3_5-hybrid", out, "--type", "q8_0")
    r = mlb.MlbReader(out)
    assert r.meta["arch"] == "qwen3_5" and "blk.0.ssm_qkv" in r.tensors and r.tensors["blk.0.ssm_conv"][1] == (128, 4)
    assert r.tensors["blk.3.attn_q"][1] == (256, 64)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q4_mixed", "f16"])
def test_quantised_types_and_reference_logits(qtype, tmp_path):
    out = tmp_path / "m.mlb"
    save(TINY / "llama2", out, "--type", qtype)
    r = mlb.MlbReader(out)
    types = {n: t for n, (t, _, _) in r.tensors.items()}
    assert types["blk.0.attn_norm"] == mlb.F32 and types["output_norm"] == mlb.F32
    assert types["blk.1.ffn_up"] == {"q8_0": mlb.Q8_0, "q4_0": mlb.Q4_0, "q4_mixed": mlb.Q4_0, "f16": mlb.F16}[qtype]
    if qtype == "q4_mixed":
        assert types["blk.1.ffn_down"] == mlb.Q8_0 and types["token_embd"] == mlb.Q8_0
    ids, want = reference_logits("llama2")
    got = rf.forward(*rf.load_model(out), ids)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    # the tiny random model (init range 0.25) amplifies weight noise a lot;
    # these bounds only catch gross packing errors (a wrong layout gives ~1.4)
    assert rel < {"f16": 0.01, "q8_0": 0.15, "q4_0": 0.9, "q4_mixed": 0.9}[qtype]


def test_imatrix_option(tmp_path):
    """--imatrix weights the Q4_0 fit of a checkpoint: less weighted error on the important
    columns; an entry of the wrong width is one line naming the tensor."""
    meta, W = rf.load_model(TINY / "llama2")
    rng = np.random.default_rng(5)
    im = {n: rng.uniform(0, 3, a.shape[1]).astype(np.float32) ** 4 for n, a in W.items() if a.ndim == 2}
    write_imatrix(tmp_path / "im", [(n, W[n].shape[0], w) for n, w in im.items()])
    a, b = tmp_path / "a.mlb", tmp_path / "b.mlb"
    save(TINY / "llama2", a, "--type", "q4_0")
    save(TINY / "llama2", b, "--type", "q4_0", "--imatrix", tmp_path / "im")
    ra, rb = mlb.MlbReader(a), mlb.MlbReader(b)
    assert ra.meta["convert_q4_scale"] == "fit" and rb.meta["convert_q4_scale"] == "fit+imatrix"
    n = "blk.1.ffn_gate"
    x = W[n]
    assert (((rb.get(n) - x) ** 2) * im[n]).sum() < (((ra.get(n) - x) ** 2) * im[n]).sum()
    write_imatrix(tmp_path / "bad", [(n, W[n].shape[0], w if n != "blk.0.attn_q" else [1.0] * 3)
                                    for n, w in im.items()])
    out = tmp_path / "c.mlb"
    assert "blk.0.attn_q" in assert_clean_failure(save(TINY / "llama2", out, "--type", "q4_0", "--imatrix",
                                                       tmp_path / "bad", check=False), out)


# --------------------------------------------------------------------------
# GGUF: SmolLM2-135M-Instruct Q4_1 vs transformers

def test_gguf_smollm2_matches_transformers(smollm2_gguf):
    meta, W = rf.load_model(smollm2_gguf)
    assert meta["arch"] == "llama" and meta["tie_embeddings"] == 1 and meta["n_kv_heads"] == 3
    assert W["blk.0.attn_q"].shape == (576, 576) and W["blk.0.ffn_down"].shape == (576, 1536)
    worst, top1 = rf.check_real(meta, W, FIXTURES / "real" / "smollm2-135m.json")
    assert top1 and worst < 2e-2
    # llama.cpp's q/k rows are interleaved (kept so, rope_style says): read as the other layout,
    # the same weights give a wrong model
    assert meta["rope_style"] == "interleaved"
    assert rf.check_real(dict(meta, rope_style="half"), W, FIXTURES / "real" / "smollm2-135m.json")[0] > 0.5


# --------------------------------------------------------------------------
# llama2.c checkpoints, written from the fixtures' weights

@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("family", ["llama2", "smollm2-tied"])
def test_llama2c_roundtrip(version, family, tmp_path):
    meta, W = rf.load_model(TINY / family)
    ck = tmp_path / "model.bin"
    {0: llama2c.write_v0, 1: llama2c.write_v1, 2: llama2c.write_v2}[version](str(ck), meta, W)
    m2, W2 = rf.load_model(ck)
    assert m2["arch"] == "llama2c" and m2["tie_embeddings"] == meta["tie_embeddings"]
    for k in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
              "context_length"):
        assert m2[k] == meta[k], k
    assert set(W2) == set(W)
    for n, a in W.items():
        if version == 2 and a.ndim == 2:
            g = 64
            tol = np.abs(a).reshape(-1, g).max(1) / 127 * 0.5 * 1.0001 + 1e-7
            assert np.all(np.abs(W2[n] - a).reshape(-1, g) <= tol[:, None]), n
        else:
            np.testing.assert_array_equal(W2[n], a, err_msg=n)
    if family == "llama2" and meta["rope_theta"] == 10000.0:
        ids, want = reference_logits(family)
        got = rf.forward(m2, W2, ids)
        if version < 2:
            assert np.abs(got - want).max() < 1e-3
        else:  # Q8 weights; the tiny random model amplifies weight noise
            assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)) < 0.15


def test_llama2c_truncated(tmp_path):
    meta, W = rf.load_model(TINY / "llama2")
    ck = tmp_path / "model.bin"
    llama2c.write_v0(str(ck), meta, W)
    data = ck.read_bytes()
    ck.write_bytes(data[: len(data) // 2])
    out = tmp_path / "m.mlb"
    assert "truncated" in assert_clean_failure(save(ck, out, check=False), out)


# --------------------------------------------------------------------------
# a model directory brings its tokenizer

def test_a_model_directory_brings_its_tokenizer(tmp_path):
    """tokenizer.json (with tokenizer_config.json and chat_template.jinja) beside the weights is
    the model's tokenizer with no -z: a text prompt is tokenised as the `tokenizers` package does,
    and it is checked against the model (the tiny fixture has 512 embedding rows, the real
    tokenizer 49,152 tokens: refused in one line)."""
    tokenizers = pytest.importorskip("tokenizers")
    src = tmp_path / "smol"
    shutil.copytree(TINY / "smollm2-tied", src)
    for f in (FIXTURES / "tokenizers" / "smollm2").iterdir():
        shutil.copy(f, src / f.name)
    text = "Hello world, 1234 héllo"
    got = json.loads(run_ml(src, "--tokenize", "-p", text).stdout)
    assert got == tokenizers.Tokenizer.from_file(str(src / "tokenizer.json")).encode(text).ids
    p = run_ml(src, "-p", text, "-n", "1", check=False)
    assert p.returncode == 2 and "49152 tokens but the model only 512" in p.stderr, p.stderr
