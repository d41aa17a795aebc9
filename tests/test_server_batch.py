"""`ml_server --parallel N` (issue 16): several requests decoded in one batch, each bit-identical to
its solo run; a conversation returns to the slot holding its prefix; the queue beyond the slots,
deadlines and disconnects; `/metrics` read by Prometheus' own parser; `/health` while loading; the
access log line. SmolLM2-135M-Instruct in Q4_0, driven by the real `openai` client."""
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import import_tokenizer, ml_bin
from test_server import Server, error_of, health, wait_health, waiting_request

CTX = 1024

# Different lengths, so that prompts are still being read (in chunks of --batch 16) while other
# sequences decode; the last is long enough to take many steps.
PROMPTS = [
    "Once upon a time, a fox",
    "The three most important rules of cooking are",
    "def fibonacci(n):\n    ",
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden press. Within decades, print shops "
    "appeared in every major European city, and books that had once been copied by hand for years "
    "could be produced by the hundred in weeks. Scholars argue about how quickly literacy followed, "
    "but nobody doubts that the cost of a book fell sharply. In the next chapter we look at",
]


@pytest.fixture(scope="module")
def files(smol):
    return smol("q4_0"), smol("mlt")


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory, files):
    s = Server(tmp_path_factory.mktemp("batch"), files, "--ctx", CTX, "--parallel", 4, "--batch", 16, key=None)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory, files):
    """Two slots, one waiting request, prompts in the access log."""
    s = Server(tmp_path_factory.mktemp("two"), files, "--ctx", CTX, "--parallel", 2, "--max-queue", 1,
               "--log-prompts", key=None)
    yield s
    s.stop()


