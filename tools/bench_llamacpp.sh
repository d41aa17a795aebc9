#!/bin/bash
# Krafla against llama.cpp, side by side, on this machine: llama.cpp built
# once per x86-64 level (no runtime dispatch, like Krafla's builds), both run
# on SmolLM2-135M-Instruct made from the same PyPI GGUF (Q4_1, requantised to
# Q4_0 / Q8_0 by each project's own tool), pp512 and tg128 at 1 and 2 threads.
# Run it on a quiet machine; a full run takes about 20 minutes plus the builds.
#
#   tools/bench_llamacpp.sh [WORKDIR]      (default WORKDIR: .cache/llamacpp)
#   ISAS="avx2 avx512vnni" THREADS=2 tools/bench_llamacpp.sh
#   ISAS="avx512vnni avx2" SERVER=1 BUILD_ONLY=1 tools/bench_llamacpp.sh
#
# SERVER=1 also builds llama-server (for tools/bench_server.sh), reconfiguring
# a build folder that lacks it with the server on (same ISA flags; expect a
# full rebuild, ~20 minutes on two cores) and the web UI off (no npm, no
# download: an empty UI), and makes qwen2.5-1.5b-random-Q4_0.gguf if the
# f16 file of tools/make_random_qwen2.py is in WORKDIR.
# BUILD_ONLY=1 stops after the builds and the requantised GGUFs.
#
# Needs: cmake (pip install cmake), g++, the Krafla builds (cargo xtask dist
# linux-x86_64) and Python with tools/requirements.txt. llama.cpp's source is
# the vendor/llama.cpp folder of the llama-cpp-python sdist on PyPI (0.3.36 is
# llama.cpp commit 0c1e570). llama.cpp's own defaults stay on: at avx2 and
# above it repacks Q4_0 weights at load time and uses llamafile's tinyBLAS for
# prompt batches; at sse2 its Q4_0 dot product is plain C, and below avx2 its
# Q8_0 dot product is compiler-vectorised C.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mkdir -p "${1:-$REPO/.cache/llamacpp}" && cd "${1:-$REPO/.cache/llamacpp}" && pwd)
# default: every x86-64 build of the variant table, the baseline first
ISAS=${ISAS:-$(cargo xtask variants --names x86_64 | tac | tr "\n" " ")}
THREADS=${THREADS:-"1 2"}
VERSION=0.3.36
PY=${PYTHON:-python3}
SERVER=${SERVER:-0}
BUILD_ONLY=${BUILD_ONLY:-0}

cd "$WORK"
# (the tests extract only models/ from the same sdist into .cache/llamacpp: look for the source itself)
if [ ! -f "llama_cpp_python-$VERSION/vendor/llama.cpp/CMakeLists.txt" ]; then
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d dl
    tar xzf "dl/llama_cpp_python-$VERSION.tar.gz"
fi
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp

# One static llama.cpp per level: GGML_NATIVE off (no -march=native), every
# x86 option set explicitly (they default to on), no backend dlopen.
COMMON=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_BACKEND_DL=OFF
    -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_AVX_VNNI=OFF -DGGML_AVX512_VBMI=OFF
    -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
flags() {
    case $1 in
        sse2) echo "-DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF" ;;
        # llama.cpp has no SSE4.1 level; its SSE4.2 build uses SSSE3/SSE4.1 instructions only
        sse41) echo "-DGGML_SSE42=ON -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF" ;;
        avx2) echo "-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF" ;;
        avx512vnni) echo "-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON" ;;
        *) echo "unknown ISA $1" >&2; exit 1 ;;
    esac
}
if [ "$SERVER" = 1 ]; then
    SERVER_FLAGS=(-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
    TARGETS=(llama-bench llama-quantize llama-server)
else
    SERVER_FLAGS=(-DLLAMA_BUILD_SERVER=OFF)
    TARGETS=(llama-bench llama-quantize)
fi
for isa in $ISAS; do
    if [ ! -x "build-$isa/bin/llama-bench" ] || { [ "$SERVER" = 1 ] && [ ! -x "build-$isa/bin/llama-server" ]; }; then
        # shellcheck disable=SC2046
        cmake -S "$SRC" -B "build-$isa" "${COMMON[@]}" "${SERVER_FLAGS[@]}" $(flags "$isa") > "build-$isa.log"
        nice -n 19 cmake --build "build-$isa" -j2 --target "${TARGETS[@]}" >> "build-$isa.log"
    fi
done

# The same source weights for both: SmolLM2-135M-Instruct Q4_1 from PyPI.
GGUF=$(cd "$REPO" && "$PY" -c "import sys; sys.path.insert(0, 'tools'); import models; print(models.smollm2_gguf())")
QUANT=$(ls build-*/bin/llama-quantize | head -1)
for ty in q4_0 q8_0; do
    [ -f "smollm2-$ty.gguf" ] || "$QUANT" --allow-requantize "$GGUF" "smollm2-$ty.gguf" "${ty^^}" > "quantize-$ty.log" 2>&1
    [ -f "smollm2-$ty.mlb" ] || "$REPO/dist/linux-x86_64/ml_sse2" "$GGUF" --type "$ty" --save "smollm2-$ty.mlb" \
        --prompt-ids 1 -n 0 2> /dev/null
done
if [ "$SERVER" = 1 ] && [ -f qwen2.5-1.5b-random-f16.gguf ] && [ ! -f qwen2.5-1.5b-random-Q4_0.gguf ]; then
    "$QUANT" qwen2.5-1.5b-random-f16.gguf qwen2.5-1.5b-random-Q4_0.gguf Q4_0 > quantize-qwen-q4_0.log 2>&1
fi
if [ "$BUILD_ONLY" = 1 ]; then exit 0; fi

for isa in $ISAS; do
    for t in $THREADS; do
        for ty in q8_0 q4_0; do
            echo "== krafla $isa $ty, $t threads"
            "$REPO/dist/linux-x86_64/ml_$isa" "smollm2-$ty.mlb" --bench -pp 512 -tg 128 -r 3 -t "$t" 2>&1 | grep -E '^\| |roofline|int8 peak'
            echo "== llama.cpp $isa $ty, $t threads"
            "build-$isa/bin/llama-bench" -m "smollm2-$ty.gguf" -p 512 -n 128 -r 3 -t "$t" 2>/dev/null | grep -E '^\| '
        done
    done
done
