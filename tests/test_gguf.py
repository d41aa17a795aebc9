"""GGUF files run directly by the executables: the model and its tokenizer read from the file,
the tensor types Krafla does not read converted at load by `--type`, `--save` the same bytes
on any thread count, the real models' logits against transformers, and hostile files."""
import base64
import filecmp
import json
import re
import struct
import subprocess

import numpy as np
import pytest

from conftest import FIXTURES, REPO, FixtureJson, ml_bin, run_ml

REAL = {name: FixtureJson(FIXTURES / "real" / f"{name}.json") for name in ("smollm2-135m", "gemma3-270m")}


@pytest.fixture(scope="module")
def sources(smollm2_gguf, gemma3_gguf, smol, gem):
    """name -> (GGUF path, get(kind): the .mlb `--save` writes with that --type, or 'mlt': the
    .mlt `--save-tokenizer` writes, both from the GGUF)."""
    return {"smollm2-135m": (smollm2_gguf, smol), "gemma3-270m": (gemma3_gguf, gem)}


@pytest.mark.parametrize("name,qtype", [("smollm2-135m", "q8_0"), ("smollm2-135m", "q4_0"),
                                        ("gemma3-270m", "q8_0"), ("gemma3-270m", "auto")])
def test_save_is_the_same_bytes_on_any_thread_count(sources, name, qtype, tmp_path):
    """The conversion runs on all threads (q4_0: after measuring its importance matrix): one
    thread writes the bytes two do."""
    gguf, conv = sources[name]
    mlb, mlt = tmp_path / "m.mlb", tmp_path / "t.mlt"
    p = run_ml(gguf, "--type", qtype, "--save", mlb, "--save-tokenizer", mlt, "--prompt-ids", "1", "-n", "0",
               "-t", "1")
    assert "loaded in" in p.stderr, p.stderr
    assert filecmp.cmp(mlb, conv(qtype), shallow=False), f"{name} --type {qtype}: -t 1 and -t 2 differ"
    assert filecmp.cmp(mlt, conv("mlt"), shallow=False), f"{name}: --save-tokenizer differs from -z GGUF's"


def logits(model, ids, tmp_path, *extra):
    out = tmp_path / "logits.f32"
    run_ml(model, *extra, "--prompt-ids", ",".join(map(str, ids)), "--logits-out", out, "-n", "0")
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.mark.parametrize("name", REAL)
def test_q8_0_matches_transformers_top20(sources, name, tmp_path):
    """--type q8_0 (everything the GGUF does not store in Q8_0/Q4_0/F16/F32 requantised to Q8_0):
    the same argmax at every position and the top-20 logits within 1.0 (measured: 0.60 for
    SmolLM2, 0.43 for Gemma 3; the f32 conversion is within 2e-2)."""
    real = REAL[name]
    got = logits(sources[name][0], real["input_ids"], tmp_path, "--type", "q8_0")
    for pos, (top_ids, top_vals) in enumerate(zip(real["top20_ids"], real["top20_logits"], strict=True)):
        diff = np.abs(got[pos, top_ids] - np.array(top_vals)).max()
        assert diff <= 1.0, f"{name} position {pos}: top-20 logits differ by {diff:.3f}"
        assert int(got[pos].argmax()) == top_ids[0], f"{name} position {pos}"


@pytest.mark.parametrize("name,qtype", [("smollm2-135m", "q4_0"), ("gemma3-270m", None)])
def test_direct_runs_like_the_converted_file(sources, name, qtype, tmp_path):
    """A GGUF run directly (Gemma 3: the default --type, auto; SmolLM2: q4_0, which for its Q4_1
    file is what auto does too) gives the logits and greedy tokens of its --save file of the
    same --type, byte for byte, and its text prompt is tokenized by the GGUF's own tokenizer like
    transformers does."""
    real = REAL[name]
    gguf, conv = sources[name]
    opts = ["--type", qtype] if qtype else []
    direct = logits(gguf, real["input_ids"], tmp_path, *opts)
    converted = logits(conv(qtype or "auto"), real["input_ids"], tmp_path)
    assert direct.tobytes() == converted.tobytes()
    ids = ",".join(map(str, real["input_ids"]))
    a = run_ml(gguf, *opts, "--prompt-ids", ids, "-n", "12", "--print-ids").stdout
    b = run_ml(conv(qtype or "auto"), "--prompt-ids", ids, "-n", "12", "--print-ids").stdout
    assert a == b
    p = run_ml(gguf, "-p", real["prompt"], "--tokenize")
    assert json.loads(p.stdout) == real["input_ids"]


