#!/usr/bin/env bash
# Makes sure Debian's chromium package is installed, for the dashboard tests (playwright-core drives it; no browser
# download of Playwright's own). Prints nothing when it is already there.
set -euo pipefail
bin=${CHROMIUM_PATH:-/usr/bin/chromium}
if [ -x "$bin" ]; then
  exit 0
fi
echo "==> installing chromium (Debian package)"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
if [ ! -x "$bin" ]; then
  echo "chromium was installed but $bin is missing; set CHROMIUM_PATH" >&2
  exit 1
fi