def metrics(srv):
    """{sample name with labels: value} of /metrics, parsed by prometheus_client."""
    st, hdrs, body = srv.raw("GET", "/metrics", key=False)
    assert st == 200 and hdrs["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def streamed(srv, prompt):
    """(text pieces, logprobs per chunk, finish) of one streamed completion with logprobs."""
    pieces, lps, finish = [], [], None
    chunks = srv.client().completions.create(model="x", prompt=prompt, max_tokens=24, temperature=0.8, seed=11,
                                             logprobs=3, stream=True)
    for ch in chunks:
        c = ch.choices[0]
        pieces.append(c.text)
        lps.append(c.logprobs.model_dump() if c.logprobs else None)
        finish = c.finish_reason or finish
    return pieces, lps, finish


def test_each_sequence_is_bit_identical_to_its_solo_run(batch_server):
    srv = batch_server
    solo = [streamed(srv, p) for p in PROMPTS]
    before = metrics(srv)
    together = [None] * len(PROMPTS)
    barrier = threading.Barrier(len(PROMPTS))

    def run(i):
        barrier.wait()
        together[i] = streamed(srv, PROMPTS[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a concurrent request hung"
    after = metrics(srv)
    # They really shared forward passes: more than one sequence per step on average.
    steps = after["krafla:n_decode_total"] - before["krafla:n_decode_total"]
    seqs = after["krafla:n_decode_sequences_total"] - before["krafla:n_decode_sequences_total"]
    assert seqs / steps > 1.5, (seqs, steps)
    for i, (alone, shared) in enumerate(zip(solo, together, strict=True)):
        assert "".join(alone[0]) and alone[2] == "length"
        # JSON floats are shortest round-trip: equal values are equal bits.
        assert shared == alone, f"prompt {i} differs when it shares the batch"


def test_a_conversation_returns_to_its_slot(batch_server):
    c = batch_server.client()
    topics = ["the moon", "volcanoes in Iceland", "how bread rises"]
    # each its own system prompt: under SmolLM2's template a shared default one would make a new
    # conversation continue another's cache (more than half of it in common, llama.cpp's rule)
    convs = [[{"role": "system", "content": f"You know {t} well."},
              {"role": "user", "content": f"Tell me one fact about {t}."}] for t in topics]
    # Turn one of every conversation, then turn two of every conversation: three caches kept at once.
    for turn in range(2):
        for conv in convs:
            r = c.chat.completions.create(model="x", messages=conv, max_tokens=12, temperature=0)
            cached = r.usage.prompt_tokens_details.cached_tokens
            if turn == 1:
                assert cached > 20, f"turn two of a conversation reused only {cached} tokens"
            conv += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "And another one?"}]


def test_queue_deadlines_and_disconnects(two_slots):
    srv = two_slots
    c = srv.client()
    long_kw = dict(model="x", max_tokens=900, temperature=0, extra_body={"ignore_eos": True})
    streams = [c.completions.create(prompt=f"Story {i}: once upon a time", stream=True, **long_kw) for i in range(2)]
    its = [iter(s) for s in streams]
    for it in its:
        next(it), next(it)
    assert health(srv)["slots_busy"] == 2

    # A request whose deadline passes while it waits for a slot gets 503.
    t0 = time.time()
    err = error_of(srv.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "timeout": 0.5}), 503)
    assert err["code"] == "timeout" and 0.4 < time.time() - t0 < 5
    # One waits its turn...
    waiter, result = waiting_request(srv)
    # ...and the next finds the queue full: 503 with Retry-After.
    st, hdrs, body = srv.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    assert st == 503 and hdrs["retry-after"] == "1" and json.loads(body)["error"]["code"] == "queue_full"

    # A streaming client hangs up: its slot serves the waiting request at once; the other stream goes on.
    t1 = time.time()
    streams[0].close()
    waiter.join(20)
    assert not waiter.is_alive() and result["r"].usage.completion_tokens == 2
    assert time.time() - t1 < 5, "the cancelled generation kept its slot"
    assert next(its[1]).choices[0].text is not None
    streams[1].close()

    # A deadline reached while generating ends the answer like a token limit.
    wait_health(srv, lambda h: h["slots_busy"] == 0, "the slots were never freed")
    t2 = time.time()
    r = c.completions.create(model="x", prompt="Count: one, two,", max_tokens=900, temperature=0,
                             extra_body={"ignore_eos": True, "timeout": 1.0})
    assert r.choices[0].finish_reason == "length" and 0 < r.usage.completion_tokens < 900
    assert time.time() - t2 < 5
    for bad in [0, -1, 1e9, "1"]:
        err = error_of(srv.raw("POST", "/v1/completions", {"prompt": "Hi", "timeout": bad}), 400)
        assert err["param"] == "timeout"

    # The access log: one line per request, with the prompt only because of --log-prompts.
    log = srv.log_text()
    lines = re.findall(r"krafla: request cmpl-[0-9a-f]{16}: prompt \d+ tokens \(\d+ cached\), generated (\d+) tokens, "
                       r"ttft [\d.]+ s, [\d.-]+ tokens/s, total [\d.]+ s, finish (\w+), prompt \"([^\n]*)\"\n", log)
    assert {f for _, f, _ in lines} >= {"cancelled", "length"}, log
    assert any(p == "Story 0: once upon a time" for _, _, p in lines), log

    # And every answer is counted by status.
    m = metrics(srv)
    assert m['krafla:requests_total{status=503}'] >= 2 and m['krafla:requests_total{status=200}'] >= 4
    assert m["krafla:time_to_first_token_seconds_count"] >= 4
    assert m["krafla:time_per_output_token_seconds_count"] > 10
    assert m["krafla:tokens_predicted_total"] > 10 and m["krafla:slots_total"] == 2
    assert m["krafla:requests_processing"] == 0 and m["krafla:requests_deferred"] == 0


def test_no_prompt_text_in_the_log_by_default(batch_server):
    log = batch_server.log_text()
    assert re.search(r"krafla: request chatcmpl-[0-9a-f]{16}: prompt \d+ tokens", log), log
    assert "Tell me one fact" not in log and "printing press" not in log


