#!/usr/bin/env bash
# Embedding queue under load (issue 14): miss TTFT and the share of misses that fell back to exact
# matching, at concurrency 1, 32 and 64 with semantic matching on, for the gateway at an older
# revision (built in a temporary git worktree) and the current tree, in one run. The builds alternate
# cell by cell (old first at odd cells, new first at even ones) so drift on a shared machine falls on
# both. Every cell starts a fresh gateway (fresh data dir) in front of one reprise-sim with a ~20 ms
# TTFT and sends only new prompts (all misses). After each cell the gateway is left idle until every
# entry has a vector (or --idle seconds pass), and says how many have one. Where the build reports it
# (`reprise_embedding_queue_wait_seconds`, `max_queue_wait_ms`), also how long the texts that were
# embedded waited for their model call to start. Writes benches/results/<date>-embed-overload.md.
#
# Usage: benches/embed-overload.sh [--rev REV] [--seconds S] [--reps N] [--idle S]
#   defaults: ef8cd98 (before the bounded queue), 20 s per cell, 1 run per build and concurrency,
#   at most 90 s of idle time for the entries to get their vectors.
# REPRISE_BEFORE_BIN=PATH uses a release `reprise` already built at REV instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."

rev=ef8cd98
secs=20
reps=1
idle=90
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) rev=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
scripts/provision-models.sh >/dev/null
echo "==> release build of the current tree" >&2
cargo build --release --bins --quiet
target_dir=$(scripts/target-dir.sh)
new="$target_dir/release/reprise"
client="$target_dir/release/reprise-client"
sim="$target_dir/release/reprise-sim"

if [ -n "${REPRISE_BEFORE_BIN:-}" ]; then
  old=$REPRISE_BEFORE_BIN
  echo "==> reprise at $rev: $old (prebuilt)" >&2
else
  echo "==> reprise at $rev (a worktree in $WORK)" >&2
  git worktree add --quiet --detach "$WORK/old" "$rev"
  remove_worktree() { git worktree remove --force "$WORK/old" 2>/dev/null || true; procs_cleanup; }
  trap remove_worktree EXIT
  (cd "$WORK/old" && CARGO_TARGET_DIR="$WORK/target" CARGO_INCREMENTAL=0 \
    cargo build --release --quiet -p reprise-server --bin reprise)
  old="$WORK/target/release/reprise"
fi

sim_port=$(free_port)
"$sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 20 --itl-ms 1 --tokens 16 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"

# cell BIN LABEL C: one fresh gateway, one closed-loop run of new prompts, then the idle wait.
# Prints one line of JSON with what the bench and the gateway reported.
cell() {
  local bin=$1 label=$2 c=$3 port data log gw
  port=$(free_port)
  data="$WORK/data-$label-$c-$RANDOM"
  log="$WORK/gateway-$label-$c.log"
  "$bin" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$sim_port"/v1 \
    --data-dir "$data" --semantic true --model-dir models/all-MiniLM-L6-v2 --admin-token bench \
    --ort-lib models/onnxruntime/libonnxruntime.so >"$log" 2>&1 &
  gw=$!
  wait_ready http://127.0.0.1:"$port"/healthz "gateway $label" "$log" 1200
  "$client" bench --url http://127.0.0.1:"$port"/v1 --concurrency "$c" --duration "$secs" \
    --unique-prompts 10000000 --warmup 0 --model "overload-$label-$c" --quiet --json >"$WORK/bench.json"
  local right_after
  right_after=$(curl -sf http://127.0.0.1:"$port"/healthz)
  curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$port"/metrics >"$WORK/metrics.txt" || : >"$WORK/metrics.txt"
  curl -sf -H 'authorization: Bearer bench' http://127.0.0.1:"$port"/admin/stats >"$WORK/stats.json" || echo '{}' >"$WORK/stats.json"
  # Idle: the current tree embeds the entries stored without a vector now.
  local health=$right_after idle_started=$SECONDS idle_s=-1
  for _ in $(seq 1 "$((idle * 2))"); do
    # A gateway that stopped answering ends the wait with what it said last (its log is copied to $TMPDIR).
    health=$(curl -sf http://127.0.0.1:"$port"/healthz) || { cp "$log" "${TMPDIR:-/tmp}/" 2>/dev/null; health=$right_after; break; }
    if python3 -c 'import json, sys; h = json.loads(sys.argv[1]); sys.exit(0 if h["semantic"]["vectors"] >= h["entries"] else 1)' "$health"; then
      idle_s=$((SECONDS - idle_started))
      break
    fi
    sleep 0.5
  done
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  python3 - "$label" "$c" "$WORK/bench.json" "$right_after" "$health" "$idle_s" "$WORK/metrics.txt" "$WORK/stats.json" <<'PY'
import json, re, sys
label, c, bench, after, idle = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3])), json.loads(sys.argv[4]), json.loads(sys.argv[5])
idle_s = int(sys.argv[6])
# Queue wait of the texts that reached the model (during the load; the backfill's own calls have no
# deadline and are not counted): how many, how many within 5 ms, the bucket holding the p99, the max.
buckets = []
for line in open(sys.argv[7]):
    m = re.match(r'reprise_embedding_queue_wait_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
    if m:
        buckets.append((float(m.group(1)), float(m.group(2))))
wait = None
if buckets:
    total = buckets[-1][1]
    within_5ms = next((n for le, n in buckets if le == 0.005), 0)
    p99 = next((le for le, n in buckets if n >= 0.99 * total), None) if total else None
    stats = json.load(open(sys.argv[8]))
    wait = {"texts": int(total), "within_5ms": int(within_5ms), "p99_le_ms": None if p99 is None else p99 * 1e3,
            "max_ms": (stats.get("embedding") or {}).get("max_queue_wait_ms")}
t = bench["targets"][0]
miss = t["by_outcome"].get("miss", {})
ttft = miss.get("ttft_ms") or {}
sem = after["semantic"]
print(json.dumps({
    "build": label, "c": c, "misses": miss.get("count", 0), "errors": t["errors"],
    "ttft_p50": ttft.get("p50"), "ttft_p99": ttft.get("p99"),
    "fallbacks": sem["fallbacks"], "reasons": sem.get("fallback_reasons"),
    "entries": idle["entries"], "vectors": idle["semantic"]["vectors"],
    "all_vectors_after_s": None if idle_s < 0 else idle_s, "queue_wait": wait,
}))
PY
}

