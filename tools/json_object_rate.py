#!/usr/bin/env python3
"""How often a model closes a `json_object` answer within max_tokens
(docs/QUANT.md#closing-a-json_object-answer).

    python3 tools/json_object_rate.py [--bin ML_RUN] [-n 300] [MODEL] [-- OPTION ...]

MODEL is a name of tools/models.py (default smollm2) or a GGUF path; the
options after `--` are the load's (`--type q4_0`, `--q4-scale max`, ...).
Each of the twenty chat prompts below is answered greedily under the schema
`{"type": "object"}` (what `response_format: json_object` applies), and the
answer counts if it parses as a JSON object.  The grammar keeps every
answer a prefix of valid JSON; whether it is complete within `-n` tokens is
up to the model.
"""
import argparse
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import models  # noqa: E402

PROMPTS = [
    "List three fruits and their colours as JSON.", "Describe a cat as JSON.",
    "Give me a JSON object with a person's name and age.",
    "Return the capital cities of France, Spain and Italy as JSON.", "Describe today's weather as JSON.",
    "A recipe for pancakes as JSON.", "Three planets and their sizes as JSON.",
    "A book with its title, author and year, as JSON.",
    "List two programming languages and their creators as JSON.", "A car with make, model and colour, as JSON.",
    "Describe a dog as JSON.", "Give the days of the week as a JSON object.", "Your favourite movie as JSON.",
    "A shopping list as JSON.", "Describe the moon as JSON.", "A student's grades in three subjects as JSON.",
    "Three animals and the sounds they make, as JSON.", "A city with its population and country, as JSON.",
    "Describe a tree as JSON.", "A song with its title and artist, as JSON.",
]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    load = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--bin", default=str(REPO / "dist/linux-x86_64/ml_run"))
    ap.add_argument("-n", type=int, default=300)
    a = ap.parse_args(own)
    path = models.MODELS[a.model]() if a.model in models.MODELS else a.model
    closed = 0
    for prompt in PROMPTS:
        p = subprocess.run([a.bin, str(path), *load, "--chat", "auto", "-p", prompt, "--json-schema",
                            '{"type":"object"}', "-n", str(a.n), "-T", "0"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{a.bin} failed: {p.stderr.strip().splitlines()[-1:]}")
        try:
            ok = isinstance(json.loads(p.stdout), dict)
        except ValueError:
            ok = False
        closed += ok
        print(f"{'closed' if ok else 'open  '} {json.dumps(prompt)}: {p.stdout[:60]!r}", flush=True)
    print(f"{closed} of {len(PROMPTS)} closed within {a.n} tokens")


if __name__ == "__main__":
    main()
