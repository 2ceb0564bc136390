#!/usr/bin/env bash
# What `semantic_overlap` saves and costs (issue 12 point 4), measured side by side in one run:
#   1. miss TTFT overhead (gateway minus the same prompt sent straight to the upstream, paired) of an
#      exact-only gateway, a semantic gateway that embeds before going upstream (overlap off) and
#      one that races the embedding against the upstream request (overlap on); new prompts only
#      (every request a miss), streamed and not, concurrency 1 and 8, at two upstream TTFTs;
#   2. what the race costs: paraphrase workloads with overlap off and on (semantic-hit rate, hits
#      that won the race, upstream requests sent per semantic hit, vectors left to the backfill);
#   3. exact hits on the same three gateways (semantic matching should not touch them).
# The configurations alternate in rounds (rotated order per cell), so drift on a shared machine
# falls on all of them. Writes benches/results/<date>-overlap.md.
#
# Usage: benches/overlap.sh [--rounds N] [--requests N] [--cloud-requests N] [--para-rounds N]
#   defaults: 3 rounds; per configuration, round and cell, 100 requests at concurrency 1 against the
#   50 ms upstream (200 at concurrency 8), 30 against the cloud-GPU one (90 at concurrency 8);
#   2 rounds of the paraphrase workloads.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
requests=100
cloud_requests=30
para_rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --cloud-requests) cloud_requests=$2; shift 2 ;;
    --para-rounds) para_rounds=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
scripts/provision-models.sh >/dev/null
echo "==> release build" >&2
cargo build --release --bins --quiet
target_dir=$(scripts/target-dir.sh)
bin="$target_dir/release"

# Two upstreams, no jitter (whatever differs between gateway and direct is the gateway): the
# simulator's default 50 ms TTFT, where the embedding is a large share, and the cloud-GPU profile
# (~400 ms plus prefill). 16 tokens per answer keep the run short; TTFT does not depend on it.
declare -A sim_port gw_port
profiles=(fast cloud)
configs=(exact off on)
sim_flags_fast=(--ttft-ms 50 --itl-ms 2 --tokens 16)
sim_flags_cloud=(--profile cloud-gpu --tokens 16)
for p in "${profiles[@]}"; do
  port=$(free_port)
  sim_port[$p]=$port
  flags_var="sim_flags_${p}[@]"
  "$bin/reprise-sim" --listen 127.0.0.1:"$port" "${!flags_var}" >"$WORK/sim-$p.log" 2>&1 &
  PIDS+=($!)
  wait_ready http://127.0.0.1:"$port"/healthz "simulator $p" "$WORK/sim-$p.log"
done
# Three gateways per upstream: exact-only, semantic with overlap off, semantic with overlap on.
for p in "${profiles[@]}"; do
  for cfg in "${configs[@]}"; do
    port=$(free_port)
    gw_port[$p-$cfg]=$port
    case $cfg in
      exact) mode=(--semantic false) ;;
      off) mode=(--semantic true --semantic-overlap false) ;;
      on) mode=(--semantic true --semantic-overlap true) ;;
    esac
    "$bin/reprise" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"${sim_port[$p]}"/v1 \
      --data-dir "$WORK/data-$p-$cfg" "${mode[@]}" --admin-token bench \
      --model-dir models/all-MiniLM-L6-v2 --ort-lib models/onnxruntime/libonnxruntime.so \
      >"$WORK/gateway-$p-$cfg.log" 2>&1 &
    PIDS+=($!)
    wait_ready http://127.0.0.1:"$port"/healthz "gateway $p-$cfg" "$WORK/gateway-$p-$cfg.log" 1200
    # A semantic gateway that could not load the model serves exact-only: its numbers would lie.
    if [ "$cfg" != exact ] && ! curl -sf http://127.0.0.1:"$port"/healthz | grep -q '"mode":"semantic"'; then
      echo "gateway $p-$cfg runs without semantic matching: $(curl -sf http://127.0.0.1:"$port"/healthz)" >&2
      exit 1
    fi
  done
