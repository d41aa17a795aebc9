"""Embeddings per second, Krafla's `/v1/embeddings` beside llama-server's `--embedding`, on the
same GGUF file and the same x86-64 level: each server in turn (the order flips every
repetition) gets the same batch of texts in one request, with mean pooling; prints a markdown
table (median over the repetitions) and how close the two servers' vectors are (cosine).

    python3 tools/bench_embeddings.py MODEL.gguf --krafla dist/linux-x86_64/ml_avx512vnni \\
        --llama-server .cache/llamacpp/build-avx512vnni/bin/llama-server [--threads 2] [--texts 64] [--reps 3]
        [--krafla-args "--type q8_0"]

llama-server needs building with the server on (SERVER=1 BUILD_ONLY=1 ISAS=avx512vnni
tools/bench_llamacpp.sh). Run it on a quiet machine.
"""
import argparse
import json
import math
import statistics
import subprocess
import time
import urllib.request

WORDS = ("the river runs past old stone houses while children play near the bridge and a dog sleeps in "
         "warm afternoon light as bakers close their shops and bells ring over the quiet square").split()


def texts(n):
    """n sentences of 8 to 40 words, the same every run."""
    out = []
    for i in range(n):
        k = 8 + (i * 7) % 33
        out.append(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(k)) + ".")
    return out


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the server on port {port} exited {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the server on port {port} did not start")


def server_cmd(name, args, port):
    if name == "krafla":
        return [args.krafla, "--server", args.model, "--embedding", "--pooling", "mean", "-t", str(args.threads),
                "--port", str(port), "--ctx", "512", "--parallel", str(args.slots), *args.krafla_args.split()]
    return [args.llama_server, "-m", args.model, "--embedding", "--pooling", "mean", "-t", str(args.threads),
            "--port", str(port), "-c", str(512 * args.slots), "-np", str(args.slots), "-ub", "512", "-b", "2048"]


def measure(name, args, batch, port):
    proc = subprocess.Popen(server_cmd(name, args, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        post(port, {"input": batch[:2]})  # warm up
        t0 = time.perf_counter()
        r = post(port, {"input": batch, "encoding_format": "float"})
        secs = time.perf_counter() - t0
        vectors = [d["embedding"] for d in sorted(r["data"], key=lambda d: d["index"])]
        # the first texts again, each alone (not timed): a batch should not change a text's vector
        singles = [post(port, {"input": [t], "encoding_format": "float"})["data"][0]["embedding"]
                   for t in batch[:args.singles]]
        return secs, r["usage"]["prompt_tokens"], vectors, singles
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--krafla", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--texts", type=int, default=64)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--singles", type=int, default=16, help="texts also embedded alone, to compare")
    ap.add_argument("--port", type=int, default=18090)
    ap.add_argument("--krafla-args", default="", help="more arguments for Krafla (e.g. '--type q8_0')")
    args = ap.parse_args()
    batch = texts(args.texts)
    names = ["krafla", "llama-server"]
    times = {n: [] for n in names}
    tokens, vectors, singles = {}, {}, {}
    for rep in range(args.reps):
        for i, name in enumerate(names if rep % 2 == 0 else names[::-1]):
            secs, n_tok, vecs, alone = measure(name, args, batch, args.port + i)
            times[name].append(secs)
            tokens[name] = n_tok
            vectors.setdefault(name, vecs)
            singles.setdefault(name, alone)
    cos = [cosine(a, b) for a, b in zip(singles["krafla"], singles["llama-server"])]
    print(f"{args.texts} texts, {args.threads} threads, {args.slots} slots, mean pooling, "
          f"{args.reps} repetitions (median)\n")
    print("| server | prompt tokens | seconds | embeddings/s | tokens/s |")
    print("|---|---|---|---|---|")
    for name in names:
        s = statistics.median(times[name])
        print(f"| {name} | {tokens[name]} | {s:.2f} | {args.texts / s:.1f} | {tokens[name] / s:.0f} |")
    print(f"\ncosine(krafla, llama-server), each of the first {len(cos)} texts alone: min {min(cos):.4f}, "
          f"median {statistics.median(cos):.4f}")
    for name in names:
        same = [cosine(a, b) for a, b in zip(singles[name], vectors[name])]
        exact = sum(a == b for a, b in zip(singles[name], vectors[name]))
        print(f"{name}: a text in the batch against the same text alone: cosine min {min(same):.4f}, "
              f"{exact} of {len(same)} the same numbers")


if __name__ == "__main__":
    main()
