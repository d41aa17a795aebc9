#!/bin/bash
# Krafla beside llama.cpp on one GGUF file, on a quiet machine and with a
# CPU load of its own running beside them (users' machines are never quiet):
# Krafla's `--bench` (pp512, tg128) and llama.cpp's `llama-bench` built for the
# same ISA (tools/bench_llamacpp.sh builds them into .cache/llamacpp), at 1
# and 2 threads, the two programs alternating run by run. Prints the
# Markdown table of docs/PERFORMANCE.md ("Beside other work") on stdout.
#
#   tools/bench_loaded.sh FILE.gguf
#   ISAS="avx512vnni" THREADS="2" ROUNDS=3 tools/bench_loaded.sh FILE.gguf
#
# The load is one busy loop per core at the lowest priority (`nice -n 19`),
# as a background compile is; LOAD="command" runs that instead, once per core.
# Each cell is the mean of ROUNDS runs of each program (each run is
# `-r 1` after its own warm-up), taken in turn: Krafla, llama.cpp, Krafla...
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LLAMA=${LLAMA:-$REPO/.cache/llamacpp}
ISAS=${ISAS:-"avx2 avx512vnni"}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
CONDITIONS=${CONDITIONS:-"quiet loaded"}
LOAD=${LOAD:-"while :; do :; done"}
[ $# -eq 1 ] || { echo "usage: $0 FILE.gguf" >&2; exit 2; }
FILE=$1
CORES=$(nproc)

load_pids=()
start_load() {
    for _ in $(seq "$CORES"); do
        nice -n 19 bash -c "$LOAD" > /dev/null 2>&1 &
        load_pids+=($!)
    done
}
stop_load() {
    for p in "${load_pids[@]}"; do kill "$p" 2> /dev/null || true; done
    wait 2> /dev/null || true
    load_pids=()
}
trap stop_load EXIT

# "pp t/s" and "tg t/s" of one run: the last two columns of each program's rows
rates() { awk -F'|' '/\| *(pp|tg)[0-9]+ *\|/ { gsub(/ /, "", $(NF-2)); split($(NF-1), v, " "); printf "%s=%s ", $(NF-2), v[1] }'; }
krafla() { "$REPO/dist/linux-x86_64/ml_$1" "$FILE" --bench -pp 512 -tg 128 -r 1 -t "$2" 2> /dev/null | rates; }
llamacpp() { "$LLAMA/build-$1/bin/llama-bench" -m "$FILE" -p 512 -n 128 -r 1 -t "$2" 2> /dev/null | rates; }
mean() { tr ' ' '\n' | grep "^$1=" | cut -d= -f2 | awk '{ s += $1; n++ } END { if (n) printf "%.2f", s / n; else printf "-" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else printf "-" }'; }

echo "$(basename "$FILE"), $ROUNDS rounds a cell, $(date -u +%F)"
echo
echo "| condition | ISA | threads | Krafla pp512 | llama.cpp pp512 | ratio | Krafla tg128 | llama.cpp tg128 | ratio |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for condition in $CONDITIONS; do
    for isa in $ISAS; do
        [ -x "$LLAMA/build-$isa/bin/llama-bench" ] || { echo "no $LLAMA/build-$isa/bin/llama-bench: run ISAS=$isa BUILD_ONLY=1 tools/bench_llamacpp.sh" >&2; exit 2; }
        for t in $THREADS; do
            [ "$condition" = loaded ] && start_load
            k="" l=""
            for _ in $(seq "$ROUNDS"); do
                k+=$(krafla "$isa" "$t")
                l+=$(llamacpp "$isa" "$t")
            done
            stop_load
            kpp=$(mean pp512 <<< "$k") ktg=$(mean tg128 <<< "$k")
            lpp=$(mean pp512 <<< "$l") ltg=$(mean tg128 <<< "$l")
            echo "| $condition | $isa | $t | $kpp | $lpp | $(ratio "$kpp" "$lpp") | $ktg | $ltg | $(ratio "$ktg" "$ltg") |"
        done
    done
done