def test_chat_from_the_gguf_alone(smollm2_gguf):
    """No -z, no --chat: the tokenizer and the chat template come from the GGUF."""
    p = run_ml(smollm2_gguf, "-p", "What is the capital of France?", "--chat", "auto", "-n", "30")
    assert "Paris" in p.stdout, p.stdout + p.stderr


def llama3_gguf_like_llama_cpp(fixture, path):
    """The llama3-scaled HF fixture as llama.cpp's converter writes a Llama 3.1+ model: F32
    tensors under GGUF names, Q/K rows reordered for interleaved RoPE, and the llama3 RoPE
    scaling not as parameters but as a `rope_freqs` tensor of per-frequency divisors (what
    every Llama 3.1 / 3.2 GGUF holds). A SentencePiece vocabulary of the model's size (the
    test feeds token ids)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((fixture / "config.json").read_text())
    rope = cfg["rope_parameters"]
    w = load_file(fixture / "model.safetensors")
    d, n_heads, n_kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def interleave(m, heads):  # per head: rows (first half, second half) -> pairs side by side
        return m.reshape(heads, 2, hd // 2, -1).swapaxes(1, 2).reshape(m.shape)

    # the per-frequency divisors of llama3 scaling, written out from its definition
    inv = 1.0 / rope["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float32) / hd)
    old, lo, hi, factor = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                           rope["high_freq_factor"], rope["factor"])
    wavelen = 2 * np.pi / inv
    smooth = (old / wavelen - lo) / (hi - lo)
    divisors = np.where(wavelen < old / hi, 1.0,
                        np.where(wavelen > old / lo, factor, 1.0 / ((1 - smooth) / factor + smooth)))

    gw = gguf.GGUFWriter(str(path), "llama")
    gw.add_block_count(cfg["num_hidden_layers"])
    gw.add_context_length(cfg["max_position_embeddings"])
    gw.add_embedding_length(d)
    gw.add_feed_forward_length(cfg["intermediate_size"])
    gw.add_head_count(n_heads)
    gw.add_head_count_kv(n_kv)
    gw.add_rope_freq_base(rope["rope_theta"])
    gw.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    gw.add_rope_dimension_count(hd)
    gw.add_vocab_size(cfg["vocab_size"])
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [f"\u2581t{i}" for i in range(cfg["vocab_size"] - len(tokens))]
    gw.add_tokenizer_model("llama")
    gw.add_token_list(tokens)
    gw.add_token_scores([0.0] * len(tokens))
    gw.add_token_types([2, 3, 3, *([6] * 256), *([1] * (len(tokens) - 259))])
    gw.add_bos_token_id(cfg["bos_token_id"])
    gw.add_eos_token_id(cfg["eos_token_id"])
    gw.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    gw.add_tensor("rope_freqs.weight", divisors.astype(np.float32))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(cfg["num_hidden_layers"]):
        for hf, g in names.items():
            t = w[f"model.layers.{i}.{hf}.weight"]
            if g in ("attn_q", "attn_k"):
                t = interleave(t, n_heads if g == "attn_q" else n_kv)
            gw.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(t))
    gw.add_tensor("output_norm.weight", w["model.norm.weight"])
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()


def test_llama3_rope_freqs_match_transformers(tmp_path):
    """A GGUF with llama.cpp's rope_freqs tensor (Llama 3.1 / 3.2) runs directly with the logits
    of transformers (the llama3-scaled fixture, whose short original context puts positions
    past it)."""
    fixture = FIXTURES / "hf-tiny" / "llama3-scaled"
    ref = json.loads((fixture / "reference.json").read_text())
    want = np.frombuffer(base64.b64decode(ref["logits_f32_le_base64"]), dtype="<f4").reshape(ref["logits_shape"])
    gguf_path = tmp_path / "llama3.gguf"
    llama3_gguf_like_llama_cpp(fixture, gguf_path)
    got = logits(gguf_path, ref["input_ids"], tmp_path)
    diff = np.abs(got - want).max()
    assert diff <= 1e-3, f"llama3 rope_freqs: logits differ from transformers by {diff}"
    # without the divisors the same file is clearly wrong: the test sees the scaling
    unscaled = tmp_path / "unscaled.gguf"
    data = bytearray(gguf_path.read_bytes())
    at = data.find(b"rope_freqs.weight")
    data[at:at + 10] = b"rope_fregs"  # the tensor is no longer the one llama.cpp reads
    unscaled.write_bytes(data)
    off = np.abs(logits(unscaled, ref["input_ids"], tmp_path) - want).max()
    assert off > 1e-2, f"the fixture does not exercise the scaling ({off})"


# ---------------------------------------------------------------------------------------------
# Dequantisation, type by type, against the gguf package
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dequantize_blocks():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "krafla", "--example", "dequantize_blocks"],
                   cwd=REPO, check=True, timeout=1800)
    return REPO / "target" / "release" / "examples" / "dequantize_blocks"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the NaN and infinite scales
@pytest.mark.parametrize("name", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                  "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"])
def test_dequantisation_matches_the_gguf_package(name, dequantize_blocks, tmp_path):
    """Random blocks (every bit pattern of the quants and the scales, so also infinite and NaN
    scales, and all-zero and all-one blocks) give the gguf package's values bit for bit (Q8_K,
    which the package cannot dequantise: d · q)."""
    gguf = pytest.importorskip("gguf")
    qt = gguf.GGMLQuantizationType[name]
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(len(name) * 7919)
    raw = rng.integers(0, 256, size=(300, nbytes), dtype=np.uint8)
    raw[0], raw[1] = 0, 0xFF
    if name == "Q8_K":
        d = raw[:, :4].copy().view("<f4")
        want = d * raw[:, 4:4 + 256].view(np.int8).astype(np.float32)
    else:
        want = np.asarray(gguf.quants.dequantize(raw.reshape(-1), qt), dtype=np.float32)
    (tmp_path / "blocks").write_bytes(raw.tobytes())
    subprocess.run([dequantize_blocks, str(int(qt)), tmp_path / "blocks", tmp_path / "out"], check=True)
    got = np.fromfile(tmp_path / "out", dtype="<f4")
    want = want.reshape(-1)
    assert got.shape == want.shape
    same = (got.view("<u4") == want.view("<u4")) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{name}: {np.count_nonzero(~same)} values differ, first at {np.argmin(same)}: " \
        f"{got[np.argmin(same)]} vs {want[np.argmin(same)]}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the NaN and infinite scales
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_mlb_reader_decodes_k_quants_as_the_gguf_package(name):
    """tools/mlb.py's reader of the K-quant tensors that `--save` copies from GGUF (.mlb types
    6, 7, 8) gives the gguf package's values bit for bit, on random super-blocks."""
    gguf = pytest.importorskip("gguf")
    import mlb
    qt = gguf.GGMLQuantizationType[name]
    _, nbytes = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(len(name) * 104729)
    raw = rng.integers(0, 256, size=(300, nbytes), dtype=np.uint8)
    raw[0], raw[1] = 0, 0xFF
    want = np.asarray(gguf.quants.dequantize(raw.reshape(-1), qt), dtype=np.float32).reshape(-1)
    ttype = {"Q4_K": mlb.Q4_K, "Q5_K": mlb.Q5_K, "Q6_K": mlb.Q6_K}[name]
    assert mlb.tensor_nbytes(ttype, (2, 150 * 256)) == raw.size
    got = mlb.decode(raw.reshape(-1), ttype, (2, 150 * 256)).reshape(-1)
    same = (got.view("<u4") == want.view("<u4")) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{name}: {np.count_nonzero(~same)} values differ"


