#!/usr/bin/env bash
# The main job: set up, build, start rmmd on its default backend, run a client
# that allocates through it, writes, reads back and frees, print
# `rmmctl stats` while the client holds its memory, then stop the daemon.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# RMMD_BUNDLE=DIR: use the programs of a gpu-bundle (DIR/bin) instead of building.
if [ -n "${RMMD_BUNDLE:-}" ]; then
  b=$(cd "$RMMD_BUNDLE/bin" && pwd)
  rmmd=$b/rmmd rmmctl=$b/rmmctl hello=$b/rmmd_hello
else
  ./scripts/build.sh --target rmmd rmmctl rmmd_hello
  rmmd=build/daemon/rmmd rmmctl=build/rmmctl/rmmctl hello=build/examples/rmmd_hello
fi
runtime=$(mktemp -d /tmp/rmmd-demo-XXXXXX)
export RMMD_RUNTIME_DIR=$runtime

"$rmmd" --runtime-dir "$runtime" 2> "$runtime/rmmd.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
  echo "--- rmmd log"; cat "$runtime/rmmd.log"; rm -rf "$runtime"
}
trap cleanup EXIT

# Ready once a session can be opened (at most 10 s).
for _ in $(seq 200); do
  "$rmmctl" stats >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { echo "rmmd exited at start-up"; exit 1; }
  sleep 0.05
done

coproc demo { "$hello" --hold; }
demo_pid=$demo_PID  # bash unsets demo_PID once the coprocess ends
while read -r line <&"${demo[0]}"; do
  echo "$line"
  [[ $line == *holding* ]] && break
done
echo "--- rmmctl stats (while rmmd_hello holds its buffers)"
"$rmmctl" stats
exec {demo[1]}>&-
cat <&"${demo[0]}"
wait "$demo_pid"
echo "--- rmmctl stats (after rmmd_hello freed and exited)"
"$rmmctl" stats
