#!/usr/bin/env bash
# Builds the .deb with CPack (as scripts/package.sh does) and checks what is in
# it: the file list, the control fields, the maintainer scripts, the conffile,
# the unit's paths, and that the unpacked programs run from anywhere.
#
# Environment (tests/packaging/CMakeLists.txt): RMMD_SOURCE_DIR, RMMD_BUILD_DIR,
# RMMD_SCRATCH, CPACK.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
require_env RMMD_SOURCE_DIR RMMD_BUILD_DIR RMMD_SCRATCH CPACK

src=$RMMD_SOURCE_DIR build=$RMMD_BUILD_DIR scratch=$RMMD_SCRATCH
rm -rf "$scratch"
mkdir -p "$scratch"

echo "--- cpack -G DEB"
run_logged "$scratch/cpack.log" "$CPACK" --config "$build/CPackConfig.cmake" -B "$scratch/out"
debs=("$scratch"/out/rmmd_*.deb)
if [ "${#debs[@]}" -ne 1 ] || [ ! -f "${debs[0]}" ]; then
  fail "expected one rmmd_*.deb in $scratch/out: ${debs[*]}"
fi
deb=${debs[0]}
echo "$deb"

dpkg-deb -I "$deb" | tee "$scratch/info.txt"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$scratch/files.txt"

for f in /usr/bin/rmmd /usr/bin/rmmctl /usr/lib/systemd/system/rmmd.service \
  /usr/lib/sysusers.d/rmmd.conf /usr/include/rmmd/session.hpp \
  /usr/include/rmmd/host_memory_resource.hpp /usr/include/rmmd/ipc_memory_resource.hpp \
  /usr/lib/cmake/rmmd/rmmdConfig.cmake /usr/lib/cmake/rmmd/rmmdConfigVersion.cmake \
  /usr/lib/cmake/rmmd/rmmdTargets.cmake /usr/lib/librmmd_client.so /usr/lib/rmmd/librmmd_proto.so \
  /usr/lib/rmmd/librmm.so /usr/lib/rmmd/librapids_logger.so; do
  grep -qxF "$f" "$scratch/files.txt" || fail "the package lacks $f"
done
expect_no_line "$scratch/files.txt" "_CPack_Packages|^/usr/etc|^/work|^/tmp" "no staging or misplaced paths"
[ ! -e "$src/deploy/tmpfiles.d/rmmd.conf" ] || grep -qxF /usr/lib/tmpfiles.d/rmmd.conf "$scratch/files.txt" ||
  fail "the package lacks /usr/lib/tmpfiles.d/rmmd.conf"

# Control fields.
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = rmmd ] || fail "Package is '$(field Package)', expected rmmd"
[ -n "$(field Maintainer)" ] || fail "no Maintainer"
depends=$(field Depends)
[[ $depends == *libc6* && $depends == *libgrpc++* && $depends == *libprotobuf* ]] ||
  fail "Depends ($depends) lacks what dpkg-shlibdeps should have found"
[[ $depends != *rmm* && $depends != *rapids* ]] ||
  fail "Depends ($depends) names a bundled library: there is no such Debian package"

# Maintainer scripts and conffiles.
dpkg-deb -e "$deb" "$scratch/control"
for s in postinst prerm postrm; do
  [ -x "$scratch/control/$s" ] || fail "no executable $s in the package's control area"
  sh -n "$scratch/control/$s" || fail "$s is not valid sh"
done
expect_line "$scratch/control/postinst" "systemd-sysusers" "postinst makes the rmmd user"
expect_line "$scratch/control/postinst" "systemctl daemon-reload" "postinst reloads systemd"
if [ -e "$src/deploy/rmmd.conf.example" ]; then
  grep -qxF /etc/rmmd/rmmd.conf "$scratch/files.txt" || fail "the package lacks /etc/rmmd/rmmd.conf"
  grep -qxF /usr/share/doc/rmmd/rmmd.conf.example "$scratch/files.txt" ||
    fail "the package lacks /usr/share/doc/rmmd/rmmd.conf.example"
  [ -f "$scratch/control/conffiles" ] || fail "no conffiles in the package"
  expect_line "$scratch/control/conffiles" "^/etc/rmmd/rmmd\\.conf$" "rmmd.conf is a conffile"
fi

# Contents: the unit names /usr/bin/rmmd; the programs run unpacked anywhere.
dpkg-deb -x "$deb" "$scratch/root"
expect_line "$scratch/root/usr/lib/systemd/system/rmmd.service" "^ExecStart=/usr/bin/rmmd( |$)" \
  "the packaged unit's ExecStart"
expect_relocatable_runpaths "$scratch/root"
run_logged "$scratch/rmmd-help.log" "$scratch/root/usr/bin/rmmd" --help
run_logged "$scratch/rmmctl-help.log" "$scratch/root/usr/bin/rmmctl" --help
echo "PASS: $deb"
