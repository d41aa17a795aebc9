"""Several `ml_server` replicas behind nginx (docs/DEPLOY.md): the very
docs/deploy/nginx.conf, run unprivileged on loopback in front of two replicas
of SmolLM2-135M-Instruct in Q4_0. A conversation keyed by the X-Session-Id
header or by the body's "user" field stays on one replica (its second turn
comes from that replica's prompt cache); requests without a key spread; a
full replica's 503 is retried on the other; a replica killed with SIGKILL,
mid-stream, costs only that stream: the next requests, its conversation's
too, get 200 from the other replica. Every call has a timeout: nothing hangs.
Also: docs/deploy/kubernetes.yaml parses and holds what DEPLOY.md says."""
import http.client
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import REPO, ServerProcess, ml_bin, unavailable

NGINX = pathlib.Path("/usr/sbin/nginx")
DEPLOY = REPO / "docs" / "deploy"
KEY = "deploy-key-123"
# Options of every replica beyond the model, tokenizer and port: two slots,
# so two conversations keep their prompt caches on one replica.
REPLICA_ARGS = ["--parallel", "2"]
# Seconds any one HTTP call may take.
TIMEOUT = 60


class Replica(ServerProcess):
    """One ml_server on a free loopback port. --max-queue 1: with one request generating and one
    waiting, the next gets 503."""

    def __init__(self, tmp_path, files, name):
        cmd = [ml_bin(), "--server", files[0], "-z", files[1], "--port", "0", "-t", "1", "--ctx", "512",
               "--alias", "smol", "--api-key", KEY, "--max-queue", "1", *REPLICA_ARGS]
        super().__init__(cmd, tmp_path / f"replica-{name}.log", start_timeout=60, stop_timeout=10)
        self.addr = f"{self.host}:{self.port}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """docs/deploy/nginx.conf with its placeholders filled, run in the foreground as an unprivileged
    nginx would be (prefix, pid file and logs in `tmp_path`)."""

    def __init__(self, tmp_path, replicas):
        self.port = free_port()
        conf = (DEPLOY / "nginx.conf").read_text()
        conf = conf.replace("@LISTEN@", f"127.0.0.1:{self.port}").replace("@LOG_DIR@", str(tmp_path))
        for i, r in enumerate(replicas, 1):
            conf = conf.replace(f"@REPLICA_{i}@", r.addr)
        left = [ln for ln in conf.splitlines() if re.search(r"@[A-Z_0-9]+@", ln) and not ln.lstrip().startswith("#")]
        assert not left, f"placeholders left: {left}"
        self.conf = tmp_path / "nginx.conf"
        self.conf.write_text(conf)
        self.access_log = tmp_path / "krafla-access.log"
        self.error_log = tmp_path / "nginx-error.log"
        self.out = open(tmp_path / "nginx-out.log", "w")
        self.proc = subprocess.Popen(
            [NGINX, "-p", tmp_path, "-c", self.conf, "-e", self.error_log,
             "-g", f"daemon off; pid {tmp_path / 'nginx.pid'};"],
            stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise AssertionError(f"nginx did not start:\n{self.logs()}")
            time.sleep(0.05)

    def logs(self):
        return "\n".join(p.read_text() for p in [pathlib.Path(self.out.name), self.error_log] if p.exists())

    def lines(self):
        return self.access_log.read_text().splitlines() if self.access_log.exists() else []

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


def request(port, method, path, body=None, headers=None, timeout=TIMEOUT):
    """(status, headers dict, body bytes) of one plain HTTP request through nginx, with the API key."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    if body is not None:
        body = json.dumps(body).encode() if not isinstance(body, bytes) else body
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def health(replica):
    """The /health answer of a replica, asked directly."""
    c = http.client.HTTPConnection(replica.host, replica.port, timeout=TIMEOUT)
    c.request("GET", "/health")
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, data
    return json.loads(data)


class Pending:
    """A chat completion (not streamed) sent through nginx, its answer read later by `result`."""

    def __init__(self, port, headers, body):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **headers}
        self.conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=h)

    def result(self):
        """(status, decoded JSON)"""
        r = self.conn.getresponse()
        data = r.read()
        self.close()
        return r.status, json.loads(data)

    def close(self):
        self.conn.close()


class Stream:
    """A streamed chat completion through nginx, read up to its first token."""

    def __init__(self, port, headers, body):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **headers}
        self.conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}), headers=h)
        self.start()

    def start(self):
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        if self.status == 200:
            while not (line := self.resp.readline()).startswith(b"data: {"):
                assert line, "the stream ended before its first token"
        return self

    def finish(self):
        """Reads to the end: True if the stream ended with [DONE], False if it was cut off."""
        try:
            while line := self.resp.readline():
                if line.startswith(b"data: [DONE]"):
                    return True
            return False
        except (http.client.IncompleteRead, ConnectionError):
            return False
        finally:
            self.close()

    def close(self):
        self.conn.close()


@pytest.fixture(scope="module")
def smol_files(smol):
    return smol("q4_0"), smol("mlt")


