#!/usr/bin/env bash
# A/B of the benchmark driver itself: builds `reprise-client` at an older revision (in a temporary git
# worktree with its own target dir) and runs it and the current one, alternating, against one
# exact-only gateway of the current tree in front of a fixed-latency reprise-sim. Exact-hit
# throughput with the flags of benches/run.sh section 4, so a change in that section's numbers can be
# told apart from a change in what the driver itself costs. Writes benches/results/<date>-driver-ab.md.
#
# Usage: benches/driver-ab.sh [--rev REV] [--reps N]   (defaults: ed5d7e5, the driver before
# workloads, open loop and gateway-timing parsing were added; 3 alternating pairs per cell)
set -euo pipefail
cd "$(dirname "$0")/.."

rev=ed5d7e5
reps=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) rev=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
echo "==> release build of the current tree" >&2
cargo build --release --bins --quiet
release=$(scripts/target-dir.sh)/release
new=$release/reprise-client

echo "==> reprise-client at $rev (a worktree in $WORK)" >&2
git worktree add --quiet --detach "$WORK/old" "$rev"
remove_worktree() { git worktree remove --force "$WORK/old" 2>/dev/null || true; procs_cleanup; }
trap remove_worktree EXIT
(cd "$WORK/old" && CARGO_TARGET_DIR="$WORK/target" CARGO_INCREMENTAL=0 \
  cargo build --release --quiet -p reprise-client --bin reprise-client)
old="$WORK/target/release/reprise-client"

sim_port=$(free_port)
gw_port=$(free_port)
"$release"/reprise-sim --listen 127.0.0.1:"$sim_port" --ttft-ms 50 --itl-ms 2 --tokens 32 \
  >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
"$release"/reprise serve --listen 127.0.0.1:"$gw_port" \
  --upstream-url http://127.0.0.1:"$sim_port"/v1 --data-dir "$WORK/data" --semantic false \
  >"$WORK/gateway.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"
wait_ready http://127.0.0.1:"$gw_port"/healthz gateway "$WORK/gateway.log"

# rps BIN MODE C: exact-hit requests per second of one run (both drivers print it in --json).
rps() {
  local flags=(--url http://127.0.0.1:"$gw_port"/v1 --unique-prompts 50 --warmup 50 --requests 4000
    --concurrency "$3" --model "ab-$2" --json)
  [ "$2" = no-stream ] && flags+=(--no-stream)
  "$1" bench "${flags[@]}" 2>/dev/null \
    | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["targets"][0]["requests_per_s"], 1))'
}

day=$(date -u +%Y-%m-%d)
out=benches/results/$day-driver-ab.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Benchmark driver A/B, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "\`benches/driver-ab.sh --rev $rev --reps $reps\` on $(nproc) cores ($cpu). One exact-only gateway"
  echo "(current tree, release) in front of \`reprise-sim --ttft-ms 50 --itl-ms 2 --tokens 32\`; 50 prompts"
  echo "cached, then 4,000 requests that all hit, closed loop. The drivers alternate (old first in odd"
  echo "pairs, new first in even ones), so drift on a shared machine falls on both. Exact hits per second."
  echo
  echo "| mode | concurrency | $rev driver, each run | current driver, each run | current / old (means) |"
  echo "|---|---:|---|---|---:|"
  for mode in stream no-stream; do
    for c in 1 8; do
      olds=()
      news=()
      for i in $(seq 1 "$reps"); do
        if [ $((i % 2)) = 1 ]; then
          olds+=("$(rps "$old" "$mode" "$c")")
          news+=("$(rps "$new" "$mode" "$c")")
        else
          news+=("$(rps "$new" "$mode" "$c")")
          olds+=("$(rps "$old" "$mode" "$c")")
        fi
      done
      ratio=$(python3 -c 'import sys; o, n = (list(map(float, a.split())) for a in sys.argv[1:]); print(f"{(sum(n) / len(n)) / (sum(o) / len(o)):.2f}")' "${olds[*]}" "${news[*]}")
      echo "| $mode | $c | ${olds[*]} | ${news[*]} | $ratio |"
    done
  done
} | tee "$out"
echo "==> wrote $out" >&2
