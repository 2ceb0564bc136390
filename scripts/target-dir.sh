#!/usr/bin/env bash
# Prints cargo's target directory for this workspace, absolute: CARGO_TARGET_DIR or a cargo config's
# build.target-dir when one is set, else ./target. For the scripts and benches that run the binaries
# they build, so that a user with a shared target directory gets them too.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
