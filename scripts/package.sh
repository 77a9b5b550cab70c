#!/usr/bin/env bash
# Builds the Debian package: sets up and builds (scripts/build.sh), then CPack
# writes rmmd_VERSION_ARCH.deb into OUTDIR (default build/package) and shows its
# control fields and file list. The package's contents are cmake --install's
# under /usr (cmake/rmmd_install.cmake; docs/operations.md, Install).
#   scripts/package.sh [OUTDIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=$(realpath -m "${1:-build/package}")
./scripts/build.sh
export PATH="$root/.venv/bin:$PATH"
mkdir -p "$out"
rm -f "$out"/rmmd_*.deb
cpack --config build/CPackConfig.cmake -B "$out"
deb=$(ls "$out"/rmmd_*.deb)
echo "--- dpkg-deb -I $deb"
dpkg-deb -I "$deb"
echo "--- dpkg-deb -c $deb"
dpkg-deb -c "$deb"
echo "package: $deb"
