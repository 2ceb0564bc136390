#!/usr/bin/env bash
# A/B of the exact-hit path: the gateway built at an older revision against the current tree's, both
# exact-only, in front of one fixed-latency reprise-sim, measured alternately by the current
# driver in one run, so drift on a shared machine falls on both. Exact-hit throughput with the flags
# of benches/run.sh section 4. Writes benches/results/<date>-hit-ab.md.
#
# Usage: benches/hit-ab.sh [--rev REV] [--old-bin PATH] [--reps N] [--tokens N] [--concurrency "1 8"]
# Defaults: f5ff63a (store schema v2: a hit decoded the whole entry from JSON), 3 alternating pairs
# per cell, 32-token answers, concurrency 8. --old-bin skips building REV and uses that gateway
# binary (it must be a build of REV). Beside hits per second, each run reports the gateway's own CPU
# time per 1,000 hits (user + system, from /proc): what a hit costs, which a busy machine's other
# work changes far less than it changes throughput.
set -euo pipefail
cd "$(dirname "$0")/.."

rev=f5ff63a
old_bin=
reps=3
tokens=32
concurrency=8
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) rev=$2; shift 2 ;;
    --old-bin) old_bin=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
target=${CARGO_TARGET_DIR:-target}
echo "==> release build of the current tree" >&2
cargo build --release --bins --quiet
new="$target/release/reprise"
driver="$target/release/reprise-client"
sim="$target/release/reprise-sim"

if [ -z "$old_bin" ]; then
  echo "==> the gateway at $rev (a worktree in $WORK)" >&2
  git worktree add --quiet --detach "$WORK/old" "$rev"
  remove_worktree() { git worktree remove --force "$WORK/old" 2>/dev/null || true; procs_cleanup; }
  trap remove_worktree EXIT
  (cd "$WORK/old" && CARGO_TARGET_DIR="$WORK/target" CARGO_INCREMENTAL=0 \
    cargo build --release --quiet -p reprise-server --bin reprise)
  old_bin="$WORK/target/release/reprise"
fi

sim_port=$(free_port)
old_port=$(free_port)
new_port=$(free_port)
"$sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 50 --itl-ms 2 --tokens "$tokens" \
  >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"
declare -A gateway_pid
for side in old new; do
  bin=$new port=$new_port
  [ "$side" = old ] && bin=$old_bin port=$old_port
  "$bin" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$WORK/data-$side" --semantic false >"$WORK/gateway-$side.log" 2>&1 &
  PIDS+=($!)
  gateway_pid[$port]=$!
  wait_ready http://127.0.0.1:"$port"/healthz "gateway ($side)" "$WORK/gateway-$side.log"
done

# cpu_ticks PID: the process's user + system CPU time so far, in clock ticks.
cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat"
}

# rps PORT MODE C: exact-hit requests per second of one run (50 prompts cached by the warm-up),
# and the gateway's CPU milliseconds per 1,000 of them, as "rps/cpu".
rps() {
  local flags=(--url http://127.0.0.1:"$1"/v1 --unique-prompts 50 --warmup 50 --requests 4000
    --concurrency "$3" --model "ab-$2" --json)
  [ "$2" = no-stream ] && flags+=(--no-stream)
  local pid=${gateway_pid[$1]} before after rate
  before=$(cpu_ticks "$pid")
  rate=$("$driver" bench "${flags[@]}" 2>/dev/null \
    | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["targets"][0]["requests_per_s"], 1))')
  after=$(cpu_ticks "$pid")
  # The warm-up's 50 requests are in the ticks too: 4,050 requests in all.
  python3 -c 'import os, sys; r, b, a = sys.argv[1:]; hz = os.sysconf("SC_CLK_TCK"); print(f"{r}/{(int(a) - int(b)) * 1000 / hz / 4.05:.1f}")' "$rate" "$before" "$after"
}

day=$(date -u +%Y-%m-%d)
out=benches/results/$day-hit-ab.md
[ "$tokens" != 32 ] && out=benches/results/$day-hit-ab-${tokens}tok.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Exact-hit path A/B, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "\`benches/hit-ab.sh --rev $rev --reps $reps --tokens $tokens\` on $(nproc) cores ($cpu). Two exact-only"
  echo "gateways (release), the one at $rev and the current tree, in front of one"
  echo "\`reprise-sim --ttft-ms 50 --itl-ms 2 --tokens $tokens\`; the current driver (\`reprise-client bench\`,"
  echo "50 prompts cached, then 4,000 requests that all hit, closed loop) measures them in turn (old"
  echo "first in odd pairs, new first in even ones), so drift on a shared machine falls on both."
  echo "Each run: exact hits per second / the gateway's CPU ms per 1,000 hits (user + system, /proc);"
  echo "the driver runs on the same cores. Ratios are of the means."
  echo
  echo "| mode | concurrency | $rev gateway, each run | current gateway, each run | hits/s current / old | CPU per hit current / old |"
  echo "|---|---:|---|---|---:|---:|"
  for mode in stream no-stream; do
    for c in $concurrency; do
      olds=()
      news=()
      for i in $(seq 1 "$reps"); do
        if [ $((i % 2)) = 1 ]; then
          olds+=("$(rps "$old_port" "$mode" "$c")")
          news+=("$(rps "$new_port" "$mode" "$c")")
        else
          news+=("$(rps "$new_port" "$mode" "$c")")
          olds+=("$(rps "$old_port" "$mode" "$c")")
        fi
      done
      ratios=$(python3 -c '
import sys
o, n = ([tuple(map(float, run.split("/"))) for run in a.split()] for a in sys.argv[1:])
mean = lambda runs, k: sum(r[k] for r in runs) / len(runs)
print(f"{mean(n, 0) / mean(o, 0):.2f} | {mean(n, 1) / mean(o, 1):.2f}")' "${olds[*]}" "${news[*]}")
      echo "| $mode | $c | ${olds[*]} | ${news[*]} | $ratios |"
    done
  done
} | tee "$out"
echo "==> wrote $out" >&2
