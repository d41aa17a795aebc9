#!/usr/bin/env python3
"""Measure what each quantisation choice costs on a real model (docs/QUANT.md).

    python3 tools/quant_eval.py MODEL [--text FILE] [--calib FILE] [--chunks N]
                                [--variants NAME,...] [--bin ML_RUN] [--json OUT]

MODEL is a name of tools/models.py (smollm2, gemma3, qwen-coder) or a GGUF path.
For each variant the Krafla executable loads the GGUF with the variant's
options (`--type`, `--requantize`, `--q4-scale`, `--imatrix`, ...) and runs
llama.cpp's perplexity protocol on the text (`--perplexity TEXT --ctx 512
--chunks N`), with `--kld-base` against the reference: the source itself,
every tensor Krafla cannot read as it is dequantised to F32 (`--type f32`).
The importance matrix comes from the reference model on the calibration text
(`--imatrix-out`), never from the evaluation text.  Results are cached in
.cache/quant_eval/results.json (a run is redone only if its command changes)
and printed as a Markdown table.  Extra variants: files such as llama.cpp's
quantisations are given as `label=PATH.gguf`.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import models  # noqa: E402

OUT = REPO / ".cache" / "quant_eval"

# name -> (table label, ml_run options); "{imatrix}" is the calibration file's matrix
VARIANTS = {
    "q8_0": ("`--type q8_0`", ["--type", "q8_0", "--requantize"]),
    "q4_max": ("`--type q4_0 --q4-scale max`", ["--type", "q4_0", "--requantize", "--q4-scale", "max"]),
    "q4_fit": ("`--type q4_0 --no-imatrix` (fitted, unweighted)",
               ["--type", "q4_0", "--requantize", "--no-imatrix"]),
    "q4_default": ("**`--type q4_0`** (the default: importance matrix from the built-in text)",
                   ["--type", "q4_0", "--requantize"]),
    "q4_imatrix": ("`--type q4_0 --imatrix FILE` (Macbeth, 8 × 512 tokens)",
                   ["--type", "q4_0", "--requantize", "--imatrix", "{imatrix}"]),
    "q4_mixed": ("`--type q4_mixed` (budget +15 %)", ["--type", "q4_mixed", "--requantize"]),
    "q4_mixed30": ("`--type q4_mixed --mixed-budget 30`",
                   ["--type", "q4_mixed", "--requantize", "--mixed-budget", "30"]),
}


def run(cmd):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"quant_eval: {' '.join(map(str, cmd))} failed:\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr, time.time() - t


def parse(out):
    r = {}
    m = re.search(r"PPL = ([0-9.]+)(?: \+/- ([0-9.]+))?", out)
    if m:
        r["ppl"], r["ppl_err"] = float(m.group(1)), float(m.group(2) or 0)
    m = re.search(r"KLD = ([0-9.]+) \+/- ([0-9.]+), same top token ([0-9.]+) %", out)
    if m:
        r["kld"], r["kld_err"], r["top1"] = float(m.group(1)), float(m.group(2)), float(m.group(3))
    m = re.search(r"memory: ([0-9.]+) MiB weights", out)
    if m:
        r["mib"] = float(m.group(1))
    m = re.search(r"loaded in ([0-9]+) ms", out)
    if m:
        r["load_ms"] = int(m.group(1))
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--text", help="evaluation text (default: King Lear, tools/models.py play)")
    ap.add_argument("--calib", help="calibration text of --imatrix FILE (default: Macbeth)")
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--bin", default=os.environ.get("KRAFLA_BIN", str(REPO / "dist/linux-x86_64/ml_run")))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args(argv)

    a.text = a.text or str(models.play("lear"))
    a.calib = a.calib or str(models.play("macbeth"))
    gguf = pathlib.Path(a.model) if a.model.endswith(".gguf") else models.MODELS[a.model]()
    OUT.mkdir(parents=True, exist_ok=True)
    tag = f"{gguf.stem}-{pathlib.Path(a.text).stem}-{a.chunks}"
    base = OUT / f"{tag}.kld"
    imatrix = OUT / f"{gguf.stem}-{pathlib.Path(a.calib).stem}-{a.calib_chunks}.imatrix"
    cache_path = OUT / "results.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    common = ["--perplexity", a.text, "--ctx", "512", "--chunks", str(a.chunks), "-t", a.threads]

    def measure(label, cmd, fresh=False):
        key = " ".join(map(str, cmd))
        if fresh or key not in cache:
            print(f"quant_eval: {label} ...", file=sys.stderr, flush=True)
            out, secs = run(cmd)
            cache[key] = dict(parse(out), secs=round(secs, 1))
            cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True))
        return cache[key]

    ref_cmd = [a.bin, str(gguf), "--type", "f32", *common, "--kld-base-out", str(base)]
    rows = [("source, dequantised (`--type f32`): the reference", measure("reference", ref_cmd, not base.exists()))]
    if not imatrix.exists():
        run([a.bin, str(gguf), "--type", "f32", "--perplexity", a.calib, "--ctx", "512",
             "--chunks", str(a.calib_chunks), "-t", a.threads, "--imatrix-out", str(imatrix)])
    for name in a.variants.split(","):
        if "=" in name:
            label, path = name.split("=", 1)
            opts, label = [], f"{label} (`{pathlib.Path(path).name}` as it is)"
            cmd = [a.bin, path, *common, "--kld-base", str(base)]
        else:
            label, opts = VARIANTS[name]
            opts = [str(imatrix) if o == "{imatrix}" else o for o in opts]
            cmd = [a.bin, str(gguf), *opts, *common, "--kld-base", str(base)]
        rows.append((label, measure(label, cmd)))

    print(f"\n{gguf.name}: {a.chunks} × 512 tokens of {pathlib.Path(a.text).name}\n")
    print("| file | MiB | PPL | KLD vs reference | same top token |")
    print("|---|---|---|---|---|")
    for label, r in rows:
        kld = f"{r['kld']:.4f} ± {r['kld_err']:.4f}" if "kld" in r else "0"
        top = f"{r['top1']:.1f} %" if "top1" in r else "100 %"
        print(f"| {label} | {r.get('mib', 0):.0f} | {r['ppl']:.3f} ± {r['ppl_err']:.3f} | {kld} | {top} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
