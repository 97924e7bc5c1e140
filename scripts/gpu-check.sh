#!/usr/bin/env bash
# gpu-check.sh — the GPU check of issue 4, run on the GPU machine (nvcc 13,
# an NVIDIA GPU, python3 + numpy; no Go there). It needs a glmctl binary built on
# the development machine (`make gpu-tests`, carried as bin/) and:
#   1. builds libglmcuda.so with `glmctl build` (sources embedded in the binary),
#   2. validates the CUDA backend against every golden file (the FP8 path
#      against the float32 and the FP8 goldens, --cuda-exact against float32),
#   3. checks that greedy generation on CUDA gives the CPU backend's tokens,
#   4. times tiny-model generation on both backends,
#   5. runs compute-sanitizer memcheck on a short `glmctl generate --backend cuda`,
#   6. runs scripts/gpu-kernel-check.sh (every kernel family against float64
#      references on fresh random inputs, outputs poisoned; decode-kernel bench
#      on full-size GLM-4.7 shapes).
# Logs go to $OUT (default ./gpu-check-out); a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
# Logs go to LOGS; $OUT (what the device tool brings back) gets one tarball.
FINAL="${OUT:-$PWD/gpu-check-out}"
OUT="$(mktemp -d)/gpu-check"
mkdir -p "$OUT" "$FINAL"
trap 'tar czf "$FINAL/gpu-check-logs.tgz" -C "$(dirname "$OUT")" gpu-check' EXIT
export NCCL_NVLS_ENABLE=0
G="${GLMCTL:-bin/glmctl}"
[[ -x "$G" ]] || { echo "gpu-check: $G missing: build it with 'make build' and carry bin/" >&2; exit 2; }
summary=(); status=0
note() { summary+=("$1"); }
fail() { status=1; note "$1"; }

nvidia-smi -L | tee "$OUT/device.txt"
"$G" version | tee "$OUT/version.txt"

# 1. build
if "$G" build --verbose >"$OUT/glmctl-build.log" 2>&1; then
  LIB=$(tail -1 "$OUT/glmctl-build.log"); export GLMCTL_CUDA_LIB="$LIB"
  note "glmctl build          ok ($LIB)"
else
  fail "glmctl build          FAIL (see glmctl-build.log)"; tail -40 "$OUT/glmctl-build.log"
  printf '%s\n' "${summary[@]}"; exit 1
fi

# 2. validate every golden file on CUDA: the real FP8 path against the float32
#    golden (FP8 tolerances) and against the FP8 golden (what the FP8 path
#    computes: half the cases within 1e-5, docs/validation.md), and the
#    validation precision (--cuda-exact, exact tolerances)
for m in tiny-f32 tiny-bf16g; do
  for mode in fp8 exact; do
    flag="--golden testdata/models/$m.golden.json --golden testdata/models/$m.fp8.golden.json"
    [[ $mode == exact ]] && flag="--cuda-exact --golden testdata/models/$m.golden.json"
    if "$G" validate --backend cuda $flag --model testdata/models/$m >"$OUT/validate-$m-$mode.txt" 2>&1; then
      note "validate cuda $m $mode  ok ($(grep -io 'agreement: [0-9]* of [0-9]*' "$OUT/validate-$m-$mode.txt" | head -1))"
    else fail "validate cuda $m $mode  FAIL (see validate-$m-$mode.txt)"; tail -15 "$OUT/validate-$m-$mode.txt"; fi
  done
done

