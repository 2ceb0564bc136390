#!/usr/bin/env bash
# What the store holds per entry: N synthetic entries (short prompts, 40-token streamed answers, a
# vector each) written by `scale-gateway --store-only` through the store's own put, then the bytes
# of sled's data dir (as `du` counts them, after a clean close) and Redis's `used_memory` (a fresh
# redis-server, change feed included), per entry. With `--before DIR` (binaries of another build:
# `scale-gateway`), both builds are measured, alternately, in one run. Writes a Markdown table to
# stdout.
#
# Usage: benches/store-size.sh [--entries N] [--before DIR] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."

entries=50000
before=""
rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --entries) entries=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "store-size: unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
absolute_before scale-gateway
scripts/apt-install.sh redis-server >&2
scripts/provision-models.sh >/dev/null
echo "==> release build" >&2
cargo build --release --quiet -p reprise-benches --bins
bin=$(scripts/target-dir.sh)/release
sides="after"
[ -n "$before" ] && sides="before after"

# load SIDE STORE_FLAGS...: writes the entries with that side's scale-gateway.
load() {
  local side=$1 b=$bin
  shift
  [ "$side" = before ] && b=$before
  REPRISE_ADMIN_TOKEN=size "$b/scale-gateway" --entries "$entries" --store-only --semantic false "$@" \
    "${SCALE_FLAGS[@]}" --listen 127.0.0.1:"$(free_port)" --upstream-url http://127.0.0.1:9/v1 \
    >"$WORK/load-$side.log" 2>&1
}

echo "| build | round | sled data dir, B per entry | Redis used_memory, B per entry |"
echo "|---|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for side in $sides; do
    echo "==> $entries entries, $side, round $round" >&2
    rm -rf "$WORK/sled"
    load "$side" --data-dir "$WORK/sled"
    sled_b=$(du -sb "$WORK/sled" | cut -f1)
    rm -rf "$WORK/sled"

    start_redis "redis-$side-$round"
    load "$side" --store redis --redis-url "redis://127.0.0.1:$redis_port/" --data-dir "$WORK/loader"
    redis_b=$(redis_used_memory "$redis_port")
    redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
    wait "$redis_pid" 2>/dev/null || true
    rm -rf "$WORK/redis-$side-$round" "$WORK/loader"

    echo "| $side | $round | $((sled_b / entries)) | $((redis_b / entries)) |"
  done
done
