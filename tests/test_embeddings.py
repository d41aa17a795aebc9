"""Embeddings (issue 36): `ml_run --embedding` and the server's `/v1/embeddings` against
transformers. The tiny fixtures (../shared/fixtures/hf-tiny) hold transformers' logits, which
are the output head applied to the last hidden state (after the final norm): so for every
family, head · mean-pooled embedding equals the mean of transformers' logits over the prompt's
positions, head · last-position embedding its last row and head · first-position embedding its
first (Gemma 2's soft-cap undone). Unit length by default; the same bits at any batch size
and thread count."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import FIXTURES, import_model, run_ml
from test_forward import FAMILIES, reference
from test_server import Server, smol_files  # noqa: F401 (smol_files is a fixture)


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    cache = {}
    root = tmp_path_factory.mktemp("embed")

    def get(family):
        if family not in cache:
            out = root / f"{family}.mlb"
            import_model(FIXTURES / "hf-tiny" / family, out, "--type", "f32")
            cache[family] = out
        return cache[family]

    return get


def head(family):
    """The output head [V][D] and the final soft-cap (0: none) of a fixture."""
    d = FIXTURES / "hf-tiny" / family
    weights = {}
    for f in sorted(d.glob("*.safetensors")):
        weights.update(load_file(f))
    cfg = json.loads((d / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    w = weights.get("lm_head.weight")
    if w is None:
        w = next(v for k, v in weights.items() if k.endswith("embed_tokens.weight"))
    return w.astype(np.float64), cfg.get("final_logit_softcapping") or 0.0


def embedding(mlb, ids, *extra):
    p = run_ml(mlb, "--prompt-ids", ",".join(map(str, ids)), "--embedding", *extra)
    return np.array(json.loads(p.stdout), dtype=np.float64)


@pytest.mark.parametrize("family", FAMILIES)
def test_pooled_hidden_states_match_transformers(family, f32_model):
    ids, logits, _ = reference(family)
    w, cap = head(family)
    want = logits.astype(np.float64)
    if cap:
        want = cap * np.arctanh(np.clip(want / cap, -1 + 1e-7, 1 - 1e-7))
    mlb = f32_model(family)
    for pooling, row in [("mean", want.mean(axis=0)), ("last", want[-1]), ("cls", want[0])]:
        e = embedding(mlb, ids, "--pooling", pooling, "--embd-normalize", "-1")
        got = w @ e
        err = np.abs(got - row).max() / max(np.abs(row).max(), 1e-6)
        # measured: at most 5.8e-6 over the ten fixtures (f32 against transformers' f32)
        assert err < 1e-4, f"{family} {pooling}: relative error {err:.2e}"
    unit = embedding(mlb, ids)
    assert abs(np.linalg.norm(unit) - 1) < 1e-6
    e = embedding(mlb, ids, "--pooling", "mean", "--embd-normalize", "-1")
    assert np.allclose(unit, e / np.linalg.norm(e), atol=1e-6)


def test_the_same_bits_at_any_batch_and_thread_count(f32_model):
    ids, _, _ = reference("llama2")
    mlb = f32_model("llama2")
    outs = {run_ml(mlb, "--prompt-ids", ",".join(map(str, ids)), "--embedding", "--batch", b, "-t", t).stdout
            for b, t in [(512, 1), (5, 2), (1, 2)]}
    assert len(outs) == 1


def test_embedding_needs_a_prompt(f32_model):
    p = run_ml(f32_model("llama2"), "--embedding", "--prompt-ids", "", check=False)
    assert p.returncode != 0 and p.stderr.count("\n") == 1, p.stderr


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory, smol_files):  # noqa: F811
    s = Server(tmp_path_factory.mktemp("embed-server"), smol_files, "--embedding", "--ctx", 256)
    yield s
    s.stop()


TEXTS = ["The capital of France is Paris.", "Les volcans d'Islande", "a <|im_end|> b", "x"]


def test_server_embeddings_equal_the_cli_bits(embed_server, smol_files):  # noqa: F811
    client = embed_server.client()
    # the openai client asks for base64 and decodes it; the floats are the same bits
    r = client.embeddings.create(model="smol", input=TEXTS)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    status, _, body = embed_server.raw("POST", "/v1/embeddings", {"input": TEXTS, "encoding_format": "float"})
    assert status == 200, body
    floats = json.loads(body)
    assert floats["usage"]["prompt_tokens"] == r.usage.prompt_tokens > len(TEXTS)
    for text, d, f in zip(TEXTS, r.data, floats["data"], strict=True):
        cli = run_ml(smol_files[0], "-z", smol_files[1], "-p", text, "--embedding").stdout
        want = np.array(json.loads(cli), dtype=np.float32)
        assert np.array_equal(np.array(d.embedding, dtype=np.float32), want), text
        assert np.array_equal(np.array(f["embedding"], dtype=np.float32), want), text
        assert abs(np.linalg.norm(want) - 1) < 1e-5
    # one at a time, or as token ids: the same vectors
    one = client.embeddings.create(model="smol", input=TEXTS[2]).data[0].embedding
    assert one == r.data[2].embedding
    ids = json.loads(run_ml("-z", smol_files[1], "-p", TEXTS[0], "--tokenize").stdout)
    assert client.embeddings.create(model="smol", input=[ids]).data[0].embedding == r.data[0].embedding


@pytest.mark.parametrize("body, words", [
    ({}, b"'input' is required"),
    ({"input": []}, b"empty array"),
    ({"input": [""]}, b"input 0 is empty"),
    ({"input": [1, -2]}, b"token ids"),
    ({"input": {"a": 1}}, b"must be a string"),
    ({"input": "x", "encoding_format": "int8"}, b"encoding_format"),
    ({"input": "x", "dimensions": 7}, b"dimensions"),
    ({"input": "x", "extra": 1}, b"'extra'"),
    ({"input": "x " * 300}, b"context"),
])
def test_bad_embedding_requests_are_400(embed_server, body, words):
    status, _, got = embed_server.raw("POST", "/v1/embeddings", body)
    assert status == 400 and words in got, got


def test_without_embedding_the_endpoint_says_how(tmp_path, smol_files):  # noqa: F811
    s = Server(tmp_path, smol_files, "--ctx", 128)
    try:
        status, _, got = s.raw("POST", "/v1/embeddings", {"input": "x"})
        assert status == 501 and b"--embedding" in got
    finally:
        s.stop()
