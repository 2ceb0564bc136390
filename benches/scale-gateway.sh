#!/usr/bin/env bash
# The whole gateway at scale (issue 22), one run, one report; `benches/scale.sh --gateway` runs it.
# For each size N: `scale-gateway` (benches/src/bin/scale-gateway.rs: `reprise serve` that first
# writes N synthetic entries through the gateway's own code path for a stored entry, store then
# index; no upstream call, no embedding) is the *writing* replica. Then `reprise serve` restarts on
# its data dir with the index dump (start-up: until it listens and serves exact hits, until the full
# index serves), and without it (the same, the index rebuilt in the background: /healthz
# `index_rebuilding`); with `--redis-sizes`, the entries are also written into a local redis-server
# (`scale-gateway --store-only`) and a fresh replica loads them from there, then restarts with the
# index dump it saved at its stop. Every gateway then gets
# the same serving phase: the prompts of benches/workloads/bank.jsonl that the pairs below do not
# ask (120) warmed through POST /admin/entries into the `support` namespace (the big partition),
# then `reprise-client bench --pairs` over the 30 question/paraphrase pairs of paraphrases.txt in
# that namespace at each concurrency, with no API key, as the synthetic entries were stored: the
# questions are stored into the big partition and each paraphrase searches it (streamed
# semantic-hit TTFT against the big index; the embedding's texts per second of model time from
# /admin/stats and /metrics), then its resident set (VmRSS) and its peak (VmHWM). Before 2026-12-06 the driver sent its
# default key, so its lookups searched a partition of their own (the 30 questions), not the big one. RSS per entry is
# against a gateway on an empty store after the same serving phase (the raw measurements are kept
# in target/scale-gateway-last/ as they come). Sizes not in `--writer-sizes`
# (one graph insert at a time is hours at 1M) are written into sled with `--store-only`, and
# measured restarting without a dump first (the rebuild), then with the dump it left. With `--before DIR` (a
# `reprise` binary of another build) the restarts and the Redis load run both builds alternately.
#
# Usage: benches/scale-gateway.sh [--sizes "100000"] [--redis-sizes "100000"] [--writer-sizes "100000"] [--rounds N]
#                                 [--concurrency "1 8"] [--before DIR] [--keep-data] [--out FILE]
#   A size in `--redis-sizes` only (`--sizes ""`) is measured on the Redis-loaded replica alone.
#   Redis holds about 15 KB per entry in memory (1M: about 15 GB). Writes
#   benches/results/<date>-scale-gateway.md by default. Disk: about 3 GB per 100k entries
#   (sled and its dump, Redis in memory); all of it in a temporary folder removed at exit. With
#   `--keep-data`, each size's data dir (sled, its ledger file and the last index dump) is moved to
#   target/scale-gateway-last/data-N instead, to restart a gateway on it again without the hour a
#   1M cache takes to build.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes="100000"
redis_sizes="100000"
writer_sizes="100000"
rounds=3
concurrency="1 8"
before=""
keep_data=""
out="benches/results/$(date -u +%F)-scale-gateway.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --redis-sizes) redis_sizes=$2; shift 2 ;;
    --writer-sizes) writer_sizes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --keep-data) keep_data=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "scale-gateway: unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
absolute_before reprise
[ -n "$redis_sizes" ] && scripts/apt-install.sh redis-server >&2
scripts/provision-models.sh >/dev/null
echo "==> release build" >&2
cargo build --release --quiet -p reprise-server -p reprise-client -p reprise-sim -p reprise-benches --bins
bin=$(scripts/target-dir.sh)/release
sides="after"
[ -n "$before" ] && sides="before after"
token=scale
results=$WORK/results.jsonl
: >"$results"
rm -rf target/scale-gateway-last

