# Shared by scripts/eval.sh and scripts/smoke-eval.sh (sourced, not run): starts reprise-sim and a
# gateway in front of it on free loopback ports with a temporary data dir, and stops them on exit.
#
# Needs: BIN (folder with reprise, reprise-sim), MODELS (folder with all-MiniLM-L6-v2/ and
# onnxruntime/). Sets: GATEWAY_URL, WORK (temp dir, removed on exit).

WORK=$(mktemp -d "${TMPDIR:-/tmp}/reprise-eval.XXXXXX")
eval_pids=()
eval_cleanup() {
  for p in "${eval_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${eval_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf -- "$WORK"
}
trap eval_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_ready URL NAME LOG: polls URL until it answers, or fails showing the log.
wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "eval: $2 did not become ready at $1; its log:" >&2
  tail -n 40 "$3" >&2
  exit 1
}

# start_stack: the simulator answers at once (no latency: only match quality is measured) and the
# gateway runs with its default matching settings. The embedding deadline is raised so that a busy
# machine never turns a request exact-only, which would measure the fallback instead of the model.
start_stack() {
  [ -x "$BIN/reprise" ] && [ -x "$BIN/reprise-sim" ] || {
    echo "eval: $BIN has no reprise and reprise-sim binaries" >&2
    exit 1
  }
  [ -f "$MODELS/all-MiniLM-L6-v2/model.onnx" ] || {
    echo "eval: no embedding model in $MODELS (run scripts/provision-models.sh)" >&2
    exit 1
  }
  local sim_port gw_port
  sim_port=$(free_port)
  gw_port=$(free_port)
  "$BIN/reprise-sim" --listen "127.0.0.1:$sim_port" --ttft-ms 0 --itl-ms 0 --tokens 8 \
    >"$WORK/sim.log" 2>&1 &
  eval_pids+=($!)
  wait_ready "http://127.0.0.1:$sim_port/healthz" reprise-sim "$WORK/sim.log"
  "$BIN/reprise" serve --listen "127.0.0.1:$gw_port" \
    --upstream-url "http://127.0.0.1:$sim_port/v1" \
    --data-dir "$WORK/data" \
    --model-dir "$MODELS/all-MiniLM-L6-v2" \
    --ort-lib "$MODELS/onnxruntime/libonnxruntime.so" \
    --embed-deadline-ms 30000 \
    >"$WORK/gateway.log" 2>&1 &
  eval_pids+=($!)
  wait_ready "http://127.0.0.1:$gw_port/healthz" gateway "$WORK/gateway.log"
  GATEWAY_URL="http://127.0.0.1:$gw_port"
}
