#!/usr/bin/env bash
# Semantic matching under load (issue 24, point 4): at concurrency 8, 32 and 64 in front of a fast
# simulator, and at concurrency 8 in front of the simulator's cloud-GPU profile (~400 ms TTFT), the
# share of misses that skipped semantic matching because the embedding queue refused them
# (`overload`) and the share of paraphrases served, for two builds of the gateway, in one run. The
# builds alternate cell by cell (before first at odd cells, after first at even ones) so drift on a
# shared machine falls on both. Every cell starts a fresh gateway (fresh data dir, default settings,
# semantic matching on) and runs `reprise-client bench --generate --distinct N --paraphrase-share 0.2`
# closed loop. The skips are read from the gateway's own counter (`/healthz`
# `semantic.fallback_reasons.overload`, which both builds report), the paraphrases from the bench's
# outcome by construction. Writes benches/results/<date>-admission.md.
#
# Usage: benches/admission.sh --before DIR --after DIR [--seconds S] [--distinct N]
#                             [--concurrency "8 32 64"] [--cloud-concurrency C] [--reps N]
#   DIR holds reprise, reprise-sim and reprise-client (e.g. target/release). Both builds are driven
#   by the after build's reprise-client and reprise-sim, so only the gateway differs.
#   Defaults: 30 s per cell, 3000 distinct questions, concurrency 8 32 64, cloud-GPU cell at 8, 1 rep.
set -euo pipefail
cd "$(dirname "$0")/.."

before=
after=
secs=30
distinct=3000
concurrencies="8 32 64"
cloud_c=8
reps=1
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --distinct) distinct=$2; shift 2 ;;
    --concurrency) concurrencies=$2; shift 2 ;;
    --cloud-concurrency) cloud_c=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [ -z "$before" ] || [ -z "$after" ]; then
  echo "usage: benches/admission.sh --before DIR --after DIR [--seconds S] [--distinct N] [--concurrency \"8 32 64\"] [--cloud-concurrency C] [--reps N]" >&2
  exit 2
fi
for dir in "$before" "$after"; do
  for bin in reprise reprise-sim reprise-client; do
    [ -x "$dir/$bin" ] || { echo "$dir/$bin: not an executable (build it first)" >&2; exit 2; }
  done
done
before=$(cd "$before" && pwd)
after=$(cd "$after" && pwd)

. scripts/lib-procs.sh
scripts/provision-models.sh >/dev/null
client="$after/reprise-client"
sim="$after/reprise-sim"

fast_port=$(free_port)
"$sim" --listen 127.0.0.1:"$fast_port" --ttft-ms 20 --itl-ms 1 --tokens 16 >"$WORK/sim-fast.log" 2>&1 &
PIDS+=($!)
cloud_port=$(free_port)
"$sim" --listen 127.0.0.1:"$cloud_port" --profile cloud-gpu >"$WORK/sim-cloud.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$fast_port"/healthz "reprise-sim (fast)" "$WORK/sim-fast.log"
wait_ready http://127.0.0.1:"$cloud_port"/healthz "reprise-sim (cloud-gpu)" "$WORK/sim-cloud.log"