def test_q5_k_matrices_repacked_give_the_row_kernels_bits(native, tmp_path):
    """Q5_K matrices (a tiny random llama GGUF, tests/test_nonfinite.py's, with its attention
    output and feed-forward gate and up in Q5_K): the builds with eight-row K-quant kernels copy
    them into eight-row groups at load (the startup line counts them) and run them through the
    eight-row kernels and, from 16 tokens, the prompt tiles; --no-repack keeps the plain rows and
    the row kernels, and the native build has no eight-row kernels at all. Same logits, byte for
    byte, at 1 and 2 threads, in one batch and in batches of 5."""
    from test_nonfinite import tiny_gguf
    path = tiny_gguf(tmp_path / "q5k.gguf", q5k=True)
    ids = ",".join(str(3 + (i * 37) % 290) for i in range(40))
    p = run_ml(path, "--prompt-ids", ids, "-n", "0")
    x86_kquant_rows8 = re.search(r"isa (avx2|avx512vnni),", p.stderr)
    repacked = float(re.search(r"\+ ([0-9.]+) MiB repacked weights", p.stderr).group(1))
    assert (repacked > 0) == bool(x86_kquant_rows8), p.stderr

    def logits(exe, *extra):
        out = tmp_path / "logits.f32"
        subprocess.run([str(exe), str(path), "--prompt-ids", ids, "--logits-out", str(out), "-n", "0", *extra],
                       check=True, capture_output=True, timeout=600)
        return out.read_bytes()

    want = logits(native, "-t", "1")
    for threads, batch in [("1", "512"), ("2", "512"), ("2", "5")]:
        for extra in [(), ("--no-repack",)]:
            got = logits(ml_bin(), "-t", threads, "--batch", batch, *extra)
            assert got == want, f"-t {threads} --batch {batch} {' '.join(extra)}: not the native build's logits"


