#!/usr/bin/env bash
# Train the bundled demo model (testdata/models/demo-go) on one GPU.
#
# Run from the repository root on a machine with one CUDA GPU and python3 with
# torch (CUDA), numpy and safetensors (transformers too, for the end-of-run
# check against Glm4MoeForCausalLM; without it that check is reported as failed
# and nothing else changes). No network is needed. The corpus must be there
# (made by scripts/demo_corpus.py on a machine with Go, then carried):
#
#   .bundle/demo-corpus.npy  .bundle/demo-corpus.json  .bundle/demo-go-tokenizer/
#
# Usage:
#   OUT=/some/dir TIME_BUDGET=480 scripts/train-demo-gpu.sh [extra train_demo_model.py flags]
#
# TIME_BUDGET is the training loop's wall time in seconds (default 480); setup,
# the final evaluation, samples and the check add about a minute. Weights are
# saved every 2 minutes as well, so a run cut short still leaves a checkpoint.
# Outputs in $OUT (default build/demo-train): demo-go-state.safetensors (~28 MB),
# model_config.json, train_log.json, samples.txt, train.log. The last lines
# printed are a summary table.
#
# Then, on a machine with the repository (and Go for the glmctl check):
#   python3 scripts/export_demo_model.py --state $OUT --out testdata/models/demo-go --glmctl bin/glmctl
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build/demo-train}
TIME_BUDGET=${TIME_BUDGET:-480}
PY=${PYTHON:-python3}

for f in .bundle/demo-corpus.npy .bundle/demo-corpus.json .bundle/demo-go-tokenizer/tokenizer.json; do
  if [ ! -f "$f" ]; then
    echo "train-demo-gpu: missing $f (run python3 scripts/demo_corpus.py and carry .bundle/)" >&2
    exit 2
  fi
done
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "train-demo-gpu: torch sees no CUDA device")'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
start=$(date +%s)
"$PY" scripts/train_demo_model.py --device cuda --out "$OUT" --time-budget "$TIME_BUDGET" "$@" 2>&1 | tee "$OUT/train.log"
echo "train-demo-gpu: done in $(( $(date +%s) - start )) s; outputs in $OUT:"
ls -l "$OUT"
