"""`ml_run --server`: the OpenAI-compatible API, driven by the real `openai`
client (and raw HTTP for malformed requests) against SmolLM2-135M-Instruct
in Q4_0, plus the built-in chat page in headless Chromium."""
import codecs
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid

import openai
import pytest

from conftest import ServerProcess, ml_bin

KEY = "test-key-123"
ALIAS = "smol"
CTX = 512
MAX_BODY = 65536


@pytest.fixture(scope="session")
def smol_files(smol):
    """(model, tokenizer): SmolLM2 in Q4_0, converted once per session by conftest's `smol`."""
    return smol("q4_0"), smol("mlt")


class Server(ServerProcess):
    """A real server process on a free loopback port (--port 0, address read from its log)."""

    def __init__(self, tmp_path, files, *extra, key=KEY):
        self.key = key
        args = [ml_bin(), "--server", files[0], "-z", files[1], "--port", "0", "-t", "2", *extra]
        if key:
            args += ["--api-key", key]
        super().__init__(args, tmp_path / f"server-{uuid.uuid4().hex[:8]}.log", start_timeout=60, stop_timeout=10)
        self.base = f"http://{self.host}:{self.port}/v1"

    def client(self, key=None, **kw):
        return openai.OpenAI(base_url=self.base, api_key=key or self.key or "none", max_retries=0, timeout=60, **kw)

    def raw(self, method, path, body=None, headers=None, key=True, timeout=30):
        """(status, headers dict, body bytes) of one plain HTTP request."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = dict(headers or {})
        if key and self.key:
            h["Authorization"] = f"Bearer {self.key}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if body is not None:
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def log_text(self):
        return self.log_path.read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory, smol_files):
    s = Server(tmp_path_factory.mktemp("server"), smol_files, "--alias", ALIAS, "--ctx", CTX, "--max-body", MAX_BODY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory, smol_files):
    """One slot, one waiting request, a 2 s read timeout, no API key, CORS for one origin."""
    s = Server(tmp_path_factory.mktemp("server-q"), smol_files, "--ctx", CTX, "--parallel", 1, "--max-queue", 1,
               "--read-timeout", 2, "--cors-origin", "http://example.test", key=None)
    yield s
    s.stop()


def health(srv):
    status, _, body = srv.raw("GET", "/health", key=False)
    assert status == 200
    return json.loads(body)


def wait_health(srv, ok, what, timeout=10):
    """Polls /health until `ok(answer)`; fails naming `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    while not ok(h := health(srv)):
        assert time.time() < deadline, f"{what}: {h}"
        time.sleep(0.02)


def waiting_request(srv):
    """A two-token completion sent on a thread, returned once /health counts it as queued:
    (the thread, the dict its answer goes to as "r")."""
    result = {}
    waiter = threading.Thread(target=lambda: result.update(
        r=srv.client().completions.create(model="x", prompt="Hello", max_tokens=2, temperature=0)))
    waiter.start()
    wait_health(srv, lambda h: h["queued"] == 1, "the request never queued")
    return waiter, result


def error_of(status_body, status):
    """The OpenAI error object of a raw answer, checking status and shape."""
    st, hdrs, body = status_body
    assert st == status, (st, body)
    assert hdrs["content-type"].startswith("application/json")
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"]
    assert isinstance(err["type"], str) and isinstance(err["code"], str)
    return err


# ------------------------------------------------------------------ basics

def test_health_models_and_api_key(server):
    assert health(server)["status"] == "ok"  # no key needed
    models = server.client().models.list()
    assert [m.id for m in models.data] == [ALIAS]
    assert server.client().models.retrieve(ALIAS).id == ALIAS
    # Every other endpoint needs the key.
    err = error_of(server.raw("GET", "/v1/models", key=False), 401)
    assert err["type"] == "authentication_error"
    st, hdrs, _ = server.raw("POST", "/v1/completions", {"prompt": "x"}, key=False)
    assert st == 401 and hdrs["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong-key").completions.create(model=ALIAS, prompt="Hi", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        server.client(key=KEY + "4").models.list()
    # No CORS unless --cors-origin.
    st, hdrs, _ = server.raw("GET", "/v1/models")
    assert st == 200 and "access-control-allow-origin" not in hdrs
    assert server.raw("OPTIONS", "/v1/completions")[0] == 405


def test_chat_streamed_equals_non_streamed_and_multi_turn_reuses_cache(server):
    c = server.client()
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model=ALIAS, messages=msgs, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert r.object == "chat.completion" and r.model == ALIAS and r.choices[0].message.role == "assistant"
    u = r.usage
    assert u.prompt_tokens > 5 and 0 < u.completion_tokens <= 24
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert r.choices[0].finish_reason == ("length" if u.completion_tokens == 24 else "stop")

    chunks = list(c.chat.completions.create(model=ALIAS, messages=msgs, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [r.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    # The same conversation again comes from the cache (all but the last prompt token).
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1

    # A second turn: the first turn and the reply are reused from the KV cache.
    msgs2 = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    r2 = c.chat.completions.create(model=ALIAS, messages=msgs2, max_tokens=12, temperature=0)
    assert r2.usage.prompt_tokens > u.prompt_tokens + u.completion_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= u.prompt_tokens
    assert r2.choices[0].message.content


def test_completion_seed_reproducibility_and_stream(server):
    c = server.client()
    kw = dict(model=ALIAS, prompt="Once upon a time, in a small village,", max_tokens=10, temperature=1.0)
    a = c.completions.create(seed=42, **kw)
    b = c.completions.create(seed=42, **kw)
    assert a.choices[0].text == b.choices[0].text and a.object == "text_completion"
    assert a.choices[0].finish_reason == "length" and a.usage.completion_tokens == 10
    streamed = list(c.completions.create(seed=42, stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == a.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"
    others = {c.completions.create(seed=s, **kw).choices[0].text for s in (1, 2)}
    assert others != {a.choices[0].text}, "different seeds all gave the same text"


def test_streaming_never_splits_utf8(server):
    """Emoji span several byte-level tokens: deltas carry whole characters only."""
    c = server.client()
    kw = dict(model=ALIAS, prompt="Emoji list: \U0001F600 \U0001F603 \U0001F604 \U0001F601", max_tokens=8,
              temperature=0)
    full = c.completions.create(logprobs=0, **kw)
    toks = full.choices[0].logprobs.tokens
    assert sum(t.startswith("bytes:") for t in toks) >= 2, toks  # the model does emit partial characters
    chunks = [ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices]
    deltas = [d for d in chunks if d]
    assert "".join(deltas) == full.choices[0].text
    assert not any("\ufffd" in d for d in deltas), deltas
    # After each token the stream sends exactly the whole characters it has: a character's first bytes wait
    # for its last ones, and nothing whole waits longer.
    pieces = [token_bytes(t) for t in toks]
    text = full.choices[0].text
    ends = chars_before_each(pieces)[1:] + [len(text)]
    want = [text[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True) if b > a]
    assert deltas == want, (deltas, toks)
    assert any(ends_inside_a_character(b"".join(pieces[:n])) for n in range(1, len(pieces))), toks


def test_stop_strings_never_leak(server):
    c = server.client()
    kw = dict(model=ALIAS, prompt="The three primary colors are", max_tokens=16, temperature=0)
    full = c.completions.create(logprobs=1, **kw)
    text = full.choices[0].text
    toks = full.choices[0].logprobs.tokens
    assert "".join(toks) == text and len(toks) == 16
    # A stop string across a token boundary: the end of one token and the start of the next.
    # Prefer two characters from each side; fall back to one (the greedy text depends on the build).
    pairs = [(i, n) for n in (2, 1) for i in range(2, len(toks) - 1)
             if len(toks[i].strip()) >= n and len(toks[i + 1].strip()) >= n]
    i, n = pairs[0]
    stop = toks[i][-n:] + toks[i + 1][:n]
    want = text[:text.find(stop)]
    r = c.completions.create(stop=[stop, "zzzz-never"], **kw)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(stop=stop, stream=True, **kw))
    deltas = [ch.choices[0].text for ch in chunks if ch.choices]
    assert "".join(deltas) == want
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert not any(stop in d for d in deltas)


EMOJI_PROMPT = "Emoji list: \U0001F600\U0001F601\U0001F602 \u4e2d\u6587\uff1a\u4f60\u597d"


def token_bytes(tok):
    """The bytes of a legacy-completions logprobs token: its text, or OpenAI's "bytes:\\xNN" form."""
    if not tok.startswith("bytes:"):
        return tok.encode()
    out, rest = b"", tok[len("bytes:"):]
    while rest:
        if rest.startswith("\\x"):
            out, rest = out + bytes([int(rest[2:4], 16)]), rest[4:]
        else:
            out, rest = out + rest[0].encode(), rest[1:]
    return out


def ends_inside_a_character(data):
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    dec.decode(data)
    return dec.getstate()[0] != b""


def chars_before_each(pieces):
    """For byte strings `pieces`: how many whole characters the pieces before each one make."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    n, out = 0, []
    for p in pieces:
        out.append(n)
        n += len(dec.decode(p))
    return out


def check_cut_completion(c, max_tokens):
    """A greedy completion of EMOJI_PROMPT, streamed and not: no U+FFFD anywhere, partial tokens as OpenAI's
    "bytes:\\xNN", text_offset the character offsets (code points, Python's str indices) into `text`.
    Returns the tokens' bytes."""
    kw = dict(model=ALIAS, prompt=EMOJI_PROMPT, max_tokens=max_tokens, temperature=0)
    r = c.completions.create(logprobs=1, **kw)
    text, lp = r.choices[0].text, r.choices[0].logprobs
    assert r.usage.completion_tokens == max_tokens and r.choices[0].finish_reason == "length"
    assert "\ufffd" not in text, text
    assert "\ufffd" not in "".join(lp.tokens) and any(t.startswith("bytes:") for t in lp.tokens), lp.tokens
    pieces = [token_bytes(t) for t in lp.tokens]
    assert text == b"".join(pieces).decode("utf-8", "ignore")
    assert lp.text_offset == chars_before_each(pieces)
    assert all(0 <= o <= len(text) for o in lp.text_offset)
    for t in lp.top_logprobs:
        assert all("\ufffd" not in k for k in t), t
    chunks = [ch.choices[0] for ch in c.completions.create(stream=True, logprobs=1, **kw)]
    assert "".join(ch.text for ch in chunks) == text
    assert not any("\ufffd" in ch.text for ch in chunks)
    streamed = [ch.logprobs for ch in chunks if ch.logprobs]
    assert [t for x in streamed for t in x.tokens] == lp.tokens
    assert [o for x in streamed for o in x.text_offset] == lp.text_offset
    return pieces


def test_a_stream_cut_inside_a_character(server):
    """Issue 14, case 6, as written (max_tokens 40), then cut where the last token ends inside a character:
    its bytes are held back, never shown as U+FFFD."""
    c = server.client()
    pieces = check_cut_completion(c, 40)
    cuts = [n for n in range(1, len(pieces)) if ends_inside_a_character(b"".join(pieces[:n]))]
    assert cuts, pieces  # the model answers in multi-byte characters split across tokens
    cut = check_cut_completion(c, cuts[0])
    assert cut == pieces[:cuts[0]]


def test_chat_logprobs_of_partial_characters_carry_their_bytes(server):
    """Chat logprobs: each token's exact `bytes`; a token holding part of a character shows "\\xNN", not U+FFFD."""
    r = server.client().chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Repeat exactly: " + EMOJI_PROMPT}], max_tokens=24,
        temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    whole = b"".join(bytes(t.bytes) for t in content)
    assert r.choices[0].message.content == whole.decode("utf-8", "ignore")
    partial = [t for t in content if not _is_utf8(bytes(t.bytes))]
    assert partial, [t.token for t in content]  # the model answers with emoji or CJK, split across tokens
    for t in content:
        assert "\ufffd" not in t.token
        for alt in t.top_logprobs:
            assert "\ufffd" not in alt.token and alt.bytes is not None
    for t in partial:
        assert "\\x" in t.token, t.token


def _is_utf8(b):
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("field,value", [
    ("top_p", 2), ("top_p", -0.5), ("temperature", -1), ("min_p", 5), ("repeat_penalty", 0),
])
def test_sampling_values_the_cli_refuses_get_400(server, field, value):
    """Issue 14, case 3: the server checks sampling settings with the CLI's ranges (crate::sampler)."""
    err = error_of(server.raw("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, field: value}), 400)
    assert err["code"] == "invalid_value" and err["param"] == field
    assert re.fullmatch(rf"'{field}' must be a number (from \S+ to \S+|above 0 and at most 100)", err["message"]), err
    # NaN and infinities are not JSON at all.
    for bad in ("NaN", "Infinity", "-Infinity"):
        body = f'{{"prompt": "x", "max_tokens": 1, "{field}": {bad}}}'
        assert error_of(server.raw("POST", "/v1/completions", body), 400)["code"] == "invalid_json"


def test_repeat_penalty_is_accepted(server):
    r = server.client().completions.create(model=ALIAS, prompt="a a a a a a", max_tokens=4, temperature=0,
                                           extra_body={"repeat_penalty": 1.5})
    assert r.usage.completion_tokens == 4


def test_integers_beyond_64_bits_are_out_of_range(server):
    """Issue 14, case 8: `max_tokens` 2**64 is too large, not "not an integer"."""
    for big in ("18446744073709551616", "-18446744073709551617", "1e30"):
        body = '{"prompt": "x", "max_tokens": ' + big + "}"
        err = error_of(server.raw("POST", "/v1/completions", body), 400)
        assert err["code"] == "invalid_value" and "must be an integer from 1 to" in err["message"], (big, err)
    err = error_of(server.raw("POST", "/v1/completions", '{"prompt": "x", "max_tokens": 2.5}'), 400)
    assert err["code"] == "invalid_type" and "must be an integer" in err["message"]


def test_head_follows_the_rules_of_get(server):
    """Issue 14, case 5: HEAD /health needs no key, as GET /health; HEAD of any route is its GET without a body."""
    for path, key in [("/health", False), ("/", False), ("/v1/models", True), ("/v1/models", False),
                      ("/v1/nothing", True), ("/v1/completions", True)]:
        g_st, g_hdrs, g_body = server.raw("GET", path, key=key)
        h_st, h_hdrs, h_body = server.raw("HEAD", path, key=key)
        assert h_st == g_st, (path, key, h_st, g_st)
        assert h_body == b""
        assert int(h_hdrs["content-length"]) == len(g_body) and h_hdrs["content-type"] == g_hdrs["content-type"]
    assert server.raw("HEAD", "/health", key=False)[0] == 200
    assert server.raw("HEAD", "/v1/models", key=False)[0] == 401
    # Nothing follows the head on the wire either.
    s = socket.create_connection((server.host, server.port), timeout=10)
    s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n"), data


@pytest.mark.parametrize("opt,value", [
    ("--max-body", "0"), ("--read-timeout", "0"), ("--read-timeout", "18446744073709551615"),
    ("--max-queue", "18446744073709551615"),
])
def test_limits_that_cannot_work_are_refused(smol_files, opt, value):
    """Issue 14, case 8: a limit the server cannot work with is refused at start, on one line, with exit 2."""
    p = subprocess.run([str(ml_bin()), "--server", str(smol_files[0]), "-z", str(smol_files[1]), "--port", "0",
                        opt, value], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"krafla: {opt} must be"), p.stderr
    assert "panicked" not in p.stderr


def test_log_lines_escape_client_and_file_text(tmp_path, smol_files):
    """A model id (from --alias or the file name) with control characters is logged escaped, on one line."""
    evil = "evil\x1b]0;PWNED\x07\nkrafla: fake line"
    srv = Server(tmp_path, smol_files, "--alias", evil, key=None)
    try:
        assert srv.client().models.list().data[0].id == evil  # the API gives it as it is (JSON escapes it)
    finally:
        srv.stop()
    log = srv.log_text()
    assert "\x1b" not in log and "\x07" not in log, repr(log)
    assert not any(line.startswith("krafla: fake line") for line in log.splitlines()), log


# --------------------------------------------------------------- the cache

def test_warm_cache_gives_bit_identical_logprobs(tmp_path, smol_files, server):
    c = server.client()
    base = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
            "combined movable metal type, oil-based ink and a wooden press. Within decades, print shops ")
    prompt_b = base + "appeared in every major European city, and"
    kw = dict(model=ALIAS, max_tokens=4, temperature=0, logprobs=5)
    # Warm: the cache holds `base` plus another continuation, so B reuses a prefix and truncates the rest.
    c.completions.create(prompt=base + "spread the new craft to Venice, Paris and", **kw)
    warm = c.completions.create(prompt=prompt_b, **kw)
    assert warm.usage.prompt_tokens_details.cached_tokens > 30
    again = c.completions.create(prompt=prompt_b, **kw)  # all cached but the last prompt token
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    cold_srv = Server(tmp_path, smol_files, "--ctx", CTX, key=None)
    try:
        cold = cold_srv.client().completions.create(prompt=prompt_b, **kw)
    finally:
        cold_srv.stop()
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    # JSON floats are shortest round-trip: equal values are equal bits.

    def lp(r):
        return r.choices[0].logprobs.model_dump()

    assert lp(warm) == lp(cold) and lp(again) == lp(cold)
    assert warm.choices[0].text == cold.choices[0].text
    assert len(lp(cold)["top_logprobs"][0]) == 5


# ------------------------------------------------------- queue, disconnects

def test_queue_full_gives_503_then_disconnect_frees_the_slot(small_queue_server):
    srv = small_queue_server
    c = srv.client()
    long_kw = dict(model="x", prompt="Once upon a time, there was a dragon who", max_tokens=400, temperature=0)
    stream = c.completions.create(stream=True, **long_kw)
    it = iter(stream)
    next(it), next(it)  # generating now
    assert health(srv)["slots_busy"] == 1

    # A second request waits its turn...
    waiter, result = waiting_request(srv)
    # ...and a third finds the queue full.
    err = error_of(srv.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}), 503)
    assert err["code"] == "queue_full" and "retry" in err["message"]
    with pytest.raises(openai.APIStatusError) as e:
        c.completions.create(model="x", prompt="Hi", max_tokens=1)
    assert e.value.status_code == 503

    # The streaming client hangs up: its generation stops and the waiting request runs at once.
    t0 = time.time()
    stream.close()
    waiter.join(20)
    assert not waiter.is_alive() and result["r"].usage.completion_tokens == 2
    assert time.time() - t0 < 5, "the cancelled generation kept the slot"
    m = re.search(r"generated (\d+) tokens.*finish cancelled", srv.log_text())
    assert m and int(m.group(1)) < 60, srv.log_text()
    # And a request after that is served promptly too.
    t1 = time.time()
    assert c.completions.create(model="x", prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
    assert time.time() - t1 < 5
    assert health(srv) == {"status": "ok", "slots_total": 1, "slots_busy": 0, "slots_idle": 1, "queued": 0}


def test_slow_client_times_out(small_queue_server):
    srv = small_queue_server
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
    t0 = time.time()
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 408"), data
    assert 1.5 < time.time() - t0 < 6
    assert health(srv)["status"] == "ok"
    # Chunked request bodies are refused (Content-Length is required).
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"e\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 411") and b'"length_required"' in data, data


def test_cors_only_for_the_given_origin(small_queue_server):
    srv = small_queue_server
    st, hdrs, _ = srv.raw("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://example.test", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert st == 204
    assert hdrs["access-control-allow-origin"] == "http://example.test"
    assert "POST" in hdrs["access-control-allow-methods"]
    assert "Authorization" in hdrs["access-control-allow-headers"]
    st, hdrs, _ = srv.raw("GET", "/v1/models", headers={"Origin": "http://example.test"})
    assert st == 200 and hdrs["access-control-allow-origin"] == "http://example.test"


# --------------------------------------------------------- bad requests

@pytest.mark.parametrize("path,body,code,param", [
    ("/v1/completions", "{not json", "invalid_json", None),
    ("/v1/completions", "", "invalid_json", None),
    ("/v1/completions", "[1, 2]", "invalid_json", None),
    ("/v1/completions", '"just a string"', "invalid_json", None),
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, "invalid_type", "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "invalid_type", "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": 5}, "invalid_value", "temperature"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "invalid_type", "stop"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "invalid_type", "stream"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "unsupported_value", "n"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "unsupported_value", "echo"),
    ("/v1/completions", {"prompt": "x", "tools": []}, "unsupported_parameter", "tools"),
    ("/v1/completions", {"max_tokens": 3}, "missing_parameter", "prompt"),
    ("/v1/completions", {"prompt": 12}, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [99999999]}, "invalid_value", "prompt"),
    ("/v1/chat/completions", {"messages": "hi"}, "invalid_type", "messages"),
    ("/v1/chat/completions", {"messages": []}, "invalid_value", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "function", "content": "x"}]}, "invalid_value", "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "invalid_type", "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}, "unsupported_value", "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1},
     "invalid_type", "logprobs"),
])
def test_malformed_requests_get_400(server, path, body, code, param):
    err = error_of(server.raw("POST", path, body), 400)
    assert err["code"] == code, err
    assert err["type"] == "invalid_request_error"
    if param:
        assert err["param"] == param and param.split("[")[0] in err["message"], err


def test_limits_and_routes(server):
    # A prompt longer than the context: the message names both numbers.
    st = server.raw("POST", "/v1/completions", {"prompt": "hello world " * 400, "max_tokens": 1})
    err = error_of(st, 400)
    assert err["code"] == "context_length_exceeded"
    n = int(re.search(r"has (\d+) tokens", err["message"]).group(1))
    assert n > CTX and str(CTX) in err["message"]
    # The openai client sees the same as an exception.
    with pytest.raises(openai.BadRequestError, match="n other than 1"):
        server.client().chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x"}], n=2)
    # Too large a body: 413 before reading it.
    err = error_of(server.raw("POST", "/v1/completions", b'{"prompt": "' + b"a" * (MAX_BODY + 10) + b'"}'), 413)
    assert str(MAX_BODY) in err["message"]
    assert error_of(server.raw("GET", "/v1/nothing"), 404)["code"] == "not_found"
    assert error_of(server.raw("GET", "/v1/completions"), 405)["code"] == "method_not_allowed"
    assert error_of(server.raw("GET", "/v1/models/other"), 404)["code"] == "model_not_found"
    # The chat page needs no key (it holds no data; its requests carry the key).
    st, hdrs, body = server.raw("GET", "/", key=False)
    assert st == 200 and hdrs["content-type"].startswith("text/html") and b"/v1/chat/completions" in body
    assert "connect-src 'self'" in hdrs["content-security-policy"]


# ------------------------------------------------------------ chat page

def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4, NUL-framed JSON)."""

    def __init__(self, exe, profile, size=(900, 640)):
        self.cmd_r, self.cmd_w = os.pipe()  # we write commands, Chromium reads fd 3
        self.out_r, self.out_w = os.pipe()  # Chromium writes fd 4, we read
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-pipe",
                 f"--window-size={size[0]},{size[1]}", "about:blank"]

        def fds():  # in the child: our pipe ends become fds 3 and 4
            import fcntl
            r, w = fcntl.fcntl(self.cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(self.out_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen([exe, *flags], preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        os.close(self.cmd_r)
        os.close(self.out_w)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def call(self, method, session=True, timeout=30, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise AssertionError(f"{method}: {reply['error']}")
                    return reply["result"]
            assert time.time() < deadline, f"no answer to {method}"
            import select
            if select.select([self.out_r], [], [], 1)[0]:
                chunk = os.read(self.out_r, 1 << 20)
                assert chunk, "chromium exited"
                self.buf += chunk

    def open(self, url):
        target = self.call("Target.createTarget", session=False, url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", session=False, targetId=target, flatten=True)["sessionId"]

    def eval(self, js):
        return self.call("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value")

    def wait_for(self, js, timeout=30):
        deadline = time.time() + timeout
        while not self.eval(js):
            assert time.time() < deadline, f"timed out waiting for {js}"
            time.sleep(0.1)

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.out_r)


def test_chat_page_streams_in_headless_chromium(server, tmp_path):
    """A person's view: type a question, press Enter, watch the streamed answer; screenshot it."""
    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed")
    question = "What is the capital of France?"
    want = server.client().chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": question}], max_tokens=12, temperature=0
    ).choices[0].message.content
    browser = Chromium(exe, tmp_path / "profile")
    try:
        # The key travels in the fragment (never sent to the server); the page keeps it in localStorage.
        browser.open(f"http://{server.host}:{server.port}/?temperature=0&max_tokens=12#key={KEY}")
        browser.wait_for("document.getElementById('model').textContent === " + json.dumps(ALIAS))
        assert browser.eval("location.hash") == ""
        browser.eval("document.getElementById('input').focus()")
        browser.call("Input.insertText", text=question)
        for kind in ("keyDown", "keyUp"):
            browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                         **({"text": "\r"} if kind == "keyDown" else {}))
        browser.wait_for("document.body.dataset.state === 'done'")
        reply = browser.eval("document.querySelector('#last-reply .body').textContent")
        assert reply == want
        stats = browser.eval("document.getElementById('last-stats').textContent")
        assert "tokens/s" in stats, stats
        assert browser.eval("document.querySelectorAll('.msg.user').length") == 1
        png = __import__("base64").b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    finally:
        browser.close()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    shot = tmp_path / "chat.png"
    shot.write_bytes(png)
    if os.environ.get("KRAFLA_SCREENSHOT"):
        shutil.copy(shot, os.environ["KRAFLA_SCREENSHOT"])


def test_context_shift_drops_the_oldest_turns(tmp_path, smol_files):
    """--context-shift: a conversation that leaves no room for its answer loses its oldest turns
    after the system message, instead of a 400; the answer is the one to the shorter conversation,
    and says what went (usage.context_shift, X-Context-Dropped-Tokens)."""
    long = "Tell me everything about the history of the moon and the sun, in detail. " * 4
    conv = [{"role": "system", "content": "Be brief."}]
    for i in range(4):
        conv += [{"role": "user", "content": f"{i}: {long}"}, {"role": "assistant", "content": long}]
    conv.append({"role": "user", "content": "What is the capital of France?"})
    body = {"messages": conv, "max_tokens": 8, "temperature": 0}
    plain = Server(tmp_path, smol_files, "--ctx", 256, "--chat", "chatml")
    try:
        status, _, got = plain.raw("POST", "/v1/chat/completions", body)
        assert status == 400 and b"context" in got
    finally:
        plain.stop()
    s = Server(tmp_path, smol_files, "--ctx", 256, "--chat", "chatml", "--context-shift")
    try:
        status, headers, got = s.raw("POST", "/v1/chat/completions", body)
        assert status == 200, got
        r = json.loads(got)
        shift = r["usage"]["context_shift"]
        assert shift["dropped_messages"] >= 1
        assert int(headers["x-context-dropped-tokens"]) == shift["dropped_tokens"] > 0
        kept = [conv[0]] + conv[1 + 2 * shift["dropped_messages"]:]
        status, headers, again = s.raw("POST", "/v1/chat/completions", {**body, "messages": kept})
        assert status == 200 and "x-context-dropped-tokens" not in headers
        assert json.loads(again)["choices"][0]["message"] == r["choices"][0]["message"]
        # streamed: the header too
        status, headers, _ = s.raw("POST", "/v1/chat/completions", {**body, "stream": True})
        assert status == 200 and int(headers["x-context-dropped-tokens"]) == shift["dropped_tokens"]
    finally:
        s.stop()
