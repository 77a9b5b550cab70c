#!/usr/bin/env bash
# Every GPU suite, whole, on the GPU host, with one summary line per suite.
# A change to daemon/, client/, python/ or the tests resolves only with this
# summary from its final commit (DEVELOPERS.md).
#
# Here (the build machine), from the checkout's root:
#   scripts/gpu-check.sh bundle [BUNDLE]     # BUNDLE default .gpu
# builds the default preset's programs that the GPU suites run, and
# rmmd_bench (so that one call can also run `RMMD_BUNDLE=BUNDLE
# scripts/bench.sh --sections ...`), and bundles them with their libraries
# (../shared/tools/gpu-bundle, or $RMMD_GPU_BUNDLE_TOOL).
#
# There (carry BUNDLE.txz, the bundle packed; the checkout travels with it), as root:
#   scripts/gpu-check.sh run [BUNDLE]
# runs, in this order, each suite in full:
#   gpu            rmmd_gpu_tests (six shards at once) with an IMEX channel (made if missing), but
#                  the restart soak (below); the lease-rounds tests for
#                  RMMD_GPU_CHECK_LEASE_ROUNDS rounds (default 20; alone they run 100)
#   gpu-no-imex    the fabric, shared-buffer, example and peering tests of
#                  rmmd_gpu_tests with the channel removed (each fabric test
#                  covers one of the two cases and skips in the other)
#   integration    rmmd_integration_tests, the peering, restart and fd-store
#                  integration tests and the host soak, as root (clients as
#                  other users from a copy of the bundle in /opt/rmmdb)
#   manifest       rmmd_buffer_manifest_tests
#   examples       rmmd_example_tests
#   python         python/tests with the host's Python (PyTorch, CuPy, JAX), by test
#                  in RMMD_GPU_CHECK_PY_SHARDS (6) pytest processes at once
#   python-exclusive  the Python tests marked gpu_exclusive (they read the
#                  device's free memory), alone after those above
#   gpu-exclusive  the rmmd_gpu_tests suites named *Alone (they fill the
#                  device), alone after those
#   soak           RestartSoak.* for RMMD_GPU_CHECK_SOAK_ROUNDS rounds
#                  (default 10; the 100-round soak is its own run)
# First gpu-no-imex (in shards, the channel removed); then, with the channel,
# gpu (in shards), python (in shards), soak and the CPU-only suites
# (integration in three parts, then manifest, examples) at once; then
# python-exclusive and gpu-exclusive alone. Each suite's log goes to
# gpu-check-logs/gpu-check-<suite>.log (and, where $OUT is set, all of them
# packed into $OUT/gpu-check-logs.tgz). A suite passes when its program exits 0; the line
# says how many tests passed, failed and skipped, and why each skipped.
# Exit status: 0 when every suite passed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
step=${1:-}
bundle=${2:-.gpu}

programs=(build/daemon/rmmd build/rmmctl/rmmctl build/client/librmmd_c.so
  build/tests/rmmd_gpu_tests build/tests/rmmd_integration_tests
  build/tests/rmmd_buffer_manifest_tests build/tests/rmmd_example_tests
  build/tests/rmmd_peering_integration_tests build/tests/rmmd_buffer_restart_tests
  build/tests/rmmd_fd_store_restart_tests build/tests/rmmd_soak build/tests/rmmd_soak_client
  build/tests/rmmd_test_client build/tests/rmmd_share_client build/tests/rmmd_session_opener
  build/tests/rmmd_restart_soak_client build/tests/rmmd_fd_store_test_service build/tests/rmmd_stable_client
  build/examples/rmmd_manifest_reader
  build/examples/rmmd_hello build/examples/rmmd_share_producer build/examples/rmmd_share_consumer
  build/bench/rmmd_bench)

