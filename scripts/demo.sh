#!/usr/bin/env bash
# The main job: set up, build, start rmmd on its default backend, run a client
# that allocates through it, writes, reads back and frees, print
# `rmmctl stats` while the client holds its memory, then stop the daemon.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
./scripts/build.sh --target rmmd rmmctl rmmd_hello
bin=build
runtime=$(mktemp -d /tmp/rmmd-demo-XXXXXX)
export RMMD_RUNTIME_DIR=$runtime

"$bin/daemon/rmmd" --runtime-dir "$runtime" 2> "$runtime/rmmd.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
  echo "--- rmmd log"; cat "$runtime/rmmd.log"; rm -rf "$runtime"
}
trap cleanup EXIT

# Ready once a session can be opened (at most 10 s).
for _ in $(seq 200); do
  "$bin/client/rmmctl" stats >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { echo "rmmd exited at start-up"; exit 1; }
  sleep 0.05
done

coproc demo { "$bin/examples/rmmd_hello" --hold; }
demo_pid=$demo_PID  # bash unsets demo_PID once the coprocess ends
while read -r line <&"${demo[0]}"; do
  echo "$line"
  [[ $line == *holding* ]] && break
done
echo "--- rmmctl stats (while rmmd_hello holds its buffers)"
"$bin/client/rmmctl" stats
exec {demo[1]}>&-
cat <&"${demo[0]}"
wait "$demo_pid"
echo "--- rmmctl stats (after rmmd_hello freed and exited)"
"$bin/client/rmmctl" stats
