# Shared by the scripts that start reprise processes (sourced, not run): a temporary folder WORK,
# the started processes (append their PIDs to PIDS) stopped and WORK removed on exit, a free
# loopback port, waiting until a URL answers, a gateway's embedding counters, a bench's `--before`
# binaries, and a redis-server with a gateway on it and what it reports.

WORK=$(mktemp -d "${TMPDIR:-/tmp}/reprise.XXXXXX")
PIDS=()
procs_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf -- "$WORK"
}
trap procs_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# SCALE_FLAGS: what a gateway on a data dir of the scale benches (benches/scale-gateway.sh and
# those run on the data dirs it keeps) starts with: the provisioned model, and caps no bench's
# cache reaches (the defaults, 100,000 entries and 1 GiB, would evict part of the cache under test).
SCALE_FLAGS=(--model-dir models/all-MiniLM-L6-v2 --ort-lib models/onnxruntime/libonnxruntime.so
  --max-entries 100000000 --max-bytes 1000000000000)

# paraphrase_pairs FILE: the benches' 30 paraphrase pairs as `reprise-client bench --pairs` reads
# them: the first 30 lines of benches/workloads/paraphrases.txt are the questions stored, the next
# 30 ask them again in other words.
paraphrase_pairs() {
  python3 - "$1" <<'PY'
import json, sys
lines = [l.rstrip("\n") for l in open("benches/workloads/paraphrases.txt")]
with open(sys.argv[1], "w") as out:
    for i, (a, b) in enumerate(zip(lines[:30], lines[30:60])):
        out.write(json.dumps({"id": f"p{i:02}", "category": "paraphrase", "a": a, "b": b, "same_answer": True}) + "\n")
PY
}

# absolute_before BINARY...: when `before` is set (a bench's `--before DIR`: another build's
# binaries), checks that it holds each BINARY and makes it absolute (a relative DIR is taken from
# the repository's root, where the benches run); exits 2 otherwise.
absolute_before() {
  [ -n "$before" ] || return 0
  local b
  for b in "$@"; do
    [ -x "$before/$b" ] || { echo "$before/$b: not an executable" >&2; exit 2; }
  done
  before=$(cd "$before" && pwd)
}

# start_redis NAME: a redis-server on a free loopback port without persistence, its files and log
# in WORK/NAME; sets redis_port and redis_pid (stopped at exit with the rest).
start_redis() {
  redis_port=$(free_port)
  mkdir -p "$WORK/$1"
  redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --dir "$WORK/$1" \
    >"$WORK/$1.log" 2>&1 &
  redis_pid=$!
  PIDS+=("$redis_pid")
  for _ in $(seq 1 200); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "redis-server ($1) did not start" >&2
  exit 1
}

# redis_used_memory PORT: the `used_memory` (bytes) of the redis-server on PORT.
redis_used_memory() {
  redis-cli -p "$1" info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p'
}

# redis_hscans PORT: the `HSCAN` calls (reads of a registry) the redis-server on PORT has served
# since its stats were last reset.
redis_hscans() {
  redis-cli -p "$1" info commandstats | sed -n 's/^cmdstat_hscan:calls=\([0-9]*\),.*/\1/p' | grep . || echo 0
}

# serve_on_redis BINARY TOKEN NAME: BINARY (`reprise`) serving on a free port with its entries in the
# redis-server of start_redis, semantic matching off (no vectors to load) and caps no bench
# reaches, admin token TOKEN, log in WORK/NAME.log; sets port and gw (stopped at exit with the
# rest) once it answers.
serve_on_redis() {
  port=$(free_port)
  REPRISE_ADMIN_TOKEN=$2 "$1" serve --store redis --redis-url "redis://127.0.0.1:$redis_port/" \
    --semantic false --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:9/v1 \
    --data-dir "$WORK/$3" --max-entries 100000000 --max-bytes 1000000000000 >"$WORK/$3.log" 2>&1 &
  gw=$!
  PIDS+=("$gw")
  wait_ready "http://127.0.0.1:$port/healthz" "gateway ($3)" "$WORK/$3.log"
}

# free_port: a loopback port the kernel just handed out (and took back).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_ready URL NAME [LOG] [TRIES]: polls URL every 50 ms, at most TRIES times (default 600), until
# it answers; otherwise fails, showing the end of LOG when there is one.
wait_ready() {
  local tries=${4:-600}
  for _ in $(seq 1 "$tries"); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "$2 did not become ready at $1" >&2
  if [ -n "${3:-}" ] && [ -f "$3" ]; then
    echo "its log:" >&2
    tail -n 40 "$3" >&2
  fi
  exit 1
}

# embedding PORT TOKEN: a gateway's embedding counters as "batches texts overload busy_seconds"
# (the last: the model calls' total time, from /metrics), read with admin token TOKEN. Benches take
# it before and after a run: the difference is what the run cost the model.
embedding() {
  local busy
  busy=$(curl -sf -H "authorization: Bearer $2" http://127.0.0.1:"$1"/metrics \
    | awk '$1 == "reprise_embedding_batch_seconds_sum" { print $2 }')
  curl -sf -H "authorization: Bearer $2" http://127.0.0.1:"$1"/admin/stats | python3 -c '
import json, sys
e = json.load(sys.stdin)["embedding"]
print(e["batches"], e["texts"], e["fallback_reasons"]["overload"], sys.argv[1] or 0)' "$busy"
}
