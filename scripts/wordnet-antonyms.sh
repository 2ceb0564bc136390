#!/usr/bin/env bash
# Regenerates the guards' WordNet tables from WordNet 3.0 (Debian's wordnet-base): the antonym table
# (scripts/wordnet-antonyms.py) and the names table (scripts/wordnet-names.py). With --check, fails
# when either differs from the committed server/assets/wordnet-{antonyms,names}.txt (CI runs that).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/apt-install.sh wordnet-base
for kind in antonyms names; do
  table=server/assets/wordnet-$kind.txt
  if [ "${1:-}" = "--check" ]; then
    python3 "scripts/wordnet-$kind.py" | diff -q - "$table" >/dev/null || {
      echo "$table differs from what scripts/wordnet-$kind.py makes of wordnet-base; run scripts/wordnet-antonyms.sh" >&2
      exit 1
    }
    echo "$table matches WordNet ($(grep -c '^[=p]' "$table") entries)"
  else
    python3 "scripts/wordnet-$kind.py" >"$table"
    echo "wrote $table"
  fi
done
