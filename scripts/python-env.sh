#!/usr/bin/env bash
# Creates (or reuses) the project's Python venv in .venv with the SDK-test requirements; prints nothing on reuse.
set -euo pipefail
cd "$(dirname "$0")/.."
req=server/tests/sdk/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "==> setting up .venv (OpenAI SDK, pytest)"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
