#!/bin/bash
# Krafla against llama.cpp on a Mixture-of-Experts GGUF (docs/PERFORMANCE.md#mixture-of-experts):
# the same file, `ml_<isa> --bench` beside llama-bench of the same ISA, pp512 and tg128 at 1 and
# 2 threads, each cell's two runs one after the other. Run it on a quiet machine.
#
#   python3 tools/make_random_moe.py -o WORK/moe24.gguf --layers 24
#   tools/bench_moe.sh WORK/moe24.gguf [LLAMACPP_WORKDIR]
#   ISAS="avx512vnni" THREADS="2" REPS=3 tools/bench_moe.sh FILE
#
# LLAMACPP_WORKDIR: where tools/bench_llamacpp.sh built llama.cpp (default .cache/llamacpp;
# `ISAS="avx512vnni avx2" BUILD_ONLY=1 tools/bench_llamacpp.sh` builds it). Needs the Krafla
# builds (cargo xtask dist linux-x86_64).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$1
WORK=${2:-$REPO/.cache/llamacpp}
ISAS=${ISAS:-"avx512vnni avx2"}
THREADS=${THREADS:-"1 2"}
REPS=${REPS:-3}
for isa in $ISAS; do
    for t in $THREADS; do
        echo "== krafla $isa, $t threads"
        "$REPO/dist/linux-x86_64/ml_$isa" "$MODEL" --bench -pp 512 -tg 128 -r "$REPS" -t "$t" 2>&1 \
            | grep -E '^\| |roofline'
        echo "== llama.cpp $isa, $t threads"
        "$WORK/build-$isa/bin/llama-bench" -m "$MODEL" -p 512 -n 128 -r "$REPS" -t "$t" 2>/dev/null | grep -E '^\| '
    done
done
