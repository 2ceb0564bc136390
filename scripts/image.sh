#!/usr/bin/env bash
# Builds Reprise's container image (deploy/Containerfile) on a machine that cannot pull images, then
# smoke-tests it: buildah with chroot isolation, on a Debian bookworm base made here with debootstrap.
#
# Usage: scripts/image.sh [--no-smoke | --smoke-only]
#   --smoke-only  test $IMAGE as it is (for example one built from the Containerfile's compiled target)
#   IMAGE     tag of the result (default: localhost/reprise:latest, or localhost/reprise:debug)
#   PROFILE   release (default), or debug: package target/debug's binaries as they are, without building
#             (scripts/test.sh, after `cargo test` built them: a release build would add 11 minutes)
#   MIRROR    Debian mirror for debootstrap (default: http://deb.debian.org/debian)
#
# Steps: the tools (buildah, debootstrap) from apt; the base rootfs (debootstrap --variant=minbase, plus
# curl for the health check), cached as target/image/bookworm-minbase.tar and imported once into
# buildah's storage as localhost/reprise-base:bookworm; the release build and the model (a no-op when
# both are current); target/image/stage/ filled with the stripped binaries and the model;
# `buildah bud --target prebuilt`; then the smoke test, inside the image as its own user:
# reprise-sim and the gateway start, /healthz reports the model loaded, the HEALTHCHECK command passes,
# a request goes upstream (x-reprise-cache: miss), its repeat is served from the cache (hit), and
# reprise-client stats answers. Run as root (buildah and debootstrap need it).
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-release}
case "$PROFILE" in
  release) IMAGE=${IMAGE:-localhost/reprise:latest} ;;
  debug) IMAGE=${IMAGE:-localhost/reprise:debug} ;;
  *) echo "image: PROFILE must be release or debug, not '$PROFILE'" >&2; exit 2 ;;
esac
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BASE_IMAGE=localhost/reprise-base:bookworm
CACHE=target/image
STAGE=$CACHE/stage
BASE_TAR=$CACHE/bookworm-minbase.tar
smoke=1
build=1
case "${1:-}" in
  --no-smoke) smoke=0 ;;
  --smoke-only) build=0 ;;
  "") ;;
  -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "image: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

start=$SECONDS
step() { printf '==> image [%4ds] %s\n' "$((SECONDS - start))" "$*"; }
die() { printf 'image: ERROR: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root: buildah's chroot isolation and debootstrap need it"

step "tools: buildah, debootstrap (Debian packages; nothing to do when installed)"
scripts/apt-install.sh buildah debootstrap binutils
mkdir -p "$CACHE"

if [ "$build" -eq 1 ]; then

# ---- the base image -------------------------------------------------------------------------------

if [ ! -f "$BASE_TAR" ]; then
  step "debootstrap: Debian bookworm, minbase variant, from $MIRROR (first run only; 35 s to 2 min here)"
  rootfs=$CACHE/rootfs.partial
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=curl bookworm "$rootfs" "$MIRROR" \
    >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed; its log: $CACHE/debootstrap.log"
  # What a container never needs: package lists and caches, docs, logs of the bootstrap itself.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/var/log/* "$rootfs"/debootstrap
  tar --numeric-owner -C "$rootfs" -cf "$BASE_TAR.partial" .
  mv "$BASE_TAR.partial" "$BASE_TAR"
  rm -rf "$rootfs"
else
  step "debootstrap: using the cached base $BASE_TAR"
fi
# The tarball's sum labels the imported image, so a new tarball is imported again.
base_sum=$(sha256sum "$BASE_TAR" | cut -c1-32)
have_sum=$(buildah inspect --type image --format '{{index .ImageAnnotations "reprise.base"}}' "$BASE_IMAGE" 2>/dev/null || true)
if [ "$have_sum" != "$base_sum" ]; then
  step "importing the base into buildah's storage as $BASE_IMAGE"
  ctr=$(buildah from --pull=never scratch)
  buildah add --quiet "$ctr" "$BASE_TAR" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --annotation "reprise.base=$base_sum" "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
else
  step "base image $BASE_IMAGE is current"
fi

# ---- what goes in: release binaries and the model ---------------------------------------------------

bins=$(scripts/target-dir.sh)/$PROFILE
if [ "$PROFILE" = release ]; then
  step "release build of reprise, reprise-client, reprise-sim (cargo; a no-op when current, about 11 minutes cold)"
  cargo build --release --locked -p reprise-server -p reprise-client -p reprise-sim --bins --quiet
else
  step "debug binaries from $bins, as they are"
  for b in reprise reprise-client reprise-sim; do
    [ -x "$bins/$b" ] || die "$bins/$b is missing: run cargo test --workspace (or cargo build --bins) first"
  done
fi
step "embedding model and ONNX Runtime (scripts/provision-models.sh; a no-op when present)"
scripts/provision-models.sh >/dev/null

step "staging $STAGE (binaries without debug info, the model and ONNX Runtime)"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/models"
for b in reprise reprise-client reprise-sim; do
  strip --strip-debug -o "$STAGE/bin/$b" "$bins/$b"
done
# models/ may be a symlink; the folder's own links (libonnxruntime.so -> .so.1.31.1) are kept.
cp -a models/onnxruntime models/all-MiniLM-L6-v2 "$STAGE/models/"
scripts/provision-models.sh "$STAGE/models" >/dev/null || die "the staged model does not match its pinned sums"

# ---- the image ------------------------------------------------------------------------------------

step "buildah bud -> $IMAGE (target prebuilt, $PROFILE binaries, BASE=$BASE_IMAGE)"
previous=$(buildah images --quiet --no-trunc "$IMAGE" 2>/dev/null || true)
# --format docker keeps the HEALTHCHECK (the OCI format has no field for it).
buildah bud --isolation chroot --pull=never --format docker --quiet \
  --target prebuilt --build-arg "BASE=$BASE_IMAGE" \
  -f deploy/Containerfile -t "$IMAGE" . >/dev/null
# The image this one replaces would stay behind untagged, 200 MB a run.
current=$(buildah images --quiet --no-trunc "$IMAGE")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  buildah rmi "$previous" >/dev/null 2>&1 || true
fi
size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -1)
step "built $IMAGE ($size)"

