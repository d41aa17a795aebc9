#!/usr/bin/env python3
"""Throughput and time to first token of an OpenAI-compatible server under N
concurrent streaming clients (Krafla's ml_server, llama.cpp's llama-server, ...).

    python3 tools/bench_server.py --url http://127.0.0.1:8080 --clients 1,2,4,8 \\
        --requests 4 --max-tokens 64 --label krafla
    python3 tools/bench_server.py --summarize results.jsonl     (markdown table)

Each of N client threads sends R streaming `POST /v1/completions` requests
back to back (or keeps sending for --duration seconds), one connection per
request, with `temperature` 0, `ignore_eos` true (so every answer is
`max_tokens` long) and `stream_options.include_usage`. Every request has its
own prompt of --prompt-words words drawn from a seeded word list (seeded by
--seed, the client count, the client and the request), so no server can reuse
another request's prompt (prefix) cache; a server that is not restarted
between runs needs a new --seed to see none of its earlier prompts. Per
request: TTFT, the time from sending the request to the first SSE chunk
with non-empty text, and the generated tokens (the usage's completion_tokens,
or the number of text chunks if the server sends no usage).
Per configuration: aggregate generated tokens/s = all generated tokens / wall
time from the first send to the last finish, and TTFT p50/p95 over the
requests. One JSON line per configuration goes to stdout (--out also appends
it to a file), a human-readable line to stderr. Failed requests (non-200,
an error event, a broken stream) are reported on stderr and counted.

Stdlib only. BENCH_NO_IGNORE_EOS=1 (or --no-ignore-eos) leaves `ignore_eos`
out for servers that refuse unknown fields.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse

WORDS = (
    "the of and to in is was for on are with as his they be at one have this from or had by hot word but what "
    "some we can out other were all there when up use your how said an each she which do their time if will way "
    "about many then them write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down side been now find any "
    "new work part take get place made live where after back little only round man year came show every good me "
    "give our under name very through just form sentence great think say help low line differ turn cause much "
    "mean before move right boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men change went light kind "
    "off need house picture try us again animal point mother world near build self earth father head stand own "
    "page should country found answer school grow study still learn plant cover food sun four between state keep "
    "eye never last let thought city tree cross farm hard start might story saw far sea draw left late run while "
    "press close night real life few north open seem together next white children begin got walk example ease "
    "paper group always music those both mark often letter until mile river car feet care second book carry took "
    "science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main"
).split()


def prompt_text(tag: str, words: int, seed: int) -> str:
    """A prompt of `words` words drawn at random (seeded by `seed` and `tag`):
    two tags' prompts share no more than a chance first word or two."""
    rng = random.Random(f"{seed}-{tag}")
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default); None if empty."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Target:
    def __init__(self, url: str, api_key, timeout: float):
        u = urllib.parse.urlsplit(url if "//" in url else "http://" + url)
        if u.scheme != "http":
            raise SystemExit(f"only http:// URLs: {url}")
        self.host, self.port = u.hostname, u.port or 80
        self.base = u.path.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def connect(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)


def one_request(target: Target, body: dict) -> dict:
    """Sends one streaming completion; returns its timings or its error."""
    data = json.dumps(body).encode()
    conn = target.connect()
    res = {"ok": False}
    t0 = time.perf_counter()
    res["t_send"] = t0
    try:
        conn.request("POST", target.base + "/v1/completions", body=data, headers=target.headers)
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(2000).decode("utf-8", "replace").strip()
            res["error"] = f"HTTP {resp.status}: {text[:300]}"
            return res
        first = last = None
        chunks = 0
        usage = None
        done = False
        finish = None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                ev = json.loads(payload)
            except ValueError:
                res["error"] = f"bad SSE data: {payload[:200]!r}"
                return res
            if "error" in ev:
                res["error"] = f"error event: {json.dumps(ev['error'])[:300]}"
                return res
            now = time.perf_counter()
            for ch in ev.get("choices") or []:
                if ch.get("text"):
                    chunks += 1
                    last = now
                    if first is None:
                        first = now
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if ev.get("usage"):
                usage = ev["usage"]
        end = time.perf_counter()
        if not done:
            res["error"] = "stream ended without data: [DONE]"
            return res
        comp = usage.get("completion_tokens") if usage else None
        tokens = comp if isinstance(comp, int) else chunks
        res.update(
            ok=True,
            # None when no chunk had text (e.g. an end of text first, without ignore_eos)
            ttft=None if first is None else first - t0,
            t_end=end,
            chunks=chunks,
            tokens=tokens,
            from_usage=isinstance(comp, int),
            prompt_tokens=usage.get("prompt_tokens") if usage else None,
            finish=finish,
            # decode speed seen by this client: the tokens after the first over the time they took
            decode_tps=(tokens - 1) / (last - first) if tokens > 1 and first is not None and last > first else None,
        )
        return res
    except (OSError, http.client.HTTPException) as e:
        res["error"] = f"{type(e).__name__}: {e}"
        return res
    finally:
        res.setdefault("t_end", time.perf_counter())
        conn.close()


