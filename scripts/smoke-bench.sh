#!/usr/bin/env bash
# CI smoke of `reprise-client bench`: starts reprise-sim (fast figures) and an exact-only gateway from
# REPRISE_BIN_DIR, drives a few seconds of a generated workload closed loop (with --report), open loop
# (with --compare against the simulator) and open loop with Poisson arrivals, and fails if the report or
# its charts are missing or nothing was served from the cache.
#
# Usage: REPRISE_BIN_DIR=target/debug scripts/smoke-bench.sh
set -euo pipefail

bin=${REPRISE_BIN_DIR:?set REPRISE_BIN_DIR to the folder with reprise, reprise-sim and reprise-client}
for b in reprise reprise-sim reprise-client; do
  [ -x "$bin/$b" ] || { echo "smoke-bench: $bin/$b is missing (cargo build --workspace --bins)" >&2; exit 1; }
done
. "$(dirname "$0")/lib-procs.sh"

sim_port=$(free_port)
"$bin/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 20 --itl-ms 1 --tokens 16 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log" 200
gw_port=$(free_port)
"$bin/reprise" serve --listen 127.0.0.1:"$gw_port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
  --data-dir "$WORK/data" --semantic false >"$WORK/gateway.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$gw_port"/healthz gateway "$WORK/gateway.log" 200

echo "==> bench, closed loop, generated workload, --report" >&2
# The gateway root without /v1: bench appends it.
"$bin/reprise-client" bench --url http://127.0.0.1:"$gw_port" --generate --repeat-share 0.5 \
  --paraphrase-share 0.1 --duration 3 --concurrency 4 --warmup 2 --quiet --json \
  --report "$WORK/report" >"$WORK/closed.json"
for f in report.md report.json ttft-1.svg phases-1.svg; do
  [ -s "$WORK/report/$f" ] || { echo "smoke-bench: $f missing from the report" >&2; exit 1; }
done
grep -q '^<svg' "$WORK/report/ttft-1.svg" || { echo "smoke-bench: ttft-1.svg is not an SVG" >&2; exit 1; }
# The outcome counts come first in each target; the first "hit": N is the gateway's exact hits.
hits=$(grep -oE '"hit": [0-9]+' "$WORK/closed.json" | head -n1 | grep -oE '[0-9]+' || echo 0)
if [ "${hits:-0}" -eq 0 ]; then
  echo "smoke-bench: no exact hits in a workload of 50% repeats" >&2
  cat "$WORK/closed.json" >&2
  exit 1
fi
echo "closed loop: $hits exact hits" >&2

echo "==> bench, open loop, --compare" >&2
"$bin/reprise-client" bench --url http://127.0.0.1:"$gw_port"/v1 --compare http://127.0.0.1:"$sim_port"/v1 \
  --generate --repeat-share 0.5 --paraphrase-share 0.1 --rate 40 --duration 2 --warmup 0 --quiet \
  >"$WORK/open.txt"
grep -q '^open loop: 80 arrivals scheduled' "$WORK/open.txt" || { cat "$WORK/open.txt" >&2; exit 1; }
grep -q '^ratios \[2\] / \[1\]' "$WORK/open.txt" || { cat "$WORK/open.txt" >&2; exit 1; }

echo "==> bench, open loop, Poisson arrivals" >&2
"$bin/reprise-client" bench --url http://127.0.0.1:"$gw_port"/v1 --generate --repeat-share 0.5 \
  --rate 40 --arrivals poisson --duration 2 --warmup 0 --quiet >"$WORK/poisson.txt"
grep -q '^open loop: [0-9]* arrivals scheduled at 40/s (Poisson)' "$WORK/poisson.txt" \
  || { cat "$WORK/poisson.txt" >&2; exit 1; }
echo "smoke-bench: ok" >&2