# ---------------------------------------------------------------------------------------------
# Hostile files: one line, exit 2, no panic
# ---------------------------------------------------------------------------------------------

def tensor_table(data):
    """(offset of the tensor table, offset of each tensor entry's type field) of a GGUF file."""
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def skip_value(t, pos):
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if t in sizes:
            return pos + sizes[t]
        if t == 8:
            (n,) = struct.unpack_from("<Q", data, pos)
            return pos + 8 + n
        et, n = struct.unpack_from("<IQ", data, pos)
        pos += 12
        for _ in range(n):
            pos = skip_value(et, pos)
        return pos

    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        (t,) = struct.unpack_from("<I", data, pos)
        pos = skip_value(t, pos + 4)
    table, types = pos, []
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd
        types.append(pos)
        pos += 4 + 8
    return table, types


def test_hostile_gguf_files(smollm2_gguf, tmp_path):
    good = smollm2_gguf.read_bytes()
    table, types = tensor_table(good)
    cases = {
        "truncated in the header": good[:table // 2],
        "truncated in the data": good[:len(good) - 1000],
        "huge tensor count": good[:8] + struct.pack("<Q", 1 << 62) + good[16:],
        "huge metadata count": good[:16] + struct.pack("<Q", 1 << 62) + good[24:],
        "huge key length": good[:24] + struct.pack("<Q", 1 << 60) + good[32:],
        "unknown tensor type": good[:types[3]] + struct.pack("<I", 99) + good[types[3] + 4:],
        "IQ type": good[:types[3]] + struct.pack("<I", 16) + good[types[3] + 4:],
        "offset past the end": good[:types[3] + 4] + struct.pack("<Q", 1 << 40) + good[types[3] + 12:],
        "misaligned offset": good[:types[3] + 4] + struct.pack("<Q", 3) + good[types[3] + 12:],
        "overlapping tensors": good[:types[3] + 4] + good[types[2] + 4:types[2] + 12] + good[types[3] + 12:],
        "shape overflow": good[:types[3] - 8] + struct.pack("<Q", 1 << 62) + good[types[3]:],
        "bad version": good[:4] + struct.pack("<I", 7) + good[8:],
    }
    for what, data in cases.items():
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        p = run_ml(path, "-p", "hi", "-n", "1", check=False)
        assert p.returncode == 2, f"{what}: exit {p.returncode}\n{p.stderr}"
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("krafla: "), f"{what}: {p.stderr!r}"
        assert "panicked" not in p.stderr and "\x1b" not in p.stderr, f"{what}: {p.stderr!r}"


def test_gguf_only_options(smol, tmp_path):
    p = run_ml(smol("q8_0"), "-z", smol("mlt"), "--type", "q4_0", "-p", "hi", check=False)
    assert p.returncode == 2 and "--type applies to models converted when loaded" in p.stderr, p.stderr
    p = run_ml(smol("q8_0"), "--save-tokenizer", tmp_path / "t.mlt", "-p", "hi", check=False)
    assert p.returncode == 2 and "--save-tokenizer" in p.stderr, p.stderr