paraphrase_pairs "$WORK/pairs.jsonl"
python3 - "$WORK/bank.jsonl" <<'PY'
import json, sys
answer = "A short answer that names the steps the question asked about, in about forty tokens of plain text, as a support answer would."
# The pairs' own wordings stay out: warmed, a paraphrase would be an exact hit, not a search.
asked = {line.strip() for line in open("benches/workloads/paraphrases.txt")}
with open(sys.argv[1], "w") as out:
    for line in open("benches/workloads/bank.jsonl"):
        prompt = json.loads(line)["prompt"]
        if prompt in asked:
            continue
        out.write(json.dumps({"model": "sim-model", "prompt": prompt, "response": answer,
                              "namespace": "support", "api_key": ""}) + "\n")
PY

sim_port=$(free_port)
"$bin/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 50 --itl-ms 2 --tokens 32 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"

now() { date +%s.%N; }
rss() { awk '/^VmRSS:/ {print $2}' /proc/"$1"/status; }
# The process's peak resident set so far (a rebuild's graphs are built before they are sealed).
peak() { awk '/^VmHWM:/ {print $2}' /proc/"$1"/status; }
health() { curl -sf http://127.0.0.1:"$1"/healthz; }
field() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1], {}, {"d": d}))' "$1"; }

# start NAME BINARY PORT DATA_DIR [FLAGS...]: starts a gateway; sets gw_pid and t_start.
start() {
  local name=$1 binary=$2 port=$3 data=$4
  shift 4
  t_start=$(now)
  REPRISE_ADMIN_TOKEN=$token "$binary" "$@" --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$data" "${SCALE_FLAGS[@]}" >"$WORK/gw-$name.log" 2>&1 &
  gw_pid=$!
  PIDS+=("$gw_pid")
}

# stop PID: SIGTERM and wait (the gateway flushes its store and saves its index dump).
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }

