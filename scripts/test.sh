#!/usr/bin/env bash
# Sets up, builds and runs the test suite.
#   ./scripts/test.sh [--preset P] [ctest args]
# default: every test; tests labelled `gpu` skip (with the reason) where there
# is no GPU. asan: the unit and integration tests built with AddressSanitizer
# and UndefinedBehaviorSanitizer; tsan: the same with ThreadSanitizer. In a
# sanitized build every process the tests start (the daemon, the clients) is
# sanitized too, and a report from any of them fails the run (the test
# sanitizer_logs.check prints it). DEVELOPERS.md says more.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
preset=default
if [ "${1:-}" = --preset ]; then preset=$2; shift 2; fi
./scripts/build.sh --preset "$preset"
export PATH="$root/.venv/bin:$PATH"
ctest --preset "$preset" -j "$(nproc)" "$@"
