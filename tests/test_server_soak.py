"""A bounded soak of `ml_run --server` (issue 14): several client threads at once send a mix of valid
requests, invalid ones (bad JSON, bad fields, bad HTTP, too large, no key), streams the client drops
mid-way, requests dropped while queued, and slowloris heads the read timeout must cut. Afterwards the
server answers exactly as it did before, its memory (VmRSS) is within 2 % of the level after a warm-up
phase with the same mix, and its thread count is back to where it started (a thread left behind per
dropped client fails this). About 70 s; KRAFLA_SOAK_SECONDS sets the length of the measured phase."""
import json
import os
import random
import socket
import threading
import time

import pytest

from conftest import ServerProcess, ml_bin

KEY = "soak-key"
CTX = 512
READ_TIMEOUT = 2
MAX_BODY = 16384
CLIENTS = 6
WARMUP_S = 20
SOAK_S = float(os.environ.get("KRAFLA_SOAK_SECONDS", 45))
# VmRSS after the soak may exceed the level after the warm-up by this fraction. Measured here (2 cores,
# ~216 MiB resident: the mapped weights, their repacked copy, the KV cache): +0.0 % to +0.1 % (at most
# 144 KiB) over four clean runs of 45 s, ~640 requests each (glibc keeps freed memory in its arenas, which
# the warm-up has already grown to this concurrency). 2 % (~4.3 MiB) is twenty times that spread and
# still fails a leak of ~7 KiB per request; a server leaking 64 KiB per generation request measured +6.8 %
# after a 20 s soak, and one keeping a thread per dropped client failed the thread count.
RSS_SLACK = 0.02


def proc_status(pid):
    """(VmRSS in KiB, Threads) of process `pid`."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.split()
    return int(fields["VmRSS"][0]), int(fields["Threads"][0])


def exchange(host, port, data, timeout=30, read=True):
    """Sends raw bytes on a new connection; returns everything the server sends until it closes."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while read:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def post(path, body, key=True, extra=b""):
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    auth = f"Authorization: Bearer {KEY}\r\n".encode() if key else b""
    return (f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode() + auth + extra + b"\r\n" + body


def status_of(answer):
    line = answer.split(b"\r\n", 1)[0]
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None


def body_of(answer):
    return answer.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in answer else b""


GREEDY = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}

