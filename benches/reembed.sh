#!/usr/bin/env bash
# A local store written with one embedding model, restarted with another (issue 22's upgrade: the
# model scripts/provision-models.sh installed before, then the int8-compute one), killed with -9
# part-way through re-embedding and restarted: an exact hit at once, the progress in /healthz, how
# long the whole store took, a paraphrase as a semantic hit after, and the record naming the new model.
#
#   OLD_MODELS=/work/main/models NEW_MODELS=/work/models-int8 N=1000 benches/reembed.sh
#
# Uses target/debug (build first: cargo build -p reprise-server -p reprise-sim --bins). Ports 19190-1.
set -uo pipefail
N=${N:-1000}
OLD=${OLD_MODELS:?the models dir of the model that writes the store}
NEW=${NEW_MODELS:?the models dir of the model it is restarted with}
BIN=$("$(dirname "$0")"/../scripts/target-dir.sh)/debug
WORK=$(mktemp -d); D=$WORK/data
trap 'kill ${GW:-} ${SIM:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
"$BIN/reprise-sim" --listen 127.0.0.1:19190 --ttft-ms 1 --itl-ms 0 --tokens 16 >"$WORK/sim.log" 2>&1 & SIM=$!
serve() { # $1: models dir
  "$BIN/reprise" serve --listen 127.0.0.1:19191 --upstream-url http://127.0.0.1:19190/v1 --data-dir "$D" \
    --admin-token t --model-dir "$1/all-MiniLM-L6-v2" --ort-lib "$1/onnxruntime/libonnxruntime.so" >>"$WORK/gw.log" 2>&1 &
  GW=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:19191/healthz >/dev/null && return; sleep 0.1; done
  echo "the gateway did not start"; exit 1
}
ask() {
  curl -s -o /dev/null -w '%header{x-reprise-cache}' -H 'authorization: Bearer sk-x' -H 'content-type: application/json' \
    -d "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"$1\"}]}" http://127.0.0.1:19191/v1/chat/completions
}
progress() { curl -s http://127.0.0.1:19191/healthz | python3 -c 'import json,sys;h=json.load(sys.stdin)["semantic"];r=h["reembedding"] or {};print(h["vectors"], r.get("done",0)+r.get("failed",0), r.get("total",0), r.get("finished"))'; }

serve "$OLD"
for i in $(seq "$N"); do ask "What is the capital of imaginary country number $i?" >/dev/null; done
ask "How do I reset my password?" >/dev/null
for _ in $(seq 100); do [ "$(progress | cut -d' ' -f1)" -gt "$N" ] && break; sleep 0.1; done
echo "old model: $(progress | cut -d' ' -f1) vectors; record $(cat "$D/embedding-model")"
kill "$GW"; wait "$GW" 2>/dev/null

echo "load before: $(uptime)"
T0=$(date +%s.%N)
serve "$NEW"
echo "exact after the restart: $(ask 'How do I reset my password?'); at start (vectors settled total finished): $(progress)"
while set -- $(progress); [ "$2" -lt $(( $3 / 3 )) ]; do sleep 0.05; done
kill -9 "$GW"; wait "$GW" 2>/dev/null
echo "killed -9 at (vectors settled total): $1 $2 $3; marker: $(cat "$D/embedding-model.reembedding"); record: $(cat "$D/embedding-model")"
T1=$(date +%s.%N)
serve "$NEW"
echo "restarted: $(progress)"
until set -- $(progress); [ "$4" = True ]; do sleep 0.1; done
T2=$(date +%s.%N)
echo "finished: $1 vectors, $3 re-embedded after the restart in $(python3 -c "print(round($T2-$T1,2))") s (first run until the kill: $(python3 -c "print(round($T1-$T0,2))") s, start-up included)"
echo "load after: $(uptime)"
echo "paraphrase: $(ask 'how can I reset my password')"
echo "record: $(cat "$D/embedding-model"); marker: $(ls "$D" | grep -c reembedding) files"
grep -a "re-embed" "$WORK/gw.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-260
