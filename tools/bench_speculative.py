"""Speculative decoding benchmark: generation speed without speculation, with prompt lookup
(`--lookup N`) and with a draft model (`--draft FILE`), on the committed prompts
(tools/speculative_prompts/*.txt), greedy, runs alternating so that a busy machine slows every
column alike. Checks that every run's text is the plain run's, and prints a Markdown table.

    python tools/bench_speculative.py MODEL [--draft DRAFT] [--bin EXE] [--lookup N] [-n TOKENS]
        [--reps R] [-t THREADS] [-- EXTRA ML_RUN ARGS]
"""
import argparse
import pathlib
import re
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
PROMPTS = sorted((REPO / "tools" / "speculative_prompts").glob("*.txt"))
RATE = re.compile(r"generation (\d+) tokens, ([\d.]+) tokens/s")
SPEC = re.compile(r"speculative: drafted (\d+), accepted (\d+)")


def run(exe, model, prompt, n, threads, extra):
    """(text, tokens generated, tokens/s, (drafted, accepted) or None)."""
    # the prompts spell out SmolLM2's chat format: --parse-special reads its control tokens as such
    cmd = [str(exe), str(model), "-f", str(prompt), "--parse-special", "-n", str(n), "-t", str(threads),
           *map(str, extra)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    m = RATE.search(p.stderr)
    s = SPEC.search(p.stderr)
    return p.stdout, int(m[1]), float(m[2]), (int(s[1]), int(s[2])) if s else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--draft", help="draft model for the third column")
    ap.add_argument("--bin", default=REPO / "dist" / "linux-x86_64" / "ml_run")
    ap.add_argument("--lookup", type=int, default=3, help="n-gram length of --lookup")
    ap.add_argument("-n", type=int, default=256, help="tokens to generate")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prompts", nargs="*", default=[p.stem for p in PROMPTS])
    ap.add_argument("extra", nargs="*", help="more ml_run arguments (after --)")
    a = ap.parse_args()
    modes = {"plain": [], "lookup": ["--lookup", a.lookup]}
    if a.draft:
        modes["draft"] = ["--draft", a.draft]
    print(f"{a.model}: {a.n} tokens, {a.threads} threads, {a.reps} runs each, alternating; "
          f"tokens/s mean (min–max), speed-up against plain, drafted tokens accepted", file=sys.stderr)
    others = [m for m in modes if m != "plain"]
    print("| prompt | tokens | plain tok/s |" + "".join(f" {m} tok/s | {m} × | {m} accepted |" for m in others))
    print("|---|---:|---:|" + "---:|---:|---:|" * (len(modes) - 1))
    for prompt in [p for p in PROMPTS if p.stem in a.prompts]:
        rates = {m: [] for m in modes}
        spec = {}
        texts = {}
        for _ in range(a.reps):
            for mode, args in modes.items():
                text, n, rate, s = run(a.bin, a.model, prompt, a.n, a.threads, [*args, *a.extra])
                texts.setdefault(mode, text)
                if text != texts["plain"]:
                    sys.exit(f"{prompt.stem}: {mode} output differs from the plain run's")
                rates[mode].append(rate)
                spec[mode] = s
                tokens = n
        plain = statistics.mean(rates["plain"])
        row = f"| {prompt.stem} | {tokens} | {plain:.1f} ({min(rates['plain']):.1f}–{max(rates['plain']):.1f}) |"
        for mode in modes:
            if mode == "plain":
                continue
            r = statistics.mean(rates[mode])
            d, acc = spec[mode] or (0, 0)
            share = f"{acc}/{d} ({100 * acc / d:.0f} %)" if d else "0/0"
            row += f" {r:.1f} ({min(rates[mode]):.1f}–{max(rates[mode]):.1f}) | {r / plain:.2f} | {share} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
