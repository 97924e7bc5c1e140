#!/usr/bin/env bash
# sass-report.sh — the SASS instruction mix of a CUDA object's kernels and of
# their tensor-core loops (scripts/sass_loops.py), on the development machine:
# cuobjdump and nvdisasm from pinned PyPI wheels (the nvcc wheels carry
# neither), no GPU needed. Whether a kernel's loop is issue-bound shows here
# before any device time is spent (docs/perf.md, fifteenth session).
#
#   scripts/sass-report.sh OBJECT_OR_LIBRARY [FUNCTION_FILTER]
#   e.g. scripts/sass-report.sh build/cuda-dev/obj-90a/kernels/attention.o prefill_attn_ws
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 OBJECT_OR_LIBRARY [FUNCTION_FILTER]" >&2; exit 2; }
[[ -f $1 ]] || { echo "sass-report: no such file: $1" >&2; exit 2; }
VER=13.2.78
CACHE="${GLMCTL_CACHE:-$HOME/.cache/glmctl}/sass-tools-$VER"
if [[ ! -x "$CACHE/nvidia/cu13/bin/cuobjdump" || ! -x "$CACHE/nvidia/cu13/bin/nvdisasm" ]]; then
  rm -rf "$CACHE.tmp"
  "${PYTHON:-python3}" -m pip install --quiet --no-deps --only-binary=:all: --target "$CACHE.tmp" \
    "nvidia-cuda-cuobjdump==$VER" "nvidia-cuda-nvdisasm==$VER" >&2
  chmod +x "$CACHE.tmp/nvidia/cu13/bin/"*
  rm -rf "$CACHE"
  mv "$CACHE.tmp" "$CACHE"
fi
PATH="$CACHE/nvidia/cu13/bin:$PATH" cuobjdump -sass "$1" | python3 scripts/sass_loops.py - "${2:-}"
