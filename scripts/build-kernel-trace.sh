#!/usr/bin/env bash
# build-kernel-trace.sh — build scripts/kernel_trace.c (a CUPTI injection
# library recording every kernel's GPU start and end, CUDA graph nodes
# included) into OUT_DIR (default .carry/trace) with CUPTI from a pinned PyPI
# wheel, and copy that libcupti beside it, for `scripts/gpu-perf.sh trace` on
# the GPU machine (which has ncu but no nsys).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-.carry/trace}"
CACHE="${GLMCTL_CACHE:-$HOME/.cache/glmctl}/cupti-13.0.85"
if [[ ! -f "$CACHE/nvidia/cu13/include/cupti.h" ]]; then
  rm -rf "$CACHE.tmp"
  "${PYTHON:-python3}" -m pip install --quiet --no-deps --only-binary=:all: --target "$CACHE.tmp" \
    "nvidia-cuda-cupti==13.0.85" >&2
  rm -rf "$CACHE"
  mv "$CACHE.tmp" "$CACHE"
fi
eval "$(scripts/install-cuda-wheels.sh 2>/dev/null)"  # cuda.h for cupti.h
mkdir -p "$OUT_DIR"
cc -O2 -shared -fPIC -Wall -I"$CACHE/nvidia/cu13/include" -I"$CUDA_HOME/include" scripts/kernel_trace.c \
  -L"$CACHE/nvidia/cu13/lib" -l:libcupti.so.13 -o "$OUT_DIR/libkernel_trace.so"
cp "$CACHE/nvidia/cu13/lib/libcupti.so.13" "$OUT_DIR/"
echo "$OUT_DIR/libkernel_trace.so"
