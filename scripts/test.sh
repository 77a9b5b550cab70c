#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite. Tests labelled `gpu` skip
# (with the reason) where there is no GPU.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
./scripts/build.sh
export PATH="$root/.venv/bin:$PATH"
ctest --preset default -j "$(nproc)" "$@"
