#!/usr/bin/env bash
# Optional peer benchmark (not part of CI): Reprise and GPTCache side by side in one run, same upstream, same model, same threshold.
#
# Usage: benches/peer/run-gptcache.sh
#
# Sets up a pinned venv (benches/peer/requirements.txt) in target/peer-venv, provisions the model
# if missing, builds release binaries if missing, then for every scenario starts a fresh Reprise
# gateway and a fresh GPTCache gateway (benches/peer/gptcache_gateway.py) in front of one
# reprise-sim, and measures both with `reprise-client bench --url <reprise> --compare <gptcache>`.
# Writes benches/results/peer-gptcache-<date>.md (and the driver's raw reports as .json beside it).
#
# Environment: PYTHON (interpreter for the venv, 3.11+; default python3), PEER_VENV (default
# target/peer-venv), REPRISE_MODELS_DIR (default ./models), REPRISE_BIN_DIR (folder with reprise,
# reprise-sim and reprise-client; default ${CARGO_TARGET_DIR:-target}/release).
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python3}
venv=${PEER_VENV:-target/peer-venv}
models=${REPRISE_MODELS_DIR:-models}
bin=${REPRISE_BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
threshold=0.90
started_at=$(date +%s)
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)

log() { printf '==> %s\n' "$*" >&2; }

# ---- environment ------------------------------------------------------------------------------

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "run-gptcache: $python is older than 3.11 (the gateway reads TOML with tomllib)" >&2; exit 1; }
req=benches/peer/requirements.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
if ! [ -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  log "setting up $venv (GPTCache and its pinned dependencies)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: -r "$req"
  echo "$want" > "$venv/.requirements.sha256"
fi

if ! [ -f "$models/all-MiniLM-L6-v2/model.onnx" ] || ! [ -e "$models/onnxruntime/libonnxruntime.so" ]; then
  log "provisioning the embedding model into $models"
  scripts/provision-models.sh "$models"
fi
models=$(cd "$models" && pwd -P)

for b in reprise reprise-sim reprise-client; do
  if ! [ -x "$bin/$b" ]; then
    log "release build (missing $bin/$b)"
    cargo build --release --bins --quiet
    break
  fi
done
for b in reprise reprise-sim reprise-client; do
  [ -x "$bin/$b" ] || { echo "run-gptcache: no $bin/$b after the build (set REPRISE_BIN_DIR?)" >&2; exit 1; }
done

# The gateway's own checks first (threshold mapping through GPTCache, outcome labels, stream
# assembly, the model's vectors): numbers from a peer set up wrong would be worse than none.
REPRISE_MODELS_DIR=$models "$venv/bin/python" -W ignore -m unittest discover -q -s benches/peer -p 'test_*.py' \
  || { echo "run-gptcache: the gateway's checks failed" >&2; exit 1; }

# ---- processes --------------------------------------------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/reprise-peer.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    for f in "$work"/*.log; do
      [ -s "$f" ] && { echo "--- last lines of $f" >&2; tail -n 15 "$f" >&2; }
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "run-gptcache: not ready after 30 s: $1" >&2
  exit 1
}

# start_sim NAME FLAGS...: a simulated upstream; sets sim_url.
start_sim() {
  local name=$1 port
  shift
  port=$(free_port)
  "$bin/reprise-sim" --listen 127.0.0.1:"$port" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  wait_for "http://127.0.0.1:$port/healthz"
  sim_url=http://127.0.0.1:$port/v1
}

