#!/usr/bin/env bash
# What the shared Redis store costs per hit (issue 11), measured side by side in one run, in front of
# one fixed-latency reprise-sim:
#   sled       one gateway on sled (the default store);
#   redis      one gateway on `--store redis` (a local redis-server on a loopback port, no persistence);
#   pair       two gateways on another such Redis, one driver sending its requests to them in turn
#              (`reprise-client bench --round-robin`), so one workload's load is split between them.
# Parts: 1. exact hits (TTFT p50/p95/p99 and requests/s, streamed and not, concurrency 1 and 8);
# 2. semantic hits (paraphrases of cached questions); 3. misses, for context (paired against the
# simulator straight); 4. what a replica holds in memory for its local index: RSS of a fresh replica
# that bootstrapped N entries from Redis against one on an empty Redis, and of the replica that
# warmed them, with Redis's own memory per entry. The configurations alternate in rounds, in an
# order rotated from cell to cell, so drift on a shared machine falls on all of them. All gateways
# have semantic matching on. Writes benches/results/<date>-replicas.md.
#
# Usage: benches/replicas.sh [--rounds N] [--requests N] [--entries N]
#   defaults: 3 rounds; 4,000 exact-hit requests per run at concurrency 8 (a quarter at concurrency
#   1); 20,000 entries for the memory part (0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
requests=4000
entries=20000
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --entries) entries=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
scripts/apt-install.sh redis-server
scripts/provision-models.sh >/dev/null
echo "==> release build" >&2
cargo build --release --quiet -p reprise-server -p reprise-client -p reprise-sim
target_dir=$(scripts/target-dir.sh)
bin="$target_dir/release"
model_flags=(--model-dir models/all-MiniLM-L6-v2 --ort-lib models/onnxruntime/libonnxruntime.so)

# start_gateway NAME PORT DATA_DIR [FLAGS...]: a semantic gateway in front of the simulator; sets gw_pid.
start_gateway() {
  local name=$1 port=$2 data=$3
  shift 3
  "$bin/reprise" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$data" --semantic true --admin-token bench "${model_flags[@]}" "$@" \
    >>"$WORK/gateway-$name.log" 2>&1 &
  gw_pid=$!
  PIDS+=($gw_pid)
  wait_ready http://127.0.0.1:"$port"/healthz "gateway $name" "$WORK/gateway-$name.log" 1200
  # A gateway that could not load the model serves exact-only: its semantic numbers would lie.
  if ! curl -sf http://127.0.0.1:"$port"/healthz | grep -q '"mode":"semantic"'; then
    echo "gateway $name runs without semantic matching: $(curl -sf http://127.0.0.1:"$port"/healthz)" >&2
    exit 1
  fi
}

# vectors PORT: live vectors in the gateway's index.
vectors() { curl -sf http://127.0.0.1:"$1"/healthz | python3 -c 'import json, sys; print(json.load(sys.stdin)["semantic"]["vectors"])'; }

# wait_index PORT N: until the gateway's index holds at least N vectors and no rebuild runs (15 min at most).
wait_index() {
  for _ in $(seq 1 1800); do
    curl -sf http://127.0.0.1:"$1"/healthz | python3 -c '
import json, sys
s = json.load(sys.stdin)["semantic"]
sys.exit(0 if s["vectors"] >= int(sys.argv[1]) and not s["index_rebuilding"] and s["backfill_pending"] == 0 else 1)' "$2" \
      && return 0
    sleep 0.5
  done
  echo "gateway on $1: index below $2 vectors after 15 minutes: $(curl -sf http://127.0.0.1:"$1"/healthz)" >&2
  exit 1
}

sim_port=$(free_port)
"$bin/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 50 --itl-ms 2 --tokens 32 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"
# One Redis for the single gateway, another for the pair: with the change feed, replicas on one
# Redis apply each other's writes, so sharing one would make the single gateway a third replica.
start_redis redis-single
single_redis=redis://127.0.0.1:$redis_port/
start_redis redis-pair
pair_redis=redis://127.0.0.1:$redis_port/
redis_version=$(redis-server --version | sed 's/ sha=.*//')

declare -A port
for gw in sled redis c1 c2; do port[$gw]=$(free_port); done
start_gateway sled "${port[sled]}" "$WORK/data-sled"
start_gateway redis "${port[redis]}" "$WORK/data-redis" --store redis --redis-url "$single_redis"
start_gateway c1 "${port[c1]}" "$WORK/data-c1" --store redis --redis-url "$pair_redis"
start_gateway c2 "${port[c2]}" "$WORK/data-c2" --store redis --redis-url "$pair_redis"
configs=(sled redis pair)

# urls CFG: the driver's target flags for a configuration.
urls() {
  case $1 in
    sled) echo "--url http://127.0.0.1:${port[sled]}/v1" ;;
    redis) echo "--url http://127.0.0.1:${port[redis]}/v1" ;;
    pair) echo "--url http://127.0.0.1:${port[c1]}/v1 --round-robin http://127.0.0.1:${port[c2]}/v1" ;;
  esac
}

