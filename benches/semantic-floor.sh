#!/usr/bin/env bash
# Semantic hits at the embedding floor (issue 22, point 4): the streamed semantic hit's TTFT, end to
# end, for two builds of the gateway (or one build with two model directories) in one run, at concurrency 1 and 8, and what the embedding
# stage does meanwhile (texts per model call, model-call time, texts per second). The workload is
# `reprise-client bench --pairs` over the 30 question/paraphrase pairs of
# benches/workloads/paraphrases.txt: every question is stored, then every paraphrase asked
# `--rounds` times with `Cache-Control: no-store`, so each ask is embedded and searched (no alias
# memory, no exact repeat) and the ones at or above the threshold are semantic hits. Both gateways
# stand in front of one reprise-sim (50 ms TTFT) with default settings; the builds alternate run
# by run (before first in odd reps, after first in even ones) so drift on a shared machine falls on
# both. TTFT and the gateway's own phases per hit come from `--samples`; embedding counters from
# `/admin/stats` before and after each run. Writes benches/results/<date>-semantic-floor-ab.md.
#
# Usage: benches/semantic-floor.sh --before DIR --after DIR [--before-models M --after-models M]
#                                  [--before-flags "FLAGS" --after-flags "FLAGS"]
#                                  [--rounds N] [--reps N] [--concurrency "1 8"]
#   DIR holds reprise, reprise-sim and reprise-client (e.g. target/release of each revision). Both
#   gateways are driven by the after build's client and simulator, so only the gateway differs.
#   M is a models directory as scripts/provision-models.sh lays it out (all-MiniLM-L6-v2/ and
#   onnxruntime/): each gateway runs the model in its own, so one build (the same DIR twice) compares
#   two models; given, they are used as they are (not provisioned). Without them both gateways run
#   ./models, provisioned first. FLAGS are extra `reprise serve` flags of one side (split on
#   spaces), so one build compares two settings, e.g. --before-flags "" --after-flags "--embed-threads 2".
#   Defaults: 10 rounds (300 asks a run), 3 reps, concurrency 1 and 8.
set -euo pipefail
cd "$(dirname "$0")/.."

before=
after=
rounds=10
reps=3
concurrencies="1 8"
before_models=
after_models=
before_flags=
after_flags=
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --before-models) before_models=$2; shift 2 ;;
    --after-models) after_models=$2; shift 2 ;;
    --before-flags) before_flags=$2; shift 2 ;;
    --after-flags) after_flags=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --concurrency) concurrencies=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [ -z "$before" ] || [ -z "$after" ]; then
  echo "usage: benches/semantic-floor.sh --before DIR --after DIR [--rounds N] [--reps N] [--concurrency \"1 8\"]" >&2
  exit 2
fi
for dir in "$before" "$after"; do
  for bin in reprise reprise-sim reprise-client; do
    [ -x "$dir/$bin" ] || { echo "$dir/$bin: not an executable (build it first)" >&2; exit 2; }
  done
done
before=$(cd "$before" && pwd)
after=$(cd "$after" && pwd)
if [ -n "$before_models$after_models" ]; then
  if [ -z "$before_models" ] || [ -z "$after_models" ]; then
    echo "--before-models and --after-models go together" >&2
    exit 2
  fi
  for dir in "$before_models" "$after_models"; do
    [ -f "$dir/all-MiniLM-L6-v2/model.onnx" ] && [ -e "$dir/onnxruntime/libonnxruntime.so" ] \
      || { echo "$dir: not a provisioned models directory (scripts/provision-models.sh $dir)" >&2; exit 2; }
  done
else
  scripts/provision-models.sh >/dev/null
  before_models=models after_models=models
fi
before_models=$(cd "$before_models" && pwd)
after_models=$(cd "$after_models" && pwd)
declare -A models=([before]=$before_models [after]=$after_models)
declare -A flags=([before]=$before_flags [after]=$after_flags)

. scripts/lib-procs.sh
client="$after/reprise-client"
token=semantic-floor

paraphrase_pairs "$WORK/pairs.jsonl"

sim_port=$(free_port)
"$after/reprise-sim" --listen 127.0.0.1:"$sim_port" --ttft-ms 50 --itl-ms 2 --tokens 32 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:"$sim_port"/healthz reprise-sim "$WORK/sim.log"
declare -A port
for side in before after; do
  port[$side]=$(free_port)
  bin=$before/reprise
  [ "$side" = after ] && bin=$after/reprise
  REPRISE_ADMIN_TOKEN=$token "$bin" serve --listen 127.0.0.1:"${port[$side]}" \
    --upstream-url http://127.0.0.1:"$sim_port"/v1 --data-dir "$WORK/data-$side" \
    --model-dir "${models[$side]}/all-MiniLM-L6-v2" --ort-lib "${models[$side]}/onnxruntime/libonnxruntime.so" \
    ${flags[$side]} >"$WORK/gateway-$side.log" 2>&1 &
  PIDS+=($!)
  wait_ready http://127.0.0.1:"${port[$side]}"/healthz "gateway ($side)" "$WORK/gateway-$side.log"
  curl -sf http://127.0.0.1:"${port[$side]}"/healthz | grep -q '"mode":"semantic"' \
    || { echo "the $side gateway runs without semantic matching (model missing?)" >&2; exit 1; }
done

