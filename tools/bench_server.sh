#!/bin/bash
# Serving throughput, Krafla's ml_server beside llama.cpp's llama-server, on the
# same GGUF weights and the same x86-64 level, measured in one run: for each
# model and each number of concurrent streaming clients N, start Krafla with
# N slots, wait for /health, run tools/bench_server.py with N clients, stop
# it; then the same with llama-server -np N. Prints a markdown table (median
# over REPS repetitions; the server order flips every repetition).
#
#   tools/bench_server.sh MODEL.gguf[:MAX_TOKENS[:PROMPT_WORDS]]...
#   CONCURRENCY="1 4" REPS=3 tools/bench_server.sh .cache/llamacpp/smollm2-q4_0.gguf
#
# Environment (defaults in brackets):
#   ISA [avx512vnni]         Krafla's dist/linux-x86_64/ml_$ISA and llama.cpp's build-$ISA
#   KRAFLA, LLAMA_SERVER     the two executables (override the above)
#   CONCURRENCY ["1 2 4 8"]  client counts; each is also the servers' slot count
#   REPS [1]                 repetitions of the whole alternation
#   THREADS [2]              -t of both servers
#   CTX [1024]               context per slot (Krafla --ctx; llama-server -c CTX*N)
#   MAX_TOKENS [64]          per request, unless the model has a :MAX_TOKENS suffix
#   REQUESTS [4]             requests per client, back to back
#   PROMPT_WORDS [100]       prompt length, unless the model has a second suffix (100
#                            words are ~100 SmolLM2 or Qwen2.5 tokens; at 2 threads a
#                            1.5B model's prefill of 100 tokens takes as long as 30
#                            generated tokens, so its tokens/s then mostly measure that)
#   SERVERS ["krafla llama-server"]  which to run
#   KRAFLA_PARALLEL [1]      0: start Krafla without --parallel (before it had the flag)
#   BENCH_NO_IGNORE_EOS [0]  1: send no ignore_eos (a server that refuses it)
#   KRAFLA_ARGS, LLAMA_ARGS  extra arguments for each server
#   PORT [18080]             Krafla listens on PORT, llama-server on PORT+1
#   OUT [.cache/bench_server/DATE.jsonl]  the JSON lines (one per measurement); the
#                            servers' logs to DATE-logs/ beside it
#
# llama-server needs building with the server on: SERVER=1 BUILD_ONLY=1
# ISAS=avx512vnni tools/bench_llamacpp.sh. Both servers keep their defaults
# otherwise (Krafla: f32 KV cache; llama-server: f16 KV cache, continuous
# batching, its prompt cache; every request has a random prompt of its own,
# so no cache hits). The machine should be quiet: both use THREADS cores, and
# llama.cpp's spinning OpenMP threads lose much more than that under other load.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ISA=${ISA:-avx512vnni}
KRAFLA=${KRAFLA:-$REPO/dist/linux-x86_64/ml_$ISA}
LLAMA_SERVER=${LLAMA_SERVER:-$REPO/.cache/llamacpp/build-$ISA/bin/llama-server}
CONCURRENCY=${CONCURRENCY:-"1 2 4 8"}
REPS=${REPS:-1}
THREADS=${THREADS:-2}
CTX=${CTX:-1024}
MAX_TOKENS=${MAX_TOKENS:-64}
REQUESTS=${REQUESTS:-4}
PROMPT_WORDS=${PROMPT_WORDS:-100}
SERVERS=${SERVERS:-"krafla llama-server"}
KRAFLA_PARALLEL=${KRAFLA_PARALLEL:-1}
KRAFLA_ARGS=${KRAFLA_ARGS:-}
LLAMA_ARGS=${LLAMA_ARGS:-}
PORT=${PORT:-18080}
PY=${PYTHON:-python3}
OUT=${OUT:-$REPO/.cache/bench_server/$(date -u +%Y%m%dT%H%M%SZ).jsonl}
LOGDIR=${OUT%.jsonl}-logs
mkdir -p "$(dirname "$OUT")" "$LOGDIR"

