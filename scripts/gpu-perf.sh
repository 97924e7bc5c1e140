#!/usr/bin/env bash
# gpu-perf.sh — decode at real GLM-4.7 size on one GPU (issue 11), run on the
# GPU machine with bin/ (glmctl, cuda.test: `make gpu-tests`) and .carry/cuda
# (libglmcuda.so and the kernel test programs: `cuda/build.sh --check --tests
# -o .carry/cuda`) carried from the development machine. Stages, in order:
#
#   check    kernel_check, attn_check, prefill_check, grouped_check, small_check,
#            stream_tc_check against float64 references, moe_decode_check and
#            attn_layer_check against the kernel chains they replace, kvfp8_check
#            (the FP8 KV cache's writer, decode and prefill attention);
#            the tiny models validated on CUDA (FP8 and exact); greedy tokens with
#            CUDA graphs on and off (must be identical); the -tags gpu Go tests
#   kernels  attention decode bench next to PyTorch SDPA on the same shapes;
#            the small-kernel bench; the tensor-core streaming GEMM next to
#            cuBLASLt and gemm_fp8_stream (stream_tc_check --bench-only); the
#            one-token launches against their chains and the CTA hand-off latency
#            (handoff_bench)
#   masks    the decode step with and without token masks (bench --token-masks), and
#            pkg/grammar's mask benchmarks (bin/grammar.test) on this machine's CPUs
#   grid     glmctl bench --synthetic glm-4.7 --rank 0/8: decode step time at
#            batch {1,4,16,64,128,256} x context {1k,4k,16k}, floor and ratio
#   profile  the same at context 2k for batch 1, 64, 256 with --profile, graphs
#            on and off
#   trace    the in-graph kernel timeline of decode steps (TRACE_BATCHES, default
#            "1 64 256"; 2k context) from a CUPTI injection library
#            (scripts/build-kernel-trace.sh -> .carry/trace): per kernel its share of
#            the step, and one layer's kernels in order (scripts/trace_summary.py)
#   ncu      kernel durations of eager decode steps (6 layers) from ncu
#   ncu-prefill  duration, DRAM and SM throughput per kernel of an eager 2k prefill
#            step and a decode step of each batch in NCU_DECODE_BATCHES (default 64;
#            6 layers), from ncu
#   ncu-small  what bounds the prefill's bandwidth kernels (norms, SiLU, rope, router,
#            quantization, combine; NCU_SMALL_REGEX): their first NCU_SMALL_COUNT (24)
#            launches of an eager 2k prefill (6 layers) under ncu with application
#            replay (kernel replay fails on this program) — throughput, occupancy,
#            stall reasons — summarized by scripts/ncu_summary.py
#   e2e      the request workload (concurrency 64, 512 in / 32 out) through the
#            engine, timed from the command's start to its table
#   mtp      speculative decoding with the MTP layer (issue 19), k in MTP_K (default
#            "1 3"): greedy tokens on/off on every bundled model; demo-go's
#            acceptance and single-stream speed on/off; time per output token of
#            the synthetic rank model on/off
#   ab       the decode step at context 2k (AB_CONTEXT), batch {1,4,16,64,128,256} (AB_BATCHES;
#            "none": no decode runs), with each library of AB_LIBS ("name=path/libglmcuda.so
#            ..."), alternated AB_REPS times (default 2) on this machine (and with
#            AB_TTFT="2048 ..." the time to first token of those prompts); a table last
#   prefill  prefill attention bench next to PyTorch SDPA (causal, same shapes, every
#            backend: flash, efficient, cuDNN); the
#            grouped expert GEMM bench next to torch._scaled_mm; the peer kernels' sum for
#            whole 2k / 8k / 32k prompts (scripts/peer_prefill_sum.py; PREFILL_BENCH=0 skips
#            these); time to first token of 2k, 8k and 32k prompts with a profile; an 8k
#            prompt arriving among 16 decoding streams (--arrival-len) (issue 12)
#
#   scripts/gpu-perf.sh [stage ...]     (default: all stages)
#
# With the device tool the working tree plus carried paths must stay under 64 MiB:
# bin/glmctl alone is ~29 MB, so pack what is carried, e.g.
#   tar cf - bin/glmctl bin/cuda.test .carry/cuda | xz -T2 > .bundle/bundle.tar.xz
# (.bundle/ in .git/info/exclude), carry .bundle and start the command with
# `tar xJf .bundle/bundle.tar.xz && scripts/gpu-perf.sh ...`.
#
# Logs go to a temporary directory tarred into $OUT/gpu-perf-logs.tgz; the
# tables are also copied to $OUT; a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL="${OUT:-$PWD/gpu-perf-out}"
LOG="$(mktemp -d)/gpu-perf"
mkdir -p "$LOG" "$FINAL"
trap 'tar czf "$FINAL/gpu-perf-logs.tgz" -C "$(dirname "$LOG")" gpu-perf' EXIT
export NCCL_NVLS_ENABLE=0
G="${GLMCTL:-bin/glmctl}"
# Every GPU command gets a time limit, so one hung kernel cannot eat the call.
T="${STEP_TIMEOUT:-300}"
PRE="${PREBUILT:-.carry/cuda}"
stages=("$@")
[[ ${#stages[@]} == 0 ]] && stages=(check kernels grid profile ncu e2e prefill)
want() { local s; for s in "${stages[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
summary=(); status=0
note() { summary+=("$1"); }
fail() { status=1; note "$1"; }
SYN=(--backend cuda --synthetic glm-4.7 --rank 0/8)

nvidia-smi -L | tee "$LOG/device.txt"
if [[ -f "$PRE/libglmcuda.so" ]]; then
  export GLMCTL_CUDA_LIB="$PWD/$PRE/libglmcuda.so"
  note "library               prebuilt $GLMCTL_CUDA_LIB"
else
  t0=$(date +%s)
  if "$G" build >"$LOG/glmctl-build.log" 2>&1; then
    export GLMCTL_CUDA_LIB="$(tail -1 "$LOG/glmctl-build.log")"
    note "glmctl build          ok in $(( $(date +%s) - t0 )) s"
  else fail "glmctl build          FAIL"; tail -30 "$LOG/glmctl-build.log"; printf '%s\n' "${summary[@]}"; exit 1; fi
fi

if want check; then
  for t in kernel_check attn_check prefill_check grouped_check small_check stream_tc_check moe_decode_check \
           attn_layer_check kvfp8_check; do
    if [[ ! -x "$PRE/$t" ]]; then fail "$t               missing in $PRE"; continue; fi
    if timeout "$T" "$PRE/$t" >"$LOG/$t.log" 2>&1; then note "$(printf '%-21s' $t) ok ($(grep -m1 -o '[0-9]* checks, [0-9]* failed' "$LOG/$t.log"))"
    else fail "$(printf '%-21s' $t) FAIL (see $t.log)"; grep -m12 FAIL "$LOG/$t.log"; tail -3 "$LOG/$t.log"; fi
  done
  for m in tiny-f32 tiny-bf16g; do
    for mode in fp8 exact; do
      # The FP8 path also against the FP8 golden (docs/validation.md).
      flag="--golden testdata/models/$m.fp8.golden.json"; [[ $mode == exact ]] && flag="--cuda-exact"
      if timeout "$T" "$G" validate --backend cuda $flag --model testdata/models/$m --golden testdata/models/$m.golden.json >"$LOG/validate-$m-$mode.txt" 2>&1; then
        note "validate $m $mode  ok ($(grep -m1 -io 'worst.*' "$LOG/validate-$m-$mode.txt" | head -c 60)$(grep -io 'agreement: [0-9]* of [0-9]*' "$LOG/validate-$m-$mode.txt" | sed 's/^/; /'))"
      else fail "validate $m $mode  FAIL"; tail -8 "$LOG/validate-$m-$mode.txt"; fi
    done
    # The FP8 (e4m3, scaled) KV cache against the same goldens at the FP8 path's tolerances.
    if timeout "$T" "$G" validate --backend cuda --kv-cache-dtype fp8 --model testdata/models/$m --golden testdata/models/$m.golden.json >"$LOG/validate-$m-kvfp8.txt" 2>&1; then
      note "validate $m kv fp8 ok ($(grep -m1 -io 'worst.*' "$LOG/validate-$m-kvfp8.txt" | head -c 60))"
    else fail "validate $m kv fp8 FAIL"; tail -8 "$LOG/validate-$m-kvfp8.txt"; fi
    # Greedy tokens: CUDA graphs on vs off must be identical (padding rows and
    # graph replay change nothing), several sequences at once through serve-like
    # batching is covered by the Go tests.
    for g in on off; do
      flag=""; [[ $g == off ]] && flag="--cuda-graphs=false"
      timeout "$T" "$G" generate --backend cuda $flag --model testdata/models/$m --prompt-ids 5,17,300,42,999,7 \
        --temperature 0 --max-tokens 64 --ignore-eos --json >"$LOG/gen-$m-graphs-$g.json" 2>"$LOG/gen-$m-graphs-$g.err" ||
        fail "generate graphs $g $m FAIL ($(tail -1 "$LOG/gen-$m-graphs-$g.err"))"
    done
    if res=$(python3 scripts/compare_generations.py "$LOG/gen-$m-graphs-on.json" "$LOG/gen-$m-graphs-off.json" 2>&1); then
      note "greedy graphs on/off $m: $res"
    else fail "greedy graphs on/off $m FAIL: $res"; fi
  done
  # The long-context golden (3,000 tokens, numpy float64 reference): exact on the
  # validation path, the prompt in one step (the runtime's 8,192-token limit) and
  # in chunks of 1,024 (chunked prefill over the paged cache); the FP8 path is
  # reported, not asserted (its routing over thousands of tokens is not screened
  # for FP8-fragile decisions).
  lg=testdata/models/tiny-f32.long.golden.json
  for chunk in 0 1024; do
    if timeout "$T" "$G" validate --backend cuda --cuda-exact --max-batched-tokens $chunk --model testdata/models/tiny-f32 --golden $lg >"$LOG/validate-long-exact-$chunk.txt" 2>&1; then
      note "validate long exact   ok, chunks ${chunk/#0/whole} ($(grep -m1 -io 'worst.*' "$LOG/validate-long-exact-$chunk.txt" | head -c 80))"
    else fail "validate long exact   FAIL, chunks ${chunk/#0/whole}"; tail -8 "$LOG/validate-long-exact-$chunk.txt"; fi
  done
  timeout "$T" "$G" validate --backend cuda --model testdata/models/tiny-f32 --golden $lg >"$LOG/validate-long-fp8.txt" 2>&1
  note "validate long fp8     exit $? (informational: $(grep -m1 -io 'worst.*' "$LOG/validate-long-fp8.txt" | head -c 80))"
  if [[ -x bin/cuda.test ]]; then
    if (cd pkg/backend/cuda && timeout "$T" ../../../bin/cuda.test -test.v -test.count=1) >"$LOG/cuda-go-tests.log" 2>&1; then
      note "go tests (-tags gpu)   ok ($(grep -c -- '--- PASS' "$LOG/cuda-go-tests.log") passed)"
    else fail "go tests (-tags gpu)   FAIL (see cuda-go-tests.log)"; grep -- '--- FAIL' "$LOG/cuda-go-tests.log" | head; tail -15 "$LOG/cuda-go-tests.log"; fi
  else fail "go tests (-tags gpu)   not run: bin/cuda.test missing"; fi
fi

if want kernels; then
  timeout "$T" "$PRE/attn_check" --bench-only >"$LOG/attn-bench.txt" 2>&1 || fail "attn_check --bench FAIL"
  if [[ "${SWEEP:-0}" == 1 ]]; then
    timeout "$T" "$PRE/attn_check" --sweep >"$LOG/attn-sweep.txt" 2>&1 || fail "attn_check --sweep FAIL"
    cp "$LOG/attn-sweep.txt" "$FINAL/" 2>/dev/null
  fi
  timeout "$T" "$PRE/kernel_check" --bench-only >"$LOG/kc-bench.txt" 2>&1 || fail "kernel_check --bench-only FAIL"
  cp "$LOG/kc-bench.txt" "$FINAL/" 2>/dev/null
  timeout "$T" python3 scripts/peer_attention.py ${SDPA_ARGS:---all-backends} --json "$LOG/sdpa.json" >"$LOG/sdpa.txt" 2>&1 || fail "peer_attention.py FAIL"
  cp "$LOG/attn-bench.txt" "$LOG/sdpa.txt" "$FINAL/" 2>/dev/null
  timeout "$T" "$PRE/small_check" --bench-only >"$LOG/small-bench.txt" 2>&1 || fail "small_check --bench FAIL"
  cp "$LOG/small-bench.txt" "$FINAL/" 2>/dev/null
  timeout "$T" "$PRE/stream_tc_check" --bench-only >"$LOG/stream-tc-bench.txt" 2>&1 || fail "stream_tc_check --bench FAIL"
  timeout "$T" "$PRE/moe_decode_check" --bench-only >"$LOG/moe-decode-bench.txt" 2>&1 || fail "moe_decode_check --bench FAIL"
  cp "$LOG/moe-decode-bench.txt" "$FINAL/" 2>/dev/null
  timeout "$T" "$PRE/attn_layer_check" --bench-only >"$LOG/attn-layer-bench.txt" 2>&1 || fail "attn_layer_check --bench FAIL"
  cp "$LOG/attn-layer-bench.txt" "$FINAL/" 2>/dev/null
  timeout "$T" "$PRE/handoff_bench" >"$LOG/handoff-bench.txt" 2>&1 || fail "handoff_bench FAIL"
  cp "$LOG/handoff-bench.txt" "$FINAL/" 2>/dev/null
  cp "$LOG/stream-tc-bench.txt" "$FINAL/" 2>/dev/null
  note "kernel benches        attn-bench.txt, sdpa.txt, small-bench.txt, kc-bench.txt, stream-tc-bench.txt, moe-decode-bench.txt, attn-layer-bench.txt, handoff-bench.txt"
fi

if want grid; then
  t0=$(date +%s)
  if timeout "$T" "$G" bench "${SYN[@]}" --batches 1,4,16,64,128,256 --contexts 1024,4096,16384 --steps 10 --warmup-steps 3 \
       --markdown >"$LOG/grid.md" 2>"$LOG/grid.err"; then
    note "bench grid            ok in $(( $(date +%s) - t0 )) s (grid.md)"
  else fail "bench grid            FAIL"; tail -5 "$LOG/grid.err"; fi
  cp "$LOG/grid.md" "$FINAL/" 2>/dev/null
fi

if want masks; then
  # Structured outputs (issue 18): the decode step with and without token masks,
  # alternated twice; then the CPU side, llguidance's masks on a 151k vocabulary
  # (Qwen3's tokenizer, GLM-4.7-sized) on this machine's cores.
  for rep in 1 2; do
    for m in off on; do
      flag=""; [[ $m == on ]] && flag="--token-masks"
      timeout "$T" "$G" bench "${SYN[@]}" --batches 1,64,256 --contexts 2048 --steps 20 --warmup-steps 3 $flag \
        --markdown >"$LOG/masks-$m-$rep.md" 2>"$LOG/masks-$m-$rep.err" || fail "bench masks $m FAIL ($(tail -1 "$LOG/masks-$m-$rep.err"))"
    done
  done
  note "bench masks           done (masks-*.md)"
  if [[ -x bin/grammar.test ]]; then
    (cd pkg/grammar && timeout "$T" ../../bin/grammar.test -test.run '^$' -test.bench . -test.benchtime 2s) >"$LOG/grammar-bench.txt" 2>&1 ||
      fail "grammar benchmarks FAIL"
  fi
fi

if want profile; then
  modes=(on); [[ "${PROFILE_OFF:-0}" == 1 ]] && modes=(on off)
  for g in "${modes[@]}"; do
    flag=""; [[ $g == off ]] && flag="--cuda-graphs=false"
    if timeout "$T" "$G" bench "${SYN[@]}" $flag --batches 1,64,256 --contexts 2048 --steps 10 --profile --markdown \
         >"$LOG/profile-graphs-$g.md" 2>"$LOG/profile-graphs-$g.err"; then
      note "bench profile graphs $g ok (profile-graphs-$g.md)"
    else fail "bench profile graphs $g FAIL"; tail -5 "$LOG/profile-graphs-$g.err"; fi
    cp "$LOG/profile-graphs-$g.md" "$FINAL/" 2>/dev/null
  done
fi

if want trace; then
  # The in-graph kernel timeline of decode steps at context 2,048 for each batch
  # of TRACE_BATCHES (default "1 64 256"), recorded by the CUPTI injection
  # library in $TRACE_LIB (default .carry/trace: scripts/build-kernel-trace.sh);
  # scripts/trace_summary.py sums, per kernel, the time from the end of the
  # kernel before to its own end over the last whole step, and lists one layer.
  # 30 steps: CUPTI hands records over every 50 ms and a Go program's exit
  # flushes none, so the steps must outlast that (batch 1: ~5 ms a step).
  TL="${TRACE_LIB:-.carry/trace}"
  if [[ -f "$TL/libkernel_trace.so" ]]; then
    for b in ${TRACE_BATCHES:-1 64 256}; do
      LD_LIBRARY_PATH="$PWD/$TL:${LD_LIBRARY_PATH:-}" CUDA_INJECTION64_PATH="$PWD/$TL/libkernel_trace.so" \
        KERNEL_TRACE_OUT="$LOG/trace-b$b.csv" timeout "$T" "$G" bench "${SYN[@]}" --batches "$b" --contexts 2048 \
        --steps 30 --warmup-steps 2 >"$LOG/trace-b$b.bench" 2>&1 || fail "bench trace b$b FAIL"
      if python3 scripts/trace_summary.py "$LOG/trace-b$b.csv" >"$LOG/trace-b$b.txt" 2>&1; then
        note "trace batch $b          ok (trace-b$b.txt)"
      else fail "trace batch $b          FAIL"; fi
      cp "$LOG/trace-b$b.txt" "$FINAL/" 2>/dev/null
    done
  else fail "trace                 no $TL/libkernel_trace.so (scripts/build-kernel-trace.sh)"; fi
fi

if want ncu; then
  # Exact kernel durations of one eager decode step (4 layers: 3 dense + 1 MoE...
  # plus 2 more MoE layers) at batch 1 and 64, context 2048, from the hardware counters.
  for b in 1 64; do
    if timeout "$T" ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
         "$G" bench "${SYN[@]}" --layers 6 --cuda-graphs=false --batches $b --contexts 2048 --steps 1 --warmup-steps 1 \
         --log-level warn >"$LOG/ncu-b$b.csv" 2>"$LOG/ncu-b$b.err"; then
      note "ncu batch $b            ok (ncu-b$b.csv)"
    else fail "ncu batch $b            FAIL"; tail -5 "$LOG/ncu-b$b.err"; fi
    cp "$LOG/ncu-b$b.csv" "$FINAL/" 2>/dev/null
  done
fi

if want ncu-small; then
  # Application replay: ncu's kernel replay stops at this program's first
  # profiled kernel ("Failed to profile", error 9).
  SM=""
  for r in long_scoreboard barrier lg_throttle membar drain short_scoreboard wait mio_throttle; do
    SM="$SM,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
  done
  if timeout "$T" ncu --replay-mode application --clock-control none --section SpeedOfLight --section Occupancy \
       --section WarpStateStats --section LaunchStats --section SchedulerStats --metrics "${SM#,}" \
       -k "regex:${NCU_SMALL_REGEX:-silu|rmsnorm|combine|rope|router|quant}" --launch-count "${NCU_SMALL_COUNT:-24}" \
       --page details --print-units base \
       "$G" bench "${SYN[@]}" --layers 6 --cuda-graphs=false --concurrency 1 --input-len 2048 --output-len 2 --requests 1 \
       --warmup 0 --log-level warn >"$LOG/ncu-small.txt" 2>&1 &&
     python3 scripts/ncu_summary.py "$LOG/ncu-small.txt" >"$LOG/ncu-small.md"; then
    note "ncu small kernels     ok (ncu-small.md)"
  else fail "ncu small kernels     FAIL"; tail -5 "$LOG/ncu-small.txt"; fi
  cp "$LOG"/ncu-small.* "$FINAL/" 2>/dev/null
fi

if want ncu-prefill; then
  # Per-kernel duration, DRAM and SM throughput of one eager 2k prefill step and
  # one batch-64 decode step (6 layers: 3 dense + 3 MoE), from the hardware counters.
  M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
  if timeout "$T" ncu --clock-control none --replay-mode application --metrics $M --csv --print-units base \
       "$G" bench "${SYN[@]}" --layers 6 --cuda-graphs=false --concurrency 1 --input-len 2048 --output-len 2 --requests 1 --warmup 0 \
       --log-level warn >"$LOG/ncu-prefill.csv" 2>"$LOG/ncu-prefill.err"; then
    note "ncu prefill 2k        ok (ncu-prefill.csv)"
  else fail "ncu prefill 2k        FAIL"; tail -5 "$LOG/ncu-prefill.err"; fi
  for b in ${NCU_DECODE_BATCHES:-64}; do
    if timeout "$T" ncu --clock-control none --replay-mode application --metrics $M --csv --print-units base \
         "$G" bench "${SYN[@]}" --layers 6 --cuda-graphs=false --batches "$b" --contexts 2048 --steps 1 --warmup-steps 1 \
         --log-level warn >"$LOG/ncu-dram-b$b.csv" 2>"$LOG/ncu-dram-b$b.err"; then
      note "ncu decode b$b dram   ok (ncu-dram-b$b.csv)"
    else fail "ncu decode b$b dram   FAIL"; tail -5 "$LOG/ncu-dram-b$b.err"; fi
    cp "$LOG/ncu-dram-b$b.csv" "$FINAL/" 2>/dev/null
  done
  cp "$LOG/ncu-prefill.csv" "$FINAL/" 2>/dev/null
fi

if want ab; then
  # Same-machine A/B of runtime libraries (fresh machines differ by ~3%).
  read -r -a libs <<<"${AB_LIBS:-cur=$GLMCTL_CUDA_LIB}"
  AB_BATCHES="${AB_BATCHES:-1 4 16 64 128 256}"
  [[ $AB_BATCHES == none ]] && AB_BATCHES=""  # TTFT only (AB_TTFT): no decode runs
  for rep in $(seq "${AB_REPS:-2}"); do
    [[ -z $AB_BATCHES ]] && break
    for nl in "${libs[@]}"; do
      name=${nl%%=*}; lib=${nl#*=}
      GLMCTL_CUDA_LIB="$PWD/${lib#$PWD/}" timeout "$T" "$G" bench "${SYN[@]}" --batches "${AB_BATCHES// /,}" --contexts "${AB_CONTEXT:-2048}" \
        --steps 20 --warmup-steps 3 --markdown >"$LOG/ab-$name-$rep.md" 2>"$LOG/ab-$name-$rep.err" ||
        fail "bench ab $name $rep FAIL ($(tail -1 "$LOG/ab-$name-$rep.err"))"
    done
  done
  # AB_TTFT="2048 8192": also the time to first token of those prompt lengths.
  for n in ${AB_TTFT:-}; do
    for rep in $(seq "${AB_REPS:-2}"); do
      for nl in "${libs[@]}"; do
        name=${nl%%=*}; lib=${nl#*=}
        GLMCTL_CUDA_LIB="$PWD/${lib#$PWD/}" timeout "$T" "$G" bench "${SYN[@]}" --concurrency 1 --input-len "$n" \
          --output-len 2 --requests 3 --warmup 1 --markdown >"$LOG/abttft-$n-$name-$rep.md" 2>"$LOG/abttft-$n-$name-$rep.err" ||
          fail "bench ab ttft $n $name $rep FAIL ($(tail -1 "$LOG/abttft-$n-$name-$rep.err"))"
      done
    done
  done
  {
    for n in ${AB_TTFT:-}; do
      printf '| TTFT ms p50, %s-token prompt |' "$n"
      for nl in "${libs[@]}"; do
        name=${nl%%=*}
        v=$(for f in "$LOG"/abttft-"$n"-"$name"-*.md; do
              awk -F'|' '/TTFT ms p50/ {for (i = 1; i <= NF; i++) if ($i ~ /TTFT/) c = i; next}
                         c && $2+0 > 0 {split($c, a, "/"); gsub(/ /, "", a[1]); print a[1]; c = 0}' "$f"
            done | paste -sd/)
        printf ' %s |' "${v:--}"
      done
      echo
    done
    [[ -n ${AB_TTFT:-} && -n $AB_BATCHES ]] && echo
    if [[ -n $AB_BATCHES ]]; then
      printf '| batch |'; for nl in "${libs[@]}"; do printf ' %s ms |' "${nl%%=*}"; done; echo
      printf '|---:|'; for nl in "${libs[@]}"; do printf -- '---:|'; done; echo
    fi
    for b in $AB_BATCHES; do
      printf '| %s |' "$b"
      for nl in "${libs[@]}"; do
        name=${nl%%=*}
        v=$(for f in "$LOG"/ab-"$name"-*.md; do awk -F'|' -v b="$b" -v c="${AB_CONTEXT:-2048}" '$2+0==b && $3+0==c {gsub(/ /,"",$4); print $4}' "$f"; done | paste -sd/)
        printf ' %s |' "${v:--}"
      done
      echo
    done
  } >"$LOG/ab.md"
  cp "$LOG"/ab*.md "$FINAL/" 2>/dev/null
  note "bench ab              done (ab.md: step ms p50 per run)"
fi

if want mtp; then
  # Speculative decoding with the MTP layer (issue 19), for each k of MTP_K
  # (default "1 3"). Greedy tokens with drafting on and off must be identical
  # on every bundled model; then the trained demo model's acceptance and
  # single-stream speed on/off, and on the synthetic rank model (random MTP
  # weights: drafts are rejected, so each step is a k-draft verify step with
  # its chained passes) the time per output token against plain decoding.
  GOP=$'package main\n\nimport (\n\t"fmt"\n\t"strings"\n)\n\nfunc main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.'
  read -r -a MK <<<"${MTP_K:-1 3}"
  spec_flags() { flag=(); [[ $1 == off ]] || flag=(--speculative mtp --draft-tokens "${1#k}"); }
  for m in tiny-f32 tiny-bf16g demo-go; do
    for sp in off "${MK[@]/#/k}"; do
      spec_flags "$sp"
      src=(--prompt-ids 5,17,300,42,999,7); [[ $m == demo-go ]] && src=("$GOP")
      timeout "$T" "$G" generate --backend cuda "${flag[@]}" --model testdata/models/$m "${src[@]}" \
        --temperature 0 --max-tokens 200 --ignore-eos --json >"$LOG/gen-$m-mtp-$sp.json" 2>"$LOG/gen-$m-mtp-$sp.err" ||
        fail "generate mtp $sp $m FAIL ($(tail -1 "$LOG/gen-$m-mtp-$sp.err"))"
      [[ $sp == off ]] && continue
      if res=$(python3 scripts/compare_generations.py "$LOG/gen-$m-mtp-off.json" "$LOG/gen-$m-mtp-$sp.json" 2>&1); then
        note "greedy mtp off/$sp $m: $res; $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("drafts accepted %d of %d" % (d.get("drafts_accepted",0), d.get("drafts_verified",0)))' "$LOG/gen-$m-mtp-$sp.json")"
      else fail "greedy mtp off/$sp $m FAIL: $res"; fi
    done
  done
  for rep in 1 2; do
    for sp in off "${MK[@]/#/k}"; do
      spec_flags "$sp"
      timeout "$T" "$G" bench --backend cuda --model testdata/models/demo-go "${flag[@]}" --concurrency 1,8 --input-len 64 \
        --output-len 128 --requests 8 --warmup 1 --markdown >"$LOG/mtp-demo-$sp-$rep.md" 2>"$LOG/mtp-demo-$sp-$rep.err" ||
        fail "bench mtp demo $sp FAIL ($(tail -1 "$LOG/mtp-demo-$sp-$rep.err"))"
      timeout "$T" "$G" bench "${SYN[@]}" "${flag[@]}" --concurrency ${MTP_CONC:-1,4} --input-len 2048 --output-len 48 \
        --requests 4 --warmup 1 --markdown >"$LOG/mtp-syn-$sp-$rep.md" 2>"$LOG/mtp-syn-$sp-$rep.err" ||
        fail "bench mtp synthetic $sp FAIL ($(tail -1 "$LOG/mtp-syn-$sp-$rep.err"))"
    done
  done
  for f in "$LOG"/mtp-*.md; do echo "== $(basename "$f")"; grep '^|' "$f"; done >"$LOG/mtp.md"
  cp "$LOG"/mtp.md "$FINAL/" 2>/dev/null
  note "bench mtp             done (mtp.md)"
fi

if want e2e; then
  t0=$(date +%s)
  if timeout "$T" "$G" bench "${SYN[@]}" --concurrency 64 --input-len 512 --output-len 32 --requests 64 --warmup 0 \
       --markdown >"$LOG/e2e.md" 2>"$LOG/e2e.err"; then
    note "bench e2e c=64        ok in $(( $(date +%s) - t0 )) s from start to table (e2e.md)"
  else fail "bench e2e c=64        FAIL"; tail -5 "$LOG/e2e.err"; fi
  cp "$LOG/e2e.md" "$FINAL/" 2>/dev/null
fi

if want prefill; then
  if [[ "${PREFILL_BENCH:-1}" == 1 ]]; then
    timeout "$T" "$PRE/prefill_check" --bench-only >"$LOG/prefill-bench.txt" 2>&1 || fail "prefill_check --bench FAIL"
    # Every SDPA backend: cuDNN's is the fastest on Hopper (1.7-1.9x flash's at 8k-32k).
    timeout "$T" python3 scripts/peer_prefill.py --all-backends >"$LOG/prefill-sdpa.txt" 2>&1 || fail "peer_prefill.py FAIL"
    # Issue 12's peer sum for whole prompts (SDPA + torch._scaled_mm, 92 layers).
    timeout "$T" python3 scripts/peer_prefill_sum.py >"$LOG/prefill-peer-sum.txt" 2>&1 || fail "peer_prefill_sum.py FAIL"
    timeout "$T" "$PRE/grouped_check" --bench-only >"$LOG/grouped-bench.txt" 2>&1 || fail "grouped_check --bench FAIL"
    timeout "$T" python3 scripts/peer_grouped_gemm.py >"$LOG/grouped-peer.txt" 2>&1 || fail "peer_grouped_gemm.py FAIL"
    cp "$LOG/prefill-bench.txt" "$LOG/prefill-sdpa.txt" "$LOG/prefill-peer-sum.txt" "$LOG/grouped-bench.txt" "$LOG/grouped-peer.txt" "$FINAL/" 2>/dev/null
  fi
  for n in 2048 8192 32768; do
    if timeout "$T" "$G" bench "${SYN[@]}" --concurrency 1 --input-len $n --output-len 2 --requests 3 --warmup 1 \
         --profile --markdown >"$LOG/ttft-$n.md" 2>"$LOG/ttft-$n.err"; then
      note "bench TTFT $n         ok (ttft-$n.md)"
    else fail "bench TTFT $n         FAIL"; tail -5 "$LOG/ttft-$n.err"; fi
    cp "$LOG/ttft-$n.md" "$FINAL/" 2>/dev/null
  done
  # An 8k prompt arriving while 16 streams decode (chunked prefill mixed with
  # decode: at most 2,048 prefill tokens in a step that decodes, the engine's
  # --max-prefill-with-decode): its TTFT and the streams' ITL.
  if timeout "$T" "$G" bench "${SYN[@]}" --concurrency 16 --input-len 1024 --output-len 512 --requests 16 --warmup 0 \
       --arrival-len 8192 --markdown >"$LOG/arrival.md" 2>"$LOG/arrival.err"; then
    note "bench arrival 8k      ok ($(grep -m1 -o 'TTFT [0-9.]* ms' "$LOG/arrival.md"))"
  else fail "bench arrival 8k      FAIL"; tail -5 "$LOG/arrival.err"; fi
  cp "$LOG/arrival.md" "$FINAL/" 2>/dev/null
fi

echo
for f in trace-b1.txt trace-b64.txt trace-b256.txt ab.md ttft-2048.md ttft-8192.md ttft-32768.md arrival.md grid.md profile-graphs-on.md e2e.md masks-off-1.md masks-on-1.md masks-off-2.md masks-on-2.md grammar-bench.txt; do [[ -f "$LOG/$f" ]] && { echo "==== $f"; cat "$LOG/$f"; }; done
[[ -f "$LOG/prefill-bench.txt" ]] && { echo "==== prefill attention (ours, then SDPA)"; tail -12 "$LOG/prefill-bench.txt"; tail -11 "$LOG/prefill-sdpa.txt"; }
[[ -f "$LOG/attn-bench.txt" ]] && { echo "==== attention (ours, then SDPA)"; tail -45 "$LOG/attn-bench.txt"; tail -40 "$LOG/sdpa.txt"; }
echo; echo "==== gpu-perf ($(head -1 "$LOG/device.txt"))"
printf '%s\n' "${summary[@]}"
exit $status
