#!/usr/bin/env bash
# `cmake --install` into a scratch prefix, then what a developer and an
# operator do with it: build tests/packaging/consumer against the installed
# package (find_package(rmmd), rmmd::client), start the installed rmmd, run the
# consumer through it and look with the installed rmmctl.
#
# Environment (tests/packaging/CMakeLists.txt): RMMD_SOURCE_DIR, RMMD_BUILD_DIR,
# RMMD_SCRATCH, CMAKE, CMAKE_GENERATOR, CMAKE_MAKE_PROGRAM, CXX, and the RMM
# hints a consumer passes as -D<name>, in RMMD_HINT_<name> for rmm_DIR,
# nvtx3_DIR and rapids_logger_DIR (find_package would read <name> itself
# from the environment).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
require_env RMMD_SOURCE_DIR RMMD_BUILD_DIR RMMD_SCRATCH CMAKE CMAKE_GENERATOR \
  CMAKE_MAKE_PROGRAM CXX RMMD_HINT_rmm_DIR RMMD_HINT_nvtx3_DIR \
  RMMD_HINT_rapids_logger_DIR

src=$RMMD_SOURCE_DIR build=$RMMD_BUILD_DIR scratch=$RMMD_SCRATCH
prefix=$scratch/prefix
rm -rf "$scratch"
mkdir -p "$scratch"

echo "--- cmake --install $build --prefix $prefix"
run_logged "$scratch/install.log" "$CMAKE" --install "$build" --prefix "$prefix"

for f in bin/rmmd bin/rmmctl lib/librmmd_client.so lib/rmmd/librmmd_proto.so lib/rmmd/librmm.so \
  include/rmmd/session.hpp include/rmmd/host_memory_resource.hpp \
  include/rmmd/ipc_memory_resource.hpp include/rmmd/error.hpp \
  lib/cmake/rmmd/rmmdConfig.cmake lib/cmake/rmmd/rmmdConfigVersion.cmake \
  lib/cmake/rmmd/rmmdTargets.cmake lib/systemd/system/rmmd.service lib/sysusers.d/rmmd.conf; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f (under $prefix)"
done
[ ! -e "$src/deploy/tmpfiles.d/rmmd.conf" ] || [ -e "$prefix/lib/tmpfiles.d/rmmd.conf" ] ||
  fail "deploy/tmpfiles.d/rmmd.conf was not installed in lib/tmpfiles.d"
# Private headers and libraries stay private.
if [ -n "$(find "$prefix/include" -name '*.pb.h')" ]; then
  fail "generated protobuf headers were installed"
fi
[ ! -e "$prefix/lib/librmmd_proto.so" ] || fail "librmmd_proto.so is in lib/, not lib/rmmd/"

expect_relocatable_runpaths "$prefix"
ldd "$prefix/bin/rmmd" >"$scratch/ldd.txt"
expect_line "$scratch/ldd.txt" "librmm\\.so => $prefix/bin/\\.\\./lib/rmmd/librmm\\.so" \
  "the installed rmmd uses the bundled librmm"