[ $# -ge 1 ] || { echo "usage: $0 MODEL.gguf[:MAX_TOKENS[:PROMPT_WORDS]]..." >&2; exit 2; }
for s in $SERVERS; do
    case $s in
        krafla) [ -x "$KRAFLA" ] || { echo "no Krafla executable $KRAFLA (cargo xtask dist linux-x86_64)" >&2; exit 1; } ;;
        llama-server) [ -x "$LLAMA_SERVER" ] || { echo "no $LLAMA_SERVER (SERVER=1 BUILD_ONLY=1 ISAS=$ISA tools/bench_llamacpp.sh)" >&2; exit 1; } ;;
        *) echo "unknown server $s (krafla, llama-server)" >&2; exit 2 ;;
    esac
done

PID=
stop_server() {
    if [ -n "$PID" ]; then
        kill "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
        PID=
    fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# start_server NAME PORT LOG CMD...: runs CMD in the background, waits until
# GET /health answers 200 (at most 600 s), fails if the process exits first.
start_server() {
    local name=$1 port=$2 log=$3
    shift 3
    if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/health"; then
        echo "port $port is already in use" >&2
        exit 1
    fi
    echo "+ $*" > "$log"
    "$@" >> "$log" 2>&1 &
    PID=$!
    local t=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health" || true)" = 200 ]; do
        if ! kill -0 "$PID" 2>/dev/null; then
            echo "$name exited before answering /health; its log ($log):" >&2
            tail -20 "$log" >&2
            PID=
            exit 1
        fi
        if [ $t -ge 6000 ]; then
            echo "$name did not answer /health within 600 s; its log: $log" >&2
            exit 1
        fi
        sleep 0.1
        t=$((t + 1))
    done
}

echo "bench_server: ISA $ISA, $THREADS threads, clients: $CONCURRENCY, $REQUESTS requests each, ctx $CTX per slot," \
    "$REPS repetition(s); results in $OUT" >&2
for rep in $(seq 1 "$REPS"); do
    order=$SERVERS
    # flip the order every other repetition, so neither always runs first
    if [ $((rep % 2)) = 0 ]; then order=$(echo "$SERVERS" | tr ' ' '\n' | tac | tr '\n' ' '); fi
    for spec in "$@"; do
        model=$spec
        mt=$MAX_TOKENS
        pw=$PROMPT_WORDS
        if [[ $spec =~ ^(.*\.gguf):([0-9]+)(:([0-9]+))?$ ]]; then
            model=${BASH_REMATCH[1]}
            mt=${BASH_REMATCH[2]}
            pw=${BASH_REMATCH[4]:-$PROMPT_WORDS}
        fi
        [ -f "$model" ] || { echo "no model file $model" >&2; exit 1; }
        name=$(basename "$model" .gguf)
        for n in $CONCURRENCY; do
            for s in $order; do
                log=$LOGDIR/$name-$s-np$n-rep$rep.log
                if [ "$s" = krafla ]; then
                    port=$PORT
                    par=()
                    [ "$KRAFLA_PARALLEL" = 1 ] && par=(--parallel "$n")
                    # shellcheck disable=SC2086
                    start_server "$s" "$port" "$log" "$KRAFLA" --server "$model" --port "$port" -t "$THREADS" \
                        "${par[@]}" --ctx "$CTX" $KRAFLA_ARGS
                    grep -m1 '^krafla: isa' "$log" >&2 || true
                else
                    port=$((PORT + 1))
                    # -c is the context of all slots together (each gets CTX)
                    # shellcheck disable=SC2086
                    start_server "$s" "$port" "$log" "$LLAMA_SERVER" -m "$model" --port "$port" -t "$THREADS" \
                        -np "$n" -c $((CTX * n)) --no-webui $LLAMA_ARGS
                fi
                "$PY" "$REPO/tools/bench_server.py" --url "http://127.0.0.1:$port" --clients "$n" \
                    --requests "$REQUESTS" --max-tokens "$mt" --prompt-words "$pw" \
                    --label "$s" --model-name "$name" --out "$OUT" > /dev/null || true
                stop_server
            done
        done
    done
done
echo
"$PY" "$REPO/tools/bench_server.py" --summarize "$OUT"