done

# snap P CFG: the counters a run is judged by, as one JSON object (gateway stats and simulator).
snap() {
  local gw sim
  gw=$(curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"${gw_port[$1-$2]}"/admin/stats)
  sim=$(curl -sf http://127.0.0.1:"${sim_port[$1]}"/stats)
  python3 -c '
import json, sys
gw, sim = json.loads(sys.argv[1]), json.loads(sys.argv[2])
e = gw.get("embedding") or {}
print(json.dumps({"requests": gw["requests"], "overlap": gw["semantic_overlap"],
                  "fallbacks": e.get("fallbacks", 0), "backfilled": (e.get("backfill") or {}).get("embedded", 0),
                  "upstream": sim["requests"]}))' "$gw" "$sim"
}

# settle P CFG: waits until the gateway has embedded every entry it stored without a vector (at
# most 90 s), so its backfill does not run during the next configuration's measurement.
settle() {
  local port=${gw_port[$1-$2]}
  [ "$2" = exact ] && return 0
  for _ in $(seq 1 180); do
    curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$port"/admin/stats | python3 -c '
import json, sys
e = json.load(sys.stdin)["embedding"]
sys.exit(0 if e["backfill"]["pending"] == 0 and e["queued"] == 0 else 1)' && return 0
    sleep 0.5
  done
  echo "gateway $1-$2: backfill still pending after 90 s" >&2
}

# run PART LABEL P CFG BENCH_FLAGS...: one bench run against a gateway; appends a record (the
# counters before and after, the bench's JSON report and its samples file) to $WORK/runs.jsonl.
n=0
run() {
  local part=$1 label=$2 p=$3 cfg=$4
  shift 4
  n=$((n + 1))
  local samples="$WORK/samples-$n.jsonl" before after
  before=$(snap "$p" "$cfg")
  "$bin/reprise-client" bench --url http://127.0.0.1:"${gw_port[$p-$cfg]}"/v1 --quiet --json \
    --samples "$samples" --model "overlap-$n" "$@" >"$WORK/report-$n.json" 2>"$WORK/bench-$n.log" || {
    echo "bench run $n ($label $p $cfg) failed:" >&2
    cat "$WORK/bench-$n.log" >&2
    exit 1
  }
  settle "$p" "$cfg"
  after=$(snap "$p" "$cfg")
  python3 -c '
import json, sys
part, label, p, cfg, before, after, report, samples = sys.argv[1:]
print(json.dumps({"part": int(part), "label": json.loads(label), "profile": p, "config": cfg,
                  "before": json.loads(before), "after": json.loads(after),
                  "report": json.load(open(report)), "samples": samples}))' \
    "$part" "$label" "$p" "$cfg" "$before" "$after" "$WORK/report-$n.json" "$samples" >>"$WORK/runs.jsonl"
  echo "    $part $label $p $cfg done" >&2
}

# rotated K: the configurations in an order that moves by one from cell to cell.
rotated() {
  local k=$1 list=("${@:2}") out=() i
  for i in $(seq 0 $((${#list[@]} - 1))); do out+=("${list[$(((i + k) % ${#list[@]}))]}"); done
  echo "${out[@]}"
}

started=$(date -u +%Y-%m-%dT%H:%MZ)
cell=0
echo "==> 1. miss overhead, $rounds rounds" >&2
for r in $(seq 1 "$rounds"); do
  for p in "${profiles[@]}"; do
    for mode in stream no-stream; do
      for c in 1 8; do
        cell=$((cell + 1))
        per=$requests
        [ "$p" = cloud ] && per=$cloud_requests
        # Concurrency 8: twice as many at 50 ms, three times as many at ~400 ms.
        if [ "$c" = 8 ]; then
          if [ "$p" = cloud ]; then per=$((per * 3)); else per=$((per * 2)); fi
        fi
        flags=(--compare http://127.0.0.1:"${sim_port[$p]}"/v1 --requests "$per" --concurrency "$c" --warmup 5)
        [ "$mode" = no-stream ] && flags+=(--no-stream)
        for cfg in $(rotated "$cell" "${configs[@]}"); do
          run 1 "{\"round\": $r, \"mode\": \"$mode\", \"c\": $c}" "$p" "$cfg" "${flags[@]}"
        done
      done
    done
  done
done

echo "==> 2. paraphrase workloads, overlap off vs on, $para_rounds rounds" >&2
for r in $(seq 1 "$para_rounds"); do
  for p in "${profiles[@]}"; do
    cell=$((cell + 1))
    for cfg in $(rotated "$cell" off on); do
      # 30 questions, then a paraphrase of each, one at a time.
      run 2 "{\"round\": $r, \"workload\": \"paraphrases\"}" "$p" "$cfg" \
        --prompts-file benches/workloads/paraphrases.txt --requests 60 --concurrency 1 --warmup 0
    done
    for cfg in $(rotated "$cell" off on); do
      # The generated mix of benches/run.sh section 5 (same seed: the same requests in the same
      # order for both), closed loop at concurrency 4.
      run 2 "{\"round\": $r, \"workload\": \"mix\"}" "$p" "$cfg" --generate --repeat-share 0.3 \
        --paraphrase-share 0.2 --zipf-s 1.0 --requests 200 --concurrency 4 --warmup 0 --seed 42
    done
  done
done

echo "==> 3. exact hits, $rounds rounds" >&2
for r in $(seq 1 "$rounds"); do
  for mode in stream no-stream; do
    for c in 1 8; do
      cell=$((cell + 1))
      flags=(--unique-prompts 50 --warmup 50 --requests $((c == 1 ? 500 : 2000)) --concurrency "$c")
      [ "$mode" = no-stream ] && flags+=(--no-stream)
      for cfg in $(rotated "$cell" "${configs[@]}"); do
        run 3 "{\"round\": $r, \"mode\": \"$mode\", \"c\": $c}" fast "$cfg" "${flags[@]}"
      done
    done
  done
done

day=$(date -u +%Y-%m-%d)
out=benches/results/$day-overlap.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$WORK/runs.jsonl" "$started" "$(nproc)" "$cpu" "$rounds" "$requests" "$cloud_requests" "$para_rounds" \
  <<'PY' | tee "$out"
import json, math, sys
from collections import defaultdict

path, started, cores, cpu, rounds, requests, cloud_requests, para_rounds = sys.argv[1:]
runs = [json.loads(l) for l in open(path)]
NAMES = {"exact": "exact-only", "off": "semantic, overlap off", "on": "semantic, overlap on"}
PROFILES = {"fast": "50 ms TTFT", "cloud": "cloud-GPU (~400 ms TTFT)"}


def pct(xs, q):
    """Nearest-rank percentile, as the bench driver computes it."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def f(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def samples(run):
    return [json.loads(l) for l in open(run["samples"])]


def delta(run, *keys):
    a, b = run["after"], run["before"]
    for k in keys:
        a, b = a[k], b[k]
    return a - b


print(f"# Semantic overlap: miss overhead and what the race costs, {started}")
print()
print(f"`benches/overlap.sh --rounds {rounds} --requests {requests} --cloud-requests {cloud_requests} "
      f"--para-rounds {para_rounds}` on {cores} cores ({cpu}); release builds, all-MiniLM-L6-v2, default")
print("embedding settings (batch 16, 2 ms batch wait, 5 ms queue budget, 250 ms deadline). Client, six")
print("gateways and two simulators share the machine and talk over loopback; times are client-side ms.")
print("Upstreams: `reprise-sim --ttft-ms 50 --itl-ms 2 --tokens 16` and `reprise-sim --profile cloud-gpu")
print("--tokens 16`, no jitter. Three gateways in front of each: exact-only (`--semantic false`), semantic")
print("matching with `--semantic-overlap false` (embed and search, then go upstream) and with `true` (go")
print("upstream at once, search meanwhile). The configurations alternate in rounds, in an order rotated")
print("from cell to cell; a semantic gateway's backfill is let finish before the next run starts.")
print()

# Part 1.
print("## 1. Miss TTFT overhead")
print()
print("Every prompt is new (all misses) and is sent to the gateway and straight to its simulator, back")
print("to back in alternating order (`reprise-client bench --compare`). Overhead: gateway TTFT minus the")
print("direct TTFT of the same prompt (paired), pooled over the rounds. Skipped: misses whose embedding")
print("the bounded queue refused or that missed their deadline (they went upstream without semantic")
print("matching, see the README's *Bounded queue*), as a share of the semantic gateway's requests.")
print("Non-streamed TTFT is the whole answer's time.")
cells = defaultdict(list)
for run in runs:
    if run["part"] == 1:
        l = run["label"]
        cells[(run["profile"], l["mode"], l["c"], run["config"])].append(run)
summary = {}
for p in ("fast", "cloud"):
    print()
    print(f"### Upstream: {PROFILES[p]}")
    print()
    print("| mode | concurrency | gateway | requests | overhead p50 | overhead p99 | gateway TTFT p50 / p99 | direct TTFT p50 / p99 | not misses | skipped semantic |")
    print("|---|---:|---|---:|---:|---:|---|---|---:|---:|")
    for mode in ("stream", "no-stream"):
        for c in (1, 8):
            for cfg in ("exact", "off", "on"):
                rs = cells.get((p, mode, c, cfg), [])
                if not rs:
                    continue
                diffs, gw, direct, other = [], [], [], 0
                for run in rs:
                    by = defaultdict(dict)
                    for s in samples(run):
                        if s["error"] is None and s["ttft_ms"] is not None:
                            by[s["index"]][s["target"]] = s
                    for pair in by.values():
                        if 0 in pair and 1 in pair:
                            diffs.append(pair[0]["ttft_ms"] - pair[1]["ttft_ms"])
                            gw.append(pair[0]["ttft_ms"])
                            direct.append(pair[1]["ttft_ms"])
                            other += pair[0]["outcome"] != "miss"
                skipped = sum(delta(r, "fallbacks") for r in rs)
                sent = sum(r["report"]["targets"][0]["requests"] for r in rs)
                skip = "-" if cfg == "exact" else f"{100 * skipped / max(1, sent):.0f}%"
                row = (pct(diffs, 0.5), pct(diffs, 0.99))
                summary[(p, mode, c, cfg)] = row
                print(f"| {mode} | {c} | {NAMES[cfg]} | {len(diffs)} | {f(row[0], 2)} | {f(row[1], 2)} | "
                      f"{f(pct(gw, 0.5))} / {f(pct(gw, 0.99))} | {f(pct(direct, 0.5))} / {f(pct(direct, 0.99))} | {other} | {skip} |")

print()
print("Overhead saved by the overlap (overlap off minus overlap on, ms):")
print()
print("| upstream | mode | concurrency | p50 saved | p99 saved | overlap on vs exact-only, p50 |")
print("|---|---|---:|---:|---:|---:|")
for p in ("fast", "cloud"):
    for mode in ("stream", "no-stream"):
        for c in (1, 8):
            off, on, ex = (summary.get((p, mode, c, k)) for k in ("off", "on", "exact"))
            if not (off and on and ex):
                continue
            print(f"| {PROFILES[p]} | {mode} | {c} | {f(off[0] - on[0], 2)} | {f(off[1] - on[1], 2)} | {f(on[0] - ex[0], 2)} |")

# Part 2.
print()
print("## 2. What the race costs: paraphrase workloads")
print()
print("`paraphrases`: benches/workloads/paraphrases.txt (30 questions, then a paraphrase of each),")
print("concurrency 1. `mix`: the generated workload of benches/run.sh section 5 (seed 42: 30% verbatim")
print("repeats, 20% paraphrases, the rest new), 200 requests, closed loop at concurrency 4; the same")
print("requests for both settings. Summed over the rounds. Semantic hits: all requests served by similarity;")
print("paraphrases served: of the requests built as paraphrases, any cache answer. Won the race: semantic hits found while the upstream")
print("request was in flight, which was then cancelled (`/admin/stats` `semantic_overlap.semantic_first`);")
print("the rest came from the alias memory (a paraphrase served before), which is checked before anything")
print("goes upstream. Extra upstream requests: requests the simulator received beyond the misses whose")
print("answer was relayed, i.e. the cancelled ones that had already reached it. Backfilled: entries")
print("stored without their vector and given it later.")
print()
print("| upstream | workload | overlap | requests | semantic hits | paraphrases served | won the race | upstream requests (misses relayed) | extra upstream per semantic hit | semantic-hit TTFT p50 | miss TTFT p50 | backfilled |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
groups = defaultdict(list)
for run in runs:
    if run["part"] == 2:
        groups[(run["profile"], run["label"]["workload"], run["config"])].append(run)
for p in ("fast", "cloud"):
    for w in ("paraphrases", "mix"):
        for cfg in ("off", "on"):
            rs = groups.get((p, w, cfg), [])
            if not rs:
                continue
            ss = [s for r in rs for s in samples(r) if s["error"] is None]
            sem = [s for s in ss if s["outcome"] == "semantic-hit"]
            misses = sum(1 for s in ss if s["outcome"] == "miss")
            upstream = sum(delta(r, "upstream") for r in rs)
            won = sum(delta(r, "overlap", "semantic_first") for r in rs)
            backfilled = sum(delta(r, "backfilled") for r in rs)
            if w == "paraphrases":
                paras = [s for s in ss if s["index"] >= 30]
            else:
                paras = [s for s in ss if s["kind"] == "paraphrase"]
            served = sum(1 for s in paras if s["outcome"] in ("semantic-hit", "hit", "coalesced"))
            extra = upstream - misses
            per = f"{extra / len(sem):.2f}" if sem else "-"
            ttft = lambda xs: f(pct([s["ttft_ms"] for s in xs if s["ttft_ms"] is not None], 0.5))
            print(f"| {PROFILES[p]} | {w} | {cfg} | {len(ss)} | {len(sem)} | {served} of {len(paras)} | {won} | "
                  f"{upstream} ({misses}) | {per} | {ttft(sem)} | {ttft([s for s in ss if s['outcome'] == 'miss'])} | {backfilled} |")

# Part 3.
print()
print("## 3. Exact hits")
print()
print("50 prompts cached by the warm-up, then every request an exact hit (upstream: 50 ms). TTFT p50 /")
print("p99, pooled over the rounds.")
print()
print("| mode | concurrency | " + " | ".join(NAMES[c] for c in ("exact", "off", "on")) + " |")
print("|---|---:|---|---|---|")
hits = defaultdict(list)
for run in runs:
    if run["part"] == 3:
        hits[(run["label"]["mode"], run["label"]["c"], run["config"])].append(run)
for mode in ("stream", "no-stream"):
    for c in (1, 8):
        cols = []
        for cfg in ("exact", "off", "on"):
            ts = [s["ttft_ms"] for r in hits.get((mode, c, cfg), []) for s in samples(r)
                  if s["error"] is None and s["outcome"] == "hit" and s["ttft_ms"] is not None]
            total = sum(r["report"]["targets"][0]["requests"] for r in hits.get((mode, c, cfg), []))
            cols.append(f"{f(pct(ts, 0.5), 3)} / {f(pct(ts, 0.99), 3)} ({len(ts)} of {total} hits)")
        print(f"| {mode} | {c} | " + " | ".join(cols) + " |")
PY
echo "==> wrote $out" >&2
