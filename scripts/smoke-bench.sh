#!/usr/bin/env bash
# CI smoke of `reprise-client bench`: starts reprise-sim (fast figures) and an exact-only gateway from
# REPRISE_BIN_DIR, drives a few seconds of a generated workload closed loop (with --report) and open loop
# (with --compare against the simulator), and fails if the report or its charts are missing or nothing
# was served from the cache.
#
# Usage: REPRISE_BIN_DIR=target/debug scripts/smoke-bench.sh
set -euo pipefail

bin=${REPRISE_BIN_DIR:?set REPRISE_BIN_DIR to the folder with reprise, reprise-sim and reprise-client}
for b in reprise reprise-sim reprise-client; do
  [ -x "$bin/$b" ] || { echo "smoke-bench: $bin/$b is missing (cargo build --workspace --bins)" >&2; exit 1; }
done
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A port nobody listens on (bash's /dev/tcp connects only when something does).
free_port() {
  local p
  for p in $(shuf -i 20000-60000 -n 64); do
    if ! (echo >/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  echo "smoke-bench: no free port found" >&2
  return 1
}

wait_for() {
  for _ in $(seq 1 200); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "smoke-bench: not ready: $1" >&2
  exit 1
}

sim_port=$(free_port)
"$bin/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 20 --itl-ms 1 --tokens 16 >"$work/sim.log" 2>&1 &
pids+=($!)
wait_for http://127.0.0.1:"$sim_port"/healthz
gw_port=$(free_port)
"$bin/reprise" serve --listen 127.0.0.1:"$gw_port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
  --data-dir "$work/data" --semantic false >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_for http://127.0.0.1:"$gw_port"/healthz

echo "==> bench, closed loop, generated workload, --report" >&2
# The gateway root without /v1: bench appends it.
"$bin/reprise-client" bench --url http://127.0.0.1:"$gw_port" --generate --repeat-share 0.5 \
  --paraphrase-share 0.1 --duration 3 --concurrency 4 --warmup 2 --quiet --json \
  --report "$work/report" >"$work/closed.json"
for f in report.md report.json ttft-1.svg phases-1.svg; do
  [ -s "$work/report/$f" ] || { echo "smoke-bench: $f missing from the report" >&2; exit 1; }
done
grep -q '^<svg' "$work/report/ttft-1.svg" || { echo "smoke-bench: ttft-1.svg is not an SVG" >&2; exit 1; }
# The outcome counts come first in each target; the first "hit": N is the gateway's exact hits.
hits=$(grep -oE '"hit": [0-9]+' "$work/closed.json" | head -n1 | grep -oE '[0-9]+' || echo 0)
if [ "${hits:-0}" -eq 0 ]; then
  echo "smoke-bench: no exact hits in a workload of 50% repeats" >&2
  cat "$work/closed.json" >&2
  exit 1
fi
echo "closed loop: $hits exact hits" >&2

echo "==> bench, open loop, --compare" >&2
"$bin/reprise-client" bench --url http://127.0.0.1:"$gw_port"/v1 --compare http://127.0.0.1:"$sim_port"/v1 \
  --generate --repeat-share 0.5 --paraphrase-share 0.1 --rate 40 --duration 2 --warmup 0 --quiet \
  >"$work/open.txt"
grep -q '^open loop: 80 arrivals scheduled' "$work/open.txt" || { cat "$work/open.txt" >&2; exit 1; }
grep -q '^ratios \[2\] / \[1\]' "$work/open.txt" || { cat "$work/open.txt" >&2; exit 1; }
echo "smoke-bench: ok" >&2
