#!/usr/bin/env bash
# What a replica's store sweep costs on a big shared Redis: a redis-server whose registry
# (`reprise:index`) holds N rows (synthetic, as N entries' rows are: an expiry, a size, an exact
# key, a last use; the entries themselves are not written, since a sweep reads rows only), and one
# `reprise serve --store redis` on it (semantic matching off: no vectors to load). After a warm-up
# (the start's count of the registry), an admin client stores one answer every 250 ms through
# `POST /admin/entries`, which waits for the writer thread, the thread that also runs the sweep.
# Reported over that window: the stores' latency (p50, p99, max), the CPU of redis-server and of
# the gateway (share of one core), and the `HSCAN` calls Redis served (the registry reads). With
# `--before DIR` (another build's `reprise`), both builds are measured, alternately, in one run.
# Writes a Markdown table to stdout.
#
# Usage: benches/redis-sweep.sh [--rows N] [--seconds S] [--before DIR] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."

rows=1000000
seconds=60
before=""
rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) rows=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "redis-sweep: unknown argument: $1" >&2; exit 2 ;;
  esac
done

. scripts/lib-procs.sh
absolute_before reprise
scripts/apt-install.sh redis-server >&2
echo "==> release build" >&2
cargo build --release --quiet -p reprise-server --bin reprise
bin=$(scripts/target-dir.sh)/release
sides="after"
[ -n "$before" ] && sides="before after"

start_redis redis
echo "==> $rows registry rows" >&2
python3 - "$rows" <<'PY' | redis-cli -p "$redis_port" --pipe >&2
import random, sys, time
n = int(sys.argv[1])
rng = random.Random(22)
now = int(time.time() * 1000)
out = sys.stdout.buffer
for i in range(1, n + 1):
    # A day's TTL, 7-10 kB stored (compressed answers), used within the last few hours.
    row = "%d %d %064x %d" % (now + 86_400_000, rng.randint(7_000, 10_000), rng.getrandbits(256),
                              now - rng.randint(0, 10_000_000))
    args = [b"HSET", b"reprise:index", str(i).encode(), row.encode()]
    out.write(b"*4\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
PY
# The ids the rows took: the gateways' stores get new ones.
redis-cli -p "$redis_port" set reprise:ids "$rows" >/dev/null

# cpu_ticks PID: user + system clock ticks of PID so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

echo "| build | round | rows | stores | store p50 ms | p99 ms | max ms | redis-server CPU % | gateway CPU % | HSCAN calls per min |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for side in $sides; do
    b=$bin
    [ "$side" = before ] && b=$before
    serve_on_redis "$b/reprise" sweep "gw-$side-$round"
    echo "==> $side, round $round: warm-up, then $seconds s of stores" >&2
    sleep 15
    redis-cli -p "$redis_port" config resetstat >/dev/null
    r0=$(cpu_ticks "$redis_pid"); g0=$(cpu_ticks "$gw"); t0=$(date +%s.%N)
    : >"$WORK/lat"
    end=$(($(date +%s) + seconds))
    n=0
    while [ "$(date +%s)" -lt "$end" ]; do
      n=$((n + 1))
      curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -H 'authorization: Bearer sweep' \
        -H 'content-type: application/json' \
        --data "{\"model\":\"m\",\"api_key\":\"\",\"prompt\":\"probe $side $round $n\",\"response\":\"ok\"}" \
        "http://127.0.0.1:$port/admin/entries" >>"$WORK/lat"
      sleep 0.25
    done
    r1=$(cpu_ticks "$redis_pid"); g1=$(cpu_ticks "$gw"); t1=$(date +%s.%N)
    hscans=$(redis_hscans "$redis_port")
    kill "$gw"
    wait "$gw" 2>/dev/null || true
    python3 - "$side" "$round" "$rows" "$WORK/lat" "$r0" "$r1" "$g0" "$g1" "$t0" "$t1" "$hscans" <<'PY'
import os, sys
side, rnd, rows, lat = sys.argv[1:5]
r0, r1, g0, g1, t0, t1, hscans = map(float, sys.argv[5:12])
lines = [l.split() for l in open(lat)]
bad = [l for l in lines if l[0] != "201"]
if bad:
    sys.exit(f"redis-sweep: {len(bad)} stores failed, e.g. status {bad[0][0]}")
ms = sorted(float(l[1]) * 1000 for l in lines)
pick = lambda q: ms[min(len(ms) - 1, int(len(ms) * q))]
elapsed = t1 - t0
hz = os.sysconf("SC_CLK_TCK")
cpu = lambda a, b: (b - a) / hz / elapsed * 100
print(f"| {side} | {rnd} | {int(rows):,} | {len(ms)} | {pick(0.5):.1f} | {pick(0.99):.1f} | {ms[-1]:.1f} "
      f"| {cpu(r0, r1):.1f} | {cpu(g0, g1):.1f} | {hscans / elapsed * 60:.0f} |")
PY
  done
done
