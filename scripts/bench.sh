#!/usr/bin/env bash
# Runs rmmd_bench on this GPU host: every section in one run on GPU 0, the
# table on stdout (and beside the JSON), the figures in
# bench/results/<gpu>.json (<gpu>-quick.json with --quick; some sections
# only, --sections f,...: <gpu>-sections-f....json, so that a full run's file
# stays).
#
#   RMMD_BUNDLE=.gpu ./scripts/bench.sh [--quick] [--sections LIST] [more rmmd_bench options]
#
# RMMD_BUNDLE=DIR: use the programs of a gpu-bundle (DIR/bin, DIR/env)
# instead of building. RMMD_BENCH_OUT_DIR=DIR: write there instead of
# bench/results (e.g. $OUT on a lent device machine).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ -n "${RMMD_BUNDLE:-}" ]; then
  # shellcheck source=/dev/null
  source "$RMMD_BUNDLE/env"  # PATH and LD_LIBRARY_PATH for the bundle's libraries
  b=$(cd "$RMMD_BUNDLE/bin" && pwd)
  rmmd=$b/rmmd bench=$b/rmmd_bench
  [ -x "$bench" ] || { echo "bench.sh: $bench is missing: bundle build/bench/rmmd_bench too (bench/README.md)" >&2; exit 2; }
else
  ./scripts/build.sh --target rmmd rmmd_bench
  rmmd=build/daemon/rmmd bench=build/bench/rmmd_bench
fi
slug=$("$bench" --gpu-slug) || exit 2  # it says why (no GPU, no driver)
suffix= sections= prev=
for a in "$@"; do
  [ "$a" = --quick ] && suffix=-quick
  [ "$prev" = --sections ] && sections=$a
  case $a in --sections=*) sections=${a#--sections=} ;; esac
  prev=$a
done
[ -n "$sections" ] && suffix=-sections-${sections//,/-}$suffix
dir=${RMMD_BENCH_OUT_DIR:-bench/results}
mkdir -p "$dir"
out=$dir/$slug$suffix.json
echo "bench.sh: $bench --rmmd $rmmd --out $out $*"
"$bench" --rmmd "$rmmd" --out "$out" "$@" | tee "$dir/$slug$suffix.txt"
