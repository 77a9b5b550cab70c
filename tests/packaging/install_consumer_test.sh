#!/usr/bin/env bash
# `cmake --install` into a scratch prefix, then what a developer and an
# operator do with it: build tests/packaging/consumer against the installed
# package, with CMake (find_package(rmmd), rmmd::client, with the RMM that
# ships in the package) and with pkg-config (rmmd.pc), start the installed
# rmmd, run both consumers through it and look with the installed rmmctl.
#
# Environment (tests/packaging/CMakeLists.txt): RMMD_SOURCE_DIR, RMMD_BUILD_DIR,
# RMMD_SCRATCH, CMAKE, CMAKE_GENERATOR, CMAKE_MAKE_PROGRAM, CXX,
# RMMD_CUDA_INCLUDE_DIR and RMMD_CUDA_LIBRARY_DIR (the CUDA runtime's, for the
# pkg-config build), and RMMD_HINT_rmm_DIR (the wheel's RMM package, which
# must not be what the consumer uses).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
require_env RMMD_SOURCE_DIR RMMD_BUILD_DIR RMMD_SCRATCH CMAKE CMAKE_GENERATOR \
  CMAKE_MAKE_PROGRAM CXX RMMD_CUDA_INCLUDE_DIR RMMD_CUDA_LIBRARY_DIR RMMD_HINT_rmm_DIR

src=$RMMD_SOURCE_DIR build=$RMMD_BUILD_DIR scratch=$RMMD_SCRATCH
prefix=$scratch/prefix
rm -rf "$scratch"
mkdir -p "$scratch"

echo "--- cmake --install $build --prefix $prefix"
run_logged "$scratch/install.log" "$CMAKE" --install "$build" --prefix "$prefix"

for f in bin/rmmd bin/rmmctl lib/librmmd_client.so lib/rmmd/librmmd_proto.so lib/rmmd/librmm.so \
  lib/rmmd/libgrpc++.so.1.51 lib/rmmd/libprotobuf.so.32 \
  include/rmmd/session.hpp include/rmmd/host_memory_resource.hpp include/rmmd/admin.hpp \
  include/rmmd/ipc_memory_resource.hpp include/rmmd/error.hpp \
  lib/cmake/rmmd/rmmdConfig.cmake lib/cmake/rmmd/rmmdConfigVersion.cmake \
  lib/cmake/rmmd/rmmdTargets.cmake lib/pkgconfig/rmmd.pc \
  lib/rmmd/rmm/include/rmm/device_buffer.hpp lib/rmmd/rmm/lib64/cmake/rmm/rmm-config.cmake \
  lib/rmmd/rmm/lib64/librmm.so lib/rmmd/rapids_logger/lib64/librapids_logger.so \
  lib/systemd/system/rmmd.service lib/sysusers.d/rmmd.conf share/doc/rmmd/third-party/libgrpc29/copyright; do
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
expect_line "$scratch/ldd.txt" "libgrpc\\.so\\.29 => $prefix/(bin/\\.\\./)?lib/rmmd/libgrpc\\.so\\.29" \
  "the installed rmmd uses the bundled gRPC, also where the program does not name it"
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

consumer_args=(-G "$CMAKE_GENERATOR" -DCMAKE_MAKE_PROGRAM="$CMAKE_MAKE_PROGRAM"
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_PREFIX_PATH="$prefix")
echo "--- the consumer project: RMM's package where it is not whole, a precise error"
if "$CMAKE" -S "$here/consumer" -B "$scratch/consumer-nologger" "${consumer_args[@]}" \
  -Drapids_logger_DIR="$scratch/nowhere" >"$scratch/consumer-nologger.log" 2>&1; then
  fail "the consumer configured without rapids_logger: RMM cannot have been whole"
fi
expect_text "$scratch/consumer-nologger.log" \
  "needs RMM, found at $prefix/lib/rmmd/rmm/lib64/cmake/rmm, but not all of RMM's own dependencies: .*rapids_logger::rapids_logger" \
  "rmmdConfig.cmake names the RMM dependency that is missing"
expect_text "$scratch/consumer-nologger.log" "come with rmmd in $prefix/lib/rmmd/rmm and $prefix/lib/rmmd/rapids_logger" \
  "rmmdConfig.cmake says where RMM should have been"
# A CMake older than RMM's package needs (Debian's 3.25, where installed).
old_cmake=$(command -v /usr/bin/cmake || true)
if [ -n "$old_cmake" ] && "$old_cmake" --version | grep -qE 'version 3\.(2[2-9]|[3-9][0-9])\.'; then
  if "$old_cmake" -S "$here/consumer" -B "$scratch/consumer-oldcmake" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON >"$scratch/consumer-oldcmake.log" 2>&1; then
    fail "the consumer configured with $old_cmake, older than RMM's package allows"
  fi
  expect_text "$scratch/consumer-oldcmake.log" "needs CMake >= 4.0 .*pkg-config --cflags --libs rmmd" \
    "rmmdConfig.cmake says why an old CMake cannot build a client, and what to do"
