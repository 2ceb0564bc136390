#!/usr/bin/env bash
# The first exact hits after a restart, for one or more gateway binaries measured alternately in one
# run: each round stores one streamed answer without usage (the SDKs' default, so a hit's tokens
# are counted with a tokenizer), restarts the gateway on the same data dir, then times the first
# two hits (curl's time to the first byte) and prints the hit's `x-reprise-tokens-saved`. Before
# b0bb549 the first hit after a restart built the tokenizer's tables on the request path.
#
# Usage: benches/first-hit.sh [--rounds 3] BIN [BIN...]
#   BIN: a `reprise` binary (for example target/release/reprise, or a copy of an older build's).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    -*) echo "first-hit: unknown argument: $1" >&2; exit 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ ${#bins[@]} -ge 1 ] || { echo "usage: benches/first-hit.sh [--rounds N] BIN [BIN...]" >&2; exit 2; }
for bin in "${bins[@]}"; do
  [ -x "$bin" ] || { echo "$bin: not an executable" >&2; exit 2; }
done
sim=${CARGO_TARGET_DIR:-target}/release/reprise-sim
[ -x "$sim" ] || { echo "$sim: missing (cargo build --release -p reprise-sim)" >&2; exit 2; }

. scripts/lib-procs.sh
sim_port=$(free_port)
"$sim" --listen 127.0.0.1:"$sim_port" --profile wafer-scale >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$sim_port/v1/models" reprise-sim "$WORK/sim.log"
port=$(free_port)

# ask PROMPT: one streamed request; prints "seconds-to-first-byte outcome tokens-saved".
ask() {
  local body
  body=$(python3 -c 'import json, sys; print(json.dumps({"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": sys.argv[1]}]}))' "$1")
  curl -s -o /dev/null -w '%{time_starttransfer} %header{x-reprise-cache} %header{x-reprise-tokens-saved}\n' \
    http://127.0.0.1:"$port"/v1/chat/completions -H 'content-type: application/json' \
    -H 'authorization: Bearer sk-first-hit' -d "$body"
}

gateway=
# serve BIN DATA_DIR: starts an exact-only gateway and waits until it answers.
serve() {
  "$1" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$2" --semantic false >>"$WORK/gateway.log" 2>&1 &
  gateway=$!
  PIDS+=("$gateway")
  wait_ready "http://127.0.0.1:$port/healthz" reprise "$WORK/gateway.log"
}

# stop: SIGTERM, so the answer is on disk for the next start.
stop() {
  kill -TERM "$gateway"
  wait "$gateway" 2>/dev/null || true
}

echo "| round | binary | first hit after the restart | second hit |"
echo "|---:|---|---|---|"
for round in $(seq 1 "$rounds"); do
  for i in "${!bins[@]}"; do
    data="$WORK/data-$round-$i"
    prompt="Round $round, binary $i: tell me about restarts"
    serve "${bins[$i]}" "$data"
    ask "$prompt" >/dev/null
    stop
    serve "${bins[$i]}" "$data"
    first=$(ask "$prompt")
    second=$(ask "$prompt")
    stop
    echo "| $round | ${bins[$i]} | $first | $second |"
  done
done
