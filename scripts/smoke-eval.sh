#!/usr/bin/env bash
# CI smoke of `reprise-client eval`: starts reprise-sim and a gateway from REPRISE_BIN_DIR (default
# target/debug) with the provisioned model (REPRISE_MODELS_DIR, default ./models), evaluates the
# hand-made pairs in client/tests/fixtures/eval-pairs.jsonl, and fails unless some pair was served,
# the order-number trap (fixture-07) was refused by the numbers guard, and the report (eval.md,
# threshold-curve.svg, results.jsonl) was written.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${REPRISE_BIN_DIR:-target/debug}
MODELS=${REPRISE_MODELS_DIR:-./models}
. scripts/lib-eval.sh
start_stack

report="$WORK/report"
"$BIN/reprise-client" eval --url "$GATEWAY_URL" --pairs client/tests/fixtures/eval-pairs.jsonl \
  --concurrency 4 --title "Smoke: hand-made fixture" --report "$report"

for f in eval.md threshold-curve.svg results.jsonl; do
  [ -s "$report/$f" ] || { echo "smoke-eval: the report has no $f" >&2; exit 1; }
done
pairs=$(grep -c . client/tests/fixtures/eval-pairs.jsonl)
[ "$(grep -c . "$report/results.jsonl")" -eq "$pairs" ] \
  || { echo "smoke-eval: results.jsonl does not hold one line per pair" >&2; exit 1; }
grep -q '"served":true' "$report/results.jsonl" \
  || { echo "smoke-eval: no pair was served from the cache" >&2; exit 1; }
grep '"id":"fixture-07"' "$report/results.jsonl" | grep -q '"guard":"numbers"' \
  || { echo "smoke-eval: the numbers guard did not refuse order 55120 for order 55210" >&2; exit 1; }
echo "smoke-eval: ok ($pairs pairs, $(grep -c '"served":true' "$report/results.jsonl") served)"
