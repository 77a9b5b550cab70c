#!/usr/bin/env bash
# The `safetensors` package for the GPU host, whose Python (/opt/torch/.venv:
# CPython 3.12, PyTorch, CuPy, NumPy) lacks it and has no network. Two steps:
#
# Here (with the network), into the bundle (.gpu/ is git-ignored):
#   scripts/gpu-safetensors.sh fetch [BUNDLE]      # BUNDLE default .gpu
# downloads the pinned manylinux x86_64 wheel for CPython 3.12 (an abi3
# wheel) into BUNDLE/wheels and checks its sha256.
#
# There (carry BUNDLE), from the checkout's root:
#   scripts/gpu-safetensors.sh install [BUNDLE]
# installs it into BUNDLE/pylib (pip --no-index --target; where that Python
# has no pip, the wheel is unpacked there, which is what installing a wheel
# without scripts or data amounts to) and checks that it imports. Then
#   export PYTHONPATH=BUNDLE/pylib${PYTHONPATH:+:$PYTHONPATH}
# (python/tests/run_gpu.sh does it when BUNDLE/pylib exists).
#
# RMMD_PYTHON: the Python to install for (default /opt/torch/.venv/bin/python).
set -euo pipefail
version=0.8.0
wheel=safetensors-$version-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
sha256=fd6f3f93c9a0a7cc2788ee63fb763353d4bd2e89b0751bc78fcf7dda00bea774  # PyPI's

usage() { echo "usage: scripts/gpu-safetensors.sh fetch|install [BUNDLE]" >&2; exit 2; }
[ $# -ge 1 ] || usage
step=$1
bundle=$(realpath -m "${2:-.gpu}")

case $step in
fetch)
  mkdir -p "$bundle/wheels"
  if [ ! -f "$bundle/wheels/$wheel" ]; then
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    py=$root/.venv/bin/python  # scripts/setup.sh makes it; else the system's
    [ -x "$py" ] || py=python3
    "$py" -m pip download --quiet "safetensors==$version" --only-binary=:all: --platform manylinux2014_x86_64 \
      --python-version 3.12 --implementation cp --no-deps -d "$bundle/wheels"
  fi
  echo "$sha256  $bundle/wheels/$wheel" | sha256sum --check --quiet || {
    echo "gpu-safetensors: $wheel does not have the pinned sha256; removed" >&2
    rm -f "$bundle/wheels/$wheel"
    exit 1
  }
  echo "gpu-safetensors: $bundle/wheels/$wheel ($(du -h "$bundle/wheels/$wheel" | cut -f1))"
  ;;
install)
  py=${RMMD_PYTHON:-/opt/torch/.venv/bin/python}
  [ -f "$bundle/wheels/$wheel" ] || {
    echo "gpu-safetensors: no $bundle/wheels/$wheel: run 'scripts/gpu-safetensors.sh fetch' where there is a network" >&2
    exit 1
  }
  rm -rf "$bundle/pylib/safetensors" "$bundle"/pylib/safetensors-*.dist-info
  mkdir -p "$bundle/pylib"
  if "$py" -m pip --version >/dev/null 2>&1; then
    "$py" -m pip install --quiet --no-index --no-deps --target "$bundle/pylib" "$bundle/wheels/$wheel"
  else
    "$py" -m zipfile -e "$bundle/wheels/$wheel" "$bundle/pylib"
  fi
  PYTHONPATH="$bundle/pylib${PYTHONPATH:+:$PYTHONPATH}" "$py" -c \
    'import safetensors; print("gpu-safetensors: safetensors", safetensors.__version__, "from", safetensors.__file__)'
  echo "export PYTHONPATH=$bundle/pylib\${PYTHONPATH:+:\$PYTHONPATH}"
  ;;
*) usage ;;
esac