# 3 + 4. greedy tokens on CUDA vs CPU, at both precisions: CPU exact float32 vs
#    --cuda-exact (must agree token for token), CPU --fp8-activations vs the real
#    CUDA FP8 path (the same roundings, so they agree until an FP8 rounding flip
#    from float32 summation order), and tokens/s of each
for m in tiny-f32 tiny-bf16g; do
  for cfg in "cpu:" "cuda:--cuda-exact" "cpu8:--fp8-activations" "cuda8:"; do
    name=${cfg%%:*}; flags=${cfg#*:}; b=${name%8}
    "$G" generate --backend $b $flags --model testdata/models/$m --prompt-ids 5,17,300,42,999,7 \
      --temperature 0 --max-tokens 64 --ignore-eos --json >"$OUT/gen-$m-$name.json" 2>"$OUT/gen-$m-$name.err" || fail "generate $name $m FAIL"
  done
  if res=$(python3 scripts/compare_generations.py "$OUT/gen-$m-cpu.json" "$OUT/gen-$m-cuda.json" 2>&1); then
    note "greedy exact cpu vs cuda $m: $res"
  else fail "greedy exact cpu vs cuda $m FAIL: $res"; fi
  res=$(python3 scripts/compare_generations.py "$OUT/gen-$m-cpu8.json" "$OUT/gen-$m-cuda8.json" 2>&1)
  note "greedy fp8 cpu vs cuda $m: $res"
done

# 4b. serve on CUDA: one chat completion (streamed and not) over HTTP, then SIGTERM
port=18431
"$G" serve --backend cuda --model testdata/models/tiny-f32 --port $port --gpu-memory-budget 4000000000 >"$OUT/serve.log" 2>&1 &
spid=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
body='{"model":"tiny-f32","messages":[{"role":"user","content":"Hello"}],"max_tokens":16,"seed":1}'
if curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$OUT/serve-chat.json" &&
   curl -sfN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
     -d '{"model":"tiny-f32","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}],"max_tokens":8}' >"$OUT/serve-stream.txt" &&
   grep -q '"finish_reason"' "$OUT/serve-chat.json" && grep -q 'data: \[DONE\]' "$OUT/serve-stream.txt"; then
  kill -TERM $spid; wait $spid; rc=$?
  if [[ $rc == 0 ]]; then note "serve cuda            ok (chat + SSE stream over HTTP, SIGTERM exit 0)"
  else fail "serve cuda            FAIL: exit $rc after SIGTERM"; fi
else
  fail "serve cuda            FAIL (see serve.log)"; kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null; tail -20 "$OUT/serve.log"
fi

# 5. compute-sanitizer on a short generate
if compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
     "$G" generate --backend cuda --model testdata/models/tiny-bf16g --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18 \
     --max-tokens 8 --temperature 0.7 --top-p 0.9 --seed 1 >"$OUT/sanitizer-generate.log" 2>&1; then
  note "compute-sanitizer generate ok ($(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer-generate.log"))"
else fail "compute-sanitizer generate FAIL (see sanitizer-generate.log)"; grep -m5 -A3 "=========" "$OUT/sanitizer-generate.log" | head -30; fi

# 5b. the CUDA backend's Go tests that need a GPU (`make gpu-tests` builds bin/cuda.test)
if [[ -x bin/cuda.test ]]; then
  if (cd pkg/backend/cuda && ../../../bin/cuda.test -test.v -test.count=1) >"$OUT/cuda-go-tests.log" 2>&1; then
    note "go tests (-tags gpu)   ok ($(grep -c '^--- PASS\|^    --- PASS' "$OUT/cuda-go-tests.log") passed)"
  else fail "go tests (-tags gpu)   FAIL (see cuda-go-tests.log)"; tail -20 "$OUT/cuda-go-tests.log"; fi
else
  fail "go tests (-tags gpu)   not run: bin/cuda.test missing (make gpu-tests)"
fi

# 6. kernels vs float64 references, and the decode bench
if [[ "${SKIP_KERNELS:-0}" != 1 ]]; then
  if OUT="$OUT" scripts/gpu-kernel-check.sh --no-sanitizer >"$OUT/gpu-kernel-check.txt" 2>&1; then note "gpu-kernel-check      ok"
  else fail "gpu-kernel-check      FAIL (see gpu-kernel-check.txt)"; fi
  tail -40 "$OUT/gpu-kernel-check.txt"
fi

# 7. bench: tiny model on CUDA through the engine, with the floor and a
#    projection of the floor to GLM-4.7 at TP8/EP8 (a projection, not a measurement)
if "$G" bench --backend cuda --model testdata/models/tiny-f32 --concurrency 1,16,64 --input-len 128 --output-len 64 \
     --project-model testdata/glm-4.7-fp8 --markdown >"$OUT/bench-tiny-cuda.md" 2>"$OUT/bench-tiny-cuda.err"; then
  note "bench cuda tiny-f32    ok (bench-tiny-cuda.md)"
else fail "bench cuda tiny-f32    FAIL (see bench-tiny-cuda.err)"; tail -5 "$OUT/bench-tiny-cuda.err"; fi
cat "$OUT/bench-tiny-cuda.md"

echo; echo "==== glmctl GPU check ($(head -1 "$OUT/device.txt"))"
printf '%s\n' "${summary[@]}"
exit $status
