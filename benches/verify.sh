#!/usr/bin/env bash
# The verify stage over replayed paraphrases (issue 19, point 5): `reprise-client bench --pairs` on
# the fow-cache dev set (pairs.jsonl; installed into .venv as scripts/eval.sh does, never copied
# into the repository) through two gateways side by side in one run, in front of one reprise-sim
# that answers both the chat completions (TTFT --ttft-ms with --jitter) and the judge calls (from
# the same labels at --accuracy, after --judge-latency-ms):
#   (a) async: `--verify judge --verify-mode async` against a gateway without verify. Every `a` is
#       stored, every `b` asked --rounds times with `Cache-Control: no-store` (so a later `b` can only
#       be served from an `a`): promotion per round, and misses' TTFT against the plain gateway's.
#   (b) sync with the error budget: `--verify judge --max-wrong W` against a gateway without verify,
#       once per W given: judge calls per lookup per round (and per slice of each round), and the
#       wrong answers served.
# Both gateways of a part are fresh (their own data dir), so each part starts from no verdicts.
# Judge calls are not rate-limited (`--judge-rate 0`) and embedding waits are raised as in the eval,
# so that neither a rate budget nor an embedding fallback is what gets measured.
# Writes benches/results/<date>-verify.md.
#
# Usage: benches/verify.sh [--rounds N] [--concurrency C] [--accuracy P] [--max-wrong "W ..."]
#                          [--ttft-ms MS] [--jitter J] [--judge-latency-ms MS] [--segments N] [--check]
#   Defaults: 3 rounds, concurrency 8, accuracy 0.95, max-wrong "0.05 0.25" (the second one loose
#   enough for the budget to clear on this set, to show what it trades), TTFT 300 ms +-33% (200-400),
#   judge 150 ms, 3 slices per round in (b). Release binaries from ${CARGO_TARGET_DIR:-target}.
#   --check tests the script itself: debug builds, every tenth pair, two rounds, the report written
#   to target/verify-check/ instead of benches/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

rounds=3
concurrency=8
accuracy=0.95
max_wrong="0.05 0.25"
ttft_ms=300
jitter=0.33
judge_latency_ms=150
segments=3
check=false
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --accuracy) accuracy=$2; shift 2 ;;
    --max-wrong) max_wrong=$2; shift 2 ;;
    --ttft-ms) ttft_ms=$2; shift 2 ;;
    --jitter) jitter=$2; shift 2 ;;
    --judge-latency-ms) judge_latency_ms=$2; shift 2 ;;
    --segments) segments=$2; shift 2 ;;
    --check) check=true; shift ;;
    *) echo "verify: unknown argument: $1" >&2; exit 2 ;;
  esac
done

scripts/python-env.sh
echo "==> fow-cache dev set (pinned version and sha256)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
  -r scripts/eval-requirements.txt
fow_version=$(.venv/bin/python -c 'from importlib.metadata import version; print(version("fow-cache"))')
data=$(.venv/bin/python -c 'from importlib import resources; print(resources.files("fow_cache") / "data")')
[ -f "$data/pairs.jsonl" ] || { echo "verify: no pairs.jsonl in $data" >&2; exit 1; }
scripts/provision-models.sh >&2

profile=release results=benches/results
if $check; then
  profile=debug results=target/verify-check
  rounds=2
fi
echo "==> $profile build" >&2
cargo build "--profile=$([ "$profile" = debug ] && echo dev || echo release)" --quiet \
  -p reprise-server -p reprise-sim -p reprise-client --bin reprise --bin reprise-sim --bin reprise-client
target_dir=${CARGO_TARGET_DIR:-target}
BIN=$(cd "$target_dir/$profile" && pwd)
MODELS=$(cd "${REPRISE_MODELS_DIR:-./models}" && pwd)
. scripts/lib-procs.sh
pairs=$data/pairs.jsonl
if $check; then
  awk 'NR % 10 == 1' "$pairs" >"$WORK/pairs.jsonl"
  pairs=$WORK/pairs.jsonl
fi

sim_port=$(free_port)
sim_args=(--ttft-ms "$ttft_ms" --jitter "$jitter" --itl-ms 5 --tokens 16
  --judge-labels "$pairs" --judge-accuracy "$accuracy" --judge-seed 19 --judge-latency-ms "$judge_latency_ms")
"$BIN/reprise-sim" --listen "127.0.0.1:$sim_port" "${sim_args[@]}" >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$sim_port/healthz" reprise-sim "$WORK/sim.log"

