#!/usr/bin/env bash
# Builds the Debian packages with CPack (as scripts/package.sh does) and checks
# what is in them: the file lists of rmmd and rmmd-dev, the control fields,
# the maintainer scripts, the conffile, the unit's paths; that rmmd is
# self-contained (every library an ELF file in it needs is in it, or is one
# every Debian 12 and Ubuntu 22.04/24.04 system has, which is all it Depends
# on); the highest glibc and libstdc++ symbol versions it needs (Ubuntu
# 22.04's glibc is 2.35); and that the unpacked programs run from anywhere.
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
run_logged "$scratch/cpack.log" "$CPACK" -G DEB --config "$build/CPackConfig.cmake" -B "$scratch/out"
one_file() {
  local files=("$@")
  if [ "${#files[@]}" -ne 1 ] || [ ! -f "${files[0]}" ]; then
    fail "expected one file, found: ${files[*]}"
  fi
  echo "${files[0]}"
}
deb=$(one_file "$scratch"/out/rmmd_*_amd64.deb)
dev=$(one_file "$scratch"/out/rmmd-dev_*_amd64.deb)
echo "$deb"
echo "$dev"

dpkg-deb -I "$deb" | tee "$scratch/info.txt"
dpkg-deb -f "$dev" Package Version Depends Section
list() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./|/|'; }
list "$deb" >"$scratch/files.txt"
list "$dev" >"$scratch/dev-files.txt"

for f in /usr/bin/rmmd /usr/bin/rmmctl /usr/lib/systemd/system/rmmd.service \
  /usr/lib/sysusers.d/rmmd.conf /usr/lib/librmmd_client.so.0 /usr/lib/librmmd_c.so.0 \
  /usr/lib/rmmd/librmmd_proto.so \
  /usr/lib/rmmd/librmm.so /usr/lib/rmmd/librapids_logger.so /usr/lib/rmmd/libcudart.so.13 \
  /usr/lib/rmmd/libgrpc++.so.1.51 /usr/lib/rmmd/libprotobuf.so.32 /usr/lib/rmmd/libssl.so.3 \
  /usr/share/doc/rmmd/third-party/libgrpc29/copyright /usr/share/doc/rmmd/third-party/librmm/LICENSE; do
  grep -qxF "$f" "$scratch/files.txt" || fail "rmmd lacks $f"
done
for f in /usr/include/rmmd/session.hpp /usr/include/rmmd/host_memory_resource.hpp \
  /usr/include/rmmd/ipc_memory_resource.hpp /usr/lib/librmmd_client.so \
  /usr/lib/cmake/rmmd/rmmdConfig.cmake /usr/lib/cmake/rmmd/rmmdConfigVersion.cmake \
  /usr/lib/cmake/rmmd/rmmdTargets.cmake /usr/lib/pkgconfig/rmmd.pc \
  /usr/include/rmmd/rmmd.h /usr/include/rmmd/shared_buffer.hpp /usr/lib/librmmd_c.so \
  /usr/lib/pkgconfig/rmmd-c.pc \
  /usr/lib/rmmd/rmm/include/rmm/device_buffer.hpp /usr/lib/rmmd/rmm/lib64/cmake/rmm/rmm-config.cmake \
  /usr/lib/rmmd/rmm/lib64/librmm.so /usr/lib/rmmd/rapids_logger/lib64/librapids_logger.so; do
  grep -qxF "$f" "$scratch/dev-files.txt" || fail "rmmd-dev lacks $f"
done
expect_no_line "$scratch/files.txt" "^/usr/include|^/usr/lib/cmake|^/usr/lib/pkgconfig|^/usr/lib/librmmd_client\\.so$" \
  "rmmd holds nothing for building (that is rmmd-dev)"
# The two packages share directories only.
comm -12 <(grep -v '/$' "$scratch/files.txt" | sort) <(grep -v '/$' "$scratch/dev-files.txt" | sort) \
  >"$scratch/both.txt"
expect_no_line "$scratch/both.txt" "." "no file is in both packages"
cat "$scratch/files.txt" "$scratch/dev-files.txt" >"$scratch/all-files.txt"
expect_no_line "$scratch/all-files.txt" "_CPack_Packages|^/usr/etc|^/work|^/tmp" "no staging or misplaced paths"
[ ! -e "$src/deploy/tmpfiles.d/rmmd.conf" ] || grep -qxF /usr/lib/tmpfiles.d/rmmd.conf "$scratch/files.txt" ||
  fail "rmmd lacks /usr/lib/tmpfiles.d/rmmd.conf"

