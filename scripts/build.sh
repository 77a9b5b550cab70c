#!/usr/bin/env bash
# Sets up (idempotent), configures and builds. Extra arguments go to
# `cmake --build` (e.g. --target rmmd).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
./scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
[ -f build/CMakeCache.txt ] || cmake --preset default
cmake --build --preset default -j "$(nproc)" "$@"