# started NAME PORT: waits (up to 90 min) until the gateway answers, serves the probe as an exact
# hit, its index is whole (every vector searched) and every large partition has its graph (after a
# rebuild from the store they are scanned exactly meanwhile); sets t_listen, t_exact, t_index,
# t_graphs (seconds after start).
started() {
  local name=$1 port=$2 t
  until health "$port" >/dev/null 2>&1; do
    kill -0 "$gw_pid" 2>/dev/null || { echo "gateway $name exited:" >&2; tail -20 "$WORK/gw-$name.log" >&2; exit 1; }
    sleep 0.05
  done
  t=$(now); t_listen=$(python3 -c "print($t - $t_start)")
  if [ -n "${probe:-}" ]; then
    local outcome
    outcome=$(curl -s -D - -o /dev/null http://127.0.0.1:"$port"/v1/chat/completions -H 'content-type: application/json' \
      -H "x-reprise-namespace: $probe_ns" -d "$probe" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-reprise-cache" {print $2}')
    [ "$outcome" = hit ] || { echo "gateway $name: the probe was a $outcome, not an exact hit" >&2; exit 1; }
    t=$(now); t_exact=$(python3 -c "print($t - $t_start)")
  else
    t_exact=$t_listen
  fi
  t_index=""
  for _ in $(seq 1 108000); do
    # Builds before 2026-12-06 have no `index_graphs_pending`: their index is whole with its graphs.
    if [ -z "$t_index" ] && health "$port" | field 'd["mode"] != "semantic" or not d["semantic"]["index_rebuilding"]' | grep -q True; then
      t=$(now); t_index=$(python3 -c "print($t - $t_start)")
    fi
    if [ -n "$t_index" ] && health "$port" | field 'd["mode"] != "semantic" or not d["semantic"].get("index_graphs_pending", 0)' | grep -q True; then
      t=$(now); t_graphs=$(python3 -c "print($t - $t_start)")
      return 0
    fi
    sleep 0.05
  done
  echo "gateway $name: index not ready after 90 minutes" >&2
  exit 1
}

# keep: copies what the report is made of, and the gateways' logs, to target/scale-gateway-last/ (outside git), so a run
# stopped early still leaves its measurements.
keep() { mkdir -p target/scale-gateway-last && cp "$WORK"/results.jsonl "$WORK"/[sej]-*.* "$WORK"/gw-*.log target/scale-gateway-last/ 2>/dev/null || true; }

# serve NAME PORT PID SIZE KIND SIDE [EXTRA_JSON]: the serving phase, then one result line.
serve() {
  local name=$1 port=$2 pid=$3 size=$4 kind=$5 side=$6 extra=${7:-"{}"} c code
  code=$(curl -s -o "$WORK/warm-answer" -w '%{http_code}' -H "authorization: Bearer $token" \
    -H 'content-type: application/x-ndjson' --data-binary @"$WORK/bank.jsonl" http://127.0.0.1:"$port"/admin/entries)
  [ "$code" = 201 ] || { echo "warming $name: HTTP $code: $(head -c 300 "$WORK/warm-answer")" >&2; exit 1; }
  for c in $concurrency; do
    local e0 e1
    e0=$(embedding "$port" "$token")
    # No key: the synthetic entries' tenant (a client without one), so the lookups search the big partition.
    REPRISE_ADMIN_TOKEN=$token "$bin/reprise-client" bench --url http://127.0.0.1:"$port"/v1 --pairs "$WORK/pairs.jsonl" \
      --api-key "" --namespace support --rounds "$rounds" --concurrency "$c" --samples "$WORK/s-$name-$c.jsonl" -q --json \
      >"$WORK/j-$name-$c.json"
    e1=$(embedding "$port" "$token")
    echo "$e0 $e1" >"$WORK/e-$name-$c.txt"
  done
  local vectors
  vectors=$(health "$port" | field 'd["semantic"]["vectors"]')
  python3 - "$name" "$size" "$kind" "$side" "$(rss "$pid")" "$(peak "$pid")" "$vectors" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "${t_listen:-0}" "${t_exact:-0}" "${t_index:-0}" "${t_graphs:-0}" "$extra" >>"$results" <<'PY'
import json, sys
name, size, kind, side, rss, hwm, vectors, load, tl, te, ti, tg, extra = sys.argv[1:]
row = {"name": name, "size": int(size), "kind": kind, "side": side, "rss_kib": int(rss), "hwm_kib": int(hwm),
       "vectors": int(vectors),
       "load": load, "t_listen": float(tl), "t_exact": float(te), "t_index": float(ti), "t_graphs": float(tg)}
row.update(json.loads(extra))
print(json.dumps(row))
PY
  keep
}

# The baseline: a gateway on an empty store, after the same serving phase.
for side in $sides; do
  b=$bin/reprise
  [ "$side" = before ] && b=$before/reprise
  port=$(free_port)
  echo "==> empty store ($side)" >&2
  start "empty-$side" "$b" "$port" "$WORK/data-empty-$side" serve
  probe="" started "empty-$side" "$port"
  serve "empty-$side" "$port" "$gw_pid" 0 empty "$side"
  stop "$gw_pid"
  rm -rf "$WORK/data-empty-$side"
done

# redis_replica N: N entries written into a local redis-server, then a fresh replica loading them
# from there (its index rebuilt from the store, as every replica without a dump of its own).
redis_replica() {
  local n=$1 url t0 redis_load_s redis_mem side b port dump redis_probe
  start_redis "redis-$n"
  url=redis://127.0.0.1:$redis_port/
  echo "==> $n entries into Redis (scale-gateway --store-only)" >&2
  t0=$(now)
  REPRISE_ADMIN_TOKEN=$token "$bin/scale-gateway" --entries "$n" --store-only --semantic false --store redis --redis-url "$url" \
    "${SCALE_FLAGS[@]}" --listen 127.0.0.1:"$(free_port)" --upstream-url http://127.0.0.1:"$sim_port"/v1 --data-dir "$WORK/redis-loader" \
    >"$WORK/redis-loader-$n.log" 2>&1 || { echo "loading Redis failed:" >&2; tail -20 "$WORK/redis-loader-$n.log" >&2; exit 1; }
  redis_load_s=$(python3 -c "print($(now) - $t0)")
  redis_mem=$(redis_used_memory "$redis_port")
  for side in $sides; do
    b=$bin/reprise
    [ "$side" = before ] && b=$before/reprise
    echo "==> $n entries: a replica loading from Redis ($side)" >&2
    port=$(free_port)
    rm -rf "$WORK/data-redis-$side"
    start "redis-$n-$side" "$b" "$port" "$WORK/data-redis-$side" serve --store redis --redis-url "$url"
    started "redis-$n-$side" "$port"
    serve "redis-$n-$side" "$port" "$gw_pid" "$n" redis "$side" \
      "{\"load_s\": $redis_load_s, \"redis_used_memory\": $redis_mem}"
    # An exact-hit probe for its restart: the newest entry of the `docs` namespace (synthetic only).
    probe_ns=docs
    redis_probe=$(curl -sf -H "authorization: Bearer $token" "http://127.0.0.1:$port/admin/entries?namespace=docs&limit=1" \
      | python3 -c 'import json, sys; e = json.load(sys.stdin)["data"][0]; print(json.dumps({"model": e["model"], "messages": [{"role": "user", "content": e["prompt"]}]}))')
    stop "$gw_pid"
    # The same replica restarted: the index dump it saved at its stop, and Redis, as before.
    dump=$(du -sk "$WORK/data-redis-$side/index" 2>/dev/null | cut -f1 || echo 0)
    echo "==> $n entries: the Redis replica restarted with its dump ($side)" >&2
    port=$(free_port)
    start "redis-dump-$n-$side" "$b" "$port" "$WORK/data-redis-$side" serve --store redis --redis-url "$url"
    probe=$redis_probe started "redis-dump-$n-$side" "$port"
    serve "redis-dump-$n-$side" "$port" "$gw_pid" "$n" redis-dump "$side" "{\"dump_kib\": ${dump:-0}}"
    stop "$gw_pid"
    rm -rf "$WORK/data-redis-$side"
  done
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  wait "$redis_pid" 2>/dev/null || true
  rm -rf "$WORK/redis-$n" "$WORK/redis-loader"
}

# Every size of either list, in order: a size only in `--redis-sizes` skips the sled replicas.
for n in $(echo $sizes $redis_sizes | tr ' ' '\n' | sort -nu); do
  case " $sizes " in *" $n "*) ;; *) redis_replica "$n"; continue ;; esac
  data=$WORK/data-$n
  port=$(free_port)
  kinds="dump rebuild"
  case " $writer_sizes " in
    *" $n "*)
      echo "==> $n entries: the writing replica (scale-gateway)" >&2
      start "writer-$n" "$bin/scale-gateway" "$port" "$data" --entries "$n"
      probe="" started "writer-$n" "$port"
      load_s=$(sed -n 's/.*wrote [0-9]* entries in \([0-9.]*\) s.*/\1/p' "$WORK/gw-writer-$n.log")
      ;;
    *)
      # Too many for one-at-a-time graph inserts: the store alone, then a rebuild (which leaves
      # the dump the next start loads).
      echo "==> $n entries into sled (scale-gateway --store-only)" >&2
      kinds="rebuild dump"
      t0=$(now)
      # With the model loaded, so that the data dir records it: a dir without a record is taken
      # as holding the previous model's vectors, and the restarts would re-embed every entry.
      REPRISE_ADMIN_TOKEN=$token "$bin/scale-gateway" --entries "$n" --store-only --data-dir "$data" \
        "${SCALE_FLAGS[@]}" --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$sim_port"/v1 >"$WORK/sled-loader-$n.log" 2>&1 ||
        { echo "loading sled failed:" >&2; tail -20 "$WORK/sled-loader-$n.log" >&2; exit 1; }
      load_s=$(python3 -c "print($(now) - $t0)")
      start "probe-$n" "$bin/reprise" "$port" "$data" serve --semantic false
      probe="" started "probe-$n" "$port"
      ;;
  esac
  # An exact-hit probe for the restarts: the newest entry of the `docs` namespace (synthetic only).
  probe_ns=docs
  probe=$(curl -sf -H "authorization: Bearer $token" "http://127.0.0.1:$port/admin/entries?namespace=docs&limit=1" \
    | python3 -c 'import json, sys; e = json.load(sys.stdin)["data"][0]; print(json.dumps({"model": e["model"], "messages": [{"role": "user", "content": e["prompt"]}]}))')
  if [ "$kinds" = "dump rebuild" ]; then
    serve "writer-$n" "$port" "$gw_pid" "$n" writer after "{\"load_s\": $load_s}"
  fi
  stop "$gw_pid"
  for kind in $kinds; do
    # The current build first: each restart saves the dump the next one loads, and one left by
    # a build that kept stale ids in its index (before ae4fa97) would make the next one rebuild.
    for side in $(echo "$sides" | tr ' ' '\n' | sort); do
      b=$bin/reprise
      [ "$side" = before ] && b=$before/reprise
      [ "$kind" = rebuild ] && rm -rf "$data/index"
      disk=$(du -sk "$data" | cut -f1)
      dump=$(du -sk "$data/index" 2>/dev/null | cut -f1 || echo 0)
      echo "==> $n entries: restart with $kind ($side)" >&2
      port=$(free_port)
      start "$kind-$n-$side" "$b" "$port" "$data" serve
      started "$kind-$n-$side" "$port"
      serve "$kind-$n-$side" "$port" "$gw_pid" "$n" "$kind" "$side" \
        "{\"disk_kib\": $disk, \"dump_kib\": ${dump:-0}, \"load_s\": $load_s}"
      stop "$gw_pid"
    done
  done
  if [ -n "$keep_data" ]; then
    mkdir -p target/scale-gateway-last && rm -rf target/scale-gateway-last/data-"$n"
    mv "$data" target/scale-gateway-last/data-"$n"
  else
    rm -rf "$data"
  fi

  case " $redis_sizes " in *" $n "*) redis_replica "$n" ;; esac