@pytest.fixture
def cluster(tmp_path, smol_files):
    """(nginx, [replica 1, replica 2])."""
    if not NGINX.is_file():
        unavailable(f"nginx is not installed ({NGINX}: apt-get install nginx)")
    replicas = []
    lb = None
    try:
        for name in ["1", "2"]:
            replicas.append(Replica(tmp_path, smol_files, name))
        lb = Nginx(tmp_path, replicas)
        yield lb, replicas
    finally:
        if lb:
            lb.stop()
        for r in replicas:
            r.stop()


def test_conversations_stay_on_their_replica_and_survive_a_killed_one(cluster):
    lb, (r1, r2) = cluster
    t_start = time.time()

    tags = iter(range(1_000_000))

    def served(tag):
        """(upstream addresses, upstream statuses) in the access log line of the request tagged `tag`."""
        deadline = time.time() + 5
        while not (found := [ln for ln in lb.lines() if f"?tag={tag} HTTP/" in ln]):
            assert time.time() < deadline, f"no access log line for tag {tag}\n{lb.logs()}"
            time.sleep(0.01)
        m = re.search(r" upstream=(.*?) upstream_status=(.*?) session=", found[0])
        assert m, found[0]
        return m.group(1).split(", "), m.group(2).split(", ")

    def call(body, headers=None, path="/v1/chat/completions"):
        """(status, headers, decoded JSON, the replica address that answered, every address tried).
        A query string (which ml_server ignores) tags the request's access log line."""
        tag = next(tags)
        t0 = time.time()
        st, hdrs, data = request(lb.port, "POST", f"{path}?tag={tag}", body, headers)
        assert time.time() - t0 < 30, "a request took too long"
        addrs, _ = served(tag)
        return st, hdrs, json.loads(data), addrs[-1], addrs

    def probe(session=None, user=None, pad=0):
        """The replica that gets this key: a request the replica refuses at once (400: no messages)."""
        body = {"model": "smol"}
        if pad:
            body["padding"] = "x" * pad  # "user" after a large field: the whole body must be in memory
        if user is not None:
            body["user"] = user
        st, _, data, addr, _ = call(body, {"X-Session-Id": session} if session else None)
        assert st == 400, data
        return addr

    # The API key passes through.
    assert request(lb.port, "GET", "/v1/models")[0] == 200

    # A session key or a user key always goes to the same replica, and keys reach both replicas.
    sessions, users = {}, {}
    for i in range(64):
        sessions.setdefault(probe(session=f"conversation-{i}"), f"conversation-{i}")
        users.setdefault(probe(user=f"user-{i}"), f"user-{i}")
        if len(sessions) == 2 and len(users) == 2:
            break
    assert set(sessions) == set(users) == {r1.addr, r2.addr}, (sessions, users)
    for addr, key in sessions.items():
        assert {probe(session=key) for _ in range(4)} == {addr}
        assert probe(session=key, user="someone else") == addr  # the header wins over the body
    for addr, key in users.items():
        assert {probe(user=key) for _ in range(4)} == {addr}
        assert probe(user=key, pad=200_000) == addr  # found after 200 kB of body
    # Requests without a key spread over the replicas.
    seen = set()
    for _ in range(100):
        seen.add(probe())
        if len(seen) == 2:
            break
    assert seen == {r1.addr, r2.addr}, "requests without a key all went to one replica"

    # Three conversations, two turns each: the second turn comes from the replica's prompt cache.
    convs = {
        "a": ({"X-Session-Id": sessions[r1.addr]}, {}, r1.addr,
              ["What is the capital of France?", "And of Italy?"]),
        "b": ({"X-Session-Id": sessions[r2.addr]}, {}, r2.addr, ["Name a color.", "Another one?"]),
        "c": ({}, {"user": users[r1.addr]}, r1.addr, ["Count to three.", "And to five?"]),
    }
    history = {name: [] for name in convs}

    def turn(name, text, max_tokens=16):
        headers, extra, _, _ = convs[name]
        msgs = history[name] + [{"role": "user", "content": text}]
        st, _, r, addr, _ = call({"model": "smol", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                                  **extra}, headers)
        assert st == 200, r
        history[name] = msgs + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
        return r, addr

    # a and b on different replicas, interleaved; then c (on a's replica).
    first = {}
    for name in ["a", "b"]:
        first[name] = turn(name, convs[name][3][0])
    for name in ["a", "b"]:
        r, addr = turn(name, convs[name][3][1])
        assert first[name][1] == addr == convs[name][2]
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= first[name][0]["usage"]["prompt_tokens"], r
    r1st, addr1 = turn("c", convs["c"][3][0])
    r, addr = turn("c", convs["c"][3][1])
    assert addr1 == addr == r1.addr
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1st["usage"]["prompt_tokens"], r

    long = {"model": "smol", "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    # Long enough that the replica is still full when the next request comes.
    pending = {**long, "max_tokens": 400}
    short = {**long, "max_tokens": 12}

    def fill(replica, headers):
        """Requests of one conversation until `replica` is full: [a stream generating, requests (not streamed)
        generating or waiting...] (with several slots, more generate before one waits)."""
        streams = [Stream(lb.port, headers, long)]
        assert streams[0].status == 200
        for _ in range(4):
            streams.append(Pending(lb.port, headers, pending))
            # Full: every slot generating and one waiting (a request is briefly "queued" before the
            # worker's next step takes it into a free slot, so both are checked).
            deadline = time.time() + 2
            while time.time() < deadline:
                h = health(replica)
                if h["slots_busy"] == h["slots_total"] and h["queued"] >= 1:
                    return streams
                time.sleep(0.02)
        raise AssertionError(f"{replica.addr} never filled up: {health(replica)}")

    # A full replica: its 503 (queue full) is retried on the other replica.
    a_headers, b_headers = convs["a"][0], convs["b"][0]
    streams = fill(r1, a_headers)
    st, _, r, addr, tried = call({"model": "smol", "prompt": "Hi", "max_tokens": 2}, a_headers, "/v1/completions")
    assert st == 200 and tried == [r1.addr, r2.addr], (r, tried)

    # Replica 1 dies (SIGKILL) with a stream generating and a request waiting:
    # the stream is cut off at once; the waiting request had no answer yet,
    # so nginx sends it to replica 2, which answers it.
    t0 = time.time()
    os.kill(r1.proc.pid, signal.SIGKILL)
    r1.proc.wait(timeout=10)
    assert streams[0].finish() is False
    assert time.time() - t0 < 10
    for s in streams[1:]:
        st, r = s.result()
        assert st == 200 and r["choices"][0]["message"]["content"], r
    retried = f"upstream={r1.addr}, {r2.addr} upstream_status=502, 200"
    deadline = time.time() + 5
    while not any(retried in ln for ln in lb.lines()):
        assert time.time() < deadline, lb.lines()[-5:]
        time.sleep(0.01)

    # Conversation a goes on at replica 2 (without its cache there), b and c too, and so does the rest.
    for name, text in [("a", "And of Spain?"), ("b", "And a third?"), ("c", "And to seven?")]:
        _, addr = turn(name, text)
        assert addr == r2.addr
    st, _, r, addr, _ = call({"model": "smol", "prompt": "Once upon a time", "max_tokens": 4}, path="/v1/completions")
    assert st == 200 and addr == r2.addr, r
    assert Stream(lb.port, a_headers, short).finish() is True

    # Every replica full (or down): the client gets a 503 with Retry-After.
    streams = fill(r2, b_headers)
    s = Stream(lb.port, b_headers, short)
    err = json.loads(s.resp.read())["error"]
    s.close()
    assert s.status == 503 and int(s.headers["retry-after"]) >= 1, (s.status, s.headers)
    assert err["code"] in ("queue_full", "no_replica"), err
    for s in streams:
        s.close()
    # The clients hung up: replica 2 is free again at once (asked directly: a 503 through nginx
    # would count as one more failure of replica 2).
    deadline = time.time() + 10
    while (h := health(r2))["slots_busy"] or h["queued"]:
        assert time.time() < deadline, f"replica 2 stayed busy after its clients hung up: {h}"
        time.sleep(0.05)
    assert call({"model": "smol", "prompt": "Hi", "max_tokens": 2}, b_headers, "/v1/completions")[0] == 200

    # No replica left: a 503 with Retry-After in the OpenAI error shape, at once.
    os.kill(r2.proc.pid, signal.SIGKILL)
    r2.proc.wait(timeout=10)
    t0 = time.time()
    st, hdrs, data = request(lb.port, "POST", "/v1/completions", {"prompt": "Hi"})
    assert st == 503 and hdrs["retry-after"] == "5" and json.loads(data)["error"]["code"] == "no_replica", data
    assert time.time() - t0 < 10
    print(f"test_deploy: {time.time() - t_start:.1f} s with the replicas up")


def test_kubernetes_manifest():
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Deployment", "Service"}
    dep, svc = kinds["Deployment"], kinds["Service"]
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    (c,) = pod["spec"]["containers"]
    port = c["ports"][0]["containerPort"]
    assert int(ann["prometheus.io/port"]) == port
    args = c["args"]
    assert "--host" in args and args[args.index("--host") + 1] == "0.0.0.0"
    assert int(args[args.index("--port") + 1]) == port
    for probe in ["readinessProbe", "livenessProbe"]:
        assert c[probe]["httpGet"]["path"] == "/health" and c[probe]["httpGet"]["port"] == port
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert svc["spec"]["ports"][0]["targetPort"] == port


def test_deploy_md_quotes_the_config():
    """Every nginx block in docs/DEPLOY.md is part of docs/deploy/nginx.conf (comments and blank lines aside)."""

    def lines(text):
        return "\n".join(s for ln in text.splitlines() if (s := ln.strip()) and not s.startswith("#"))

    conf = lines((DEPLOY / "nginx.conf").read_text())
    blocks = re.findall(r"```nginx\n(.*?)```", (REPO / "docs" / "DEPLOY.md").read_text(), re.S)
    assert len(blocks) >= 5
    for block in blocks:
        assert lines(block) in conf, block
