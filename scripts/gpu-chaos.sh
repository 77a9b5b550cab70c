#!/usr/bin/env bash
# The chaos soak on the GPU host (docs/reliability.md, "The chaos soak"),
# from the bundle that `scripts/gpu-check.sh bundle` makes. There, as root
# (carry BUNDLE.txz; it is unpacked where BUNDLE is missing):
#   scripts/gpu-chaos.sh BUNDLE --minutes N --seed S [rmmd_chaos.py flags]
# Makes the IMEX channel device if it is missing (node A's CUDA pool then
# exports fabric handles: peer_fabric's remote read), copies the bundle to
# /opt/rmmdb and the soak's sources to /opt/rmmdc (readable by the daemon's
# user rmmd and the test users the soak makes), and runs the soak: the
# host's Python for the driver and its workers, /opt/torch/.venv's for the
# PyTorch and CuPy clients (RMMD_CHAOS_FRAMEWORK_PYTHON to change it). With
# $OUT set, the summary also goes to $OUT/chaos.json.
# Exit status: rmmd_chaos.py's (0 no failure, 1 failures, 2 could not run).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=${1:?usage: scripts/gpu-chaos.sh BUNDLE --minutes N --seed S [flags]}
shift
case $bundle in /*) ;; *) bundle=$PWD/$bundle ;; esac
cd "$root"
if [ ! -d "$bundle" ] && [ -f "$bundle.txz" ]; then
  (cd "$(dirname "$bundle")" && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall()' "$bundle.txz")
fi
[ -d "$bundle" ] || { echo "gpu-chaos: no bundle at $bundle (nor $bundle.txz)" >&2; exit 2; }
if [ "$(id -u)" != 0 ]; then
  echo "gpu-chaos: run as root (the soak's daemon runs as rmmd, its clients as test users)" >&2
  exit 2
fi
# The daemon runs as rmmd and node B's readers as test users: all of them
# must open the channel (a plain mknod as root makes it 0644, root's alone).
channel=/dev/nvidia-caps-imex-channels/channel0
if [ ! -e "$channel" ]; then
  major=$(awk '/nvidia-caps-imex-channels/{print $1}' /proc/devices)
  if [ -z "$major" ]; then
    echo "gpu-chaos: the driver offers no IMEX channels: no fabric pool, no remote read" >&2
  elif ! { mkdir -p "$(dirname "$channel")" && mknod -m 0666 "$channel" c "$major" 0; }; then
    echo "gpu-chaos: could not make $channel: no fabric pool, no remote read" >&2
  fi
fi
if [ -e "$channel" ]; then chmod 0666 "$channel" || true; fi
rm -rf /opt/rmmdb /opt/rmmdc
cp -r "$bundle" /opt/rmmdb
mkdir /opt/rmmdc
cp -r tests python scripts /opt/rmmdc/
chmod -R a+rX /opt/rmmdb /opt/rmmdc
export LD_LIBRARY_PATH="/opt/rmmdb/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
json=()
if [ -n "${OUT:-}" ]; then json=(--json "$OUT/chaos.json"); fi
cd /opt/rmmdc
frameworks=()
framework_python=${RMMD_CHAOS_FRAMEWORK_PYTHON:-/opt/torch/.venv/bin/python}
if [ -x "$framework_python" ]; then
  frameworks=(--framework-python "$framework_python")
else
  echo "gpu-chaos: no $framework_python: no PyTorch or CuPy clients" >&2
fi
exec python3 tests/soak/rmmd_chaos.py --bin-dir /opt/rmmdb/bin --python /usr/bin/python3 \
  "${frameworks[@]}" "${json[@]}" "$@"
