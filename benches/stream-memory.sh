#!/usr/bin/env bash
# Memory of long streams (issue 24, point 3), two builds side by side: the gateway's resident set
# (VmRSS of /proc/PID/status) before, at its peak (VmHWM) and after streams whose clients leave
# early, as the issue reproduced it. Two cases, each on a fresh gateway and reprise-sim of the build
# (the builds alternate, which goes first swaps between cases):
#   long:  ROUNDS rounds of STREAMS concurrent TOKENS-token streams whose clients leave LEAVE s
#          after their first byte (the gateway reads on to cache the answer: complete_on_disconnect);
#   short: STREAMS concurrent SHORT-token streams read to the end.
# "after" is read once the gateway has finished every stream (its request records), the store has
# stopped growing (the writer wrote what it was given) and SETTLE s have passed.
# Writes benches/results/<date>-stream-memory.md (or --out).
#
# Usage: benches/stream-memory.sh --before DIR --after DIR [--streams 5] [--tokens 100000]
#          [--rounds 4] [--short-tokens 16000] [--leave-after-s 1] [--settle-s 15] [--out FILE]
# Each DIR holds a `reprise` and a `reprise-sim` (e.g. target/release of each revision).
set -euo pipefail
cd "$(dirname "$0")/.."

before=
after=
streams=5
tokens=100000
rounds=4
short=16000
leave=1
settle=15
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --short-tokens) short=$2; shift 2 ;;
    --leave-after-s) leave=$2; shift 2 ;;
    --settle-s) settle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
for dir in "$before" "$after"; do
  if [ -z "$dir" ] || [ ! -x "$dir/reprise" ] || [ ! -x "$dir/reprise-sim" ]; then
    echo "--before and --after must each name a folder holding reprise and reprise-sim" >&2
    exit 2
  fi
done

. scripts/lib-procs.sh

mb() { python3 -c 'import sys; print(f"{int(sys.argv[1]) / 1024:.0f}")' "$1"; }
# status_kb PID FIELD: a /proc/PID/status figure in kB (VmRSS, VmHWM).
status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# drive PORT N TOKENS LEAVE TAG: N concurrent streams of TOKENS tokens, distinct prompts (TAG),
# each client closing its connection LEAVE s after its first byte (0: it reads to the end).
drive() {
  python3 - "$@" <<'PY'
import http.client, json, sys, threading, time
port, n, tokens, leave, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
def one(i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": "sim", "stream": True,
                       "messages": [{"role": "user", "content": f"stream memory {tag} {i}"}]})
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", "x-sim-tokens": tokens, "x-sim-itl-ms": "0"})
    resp = conn.getresponse()
    first = None
    while True:
        data = resp.read1(65536)
        if not data:
            break
        first = first or time.monotonic()
        if leave > 0 and time.monotonic() - first >= leave:
            break
    conn.sock.close()
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
PY
}