# start_gateways UPSTREAM_URL: a fresh Reprise and a fresh GPTCache gateway (empty caches) in front
# of the same upstream; sets reprise_url, peer_url and gw_pids.
gateway_run=0
start_gateways() {
  local upstream=$1 rport pport
  gateway_run=$((gateway_run + 1))
  rport=$(free_port)
  pport=$(free_port)
  "$bin/reprise" serve --listen 127.0.0.1:"$rport" --upstream-url "$upstream" \
    --data-dir "$work/reprise-$gateway_run" --model-dir "$models/all-MiniLM-L6-v2" \
    --ort-lib "$models/onnxruntime/libonnxruntime.so" --similarity-threshold "$threshold" \
    >"$work/reprise.log" 2>&1 &
  gw_pids=($!)
  "$venv/bin/python" benches/peer/gptcache_gateway.py --listen 127.0.0.1:"$pport" --upstream "$upstream" \
    --models-dir "$models" --data-dir "$work/gptcache-$gateway_run" --similarity-threshold "$threshold" \
    >"$work/gptcache.log" 2>&1 &
  gw_pids+=($!)
  pids+=("${gw_pids[@]}")
  wait_for "http://127.0.0.1:$rport/healthz"
  wait_for "http://127.0.0.1:$pport/healthz"
  reprise_url=http://127.0.0.1:$rport/v1
  peer_url=http://127.0.0.1:$pport/v1
}

stop_gateways() {
  local p
  for p in "${gw_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${gw_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Forget them, so the exit trap never signals a process id that may since have been reused.
  local keep=() q
  for q in "${pids[@]}"; do
    [[ " ${gw_pids[*]} " == *" $q "* ]] || keep+=("$q")
  done
  pids=("${keep[@]}")
  gw_pids=()
}

# ---- scenarios --------------------------------------------------------------------------------

