#!/usr/bin/env bash
# A slow shared store against requests that do not need it (issue 24, point 1), measured side by
# side in one run: two builds of `reprise` (--before and --after binary directories), each on
# `--store redis` through `reprise-client delay-proxy` (every chunk either way DELAY ms late, so a
# Redis round trip gains 2 x DELAY) and straight on the same Redis (no delay), in front of one fast
# reprise-sim. Per configuration, while `reprise-client bench` sends exact hits at concurrency 8
# (non-streamed, one cached prompt) for SECONDS, sequential probes time: `/healthz`, a pass-through
# `GET /v1/models`, and a miss that touches no store (`Cache-Control: no-store, no-cache`). The
# configurations alternate in rounds (order rotated per round) so drift falls on all of them.
# Writes benches/results/<date>-slow-store.md.
#
# Usage: benches/slow-store.sh --before DIR --after DIR [--delay-ms N] [--seconds S] [--rounds N]
#   DIR holds reprise, reprise-sim and reprise-client (release builds); the reprise-client of
#   --after runs the proxy and the driver for both. Defaults: 10 ms, 10 s, 2 rounds.
set -euo pipefail
cd "$(dirname "$0")/.."

before=""
after=""
delay=10
seconds=10
rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --delay-ms) delay=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$before" ] && [ -n "$after" ] || { echo "usage: $0 --before DIR --after DIR" >&2; exit 2; }
for dir in "$before" "$after"; do
  for b in reprise reprise-sim; do
    [ -x "$dir/$b" ] || { echo "$dir/$b is missing" >&2; exit 2; }
  done
done
client="$after/reprise-client"

. scripts/lib-procs.sh
scripts/apt-install.sh redis-server >/dev/null

redis_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --dir "$WORK" \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 200); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.05; done

proxy_port=$(free_port)
"$client" delay-proxy --listen "127.0.0.1:$proxy_port" --target "127.0.0.1:$redis_port" \
  --delay-ms "$delay" >"$WORK/proxy.log" 2>&1 &
PIDS+=($!)

sim_port=$(free_port)
"$after/reprise-sim" --listen "127.0.0.1:$sim_port" --ttft-ms 2 --itl-ms 0.1 --tokens 16 \
  >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$sim_port/v1/models" reprise-sim "$WORK/sim.log"

# probe URL [CURL_ARGS...]: 40 sequential requests, one time per line in ms.
probe() {
  local url=$1
  shift
  for _ in $(seq 1 40); do
    curl -s -o /dev/null -w '%{time_total}\n' "$@" "$url" | awk '{ printf "%.3f\n", $1 * 1000 }'
  done
}

