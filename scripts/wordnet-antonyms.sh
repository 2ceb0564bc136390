#!/usr/bin/env bash
# Regenerates the antonym guard's table from WordNet 3.0 (Debian's wordnet-base) and, with --check,
# fails when it differs from the committed server/assets/wordnet-antonyms.txt (CI runs that).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/apt-install.sh wordnet-base
table=server/assets/wordnet-antonyms.txt
if [ "${1:-}" = "--check" ]; then
  python3 scripts/wordnet-antonyms.py | diff -q - "$table" >/dev/null || {
    echo "$table differs from what scripts/wordnet-antonyms.py makes of wordnet-base; run scripts/wordnet-antonyms.sh" >&2
    exit 1
  }
  echo "$table matches WordNet ($(grep -c '^=' "$table") antonym pairs)"
else
  python3 scripts/wordnet-antonyms.py >"$table"
  echo "wrote $table"
fi
