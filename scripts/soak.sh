#!/usr/bin/env bash
# scripts/soak.sh — a long soak of `glmctl serve` under mixed load (docs/reliability.md, "Soak").
#
#   scripts/soak.sh [--minutes M] [--concurrency C] [--model DIR] [--port P] [--out DIR]
#                   [--backend cpu|cuda] [--rss-growth-max PCT] [-- EXTRA SERVE FLAGS...]
#
# Starts bin/glmctl serve (built with `make build` when missing), waits for /readyz, runs
# scripts/soak_load.py for M minutes with C clients (streaming and not, chat and completions,
# long prompts, client cancellations, bad requests, utility routes), waits for the server to
# drain, scrapes /metrics, stops the server with SIGTERM and checks its exit status, then prints
# the summary: requests by kind and outcome, latencies, RSS of the first and last minute, KV
# blocks in use, goroutines. Exits 1 when a request was lost or failed, a KV block is still in
# use after the drain, RSS grew more than --rss-growth-max percent (default 20), goroutines did
# not come back, or the server did not exit 0.
#
# Writes into --out (default /tmp/glmctl-soak-DATE): server.log, requests.jsonl, samples.csv
# (RSS and the KV/queue gauges every 5 s), metrics-start.txt, metrics-end.txt, run.json,
# summary.json. Python: the project venv (${GLMCTL_CACHE:-~/.cache/glmctl}/venv, `make venv`).
set -euo pipefail

cd "$(dirname "$0")/.."
minutes=10
concurrency=8
model=testdata/models/tiny-f32
port=18080
backend=cpu
out=""
rss_growth_max=20
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --rss-growth-max) rss_growth_max=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "soak: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-/tmp/glmctl-soak-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
cache=${GLMCTL_CACHE:-$HOME/.cache/glmctl}
py=$cache/venv/bin/python

[ -x bin/glmctl ] || make build
[ -x "$py" ] || make venv
url=http://127.0.0.1:$port
if curl -s -o /dev/null --max-time 2 "$url/healthz"; then
  echo "soak: something already listens on port $port; pick another with --port" >&2
  exit 2
fi

echo "soak: $(bin/glmctl version | head -1), backend $backend, model $model, port $port, out $out"
bin/glmctl serve --backend "$backend" --model "$model" --port "$port" \
  --log-format json --log-level info "${extra[@]}" >"$out/server.log" 2>&1 &
server=$!
cleanup() {
  if kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for i in $(seq 1 240); do
  if curl -sf -o /dev/null --max-time 2 "$url/readyz"; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then
    echo "soak: the server exited before it was ready:" >&2; tail -20 "$out/server.log" >&2; exit 1
  fi
  sleep 0.5
done
curl -sf -o /dev/null "$url/readyz" || { echo "soak: the server was not ready after 120 s" >&2; exit 1; }
echo "soak: server ready (pid $server)"

# The load, the drain and the last scrape.
"$py" scripts/soak_load.py run --url "$url" --pid "$server" --minutes "$minutes" \
  --concurrency "$concurrency" --out "$out"

# SIGTERM: the server drains (nothing runs by now) and must exit 0.
kill -TERM "$server"
status=""
for i in $(seq 1 120); do
  if ! kill -0 "$server" 2>/dev/null; then
    set +e; wait "$server"; status=$?; set -e
    break
  fi
  sleep 0.5
done
if [ -z "$status" ]; then
  status="still running 60 s after SIGTERM (killed)"
  kill -KILL "$server" 2>/dev/null || true
fi
echo "soak: server exit status after SIGTERM: $status"
trap - EXIT

"$py" scripts/soak_load.py report --out "$out" --exit-status "$status" --rss-growth-max "$rss_growth_max"