# (name, raw request, acceptable statuses): invalid requests of every kind.
INVALID = [
    ("bad json", post("/v1/completions", "{not json"), {400}),
    ("wrong type", post("/v1/completions", {"prompt": "x", "max_tokens": "5"}), {400}),
    ("top_p 2", post("/v1/completions", {"prompt": "x", "top_p": 2}), {400}),
    ("max_tokens 2^64", post("/v1/completions", '{"prompt": "x", "max_tokens": 18446744073709551616}'), {400}),
    ("unknown field", post("/v1/chat/completions", {"messages": [], "tools": []}), {400}),
    ("no key", post("/v1/completions", GREEDY, key=False), {401}),
    ("wrong route", b"GET /v1/nothing HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n",
     {404}),
    ("HEAD no key", b"HEAD /v1/models HTTP/1.1\r\nHost: soak\r\n\r\n", {401}),
    ("too large", post("/v1/completions", '{"prompt": "' + "a" * (MAX_BODY + 1) + '"}'), {413}),
    ("chunked", b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n", {411}),
    ("bad http", b"GET /\x01 HTTP/9\r\n\r\n", {400}),
    ("context too long", post("/v1/completions", {"prompt": "word " * 600, "max_tokens": 1}), {400}),
]


class Soak:
    """The mixed workload, run from CLIENTS threads until a deadline; counts what happened."""

    def __init__(self, srv, expected_text):
        self.srv = srv
        self.expected = expected_text
        self.counts = {}
        self.errors = []
        self.lock = threading.Lock()

    def count(self, name):
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1

    def fail(self, msg):
        with self.lock:
            self.errors.append(msg)

    def valid(self, rng):
        stream = rng.random() < 0.5
        ans = exchange(self.srv.host, self.srv.port, post("/v1/completions", {**GREEDY, "stream": stream}))
        st = status_of(ans)
        if st == 503:  # the queue is full: a correct answer under this load
            return self.count("valid: 503")
        if st != 200:
            return self.fail(f"valid request got {ans[:300]!r}")
        body = body_of(ans)
        if stream:  # chunked SSE: the text deltas are in the data lines
            text = "".join(json.loads(line[6:])["choices"][0]["text"]
                           for line in body.decode().split("\n")
                           if line.startswith("data: {") and json.loads(line[6:]).get("choices"))
        else:
            text = json.loads(body)["choices"][0]["text"]
        if text != self.expected:
            return self.fail(f"greedy text {text!r}, expected {self.expected!r}")
        self.count("valid: 200")

    def chat(self, rng):
        body = {"messages": [{"role": "user", "content": f"Say hello {rng.randrange(1000)}"}], "max_tokens": 2}
        st = status_of(exchange(self.srv.host, self.srv.port, post("/v1/chat/completions", body)))
        if st not in (200, 503):
            return self.fail(f"chat got {st}")
        self.count(f"chat: {st}")

    def invalid(self, rng):
        name, raw, want = rng.choice(INVALID)
        try:
            ans = exchange(self.srv.host, self.srv.port, raw)
        except ConnectionResetError:  # the server may close before reading all of a too-large body
            return self.count(f"invalid: {name}: reset")
        if status_of(ans) not in want:
            return self.fail(f"{name}: got {ans[:200]!r}")
        self.count("invalid")

    def drop_stream(self, rng):
        """A streamed generation the client hangs up on after the first chunks."""
        s = socket.create_connection((self.srv.host, self.srv.port), timeout=30)
        try:
            s.sendall(post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 300, "stream": True,
                                               "temperature": 1.0, "seed": rng.randrange(1 << 30)}))
            got = b""
            while got.count(b"data: ") < 2 and b"503" not in got[:20]:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        finally:
            s.close()
        self.count("dropped stream")

    def drop_queued(self, rng):
        """A request the client hangs up on at once (queued or just started)."""
        exchange(self.srv.host, self.srv.port, post("/v1/completions", {"prompt": "Hello", "max_tokens": 50}),
                 read=False)
        self.count("dropped request")

    def slowloris(self, rng):
        """A head sent a few bytes at a time, never finished: the read timeout must cut it."""
        s = socket.create_connection((self.srv.host, self.srv.port), timeout=READ_TIMEOUT + 10)
        t0 = time.time()
        try:
            head = b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nX-Slow: " + b"a" * 40
            for i in range(0, len(head), 8):
                s.sendall(head[i:i + 8])
                time.sleep(0.3)
                if time.time() - t0 > READ_TIMEOUT + 1:
                    break
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            data = b"(reset)"
        finally:
            s.close()
        took = time.time() - t0
        if took > READ_TIMEOUT + 4:
            return self.fail(f"a slow head was held for {took:.1f} s (--read-timeout {READ_TIMEOUT})")
        if not (data.startswith(b"HTTP/1.1 408") or data == b"(reset)"):
            return self.fail(f"a slow head got {data[:200]!r}")
        self.count("slowloris cut")

    def client(self, seed, deadline):
        rng = random.Random(seed)
        kinds = [self.valid, self.valid, self.chat, self.invalid, self.invalid, self.invalid, self.drop_stream,
                 self.drop_queued, self.slowloris]
        while time.time() < deadline:
            try:
                rng.choice(kinds)(rng)
            except Exception as e:  # noqa: BLE001 (any exception is a finding; keep the other clients going)
                self.fail(f"{type(e).__name__}: {e}")

    def run(self, seconds, seed):
        deadline = time.time() + seconds
        peak = [0]

        def watch():
            while time.time() < deadline:
                peak[0] = max(peak[0], proc_status(self.srv.proc.pid)[1])
                time.sleep(0.2)

        threads = [threading.Thread(target=self.client, args=(seed * 100 + i, deadline)) for i in range(CLIENTS)]
        threads.append(threading.Thread(target=watch))
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        return peak[0]


