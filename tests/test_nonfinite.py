"""NaN and infinite weights: a GGUF file whose embedding, a norm or a block scale is not finite is a
one-line error naming the tensor (exit 2), never text made from NaN: found where load copies the
values (norms, the eight-row copies of Q8_0/Q4_0 and, where the kernels read them, K-quant
matrices, converted tensors), else once the logits come out not finite. Through the server, such a
request gets a 500 with the message, while the other requests of the same step go on and the server
stays up."""
import json
import threading

import numpy as np
import pytest

from conftest import ServerProcess, ml_bin, run_ml

D, F, V, HEADS = 256, 512, 300, 4
BAD = 7  # the token whose embedding row is poisoned
PROMPT_BAD, PROMPT_GOOD = [1, BAD], [1, 8]


def q8_0_bytes(x):
    """llama.cpp's Q8_0 blocks of the rows of `x` as [rows][bytes of a row] uint8."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(axis=1) / 127
    q = np.round(blocks / np.where(d == 0, 1, d)[:, None]).astype(np.int8)
    out = np.concatenate([d.astype("<f2")[:, None].view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(x.shape[0], -1)


def k_quant_bytes(rng, rows, cols, kind):
    """Random Q4_K (d, dmin, 12 scale bytes, 128 code bytes), Q5_K (d, dmin, 12 scale bytes, 32
    bytes of fifth bits, 128 code bytes) or Q6_K (128 + 64 code bytes, 16 scales, d)
    super-blocks with small scales, as [rows][bytes of a row] uint8."""
    n = rows * cols // 256
    if kind in ("Q4_K", "Q5_K"):
        scales = np.full((n, 2), 2e-4, "<f2").view(np.uint8)
        body = rng.integers(0, 256, (n, 140 if kind == "Q4_K" else 172), dtype=np.uint8)
        return np.concatenate([scales, body], axis=1).reshape(rows, -1)
    body = rng.integers(0, 256, (n, 192), dtype=np.uint8)
    sub = rng.integers(1, 32, (n, 16), dtype=np.uint8)
    d = np.full((n, 1), 2e-4, "<f2").view(np.uint8)
    return np.concatenate([body, sub, d], axis=1).reshape(rows, -1)


def set_f16(row_bytes, at, value):
    """Writes the f16 `value` at byte `at` of a [rows][bytes] uint8 array (flat offset)."""
    row_bytes.reshape(-1)[at:at + 2] = np.array([value], "<f2").view(np.uint8)


def tiny_gguf(path, embd="F32", poison=None, q5k=False):
    """A two-layer llama GGUF (hidden 256, random weights, untied output) with a SentencePiece
    vocabulary of V tokens: the token embedding in `embd` (F32, F16, Q8_0 or Q4_K), the attention
    output in Q4_K and the feed-forward's down projection in Q6_K (K-quants, used as stored where
    the build has no eight-row kernels for them), with `q5k` the attention output and the
    feed-forward's gate and up projections in Q5_K, the rest F32. `poison(tensors)` changes the
    arrays (name -> (array, raw GGML type or None)) before they are written."""
    import gguf

    rng = np.random.default_rng(32)
    normal = lambda *shape: (rng.standard_normal(shape) * 0.05).astype(np.float32)  # noqa: E731
    emb = normal(V, D)
    tensors = {"token_embd.weight": {"F32": (emb, None), "F16": (emb.astype(np.float16), None),
                                     "Q8_0": (q8_0_bytes(emb), gguf.GGMLQuantizationType.Q8_0),
                                     "Q4_K": (k_quant_bytes(rng, V, D, "Q4_K"), gguf.GGMLQuantizationType.Q4_K)}[embd]}
    for i in range(2):
        tensors |= {
            f"blk.{i}.attn_norm.weight": (np.ones(D, np.float32), None),
            f"blk.{i}.attn_q.weight": (normal(D, D), None),
            f"blk.{i}.attn_k.weight": (normal(D, D), None),
            f"blk.{i}.attn_v.weight": (normal(D, D), None),
            f"blk.{i}.attn_output.weight": (k_quant_bytes(rng, D, D, "Q4_K"), gguf.GGMLQuantizationType.Q4_K),
            f"blk.{i}.ffn_norm.weight": (np.ones(D, np.float32), None),
            f"blk.{i}.ffn_gate.weight": (normal(F, D), None),
            f"blk.{i}.ffn_up.weight": (normal(F, D), None),
            f"blk.{i}.ffn_down.weight": (k_quant_bytes(rng, D, F, "Q6_K"), gguf.GGMLQuantizationType.Q6_K),
        }
        if q5k:
            q5 = gguf.GGMLQuantizationType.Q5_K
            tensors |= {f"blk.{i}.attn_output.weight": (k_quant_bytes(rng, D, D, "Q5_K"), q5),
                        f"blk.{i}.ffn_gate.weight": (k_quant_bytes(rng, F, D, "Q5_K"), q5),
                        f"blk.{i}.ffn_up.weight": (k_quant_bytes(rng, F, D, "Q5_K"), q5)}
    tensors |= {"output_norm.weight": (np.ones(D, np.float32), None), "output.weight": (normal(V, D), None)}
    if poison:
        poison(tensors)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [f"\u2581t{i}" for i in range(V - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3, *([6] * 256), *([1] * (V - 259))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, (array, raw) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def nan_at(name, row, col, value=np.nan):
    """A poison: element (row, col) of the float tensor `name` set to `value`."""
    def poison(tensors):
        array, raw = tensors[name]
        array = array.copy()
        array.reshape(array.shape[0] if array.ndim > 1 else 1, -1)[row, col] = value
        tensors[name] = (array, raw)
    return poison


def scale_at(name, at, value):
    """A poison: the f16 at byte `at` of the quantised tensor `name` (a block's d or dmin) set."""
    def poison(tensors):
        array, raw = tensors[name]
        array = array.copy()
        set_f16(array, at, value)
        tensors[name] = (array, raw)
    return poison


def k_quant_at(name, rows, cols, at, value):
    """A poison: the float tensor `name` replaced by random Q4_K blocks, the f16 at byte `at` set."""
    import gguf

    def poison(tensors):
        array = k_quant_bytes(np.random.default_rng(5), rows, cols, "Q4_K")
        set_f16(array, at, value)
        tensors[name] = (array, gguf.GGMLQuantizationType.Q4_K)
    return poison


# (embedding type, poison, the tensor and what the error says of it[, options])
CASES = {
    "f32 embedding NaN": ("F32", nan_at("token_embd.weight", BAD, 3),
                          f"tensor 'token_embd' has a non-finite value (NaN) at element {BAD * D + 3}"),
    "f16 embedding NaN": ("F16", nan_at("token_embd.weight", BAD, 3),
                          f"tensor 'token_embd' has a non-finite value (NaN) at element {BAD * D + 3}"),
    # row BAD's first block: block BAD·8 of 34 bytes
    "q8_0 embedding scale inf": ("Q8_0", scale_at("token_embd.weight", 34 * BAD * (D // 32), np.inf),
                                 f"tensor 'token_embd' has a non-finite scale (inf) in block {BAD * D // 32}"),
    # row BAD's one super-block: its d
    "q4_k embedding scale inf": ("Q4_K", scale_at("token_embd.weight", 144 * BAD, np.inf),
                                 f"tensor 'token_embd' has a non-finite scale (inf) in block {BAD}"),
    "norm inf": ("F32", nan_at("blk.0.ffn_norm.weight", 0, 5, np.inf),
                 "tensor 'blk.0.ffn_norm' has a non-finite value (inf) at element 5"),
    # row 9's one super-block's dmin (bytes 2..4 of its 144)
    "q4_k dmin NaN": ("F32", scale_at("blk.1.attn_output.weight", 144 * (9 * D // 256) + 2, np.nan),
                      f"tensor 'blk.1.attn_o' has a non-finite scale (NaN) in block {9 * D // 256}"),
    # a Q5_K matrix's row 9, its one super-block's dmin (bytes 2..4 of its 176)
    "q5_k dmin NaN": ("F32", scale_at("blk.0.attn_output.weight", 176 * (9 * D // 256) + 2, np.nan),
                      f"tensor 'blk.0.attn_o' has a non-finite scale (NaN) in block {9 * D // 256}", [], True),
    # row 9's second super-block's d (the last 2 of its 210 bytes)
    "q6_k scale NaN": ("F32", scale_at("blk.0.ffn_down.weight", 210 * (9 * F // 256 + 1) + 208, np.nan),
                       f"tensor 'blk.0.ffn_down' has a non-finite scale (NaN) in block {9 * F // 256 + 1}"),
    # in matrices read in place whose output goes into another product (the activation
    # quantiser would pass the NaN over): carried to the hidden state, found from the logits
    "f32 attn_q NaN": ("F32", nan_at("blk.0.attn_q.weight", 5, 3),
                       f"tensor 'blk.0.attn_q' has a non-finite value (NaN) at element {5 * D + 3}"),
    "q4_k ffn_gate scale NaN": ("F32", k_quant_at("blk.1.ffn_gate.weight", F, D, 144 * 3, np.nan),
                                "tensor 'blk.1.ffn_gate' has a non-finite scale (NaN) in block 3"),
    # converted at load (F32 -> Q4_0): the value, named by its GGUF name
    "converted NaN": ("F32", nan_at("blk.1.ffn_gate.weight", 3, 2),
                      f"tensor 'blk.1.ffn_gate.weight' has a non-finite value (NaN) at element {3 * D + 2}",
                      ["--type", "q4_0", "--requantize"]),
}


def test_the_clean_model_runs(tmp_path):
    for embd in ("F32", "F16", "Q8_0", "Q4_K"):
        path = tiny_gguf(tmp_path / f"clean-{embd}.gguf", embd)
        run_ml(path, "--prompt-ids", ",".join(map(str, PROMPT_BAD)), "-n", "4", "--print-ids")


@pytest.mark.parametrize("case", CASES)
def test_non_finite_weights_fail_on_one_line_naming_the_tensor(tmp_path, case):
    embd, poison, says, *rest = CASES[case]
    options, q5k = (rest[0] if rest else []), len(rest) > 1 and rest[1]
    path = tiny_gguf(tmp_path / "poisoned.gguf", embd, poison, q5k)
    p = run_ml(path, *options, "--prompt-ids", ",".join(map(str, PROMPT_BAD)), "-n", "4", check=False)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "loaded in" not in ln]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    assert lines[0].startswith(f"krafla: {path}: {says}"), lines[0]
    assert p.stdout == "", "no text from NaN"


@pytest.fixture(scope="module")
def poisoned_server(tmp_path_factory):
    """A server of the model whose token BAD has a NaN in its (f32, used in place) embedding row:
    a prompt holding BAD gets NaN logits, the others are fine."""
    root = tmp_path_factory.mktemp("nonfinite-server")
    path = tiny_gguf(root / "poisoned.gguf", "F32", nan_at("token_embd.weight", BAD, 3))
    s = ServerProcess([ml_bin(), "--server", path, "--port", 0, "-t", 2, "--parallel", 2, "--ctx", 64],
                      root / "server.log", start_timeout=60, stop_timeout=10)
    yield s
    s.stop()


def post(srv, body, timeout=60):
    import http.client

    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def test_the_server_fails_that_request_only(poisoned_server):
    """The poisoned prompt and a clean one sent together (two slots: the same steps): the first
    gets a 500 naming the tensor, the second its tokens; then the server answers /health and
    serves the next requests, streamed or not."""
    results = {}

    def send(key, prompt, **extra):
        results[key] = post(poisoned_server, {"prompt": prompt, "max_tokens": 8, "temperature": 0, **extra})

    threads = [threading.Thread(target=send, args=(k, p)) for k, p in (("bad", PROMPT_BAD), ("good", PROMPT_GOOD))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status, body = results["bad"]
    assert status == 500, (status, body)
    message = json.loads(body)["error"]["message"]
    assert f"tensor 'token_embd' has a non-finite value (NaN) at element {BAD * D + 3}" in message, message
    status, body = results["good"]
    assert status == 200, (status, body)
    assert json.loads(body)["usage"]["completion_tokens"] == 8

    import http.client

    c = http.client.HTTPConnection(poisoned_server.host, poisoned_server.port, timeout=30)
    c.request("GET", "/health")
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    c.close()
    # streamed: an error event, then the end of the stream
    status, body = post(poisoned_server, {"prompt": PROMPT_BAD, "max_tokens": 8, "stream": True})
    events = [json.loads(ln[6:]) for ln in body.decode().splitlines() if ln.startswith("data: {")]
    assert status == 200 and "token_embd" in events[-1]["error"]["message"], body
    assert body.decode().rstrip().endswith("data: [DONE]")
    # and the clean prompt still runs, in either slot
    for _ in range(2):
        status, body = post(poisoned_server, {"prompt": PROMPT_GOOD, "max_tokens": 4, "temperature": 0})
        assert status == 200, body
    # the log names the request and why
    failed = [ln for ln in poisoned_server.log_path.read_text().splitlines() if "not finite" in ln]
    assert len(failed) == 2 and all(ln.startswith("krafla: request cmpl-") and "'token_embd'" in ln for ln in failed)
