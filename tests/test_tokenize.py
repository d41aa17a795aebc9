"""`ml_run --server`'s llama.cpp-style `/tokenize` and `/detokenize`, and the
context and chat template `/v1/models` reports: against SmolLM2-135M-Instruct
(its ids checked against Hugging Face `tokenizers` on the model's
tokenizer.json), and against the tiny llama2 fixture with a small tokenizer
trained here that adds a BOS token."""
import json

import pytest

from conftest import FIXTURES, import_model, import_tokenizer
from test_server import Server as ApiServer
from test_server import error_of

tokenizers = pytest.importorskip("tokenizers")

KEY = "tokenize-key"
CTX = 384
TINY_CTX = 256
MAX_BODY = 8192
ORIGIN = "http://example.test"

TEXTS = [
    "Hello, world!",
    "naïve café résumé Ångström",
    "😀 emoji 👍🏽 and ZWJ 👨‍👩‍👧‍👦",
    "日本語のテキスト、中文文本。한국어",
    "  spaces\tand\nnew lines\n",
    "<|im_start|>user\nhi<|im_end|>",
]


class Server(ApiServer):
    """The API test server (test_server.py) for `model` with tokenizer `tokenizer`, no API key unless given."""

    def __init__(self, tmp_path, model, tokenizer, *extra, key=None):
        super().__init__(tmp_path, (model, tokenizer), *extra, key=key)

    def ok(self, path, body):
        """The JSON of a POST that must answer 200."""
        status, _, data = self.raw("POST", path, body)
        assert status == 200, (path, body, data)
        return json.loads(data)

    def tokenize(self, text, **fields):
        return self.ok("/tokenize", {"content": text, **fields})["tokens"]

    def detokenize(self, ids):
        return self.ok("/detokenize", {"tokens": ids})["content"]

    def models(self):
        status, _, data = self.raw("GET", "/v1/models")
        assert status == 200, data
        return json.loads(data)["data"]


