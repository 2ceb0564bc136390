#!/usr/bin/env bash
# Match quality on the public fow-cache dev set, end to end: installs the pinned package into .venv,
# provisions the embedding model, builds release binaries, starts reprise-sim and a gateway (default
# matching settings) on free ports with a temporary data dir, runs `reprise-client eval` on the
# single questions (pairs.jsonl) and on the conversations (conv-parts/, conv-long/), then the single
# questions again through a second gateway with the guards off (`--semantic-guards none`), and once
# more for each guard with only that guard off, so what each guard buys and costs is measured in the
# same run (scripts/eval-guards.py tabulates it, with every guard's refusals per category). Then the
# single questions through gateways with a sync verify stage (`--verify judge`, default floor) whose
# judge is reprise-sim answering from the same labels at accuracy 0.90, 0.95 and 0.98, one stack per
# accuracy (scripts/eval-verify.py tabulates them against no verifier). Writes
# benches/results/eval-<date>.md with one threshold curve per set beside it. Nothing of the data set
# is copied into the repository.
#
# Usage: scripts/eval.sh [--concurrency N] [--judge-latency-ms MS] [--judge-accuracies "A B ..."]
#                       [--debug | --check]
#   (defaults 8; 0: the simulated judge answers at once, so the added TTFT is the gateway's own cost
#   of a judge call; "0.90 0.95 0.98"). --debug: debug builds (shares served are the release
#   build's, times are not), the report written to target/eval-check/ instead of benches/results/.
#   --check tests the script itself: --debug on every tenth pair of each file (a temporary copy).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

concurrency=8
judge_latency_ms=0
judge_accuracies="0.90 0.95 0.98"
check=false
debug=false
while [ $# -gt 0 ]; do
  case "$1" in
    --concurrency) concurrency=$2; shift 2 ;;
    --judge-latency-ms) judge_latency_ms=$2; shift 2 ;;
    --judge-accuracies) judge_accuracies=$2; shift 2 ;;
    --check) check=true; debug=true; shift ;;
    --debug) debug=true; shift ;;
    *) echo "eval: unknown argument: $1" >&2; exit 2 ;;
  esac
done

scripts/python-env.sh
echo "==> fow-cache dev set (pinned version and sha256)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
  -r scripts/eval-requirements.txt
fow_version=$(.venv/bin/python -c 'from importlib.metadata import version; print(version("fow-cache"))')
data=$(.venv/bin/python -c 'from importlib import resources; print(resources.files("fow_cache") / "data")')
[ -f "$data/pairs.jsonl" ] || { echo "eval: no pairs.jsonl in $data" >&2; exit 1; }

echo "==> embedding model (skipped when present)" >&2
scripts/provision-models.sh >&2

profile=release results=benches/results
if $debug; then
  profile=debug results=target/eval-check
fi
echo "==> $profile build" >&2
cargo build "--profile=$([ "$profile" = debug ] && echo dev || echo release)" --quiet \
  -p reprise-server -p reprise-sim -p reprise-client --bin reprise --bin reprise-sim --bin reprise-client
target_dir=${CARGO_TARGET_DIR:-target}
BIN=$(cd "$target_dir/$profile" && pwd)
MODELS=$(cd "${REPRISE_MODELS_DIR:-./models}" && pwd)
. scripts/lib-eval.sh
if $check; then
  # Every tenth line of every file, so that each category still shows up; in WORK, removed on exit.
  (cd "$data" && find . -name '*.jsonl') | while read -r f; do
    mkdir -p "$WORK/sample/$(dirname "$f")"
    awk 'NR % 10 == 1' "$data/$f" >"$WORK/sample/$f"
  done
  data=$WORK/sample
fi
start_stack
default_url=$GATEWAY_URL
start_stack --semantic-guards none
unguarded_url=$GATEWAY_URL
all_guards=$(curl -fsS "$default_url/healthz" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["semantic"]["guards"])')
echo "==> gateways at $default_url (defaults) and $unguarded_url (guards off)" >&2

