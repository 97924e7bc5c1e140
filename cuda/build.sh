#!/usr/bin/env bash
# cuda/build.sh — build libglmcuda.so (and, with --tests, the kernel_check
# program) with the one nvcc command that `glmctl build` reproduces.
#
#   cuda/build.sh [--check] [--tests] [-o OUTDIR] [--arch SM]
#
#   --check   CI mode: no GPU needed. Installs the pinned CUDA 13.0 wheels
#             (scripts/install-cuda-wheels.sh) and uses their nvcc, headers and
#             libraries; compiles and links everything; a compile error fails.
#   --tests   also build one test program per cuda/tests/*.cu (OUTDIR/kernel_check, ...).
#   -o DIR    output directory (default: build/cuda).
#   --arch    SM target (default 90a: H100/H200). 100a for B200.
#
# Run from the repository root (or anywhere: the script cd's there).
set -euo pipefail
cd "$(dirname "$0")/.."

out=build/cuda; check=0; tests=0; arch=90a
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) check=1 ;;
    --tests) tests=1 ;;
    -o) out="$2"; shift ;;
    --arch) arch="$2"; shift ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [[ $check == 1 ]]; then
  eval "$(scripts/install-cuda-wheels.sh)"
fi
command -v nvcc >/dev/null || { echo "build.sh: nvcc not found (install CUDA 13 or use --check)" >&2; exit 1; }
mkdir -p "$out"

gencode="-gencode=arch=compute_${arch},code=sm_${arch}"
# The library: exactly the documented command (docs/cuda.md).
set -x
nvcc -O3 -std=c++17 -Xcompiler -fPIC -shared "$gencode" -Icuda/include \
  cuda/runtime/*.cu cuda/kernels/*.cu cuda/comm/*.cu \
  -lcublasLt -lcublas -lnccl -o "$out/libglmcuda.so"
if [[ $tests == 1 ]]; then
  # Every cuda/tests/*.cu is one test program linked with the kernels.
  for t in cuda/tests/*.cu; do
    name="$(basename "$t" .cu)"
    nvcc -O3 -std=c++17 "$gencode" -Icuda/include -Icuda/kernels \
      "$t" cuda/kernels/*.cu \
      -lcublasLt -lcublas -o "$out/$name"
  done
fi
