#!/usr/bin/env bash
# gpu-check-tp.sh — tensor parallelism on a machine with >= TP GPUs (NCCL):
# validate the CUDA backend at --tp N on every golden file (real FP8 path and
# --cuda-exact), compare greedy tokens at validation precision with the CPU
# backend, run the two-GPU Go test (TestTensorParallelManyRows, with
# bin/cuda.test from `make gpu-tests`), and bench the tiny model. Needs bin/glmctl carried from the
# development machine, like gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
TP="${TP:-2}"
G="${GLMCTL:-bin/glmctl}"
export NCCL_NVLS_ENABLE=0
status=0; summary=()
nvidia-smi -L
LIB=$("$G" build 2>/dev/null | tail -1) || { echo "glmctl build failed"; exit 1; }
export GLMCTL_CUDA_LIB="$LIB"
for m in tiny-f32 tiny-bf16g; do
  for x in "" --cuda-exact; do
    if out=$("$G" validate --backend cuda --tp "$TP" $x --model testdata/models/$m 2>&1); then
      summary+=("validate tp$TP $m ${x:-fp8}: $(echo "$out" | grep -m1 -o 'PASS.*')")
    else status=1; summary+=("validate tp$TP $m ${x:-fp8}: FAIL"); echo "$out" | tail -12; fi
  done
  d=$(mktemp -d)
  "$G" generate --backend cpu --model testdata/models/$m --prompt-ids 5,17,300,42,999,7 --temperature 0 --max-tokens 64 --ignore-eos --json >"$d/cpu.json" 2>/dev/null
  "$G" generate --backend cuda --tp "$TP" --cuda-exact --model testdata/models/$m --prompt-ids 5,17,300,42,999,7 --temperature 0 --max-tokens 64 --ignore-eos --json >"$d/cuda.json" 2>"$d/cuda.err" || tail -5 "$d/cuda.err"
  if res=$(python3 scripts/compare_generations.py "$d/cpu.json" "$d/cuda.json" 2>&1); then summary+=("greedy exact cpu vs cuda tp$TP $m: $res")
  else status=1; summary+=("greedy exact cpu vs cuda tp$TP $m FAIL: $res"); fi
done
# The synthetic model's experts split over two GPUs past 128 rows a step (the
# shared expert on GPU 0 only): bin/cuda.test from `make gpu-tests`, if carried.
if [[ -x bin/cuda.test ]]; then
  if out=$(bin/cuda.test -test.run 'TestTensorParallelManyRows' -test.v 2>&1); then
    summary+=("go test TestTensorParallelManyRows: $(echo "$out" | grep -c 'worst rel L2') batches ok")
  else status=1; summary+=("go test TestTensorParallelManyRows FAIL"); echo "$out" | tail -12; fi
fi
"$G" bench --backend cuda --tp "$TP" --model testdata/models/tiny-f32 --concurrency 1,16,64 --input-len 128 --output-len 64 --markdown 2>/dev/null || { status=1; summary+=("bench tp$TP FAIL"); }
echo; printf '%s\n' "${summary[@]}"
exit $status
