#!/usr/bin/env bash
# Idempotent set-up: installs what a fresh Debian 12 machine lacks to build and
# test rmmd, and does nothing when everything is already there.
#   - Debian packages (gRPC, protobuf, abseil, GoogleTest, libsystemd, promtool,
#     clang 14 with libFuzzer for the fuzzers, ...; GCC's ASan, UBSan and TSan
#     runtimes come with build-essential)
#   - a Python venv (.venv) with a recent cmake (RMM's package needs >= 4.0),
#     the librmm-cu13 wheel (RMM 26.10 with its CCCL 3.5, rapids-logger) and
#     kubernetes-validate (scripts/validate-manifests.sh), lizard (function
#     sizes for scripts/check-structure.py) and matplotlib
#     (bench/plot_results.py, the charts of docs/benchmarks.md)
#   - a second venv (.venv-py) with pytest and numpy, for the Python package's
#     tests (python/tests); kept apart so the build's venv stays as it is
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${RMMD_VENV:-$root/.venv}
py_venv=${RMMD_PY_VENV:-$root/.venv-py}

debs=(build-essential pkg-config ninja-build
      ccache      # rebuilds in other worktrees and presets reuse unchanged objects
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libsystemd-dev
      libcpp-httplib-dev libcli11-dev
      file        # CPack's DEB generator (scripts/package.sh) runs file and dpkg-shlibdeps
      patchelf    # the package's private libraries find each other ($ORIGIN run paths)
      systemd     # systemd-analyze verify and systemd-sysusers, for the deploy/ tests
      prometheus  # for promtool: the metrics test checks the scrape with it
      clang-14 libclang-rt-14-dev  # the fuzz preset: clang and its libFuzzer/ASan runtimes
      llvm-14     # llvm-symbolizer: the sanitizers' stack traces with file and line
      python3-venv)  # python3 -m venv, for both venvs
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ -x /usr/local/cuda/bin/nvcc ] || { echo "setup: the CUDA 13 toolkit is expected at /usr/local/cuda" >&2; exit 1; }

want_rmm='librmm-cu13==26.10.*'
# Pinned: its schemas (Kubernetes 1.25 to 1.37) come with the release.
want_kv=1.37.0
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import importlib.metadata as m; v=m.version("librmm-cu13"); assert v.startswith("26.10"); import cmake' 2>/dev/null \
   || ! "$venv/bin/cmake" --version 2>/dev/null | grep -qE 'version [4-9]\.'; then
  echo "setup: installing $want_rmm and cmake>=4 into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$want_rmm" 'cmake>=4.0,<5'
fi
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('kubernetes-validate') == '$want_kv'" 2>/dev/null; then
  echo "setup: installing kubernetes-validate==$want_kv into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "kubernetes-validate==$want_kv"
fi

# Pinned: a function's measured length must not change under CI's feet.
want_lizard=1.24.3
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('lizard') == '$want_lizard'" 2>/dev/null; then
  echo "setup: installing lizard==$want_lizard into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "lizard==$want_lizard"
fi

# Pinned: the committed charts (docs/images) are redrawn the same way.
want_mpl=3.11.2
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('matplotlib') == '$want_mpl'" 2>/dev/null; then
  echo "setup: installing matplotlib==$want_mpl into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "matplotlib==$want_mpl"
fi

if [ ! -x "$py_venv/bin/python" ]; then
  echo "setup: creating $py_venv (the Python tests' venv)"
  python3 -m venv "$py_venv"
fi
if ! "$py_venv/bin/python" -c 'import pytest, numpy' 2>/dev/null; then
  echo "setup: installing pytest and numpy into $py_venv"
  "$py_venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy
fi
echo "setup: ready (cmake: $("$venv/bin/cmake" --version | head -1); python tests: $("$py_venv/bin/python" --version))"
