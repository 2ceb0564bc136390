#!/usr/bin/env bash
# A crash and the restart after it, on a data dir with an index dump (issue 22): how long until the
# gateway serves exact hits and its full index when the dump is behind the store. Starts
# `reprise serve` on DATA_DIR (for example target/scale-gateway-last/data-1000000, which
# `benches/scale.sh --gateway --keep-data` leaves), waits for its full index (a clean start: the
# ledger file and the dump of its last shutdown), stores N new entries through POST /admin/entries
# (embedded by the model, so they have vectors), kills it with SIGKILL (no dump saved, no ledger
# file written), starts it again and prints both starts: seconds until it listens, until a new
# entry is served as an exact hit, until /healthz shows the whole index, and the log lines that
# say how the store was opened and whether the dump was brought up to date or the index rebuilt.
# DATA_DIR keeps the N entries.
#
# Usage: benches/crash-restart.sh DATA_DIR [--entries 1000] [--bin DIR]
#   --bin: the directory of the `reprise` binary (default target/release, built by the caller).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: benches/crash-restart.sh DATA_DIR [--entries N] [--bin DIR]" >&2; exit 2; }
data=$1
shift
entries=1000
bin=$(scripts/target-dir.sh)/release
while [ $# -gt 0 ]; do
  case "$1" in
    --entries) entries=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "crash-restart: unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -d "$data" ] || { echo "$data: not a directory" >&2; exit 2; }
[ -x "$bin/reprise" ] || { echo "$bin/reprise: not an executable (cargo build --release -p reprise-server)" >&2; exit 2; }

. scripts/lib-procs.sh
token=crash
now() { date +%s.%N; }
since() { python3 -c "print(round($(now) - $1, 2))"; }
port=$(free_port)

# start NAME: starts the gateway (no upstream is asked); sets gw_pid and t_start.
start() {
  t_start=$(now)
  REPRISE_ADMIN_TOKEN=$token "$bin/reprise" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:9/v1 \
    --data-dir "$data" "${SCALE_FLAGS[@]}" >"$WORK/gw-$1.log" 2>&1 &
  gw_pid=$!
  PIDS+=("$gw_pid")
}

# started NAME [PROMPT]: waits until it listens, serves PROMPT as an exact hit, and its index is
# whole; prints one line of seconds after start.
started() {
  local name=$1 prompt=${2:-} t_listen t_exact="-" outcome
  until curl -sf http://127.0.0.1:"$port"/healthz >/dev/null 2>&1; do
    kill -0 "$gw_pid" 2>/dev/null || { echo "gateway $name exited:" >&2; tail -20 "$WORK/gw-$name.log" >&2; exit 1; }
    sleep 0.05
  done
  t_listen=$(since "$t_start")
  if [ -n "$prompt" ]; then
    outcome=$(curl -s -D - -o /dev/null http://127.0.0.1:"$port"/v1/chat/completions -H 'content-type: application/json' \
      -H 'x-reprise-namespace: crash' -d "$(python3 -c 'import json, sys; print(json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": sys.argv[1]}]}))' "$prompt")" \
      | tr -d '\r' | awk -F': ' 'tolower($1) == "x-reprise-cache" {print $2}')
    [ "$outcome" = hit ] || { echo "gateway $name: the probe was a $outcome, not an exact hit" >&2; exit 1; }
    t_exact=$(since "$t_start")
  fi
  until curl -sf http://127.0.0.1:"$port"/healthz | python3 -c 'import json, sys; d = json.load(sys.stdin); sys.exit(0 if d["mode"] != "semantic" or not d["semantic"]["index_rebuilding"] else 1)'; do
    sleep 0.05
  done
  echo "$name: listening after $t_listen s, exact hit of a new entry after $t_exact s, full index after $(since "$t_start") s," \
    "$(curl -sf http://127.0.0.1:"$port"/healthz | python3 -c 'import json, sys; print(json.load(sys.stdin)["semantic"]["vectors"])') vectors"
  grep -aE 'opened cache store|vector index (loaded|rebuilt)|rebuilding the vector index' "$WORK/gw-$name.log" \
    | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^[^ ]* *[A-Z]* *//' -e 's/^/  /'
}

echo "==> clean start on $data"
start clean
started clean

echo "==> $entries new entries (POST /admin/entries), then SIGKILL"
python3 - "$entries" "$WORK/new.jsonl" <<'PY'
import json, sys, time
n, out = int(sys.argv[1]), sys.argv[2]
stamp = int(time.time())
with open(out, "w") as f:
    for i in range(n):
        f.write(json.dumps({"model": "sim-model", "prompt": f"crash test {stamp} question {i}: how do I rotate key {i}?",
                            "response": "Rotate it in the settings page.", "namespace": "crash", "api_key": ""}) + "\n")
PY
code=$(curl -s -o "$WORK/answer" -w '%{http_code}' -H "authorization: Bearer $token" -H 'content-type: application/x-ndjson' \
  --data-binary @"$WORK/new.jsonl" http://127.0.0.1:"$port"/admin/entries)
[ "$code" = 201 ] || { echo "storing: HTTP $code: $(head -c 300 "$WORK/answer")" >&2; exit 1; }
# sled writes its log to disk every 500 ms: give it time, so the kill loses no stored entry.
sleep 2
kill -9 "$gw_pid"
wait "$gw_pid" 2>/dev/null || true
probe=$(tail -1 "$WORK/new.jsonl" | python3 -c 'import json, sys; print(json.load(sys.stdin)["prompt"])')

echo "==> restart after the crash"
start crashed
started crashed "$probe"