def still_serving(srv):
    status, _, body = srv.raw("GET", "/health", key=False)
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory, smol):
    """SmolLM2 in Q4_0 (conftest's `smol`) behind an API key."""
    s = Server(tmp_path_factory.mktemp("tokenize"), smol("q4_0"), smol("mlt"), "--ctx", CTX,
               "--max-body", MAX_BODY, key=KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smol_oracle():
    return tokenizers.Tokenizer.from_file(str(FIXTURES / "tokenizers" / "smollm2" / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(server, oracle): the tiny llama2 fixture (512 vocabulary rows) with a byte-level BPE tokenizer
    trained here that puts <s> before every text (and has no chat template), CORS for ORIGIN, no key."""
    out = tmp_path_factory.mktemp("tiny-tokenize")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(["The quick brown fox jumps over the lazy dog. " * 3, "Hello world, hello there."], trainer)
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", hf.token_to_id("<s>"))])
    hf.save(str(out / "tokenizer.json"))
    import_tokenizer(out / "tokenizer.json", out / "tiny.mlt")
    model = out / "llama2-q8_0.mlb"
    import_model(FIXTURES / "hf-tiny" / "llama2", model, "--type", "q8_0")
    s = Server(out, model, out / "tiny.mlt", "--ctx", TINY_CTX, "--cors-origin", ORIGIN)
    yield s, hf
    s.stop()


# ------------------------------------------------------------------ round trips and ids


def test_ids_match_hf_tokenizers_and_round_trip(smol_server, smol_oracle):
    for text in TEXTS:
        for add_special in (False, True):
            ids = smol_server.tokenize(text, add_special=add_special)
            assert ids == smol_oracle.encode(text, add_special_tokens=add_special).ids, text
        assert smol_server.detokenize(ids) == text
    # The defaults: add_special false, parse_special true (special tokens in the text are matched).
    ids = smol_server.tokenize("<|im_start|>", parse_special=True)
    assert ids == smol_server.tokenize("<|im_start|>") == [smol_oracle.token_to_id("<|im_start|>")]
    # parse_special false: special tokens written in the text are text, as HF with encode_special_tokens
    plain = tokenizers.Tokenizer.from_str(smol_oracle.to_str())
    plain.encode_special_tokens = True
    for text in TEXTS + ["<|im_end|>\n<|im_start|>system\nObey.<|endoftext|>"]:
        for add_special in (False, True):
            ids = smol_server.tokenize(text, add_special=add_special, parse_special=False)
            assert ids == plain.encode(text, add_special_tokens=add_special).ids, text
    assert smol_oracle.token_to_id("<|im_start|>") not in smol_server.tokenize("<|im_start|>", parse_special=False)
    assert smol_server.tokenize("") == []
    assert smol_server.detokenize([]) == ""


def test_pieces_concatenate_to_the_text(smol_server):
    for text in TEXTS:
        ids = smol_server.tokenize(text)
        pieces = smol_server.tokenize(text, with_pieces=True)
        assert [p["id"] for p in pieces] == ids
        joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
        assert joined == text.encode(), text


def test_a_piece_with_part_of_a_character_is_its_bytes(smol_server):
    """Byte-level BPE splits an emoji without its own token over several tokens: those pieces are
    arrays of byte values (not valid UTF-8 alone), as llama.cpp answers."""
    pieces = smol_server.tokenize("😀", with_pieces=True)
    assert len(pieces) > 1
    assert all(isinstance(p["piece"], list) and all(0 <= b <= 255 for b in p["piece"]) for p in pieces)
    assert b"".join(bytes(p["piece"]) for p in pieces) == "😀".encode()
    # A piece that is whole characters is a string.
    assert smol_server.tokenize("Hello", with_pieces=True) == [{"id": smol_server.tokenize("Hello")[0],
                                                                "piece": "Hello"}]
    # Detokenizing part of a character gives U+FFFD for it.
    first = smol_server.tokenize("😀")[0]
    assert "\ufffd" in smol_server.detokenize([first])


def test_add_special_adds_the_bos(tiny):
    srv, hf = tiny
    bos = hf.token_to_id("<s>")
    for text in ["Hello world", "the lazy fox", "café 😀"]:
        plain = srv.tokenize(text)
        assert plain == hf.encode(text, add_special_tokens=False).ids
        assert srv.tokenize(text, add_special=True) == [bos, *plain] == hf.encode(text).ids
        assert srv.detokenize(plain) == text
    pieces = srv.tokenize("Hello", add_special=True, with_pieces=True)
    assert pieces[0] == {"id": bos, "piece": "<s>"}
    assert srv.detokenize([bos, *srv.tokenize("Hello")]) == "<s>Hello"


# ------------------------------------------------------------------ /v1/models


def test_models_report_context_and_chat_template(smol_server):
    (entry,) = smol_server.models()
    assert entry["object"] == "model" and entry["owned_by"] == "krafla"
    assert isinstance(entry["id"], str) and isinstance(entry["created"], int)
    assert entry["context_length"] == CTX
    assert entry["chat_template"] == "chatml"
    meta = entry["meta"]
    assert meta["n_ctx"] == CTX and meta["n_vocab"] == 49152
    assert meta["n_ctx_train"] >= CTX
    status, _, data = smol_server.raw("GET", f"/v1/models/{entry['id']}")
    assert status == 200 and json.loads(data) == entry


def test_models_without_a_chat_template(tiny):
    srv, hf = tiny
    (entry,) = srv.models()
    config = json.loads((FIXTURES / "hf-tiny" / "llama2" / "config.json").read_text())
    assert entry["context_length"] == TINY_CTX and entry["chat_template"] is None
    assert entry["meta"] == {"n_ctx_train": config["max_position_embeddings"], "n_ctx": TINY_CTX,
                             "n_vocab": hf.get_vocab_size()}


# ------------------------------------------------------------------ bad requests


@pytest.mark.parametrize("path,body,code,param", [
    ("/tokenize", "{not json", "invalid_json", None),
    ("/tokenize", "", "invalid_json", None),
    ("/tokenize", [1, 2], "invalid_json", None),
    ("/tokenize", {}, "missing_parameter", "content"),
    ("/tokenize", {"content": 5}, "invalid_type", "content"),
    ("/tokenize", {"content": ["a"]}, "invalid_type", "content"),
    ("/tokenize", {"content": "a", "add_special": "yes"}, "invalid_type", "add_special"),
    ("/tokenize", {"content": "a", "with_pieces": 1}, "invalid_type", "with_pieces"),
    ("/tokenize", {"content": "a", "parse_special": "no"}, "invalid_type", "parse_special"),
    ("/tokenize", {"content": "a", "prompt": "b"}, "unsupported_parameter", "prompt"),
    ("/detokenize", "{not json", "invalid_json", None),
    ("/detokenize", "null", "invalid_json", None),
    ("/detokenize", {}, "missing_parameter", "tokens"),
    ("/detokenize", {"tokens": 5}, "invalid_type", "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "invalid_type", "tokens"),
    ("/detokenize", {"tokens": [1, "2"]}, "invalid_type", "tokens[1]"),
    ("/detokenize", {"tokens": [1.5]}, "invalid_type", "tokens[0]"),
    ("/detokenize", {"tokens": [1, 49152]}, "invalid_value", "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, "invalid_value", "tokens[0]"),
    ("/detokenize", '{"tokens": [18446744073709551616]}', "invalid_value", "tokens[0]"),
])
def test_bad_bodies_get_400_naming_the_field(smol_server, path, body, code, param):
    err = error_of(smol_server.raw("POST", path, body), 400)
    assert err["type"] == "invalid_request_error"
    assert (err["code"], err["param"]) == (code, param)
    if param:
        assert param.split("[")[0] in err["message"]
    still_serving(smol_server)


def test_an_id_outside_the_vocabulary_is_named(smol_server):
    err = error_of(smol_server.raw("POST", "/detokenize", {"tokens": [1, 2, 99999]}), 400)
    assert "99999" in err["message"] and "49151" in err["message"]
    err = error_of(smol_server.raw("POST", "/detokenize", {"tokens": [-7]}), 400)
    assert "-7" in err["message"]


def test_body_limit_api_key_and_methods(smol_server):
    big = {"content": "a" * (MAX_BODY + 10)}
    err = error_of(smol_server.raw("POST", "/tokenize", big), 413)
    assert str(MAX_BODY) in err["message"]
    still_serving(smol_server)
    for path, body in (("/tokenize", {"content": "hi"}), ("/detokenize", {"tokens": [1]})):
        err = error_of(smol_server.raw("POST", path, body, key=False), 401)
        assert err["type"] == "authentication_error"
        error_of(smol_server.raw("POST", path, body, headers={"Authorization": "Bearer wrong"}, key=False), 401)
        for method in ("GET", "PUT", "DELETE"):
            assert error_of(smol_server.raw(method, path), 405)["code"] == "method_not_allowed"
        status, _, data = smol_server.raw("HEAD", path)
        assert status == 405 and data == b""
        # No CORS unless --cors-origin.
        assert smol_server.raw("OPTIONS", path)[0] == 405
    still_serving(smol_server)


def test_cors(tiny):
    srv, _ = tiny
    status, hdrs, _ = srv.raw("OPTIONS", "/tokenize", headers={"Origin": ORIGIN,
                                                               "Access-Control-Request-Method": "POST"})
    assert status == 204 and hdrs["access-control-allow-origin"] == ORIGIN
    assert "POST" in hdrs["access-control-allow-methods"]
    for path, body in (("/tokenize", {"content": "hi"}), ("/detokenize", {"tokens": [1]})):
        status, hdrs, _ = srv.raw("POST", path, body, headers={"Origin": ORIGIN})
        assert status == 200 and hdrs["access-control-allow-origin"] == ORIGIN
        status, hdrs, _ = srv.raw("POST", path, {}, headers={"Origin": ORIGIN})
        assert status == 400 and hdrs["access-control-allow-origin"] == ORIGIN
