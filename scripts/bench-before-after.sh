#!/usr/bin/env bash
# The same sections with two builds, in turned order (before then after,
# then after then before), so that a machine that drifts during the call
# does not read as a change: "no speed lost" (docs/benchmarks.md).
#
# Here (the build machine), with BEFORE a checkout of the older commit (or
# a bundle made from one earlier: a folder with bin/rmmd_bench and env):
#   scripts/bench-before-after.sh bundle BEFORE         # packs .gpub.txz: before/ and after/ (this tree)
# There (carry .gpub.txz):
#   scripts/bench-before-after.sh run [SECTIONS]        # default a,a8,c,h
#
# Each run's JSON and table go into one archive, $OUT/bench-before-after.tgz
# (the device tool brings back at most 8 files), and each run's last table
# line to stdout. Compare with bench/compare_runs.py BEFORE.json AFTER.json.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tool=${RMMD_GPU_BUNDLE_TOOL:-$root/../shared/tools/gpu-bundle}
programs=(build/bench/rmmd_bench build/daemon/rmmd build/rmmctl/rmmctl build/bench/rmmd_host_pairs)

bundle_one() {  # TREE DEST
  (cd "$1" && ./scripts/build.sh --target rmmd_bench rmmd rmmctl rmmd_host_pairs >/dev/null) || exit 1
  local list=()
  for p in "${programs[@]}"; do [ -f "$1/$p" ] && list+=("$1/$p"); done
  "$tool" "$2" "${list[@]}" >/dev/null || exit 1
  strip --strip-debug "$2"/bin/* "$2"/lib/* 2>/dev/null || true
  git -C "$1" rev-parse --short HEAD >"$2/commit"
}

case ${1:-} in
  bundle)
    [ -d "${2:-}" ] || { echo "usage: $0 bundle BEFORE" >&2; exit 2; }
    rm -rf .gpub && mkdir .gpub
    if [ -x "$2/bin/rmmd_bench" ]; then
      cp -r "$2" .gpub/before
      [ -f .gpub/before/commit ] || echo before >.gpub/before/commit
    else
      bundle_one "$(cd "$2" && pwd)" .gpub/before
    fi
    bundle_one "$root" .gpub/after
    tar cf - .gpub | xz -T2 -6 >.gpub.txz
    du -sh .gpub.txz ;;
  run)
    sections=${2:-a,a8,c,h}
    [ -d .gpub ] || python3 -c 'import tarfile; tarfile.open(".gpub.txz").extractall()'
    out=$(mktemp -d /tmp/bench-before-after-XXXX)
    nvidia-smi -L
    one() {  # SIDE RUN
      local name
      name="sections-${sections//,/-}-$1-$(cat .gpub/$1/commit)-run$2"
      (source ".gpub/$1/env"
       rmmd_bench --rmmd "$root/.gpub/$1/bin/rmmd" --sections "$sections" \
         --out "$out/$name.json" >"$out/$name.txt" 2>&1)
      echo "$name: exit $? at $(date +%T)"
    }
    one before 1; one after 1; one after 2; one before 2
    tar czf "${OUT:-.}/bench-before-after.tgz" -C "$out" . && echo "packed into ${OUT:-.}/bench-before-after.tgz" ;;
  *) echo "usage: $0 bundle BEFORE | run [SECTIONS]" >&2; exit 2 ;;
esac