bundle_step() {
  set -e
  ./scripts/build.sh
  local tool=${RMMD_GPU_BUNDLE_TOOL:-$root/../shared/tools/gpu-bundle}
  rm -rf "$bundle"
  local found=()
  for p in "${programs[@]}"; do
    [ -f "$p" ] && found+=("$p") || { echo "gpu-check: no $p (not built?)" >&2; exit 1; }
  done
  "$tool" "$bundle" "${found[@]}"
  strip --strip-debug "$bundle"/bin/* "$bundle"/lib/* 2>/dev/null || true
  # Python packages the host lacks that tests compare against (the
  # torch_memory_saver test), from wheels here (a wheel is a zip of what an
  # install puts in site-packages, except what it keeps under NAME.data/purelib
  # or platlib, which an install moves up): RMMD_GPU_CHECK_WHEELS, a glob.
  local wheel lib
  for wheel in ${RMMD_GPU_CHECK_WHEELS:-.whl/torch_memory_saver-*.whl}; do
    [ -f "$wheel" ] || continue
    mkdir -p "$bundle/pylib" && unzip -qo "$wheel" -d "$bundle/pylib"
    for lib in "$bundle"/pylib/*.data/purelib "$bundle"/pylib/*.data/platlib; do
      [ -d "$lib" ] && cp -a "$lib"/. "$bundle/pylib/" && rm -rf "$lib"
    done
    echo "gpu-check: $(basename "$wheel") into $bundle/pylib"
  done
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo '+changes')" \
    >"$bundle/commit"
  du -sh "$bundle"
  # The device tool carries 64 MiB with the checkout: carry BUNDLE.txz (the
  # run step unpacks it where BUNDLE is missing).
  tar cf - "$bundle" | xz -T2 -6 >"$bundle.txz"
  du -sh "$bundle.txz"
}

# Logs go to gpu-check-logs/ (RMMD_GPU_CHECK_LOGS); where $OUT is set (the
# device tool's folder, which brings back only a few files), they are also
# packed into $OUT/gpu-check-logs.tgz at the end, or when a TERM cuts the run
# short (run it under `timeout` shorter than the call's limit).
logs=${RMMD_GPU_CHECK_LOGS:-$root/gpu-check-logs}
pack_logs() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/gpu-check-logs.tgz" -C "$logs" . 2>/dev/null || true
}
# RMMD_GPU_CHECK_SUITES: run only these (a partial run does not resolve an
# issue; the summary says which suites it left out).
all_suites="gpu gpu-no-imex integration manifest examples python python-exclusive gpu-exclusive soak"
suites=${RMMD_GPU_CHECK_SUITES:-$all_suites}
wanted() { [[ " $suites " == *" $1 "* ]]; }

channel=/dev/nvidia-caps-imex-channels/channel0
make_channel() {
  [ -e "$channel" ] && return 0
  local major
  major=$(awk '/nvidia-caps-imex-channels/{print $1}' /proc/devices)
  [ -n "$major" ] || { echo "gpu-check: the driver offers no IMEX channels" >&2; return 1; }
  mkdir -p "$(dirname "$channel")" && mknod "$channel" c "$major" 0
}

# One line from a GoogleTest log (one program or several): passed, failed,
# skipped, and each skip's reason with how often it was given.
gtest_line() {
  local log=$1 passed failed skipped reasons
  passed=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | awk '{n += $4} END {print n + 0}')
  skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$log" | awk '{n += $4} END {print n + 0}')
  failed=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{n += $4} END {print n + 0}')
  reasons=$(grep -A1 -E ': Skipped$' "$log" | grep -vE ': Skipped$|^--$' | sed 's/^ *//' |
    sort | uniq -c | sed -E 's/^ *([0-9]+) /\1x /' | paste -sd ';' - | cut -c1-600)
  echo "$passed passed, $failed failed, $skipped skipped${reasons:+ ($reasons)}"
}

# run_suite NAME KIND(gtest|pytest|plain) COMMAND...: runs it, keeps its
# log and writes its summary line to $logs/line-NAME.
run_suite() {
  local name=$1 kind=$2; shift 2
  local log="$logs/gpu-check-$name.log" start=$SECONDS rc counts verdict=PASS
  "$@" >"$log" 2>&1
  rc=$?
  case $kind in
    gtest) counts=$(gtest_line "$log") ;;
    pytest) counts=$(pytest_counts "$log") ;;
    *) counts=$(tail -1 "$log" | cut -c1-200) ;;
  esac
  [ "$rc" -eq 0 ] || verdict=FAIL
  printf 'gpu-check: %-12s %s  %4d s  exit %d  %s\n' "$name" "$verdict" $((SECONDS - start)) "$rc" \
    "$counts" | tee "$logs/line-$name"
}

