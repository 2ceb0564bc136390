#!/usr/bin/env bash
# End-to-end benchmark scenarios: release builds of reprise-sim and the gateway, measured with
# `reprise-client bench` side by side in one run; writes benches/results/<date>.md.
#
# Usage: benches/run.sh [--requests N] [--profile NAME]
set -euo pipefail
cd "$(dirname "$0")/.."

requests=500
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

echo "==> release build"
cargo build --release --bins --quiet
bin=target/release
sim_port=19090
gw_port=19080
data_dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$data_dir"
}
trap cleanup EXIT

wait_for() {
  for _ in $(seq 1 200); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "not ready: $1" >&2
  exit 1
}

# A fixed TTFT with no jitter: whatever differs between direct and gateway is the gateway.
"$bin/reprise-sim" --listen 127.0.0.1:$sim_port --ttft-ms 50 --itl-ms 2 --tokens 32 >/dev/null 2>&1 &
pids+=($!)
"$bin/reprise" serve --listen 127.0.0.1:$gw_port --upstream-url http://127.0.0.1:$sim_port/v1 \
  --data-dir "$data_dir" >/dev/null 2>&1 &
pids+=($!)
wait_for http://127.0.0.1:$sim_port/healthz
wait_for http://127.0.0.1:$gw_port/healthz

mkdir -p benches/results
out=benches/results/$(date -u +%Y-%m-%d).md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Reprise benchmark results, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Machine: $(nproc) cores ($cpu), $(free -g | awk '/Mem:/{print $2}') GiB RAM. Release builds, loopback."
  echo "Upstream: reprise-sim --ttft-ms 50 --itl-ms 2 --tokens 32 (no jitter)."
  echo
  echo "## Miss overhead: gateway vs direct upstream, streaming, concurrency 1, $requests requests each"
  echo
  echo "Each prompt is sent to both, back to back in alternating order; the paired difference is the"
  echo "gateway's added time to first token (client-side)."
  echo
  echo '```'
  "$bin/reprise-client" bench --url http://127.0.0.1:$gw_port/v1 --compare http://127.0.0.1:$sim_port/v1 \
    --requests "$requests" --concurrency 1 --warmup 20
  echo '```'
  echo
  echo "## Miss overhead, non-streaming"
  echo
  echo '```'
  "$bin/reprise-client" bench --url http://127.0.0.1:$gw_port/v1 --compare http://127.0.0.1:$sim_port/v1 \
    --requests "$requests" --concurrency 1 --warmup 20 --no-stream
  echo '```'
  echo
  echo "## Miss overhead at concurrency 8, streaming"
  echo
  echo '```'
  "$bin/reprise-client" bench --url http://127.0.0.1:$gw_port/v1 --compare http://127.0.0.1:$sim_port/v1 \
    --requests "$requests" --concurrency 8 --warmup 20
  echo '```'
} | tee "$out"
echo "==> wrote $out"
