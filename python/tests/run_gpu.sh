#!/usr/bin/env bash
# The Python tests on the GPU host, which has none of our libraries but a
# Python with PyTorch, CuPy, NumPy and pytest (/opt/torch/.venv). Bundle the
# daemon, rmmctl and the C library on the build machine:
#
#   ../shared/tools/gpu-bundle .gpu build/daemon/rmmd build/rmmctl/rmmctl build/client/librmmd_c.so
#
# then, there, from the checkout's root (carry .gpu and python/):
#
#   python/tests/run_gpu.sh .gpu [pytest args]
#
# RMMD_PYTHON picks another Python (default /opt/torch/.venv/bin/python).
#
# test_peering_gpu.py (two daemons as nodes A and B) needs two GPUs (the
# nvidia-h100-x2 or nvidia-h200-x2 kind), the IMEX channel
# /dev/nvidia-caps-imex-channels/channel0 (DEVELOPERS.md, "On the GPU host")
# and openssl; it finds scripts/make-test-certs.sh in the checkout, or at
# $RMMD_TEST_CERTS_SCRIPT. Alone: python/tests/run_gpu.sh .gpu -k peering
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: python/tests/run_gpu.sh BUNDLE_DIR [pytest args]" >&2; exit 2; }
bundle=$(cd "$1" && pwd); shift
tests_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
source "$bundle/env"   # (it sets $here) LD_LIBRARY_PATH: the bundle's libraries, which librmmd_c.so needs
export RMMD_LIBRARY="$bundle/bin/librmmd_c.so" RMMD_DAEMON="$bundle/bin/rmmd" RMMD_RMMCTL="$bundle/bin/rmmctl"
# Packages that Python lacks there, installed into the bundle
# (scripts/gpu-safetensors.sh install BUNDLE_DIR).
[ ! -d "$bundle/pylib" ] || export PYTHONPATH="$bundle/pylib${PYTHONPATH:+:$PYTHONPATH}"
# Test files or ids among the arguments: those only; else the whole folder.
paths=("$tests_dir")
for a in "$@"; do [[ "$a" == *.py || "$a" == *.py::* ]] && paths=(); done
exec "${RMMD_PYTHON:-/opt/torch/.venv/bin/python}" -m pytest -p no:cacheprovider -q -rs "${paths[@]}" "$@"
