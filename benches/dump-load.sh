#!/usr/bin/env bash
# A gateway started on a data dir with an index dump, for one or more `reprise` binaries in turn per
# round (issue 22): seconds until its full index, the dump's load as its log says, its memory once
# loaded (resident, anonymous and file-backed: a loaded graph's vectors may be mapped from the
# dump), and the search phase and semantic-hit TTFT of 90 streamed paraphrase lookups at concurrency 1,
# then of 90 more at concurrency 8 (30 fow-style
# pairs of benches/workloads/paraphrases.txt, three rounds, in the `support` namespace, the big
# partition of `benches/scale.sh --gateway --keep-data`'s data dirs, with no API key as its
# entries were stored; before 2026-12-06 the driver's default key kept them in a partition of
# their own). Each gateway is stopped with
# SIGTERM, which saves the dump again since the pairs changed the index. DATA_DIR keeps the 30
# answers the pairs store.
#
# Usage: benches/dump-load.sh DATA_DIR [--rounds 2] BIN [BIN...]
#   BIN: a `reprise` binary (for example target/release/reprise, or a copy of an older build's).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: benches/dump-load.sh DATA_DIR [--rounds N] BIN [BIN...]" >&2; exit 2; }
data=${1%/}
shift
rounds=2
bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    -*) echo "dump-load: unknown argument: $1" >&2; exit 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ -f "$data/index/manifest.json" ] || { echo "$data: no index dump (index/manifest.json)" >&2; exit 2; }
for bin in "${bins[@]}"; do
  [ -x "$bin" ] || { echo "$bin: not an executable" >&2; exit 2; }
done
release=${CARGO_TARGET_DIR:-target}/release
for tool in reprise-sim reprise-client; do
  [ -x "$release/$tool" ] || { echo "$release/$tool: missing (cargo build --release)" >&2; exit 2; }
done

. scripts/lib-procs.sh
paraphrase_pairs "$WORK/pairs.jsonl"
sim_port=$(free_port)
"$release/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 50 --itl-ms 2 --tokens 32 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$sim_port/healthz" reprise-sim "$WORK/sim.log"
port=$(free_port)
token=dump-load

echo "| round | binary | full index | dump loaded | RSS | anonymous | file-backed | search p50 / p90 / p99 | semantic hits | hit TTFT p50, c=1 / c=8 |"
echo "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for bin in "${bins[@]}"; do
    log="$WORK/gateway-$round.log"
    started=$(date +%s.%N)
    REPRISE_ADMIN_TOKEN=$token RUST_LOG=reprise_server=info "$bin" serve --listen 127.0.0.1:"$port" \
      --upstream-url http://127.0.0.1:"$sim_port"/v1 --data-dir "$data" "${SCALE_FLAGS[@]}" >"$log" 2>&1 &
    gateway=$!
    PIDS+=("$gateway")
    for _ in $(seq 1 6000); do
      grep -q "vector index loaded\|rebuilding the vector index" "$log" && break
      kill -0 "$gateway" 2>/dev/null || { tail -n 20 "$log" >&2; exit 1; }
      sleep 0.1
    done
    indexed=$(python3 -c "import time; print(f'{time.time() - $started:.1f} s')")
    loaded=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'vector index loaded from its dump.* ms=[0-9]*' | grep -o 'ms=[0-9]*' || echo "rebuilt")
    # Let the allocator return what the load freed before the memory is read.
    sleep 15
    for c in 1 8; do
      REPRISE_ADMIN_TOKEN=$token "$release/reprise-client" bench --url http://127.0.0.1:"$port"/v1 \
        --pairs "$WORK/pairs.jsonl" --api-key "" --namespace support --rounds 3 --concurrency $c \
        --samples "$WORK/samples-$c.jsonl" -q --json >/dev/null
    done
    memory=$(awk '/^(VmRSS|RssAnon|RssFile):/ {printf "%.2f GB | ", $2 * 1024 / 1e9}' /proc/"$gateway"/status)
    search=$(python3 - "$WORK/samples-1.jsonl" "$WORK/samples-8.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = sorted(r["phases"]["search_ms"] for r in rows if (r.get("phases") or {}).get("search_ms") is not None)
q = lambda s, p: s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")
hits = sum(r["outcome"] == "semantic-hit" for r in rows)
def ttft(path):
    return q(sorted(r["ttft_ms"] for r in map(json.loads, open(path)) if r["outcome"] == "semantic-hit"), .5)
print(f"{q(s, .5):.2f} / {q(s, .9):.2f} / {q(s, .99):.2f} ms | {hits} of {len(rows)} | {ttft(sys.argv[1]):.2f} / {ttft(sys.argv[2]):.2f} ms")
PY
)
    kill -TERM "$gateway"
    wait "$gateway" 2>/dev/null || true
    echo "| $round | $bin | $indexed | ${loaded#ms=} ms | ${memory}$search |"
  done
done
