# Shared by scripts/eval.sh and scripts/smoke-eval.sh (sourced, not run): starts reprise-sim and a
# gateway in front of it on free loopback ports with a temporary data dir, and stops them on exit.
#
# Needs: BIN (folder with reprise, reprise-sim), MODELS (folder with all-MiniLM-L6-v2/ and
# onnxruntime/). Sets: GATEWAY_URL, SIM_URL, and WORK (temp dir, removed on exit) by lib-procs.sh.

. "$(dirname "${BASH_SOURCE[0]}")/lib-procs.sh"

# start_stack [--sim-args SIM ARGS... --] [GATEWAY ARGS...]: the simulator answers at once (no
# latency: only match quality is measured; SIM ARGS are added, e.g. its judge flags) and the gateway
# runs with its default matching settings, changed only by the arguments given. The embedding
# deadline and queue budget are raised so that a busy machine never turns a request exact-only,
# which would measure the fallback instead of the model. May be called again for a second stack
# (its own ports, data dir and logs); GATEWAY_URL names the latest.
start_stack() {
  [ -x "$BIN/reprise" ] && [ -x "$BIN/reprise-sim" ] || {
    echo "eval: $BIN has no reprise and reprise-sim binaries" >&2
    exit 1
  }
  [ -f "$MODELS/all-MiniLM-L6-v2/model.onnx" ] || {
    echo "eval: no embedding model in $MODELS (run scripts/provision-models.sh)" >&2
    exit 1
  }
  local sim_port gw_port sim_args=()
  if [ "${1:-}" = --sim-args ]; then
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sim_args+=("$1"); shift; done
    [ "${1:-}" = -- ] || { echo "eval: start_stack --sim-args needs a closing --" >&2; exit 2; }
    shift
  fi
  sim_port=$(free_port)
  gw_port=$(free_port)
  "$BIN/reprise-sim" --listen "127.0.0.1:$sim_port" --ttft-ms 0 --itl-ms 0 --tokens 8 \
    "${sim_args[@]}" >"$WORK/sim-$sim_port.log" 2>&1 &
  PIDS+=($!)
  wait_ready "http://127.0.0.1:$sim_port/healthz" reprise-sim "$WORK/sim-$sim_port.log"
  "$BIN/reprise" serve --listen "127.0.0.1:$gw_port" \
    --upstream-url "http://127.0.0.1:$sim_port/v1" \
    --data-dir "$WORK/data-$gw_port" \
    --model-dir "$MODELS/all-MiniLM-L6-v2" \
    --ort-lib "$MODELS/onnxruntime/libonnxruntime.so" \
    --embed-deadline-ms 30000 --embed-queue-budget-ms 30000 \
    "$@" \
    >"$WORK/gateway-$gw_port.log" 2>&1 &
  PIDS+=($!)
  wait_ready "http://127.0.0.1:$gw_port/healthz" gateway "$WORK/gateway-$gw_port.log"
  GATEWAY_URL="http://127.0.0.1:$gw_port"
  SIM_URL="http://127.0.0.1:$sim_port"
}

# stop_last_stack: stops the gateway and simulator that the latest start_stack started (each runs an
# embedding model, so a run of many stacks keeps one at a time).
stop_last_stack() {
  local n=${#PIDS[@]}
  [ "$n" -ge 2 ] || return 0
  local last=("${PIDS[@]:n-2}")
  kill "${last[@]}" 2>/dev/null || true
  wait "${last[@]}" 2>/dev/null || true
  PIDS=("${PIDS[@]:0:n-2}")
}