# run_set URL NAME TITLE FILES...: evaluates FILES (relative to the data dir, so reports name them
# briefly) through the gateway at URL into $WORK/NAME.
run_set() {
  local url=$1 name=$2 title=$3
  shift 3
  echo "==> $title" >&2
  (cd "$data" && "$BIN/reprise-client" eval --url "$url" --concurrency "$concurrency" \
    --title "$title" --report "$WORK/$name" --pairs "$@")
}
run_set "$default_url" questions "Single questions (pairs.jsonl)" pairs.jsonl
(cd "$data" && ls conv-parts/*.jsonl conv-long/*.jsonl) >"$WORK/conv-files"
mapfile -t conv_files <"$WORK/conv-files"
run_set "$default_url" conversations "Conversations (conv-parts/, conv-long/)" "${conv_files[@]}"
run_set "$unguarded_url" questions-unguarded \
  "Single questions with the guards off (comparison)" pairs.jsonl
# One gateway at a time with a single guard switched off: what that guard buys and costs.
ablations=()
for guard in ${all_guards//,/ }; do
  others=$(echo ",$all_guards," | sed "s/,$guard,/,/; s/^,//; s/,$//")
  start_stack --semantic-guards "${others:-none}"
  run_set "$GATEWAY_URL" "without-$guard" "Single questions without the $guard guard" pairs.jsonl >/dev/null
  stop_last_stack
  ablations+=("without $guard=$WORK/without-$guard")
done
ablations+=("none=$WORK/questions-unguarded")

# The verify stage, sync, with a simulated judge of stated accuracy: one simulator per accuracy, given
# the same labels the eval scores against, and a default gateway in front of it that asks it. No
# judge rate limit: at the eval's pace the default (20/s) would measure the limit, not the judge.
verify_runs=()
for accuracy in $judge_accuracies; do
  start_stack --sim-args --judge-labels "$data/pairs.jsonl" --judge-accuracy "$accuracy" \
    --judge-latency-ms "$judge_latency_ms" -- \
    --verify judge --verify-mode sync --judge-model sim-judge --judge-rate 0
  run_set "$GATEWAY_URL" "judge-$accuracy" \
    "Single questions, sync judge at accuracy $accuracy (simulated)" pairs.jsonl >/dev/null
  # The simulator's own count, to check against what the lookups reported.
  curl -fsS "$SIM_URL/stats" >"$WORK/judge-$accuracy/sim-stats.json"
  stop_last_stack
  verify_runs+=("$accuracy=$WORK/judge-$accuracy")
done

# Per-pair results hold the data set's text: kept out of the repository, in target/eval-last/.
rm -rf target/eval-last && mkdir -p target/eval-last
for dir in "$WORK"/questions* "$WORK"/conversations "$WORK"/without-* "$WORK"/judge-*; do
  [ -f "$dir/results.jsonl" ] && cp "$dir/results.jsonl" "target/eval-last/$(basename "$dir").jsonl"
done

day=$(date -u +%Y-%m-%d)
mkdir -p "$results"
out=$results/eval-$day.md
elapsed=$(( $(date +%s) - started ))
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Reprise match quality on the fow-cache dev set, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Written by \`scripts/eval.sh\` in $elapsed s (set-up, build and downloads included, as far as this"
  echo "checkout needed them) on $(nproc) cores ($cpu). Data: fow-cache $fow_version by Mabon ap Gwyn,"
  echo "CC BY 4.0, used unchanged;"
  echo "pairs marked \`ambiguous\` count as traps (fow-cache's strict default). Gateway: $profile build,"
  echo "default matching settings (all-MiniLM-L6-v2, threshold from \`/healthz\`), embedding deadline"
  echo "raised so that no request falls back to exact matching; upstream: reprise-sim answering at once."
  echo "Each pair runs in its own namespace: \`a\` is stored, then \`b\` is looked up without being stored."
  for name in questions conversations questions-unguarded; do
    echo
    sed "s|(threshold-curve.svg)|(eval-$day-$name.svg)|" "$WORK/$name/eval.md"
    cp "$WORK/$name/threshold-curve.svg" "$results/eval-$day-$name.svg"
  done
  echo
  echo "## Guards, one by one (single questions)"
  echo
  .venv/bin/python scripts/eval-guards.py "$WORK/questions" "${ablations[@]}"
  echo
  .venv/bin/python scripts/eval-verify.py --judge-latency-ms "$judge_latency_ms" \
    "$WORK/questions" "${verify_runs[@]}"
} >"$out"
echo "==> wrote $out and $results/eval-$day-{questions,conversations,questions-unguarded}.svg in $elapsed s" >&2