# finished GW_PORT N: waits until the gateway has finished N requests (a stream's request is
# recorded when the gateway stops reading its upstream, long after its client left).
finished() {
  for _ in $(seq 1 1200); do
    local done
    done=$(curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$1"/metrics \
      | awk '/^reprise_requests_total/ { s += $2 } END { print s + 0 }')
    [ "${done:-0}" -ge "$2" ] && return 0
    sleep 0.5
  done
  echo "the gateway did not finish its streams within 10 minutes" >&2
  exit 1
}

# written GW_PORT: waits until the store stops growing (the writer thread writes each answer after
# its stream ended: what it holds meanwhile is in flight, not kept).
written() {
  local last=-1 same=0 now
  for _ in $(seq 1 600); do
    now=$(curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$1"/metrics \
      | awk '$1 == "reprise_store_bytes" { print $2 }')
    if [ "$now" = "$last" ]; then
      same=$((same + 1))
      [ "$same" -ge 3 ] && return 0
    else
      same=0
    fi
    last=$now
    sleep 1
  done
}

# measure SIDE CASE: one fresh sim and gateway of SIDE's build, one case; prints a table row.
measure() {
  local side=$1 case=$2 dir=$before
  [ "$side" = after ] && dir=$after
  local sim_port gw_port
  sim_port=$(free_port)
  gw_port=$(free_port)
  "$dir/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 0 --itl-ms 0 \
    >"$WORK/sim-$side-$case.log" 2>&1 &
  local sim_pid=$!
  PIDS+=("$sim_pid")
  wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim-$side-$case.log"
  "$dir/reprise" serve --listen 127.0.0.1:"$gw_port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$WORK/data-$side-$case" --semantic false --admin-token bench \
    >"$WORK/gateway-$side-$case.log" 2>&1 &
  local gw_pid=$!
  PIDS+=("$gw_pid")
  wait_ready http://127.0.0.1:"$gw_port"/healthz "gateway ($side)" "$WORK/gateway-$side-$case.log"
  # One short stream first, so the baseline has the connection pools and the store warmed.
  drive "$gw_port" 1 32 0 "warm-$side-$case"
  local requests=1
  finished "$gw_port" "$requests"
  sleep 2
  local base first="" last
  base=$(status_kb "$gw_pid" VmRSS)
  if [ "$case" = long ]; then
    for r in $(seq 1 "$rounds"); do
      drive "$gw_port" "$streams" "$tokens" "$leave" "$side-$case-$r"
      requests=$((requests + streams))
      finished "$gw_port" "$requests"
      written "$gw_port"
      sleep "$settle"
      last=$(status_kb "$gw_pid" VmRSS)
      [ -z "$first" ] && first=$last
    done
  else
    drive "$gw_port" "$streams" "$short" 0 "$side-$case"
    requests=$((requests + streams))
    finished "$gw_port" "$requests"
    written "$gw_port"
    sleep "$settle"
    last=$(status_kb "$gw_pid" VmRSS)
    first=$last
  fi
  local peak stored
  peak=$(status_kb "$gw_pid" VmHWM)
  stored=$(curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$gw_port"/metrics \
    | awk '$1 == "reprise_store_bytes" { printf "%.1f", $2 / 1048576 }')
  local skipped
  skipped=$(curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$gw_port"/metrics \
    | awk '/^reprise_store_skipped_total/ { s += $2 } END { print s + 0 }')
  kill "$gw_pid" "$sim_pid" 2>/dev/null || true
  wait "$gw_pid" "$sim_pid" 2>/dev/null || true
  local what="$rounds × $streams streams of $tokens tokens, clients leave after ${leave} s"
  [ "$case" = short ] && what="$streams streams of $short tokens, read whole"
  echo "| $side | $what | $(mb "$base") | $(mb "$peak") | $(mb "$first") | $(mb "$last") | ${stored:-?} | $skipped |"
}

day=$(date -u +%Y-%m-%d)
out=${out:-benches/results/$day-stream-memory.md}
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# Memory of long streams, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "\`benches/stream-memory.sh --before $before --after $after --streams $streams --tokens $tokens"
  echo "--rounds $rounds --short-tokens $short --leave-after-s $leave --settle-s $settle\` on $(nproc) cores"
  echo "($cpu). Each row is a fresh gateway (\`--semantic false\`, defaults otherwise) in front of its"
  echo "build's \`reprise-sim --ttft-ms 0 --itl-ms 0\`. Resident set of the gateway in MB: after one"
  echo "short warm-up stream (baseline), its high-water mark (peak), ${settle} s after the first round's"
  echo "streams ended and were written, and after the last one's; stored: \`reprise_store_bytes\`; skipped:"
  echo "\`reprise_store_skipped_total\` (answers over \`--max-entry-bytes\`, relayed but not stored)."
  echo
  echo "| build | case | baseline | peak | after round 1 | after | stored MB | skipped |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  measure before long
  measure after long
  measure after short
  measure before short
} >"$out" # not a pipe: the processes started must stay in this shell's PIDS, for the cleanup
cat "$out"
echo "==> wrote $out" >&2