# cell LABEL UPSTREAM_NAME UPSTREAM_PORT C: one fresh gateway of build LABEL, one closed-loop run.
# Prints one line of JSON with what the bench and the gateway reported.
cell() {
  local label=$1 upstream=$2 up_port=$3 c=$4 bin port data log gw
  bin="$before/reprise"
  [ "$label" = after ] && bin="$after/reprise"
  port=$(free_port)
  data="$WORK/data-$label-$upstream-$c-$RANDOM"
  log="$WORK/gateway-$label-$upstream-$c.log"
  "$bin" serve --listen 127.0.0.1:"$port" --upstream-url http://127.0.0.1:"$up_port"/v1 \
    --data-dir "$data" --semantic true --model-dir models/all-MiniLM-L6-v2 --admin-token bench \
    --ort-lib models/onnxruntime/libonnxruntime.so >"$log" 2>&1 &
  gw=$!
  wait_ready http://127.0.0.1:"$port"/healthz "gateway $label" "$log" 2400
  "$client" bench --url http://127.0.0.1:"$port"/v1 --concurrency "$c" --duration "$secs" \
    --generate --distinct "$distinct" --paraphrase-share 0.2 --seed 24 --warmup 0 \
    --model "admission-$upstream" --quiet --json >"$WORK/bench.json"
  curl -sf http://127.0.0.1:"$port"/healthz >"$WORK/health.json"
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  python3 - "$label" "$upstream" "$c" "$WORK/bench.json" "$WORK/health.json" <<'PY'
import json, sys
label, upstream, c = sys.argv[1], sys.argv[2], int(sys.argv[3])
bench, health = json.load(open(sys.argv[4])), json.load(open(sys.argv[5]))
t = bench["targets"][0]
outcomes = t["outcomes"]
para = t["by_construction"].get("paraphrase", {})
sem = health.get("semantic") or {}
reasons = sem.get("fallback_reasons") or {}
print(json.dumps({
    "build": label, "upstream": upstream, "c": c,
    "requests": sum(outcomes.values()), "errors": t["errors"], "rps": t["requests_per_s"],
    "misses": outcomes.get("miss", 0),
    "overload": reasons.get("overload", 0), "deadline": reasons.get("deadline", 0),
    "paraphrases": sum(para.values()), "paraphrases_served": para.get("semantic-hit", 0) + para.get("hit", 0),
    # The after build's responses say it themselves (x-reprise-semantic); the before build's do not.
    "skipped_header": sum((t.get("semantic_skipped") or {}).values()) if label == "after" else None,
}))
PY
}

results="$WORK/results.jsonl"
cells=()
for c in $concurrencies; do cells+=("fast:$fast_port:$c"); done
cells+=("cloud-gpu:$cloud_port:$cloud_c")
i=0
for spec in "${cells[@]}"; do
  IFS=: read -r upstream up_port c <<<"$spec"
  for _ in $(seq 1 "$reps"); do
    i=$((i + 1))
    if [ $((i % 2)) = 1 ]; then order=(before after); else order=(after before); fi
    for label in "${order[@]}"; do
      echo "==> $upstream upstream, concurrency $c, $label" >&2
      cell "$label" "$upstream" "$up_port" "$c" | tee -a "$results" >&2
    done
  done
done

day=$(date -u +%Y-%m-%d)
out=benches/results/$day-admission.md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$results" "$before" "$after" "$secs" "$distinct" "$reps" "$(nproc)" "$cpu" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$out"
import json, sys
path, before, after, secs, distinct, reps, cores, cpu, when, load = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
print(f"# Semantic matching under load (admission), {when}")
print()
print(f"`benches/admission.sh --before {before} --after {after} --seconds {secs} --distinct {distinct} --reps {reps}`")
print(f"on {cores} cores ({cpu}); load average at the end {load}.")
print("A fresh gateway per cell with the default settings (semantic matching on, all-MiniLM-L6-v2);")
print(f"`reprise-client bench --generate --distinct {distinct} --paraphrase-share 0.2`, closed loop, {secs} s per")
print("cell, builds alternating cell by cell. Upstream `fast`: `reprise-sim --ttft-ms 20 --itl-ms 1 --tokens 16`;")
print("`cloud-gpu`: `reprise-sim --profile cloud-gpu` (~400 ms TTFT, ~120 tokens/s). Overload skips: misses the")
print("embedding queue refused at once (the gateway's `fallback_reasons.overload`), over all misses; deadline")
print("skips: texts admitted that still missed the embed deadline.")
print("Paraphrases served: requests constructed as a paraphrase of an earlier question that were answered")
print("from the cache. Header: responses of the after build carrying `x-reprise-semantic: skipped` (any reason).")
print()
print("| upstream | concurrency | build | requests/s | misses | overload skips | deadline skips | paraphrases served | header |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    share = 100 * r["overload"] / r["misses"] if r["misses"] else 0.0
    served = 100 * r["paraphrases_served"] / r["paraphrases"] if r["paraphrases"] else 0.0
    head = "-" if r["skipped_header"] is None else str(r["skipped_header"])
    err = f" ({r['errors']} errors)" if r["errors"] else ""
    print(f"| {r['upstream']} | {r['c']} | {r['build']} | {r['rps']:.1f}{err} | {r['misses']} | "
          f"{r['overload']} ({share:.1f}%) | {r['deadline']} | {r['paraphrases_served']} of {r['paraphrases']} ({served:.1f}%) | {head} |")
PY
echo "==> wrote $out" >&2
