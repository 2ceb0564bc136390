#!/usr/bin/env bash
# Exact hits served while the vector index rebuilds (issue 22): a start without an index dump
# rebuilds the whole index with every core (half an hour at a million entries) while the gateway
# already serves; this measures what that costs the requests. Starts `reprise serve` on DATA_DIR
# (for example target/scale-gateway-last/data-1000000, which `benches/scale.sh --gateway --keep-data`
# leaves) with its index dump moved aside (put back on exit), stores 20 probe prompts through
# POST /admin/entries, waits until the rebuild inserts (--wait seconds after the start; reading a
# million vectors takes about 20 s on a warm page cache), then sends exact hits from 1 and 4
# clients (400 and 800 requests, keep-alive) and prints their latency percentiles. --keep-dump
# measures the same with the dump loaded instead (no rebuild): the baseline. The 20 probes stay in
# DATA_DIR's store.
#
# Usage: benches/rebuild-serving.sh DATA_DIR [--bin DIR] [--wait 45] [--keep-dump]
#   --bin: the directory of the `reprise` binary (default target/release, built by the caller).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: benches/rebuild-serving.sh DATA_DIR [--bin DIR] [--wait S] [--keep-dump]" >&2; exit 2; }
data=${1%/}
shift
bin=$(scripts/target-dir.sh)/release
wait_s=45
keep_dump=false
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --wait) wait_s=$2; shift 2 ;;
    --keep-dump) keep_dump=true; shift ;;
    *) echo "rebuild-serving: unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -d "$data" ] || { echo "$data: not a directory" >&2; exit 2; }
[ -x "$bin/reprise" ] || { echo "$bin/reprise: not an executable (cargo build --release -p reprise-server)" >&2; exit 2; }

. scripts/lib-procs.sh
aside="$data.index-aside"
[ -e "$aside" ] && { echo "$aside exists: a run before did not put the dump back" >&2; exit 2; }
if [ "$keep_dump" = false ] && [ -d "$data/index" ]; then
  mv "$data/index" "$aside"
  # Put back whatever happens; the run saves no dump while the rebuild is unfinished.
  trap 'procs_cleanup; rm -rf "$data/index"; mv "$aside" "$data/index"' EXIT
fi
token=rebuild
port=$(free_port)
t_start=$(date +%s)
REPRISE_ADMIN_TOKEN=$token "$bin/reprise" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:9/v1 \
  --data-dir "$data" "${SCALE_FLAGS[@]}" >"$WORK/gw.log" 2>&1 &
gw_pid=$!
PIDS+=("$gw_pid")
wait_ready http://127.0.0.1:"$port"/healthz gateway "$WORK/gw.log" 1200

python3 - >"$WORK/probes.jsonl" <<'PY'
import json
for i in range(20):
    print(json.dumps({"model": "sim-model", "prompt": f"rebuild serving probe {i}: what is the capital of country {i}?",
                      "response": "Paris.", "namespace": "rebuild-probe", "api_key": ""}))
PY
code=$(curl -s -o "$WORK/answer" -w '%{http_code}' -H "authorization: Bearer $token" -H 'content-type: application/x-ndjson' \
  --data-binary @"$WORK/probes.jsonl" http://127.0.0.1:"$port"/admin/entries)
[ "$code" = 201 ] || { echo "storing the probes: HTTP $code: $(head -c 300 "$WORK/answer")" >&2; exit 1; }
while [ $(( $(date +%s) - t_start )) -lt "$wait_s" ]; do sleep 1; done
rebuilding=$(curl -sf http://127.0.0.1:"$port"/healthz | python3 -c 'import json, sys; print(json.load(sys.stdin)["semantic"]["index_rebuilding"])')
echo "==> $bin/reprise on $data, ${wait_s} s after the start, index rebuilding: $rebuilding, load $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$port" <<'PY'
import http.client, json, sys, threading, time
port = int(sys.argv[1])
prompts = [f"rebuild serving probe {i}: what is the capital of country {i}?" for i in range(20)]

def run(clients, requests):
    latencies, lock = [], threading.Lock()
    def client(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for j in range(requests // clients):
            body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": prompts[(k * 7 + j) % 20]}]})
            t = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body,
                         {"content-type": "application/json", "x-reprise-namespace": "rebuild-probe"})
            response = conn.getresponse()
            response.read()
            elapsed = (time.perf_counter() - t) * 1000
            if response.getheader("x-reprise-cache") != "hit":
                sys.exit(f"not an exact hit: HTTP {response.status}, {response.getheader('x-reprise-cache')}")
            with lock:
                latencies.append(elapsed)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    at = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    print(f"exact hits, {clients} client(s), {len(latencies)} requests: p50 {at(0.5):.2f} ms, p90 {at(0.9):.2f} ms, p99 {at(0.99):.2f} ms")

run(1, 400)
run(4, 800)
PY
