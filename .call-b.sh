#!/usr/bin/env bash
# Device call B of session 51 (not committed): bench sections p, a8, f; then
# the checkpoint bench, cold (the fastest peers and the page-cache read) and
# rmmd warm. Everything lands in $OUT as it goes.
source .gpu/env
nvidia-smi --query-gpu=index,uuid --format=csv,noheader
ch=/dev/nvidia-caps-imex-channels/channel0
[ -e $ch ] || { mkdir -p "$(dirname $ch)" && mknod $ch c "$(awk '/nvidia-caps-imex-channels/{print $1}' /proc/devices)" 0; }
export RMMD_TEST_CERTS_SCRIPT=$PWD/scripts/make-test-certs.sh
RMMD_BUNDLE=.gpu RMMD_BENCH_OUT_DIR=$OUT timeout 150 scripts/bench.sh --sections p,a8,f > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -E "^  (pass|MISS)|first|cold p50|MiB  " "$OUT/bench.log" | head -60
export PYTHONPATH=$PWD/.gpu/pylib:$PWD/python RMMD_LIBRARY=$PWD/.gpu/bin/librmmd_c.so
timeout 190 python bench/python/checkpoint_bench.py --size-gib 20 --shards 4 --dir /tmp/ckpt \
  --loaders raw-buffered,fastsafetensors,runai,rmmd --cache cold --rmmd .gpu/bin/rmmd \
  --out "$OUT/ckpt-cold.json" > "$OUT/ckpt-cold.txt" 2>&1
echo "ckpt cold rc=$?"; grep -v '^{' "$OUT/ckpt-cold.txt"
timeout 60 python bench/python/checkpoint_bench.py --size-gib 20 --shards 4 --dir /tmp/ckpt \
  --loaders safetensors,rmmd --cache warm --rmmd .gpu/bin/rmmd \
  --out "$OUT/ckpt-warm.json" > "$OUT/ckpt-warm.txt" 2>&1
echo "ckpt warm rc=$?"; grep -v '^{' "$OUT/ckpt-warm.txt"
