#!/usr/bin/env bash
# Puts together what tests/packaging/gpu_host_install_check.sh needs on a GPU
# host, in OUTDIR (default .gpu/install-check; .gpu/ is git-ignored): the
# packages that scripts/package.sh builds, the script itself and the sources
# of tests/packaging/consumer. Nothing else of the tree travels.
#   scripts/gpu-install-bundle.sh [--no-archive] [OUTDIR]
# --no-archive leaves out the portable archive (about 12 MB; its step is then
# skipped there). On the GPU host, as root:
#   OUTDIR/gpu_host_install_check.sh --require-gpu OUTDIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
archive=1
if [ "${1:-}" = --no-archive ]; then archive=0; shift; fi
out=$(realpath -m "${1:-.gpu/install-check}")
./scripts/package.sh build/package >build/package.log 2>&1 || {
  tail -40 build/package.log >&2
  echo "gpu-install-bundle: scripts/package.sh failed (log: build/package.log)" >&2
  exit 1
}
rm -rf "$out"
mkdir -p "$out/consumer"
cp build/package/rmmd_*.deb build/package/rmmd-dev_*.deb "$out/"
[ "$archive" -eq 0 ] || cp build/package/rmmd-*-linux-*.tar.gz "$out/"
cp tests/packaging/gpu_host_install_check.sh "$out/"
# The Python package as a wheel (pure Python: pip installs it there without a
# build or the network), built here from a copy so that the tree stays clean
# (pip fetches setuptools for the build from PyPI, as `pip install ./python` does).
py_build=$(mktemp -d)
cp -r python/pyproject.toml python/README.md python/rmmd "$py_build/"
find "$py_build" -name __pycache__ -prune -exec rm -rf {} +
.venv/bin/python -m pip wheel --quiet --no-deps -w "$out/python" "$py_build" \
  >build/python-wheel.log 2>&1 || {
  cat build/python-wheel.log >&2
  echo "gpu-install-bundle: building the Python wheel failed" >&2
  exit 1
}
rm -rf "$py_build"
cp tests/packaging/consumer/CMakeLists.txt tests/packaging/consumer/main.cpp "$out/consumer/"
echo "gpu-install-bundle: $(du -sh "$out" | cut -f1) in $out:"
ls -l "$out"
rel=${out#"$root"/}
echo "on the GPU host, as root, from the repository root: $rel/gpu_host_install_check.sh --require-gpu $rel"
