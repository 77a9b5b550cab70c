#!/usr/bin/env bash
# Builds the libFuzzer targets (the fuzz preset: clang 14, ASan + UBSan) and
# runs each for a bounded time, starting from its seed corpus in the tree.
#   ./scripts/fuzz.sh [--seconds N] [TARGET...]
# TARGET: session, config, service, peer_service, client_messages, manifest,
# state_file (default: all, N = 60 s each, as many at once as there are cores:
# each fuzzer is one process on one core, so each still gets its N s). What a run finds goes to build-fuzz/corpus/TARGET
# (not into the tree); a crash leaves its input in build-fuzz/artifacts/ and
# fails the script. DEVELOPERS.md ("Fuzzing") gives the long-run command and
# says how a crash becomes a regression input.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seconds=60
if [ "${1:-}" = --seconds ]; then seconds=$2; shift 2; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(session config service peer_service client_messages manifest state_file)
./scripts/build.sh --preset fuzz

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# One target for `seconds`; its verdict in build-fuzz/verdict-TARGET.
fuzz_one() {
  local t=$1 corpus=build-fuzz/corpus/$1 artifacts=build-fuzz/artifacts/$1/
  local log=build-fuzz/fuzz-$1.log
  mkdir -p "$corpus" "$artifacts"
  echo "fuzz: $t for ${seconds} s (log: $log)"
  if build-fuzz/tests/fuzz/rmmd_fuzz_"$t" -max_total_time="$seconds" -print_final_stats=1 \
       -artifact_prefix="$artifacts" "$corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o "cov: [0-9]*" "$log" | tail -1 || true)
    echo "fuzz: $t: ${runs:-?} runs in ${seconds} s, ${cov:-cov: ?}, no crash"
    echo ok >"build-fuzz/verdict-$t"
  else
    {
      echo "fuzz: $t FAILED; the end of its log:"
      tail -40 "$log"
      echo "fuzz: reproduce with: build-fuzz/tests/fuzz/rmmd_fuzz_$t $artifacts<the file named above>"
    } >&2
    echo failed >"build-fuzz/verdict-$t"
  fi
}

at_once=$(nproc)
running=0
for t in "${targets[@]}"; do
  rm -f "build-fuzz/verdict-$t"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$at_once" ]; then wait -n || true; running=$((running - 1)); fi
done
wait
failed=()
for t in "${targets[@]}"; do
  [ "$(cat "build-fuzz/verdict-$t" 2>/dev/null)" = ok ] || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