def run_config(target: Target, args, clients: int) -> dict:
    results = []
    lock = threading.Lock()
    start_gate = threading.Barrier(clients)
    deadline = [None]

    def client(ci: int):
        start_gate.wait()
        r = 0
        while True:
            if args.duration:
                if deadline[0] is None or time.perf_counter() >= deadline[0]:
                    break
            elif r >= args.requests:
                break
            body = {
                "prompt": prompt_text(f"{clients}-{ci}-{r}", args.prompt_words, args.seed),
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if args.model:
                body["model"] = args.model
            if not args.no_ignore_eos:
                body["ignore_eos"] = True
            res = one_request(target, body)
            res["client"], res["request"] = ci, r
            if not res["ok"]:
                print(
                    f"bench_server: {args.label} clients={clients} client {ci} request {r}: {res['error']}",
                    file=sys.stderr,
                )
            with lock:
                results.append(res)
            r += 1

    t_start = time.perf_counter()
    cpu_start = time.process_time()
    if args.duration:
        deadline[0] = t_start + args.duration
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client_cpu = time.process_time() - cpu_start
    ok = [r for r in results if r["ok"]]
    errors = [r for r in results if not r["ok"]]
    if results:
        wall = max(r["t_end"] for r in results) - min(r["t_send"] for r in results)
    else:
        wall = 0.0
    tokens = sum(r["tokens"] for r in ok)
    ttfts = [r["ttft"] * 1000 for r in ok if r["ttft"] is not None]
    dec = [r["decode_tps"] for r in ok if r.get("decode_tps")]
    ptoks = [r["prompt_tokens"] for r in ok if isinstance(r.get("prompt_tokens"), int)]
    short = sum(1 for r in ok if r["tokens"] < args.max_tokens)

    def rnd(x, n=1):
        return None if x is None else round(x, n)

    return {
        "label": args.label,
        "url": f"http://{target.host}:{target.port}{target.base}",
        "model": args.model_name,
        "clients": clients,
        "requests": len(results),
        "ok": len(ok),
        "errors": len(errors),
        "first_error": errors[0]["error"] if errors else None,
        "max_tokens": args.max_tokens,
        "ignore_eos": not args.no_ignore_eos,
        "short_answers": short,
        "no_text_answers": sum(1 for r in ok if r["ttft"] is None),
        "tokens_from_usage": all(r["from_usage"] for r in ok) if ok else None,
        "prompt_tokens_mean": rnd(statistics.mean(ptoks)) if ptoks else None,
        "generated_tokens": tokens,
        "wall_s": rnd(wall, 3),
        "tok_s": rnd(tokens / wall if ok and wall > 0 else None, 2),
        "ttft_p50_ms": rnd(percentile(ttfts, 50)),
        "ttft_p95_ms": rnd(percentile(ttfts, 95)),
        "ttft_max_ms": rnd(max(ttfts) if ttfts else None),
        "client_decode_tok_s_mean": rnd(statistics.mean(dec) if dec else None, 2),
        # CPU time this benchmark client itself used (it shares the cores with the server)
        "client_cpu_s": rnd(client_cpu, 3),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def human(r: dict) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    s = (
        f"{r['label'] or '?'} {r['model'] or ''} clients={r['clients']}: {f(r['tok_s'], '.1f')} tok/s "
        f"({r['generated_tokens']} tokens in {f(r['wall_s'], '.2f')} s), TTFT p50 {f(r['ttft_p50_ms'], '.0f')} ms "
        f"p95 {f(r['ttft_p95_ms'], '.0f')} ms, per-client decode {f(r['client_decode_tok_s_mean'], '.1f')} tok/s, "
        f"prompt {f(r['prompt_tokens_mean'], '.0f')} tokens, client CPU {r['client_cpu_s']:.2f} s, "
        f"{r['ok']}/{r['requests']} ok"
    )
    if r["errors"]:
        s += f", {r['errors']} errors (first: {r['first_error']})"
    if r["short_answers"]:
        s += f", {r['short_answers']} answers shorter than max_tokens"
    return s


def summarize(paths) -> str:
    """Markdown table from JSON lines: one row per model and client count,
    the medians over repetitions, every label (server) side by side."""
    rows = []
    for p in paths:
        with open(p) as fh:
            rows += [json.loads(line) for line in fh if line.strip().startswith("{")]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    keys = list(dict.fromkeys((r["model"], r["clients"]) for r in rows))

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def cell(model, clients, label):
        rs = [r for r in rows if (r["model"], r["clients"], r["label"]) == (model, clients, label)]
        if not rs:
            return ["", ""]
        tps, p50, p95 = (med([r[k] for r in rs]) for k in ("tok_s", "ttft_p50_ms", "ttft_p95_ms"))
        err = sum(r["errors"] for r in rs)
        short = sum(r["short_answers"] for r in rs)
        t = "-" if tps is None else f"{tps:.1f}"
        if len(rs) > 1:
            vals = [r["tok_s"] for r in rs if r["tok_s"] is not None]
            if vals:
                t += f" ({min(vals):.1f}–{max(vals):.1f})"
        if err:
            t += f" [{err} errors]"
        if short:
            t += f" [{short} short answers]"
        ttft = "-" if p50 is None else f"{p50:.0f} / {p95:.0f}"
        return [t, ttft]

    head = ["model", "clients"]
    for lb in labels:
        head += [f"{lb} tok/s", f"{lb} TTFT p50 / p95 ms"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, clients in keys:
        cells = [model or "", str(clients)]
        for lb in labels:
            cells += cell(model, clients, lb)
        out.append("| " + " | ".join(cells) + " |")
    reps = max(
        (
            sum(1 for r in rows if (r["model"], r["clients"], r["label"]) == (m, c, lb))
            for m, c in keys
            for lb in labels
        ),
        default=0,
    )
    if reps > 1:
        out.append(f"\nMedians over up to {reps} repetitions; tok/s range in brackets.")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (a trailing /v1 is fine)")
    ap.add_argument("--clients", default="1", help="concurrent clients, a comma-separated list (one run each)")
    ap.add_argument("--requests", type=int, default=4, help="requests per client, back to back")
    ap.add_argument(
        "--duration",
        type=float,
        default=0,
        help="instead of --requests: each client keeps starting requests for this many seconds",
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=100, help="prompt length in words (~1 token each)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed requests (8 tokens) before the first run")
    ap.add_argument("--seed", type=int, default=1, help="seed of the prompts' words")
    ap.add_argument("--label", default="", help="server name in the output (e.g. krafla, llama-server)")
    ap.add_argument("--model", default=None, help='"model" field to send (default: none)')
    ap.add_argument("--model-name", default=None, help="model name in the output (default: --model)")
    ap.add_argument("--api-key", default=os.environ.get("KRAFLA_API_KEY"))
    ap.add_argument("--timeout", type=float, default=600, help="socket timeout in seconds")
    ap.add_argument(
        "--no-ignore-eos",
        action="store_true",
        default=os.environ.get("BENCH_NO_IGNORE_EOS", "") not in ("", "0"),
        help="do not send ignore_eos (also BENCH_NO_IGNORE_EOS=1)",
    )
    ap.add_argument("--out", help="also append the JSON lines to this file")
    ap.add_argument("--summarize", nargs="+", metavar="JSONL", help="print a markdown table of JSON-line files")
    args = ap.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    if args.model_name is None:
        args.model_name = args.model
    try:
        counts = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--clients: not a list of numbers: {args.clients}")
    if not counts or min(counts) < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("--clients, --requests and --max-tokens must be at least 1")
    target = Target(args.url, args.api_key, args.timeout)
    for i in range(args.warmup):
        body = {
            "prompt": prompt_text(f"warmup-{i}", args.prompt_words, args.seed),
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        if args.model:
            body["model"] = args.model
        if not args.no_ignore_eos:
            body["ignore_eos"] = True
        res = one_request(target, body)
        if not res["ok"]:
            print(f"bench_server: warm-up request failed: {res['error']}", file=sys.stderr)
    failed = False
    for n in counts:
        r = run_config(target, args, n)
        line = json.dumps(r)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(line + "\n")
        print(human(r), file=sys.stderr, flush=True)
        failed |= r["ok"] == 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