else
  echo "(no CMake 3.22-3.x at /usr/bin/cmake: the old-CMake message is not checked)"
fi

echo "--- the consumer project: configure and build against $prefix, with the RMM that ships there"
run_logged "$scratch/consumer-configure.log" "$CMAKE" -S "$here/consumer" -B "$scratch/consumer" \
  "${consumer_args[@]}"
expect_line "$scratch/consumer/CMakeCache.txt" "^rmmd_DIR:PATH=$prefix/lib/cmake/rmmd$" \
  "the consumer found the installed package"
expect_line "$scratch/consumer/CMakeCache.txt" "^rmm_DIR:PATH=$prefix/lib/rmmd/rmm/lib64/cmake/rmm$" \
  "the consumer found the RMM that ships with rmmd"
run_logged "$scratch/consumer-build.log" "$CMAKE" --build "$scratch/consumer" --verbose
# Built from the installed headers only: none of rmmd's source or build tree,
# nor the wheel that rmmd was built with.
wheel_site=$(cd "$RMMD_HINT_rmm_DIR/../../../.." && pwd)
expect_no_line "$scratch/consumer-build.log" "$src/(include|client|daemon|proto)|$build/(proto|client)|$wheel_site" \
  "the consumer compiles and links against the install, not rmmd's trees or the wheel"
consumer=$scratch/consumer/rmmd_consumer

echo "--- the consumer built with pkg-config (rmmd.pc) and g++ alone"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
read -ra pc_cflags <<<"$(pkg-config --cflags rmmd)"
read -ra pc_libs <<<"$(pkg-config --libs rmmd)"
run_logged "$scratch/consumer-pc.log" "$CXX" -std=c++20 -Wall -Wextra -Werror \
  "$here/consumer/main.cpp" "${pc_cflags[@]}" -I"$RMMD_CUDA_INCLUDE_DIR" "${pc_libs[@]}" \
  -L"$RMMD_CUDA_LIBRARY_DIR" -lcudart -o "$scratch/rmmd_consumer_pc"
# The definitions choose CCCL's ABI namespaces: rmmd.pc gives what CMake gives.
# NDEBUG is the build type's (Release), not a package's.
defines() { grep -oE -- '-D[A-Z_]+(=[A-Z_]+)?' | grep -vx -- -DNDEBUG | sort -u; }
grep -E -- "-c .*consumer/main\.cpp" "$scratch/consumer-build.log" | defines >"$scratch/defines-cmake.txt"
printf '%s\n' "${pc_cflags[@]}" | defines >"$scratch/defines-pc.txt"
diff -u "$scratch/defines-cmake.txt" "$scratch/defines-pc.txt" ||
  fail "rmmd.pc's definitions (+) are not the ones CMake's packages give a client (-): update RMMD_PC_DEFINITIONS"

echo "--- a C program against the C ABI, with pkg-config (rmmd-c.pc) and cc alone"
read -ra c_cflags <<<"$(pkg-config --cflags rmmd-c)"
read -ra c_libs <<<"$(pkg-config --libs rmmd-c)"
run_logged "$scratch/c-consumer-build.log" "${CC:-cc}" -std=c11 -Wall -Wextra -Werror \
  "$here/consumer/c_consumer.c" "${c_cflags[@]}" "${c_libs[@]}" -o "$scratch/rmmd_c_consumer"

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
run_logged "$scratch/consumer-pc-run.log" "$scratch/rmmd_consumer_pc" "$scratch/run"
cat "$scratch/consumer-pc-run.log"
expect_line "$scratch/consumer-pc-run.log" "^rmmd_consumer: session [0-9]+, pool '.+': 1048576 bytes .*: ok$" \
  "the pkg-config consumer allocated through the installed daemon"
run_logged "$scratch/c-consumer-run.log" "$scratch/rmmd_c_consumer" "$scratch/run"
cat "$scratch/c-consumer-run.log"
expect_line "$scratch/c-consumer-run.log" "^rmmd_c_consumer: session [0-9]+, library [0-9.]+: ok$" \
  "the C program used the installed daemon through the C ABI"
ldd "$scratch/rmmd_consumer_pc" >"$scratch/consumer-pc-ldd.txt"
expect_line "$scratch/consumer-pc-ldd.txt" "librmm\\.so => $prefix/lib/pkgconfig/\\.\\./\\.\\./lib/rmmd/librmm\\.so" \
  "the pkg-config consumer runs with the bundled librmm"
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
