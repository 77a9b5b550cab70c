#!/usr/bin/env bash
# Installs rmmd from its .deb on this machine and uses it as an operator and a
# developer would, from the installed paths only; then removes it and checks
# that nothing it installed is left. Made for a GPU host with none of rmmd's
# libraries (Ubuntu 24.04, root, no network, no systemd running),
# and runs on any Debian or Ubuntu machine with root (without a GPU the
# device steps say SKIP, or FAIL with --require-gpu).
#
#   gpu_host_install_check.sh [options] BUNDLE
#
# BUNDLE is a directory holding rmmd_*.deb, rmmd-dev_*.deb, consumer/ (a copy
# of tests/packaging/consumer) and, optionally, rmmd-*-linux-*.tar.gz: what
# scripts/gpu-install-bundle.sh puts there. Nothing else of rmmd's source
# tree is needed. Options:
#   --require-gpu      no GPU is a failure, not a skip
#   --cuda DIR         the CUDA toolkit (default /usr/local/cuda)
#   --python PY        the Python of step 6b (default /opt/torch/.venv/bin/python
#                      where it exists, else python3)
#   --client-user U    the user in group rmmd who runs the client
#                      (default rmmd-install-check; made and removed again
#                      if it does not exist)
#   --keep-installed   leave the packages installed (skips the removal checks)
#   --keep-work        keep the work directory (logs, builds)
#
# Steps, each printed as PASS, FAIL or SKIP with what it saw:
#   1. dpkg -i of both packages (dpkg only: nothing is fetched);
#   2. the installed programs need no library from outside the package but
#      glibc's, GCC's and libsystemd (ldd);
#   3. rmmd --version; rmmd --check-config /etc/rmmd/rmmd.conf;
#   4. rmmd started the way /usr/lib/systemd/system/rmmd.service starts it
#      (read from the installed unit: User=, Group=, RuntimeDirectory= with
#      its mode, UMask=, LimitNOFILE=, NoNewPrivileges=, no capabilities,
#      Environment=, ExecStartPre=, ExecStart=, and NOTIFY_SOCKET when
#      python3 is there to listen for READY=1); what the unit's sandboxing
#      options add (ProtectSystem= and the others) needs systemd and is not
#      reproduced;
#   5. tests/packaging/consumer built against the installed rmmd-dev: with
#      CMake (find_package(rmmd), when CMake >= 4.0 is there; an older CMake
#      must get rmmdConfig.cmake's message) and with g++ and rmmd.pc;
#   6. both consumers run as the client user (group rmmd, not rmmd's uid):
#      host memory, then 64 MiB of device memory through
#      rmmd::ipc_memory_resource; with two GPUs or more, also under
#      CUDA_VISIBLE_DEVICES=1 (the pool of that GPU, found by UUID, or, as
#      the shipped config has none there, a refusal that names the GPUs);
#  6b. with python/rmmd-*.whl in BUNDLE: the Python package pip-installed
#      from its wheel (--no-index: offline), then as the client user: it
#      finds the .deb's librmmd_c.so on its own, a session, host memory and
#      (with a GPU) 64 MiB of device memory; where that Python has PyTorch
#      with CUDA, a tensor through the rmmd MemPool, and
#      torch.OutOfMemoryError with rmmd's message under
#      use_rmmd_as_allocator() (its shim built in the user's home);
#   7. rmmctl stats as the client user; a user outside group rmmd refused;
#   8. SIGTERM: the daemon drains and exits 0;
#   9. dpkg -r, then dpkg -P: every file the packages installed is gone, and
#      nothing else under /usr, /etc, /opt, /var/lib, /run changed but the
#      user database (the rmmd user and group stay, as Debian does for
#      system users);
#  10. with an archive in BUNDLE: unpacked in the work directory, its
#      bin/rmmd and bin/rmmctl run from there (the packages are gone by then).
# Exit status: 0 when no step failed, 1 otherwise, 2 for bad usage.
set -uo pipefail

usage() {
  sed -n '/^#   gpu_host_install_check.sh/,/^# Steps/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
require_gpu=0 cuda=/usr/local/cuda client_user=rmmd-install-check keep_installed=0 keep_work=0
python=/opt/torch/.venv/bin/python
[ -x "$python" ] || python=$(command -v python3 || true)
while [ $# -gt 0 ]; do
  case $1 in
    --require-gpu) require_gpu=1 ;;
    --cuda) cuda=${2:?}; shift ;;
    --client-user) client_user=${2:?}; shift ;;
    --python) python=${2:?}; shift ;;
    --keep-installed) keep_installed=1 ;;
    --keep-work) keep_work=1 ;;
    -h | --help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 1 ] || usage
bundle=$(cd "$1" && pwd) || exit 2

# The check is about what an installed rmmd finds on its own: a service, or an
# operator's login shell, has no LD_LIBRARY_PATH pointing at another copy of
# rmmd's libraries (a gpu-bundle's env sets one, and it wins over the RUNPATH).
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
  echo "note: LD_LIBRARY_PATH=$LD_LIBRARY_PATH is unset for this check"
  unset LD_LIBRARY_PATH
