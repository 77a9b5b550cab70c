#!/usr/bin/env bash
# Builds the portable archive with CPack (cpack -G TGZ, as scripts/package.sh
# does), unpacks it in a directory of its own, and runs it from there, as on a
# node that takes no packages: bin/rmmd --version, the daemon on the host
# backend with a runtime directory of its own, bin/rmmctl stats and health
# against it, a clean stop. Checks that the archive is self-contained and
# relocatable (every run path relative to $ORIGIN; no library a system may
# lack is taken from the system) and that it holds no systemd unit.
#
# Environment (tests/packaging/CMakeLists.txt): RMMD_BUILD_DIR, RMMD_SCRATCH, CPACK.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
require_env RMMD_BUILD_DIR RMMD_SCRATCH CPACK

build=$RMMD_BUILD_DIR scratch=$RMMD_SCRATCH
rm -rf "$scratch"
mkdir -p "$scratch"

echo "--- cpack -G TGZ"
run_logged "$scratch/cpack.log" "$CPACK" -G TGZ --config "$build/CPackConfig.cmake" -B "$scratch/out"
archives=("$scratch"/out/rmmd-*-linux-*.tar.gz)
if [ "${#archives[@]}" -ne 1 ] || [ ! -f "${archives[0]}" ]; then
  fail "expected one rmmd-*-linux-*.tar.gz in $scratch/out: ${archives[*]}"
fi
archive=${archives[0]}
echo "$archive ($(du -h "$archive" | cut -f1))"
top=$(basename "$archive" .tar.gz)

# Somewhere no build ever was, by a path with a space in it.
unpacked="$scratch/un packed"
mkdir -p "$unpacked"
tar -xzf "$archive" -C "$unpacked"
root="$unpacked/$top"
[ -d "$root" ] || fail "the archive's top directory is not $top"
tar -tzf "$archive" >"$scratch/files.txt"
for f in bin/rmmd bin/rmmctl lib/librmmd_client.so.0 lib/rmmd/librmm.so lib/rmmd/libgrpc++.so.1.51 \
  include/rmmd/session.hpp lib/cmake/rmmd/rmmdConfig.cmake lib/pkgconfig/rmmd.pc \
  etc/rmmd/rmmd.conf share/doc/rmmd/operations.md; do
  [ -e "$root/$f" ] || fail "the archive lacks $top/$f"
done
expect_no_line "$scratch/files.txt" "systemd/system|_CPack_Packages" \
  "no systemd unit (its paths would name the staging directory) and no staging path"
expect_relocatable_runpaths "$root"
expect_self_contained "$root"

echo "--- run from $root"
run_logged "$scratch/version.log" "$root/bin/rmmd" --version
cat "$scratch/version.log"
expect_line "$scratch/version.log" "^rmmd [0-9]+\\.[0-9]+\\.[0-9]+$" "bin/rmmd --version"
run="$scratch/run dir"
mkdir -p "$run"
"$root/bin/rmmd" --config "$root/etc/rmmd/rmmd.conf" --backend host --host-pool-bytes 64MiB \
  --runtime-dir "$run" 2>"$scratch/rmmd.log" &
daemon=$!
stop_daemon() {
  if kill -TERM "$daemon" 2>/dev/null; then wait "$daemon" || true; fi
}
trap stop_daemon EXIT
deadline=$((SECONDS + 30))
until "$root/bin/rmmctl" --runtime-dir "$run" health >/dev/null 2>&1; do
  kill -0 "$daemon" 2>/dev/null || {
    cat "$scratch/rmmd.log" >&2
    fail "bin/rmmd exited at start-up"
  }
  [ "$SECONDS" -lt "$deadline" ] || {
    cat "$scratch/rmmd.log" >&2
    fail "bin/rmmd did not answer within 30 s"
  }
  sleep 0.05
done
run_logged "$scratch/stats.log" "$root/bin/rmmctl" --runtime-dir "$run" stats
cat "$scratch/stats.log"
expect_line "$scratch/stats.log" "^host +0 +host .*64\\.00 MiB" "bin/rmmctl stats shows the host pool"
trap - EXIT
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
[ "$rc" -eq 0 ] || {
  cat "$scratch/rmmd.log" >&2
  fail "bin/rmmd exited $rc on SIGTERM"
}
echo "PASS: $archive runs from $root"
