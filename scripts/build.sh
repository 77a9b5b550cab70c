#!/usr/bin/env bash
# Sets up (idempotent), configures and builds.
#   ./scripts/build.sh [--preset P] [cmake --build args, e.g. --target rmmd]
# P is a CMakePresets.json preset: default (build/), asan, tsan, fuzz
# (build-P/); each is configured the first time it is built.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
preset=default
if [ "${1:-}" = --preset ]; then preset=$2; shift 2; fi
dir=build; [ "$preset" = default ] || dir=build-$preset
./scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
[ -f "$dir/CMakeCache.txt" ] || cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)" "$@"