fi

passed=0 failed=0 skipped=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }
# fatal: a failure the later steps cannot go on from.
fatal() {
  fail "$*"
  echo "(stopping here: the steps that follow need this one)"
  exit 1
}
step() { echo; echo "=== $*"; }
# show FILE: a log, indented.
show() { sed 's/^/    /' "$1"; }

# --- what this machine is -------------------------------------------------------
step "this machine"
[ "$(id -u)" -eq 0 ] || { echo "run this as root (dpkg, users, the daemon's user)" >&2; exit 2; }
for tool in dpkg setpriv useradd ldd g++; do
  command -v "$tool" >/dev/null || { echo "this script needs $tool" >&2; exit 2; }
done
( . /etc/os-release && echo "system: $PRETTY_NAME" )
echo "kernel: $(uname -r); $(ldd --version | head -1)"
echo "libstdc++6: $(dpkg-query -W -f='${Version}' 'libstdc++6:*' 2>/dev/null | head -1); libsystemd0: $(dpkg-query -W -f='${Version}' 'libsystemd0:*' 2>/dev/null | head -1)"
echo "compiler: $(g++ --version | head -1); cmake: $(cmake --version 2>/dev/null | head -1 || echo none); pkg-config: $(command -v pkg-config || echo none)"
gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU ')
  nvidia-smi -L | sed 's/^/gpu: /'
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
else
  echo "gpu: none (nvidia-smi finds no GPU)"
fi
[ -d /run/systemd/system ] && echo "systemd runs here: the daemon is still started by this script, not by systemctl"

debs=("$bundle"/rmmd_*.deb)
devs=("$bundle"/rmmd-dev_*.deb)
[ -f "${debs[0]}" ] && [ "${#debs[@]}" -eq 1 ] || { echo "no single rmmd_*.deb in $bundle" >&2; exit 2; }
[ -f "${devs[0]}" ] && [ "${#devs[@]}" -eq 1 ] || { echo "no single rmmd-dev_*.deb in $bundle" >&2; exit 2; }
[ -f "$bundle/consumer/CMakeLists.txt" ] && [ -f "$bundle/consumer/main.cpp" ] ||
  { echo "no consumer/ (tests/packaging/consumer) in $bundle" >&2; exit 2; }
deb=${debs[0]} dev=${devs[0]}
echo "packages: $(basename "$deb") ($(du -h "$deb" | cut -f1)), $(basename "$dev") ($(du -h "$dev" | cut -f1))"
if dpkg-query -W -f='${Status}' rmmd 2>/dev/null | grep -q installed; then
  echo "rmmd is installed already; remove it first (dpkg -P rmmd-dev rmmd)" >&2
  exit 2
fi
[ ! -e /run/rmmd ] || { echo "/run/rmmd exists: is an rmmd running? Stop it and remove the directory" >&2; exit 2; }

work=$(mktemp -d /tmp/rmmd-install-check.XXXXXX)
chmod 0755 "$work"  # the daemon's and the client's users read in it
echo "work directory: $work"

# --- clean-up, whatever happens -------------------------------------------------
daemon_pid='' listener_pid='' made_user=0 installed=0
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    echo "clean-up: stopping rmmd ($daemon_pid)"
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null
  fi
  [ -z "$listener_pid" ] || kill "$listener_pid" 2>/dev/null
  rm -rf /run/rmmd
  if [ "$installed" -eq 1 ] && [ "$keep_installed" -eq 0 ]; then
    echo "clean-up: dpkg -P rmmd-dev rmmd"
    dpkg -P rmmd-dev rmmd >/dev/null 2>&1
  fi
  if [ "$made_user" -eq 1 ]; then
    userdel "$client_user" 2>/dev/null
  fi
  if [ "$keep_work" -eq 0 ]; then rm -rf "$work"; else echo "logs and builds kept in $work"; fi
}
trap cleanup EXIT

# What the removal check compares: every path under these, before and after.
snapshot() {
  find /usr /etc /opt /var/lib /run -xdev 2>/dev/null |
    grep -Ev '^/var/lib/(dpkg|apt|systemd|ucf|update-notifier|PackageKit|snapd|docker|containerd|kubelet|nvidia)(/|$)|^/etc/ld\.so\.cache$|^/run/(user|systemd|udev|lock|utmp|log|containerd|docker|nvidia)(/|$)|/__pycache__(/|$)|^/tmp' |
    sort
}
snapshot >"$work/before.txt"

# --- 1. install -------------------------------------------------------------------
step "1. dpkg -i (no network: dpkg installs only what it is given)"
echo "rmmd Depends: $(dpkg-deb -f "$deb" Depends)"
if dpkg -i "$deb" "$dev" >"$work/dpkg-i.log" 2>&1; then
  installed=1
  show "$work/dpkg-i.log"
  pass "dpkg -i $(basename "$deb") $(basename "$dev")"