for f in "$prefix"/lib/cmake/rmmd/*.cmake; do
  expect_no_line "$f" "$build|$src/" "installed CMake files name no build or source path"
done

# The unit runs what was installed.
unit=$prefix/lib/systemd/system/rmmd.service
expect_line "$unit" "^ExecStart=$prefix/bin/rmmd( |$)" "the unit's ExecStart"
expect_no_line "$unit" "/usr/bin/rmm" "the unit names no program outside the prefix"

# The config: from the example, and never overwritten.
if [ -e "$src/deploy/rmmd.conf.example" ]; then
  conf=$prefix/etc/rmmd/rmmd.conf
  cmp -s "$src/deploy/rmmd.conf.example" "$conf" || fail "$conf is not the example config"
  cmp -s "$src/deploy/rmmd.conf.example" "$prefix/share/doc/rmmd/rmmd.conf.example" ||
    fail "share/doc/rmmd/rmmd.conf.example was not installed"
  echo "# edited by the operator" >>"$conf"
  cp "$conf" "$scratch/edited.conf"
  run_logged "$scratch/reinstall.log" "$CMAKE" --install "$build" --prefix "$prefix"
  cmp -s "$scratch/edited.conf" "$conf" || fail "a second install overwrote the edited $conf"
  expect_line "$scratch/reinstall.log" "Keeping: .*etc/rmmd/rmmd.conf" "the reinstall says it kept the config"
fi

echo "--- the consumer project: without the RMM hints, a precise error"
consumer_args=(-G "$CMAKE_GENERATOR" -DCMAKE_MAKE_PROGRAM="$CMAKE_MAKE_PROGRAM"
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_PREFIX_PATH="$prefix")
if "$CMAKE" -S "$here/consumer" -B "$scratch/consumer-nohints" "${consumer_args[@]}" \
  >"$scratch/consumer-nohints.log" 2>&1; then
  fail "the consumer configured without rmm_DIR: it cannot have found RMM's headers"
fi
expect_text "$scratch/consumer-nohints.log" "rmmd::client needs RMM [0-9]+\\.[0-9]+ .*which was not found" \
  "rmmdConfig.cmake says what is missing"
expect_text "$scratch/consumer-nohints.log" \
  "-Drmm_DIR=SITE/librmm/lib64/cmake/rmm -Dnvtx3_DIR=SITE/librmm/lib64/cmake/nvtx3 -Drapids_logger_DIR=SITE/rapids_logger/lib64/cmake/rapids_logger" \
  "rmmdConfig.cmake says which hints to pass"
# rmm_DIR alone: RMM's package loads, but not its rapids_logger.
if "$CMAKE" -S "$here/consumer" -B "$scratch/consumer-somehints" "${consumer_args[@]}" \
  -Drmm_DIR="${RMMD_HINT_rmm_DIR:?}" >"$scratch/consumer-somehints.log" 2>&1; then
  fail "the consumer configured with rmm_DIR alone: RMM's rapids_logger cannot have been found"
fi
expect_text "$scratch/consumer-somehints.log" \
  "found at ${RMMD_HINT_rmm_DIR}, but not all of RMM's own dependencies: .*rapids_logger::rapids_logger" \
  "rmmdConfig.cmake names the RMM dependency that is missing"

echo "--- the consumer project: configure and build against $prefix"
run_logged "$scratch/consumer-configure.log" "$CMAKE" -S "$here/consumer" -B "$scratch/consumer" \
  "${consumer_args[@]}" -Drmm_DIR="${RMMD_HINT_rmm_DIR:?}" -Dnvtx3_DIR="${RMMD_HINT_nvtx3_DIR:?}" \
  -Drapids_logger_DIR="${RMMD_HINT_rapids_logger_DIR:?}"
expect_line "$scratch/consumer/CMakeCache.txt" "^rmmd_DIR:PATH=$prefix/lib/cmake/rmmd$" \
  "the consumer found the installed package"
run_logged "$scratch/consumer-build.log" "$CMAKE" --build "$scratch/consumer" --verbose
# Built from the installed headers only: none of rmmd's source or build tree.
expect_no_line "$scratch/consumer-build.log" "$src/(include|client|daemon|proto)|$build/(proto|client)" \
  "the consumer compiles and links against the install, not rmmd's trees"
consumer=$scratch/consumer/rmmd_consumer

echo "--- no daemon: the consumer's session fails, saying so"
mkdir -p "$scratch/run"
rc=0
"$consumer" "$scratch/run" >"$scratch/consumer-nodaemon.log" 2>&1 || rc=$?
cat "$scratch/consumer-nodaemon.log"
[ "$rc" -eq 3 ] || fail "rmmd_consumer without a daemon exited $rc, expected 3 (rmmd::session_error)"
expect_line "$scratch/consumer-nodaemon.log" "^rmmd_consumer: no session: .*$scratch/run" \
  "the error names the runtime directory"

echo "--- the installed rmmd, the consumer through it, the installed rmmctl"
"$prefix/bin/rmmd" --runtime-dir "$scratch/run" 2>"$scratch/rmmd.log" &
daemon=$!
stop_daemon() {
  if kill -TERM "$daemon" 2>/dev/null; then wait "$daemon" || true; fi
}
trap stop_daemon EXIT
# Ready once the installed rmmctl gets an answer (at most 30 s).
deadline=$((SECONDS + 30))
until "$prefix/bin/rmmctl" --runtime-dir "$scratch/run" stats >/dev/null 2>&1; do
  kill -0 "$daemon" 2>/dev/null || {
    cat "$scratch/rmmd.log" >&2
    fail "the installed rmmd exited at start-up"
  }
  [ "$SECONDS" -lt "$deadline" ] || {
    cat "$scratch/rmmd.log" >&2
    fail "the installed rmmd did not answer within 30 s"
  }
  sleep 0.05
done
run_logged "$scratch/consumer-run.log" "$consumer" "$scratch/run"
cat "$scratch/consumer-run.log"
expect_line "$scratch/consumer-run.log" "^rmmd_consumer: session [0-9]+, pool '.+': 1048576 bytes .*: ok$" \
  "the consumer allocated through the installed daemon"
"$prefix/bin/rmmctl" --runtime-dir "$scratch/run" stats
trap - EXIT
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
[ "$rc" -eq 0 ] || {
  cat "$scratch/rmmd.log" >&2
  fail "the installed rmmd exited $rc on SIGTERM"
}
echo "PASS: installed into $prefix; consumer built and served"