# Control fields. Depends: only what every Debian 12 and Ubuntu 22.04/24.04
# system has, at versions Ubuntu 22.04 has (glibc 2.35, libstdc++6 12).
field() { dpkg-deb -f "$1" "$2"; }
[ "$(field "$deb" Package)" = rmmd ] || fail "Package is '$(field "$deb" Package)', expected rmmd"
[ "$(field "$dev" Package)" = rmmd-dev ] || fail "Package is '$(field "$dev" Package)', expected rmmd-dev"
[ -n "$(field "$deb" Maintainer)" ] || fail "no Maintainer"
depends=$(field "$deb" Depends)
echo "rmmd Depends: $depends"
IFS=, read -ra deps <<<"$depends"
for d in "${deps[@]}"; do
  d=${d# }
  [[ $d =~ ^(libc6|libgcc-s1|libstdc\+\+6|libsystemd0)(\ \(\>=\ ([0-9.]+)\))?$ ]] ||
    fail "rmmd Depends on '$d': only libc6, libgcc-s1, libstdc++6 and libsystemd0 are on every system; bundle the rest (cmake/rmmd_install.cmake)"
  version=${BASH_REMATCH[3]}
  case ${BASH_REMATCH[1]} in
    libc6) max=2.35 ;;
    libstdc++6) max=12 ;;
    *) max= ;;
  esac
  if [ -n "$version" ] && [ -n "$max" ] && ! dpkg --compare-versions "$version" le "$max"; then
    fail "rmmd Depends on '$d', newer than Ubuntu 22.04's ($max)"
  fi
done
[[ $depends == *libc6* && $depends == *libsystemd0* ]] ||
  fail "Depends ($depends) lacks what dpkg-shlibdeps should have found (libc6, libsystemd0)"
[ "$(field "$dev" Depends)" = "rmmd (= $(field "$deb" Version))" ] ||
  fail "rmmd-dev Depends on '$(field "$dev" Depends)', expected exactly its own version of rmmd"

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
dpkg-deb -x "$dev" "$scratch/root"
expect_line "$scratch/root/usr/lib/systemd/system/rmmd.service" "^ExecStart=/usr/bin/rmmd( |$)" \
  "the packaged unit's ExecStart"
expect_relocatable_runpaths "$scratch/root"
expect_self_contained "$scratch/root"
# dpkg-deb -x follows no links: the dev package's links lead into rmmd.
for l in usr/lib/librmmd_client.so usr/lib/rmmd/rmm/lib64/librmm.so \
  usr/lib/rmmd/rapids_logger/lib64/librapids_logger.so; do
  [ -e "$scratch/root/$l" ] || fail "$l leads nowhere: $(readlink "$scratch/root/$l")"
done

echo "--- symbol versions (Ubuntu 22.04: glibc 2.35; libstdc++ of GCC 12: GLIBCXX_3.4.30, CXXABI_1.3.13)"
highest_symbol_version "$scratch/root" GLIBC >"$scratch/glibc.txt"
highest_symbol_version "$scratch/root" GLIBCXX >"$scratch/glibcxx.txt"
highest_symbol_version "$scratch/root" CXXABI >"$scratch/cxxabi.txt"
read -r glibc glibc_file <"$scratch/glibc.txt"
read -r glibcxx glibcxx_file <"$scratch/glibcxx.txt"
read -r cxxabi cxxabi_file <"$scratch/cxxabi.txt"
echo "highest GLIBC_ version needed: $glibc (${glibc_file#"$scratch/root"})"
echo "highest GLIBCXX_ version needed: $glibcxx (${glibcxx_file#"$scratch/root"})"
echo "highest CXXABI_ version needed: $cxxabi (${cxxabi_file#"$scratch/root"})"
dpkg --compare-versions "${glibc#GLIBC_}" le 2.35 ||
  fail "${glibc_file#"$scratch/root"} needs $glibc: the package would not run on Ubuntu 22.04 (glibc 2.35)"
dpkg --compare-versions "${glibcxx#GLIBCXX_}" le 3.4.30 ||
  fail "${glibcxx_file#"$scratch/root"} needs $glibcxx: Ubuntu 22.04's libstdc++6 (GCC 12) has up to GLIBCXX_3.4.30"
dpkg --compare-versions "${cxxabi#CXXABI_}" le 1.3.13 ||
  fail "${cxxabi_file#"$scratch/root"} needs $cxxabi: Ubuntu 22.04's libstdc++6 (GCC 12) has up to CXXABI_1.3.13"

run_logged "$scratch/rmmd-version.log" "$scratch/root/usr/bin/rmmd" --version
expect_line "$scratch/rmmd-version.log" "^rmmd [0-9]+\\.[0-9]+\\.[0-9]+$" "rmmd --version"
run_logged "$scratch/rmmd-help.log" "$scratch/root/usr/bin/rmmd" --help
run_logged "$scratch/rmmctl-help.log" "$scratch/root/usr/bin/rmmctl" --help
echo "PASS: $deb $dev"
