#!/usr/bin/env bash
# What the admin API's listings cost on a big shared Redis: N synthetic entries written into a
# fresh redis-server by `scale-gateway --store-only` (the store's own put; namespaces `support`,
# `docs`, `sales` and 50 small `team-NN` ones), then one `reprise serve --store redis` on it
# (semantic matching off: no vectors to load) and, from curl:
#   - the dashboard's refresh, `GET /admin/entries?limit=50`, 10 times in a row;
#   - its next page (`cursor`), 10 times;
#   - a count of one small namespace's entries, `POST /admin/invalidate {"namespace":"team-07",
#     "dry_run":true}`, which pages through every entry.
# Reported: the wall time of each (median of the repeats), and the `HSCAN` calls (registry reads)
# Redis served for it. With `--before DIR` (another build's `reprise`), both builds are measured,
# alternately, on the same entries. Writes a Markdown table to stdout.
#
# Usage: benches/redis-listing.sh [--entries N] [--before DIR] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."

entries=100000
before=""
rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --entries) entries=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "redis-listing: unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
absolute_before reprise
scripts/apt-install.sh redis-server >&2
scripts/provision-models.sh >/dev/null
echo "==> release build" >&2
cargo build --release --quiet -p reprise-server --bin reprise -p reprise-benches --bin scale-gateway
bin=$(scripts/target-dir.sh)/release
sides="after"
[ -n "$before" ] && sides="before after"

start_redis redis
echo "==> $entries entries into redis" >&2
REPRISE_ADMIN_TOKEN=listing "$bin/scale-gateway" --entries "$entries" --store-only --semantic false \
  "${SCALE_FLAGS[@]}" --store redis --redis-url "redis://127.0.0.1:$redis_port/" --data-dir "$WORK/loader" \
  --listen 127.0.0.1:"$(free_port)" --upstream-url http://127.0.0.1:9/v1 >"$WORK/load.log" 2>&1

# timed NAME REPEATS CURL_ARGS...: runs curl REPEATS times; prints "NAME median_ms hscans_per_call".
timed() {
  local name=$1 repeats=$2 h0 h1
  shift 2
  h0=$(redis_hscans "$redis_port")
  for _ in $(seq 1 "$repeats"); do
    curl -sf -o "$WORK/body" -w '%{time_total}\n' -H 'authorization: Bearer listing' "$@" >>"$WORK/t-$name"
  done
  h1=$(redis_hscans "$redis_port")
  python3 - "$name" "$WORK/t-$name" "$h0" "$h1" "$repeats" <<'PY'
import statistics, sys
name, path, h0, h1, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ms = [float(l) * 1000 for l in open(path)]
print(name, f"{statistics.median(ms):.1f}", f"{(h1 - h0) / n:.0f}")
PY
  rm -f "$WORK/t-$name"
}

echo "| build | round | entries | dashboard refresh ms | HSCAN calls | next page ms | HSCAN calls | count of team-07 ms | HSCAN calls | matched |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for side in $sides; do
    b=$bin
    [ "$side" = before ] && b=$before
    serve_on_redis "$b/reprise" listing "gw-$side-$round"
    echo "==> $side, round $round" >&2
    url=http://127.0.0.1:$port/admin
    read -r _ first first_scans < <(timed first 10 "$url/entries?limit=50")
    cursor=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["next_cursor"])' "$WORK/body")
    read -r _ next next_scans < <(timed next 10 "$url/entries?limit=50&cursor=$cursor")
    read -r _ count count_scans < <(timed count 1 -H 'content-type: application/json' \
      --data '{"namespace":"team-07","dry_run":true}' "$url/invalidate")
    matched=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["matched"])' "$WORK/body")
    kill "$gw"
    wait "$gw" 2>/dev/null || true
    echo "| $side | $round | $entries | $first | $first_scans | $next | $next_scans | $count | $count_scans | $matched |"
  done
done