# gateway NAME ARGS...: a fresh gateway in front of the sim; sets GW_URL (not a subshell, so that
# its PID reaches PIDS and it is stopped on exit).
gateway() {
  local name=$1 port
  shift
  port=$(free_port)
  "$BIN/reprise" serve --listen "127.0.0.1:$port" \
    --upstream-url "http://127.0.0.1:$sim_port/v1" \
    --data-dir "$WORK/data-$name" \
    --model-dir "$MODELS/all-MiniLM-L6-v2" \
    --ort-lib "$MODELS/onnxruntime/libonnxruntime.so" \
    --embed-deadline-ms 30000 --embed-queue-budget-ms 30000 \
    --admin-token bench "$@" >"$WORK/gateway-$name.log" 2>&1 &
  PIDS+=($!)
  wait_ready "http://127.0.0.1:$port/healthz" "gateway $name" "$WORK/gateway-$name.log" 2400
  GW_URL="http://127.0.0.1:$port"
}

judge_args=(--verify judge --judge-model sim-judge --judge-api-key sk-bench-judge --judge-rate 0)
# part NAME SEGMENTS VERIFY ARGS...: one verify gateway against one without, one bench run.
part() {
  local name=$1 segs=$2 with without
  shift 2
  gateway "$name-verify" "${judge_args[@]}" "$@"
  with=$GW_URL
  gateway "$name-plain"
  without=$GW_URL
  echo "==> part $name: [1] $with ($*), [2] $without (no verify)" >&2
  "$BIN/reprise-client" bench --url "$with" --compare "$without" --pairs "$pairs" \
    --rounds "$rounds" --segments "$segs" --concurrency "$concurrency" --admin-token bench \
    --quiet --report "$WORK/$name" >&2
  # Each gateway runs an embedding model: stop this part's two before the next part starts.
  local n=${#PIDS[@]}
  kill "${PIDS[@]:n-2}" 2>/dev/null || true
  wait "${PIDS[@]:n-2}" 2>/dev/null || true
  PIDS=("${PIDS[@]:0:n-2}")
}

part async 1 --verify-mode async
for w in $max_wrong; do
  part "sync-$w" "$segments" --verify-mode sync --max-wrong "$w"
done

mkdir -p "$results"
out=$results/$(date -u +%Y-%m-%d)-verify.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Verified semantic hits over replayed paraphrases, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "\`benches/verify.sh --rounds $rounds --concurrency $concurrency --accuracy $accuracy --max-wrong \"$max_wrong\""\
    "--ttft-ms $ttft_ms --jitter $jitter --judge-latency-ms $judge_latency_ms --segments $segments$($check && echo ' --check')\`"
  echo "($profile build) on $(nproc) cores ($cpu), load average at the end $(cut -d' ' -f1-3 /proc/loadavg);"
  echo "$(($(date +%s) - started)) s in all. Data: fow-cache $fow_version \`pairs.jsonl\`$($check && echo ', every tenth line')."
  echo
  echo "One \`reprise-sim ${sim_args[*]/#$pairs/PAIRS}\` answers both gateways and the judge calls"
  echo "(a judge call is answered from the labels, each pair's verdict flipped with probability 1 - accuracy by a"
  echo "seeded hash, so a pair is judged the same way every time; pairs it does not know are \`different\`)."
  echo "Gateways: default matching settings (threshold 0.90, verify floor 0.80, all guards), embedding waits"
  echo "raised (\`--embed-deadline-ms 30000 --embed-queue-budget-ms 30000\`), judge calls not rate-limited."
  echo "\`reprise-client bench --pairs\` stores every \`a\` (\`no-cache\`, one entry each), then asks every \`b\` once"
  echo "per round with \`Cache-Control: no-store\`, in one namespace, sending each request to [1] and [2] in turn."
  echo "A served \`b\` is attributed by \`x-reprise-entry\`: *should-hit served* counts the should-hit \`b\` answered"
  echo "from an \`a\` the labels pair it with as same (or that is the \`b\` word for word); *traps served wrong*"
  echo "the trap \`b\` answered from an \`a\` the labels pair it with as a trap; *wrong / unlabeled* all served"
  echo "answers the labels call wrong / that came from another pair's \`a\` the labels say nothing about (one"
  echo "namespace holds every \`a\`, some of them paraphrases of one another; the sim's judge calls such pairs"
  echo "\`different\`, whatever they are). Judge calls per"
  echo "lookup: the gateway's \`/admin/stats\` \`judge.calls\` over the round (async: once the background queue"
  echo "has settled), divided by the \`b\` asked. Ambiguous pairs count as traps."
  echo
  echo "## (a) async (\`--verify-mode async\`) against no verify"
  echo
  cat "$WORK/async/report.md"
  echo
  for w in $max_wrong; do
    echo
    echo "## (b) sync with the error budget (\`--verify-mode sync --max-wrong $w\`) against no verify"
    echo
    cat "$WORK/sync-$w/report.md"
  done
} >"$out"
echo "==> wrote $out" >&2