def health(srv):
    ans = exchange(srv.host, srv.port, b"GET /health HTTP/1.1\r\nHost: soak\r\n\r\n")
    assert status_of(ans) == 200, ans
    return json.loads(body_of(ans))


def settle(srv, threads_at_start, timeout=15):
    """Waits until the server is idle and has no connection thread left; returns (rss, threads)."""
    deadline = time.time() + timeout
    while True:
        h = health(srv)
        idle = h["status"] == "ok" and h["slots_busy"] == 0 and h["queued"] == 0
        time.sleep(0.3)  # the health request's own thread ends
        rss, threads = proc_status(srv.proc.pid)
        if idle and threads <= threads_at_start:
            return rss, threads
        if time.time() > deadline:
            return rss, threads
        time.sleep(0.2)


@pytest.fixture
def soak_server(tmp_path, smol):
    srv = ServerProcess([ml_bin(), "--server", smol("q4_0"), "-z", smol("mlt"), "--port", "0", "-t", "2",
                         "--ctx", CTX, "--api-key", KEY, "--max-queue", 3, "--read-timeout", READ_TIMEOUT,
                         "--max-body", MAX_BODY],
                        tmp_path / "soak.log", start_timeout=60, stop_timeout=10)
    yield srv
    srv.stop()


def greedy_answer(srv):
    ans = exchange(srv.host, srv.port, post("/v1/completions", {**GREEDY, "logprobs": 2}))
    assert status_of(ans) == 200, ans
    choice = json.loads(body_of(ans))["choices"][0]
    return choice["text"], choice["logprobs"]


def test_server_soak(soak_server):
    srv = soak_server
    t_start = time.time()
    time.sleep(0.5)
    _, threads_start = proc_status(srv.proc.pid)
    text0, logprobs0 = greedy_answer(srv)
    assert text0
    rss_cold, _ = proc_status(srv.proc.pid)

    # Warm-up: the same mix, so that the KV cache pages, the allocator's arenas and the buffers of this
    # concurrency exist before the memory is measured.
    warm = Soak(srv, text0)
    warm.run(WARMUP_S, seed=1)
    assert not warm.errors, warm.errors[:10]
    rss_warm, threads_warm = settle(srv, threads_start)
    assert threads_warm == threads_start, f"threads after the warm-up: {threads_warm}, at the start {threads_start}"

    soak = Soak(srv, text0)
    peak = soak.run(SOAK_S, seed=2)
    assert not soak.errors, soak.errors[:10]
    rss_end, threads_end = settle(srv, threads_start)
    total = sum(soak.counts.values())
    summary = (f"{total} requests in {SOAK_S:.0f} s: {dict(sorted(soak.counts.items()))}; threads {threads_start} "
               f"at the start, {peak} at the peak, {threads_end} after; VmRSS {rss_cold} KiB after one request, "
               f"{rss_warm} KiB after the warm-up, "
               f"{rss_end} KiB after the soak ({(rss_end - rss_warm) / rss_warm:+.1%}); "
               f"{time.time() - t_start:.0f} s in all")
    print(summary)

    # The load really happened: every kind of client ran, and connections overlapped.
    for kind in ("valid: 200", "invalid", "dropped stream", "dropped request", "slowloris cut"):
        assert soak.counts.get(kind, 0) >= 2, summary
    assert peak >= threads_start + 3, summary
    # No thread left behind, memory flat.
    assert threads_end == threads_start, summary
    assert rss_end <= rss_warm * (1 + RSS_SLACK), summary
    # And the server still answers, exactly as before.
    assert greedy_answer(srv) == (text0, logprobs0)
    h = health(srv)
    assert h["status"] == "ok" and h["slots_busy"] == 0 and h["queued"] == 0, h
    log = (srv.log_path).read_text()
    assert "panicked" not in log, log[-2000:]