# The GPU suite in RMMD_GPU_CHECK_SHARDS shards at once (default 6; each
# test has a daemon and pools of its own, and none reads the driver's
# totals), as one suite.
gpu_suite() {
  local filter=$1 rc=0 shards=${RMMD_GPU_CHECK_SHARDS:-6} pids=() i
  for ((i = 1; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i rmmd_gpu_tests --gtest_filter="$filter" \
      >"$logs/shard-$i.log" 2>&1 &
    pids+=($!)
  done
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=0 rmmd_gpu_tests --gtest_filter="$filter" 2>&1 || rc=1
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for ((i = 1; i < shards; i++)); do cat "$logs/shard-$i.log"; done
  return $rc
}

# The Python suite in RMMD_GPU_CHECK_PY_SHARDS pytest processes at once
# (default 6), each every Nth test of the whole suite (RMMD_PYTEST_SHARD,
# conftest.py): one file's long tests spread over all of them (every test
# has a daemon and a runtime directory of its own). Each shard prints its
# own summary line; pytest_counts sums them.
python_suite() {
  local shards=${RMMD_GPU_CHECK_PY_SHARDS:-6} rc=0 pids=() i
  for ((i = 0; i < shards; i++)); do
    RMMD_PYTEST_SHARD=$i/$shards python/tests/run_gpu.sh "$bundle" -v -v -o faulthandler_timeout=150 \
      --durations=5 -m "not gpu_exclusive" >"$logs/py-shard-$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for ((i = 0; i < shards; i++)); do cat "$logs/py-shard-$i.log"; done
  return $rc
}

# Sums pytest's final lines ("3 failed, 40 passed, 2 skipped in 9.1s") of
# a log holding one or several runs, and each skip's reason (-rs) with how
# often it was given.
pytest_counts() {
  local counts reasons
  counts=$(grep -E '^[= ]*[0-9]+ (passed|failed|skipped|errors?)[ ,]' "$1" | tr -d '=' |
    grep -oE '[0-9]+ (passed|failed|skipped|errors?)' |
    awk '{n[$2] += $1} END {printf "%d passed, %d failed, %d skipped, %d errors", n["passed"], n["failed"], n["skipped"], n["error"] + n["errors"]}')
  reasons=$(grep -E '^SKIPPED \[[0-9]+\] ' "$1" | sed -E 's/^SKIPPED \[([0-9]+)\] [^ ]+:[0-9]+: /\1 /' |
    awk '{k = $1; $1 = ""; n[substr($0, 2)] += k} END {for (r in n) printf "%dx %s;", n[r], r}' |
    sed 's/;$//' | cut -c1-600)
  echo "$counts${reasons:+ ($reasons)}"
}

# Three at once (each test has a daemon of its own): rmmd_integration_tests
# in two shards, and the other programs one after another. In one chain it
# took 450 s on the GPU host (06c2cf1), the longest suite.
integration_suite() {
  local rc=0 pids=() i
  for i in 0 1; do
    GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i rmmd_integration_tests >"$logs/int-$i.log" 2>&1 &
    pids+=($!)
  done
  (rmmd_peering_integration_tests && rmmd_buffer_restart_tests && rmmd_fd_store_restart_tests &&
    rmmd_soak --backend host --rounds 20 --clients 6 --progress-every 0) >"$logs/int-2.log" 2>&1 &
  pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  cat "$logs"/int-[012].log
  return $rc
}

run_step() {
  if [ ! -d "$bundle" ] && [ -f "$bundle.txz" ]; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall()' "$bundle.txz"
  fi
  mkdir -p "$logs" && rm -f "$logs"/*.log "$logs"/line-*
  trap 'echo "gpu-check: cut short (TERM)"; pack_logs; exit 124' TERM
  # shellcheck disable=SC1091
  source "$bundle/env"
  local bin
  bin=$(cd "$bundle/bin" && pwd)
  # Tests that run clients as other users need the programs where they can
  # reach them.
  rm -rf /opt/rmmdb && cp -r "$bundle" /opt/rmmdb && chmod -R a+rX /opt/rmmdb
  export RMMD_BIN_DIR=/opt/rmmdb/bin LD_LIBRARY_PATH="/opt/rmmdb/lib:$LD_LIBRARY_PATH"
  export RMMD_TEST_CERTS_SCRIPT="$root/scripts/make-test-certs.sh"
  # Tests that read the source tree (deploy/) find it at the path the build
  # compiled in; point that path here if nothing is there.
  local src
  src=$(strings "$bin/rmmd_gpu_tests" | grep -m1 -E '^/.*/deploy$' | sed 's,/deploy$,,' || true)
  if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
  nvidia-smi -L | sed 's/^/gpu-check: /'

  # First, without it: the tests that skip where there is one, and the
  # POSIX-fd cases again on pools that cannot take fabric handles (first, so
  # that a run cut short by its call's limit still has them: 06c2cf1's was).
  if wanted gpu-no-imex; then
    rm -f "$channel"
    run_suite gpu-no-imex gtest gpu_suite \
      'FabricPool.*:PeeringWithoutImex.*:PeeringWithoutImexRequired.*:*DeviceShared*PosixFd*:*ReadOnlyDeviceBuffers*PosixFd*:*ShareExamples*:*Outlive*'
  fi
  make_channel || true

  # With the channel: everything at once (the CPU-only suites one after
  # another beside the GPU ones).
  local pids=()
  if wanted gpu; then
    RMMD_LEASE_ROUNDS=${RMMD_GPU_CHECK_LEASE_ROUNDS:-20} run_suite gpu gtest gpu_suite '-RestartSoak.*:*Alone.*' &
    pids+=($!)
  fi
  if wanted python; then run_suite python pytest python_suite & pids+=($!); fi
  # Beside the rest: it then leaves out its device-wide used-memory check
  # (the others' processes are in it); its standalone 100-round run keeps it.
  if wanted soak; then
    RMMD_SOAK_SHARED_GPU=1 RMMD_SOAK_ROUNDS=${RMMD_GPU_CHECK_SOAK_ROUNDS:-10} \
      run_suite soak gtest rmmd_gpu_tests --gtest_filter='RestartSoak.*' &
    pids+=($!)
  fi
  (! wanted integration || run_suite integration gtest integration_suite
    ! wanted manifest || run_suite manifest gtest rmmd_buffer_manifest_tests
    ! wanted examples || run_suite examples gtest rmmd_example_tests) &
  pids+=($!)
  wait "${pids[@]}"
  # Alone on the GPUs: the tests that read a device's free memory or fill it.
  if wanted python-exclusive; then
    run_suite python-exclusive pytest python/tests/run_gpu.sh "$bundle" -m gpu_exclusive
  fi
  if wanted gpu-exclusive; then
    run_suite gpu-exclusive gtest rmmd_gpu_tests --gtest_filter='*Alone.*'
  fi

  echo "gpu-check: summary of commit $(cat "$bundle/commit" 2>/dev/null || echo unknown)"
  local failed=0
  for name in $suites; do
    if [ -f "$logs/line-$name" ]; then
      cat "$logs/line-$name"
      grep -q " PASS " "$logs/line-$name" || failed=1
    else
      echo "gpu-check: $name did not finish"; failed=1
    fi
  done
  for name in $all_suites; do wanted "$name" || echo "gpu-check: $name NOT RUN (RMMD_GPU_CHECK_SUITES)"; done
  [ "$failed" -eq 0 ] && echo "gpu-check: every suite run passed" || echo "gpu-check: FAILED"
  pack_logs
  return "$failed"
}

case $step in
  bundle) bundle_step ;;
  run) run_step ;;
  *) echo "usage: scripts/gpu-check.sh bundle|run [BUNDLE]" >&2; exit 2 ;;
esac
