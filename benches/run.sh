#!/usr/bin/env bash
# End-to-end benchmark scenarios: release builds of reprise-sim and the gateway, measured with
# `reprise-client bench` side by side in one run; writes benches/results/<date>.md.
#
# Usage: benches/run.sh [--requests N]   (N: requests per target in the overhead scenarios, default 500)
# The mixed-workload scenario also writes benches/results/<date>-mixed/ (report.md and SVG charts).
set -euo pipefail
cd "$(dirname "$0")/.."

requests=500
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

# The semantic scenarios need the embedding model (a no-op when it is already provisioned).
scripts/provision-models.sh >&2
echo "==> release build" >&2
cargo build --release --bins --quiet
bin=$(scripts/target-dir.sh)/release
. scripts/lib-procs.sh

# start_pair NAME SIM_PORT GW_PORT SEMANTIC SIM_FLAGS...: a simulator and a gateway in front of it.
start_pair() {
  local name=$1 sim_port=$2 gw_port=$3 semantic=$4
  shift 4
  "$bin/reprise-sim" --listen 127.0.0.1:"$sim_port" "$@" >/dev/null 2>&1 &
  PIDS+=($!)
  "$bin/reprise" serve --listen 127.0.0.1:"$gw_port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$WORK/$name" --semantic "$semantic" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_ready http://127.0.0.1:"$sim_port"/healthz "$name simulator" "" 200
  wait_ready http://127.0.0.1:"$gw_port"/healthz "$name gateway" "" 200
  # A gateway that could not load the model serves exact-only: its numbers would be mislabelled.
  if [ "$semantic" = true ] && ! curl -sf http://127.0.0.1:"$gw_port"/healthz | grep -q '"mode":"semantic"'; then
    echo "the $name gateway runs without semantic matching (model missing?): $(curl -sf http://127.0.0.1:"$gw_port"/healthz)" >&2
    exit 1
  fi
}

# A fixed TTFT with no jitter: whatever differs between direct and gateway is the gateway.
# Exact-only (no embedding on misses) and with semantic matching on, each with its own simulator.
start_pair fixed 19090 19080 false --ttft-ms 50 --itl-ms 2 --tokens 32
start_pair fixed-semantic 19092 19082 true --ttft-ms 50 --itl-ms 2 --tokens 32
# The cloud-GPU profile (~400 ms TTFT, ~120 tok/s, prefill by prompt length) with 10% jitter.
start_pair cloud 19091 19081 true --profile cloud-gpu --jitter 0.1

bench() { "$bin/reprise-client" bench "$@" 2>/dev/null; }
fixed_gw=http://127.0.0.1:19080/v1
fixed_sim=http://127.0.0.1:19090/v1
semantic_gw=http://127.0.0.1:19082/v1
semantic_sim=http://127.0.0.1:19092/v1
cloud_gw=http://127.0.0.1:19081/v1
cloud_sim=http://127.0.0.1:19091/v1

mkdir -p benches/results
day=$(date -u +%Y-%m-%d)
out=benches/results/$day.md
mixed_dir=benches/results/$day-mixed
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Reprise benchmark results, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Machine: $(nproc) cores ($cpu), $(free -g | awk '/Mem:/{print $2}') GiB RAM. Release builds; client,"
  echo "gateway and simulator share the machine and talk over loopback. Times in ms, client-side."
  echo
  echo "## 1. Miss overhead: gateway vs direct upstream"
  echo
  echo "Upstream: reprise-sim --ttft-ms 50 --itl-ms 2 --tokens 32 (no jitter). Every prompt is new (all"
  echo "misses) and is sent to both URLs back to back, in alternating order; the paired difference is the"
  echo "time to first token the gateway adds. This gateway runs exact-only (--semantic false): section 1b"
  echo "shows what embedding the prompt adds to a miss when semantic matching is on."
  for mode in stream no-stream; do
    for c in 1 8; do
      flags=(--requests "$requests" --concurrency "$c" --warmup 20)
      [ "$mode" = no-stream ] && flags+=(--no-stream)
      echo
      echo "### $mode, concurrency $c, $requests requests each"
      echo
      echo '```'
      bench --url "$fixed_gw" --compare "$fixed_sim" "${flags[@]}"
      echo '```'
    done
  done
  echo
  echo "## 1b. Miss overhead with semantic matching on (the prompt is embedded before going upstream)"
  echo
  echo '```'
  bench --url "$semantic_gw" --compare "$semantic_sim" --requests "$requests" --concurrency 1 --warmup 20
  echo '```'
  echo
  echo "## 2. Exact-hit TTFT vs miss TTFT (cloud-GPU profile)"
  echo
  echo "Upstream: reprise-sim --profile cloud-gpu --jitter 0.1. 60 distinct prompts sent twice (concurrency 2):"
  echo "the first pass misses, the second is served from the cache."
  for mode in stream no-stream; do
    flags=(--unique-prompts 60 --requests 120 --concurrency 2 --warmup 0)
    [ "$mode" = no-stream ] && flags+=(--no-stream --model sim-model-nostream)
    echo
    echo "### $mode"
    echo
    echo '```'
    bench --url "$cloud_gw" "${flags[@]}"
    echo '```'
  done
  echo
  echo "## 3. Semantic-hit TTFT vs miss TTFT (cloud-GPU profile)"
  echo
  echo "benches/workloads/paraphrases.txt: 30 questions (misses), then a paraphrase of each, concurrency 1."
  echo "A paraphrase that scores below the 0.90 threshold is a miss and is counted as one."
  echo
  echo '```'
  bench --url "$cloud_gw" --prompts-file benches/workloads/paraphrases.txt --requests 60 --concurrency 1 \
    --warmup 0 --model sim-model-semantic
  echo '```'
  echo
  echo "## 4. Exact-hit throughput"
  echo
  echo "50 prompts cached first (warm-up), then 4,000 requests that all hit, closed loop."
  for mode in stream no-stream; do
    for c in 1 8 32; do
      flags=(--unique-prompts 50 --warmup 50 --requests 4000 --concurrency "$c" --model "hits-$mode")
      [ "$mode" = no-stream ] && flags+=(--no-stream)
      echo
      echo "### $mode, concurrency $c"
      echo
      echo '```'
      bench --url "$fixed_gw" "${flags[@]}"
      echo '```'
    done
  done
  echo
  echo "## 5. Mixed realistic workload (cloud-GPU profile, semantic matching on)"
  echo
  echo "Generated with a fixed seed: 30% of requests repeat an earlier prompt verbatim, 20% paraphrase one"
  echo "(repeats and paraphrases pick earlier prompts by a Zipf law, s=1), the other half are new. Paraphrases"
  echo "come from the paraphrase groups of benches/workloads/bank.jsonl. Open loop: 8 arrivals per second"
  echo "for 400 requests, each sent to the gateway and directly to its simulator (--compare). The full report"
  echo "with charts (TTFT distribution by outcome, per-phase stacked bars) is in $day-mixed/report.md."
  echo
  echo '```'
  bench --url "$cloud_gw" --compare "$cloud_sim" --generate --repeat-share 0.3 --paraphrase-share 0.2 \
    --zipf-s 1.0 --rate 8 --requests 400 --warmup 0 --model sim-model-mixed --report "$mixed_dir"
  echo '```'
} | tee "$out"
echo "==> wrote $out" >&2
