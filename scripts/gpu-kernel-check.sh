#!/usr/bin/env bash
# gpu-kernel-check.sh — on the GPU machine (nvcc 13, CUDA GPU, python3 with
# numpy; no Go needed): build libglmcuda.so and kernel_check (or use the ones
# prebuilt into $PREBUILT), run every kernel family against its float64
# reference, run the tiny models through the C ABI against their golden files
# (cuda/tests/model_check.py), run compute-sanitizer memcheck on a short
# generate, and time the decode FP8 linear and MoE kernels on full-size GLM-4.7
# shapes. Logs go to $OUT (or ./gpu-check-out); a short table is printed last.
#
#   scripts/gpu-kernel-check.sh [--no-bench] [--no-sanitizer]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
PREBUILT="${PREBUILT:-.carry/cuda}"
bench=1; sanitize=1
for a in "$@"; do
  case "$a" in
    --no-bench) bench=0 ;;
    --no-sanitizer) sanitize=0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=0
summary=()
status=0
note() { summary+=("$1"); }

nvidia-smi -L | tee "$OUT/device.txt"
if [[ -x "$PREBUILT/kernel_check" && -f "$PREBUILT/libglmcuda.so" ]]; then
  BUILD="$PREBUILT"
  echo "using prebuilt binaries from $BUILD"
else
  BUILD=build/cuda
  if cuda/build.sh --tests -o "$BUILD" >"$OUT/build.log" 2>&1; then note "build            ok"
  else note "build            FAIL (see build.log)"; tail -30 "$OUT/build.log"; printf '%s\n' "${summary[@]}"; exit 1; fi
fi

if "$BUILD/kernel_check" >"$OUT/kernel_check.log" 2>&1; then note "kernel_check     ok ($(grep -m1 -o '[0-9]* checks, [0-9]* failed' "$OUT/kernel_check.log"))"
else status=1; note "kernel_check     FAIL: $(grep -c 'FAIL' "$OUT/kernel_check.log") failing (see kernel_check.log)"; fi

for m in tiny-f32 tiny-bf16g; do
  extra=""; [[ $bench == 1 ]] && extra="--bench"
  if python3 cuda/tests/model_check.py --lib "$BUILD/libglmcuda.so" --model testdata/models/$m \
       --golden testdata/models/$m.golden.json --fp8-golden testdata/models/$m.fp8.golden.json \
       $extra >"$OUT/model_check_$m.log" 2>&1; then
    note "model_check $m  ok"
  else status=1; note "model_check $m  FAIL (see model_check_$m.log)"; fi
done

if [[ $sanitize == 1 ]]; then
  if compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
       python3 cuda/tests/model_check.py --lib "$BUILD/libglmcuda.so" --model testdata/models/tiny-bf16g \
       --golden testdata/models/tiny-bf16g.golden.json --quick >"$OUT/sanitizer.log" 2>&1; then
    note "compute-sanitizer ok ($(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer.log"))"
  else status=1; note "compute-sanitizer FAIL (see sanitizer.log)"; fi
fi

if [[ $bench == 1 ]]; then
  "$BUILD/kernel_check" --bench-only >"$OUT/bench.log" 2>&1 || { status=1; note "bench            FAIL"; }
fi

echo; echo "==== logs: $OUT"
grep -E "FAIL|^  " "$OUT"/kernel_check.log | head -40
for m in tiny-f32 tiny-bf16g; do grep -E "FAIL|checks|^  |throughput|^ *[0-9]+ +[0-9]|fp8 vs|batched" "$OUT/model_check_$m.log" | head -40; done
[[ -f "$OUT/bench.log" ]] && sed -n '/^kernel (FP8/,$p' "$OUT/bench.log"
echo; printf '%s\n' "${summary[@]}"
exit $status