# run SIDE C REP: one bench run; its samples and the embedding counters' change go to $WORK.
run() {
  local side=$1 c=$2 rep=$3 p=${port[$1]} start end
  start=$(embedding "$p" "$token")
  # The driver gives up when a stored question is not yet an exact hit 30 s after seeding (the
  # writer behind on a loaded machine): such a run is tried once more.
  for try in 1 2; do
    REPRISE_ADMIN_TOKEN=$token "$client" bench --url http://127.0.0.1:"$p"/v1 --pairs "$WORK/pairs.jsonl" \
      --rounds "$rounds" --concurrency "$c" --samples "$WORK/s-$side-$c-$rep.jsonl" -q --json \
      >"$WORK/j-$side-$c-$rep.json" && break
    [ "$try" = 2 ] && exit 1
    echo "    (retrying the run)" >&2
  done
  end=$(embedding "$p" "$token")
  echo "$start $end" >"$WORK/e-$side-$c-$rep.txt"
}

loads=()
for rep in $(seq 1 "$reps"); do
  for c in $concurrencies; do
    order="before after"
    [ $((rep % 2)) -eq 0 ] && order="after before"
    for side in $order; do
      echo "==> rep $rep, concurrency $c, $side" >&2
      run "$side" "$c" "$rep"
    done
  done
  loads+=("$(cut -d' ' -f1-3 /proc/loadavg)")
done

out="benches/results/$(date -u +%F)-semantic-floor-ab.md"
sides=()
for side in before after; do
  bin=$before
  [ "$side" = after ] && bin=$after
  sides+=("$side: gateway $bin/reprise${flags[$side]:+ ${flags[$side]}}, model $(sha256sum "${models[$side]}/all-MiniLM-L6-v2/model.onnx" | cut -c1-12) in ${models[$side]}")
done
python3 - "$WORK" "$reps" "$concurrencies" "$rounds" "$(git rev-parse --short HEAD)" "${loads[*]}" "${sides[@]}" >"$out" <<'PY'
import json, sys, statistics
work, reps, cs, rounds, rev, loads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5], sys.argv[6]
sides = sys.argv[7:9]

def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, -(-len(xs) * p // 100) - 1))
    return xs[int(k)]

def cell(side, c):
    hits, asks, lookups_per_s, emb, wall = [], 0, [], [0, 0, 0, 0.0], 0.0
    for rep in range(1, reps + 1):
        rows = [json.loads(l) for l in open(f"{work}/s-{side}-{c}-{rep}.jsonl")]
        asks += len(rows)
        hits += [r for r in rows if r["outcome"] == "semantic-hit"]
        # Closed loop: requests per second is the concurrency over the mean request time.
        lookups_per_s.append(int(c) / (statistics.mean(r["total_ms"] for r in rows) / 1e3))
        a = [float(x) for x in open(f"{work}/e-{side}-{c}-{rep}.txt").read().split()]
        for i in range(4):
            emb[i] += a[4 + i] - a[i]
        wall += json.load(open(f"{work}/j-{side}-{c}-{rep}.json"))["wall_s"]
    col = lambda f: [f(r) for r in hits if f(r) is not None]
    return {
        "hits": len(hits), "asks": asks,
        "ttft": (pct(col(lambda r: r["ttft_ms"]), 50), pct(col(lambda r: r["ttft_ms"]), 99)),
        "gw": pct(col(lambda r: r["phases"]["ttft_ms"]), 50),
        "embed": pct(col(lambda r: r["phases"]["embed_ms"]), 50),
        "search": pct(col(lambda r: r["phases"]["search_ms"]), 50),
        "lookup": pct(col(lambda r: r["phases"]["lookup_ms"]), 50),
        "rate": statistics.median(lookups_per_s),
        "batch": emb[1] / emb[0] if emb[0] else float("nan"),
        "overload": int(emb[2]),
        # What the model embeds per second of its own time at the batch sizes this load forms: the
        # embedding's capacity at this concurrency. And how much of the run it was busy.
        "capacity": emb[1] / emb[3] if emb[3] else float("nan"),
        "busy": emb[3] / wall if wall else float("nan"),
    }

print(f"# Semantic hits at the embedding floor, before/after ({rev})\n")
print(f"`benches/semantic-floor.sh`: {reps} alternating reps per cell, each {rounds} rounds of the 30 paraphrases of")
print("`benches/workloads/paraphrases.txt` asked with `no-store` after their questions were stored (every ask embedded")
print("and searched), closed loop, streamed, one reprise-sim at 50 ms TTFT; both gateways at default settings.")
print(f"Load average (1/5/15 min) after each rep: {loads}. Times in ms, percentiles nearest-rank.\n")
for s in sides:
    print(f"- {s} (model.onnx sha256 prefix)")
print()
print("| c | build | semantic hits / asks | hit TTFT p50 | p99 | gateway TTFT p50 | embed p50 | search p50 | rest of lookup p50 | asks/s | texts per model call | capacity, texts/s of model time | model busy | refused (overload) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
cells = {}
for c in cs:
    for side in ("before", "after"):
        r = cells[(side, c)] = cell(side, c)
        print(f"| {c} | {side} | {r['hits']} / {r['asks']} | {r['ttft'][0]:.2f} | {r['ttft'][1]:.2f} | {r['gw']:.2f} | {r['embed']:.2f} | {r['search']:.2f} | {r['lookup']:.2f} | {r['rate']:.0f} | {r['batch']:.2f} | {r['capacity']:.0f} | {100 * r['busy']:.0f}% | {r['overload']} |")
print("\nAfter / before:\n")
print("| c | hit TTFT p50 | p99 | embed p50 | asks/s | capacity |")
print("|---|---:|---:|---:|---:|---:|")
for c in cs:
    b, a = cells[("before", c)], cells[("after", c)]
    print(f"| {c} | {a['ttft'][0] / b['ttft'][0]:.2f} | {a['ttft'][1] / b['ttft'][1]:.2f} | {a['embed'] / b['embed']:.2f} | {a['rate'] / b['rate']:.2f} | {a['capacity'] / b['capacity']:.2f} |")
PY
echo "wrote $out" >&2
cat "$out"
