#!/usr/bin/env bash
# The disk bound under churn (issue 24, point 5): a gateway with `--max-bytes` (default 5000000) in
# front of reprise-sim is sent unique streamed prompts whose answers are 1,500 tokens (`x-sim-tokens`),
# 8 at a time, while the data dir is measured with `du` every 100 ms and the store's accounted bytes
# (the ledger, `reprise_store_bytes` from /metrics) are read alongside. Prints the peak and end of
# both, the stated bound (6 × max_bytes + 40 MiB), and how many rebuilds the gateway logged.
#
# Usage: benches/disk-bound.sh --bin DIR [--requests N] [--max-bytes B] [--tokens T] [--concurrency C]
#   DIR holds `reprise` and `reprise-sim` (e.g. target/release, or an older build's).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=
requests=3000
max_bytes=5000000
tokens=1500
concurrency=8
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] && [ -x "$bin/reprise" ] && [ -x "$bin/reprise-sim" ] || {
  echo "usage: $0 --bin DIR (holding reprise and reprise-sim)" >&2
  exit 2
}

. scripts/lib-procs.sh
token=disk-bound-admin
sim_port=$(free_port)
gw_port=$(free_port)
"$bin/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 5 --itl-ms 0 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
RUST_LOG=info "$bin/reprise" serve --listen 127.0.0.1:"$gw_port" \
  --upstream-url http://127.0.0.1:"$sim_port"/v1 --data-dir "$WORK/data" --semantic false \
  --max-bytes "$max_bytes" --admin-token "$token" >"$WORK/gateway.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"
wait_ready http://127.0.0.1:"$gw_port"/healthz gateway "$WORK/gateway.log"

# The sampler: one line per 100 ms, "<du bytes> <ledger bytes> <entries>".
sample() {
  while [ ! -e "$WORK/stop" ]; do
    local du ledger entries
    # Files a rebuild moves meanwhile may vanish under du: what it could count still counts.
    du=$(du -sB1 "$WORK/data" 2>/dev/null | cut -f1 || true)
    read -r ledger entries < <(curl -sf -H "authorization: Bearer $token" \
      http://127.0.0.1:"$gw_port"/metrics 2>/dev/null \
      | awk '/^reprise_store_bytes /{b=$2} /^reprise_cache_entries /{e=$2} END{print b+0, e+0}') || true
    echo "${du:-0} ${ledger:-0} ${entries:-0}" >>"$WORK/samples"
    sleep 0.1
  done
}
sample &
sampler=$!
PIDS+=($sampler)

# One streamed request per prompt, unique prompts, $concurrency at a time.
ask() {
  curl -sf -o /dev/null --max-time 120 http://127.0.0.1:"$gw_port"/v1/chat/completions \
    -H 'content-type: application/json' -H "x-sim-tokens: $tokens" \
    -d "{\"model\":\"sim-1\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"disk bound churn $1 $RANDOM\"}]}" \
    || echo "request $1 failed" >&2
}
export -f ask
export gw_port tokens
start=$(date +%s)
seq 1 "$requests" | xargs -P "$concurrency" -I{} bash -c 'ask {}'
# The writer stores answers after they are sent: let it finish before the last samples.
sleep 3
touch "$WORK/stop"
wait "$sampler" 2>/dev/null || true
elapsed=$(( $(date +%s) - start ))

python3 - "$WORK/samples" "$max_bytes" "$requests" "$elapsed" \
  "$(grep -c 'rebuilt the cache store' "$WORK/gateway.log" || true)" <<'EOF'
import sys
path, max_bytes, requests, elapsed, rebuilds = sys.argv[1:]
max_bytes = int(max_bytes)
rows = [tuple(int(float(x)) for x in line.split()) for line in open(path) if line.strip()]
du = [r[0] for r in rows]
ledger = [r[1] for r in rows]
entries = [r[2] for r in rows]
bound = 6 * max_bytes + 40 * 2**20
mb = lambda b: f"{b / 1e6:.2f} MB"
print(f"requests {requests} in {elapsed} s, max_bytes {max_bytes}, {len(rows)} samples (every 100 ms)")
print(f"data dir: peak {mb(max(du))}, end {mb(du[-1])}; stated bound {mb(bound)}: "
      + ("within" if max(du) <= bound else "EXCEEDED"))
print(f"ledger:   peak {mb(max(ledger))} ({max(entries)} entries), end {mb(ledger[-1])} ({entries[-1]} entries); "
      + ("within max_bytes" if max(ledger) <= max_bytes else "OVER max_bytes"))
print(f"rebuilds: {rebuilds}")
EOF
