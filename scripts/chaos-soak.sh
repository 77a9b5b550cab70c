#!/usr/bin/env bash
# The chaos soak (tests/soak/rmmd_chaos.py; docs/reliability.md, "The chaos
# soak") against this checkout's build: one seeded, time-bounded run of
# client, buffer, lease, reclaim, isolation and daemon restart/reload events
# (and, where openssl exists, a second daemon peered over mutual TLS) at
# once, with the invariants checked after every event and round.
#   ./scripts/chaos-soak.sh --minutes 10 [--seed S] [rmmd_chaos.py flags]
# Builds what it runs first (default preset) unless --no-build comes first;
# prints one summary line (and --json FILE). As root it uses the test users
# (daemon as rmmd, clients as rmmd-test-a/-b, the outsider refused).
# On the GPU host, from gpu-check's bundle instead of a build tree, as root:
#   scripts/gpu-chaos.sh .gpu --minutes 30 --seed S
# Exit status: 0 no failure, 1 failures, 2 could not run, 77 no python3.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ "${1:-}" = --no-build ]; then
  shift
else
  ./scripts/build.sh --target rmmd --target rmmctl --target rmmd_c --target rmmd_soak_client \
    --target rmmd_test_client
fi
py=${RMMD_CHAOS_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import sys; assert sys.version_info >= (3, 9)' 2>/dev/null; then
  echo "chaos soak: skipped: no Python 3.9+ at $py (RMMD_CHAOS_PYTHON)"
  exit 77
fi
exec "$py" tests/soak/rmmd_chaos.py --python "$py" "$@"