def test_health_says_loading_until_the_model_is_ready(tmp_path, smollm2_gguf):
    """A GGUF converted at load takes seconds: /health answers 503 "loading" meanwhile, then 200."""
    log_path = tmp_path / "loading.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(ml_bin()), "--server", str(smollm2_gguf), "--port", "0", "-t", "1",
                                 "--ctx", "256", "--parallel", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not (m := re.search(r"http://([\d.]+):(\d+)/health answers 503", log_path.read_text())):
            assert proc.poll() is None and time.time() < deadline, log_path.read_text()
            time.sleep(0.01)
        url = f"http://{m.group(1)}:{m.group(2)}"
        seen = []
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=10) as r:
                    seen.append((r.status, json.loads(r.read())))
                    break
            except urllib.error.HTTPError as e:
                seen.append((e.code, json.loads(e.read()), e.headers["Retry-After"]))
            assert time.time() < deadline + 60, seen
            time.sleep(0.05)
        assert seen[0] == (503, {"status": "loading"}, "1"), seen
        assert seen[-1] == (200, {"status": "ok", "slots_total": 1, "slots_busy": 0, "slots_idle": 1, "queued": 0})
        assert "listening on" in log_path.read_text()
    finally:
        proc.terminate()
        proc.wait(10)


def byte_tokenizer(tmp_path):
    """A byte-level BPE tokenizer of 256 byte tokens and an end token (.mlt), within the tiny
    fixtures' vocabulary of 512: enough for the server to run them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "bytes.mlt"
    import_tokenizer(tmp_path / "tokenizer.json", out)
    return out


def test_every_family_batched_equals_solo(tmp_path, families_q8):
    """Each tiny family (sliding windows, soft-caps, q/k norms, biases, Gated DeltaNet...): three
    prompts of different lengths, read 4 tokens per step, concurrently and alone: same logprobs."""
    tok = byte_tokenizer(tmp_path)
    for family, (mlb, ids) in families_q8.items():
        ids = [int(i) % 256 for i in ids.split(",")]
        prompts = [ids, ids[: len(ids) // 2] + [7, 8, 9], list(reversed(ids))[:5]]
        srv = Server(tmp_path, (mlb, tok), "--ctx", 128, "--parallel", 3, "--batch", 4, key=None)
        try:
            body = dict(max_tokens=6, temperature=0, logprobs=5, ignore_eos=True)

            def ask(p, srv=srv, body=body):
                st, _, data = srv.raw("POST", "/v1/completions", dict(body, prompt=p), timeout=60)
                assert st == 200, data
                return json.loads(data)["choices"][0]["logprobs"]

            solo = [ask(p) for p in prompts]
            together = [None] * len(prompts)
            barrier = threading.Barrier(len(prompts))

            def run(i, barrier=barrier, together=together, prompts=prompts):
                barrier.wait()
                together[i] = ask(prompts[i])

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert together == solo, f"{family}: a sequence differs when it shares the batch"
        finally:
            srv.stop()


def test_max_queue_zero_still_fills_every_slot(tmp_path, files):
    """--max-queue 0: no request waits, but every slot takes one; the next gets 503 at once."""
    srv = Server(tmp_path, files, "--ctx", 256, "--parallel", 2, "--max-queue", 0, key=None)
    try:
        c = srv.client()
        stream = c.completions.create(model="x", prompt="Once", max_tokens=200, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it), next(it)
        held = c.completions.create(model="x", prompt="Twice", max_tokens=200, temperature=0, stream=True,
                                    extra_body={"ignore_eos": True})
        next(iter(held))
        assert health(srv)["slots_busy"] == 2
        err = error_of(srv.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}), 503)
        assert err["code"] == "queue_full"
        stream.close()
        held.close()
        wait_health(srv, lambda h: h["slots_busy"] == 0, "the slots were never freed")
        # Back to back: a slot is free again before its answer ends, so the next request never races it.
        for _ in range(5):
            assert c.completions.create(model="x", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
    finally:
        srv.stop()