# one BUILD LINK: a gateway of BUILD on the Redis through LINK (delayed|direct), under exact-hit load.
one() {
  local build=$1 link=$2 dir port gw_pid name
  dir=$([ "$build" = before ] && echo "$before" || echo "$after")
  port=$(free_port)
  name="$build-$link-$RANDOM"
  local redis_url="redis://127.0.0.1:$redis_port/"
  [ "$link" = delayed ] && redis_url="redis://127.0.0.1:$proxy_port/"
  redis-cli -p "$redis_port" flushall >/dev/null
  "$dir/reprise" serve --listen "127.0.0.1:$port" --upstream-url "http://127.0.0.1:$sim_port/v1" \
    --data-dir "$WORK/data-$name" --semantic false --store redis --redis-url "$redis_url" \
    --replica-id "$name" >"$WORK/$name.log" 2>&1 &
  gw_pid=$!
  PIDS+=($gw_pid)
  wait_ready "http://127.0.0.1:$port/healthz" "$name" "$WORK/$name.log"
  local gw="http://127.0.0.1:$port"
  "$client" bench --url "$gw" --quiet --json --no-stream --unique-prompts 1 --warmup 20 \
    --concurrency 8 --duration "$seconds" --namespace none >"$WORK/$name.json" 2>"$WORK/$name.bench.log" &
  local bench=$!
  sleep 1
  probe "$gw/healthz" >"$WORK/$name.healthz"
  probe "$gw/v1/models" -H 'authorization: Bearer sk-probe' >"$WORK/$name.models"
  probe "$gw/v1/chat/completions" -H 'content-type: application/json' \
    -H 'cache-control: no-store, no-cache' -H 'authorization: Bearer sk-probe' \
    -d '{"model":"sim-model","messages":[{"role":"user","content":"not cached"}]}' >"$WORK/$name.nostore"
  wait "$bench" || { echo "bench against $name failed:" >&2; cat "$WORK/$name.bench.log" >&2; exit 1; }
  local health
  health=$(curl -s "$gw/healthz" | python3 -c 'import json, sys; h = json.load(sys.stdin); print(h["store"]["status"])')
  kill "$gw_pid" 2>/dev/null || true
  wait "$gw_pid" 2>/dev/null || true
  python3 - "$WORK/$name" "$build" "$link" "$health" >>"$WORK/runs.jsonl" <<'PY'
import json, statistics, sys
base, build, link, health = sys.argv[1:]
def p50(path):
    xs = [float(x) for x in open(path) if x.strip()]
    return statistics.median(xs)
report = json.load(open(base + ".json"))
target = report["targets"][0]
print(json.dumps({"build": build, "link": link, "store": health,
                  "hits_per_s": target["requests_per_s"],
                  "outcomes": target.get("outcomes", {}),
                  "healthz_ms": p50(base + ".healthz"), "models_ms": p50(base + ".models"),
                  "nostore_ms": p50(base + ".nostore")}))
PY
  echo "    $build $link done" >&2
}

started=$(date -u +%Y-%m-%dT%H:%MZ)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
configs=("before delayed" "after delayed" "before direct" "after direct")
for r in $(seq 1 "$rounds"); do
  echo "==> round $r" >&2
  for i in $(seq 0 3); do
    cfg=${configs[$(((i + r) % 4))]}
    # shellcheck disable=SC2086 # two words: build and link
    one $cfg
  done
done

out="benches/results/$(date -u +%Y-%m-%d)-slow-store.md"
python3 - "$WORK/runs.jsonl" "$delay" "$seconds" "$rounds" "$started" "$load_before" >"$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
delay, seconds, rounds, started, load = sys.argv[2:]
def cell(build, link, key):
    xs = [r[key] for r in runs if r["build"] == build and r["link"] == link]
    return statistics.median(xs)
print(f"# A slow Redis and the requests that do not need it ({started})\n")
print(f"`benches/slow-store.sh`: one gateway on `--store redis`, straight to a local redis-server or through "
      f"`reprise-client delay-proxy` adding {delay} ms to every chunk each way (a round trip gains {2 * int(delay)} ms); "
      f"exact hits at concurrency 8 for {seconds} s, non-streamed, while 40 sequential probes of each kind run; "
      f"medians over {rounds} rounds, builds alternating. Load average at start: {load}.\n")
print("| | before, direct | after, direct | before, delayed | after, delayed |")
print("|---|---|---|---|---|")
rows = [("exact hits/s (c=8)", "hits_per_s", "{:,.0f}"), ("`/healthz` p50 ms", "healthz_ms", "{:.1f}"),
        ("pass-through `GET /v1/models` p50 ms", "models_ms", "{:.1f}"), ("`no-store` miss p50 ms", "nostore_ms", "{:.1f}")]
for label, key, fmt in rows:
    vals = [fmt.format(cell(b, l, key)) for l, b in [("direct", "before"), ("direct", "after"), ("delayed", "before"), ("delayed", "after")]]
    print(f"| {label} | " + " | ".join(vals) + " |")
stores = {f"{r['build']}, {r['link']}": r["store"] for r in runs}
print("\nStore status at the end of each configuration's last run: " + ", ".join(f"{k}: {v}" for k, v in sorted(stores.items())) + ".\n")
print("Per run (JSON lines):\n\n```")
for r in runs:
    print(json.dumps(r))
print("```")
PY
echo "wrote $out" >&2
cat "$out"