done

mkdir -p "$(dirname "$out")"
python3 - "$WORK" "$results" "$concurrency" "$rounds" "$(git rev-parse --short HEAD)" "$sizes" "$redis_sizes" "${before:-}" >"$out" <<'PY'
import json, os, sys
work, results, cs, rounds, rev, sizes, redis_sizes, before = sys.argv[1:]
cs = cs.split()
rows = [json.loads(l) for l in open(results)]

def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, -(-len(xs) * p // 100) - 1))
    return xs[int(k)]

def bench(name, c):
    samples = [json.loads(l) for l in open(f"{work}/s-{name}-{c}.jsonl")]
    hits = [s for s in samples if s["outcome"] == "semantic-hit"]
    col = lambda f: [f(r) for r in hits if f(r) is not None]
    e = [float(x) for x in open(f"{work}/e-{name}-{c}.txt").read().split()]
    texts, busy = e[5] - e[1], e[7] - e[3]
    return {"hits": len(hits), "asks": len(samples),
            "p50": pct(col(lambda r: r["ttft_ms"]), 50), "p99": pct(col(lambda r: r["ttft_ms"]), 99),
            "search": pct(col(lambda r: r["phases"]["search_ms"]), 50),
            "embed": pct(col(lambda r: r["phases"]["embed_ms"]), 50),
            "capacity": texts / busy if busy else float("nan"),
            "batch": texts / (e[4] - e[0]) if e[4] > e[0] else float("nan")}

empty = {r["side"]: r for r in rows if r["kind"] == "empty"}
print(f"# The gateway at scale, {os.popen('date -u +%Y-%m-%dT%H:%MZ').read().strip()}")
print()
print(f"`benches/scale.sh --gateway --sizes \"{sizes}\" --redis-sizes \"{redis_sizes}\" --rounds {rounds} "
      f"--concurrency \"{' '.join(cs)}\"{' --before ' + before if before else ''}` on {os.cpu_count()} cores; commit {rev}. "
      "Load average (1, 5, 15 min) in each row, read after its serving phase.")
print()
print("Replicas: **writer**: `scale-gateway`, which wrote the N synthetic entries itself (store, then index, as "
      "`POST /admin/entries` does); **dump**: `reprise serve` restarted on that data dir with its index dump; "
      "**rebuild**: the same without the dump (the index rebuilt in the background while exact hits are served); "
      "**redis**: a fresh replica on a Redis that `scale-gateway --store-only` filled; **redis-dump**: that replica "
      "restarted on its data dir (its own index dump) and the same Redis. RSS per entry: (RSS - RSS of "
      "an empty-store gateway of the same build after the same serving phase) / N; peak RSS: the process's highest "
      "resident set from its start to the end of its serving phase (`VmHWM`). Start-up: seconds from exec "
      "until it answers `/healthz` (the store read and, with a dump, the index loaded), until a synthetic entry is "
      "served as an exact hit, until `/healthz` shows the whole index (`index_rebuilding` false: every vector "
      "searched, exactly where a partition awaits its graph), until every large partition has its graph "
      "(`index_graphs_pending` 0; the serving phase starts then).")
print()
print("| N | replica | build | RSS MiB | per entry B | peak RSS MiB | listens s | exact hit s | full index s | graphs s | vectors | load |")
print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    base = empty.get(r["side"])
    per = (r["rss_kib"] - base["rss_kib"]) * 1024 / r["size"] if base and r["size"] else float("nan")
    # Rows of runs before the peak was recorded have none.
    hwm = f"{r['hwm_kib'] / 1024:,.0f}" if "hwm_kib" in r else ""
    print(f"| {r['size']:,} | {r['kind']} | {r['side']} | {r['rss_kib'] / 1024:,.0f} | {per:,.0f} | {hwm} | "
          f"{r['t_listen']:.1f} | {r['t_exact']:.1f} | {r['t_index']:.1f} | {r.get('t_graphs', r['t_index']):.1f} | "
          f"{r['vectors']:,} | {r['load']} |")
print()
extra = [r for r in rows if "load_s" in r or "disk_kib" in r or "dump_kib" in r]
for r in extra:
    if r["kind"] == "writer":
        print(f"- {r['size']:,} entries written by `scale-gateway` (store and index) in {r['load_s']:.1f} s.")
    if r["kind"] == "rebuild" and r["side"] == "after" and not any(w["kind"] == "writer" and w["size"] == r["size"] for w in rows):
        print(f"- {r['size']:,} entries written into sled by `scale-gateway --store-only` in {r['load_s']:.1f} s.")
    if r["kind"] == "dump" and r["side"] == "after":
        print(f"- {r['size']:,}: data dir {r['disk_kib'] / 1024:,.0f} MiB, of which the index dump {r['dump_kib'] / 1024:,.0f} MiB.")
    if r["kind"] == "redis" and r["side"] == "after":
        print(f"- {r['size']:,} entries written into Redis (`--store-only`) in {r['load_s']:.1f} s; Redis used_memory "
              f"{r['redis_used_memory'] / 2**20:,.0f} MiB ({r['redis_used_memory'] / r['size']:,.0f} B per entry).")
    if r["kind"] == "redis-dump" and r["side"] == "after":
        print(f"- {r['size']:,}: the Redis replica's index dump {r['dump_kib'] / 1024:,.0f} MiB.")
print()
print(f"## Semantic hits and the embedding, per replica ({rounds} rounds of 30 paraphrases, streamed, namespace `support`)")
print()
print("TTFT of the streamed semantic hits (client side, ms); search: the gateway's search phase p50; capacity: texts "
      "embedded per second of model time at the batch sizes this concurrency formed.")
print()
print("| N | replica | build | c | semantic hits | TTFT p50 | p99 | embed p50 | search p50 | texts/call | capacity texts/s |")
print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    for c in cs:
        b = bench(r["name"], c)
        print(f"| {r['size']:,} | {r['kind']} | {r['side']} | {c} | {b['hits']} of {b['asks']} | {b['p50']:.2f} | "
              f"{b['p99']:.2f} | {b['embed']:.2f} | {b['search']:.3f} | {b['batch']:.2f} | {b['capacity']:,.0f} |")
PY
echo "scale-gateway: wrote $out" >&2