else
  installed=1  # half-installed: clean-up purges
  show "$work/dpkg-i.log"
  fatal "dpkg -i failed (above)"
fi
dpkg -L rmmd rmmd-dev | sort -u >"$work/installed.txt"
echo "installed: $(wc -l <"$work/installed.txt") paths"
if getent passwd rmmd >/dev/null; then
  pass "user rmmd: $(id rmmd)"
else
  fatal "the package's postinst made no rmmd user"
fi

# --- 2. self-contained ------------------------------------------------------------
step "2. the installed programs find their libraries in the package"
system_libs='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libsystemd\.so\.0|libcap\.so\.2|libgcrypt\.so\.20|libgpg-error\.so\.0|liblz4\.so\.1|liblzma\.so\.5|libzstd\.so\.1|libcuda\.so\.1)$'
ok=1
for f in /usr/bin/rmmd /usr/bin/rmmctl /usr/lib/librmmd_client.so.0; do
  ldd "$f" >"$work/ldd.txt" 2>&1
  if grep -q 'not found' "$work/ldd.txt"; then
    show "$work/ldd.txt"
    fail "$f: a library is not found"
    ok=0
    continue
  fi
  # Every other library from /usr/lib/rmmd (libsystemd's own come with it).
  while read -r name _ path _; do
    [[ $name =~ $system_libs ]] && continue
    case $path in
      /usr/lib/rmmd/* | /usr/bin/../lib/rmmd/* | /usr/lib/librmmd_client.so.0 | /usr/bin/../lib/librmmd_client.so.0) ;;
      *) fail "$f takes $name from $path, not from the package"; ok=0 ;;
    esac
  done < <(grep '=>' "$work/ldd.txt")
done
[ "$ok" -eq 0 ] || pass "rmmd, rmmctl and librmmd_client.so.0: every library but glibc's, GCC's and libsystemd's is in /usr/lib/rmmd"

# --- 3. version, configuration ----------------------------------------------------
step "3. rmmd --version, rmmd --check-config /etc/rmmd/rmmd.conf"
if out=$(/usr/bin/rmmd --version 2>&1) && [[ $out =~ ^rmmd\ [0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  pass "rmmd --version: $out"
else
  fail "rmmd --version: $out"
fi
if /usr/bin/rmmd --check-config /etc/rmmd/rmmd.conf >"$work/check-config.log" 2>&1; then
  show "$work/check-config.log"
  pass "rmmd --check-config /etc/rmmd/rmmd.conf"
else
  show "$work/check-config.log"
  fail "rmmd --check-config /etc/rmmd/rmmd.conf"
fi

# --- 4. the daemon, as the unit starts it -----------------------------------------
step "4. rmmd started as /usr/lib/systemd/system/rmmd.service starts it"
unit=/usr/lib/systemd/system/rmmd.service
[ -f "$unit" ] || fatal "no $unit"
# unit_values KEY: every value of KEY= in [Service], in order.
unit_values() {
  sed -n '/^\[Service\]/,/^\[/p' "$unit" | sed -n "s/^$1=//p"
}
unit_value() { unit_values "$1" | tail -1; }
unit_user=$(unit_value User) unit_group=$(unit_value Group)
runtime_dir=/run/$(unit_value RuntimeDirectory)
runtime_mode=$(unit_value RuntimeDirectoryMode)
unit_umask=$(unit_value UMask) unit_nofile=$(unit_value LimitNOFILE)
unit_nnp=$(unit_value NoNewPrivileges)
[ -n "$unit_user" ] && [ -n "$unit_group" ] && [ "$runtime_dir" != /run/ ] ||
  fatal "the unit names no User=, Group= or RuntimeDirectory="
unit_env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ "USER=$unit_user"
  "LOGNAME=$unit_user" "RUNTIME_DIRECTORY=$runtime_dir")
while read -r line; do
  [ -n "$line" ] || continue
  [[ $line != *[\"\'\\]* ]] || fatal "Environment=$line: quoting is not understood by this script"
  read -ra assignments <<<"$line"
  unit_env+=("${assignments[@]}")
done < <(unit_values Environment)
echo "unit: User=$unit_user Group=$unit_group RuntimeDirectory=$runtime_dir (mode ${runtime_mode:-0755}) UMask=${unit_umask:-0022} LimitNOFILE=${unit_nofile:-default} NoNewPrivileges=${unit_nnp:-no}"
echo "unit: environment: ${unit_env[*]}"

# as_unit CMD...: execs CMD as the unit runs its commands. Call it in a
# subshell or as a background job: it changes the shell's umask and limits.
as_unit() {
  umask "${unit_umask:-0022}"
  [ -z "$unit_nofile" ] || ulimit -n "$nofile"
  local nnp=()
  [ "$unit_nnp" != yes ] || nnp=(--no-new-privs)
  exec setpriv --reuid="$unit_user" --regid="$unit_group" --init-groups "${nnp[@]}" \
    --inh-caps=-all --bounding-set=-all env -i "${unit_env[@]}" "$@"
}
# LimitNOFILE= sets both limits; a container may cap the hard limit lower
# (systemd would fail the same way there).
nofile=$unit_nofile
if [ -n "$unit_nofile" ] && ! (ulimit -n "$unit_nofile") 2>/dev/null; then
  nofile=$(ulimit -Hn)
  echo "note: LimitNOFILE=$unit_nofile is above this machine's hard limit; rmmd runs with $nofile"
fi
# What systemd does for RuntimeDirectory=: made before the start, owned by
# the unit's user, with its mode.
install -d -o "$unit_user" -g "$unit_group" -m "${runtime_mode:-0755}" "$runtime_dir"
ok=1
while read -r line; do
  [ -n "$line" ] || continue
  read -ra cmd <<<"${line#-}"
  if (as_unit "${cmd[@]}") >"$work/exec-start-pre.log" 2>&1; then
    pass "ExecStartPre=$line (as $unit_user)"
  else
    show "$work/exec-start-pre.log"
    fail "ExecStartPre=$line (as $unit_user)"
    ok=0
  fi
done < <(unit_values ExecStartPre)
[ "$ok" -eq 1 ] || fatal "the unit's ExecStartPre failed: systemd would not start rmmd"

read -ra exec_start <<<"$(unit_value ExecStart)"
if [ "$gpus" -eq 0 ] && grep -Eq '^\s*backend: *CUDA' /etc/rmmd/rmmd.conf; then
  [ "$require_gpu" -eq 0 ] || fatal "--require-gpu: nvidia-smi finds no GPU"
  # The shipped config's gpu0 pool needs a GPU: rmmd would refuse to start.
  exec_start+=(--backend host)
  skip "the CUDA pool: no GPU here, so ExecStart gets --backend host (drops the config's CUDA pools)"
fi
notify=
if [ "$(unit_value Type)" = notify ] && command -v python3 >/dev/null; then
  notify=$work/notify.sock
  python3 - "$notify" "$work/notify.txt" <<'EOF' &
# The NOTIFY_SOCKET end of sd_notify(3), as systemd listens: one line per datagram.
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
with open(sys.argv[2], "a") as out:
    while True:
        out.write(s.recv(4096).decode(errors="replace").replace("\n", " ").strip() + "\n")
        out.flush()
EOF
  listener_pid=$!
  for _ in $(seq 100); do [ -S "$notify" ] && break; sleep 0.05; done
  [ -S "$notify" ] || fatal "the notify socket listener (python3) did not start"
  unit_env+=("NOTIFY_SOCKET=$notify")
fi
echo "ExecStart=${exec_start[*]}"
as_unit "${exec_start[@]}" 2>"$work/rmmd.log" &
daemon_pid=$!
# Ready: READY=1 on the notify socket (Type=notify), else rmmctl health answers.
ready=0
deadline=$((SECONDS + 120))
while [ "$SECONDS" -lt "$deadline" ]; do
  kill -0 "$daemon_pid" 2>/dev/null || break
  if [ -n "$notify" ]; then
    grep -q 'READY=1' "$work/notify.txt" 2>/dev/null && ready=1 && break
  elif /usr/bin/rmmctl --runtime-dir "$runtime_dir" health >/dev/null 2>&1; then
    ready=1 && break
  fi
  sleep 0.2
done
show "$work/rmmd.log"
if [ "$ready" -eq 1 ]; then
  if [ -n "$notify" ]; then
    pass "rmmd sent READY=1 (pid $daemon_pid): $(grep READY=1 "$work/notify.txt" | head -1)"
  else
    pass "rmmd answers rmmctl health (pid $daemon_pid; no python3 here to listen for READY=1)"
  fi
else
  if kill -0 "$daemon_pid" 2>/dev/null; then fatal "rmmd was not ready within 120 s"; fi
  wait "$daemon_pid"
  rc=$?
  daemon_pid=''
  fatal "rmmd exited $rc at start-up (log above)"
fi
owner=$(stat -c '%U:%G %a' "$runtime_dir")
if [ "$owner" = "$unit_user:$unit_group ${runtime_mode#0}" ]; then
  pass "$runtime_dir: $owner"
else
  fail "$runtime_dir is '$owner', expected '$unit_user:$unit_group ${runtime_mode#0}'"
fi
daemon_uid=$(awk '/^Uid:/{print $2}' "/proc/$daemon_pid/status")
if [ "$daemon_uid" = "$(id -u "$unit_user")" ]; then
  pass "rmmd runs as $unit_user (uid $daemon_uid)"
else
  fail "rmmd runs as uid $daemon_uid, not $unit_user"
fi
find "$runtime_dir" -mindepth 1 -printf '    %M %u:%g %p\n'
if /usr/bin/rmmctl --runtime-dir "$runtime_dir" health >"$work/health.log" 2>&1; then
  show "$work/health.log"
  pass "rmmctl health (as root)"
else
  show "$work/health.log"
  fail "rmmctl health (as root)"
fi

# --- 5. a client built against the installed package -----------------------------
step "5. the consumer built against the installed rmmd-dev (CUDA from $cuda)"
[ -f "$cuda/include/cuda_runtime_api.h" ] || fatal "no CUDA toolkit at $cuda (--cuda DIR)"
cuda_lib=$cuda/lib64
[ -d "$cuda_lib" ] || cuda_lib=$cuda/lib
cp -r "$bundle/consumer" "$work/consumer-src"
consumers=()
cmake_version=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
if [ -z "$cmake_version" ]; then
  skip "CMake build: no cmake here"
elif dpkg --compare-versions "$cmake_version" ge 4.0; then
  if cmake -S "$work/consumer-src" -B "$work/consumer-cmake" -DCMAKE_BUILD_TYPE=Release \
    -DCUDAToolkit_ROOT="$cuda" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON >"$work/cmake.log" 2>&1 &&
    cmake --build "$work/consumer-cmake" >>"$work/cmake.log" 2>&1; then
    grep -E '^(rmmd|rmm|CCCL|rapids_logger)_DIR:' "$work/consumer-cmake/CMakeCache.txt" | sed 's/^/    /'
    if grep -q '^rmm_DIR:PATH=/usr/lib/rmmd/rmm/lib64/cmake/rmm$' "$work/consumer-cmake/CMakeCache.txt"; then
      pass "CMake $cmake_version: find_package(rmmd) and rmmd::client, with the RMM in /usr/lib/rmmd/rmm"
      consumers+=("$work/consumer-cmake/rmmd_consumer")
    else
      fail "CMake $cmake_version: the consumer did not use the RMM that ships with rmmd"
    fi
  else
    show "$work/cmake.log"
    fail "CMake $cmake_version: the consumer did not configure or build"
  fi
else
  if cmake -S "$work/consumer-src" -B "$work/consumer-cmake" -DCUDAToolkit_ROOT="$cuda" \
    >"$work/cmake.log" 2>&1; then
    fail "CMake $cmake_version configured the consumer, but RMM's package needs CMake >= 4.0"
  elif tr -s ' \n' ' ' <"$work/cmake.log" | grep -q 'needs CMake >= 4.0'; then
    pass "CMake $cmake_version (< 4.0): rmmdConfig.cmake says RMM's package needs CMake >= 4.0 and points to pkg-config"
  else
    show "$work/cmake.log"
    fail "CMake $cmake_version: the consumer failed without rmmdConfig.cmake's message"
  fi
fi
# pkg-config's answer, or the same read from rmmd.pc where there is no pkg-config.
pc_field() {
  local file=/usr/lib/pkgconfig/rmmd.pc line
  local -A vars=([pcfiledir]=/usr/lib/pkgconfig)
  expand() {
    local s=$1 v
    for v in "${!vars[@]}"; do s=${s//\$\{$v\}/${vars[$v]}}; done
    echo "$s"
  }
  while IFS= read -r line; do
    if [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      vars[${BASH_REMATCH[1]}]=$(expand "${BASH_REMATCH[2]}")
    elif [[ $line =~ ^$1:\ *(.*)$ ]]; then
      expand "${BASH_REMATCH[1]}"
    fi
  done <"$file"
}
if command -v pkg-config >/dev/null; then
  how="pkg-config"
  pc_cflags=$(pkg-config --cflags rmmd) && pc_libs=$(pkg-config --libs rmmd) || fail "pkg-config --cflags --libs rmmd"
else
  how="rmmd.pc read by this script (no pkg-config here)"
  pc_cflags=$(pc_field Cflags) pc_libs=$(pc_field Libs)
fi
read -ra cflags <<<"$pc_cflags"
read -ra libs <<<"$pc_libs"
if g++ -std=c++20 -O2 -Wall -Wextra -Werror "$work/consumer-src/main.cpp" "${cflags[@]}" \
  -I"$cuda/include" "${libs[@]}" -L"$cuda_lib" -lcudart -o "$work/rmmd_consumer_pc" \
  >"$work/g++.log" 2>&1; then
  pass "g++ with $how: $pc_cflags $pc_libs"
  consumers+=("$work/rmmd_consumer_pc")
else
  show "$work/g++.log"
  fail "g++ with $how"
fi

# --- 6. the consumers, as a user in group rmmd ------------------------------------
step "6. the consumers run as $client_user (group rmmd)"
if ! getent passwd "$client_user" >/dev/null; then
  # --system: no home, no subordinate id ranges to clean up afterwards.
  useradd --system --no-create-home --home-dir / --shell /usr/sbin/nologin --groups "$unit_group" "$client_user" &&
    made_user=1 || fatal "useradd $client_user failed"
elif ! id -nG "$client_user" | tr ' ' '\n' | grep -qx "$unit_group"; then
  fatal "$client_user exists and is not in group $unit_group (pick another with --client-user)"
fi
echo "client: $(id "$client_user")"
# as_client CMD...: CMD as the client user, with its groups, in a clean environment.
as_client() {
  setpriv --reuid="$client_user" --regid="$(id -g "$client_user")" --init-groups \
    env -i PATH=/usr/bin:/bin HOME=/ "$@"
}
device_args=(--device)
for consumer in "${consumers[@]}"; do
  name=${consumer#"$work"/}
  as_client "$consumer" "$runtime_dir" "${device_args[@]}" >"$work/consumer.log" 2>&1
  rc=$?
  show "$work/consumer.log"
  if [ "$rc" -eq 0 ] && grep -q "bytes of device memory written, read back, freed: ok" "$work/consumer.log" &&
    grep -q "two packed direct leases written, copied, read back: ok" "$work/consumer.log"; then
    pass "$name: host and device memory through rmmd (slab mode, and packed direct leases), as $client_user"
  elif [ "$rc" -eq 4 ] && [ "$gpus" -eq 0 ] && [ "$require_gpu" -eq 0 ]; then
    grep -q "pool '.*': 1048576 bytes written, read back, freed: ok" "$work/consumer.log" &&
      pass "$name: host memory through rmmd, as $client_user" ||
      fail "$name: the host part did not pass"
    skip "$name: device memory: no GPU on this machine"
  else
    fail "$name exited $rc"
  fi
done
if [ "${#consumers[@]}" -eq 0 ]; then
  fail "no consumer was built"
fi
if [ "$gpus" -ge 2 ] && [ "${#consumers[@]}" -gt 0 ]; then
  uuid1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1)
  as_client env CUDA_VISIBLE_DEVICES=1 "${consumers[0]}" "$runtime_dir" --device >"$work/consumer-cvd.log" 2>&1
  rc=$?
  show "$work/consumer-cvd.log"
  # /etc/rmmd/rmmd.conf as shipped lists one CUDA pool, gpu0: then the
  # client, which sees GPU 1 only, must be told so in words.
  if [ "$rc" -eq 0 ] && grep -qF "($uuid1)" "$work/consumer-cvd.log"; then
    pass "CUDA_VISIBLE_DEVICES=1: the client's device 0 got the pool of GPU 1 ($uuid1)"
  elif [ "$rc" -eq 1 ] && grep -qF "serves no pool on this process's CUDA device 0 ($uuid1" "$work/consumer-cvd.log"; then
    pass "CUDA_VISIBLE_DEVICES=1: no pool on GPU 1 ($uuid1) in this config, and the client is told which GPUs have one"
  else
    fail "CUDA_VISIBLE_DEVICES=1: expected the pool of GPU 1 ($uuid1) or a refusal naming it, exit $rc"
  fi
elif [ "$gpus" -eq 1 ]; then
  skip "CUDA_VISIBLE_DEVICES=1: one GPU here"
fi
[ "$gpus" -gt 0 ] || [ "$require_gpu" -eq 0 ] || fail "--require-gpu: nvidia-smi finds no GPU"

# --- 6b. the Python package, as a user in group rmmd --------------------------------
step "6b. the Python package (its wheel) as $client_user"
wheels=("$bundle"/python/rmmd-*.whl)
if [ ! -f "${wheels[0]}" ]; then
  skip "no python/rmmd-*.whl in $bundle (scripts/gpu-install-bundle.sh puts it there)"
elif [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
  skip "no Python with pip here (--python PY)"
elif ! "$python" -m pip install --quiet --no-deps --no-index --target "$work/py" "${wheels[0]}" \
  >"$work/pip.log" 2>&1; then
  show "$work/pip.log"
  fail "$python -m pip install --no-index --target ... $(basename "${wheels[0]}")"
else
  pass "$python -m pip install --no-index $(basename "${wheels[0]}") (pure Python: no build)"
  chmod -R a+rX "$work/py"
  install -d -o "$client_user" -m 0700 "$work/client-home"  # a login user's home
  cat >"$work/check.py" <<'PY'
import json, os, subprocess, sys
import rmmd
out = {"library": rmmd.library_path()}
s = rmmd.Session(client_name="install-check-python")
a = s.host_resource().allocation(1 << 20)
a.free()
out["host"] = "ok"
if sys.argv[1] == "gpu":
    a = s.device_resource(device=0).allocation(64 << 20)
    out["device_ptr"] = a.ptr
    a.free()
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        from rmmd.allocators.torch import use_mem_pool
        with use_mem_pool():
            out["mempool_sum"] = float(torch.ones(1 << 24, device="cuda").sum().item())
        child = """
import torch
from rmmd.allocators import torch as rt
rt.use_rmmd_as_allocator()
torch.ones(1 << 20, device="cuda")
try:
    torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
    print("no error")
except torch.OutOfMemoryError as e:
    print("OutOfMemoryError " + str(e).splitlines()[0])
except RuntimeError as e:
    print("RuntimeError " + str(e).splitlines()[0])
"""
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
        out["allocator"] = done.stdout.strip()
        out["allocator_stderr"] = done.stderr[-800:]
        cache = os.path.expanduser("~/.cache/rmmd")
        out["shims"] = sorted(os.listdir(cache)) if os.path.isdir(cache) else []
s.close()
print(json.dumps(out))
PY
  chmod a+r "$work/check.py"
  py_env=(HOME="$work/client-home" PYTHONPATH="$work/py" RMMD_RUNTIME_DIR="$runtime_dir")
  # The package is pure Python: any Python 3 the client can run will do. A
  # virtual environment whose interpreter lies under root's home cannot be.
  client_python=
  for candidate in "$python" /usr/bin/python3; do
    if [ -x "$candidate" ] && as_client env "${py_env[@]}" "$candidate" -c 'import sys' >/dev/null 2>&1; then
      client_python=$candidate
      break
    fi
  done
  [ "$client_python" = "$python" ] || [ -z "$client_python" ] ||
    echo "note: $python does not run as $client_user; using $client_python"
  if [ -z "$client_python" ]; then
    skip "neither $python nor /usr/bin/python3 runs as $client_user"
  else
    python=$client_python
    want=host
    [ "$gpus" -gt 0 ] && want=gpu
    as_client env "${py_env[@]}" "$python" "$work/check.py" "$want" >"$work/python.json" 2>"$work/python.log"
    rc=$?
    show "$work/python.json"
    show "$work/python.log"
    # field KEY: that member of the script's JSON ("" if none).
    field() {
      "$python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' \
        "$work/python.json" "$1" 2>/dev/null
    }
    lib=$(field library)
    if [ "$rc" -eq 0 ] && [[ $lib == /usr/lib/* ]] && [ "$(field host)" = ok ]; then
      pass "import rmmd as $client_user: the .deb's $lib, a session, host memory"
    else
      fail "import rmmd as $client_user (exit $rc, library '$lib')"
    fi
    if [ "$want" = gpu ]; then
      if [ -n "$(field device_ptr)" ]; then
        pass "rmmd (Python): 64 MiB of device memory as $client_user"
      else
        fail "rmmd (Python): no device memory as $client_user"
      fi
      if [ -z "$(field mempool_sum)" ]; then
        skip "no PyTorch with CUDA in $python"
      else
        if [ "$(field mempool_sum)" = 16777216.0 ]; then
          pass "PyTorch: a tensor through the rmmd MemPool"
        else
          fail "PyTorch through the rmmd MemPool: sum $(field mempool_sum)"
        fi
        said=$(field allocator)
        if [[ $said == "OutOfMemoryError rmmd: "* ]]; then
          pass "PyTorch, use_rmmd_as_allocator(): torch.OutOfMemoryError with rmmd's message (shim: $(field shims))"
        else
          fail "PyTorch, use_rmmd_as_allocator(): '$said' (stderr: $(field allocator_stderr))"
        fi
      fi
    fi
  fi
fi

# --- 7. rmmctl -------------------------------------------------------------------
step "7. rmmctl stats as $client_user; a user outside group rmmd"
if as_client /usr/bin/rmmctl --runtime-dir "$runtime_dir" stats >"$work/stats.log" 2>&1; then
  show "$work/stats.log"
  pass "rmmctl stats as $client_user"
  if [ "$gpus" -gt 0 ]; then
    grep -Eq '^\S+ +[0-9]+ +cuda ' "$work/stats.log" && pass "rmmctl stats lists a CUDA pool" ||
      fail "rmmctl stats lists no CUDA pool on a machine with $gpus GPU(s)"
  fi
else
  show "$work/stats.log"
  fail "rmmctl stats as $client_user"
fi
setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups env -i PATH=/usr/bin:/bin \
  /usr/bin/rmmctl --runtime-dir "$runtime_dir" stats >"$work/outsider.log" 2>&1
rc=$?
if [ "$rc" -eq 4 ]; then
  pass "rmmctl stats as nobody: refused, exit 4: $(head -1 "$work/outsider.log")"
else
  show "$work/outsider.log"
  fail "rmmctl stats as nobody exited $rc, expected 4 (permission denied)"
fi

# --- 8. stop ----------------------------------------------------------------------
step "8. SIGTERM (systemctl stop)"
kill -TERM "$daemon_pid"
deadline=$((SECONDS + 60))
while kill -0 "$daemon_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
if kill -0 "$daemon_pid" 2>/dev/null; then
  fail "rmmd still runs 60 s after SIGTERM"
else
  wait "$daemon_pid"
  rc=$?
  daemon_pid=''
  tail -3 "$work/rmmd.log" | sed 's/^/    /'
  [ "$rc" -eq 0 ] && pass "rmmd stopped, exit 0" || fail "rmmd exited $rc on SIGTERM"
  if [ -n "$notify" ]; then
    grep -q STOPPING=1 "$work/notify.txt" && pass "rmmd sent STOPPING=1" || fail "rmmd sent no STOPPING=1"
  fi
fi
[ -z "$listener_pid" ] || { kill "$listener_pid" 2>/dev/null; wait "$listener_pid" 2>/dev/null; listener_pid=''; }
# systemd removes the RuntimeDirectory= when the unit stops.
rm -rf "$runtime_dir"

# --- 9. remove, purge -------------------------------------------------------------
if [ "$keep_installed" -eq 1 ]; then
  skip "removal: --keep-installed"
else
  step "9. dpkg -r, dpkg -P: nothing the packages installed remains"
  if dpkg -r rmmd-dev rmmd >"$work/dpkg-r.log" 2>&1; then
    pass "dpkg -r rmmd-dev rmmd"
  else
    show "$work/dpkg-r.log"
    fail "dpkg -r rmmd-dev rmmd"
  fi
  left=$(while read -r p; do [ -e "$p" ] && ! grep -qxF "$p" "$work/before.txt" && [ ! -d "$p" ] && echo "$p"; done <"$work/installed.txt")
  if [ "$left" = /etc/rmmd/rmmd.conf ]; then
    pass "after dpkg -r only the conffile /etc/rmmd/rmmd.conf is left (dpkg keeps conffiles until purge)"
  else
    fail "after dpkg -r these files are left: $(echo "$left" | tr '\n' ' ')"
  fi
  if dpkg -P rmmd-dev rmmd >"$work/dpkg-p.log" 2>&1; then
    installed=0
    pass "dpkg -P rmmd-dev rmmd"
  else
    show "$work/dpkg-p.log"
    fail "dpkg -P rmmd-dev rmmd"
  fi
  state=$(dpkg-query -W -f='${Status}' rmmd 2>&1)
  [[ $state != *installed* && $state != *config-files* ]] && pass "dpkg knows no rmmd any more" ||
    fail "dpkg still has rmmd: $state"
  snapshot >"$work/after.txt"
  comm -13 "$work/before.txt" "$work/after.txt" >"$work/added.txt"
  comm -23 "$work/before.txt" "$work/after.txt" >"$work/removed.txt"
  # The user database: the rmmd user and group stay; $client_user is removed
  # at the end if this script made it. useradd's backups (passwd-) may be new.
  userdb='^/etc/(passwd|group|shadow|gshadow|subuid|subgid)-?$'
  grep -Ev "$userdb" "$work/added.txt" >"$work/added-other.txt"
  if [ -s "$work/added-other.txt" ] || [ -s "$work/removed.txt" ]; then
    sed 's/^/    added:   /' "$work/added-other.txt"
    sed 's/^/    removed: /' "$work/removed.txt"
    fail "after dpkg -P, paths under /usr /etc /opt /var/lib /run differ from before the install (above)"
  else
    pass "after dpkg -P every path under /usr /etc /opt /var/lib /run is as before the install$(grep -Eq "$userdb" "$work/added.txt" && echo " (but new user database backups: $(grep -E "$userdb" "$work/added.txt" | tr '\n' ' '))")"
  fi
  echo "    the rmmd user and group stay, as Debian leaves system users: $(id rmmd 2>&1)"
fi

# --- 10. the portable archive -----------------------------------------------------
archives=("$bundle"/rmmd-*-linux-*.tar.gz)
if [ ! -f "${archives[0]}" ]; then
  skip "the portable archive: none in $bundle"
else
  step "10. the portable archive, unpacked in $work/archive (no package installed now)"
  mkdir -p "$work/archive"
  tar -xzf "${archives[0]}" -C "$work/archive"
  top=$(echo "$work"/archive/*/)
  top=${top%/}
  if out=$("$top/bin/rmmd" --version 2>&1); then pass "$(basename "${archives[0]}"): bin/rmmd --version: $out"; else fail "bin/rmmd --version: $out"; fi
  run="$work/archive-run"
  mkdir -p "$run"
  # Root's own daemon, with the archive's example config (its pools: the host
  # pool and gpu0; without a GPU, the host pool only).
  backend=()
  [ "$gpus" -gt 0 ] || backend=(--backend host)
  "$top/bin/rmmd" --config "$top/etc/rmmd/rmmd.conf" --runtime-dir "$run" "${backend[@]}" 2>"$work/archive-rmmd.log" &
  daemon_pid=$!
  deadline=$((SECONDS + 120))
  until "$top/bin/rmmctl" --runtime-dir "$run" health >/dev/null 2>&1; do
    kill -0 "$daemon_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ] || break
    sleep 0.2
  done
  if "$top/bin/rmmctl" --runtime-dir "$run" stats >"$work/archive-stats.log" 2>&1; then
    show "$work/archive-stats.log"
    pass "the archive's bin/rmmd serves and its bin/rmmctl stats answers"
  else
    show "$work/archive-rmmd.log"
    show "$work/archive-stats.log"
    fail "the archive's daemon or rmmctl"
  fi
  kill -TERM "$daemon_pid" 2>/dev/null
  wait "$daemon_pid"
  rc=$?
  daemon_pid=''
  [ "$rc" -eq 0 ] && pass "the archive's rmmd stopped, exit 0" || fail "the archive's rmmd exited $rc"
fi

echo
echo "=== $passed passed, $failed failed, $skipped skipped"
if [ "$failed" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
[ "$failed" -eq 0 ]