manifest=$work/manifest.tsv
: >"$manifest"
# bench ID TITLE NAMES FLAGS...: one driver run, its JSON report recorded in the manifest.
bench() {
  local id=$1 title=$2 names=$3
  shift 3
  log "$title ($names)"
  "$bin/reprise-client" bench --json "$@" >"$work/$id.json" 2>"$work/$id.err" \
    || { cat "$work/$id.err" >&2; echo "run-gptcache: scenario $id failed" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$id" "$title" "$names" "$work/$id.json" >>"$manifest"
}

# Misses go to a cloud-GPU-like upstream without jitter, so a miss costs the same on both sides
# and what differs in TTFT is the gateway.
start_sim cloud --profile cloud-gpu
cloud=$sim_url
paraphrases=benches/workloads/paraphrases.txt
n_para=$(grep -c . "$paraphrases")

for mode in stream no-stream; do
  mflag=()
  [ "$mode" = no-stream ] && mflag=(--no-stream)
  for c in 1 8; do
    start_gateways "$cloud"
    bench "exact-$mode-c$c" "Exact repeats, $mode, concurrency $c" Reprise,GPTCache \
      --url "$reprise_url" --compare "$peer_url" --unique-prompts 20 --requests 200 --warmup 0 \
      --concurrency "$c" "${mflag[@]}"
    stop_gateways
    start_gateways "$cloud"
    bench "para-$mode-c$c" "Paraphrases, $mode, concurrency $c" Reprise,GPTCache \
      --url "$reprise_url" --compare "$peer_url" --prompts-file "$paraphrases" --requests "$n_para" \
      --warmup 0 --concurrency "$c" "${mflag[@]}"
    stop_gateways
  done
done

# Throughput of hits needs each gateway alone (side by side, the two share every worker's time).
# A fast upstream keeps the priming pass short; only the hits after it are measured, for up to
# 10,000 requests or 30 s, whichever comes first, so neither run is too short to mean much.
start_sim fast --ttft-ms 50 --itl-ms 2 --tokens 32
for mode in stream no-stream; do
  mflag=()
  [ "$mode" = no-stream ] && mflag=(--no-stream)
  start_gateways "$sim_url"
  for name in Reprise GPTCache; do
    url=$reprise_url
    [ "$name" = GPTCache ] && url=$peer_url
    bench "throughput-$mode-$name" "Exact-hit throughput, $mode, concurrency 8" "$name" \
      --url "$url" --unique-prompts 50 --warmup 50 --requests 10000 --max-seconds 30 --concurrency 8 "${mflag[@]}"
  done
  stop_gateways
done

# ---- report -----------------------------------------------------------------------------------

mkdir -p benches/results
out=benches/results/peer-gptcache-$(date -u +%Y-%m-%d).md
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
gptcache_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("gptcache"))')
ort_version=$("$venv/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)')
elapsed=$(($(date +%s) - started_at))
render() { "$python" benches/peer/render_results.py "$1" "$manifest"; }
{
  echo "# Reprise vs GPTCache, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Written by benches/peer/run-gptcache.sh (optional, not part of CI; this run took ${elapsed} s)."
  echo "Machine: $(nproc) cores ($cpu), $(free -g | awk '/Mem:/{print $2}') GiB RAM; the driver, both gateways and"
  echo "the simulator share it and talk over loopback. Times are client-side, in ms. Load average (1/5/15 min)"
  echo "at the start: $load_at_start, at the end: $(cut -d' ' -f1-3 /proc/loadavg); anything above what this run puts"
  echo "on the machine is other work, which side-by-side runs share but the alone (throughput) runs do not."
  echo
  echo "## Method"
  echo
  echo "- **Side by side.** Each scenario runs once with \`reprise-client bench --url <Reprise> --compare <GPTCache>\`:"
  echo "  every prompt goes to both gateways back to back, in alternating order, so both meet the same"
  echo "  machine state. Both start empty for every scenario (fresh data directories)."
  echo "- **Same upstream.** Both forward misses to one \`reprise-sim --profile cloud-gpu\` (~400 ms TTFT,"
  echo "  ~120 tok/s, 64 tokens, no jitter); the throughput section uses a fast simulator only to prime."
  echo "- **Same model.** Reprise embeds with its Rust stack (fastembed + ONNX Runtime). GPTCache $gptcache_version gets"
  echo "  the same int8 all-MiniLM-L6-v2 ONNX file and tokenizer through its custom-embedding hook"
  echo "  (\`Cache.init(embedding_func=...)\`), run with onnxruntime $ort_version: mean pooling, L2 norm, 256"
  echo "  tokens, 1 intra-op thread, no spinning, as Reprise configures it. Both embed the last message."
  echo "- **Same threshold.** Reprise: cosine >= $threshold. GPTCache: its \`sqlite,faiss\` data manager"
  echo "  (squared L2 on unit vectors, d2 = 2 - 2 cos) with \`SearchDistanceEvaluation(max_distance=4)\` and"
  echo "  \`similarity_threshold\` = 1 - 2(1 - $threshold)/4, which accepts exactly d2 <= 2(1 - $threshold); top_k = 1 on both."
  echo "- **The peer's server.** benches/peer/gptcache_gateway.py: aiohttp, one Python process, GPTCache's"
  echo "  \`adapt()\` on a pool of 8 threads (embedding in parallel, GPTCache's stores behind one lock),"
  echo "  misses streamed through and stored after the last byte, hits replayed the way GPTCache's OpenAI"
  echo "  adapter does (role, whole answer, finish). GPTCache's per-hit sqlite report row is off."
  echo "- **Outcomes.** Both send \`x-reprise-cache\`: hit (same text), semantic-hit, miss; Reprise also"
  echo "  \`coalesced\` (joined an identical miss in flight). Workloads: exact repeats = 20 generated prompts"
  echo "  cycled over 200 requests; paraphrases = $paraphrases, $((n_para / 2)) questions then a paraphrase of each."
  echo "  Throughput: each gateway alone, 50 prompts primed, then exact hits at concurrency 8 for up to"
  echo "  10,000 requests or 30 s."
  echo
  echo "## Summary"
  echo
  render summary
  echo
  echo "## Per scenario (the driver's numbers)"
  echo
  render tables
} >"$out"
render bundle >"${out%.md}.json"
log "wrote $out and ${out%.md}.json in ${elapsed} s"
