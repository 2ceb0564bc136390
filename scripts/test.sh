#!/usr/bin/env bash
# Runs the whole test suite: Rust unit, router and integration tests, then the official OpenAI SDK tests
# against real reprise and reprise-sim processes. Installs what it needs (Python venv) on first run.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/python-env.sh

echo "==> cargo build (all binaries)"
cargo build --workspace --bins

echo "==> cargo test"
cargo test --workspace

echo "==> OpenAI SDK tests (Python)"
REPRISE_BIN_DIR="$PWD/target/debug" .venv/bin/python -m pytest -q server/tests/sdk

echo "==> OpenAI SDK tests (Node)"
(
  cd server/tests/sdk/node
  npm ci --no-audit --no-fund --silent
  REPRISE_BIN_DIR="$OLDPWD/target/debug" node --test
)