# run PART LABEL CFG BENCH_FLAGS...: one driver run (model `$model`, else one of its own); appends a
# record (its JSON report and samples file) to $WORK/runs.jsonl.
n=0
run() {
  local part=$1 label=$2 cfg=$3
  shift 3
  n=$((n + 1))
  local samples="$WORK/samples-$n.jsonl"
  # shellcheck disable=SC2046 # urls is a list of flags
  "$bin/reprise-client" bench $(urls "$cfg") --quiet --json --samples "$samples" --model "${model:-replicas-$n}" "$@" \
    >"$WORK/report-$n.json" 2>"$WORK/bench-$n.log" || {
    echo "bench run $n ($part $label $cfg) failed:" >&2
    cat "$WORK/bench-$n.log" >&2
    exit 1
  }
  python3 -c '
import json, sys
part, label, cfg, report, samples = sys.argv[1:]
print(json.dumps({"part": int(part), "label": json.loads(label), "config": cfg,
                  "report": json.load(open(report)), "samples": samples}))' \
    "$part" "$label" "$cfg" "$WORK/report-$n.json" "$samples" >>"$WORK/runs.jsonl"
  echo "    $part $label $cfg done" >&2
}

# rotated K LIST...: the list in an order that moves by one from cell to cell.
rotated() {
  local k=$1 list=("${@:2}") out=() i
  for i in $(seq 0 $((${#list[@]} - 1))); do out+=("${list[$(((i + k) % ${#list[@]}))]}"); done
  echo "${out[@]}"
}

started=$(date -u +%Y-%m-%dT%H:%MZ)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
cell=0
echo "==> 1. exact hits, $rounds rounds" >&2
# 51 prompts (odd): with two replicas in turn, the second pass sends each prompt to the replica
# that did not store it, so half of the pair's hits are of entries the other replica wrote.
for r in $(seq 1 "$rounds"); do
  for mode in stream no-stream; do
    for c in 1 8; do
      cell=$((cell + 1))
      flags=(--unique-prompts 51 --warmup 51 --requests $((c == 1 ? requests / 4 : requests)) --concurrency "$c")
      [ "$mode" = no-stream ] && flags+=(--no-stream)
      for cfg in $(rotated "$cell" "${configs[@]}"); do
        run 1 "{\"round\": $r, \"mode\": \"$mode\", \"c\": $c}" "$cfg" "${flags[@]}"
      done
    done
  done
done

echo "==> 2. semantic hits, $rounds rounds" >&2
# The bank's 60 paraphrase groups: the first wording of each is cached first (through the first
# replica of the pair), then the other two are asked, once each, in a namespace of their own per run.
python3 - "$WORK" <<'PY'
import json, sys
rows = [json.loads(l) for l in open("benches/workloads/bank.jsonl")]
seen, anchors, paraphrases = set(), [], []
for row in rows:
    (paraphrases if row["group"] in seen else anchors).append(row)
    seen.add(row["group"])
for name, items in (("anchors", anchors), ("paraphrases", paraphrases)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps({"prompt": item["prompt"], "group": item["group"]}) + "\n")
PY
for r in $(seq 1 "$rounds"); do
  for c in 1 8; do
    for cfg in "${configs[@]}"; do
      url=$(urls "$cfg" | cut -d' ' -f2)
      "$bin/reprise-client" bench --url "$url" --quiet --json --model replicas-sem \
        --namespace "sem-$r-$c-$cfg" --workload "$WORK/anchors.jsonl" --requests 60 --concurrency 8 \
        --warmup 0 >/dev/null 2>"$WORK/anchors.log" || { cat "$WORK/anchors.log" >&2; exit 1; }
    done
  done
done
for gw in sled redis c1; do wait_index "${port[$gw]}" 1; done
# The second replica learns the first one's questions from the change feed.
wait_index "${port[c2]}" "$(vectors "${port[c1]}")"
for r in $(seq 1 "$rounds"); do
  for c in 1 8; do
    cell=$((cell + 1))
    for cfg in $(rotated "$cell" "${configs[@]}"); do
      model=replicas-sem run 2 "{\"round\": $r, \"c\": $c}" "$cfg" --namespace "sem-$r-$c-$cfg" \
        --workload "$WORK/paraphrases.jsonl" --requests 120 --concurrency "$c" --warmup 0
    done
  done
done

echo "==> 3. misses, $rounds rounds" >&2
for r in $(seq 1 "$rounds"); do
  cell=$((cell + 1))
  for cfg in $(rotated "$cell" "${configs[@]}"); do
    run 3 "{\"round\": $r, \"c\": 8}" "$cfg" --requests 160 --concurrency 8 --warmup 8 \
      --compare http://127.0.0.1:"$sim_port"/v1
  done
done

# 4. Memory: a Redis of its own, so the counts are this part's alone.
mem="{}"
if [ "$entries" -gt 0 ]; then
  echo "==> 4. memory: $entries entries" >&2
  start_redis redis-mem
  mem_url=redis://127.0.0.1:$redis_port/
  mem_redis_port=$redis_port
  # rss PID: resident set size in KiB.
  rss() { awk '/^VmRSS:/ {print $2}' /proc/"$1"/status; }
  redis_mem() { redis_used_memory "$mem_redis_port"; }
  # warm PORT FROM COUNT: stores COUNT generated question/answer pairs through /admin/entries.
  warm() {
    python3 - "$2" "$3" <<'PY' >"$WORK/warm.jsonl"
import json, random, sys
start, count = int(sys.argv[1]), int(sys.argv[2])
text = " ".join(json.loads(l)["prompt"] for l in open("benches/workloads/bank.jsonl"))
words = sorted({w.strip(",.?!'").lower() for w in text.split()} - {""})
answer = " ".join(["The answer names the facts the question asked for, in about thirty-two tokens of text."] * 2)
for i in range(start, start + count):
    rng = random.Random(i)
    prompt = "Question %d: %s?" % (i, " ".join(rng.choice(words) for _ in range(12)))
    print(json.dumps({"model": "replicas-mem", "prompt": prompt, "response": answer, "namespace": "mem",
                      "api_key": ""}))
PY
    split -l 500 "$WORK/warm.jsonl" "$WORK/warm-part-"
    local part try code
    for part in "$WORK"/warm-part-*; do
      # A batch the gateway could not store (a 500: Redis slower than the store's timeouts on this
      # busy machine) is sent again; the per-entry figures divide by the vectors actually indexed.
      for try in 1 2 3 4; do
        code=$(curl -s -o "$WORK/warm-answer" -w '%{http_code}' -H 'authorization: Bearer bench' \
          -H 'content-type: application/x-ndjson' --data-binary @"$part" http://127.0.0.1:"$1"/admin/entries)
        [ "$code" = 201 ] && break
        echo "warming through port $1: HTTP $code (try $try): $(head -c 300 "$WORK/warm-answer")" >&2
        if [ "$try" = 4 ]; then exit 1; fi
        sleep 1
      done
      rm -f "$part"
    done
  }
  # A replica is measured after 200 entries of its own, so the model's buffers are allocated.
  warmup=200
  m1=$(free_port)
  start_gateway mem-1 "$m1" "$WORK/data-mem-1" --store redis --redis-url "$mem_url"
  pid1=$gw_pid
  warm "$m1" 0 "$warmup"
  wait_index "$m1" "$warmup"
  before_rss=$(rss "$pid1")
  before_vectors=$(vectors "$m1")
  before_redis=$(redis_mem)
  t0=$(date +%s)
  warm "$m1" "$warmup" "$entries"
  wait_index "$m1" $((warmup + entries))
  warm_s=$(($(date +%s) - t0))
  grown_rss=$(rss "$pid1")
  grown_vectors=$(vectors "$m1")
  after_redis=$(redis_mem)
  # A fresh replica on the same Redis (new data folder: it builds its index from Redis) and one on
  # an empty Redis database, both after 200 entries of their own.
  m2=$(free_port)
  start_gateway mem-2 "$m2" "$WORK/data-mem-2" --store redis --redis-url "$mem_url"
  pid2=$gw_pid
  wait_index "$m2" "$grown_vectors"
  warm "$m2" $((warmup + entries)) "$warmup"
  wait_index "$m2" $((grown_vectors + warmup))
  full_rss=$(rss "$pid2")
  full_vectors=$(vectors "$m2")
  m3=$(free_port)
  start_gateway mem-3 "$m3" "$WORK/data-mem-3" --store redis --redis-url "redis://127.0.0.1:$mem_redis_port/1"
  pid3=$gw_pid
  warm "$m3" 0 "$warmup"
  wait_index "$m3" "$warmup"
  empty_rss=$(rss "$pid3")
  empty_vectors=$(vectors "$m3")
  mem=$(python3 -c 'import json, sys; k = ["entries", "warmup", "before_rss", "grown_rss", "full_rss", "empty_rss", "before_vectors", "grown_vectors", "full_vectors", "empty_vectors", "before_redis", "after_redis", "warm_s"]; print(json.dumps(dict(zip(k, map(int, sys.argv[1:])))))' \
    "$entries" "$warmup" "$before_rss" "$grown_rss" "$full_rss" "$empty_rss" "$before_vectors" "$grown_vectors" \
    "$full_vectors" "$empty_vectors" "$before_redis" "$after_redis" "$warm_s")
fi

day=$(date -u +%Y-%m-%d)
out=benches/results/$day-replicas.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem_total=$(awk '/^MemTotal:/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
load="load average $load_before at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
python3 - "$WORK/runs.jsonl" "$started" "$(nproc)" "$cpu" "$mem_total" "$rounds" "$requests" "$entries" \
  "$redis_version" "$mem" "$load" <<'PY' | tee "$out"
import json, math, sys
from collections import defaultdict

path, started, cores, cpu, mem_total, rounds, requests, entries, redis_version, mem, load = sys.argv[1:]
runs = [json.loads(l) for l in open(path)]
mem = json.loads(mem)
CONFIGS = ("sled", "redis", "pair")
NAMES = {"sled": "one gateway, sled", "redis": "one gateway, Redis", "pair": "two gateways, one Redis"}


def pct(xs, q):
    """Nearest-rank percentile, as the bench driver computes it."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def f(x, digits=2):
    return "-" if x is None else f"{x:,.{digits}f}"


def samples(run):
    return [json.loads(l) for l in open(run["samples"])]


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"


print(f"# Replicas: one gateway on sled vs one and two on a shared Redis, {started}")
print()
print(f"`benches/replicas.sh --rounds {rounds} --requests {requests} --entries {entries}` on {cores} cores")
print(f"({cpu}, {mem_total}; {load}); release builds; {redis_version} on loopback ports without")
print("persistence (`--save \"\" --appendonly no`). Upstream: `reprise-sim --ttft-ms 50 --itl-ms 2 --tokens 32`.")
print("Every gateway has semantic matching on (all-MiniLM-L6-v2, default settings). Configurations:")
print("**one gateway, sled**: its sled store; **one gateway, Redis**: `--store redis` on a Redis of its own;")
print("**two gateways, one Redis**: two gateways on another Redis, with one driver sending its requests to")
print("them in turn (`reprise-client bench --round-robin`), so the same load is split between two processes.")
print("The driver, the gateways, Redis and the simulator share the machine; times are client-side ms. The")
print("configurations alternate in rounds, in an order rotated from cell to cell, so drift on the machine")
print("falls on all of them.")
print()

# Part 1.
print("## 1. Exact hits")
print()
print("51 prompts cached by the driver's warm-up, then every request an exact hit, closed loop")
print(f"({int(requests) // 4:,} requests per run at concurrency 1, {int(requests):,} at concurrency 8). For the pair,")
print("half of the hits are of entries the other replica stored. TTFT percentiles pooled over the rounds;")
print("requests/s: the mean of the rounds' (each run's successful requests over its wall time), with each")
print("round's in brackets. Ratios: against sled in the same rounds.")
print()
print("| mode | concurrency | configuration | TTFT p50 | p95 | p99 | requests/s (each round) | TTFT p50 vs sled | requests/s vs sled | not hits |")
print("|---|---:|---|---:|---:|---:|---|---:|---:|---:|")
summary = {}
groups = defaultdict(list)
for run in runs:
    if run["part"] == 1:
        groups[(run["label"]["mode"], run["label"]["c"], run["config"])].append(run)
for mode in ("stream", "no-stream"):
    for c in (1, 8):
        cells = {}
        for cfg in CONFIGS:
            rs = sorted(groups.get((mode, c, cfg), []), key=lambda r: r["label"]["round"])
            ss = [s for r in rs for s in samples(r)]
            hits = [s["ttft_ms"] for s in ss if s["error"] is None and s["outcome"] == "hit" and s["ttft_ms"] is not None]
            rps = [r["report"]["targets"][0]["requests_per_s"] for r in rs]
            cells[cfg] = (pct(hits, 0.5), pct(hits, 0.95), pct(hits, 0.99), rps, len(ss) - len(hits))
        summary[(mode, c)] = cells
        for cfg in CONFIGS:
            p50, p95, p99, rps, other = cells[cfg]
            base = cells["sled"]
            print(f"| {mode} | {c} | {NAMES[cfg]} | {f(p50, 3)} | {f(p95, 3)} | {f(p99, 3)} | "
                  f"{f(mean(rps), 0)} ({', '.join(f(x, 0) for x in rps)}) | {ratio(p50, base[0])} | "
                  f"{ratio(mean(rps), mean(base[3]))} | {other} |")

# Part 2.
print()
print("## 2. Semantic hits")
print()
print("The 60 paraphrase groups of `benches/workloads/bank.jsonl`: the first wording of each cached first")
print("(through the pair's first replica; the second learns them from the change feed, and the run waits")
print("until its index holds them), then the other two asked once each (120 requests per run, a namespace")
print("of its own per run). TTFT of the semantic hits, pooled over the rounds; the rest were refused by a")
print("guard or scored below the 0.90 threshold and went upstream.")
print()
print("| concurrency | configuration | semantic hits | TTFT p50 | p95 | p99 | TTFT p50 vs sled |")
print("|---:|---|---:|---:|---:|---:|---:|")
groups = defaultdict(list)
for run in runs:
    if run["part"] == 2:
        groups[(run["label"]["c"], run["config"])].append(run)
for c in (1, 8):
    cells = {}
    for cfg in CONFIGS:
        ss = [s for r in groups.get((c, cfg), []) for s in samples(r) if s["error"] is None]
        sem = [s["ttft_ms"] for s in ss if s["outcome"] == "semantic-hit" and s["ttft_ms"] is not None]
        cells[cfg] = (len(sem), len(ss), pct(sem, 0.5), pct(sem, 0.95), pct(sem, 0.99))
    for cfg in CONFIGS:
        n, total, p50, p95, p99 = cells[cfg]
        print(f"| {c} | {NAMES[cfg]} | {n} of {total} | {f(p50)} | {f(p95)} | {f(p99)} | {ratio(p50, cells['sled'][2])} |")

# Part 3.
print()
print("## 3. Misses, for context")
print()
print("New prompts only, streamed, concurrency 8, each sent to the gateway and straight to the simulator")
print("(`--compare`); a miss embeds the prompt (about 10 ms here) before going upstream. Overhead: gateway")
print("TTFT minus the direct TTFT of the same prompt, pooled over the rounds.")
print()
print("| configuration | misses | TTFT p50 | p95 | p99 | direct TTFT p50 | overhead p50 | overhead p95 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
groups = defaultdict(list)
for run in runs:
    if run["part"] == 3:
        groups[run["config"]].append(run)
for cfg in CONFIGS:
    gw, direct, diffs = [], [], []
    for run in groups.get(cfg, []):
        by = defaultdict(dict)
        for s in samples(run):
            if s["error"] is None and s["ttft_ms"] is not None:
                by[s["index"]][s["target"]] = s
        for pair in by.values():
            if 0 in pair and 1 in pair and pair[0]["outcome"] == "miss":
                gw.append(pair[0]["ttft_ms"])
                direct.append(pair[1]["ttft_ms"])
                diffs.append(pair[0]["ttft_ms"] - pair[1]["ttft_ms"])
    print(f"| {NAMES[cfg]} | {len(gw)} | {f(pct(gw, 0.5))} | {f(pct(gw, 0.95))} | {f(pct(gw, 0.99))} | "
          f"{f(pct(direct, 0.5))} | {f(pct(diffs, 0.5))} | {f(pct(diffs, 0.95))} |")

# Part 4.
if mem:
    n, w = mem["entries"], mem["warmup"]
    # Per vector actually indexed (a batch sent again may have stored some twice).
    added = mem["grown_vectors"] - mem["before_vectors"]
    grown = (mem["grown_rss"] - mem["before_rss"]) * 1024 / added
    fresh = (mem["full_rss"] - mem["empty_rss"]) * 1024 / (mem["full_vectors"] - mem["empty_vectors"])
    redis = (mem["after_redis"] - mem["before_redis"]) / added
    print()
    print("## 4. Memory per replica")
    print()
    print(f"{n:,} generated question/answer pairs (12-word questions, 32-token answers, one namespace) stored")
    print(f"through `POST /admin/entries` in batches of 500 ({mem['warm_s']} s, embedding included), on a Redis of")
    print("their own. Resident set size (`VmRSS`) of the gateway process, every replica measured after")
    print(f"{w} entries of its own so the model's buffers are already allocated. *Warmed*: the replica that")
    print(f"stored them, before and after. *Fresh*: a replica started afterwards on the same Redis (a new data")
    print("folder, so it built its index from the vectors in Redis) against one started on an empty Redis")
    print("database. Redis: `used_memory` before and after.")
    print()
    print("| measure | before / empty (vectors) | after / full (vectors) | per entry | per 100k entries |")
    print("|---|---:|---:|---:|---:|")
    print(f"| replica RSS, warmed | {mem['before_rss'] / 1024:,.0f} MiB ({mem['before_vectors']:,}) | "
          f"{mem['grown_rss'] / 1024:,.0f} MiB ({mem['grown_vectors']:,}) | {grown:,.0f} B | {grown * 1e5 / 2**20:,.0f} MiB |")
    print(f"| replica RSS, fresh | {mem['empty_rss'] / 1024:,.0f} MiB ({mem['empty_vectors']:,}) | "
          f"{mem['full_rss'] / 1024:,.0f} MiB ({mem['full_vectors']:,}) | {fresh:,.0f} B | {fresh * 1e5 / 2**20:,.0f} MiB |")
    print(f"| Redis used_memory | {mem['before_redis'] / 2**20:,.1f} MiB | {mem['after_redis'] / 2**20:,.1f} MiB | "
          f"{redis:,.0f} B | {redis * 1e5 / 2**20:,.0f} MiB |")
    print()
    print("For scale: a 384-dimension f32 vector is 1,536 bytes; the index keeps each one twice (a partition's")
    print("contiguous rows for exact scans, and the HNSW graph's point), plus the graph's links (up to 32 at")
    print("layer 0) and the id maps.")
PY
echo "==> wrote $out" >&2