results="$WORK/results.jsonl"
i=0
for c in 1 32 64; do
  for _ in $(seq 1 "$reps"); do
    i=$((i + 1))
    if [ $((i % 2)) = 1 ]; then order=(old new); else order=(new old); fi
    for label in "${order[@]}"; do
      bin=$new
      [ "$label" = old ] && bin=$old
      echo "==> concurrency $c, $label" >&2
      cell "$bin" "$label" "$c" | tee -a "$results" >&2
    done
  done
done

day=$(date -u +%Y-%m-%d)
out=benches/results/$day-embed-overload.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$results" "$rev" "$secs" "$reps" "$(nproc)" "$cpu" "$(date -u +%Y-%m-%dT%H:%MZ)" "$idle" <<'PY' | tee "$out"
import json, sys
path, rev, secs, reps, cores, cpu, when, idle = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
print(f"# Embedding queue under load, {when}")
print()
print(f"`benches/embed-overload.sh --rev {rev} --seconds {secs} --reps {reps} --idle {idle}` on {cores} cores ({cpu}).")
print("A fresh gateway per cell (release build, semantic matching on, all-MiniLM-L6-v2, default")
print("250 ms embed deadline and batch of 16) in front of `reprise-sim --ttft-ms 20 --itl-ms 1")
print(f"--tokens 16`; `reprise-client bench` sends only new prompts (every request a miss), closed loop,")
print(f"{secs} s per cell; builds alternate cell by cell. Fallback: a miss that skipped semantic matching")
print("(overload: refused at once; deadline: waited the whole deadline). Vectors: entries with a vector")
print(f"once the gateway sat idle until all had one or {idle} s passed (and how long that took).")
print()
print("Queue wait: texts that reached the model during the load, how many of them waited at most 5 ms")
print("between their call and the start of their model call, the histogram bucket holding the p99, and")
print("the longest (`-`: the build does not measure it).")
print()
print("| concurrency | build | misses | miss TTFT p50 ms | miss TTFT p99 ms | fallbacks | by reason | queue wait | entries with a vector |")
print("|---:|---|---:|---:|---:|---:|---|---|---:|")
for r in rows:
    name = rev if r["build"] == "old" else "current"
    share = 100 * r["fallbacks"] / r["misses"] if r["misses"] else 0
    reasons = r["reasons"]
    why = ", ".join(f"{k} {v}" for k, v in reasons.items() if v) if reasons else "(not reported)"
    f = lambda x: "-" if x is None else f"{x:.1f}"
    took = r.get("all_vectors_after_s")
    when_all = f" (all after {took} s idle)" if took is not None else ""
    w = r.get("queue_wait")
    if w and w["texts"]:
        p99 = "-" if w["p99_le_ms"] is None else f"{w['p99_le_ms']:g}"
        top = "-" if w["max_ms"] is None else f"{w['max_ms']:.1f}"
        queue = f"{w['within_5ms']} of {w['texts']} within 5 ms; p99 ≤ {p99} ms; max {top} ms"
    elif w:
        queue = "no text embedded"
    else:
        queue = "-"
    print(f"| {r['c']} | {name} | {r['misses']} | {f(r['ttft_p50'])} | {f(r['ttft_p99'])} | {r['fallbacks']} ({share:.0f}%) | {why or '-'} | {queue} | {r['vectors']} of {r['entries']}{when_all} |")
PY
echo "==> wrote $out" >&2