fi
[ "$smoke" -eq 1 ] || { step "done (smoke test skipped)"; exit 0; }
size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -1)

# ---- smoke test -----------------------------------------------------------------------------------

# Chroot isolation shares the host's network: free ports, so parallel runs and services do not clash.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
gw_port=$(free_port)
sim_port=$(free_port)
[ "$gw_port" != "$sim_port" ] || sim_port=$(free_port)

# The image's HEALTHCHECK command, run below as docker would run it (sh -c, the container's environment).
healthcheck=$(buildah inspect --type image "$IMAGE" | python3 -c '
import json, sys
test = (json.load(sys.stdin)["Docker"]["config"].get("Healthcheck") or {}).get("Test") or []
if test[:1] != ["CMD-SHELL"]:
    sys.exit(f"image: ERROR: no HEALTHCHECK in the image (built with --format docker?): {test}")
print(test[1])')
ctr=$(buildah from --pull=never "$IMAGE")
cleanup() { buildah rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "smoke test: reprise-sim on 127.0.0.1:$sim_port and the gateway on 127.0.0.1:$gw_port, inside the image"
# Runs inside the container, as the image's user, with the image's environment.
# shellcheck disable=SC2016 # expanded inside the container, not here
smoke_script='
set -u
fail() { echo "smoke: FAIL: $*" >&2; echo "--- gateway log" >&2; tail -n 40 /tmp/gw.log >&2; exit 1; }
uid=$(id -u)
[ "$uid" != 0 ] || fail "running as root; the image should set a non-root USER"
echo "smoke: running as $(id -un) (uid $uid), data in $REPRISE_DATA_DIR"
reprise-sim --listen "127.0.0.1:$SIM_PORT" >/tmp/sim.log 2>&1 &
sim=$!
export REPRISE_ADMIN_TOKEN=smoke-token REPRISE_URL="http://127.0.0.1:$GW_PORT"
REPRISE_LISTEN="127.0.0.1:$GW_PORT" \
REPRISE_UPSTREAM_URL="http://127.0.0.1:$SIM_PORT/v1" \
  reprise serve >/tmp/gw.log 2>&1 &
gw=$!
trap "kill $gw $sim 2>/dev/null; wait 2>/dev/null" EXIT
base="http://127.0.0.1:$GW_PORT"
# The model loads at start (a few seconds); /healthz says when semantic matching is ready.
ready=0
for _ in $(seq 1 120); do
  if health=$(curl -fsS "$base/healthz" 2>/dev/null) && echo "$health" | grep -q "\"status\":\"ready\""; then
    ready=1; break
  fi
  kill -0 $gw 2>/dev/null || fail "the gateway exited"
  sleep 0.5
done
[ $ready = 1 ] || fail "/healthz did not report semantic matching ready within 60 s: ${health:-no answer}"
echo "smoke: /healthz ok, embedding model loaded"
(export REPRISE_LISTEN="127.0.0.1:$GW_PORT"; sh -c "$HEALTHCHECK") || fail "the HEALTHCHECK command failed: $HEALTHCHECK"
echo "smoke: the HEALTHCHECK command passes"
body="{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"smoke test of the image, $$\"}]}"
ask() { curl -sS -D - -o /tmp/body.json -H "content-type: application/json" -H "authorization: Bearer sk-smoke" \
  -d "$body" "$base/v1/chat/completions" | tr -d "\r"; }
head1=$(ask) || fail "the first request failed"
echo "$head1" | grep -q "^HTTP/1.1 200" || fail "first request: $(echo "$head1" | head -1): $(cat /tmp/body.json)"
echo "$head1" | grep -qi "^x-reprise-cache: miss" || fail "first request not a miss: $head1"
grep -q "\"choices\"" /tmp/body.json || fail "first answer has no choices: $(cat /tmp/body.json)"
echo "smoke: first request forwarded to reprise-sim (x-reprise-cache: miss)"
# The entry is written just after the answer has gone out; a repeat a moment later finds it.
for _ in $(seq 1 50); do
  head2=$(ask) || fail "the repeat failed"
  echo "$head2" | grep -qi "^x-reprise-cache: hit" && break
  sleep 0.1
done
echo "$head2" | grep -qi "^x-reprise-cache: hit" || fail "the repeat was not served from the cache: $head2"
echo "smoke: repeat served from the cache (x-reprise-cache: hit, $(echo "$head2" | grep -i "^x-reprise-entry" | tr -d "\n"))"
[ -n "$(ls -A "$REPRISE_DATA_DIR")" ] || fail "nothing written to $REPRISE_DATA_DIR"
reprise-client stats >/tmp/stats.txt 2>&1 || fail "reprise-client stats: $(cat /tmp/stats.txt)"
echo "smoke: reprise-client stats answers ($(grep -ci hit /tmp/stats.txt) lines mention hits)"
'
buildah run --isolation chroot --env "GW_PORT=$gw_port" --env "SIM_PORT=$sim_port" --env "HEALTHCHECK=$healthcheck" "$ctr" \
  -- bash -c "$smoke_script" || die "smoke test failed"
step "smoke test passed; $IMAGE is ready ($size). Run it with docker or podman, see README \"Container image\""
