#!/usr/bin/env bash
# Installs the named Debian packages when any is missing, running `apt-get update` at most once per
# boot (a fresh CI machine has no package lists yet). Prints nothing when all are installed.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "==> installing ${missing[*]} (Debian packages)"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
export DEBIAN_FRONTEND=noninteractive
stamp=/tmp/reprise-apt-updated.$(cut -d' ' -f1 /proc/sys/kernel/random/boot_id 2>/dev/null || echo x)
if [ ! -f "$stamp" ]; then
  $sudo apt-get update -qq
  touch "$stamp"
fi
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
