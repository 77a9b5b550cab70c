#!/usr/bin/env bash
# Builds the packages: sets up and builds (scripts/build.sh), then CPack writes
# into OUTDIR (default build/package)
#   rmmd_VERSION_ARCH.deb        the daemon, rmmctl, the client library, and
#                                their private libraries (gRPC, protobuf, RMM,
#                                the CUDA runtime, ...) in /usr/lib/rmmd
#   rmmd-dev_VERSION_ARCH.deb    headers, CMake and pkg-config packages
#   rmmd-VERSION-linux-ARCH.tar.gz  both, as one prefix to unpack anywhere
# and shows the packages' control fields and file lists. What goes where:
# cmake/rmmd_install.cmake; docs/operations.md, Install.
#   scripts/package.sh [OUTDIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=$(realpath -m "${1:-build/package}")
./scripts/build.sh
export PATH="$root/.venv/bin:$PATH"
mkdir -p "$out"
rm -f "$out"/rmmd_*.deb "$out"/rmmd-dev_*.deb "$out"/rmmd-*.tar.gz
cpack --config build/CPackConfig.cmake -B "$out"
for deb in "$out"/rmmd_*.deb "$out"/rmmd-dev_*.deb; do
  echo "--- dpkg-deb -I $deb"
  dpkg-deb -I "$deb"
  echo "--- dpkg-deb -c $deb"
  dpkg-deb -c "$deb"
done
echo "packages:"
ls -l "$out"/rmmd_*.deb "$out"/rmmd-dev_*.deb "$out"/rmmd-*.tar.gz
