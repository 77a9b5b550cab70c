#!/usr/bin/env bash
# Runs the shipped unit (deploy/systemd/rmmd.service) under a real systemd,
# PID 1 of its own namespaces, on a copy-on-write view of this machine's root,
# and shows what docs/operations.md "Restart and upgrade" promises: a
# published persistent host buffer lives in systemd's fd store across
# `systemctl kill -s SIGKILL rmmd` (and the automatic restart) and across
# `systemctl restart rmmd`, with the same bytes, also after six restarts in
# a row (the start limit must not fail the unit and drop the store), and a
# stop drops it.
#
#   sudo ./scripts/systemd-container-check.sh     (root; no GPU needed)
#
# Needs rmmd, rmmctl and rmmd_share_client built in build/ (BUILD_DIR=...):
#   ./scripts/build.sh --target rmmd rmmctl rmmd_share_client
#
# Safety: systemd never sees the real root. It runs in new mount, PID, network,
# UTS, IPC and cgroup namespaces, chrooted by pivot_root into an overlayfs
# whose lower layer is / and whose upper layer is a tmpfs of its own mount
# namespace: whatever systemd or its units write or delete (tmpfiles' --boot
# --remove included) lands in that tmpfs and goes with it. /tmp, /var/tmp,
# /run and /dev/shm are fresh tmpfs, /dev holds a few device nodes, /proc/sys
# and /sys are read-only, the cgroup tree is a child cgroup of this one, and
# the bounding set lacks CAP_SYS_MODULE, CAP_SYS_TIME, CAP_SYS_BOOT,
# CAP_SYS_RAWIO and CAP_MKNOD. The only directory of the real tree it can
# write is $BUILD_DIR/systemd-check/results. Before systemd starts, the
# isolation is checked from both sides (a file made and deleted in its /tmp
# never shows in the real /tmp; a real file deleted through the overlay
# stays); systemd does not start unless both hold. It boots a target of its
# own (sysinit and sockets; no multi-user.target). At the end, or on any
# failure, the namespace's PID 1 is SIGKILLed from outside, which ends every
# process in it, and the cgroup is removed.
#
# Prints each command run inside with its output, then a verdict (PASS/FAIL
# lines); exit status 1 if any FAIL.
set -euo pipefail

if [ "${1:-}" = --inner ]; then
  # ---- PID 1 of the new namespaces: build the root, prove it, exec systemd.
  work=$2 src=$3 build=$4
  base=$work/mnt results=$work/results R=$work/mnt/root
  exec >"$results/inner.log" 2>&1
  set -x
  mount -t tmpfs -o mode=0755 rmmd-check "$base"
  mkdir "$base/upper" "$base/work" "$R"
  mount -t overlay rmmd-check -o "lowerdir=/,upperdir=$base/upper,workdir=$base/work" "$R"
  for d in tmp var/tmp; do mount -t tmpfs -o mode=1777,nosuid,nodev rmmd-check "$R/$d"; done
  mount -t tmpfs -o mode=0755,nosuid,nodev rmmd-check "$R/run"
  mount -t tmpfs -o mode=0755,nosuid rmmd-check "$R/dev"
  mknod -m 0666 "$R/dev/null" c 1 3
  mknod -m 0666 "$R/dev/zero" c 1 5
  mknod -m 0666 "$R/dev/full" c 1 7
  mknod -m 0666 "$R/dev/random" c 1 8
  mknod -m 0666 "$R/dev/urandom" c 1 9
  mknod -m 0666 "$R/dev/tty" c 5 0
  ln -s /proc/self/fd "$R/dev/fd"
  ln -s /proc/self/fd/0 "$R/dev/stdin"
  ln -s /proc/self/fd/1 "$R/dev/stdout"
  ln -s /proc/self/fd/2 "$R/dev/stderr"
  mkdir "$R/dev/pts" "$R/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$R/dev/pts"
  ln -s pts/ptmx "$R/dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev rmmd-check "$R/dev/shm"
  mount -t proc proc "$R/proc"
  for p in sys sysrq-trigger; do
    [ -e "$R/proc/$p" ] || continue
    mount --bind "$R/proc/$p" "$R/proc/$p"
    mount -o remount,bind,ro "$R/proc/$p"
  done
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
  mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
  mkdir -p "$R/results"
  mount --bind "$results" "$R/results"
  findmnt -R -o TARGET,SOURCE,FSTYPE,OPTIONS "$R" >"$results/mounts.txt"

  # The isolation, seen from inside; the outer side checks the real tree.
  probe=$(cat "$results/probe-name")
  canary=$(cat "$results/canary-name")
  lower_canary=$(cat "$results/lower-canary-path")
  { [ ! -e "$R/tmp/$canary" ] && echo "inside: the real /tmp's $canary is not in this /tmp" ||
    echo "inside: FAIL: $canary is visible in this /tmp"
    touch "$R/tmp/$probe" && echo "inside: made /tmp/$probe"
    rm "$R/tmp/$probe" && echo "inside: deleted /tmp/$probe"
    rm "$R$lower_canary" && echo "inside: deleted $lower_canary through the overlay"
  } >"$results/probe.txt"
  touch "$results/probed"
  for _ in $(seq 600); do
    [ -e "$results/go" ] && break
    [ -e "$results/abort" ] && exit 1
    sleep 0.1
  done
  [ -e "$results/go" ] || exit 1

  # Install what the package installs, as its postinst would.
  install -m 0755 "$build/daemon/rmmd" "$build/rmmctl/rmmctl" "$build/tests/rmmd_share_client" "$R/usr/bin/"
  install -d -m 0755 "$R/etc/rmmd"
  # The example with a host pool only (no GPU here): without cuda_pool_per_gpu.
  awk '/^cuda_pool_per_gpu \{/ { skip = 1 } !skip { print } skip && /^\}/ { skip = 0 }' \
    "$src/deploy/rmmd.conf.example" >"$R/etc/rmmd/rmmd.conf"
  install -m 0644 "$src/deploy/systemd/rmmd.service" "$R/etc/systemd/system/rmmd.service"
  install -D -m 0644 "$src/deploy/sysusers.d/rmmd.conf" "$R/usr/lib/sysusers.d/rmmd.conf"
  chroot "$R" systemd-sysusers rmmd.conf
  # Boot to sysinit and sockets only (no multi-user.target: this machine's
  # postgresql, prometheus, timers...), and nothing that sets the clock.
  cat >"$R/etc/systemd/system/rmmd-check.target" <<'EOF'
[Unit]
Description=rmmd container check: sysinit and sockets only
Requires=sysinit.target sockets.target
After=sysinit.target sockets.target
EOF
  for u in systemd-timesyncd.service systemd-pstore.service; do
    ln -sf /dev/null "$R/etc/systemd/system/$u"
  done

  cd "$R"
  mkdir -p .oldroot
  pivot_root . .oldroot
  cd /
  umount -l /.oldroot
  rmdir /.oldroot
  set +x
  exec env -i container=rmmd-check PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    setpriv --bounding-set -sys_module,-sys_time,-sys_boot,-sys_rawio,-mknod \
    /lib/systemd/systemd --system --unit=rmmd-check.target --log-target=journal \
    --show-status=no
fi

# ---- Outside: set up, start the namespace, drive systemctl inside it.
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$src/build}
work=$build/systemd-check
[ "$(id -u)" = 0 ] || { echo "needs root (it makes namespaces and mounts)" >&2; exit 2; }
for f in "$build/daemon/rmmd" "$build/rmmctl/rmmctl" "$build/tests/rmmd_share_client"; do
  [ -x "$f" ] || { echo "missing $f: ./scripts/build.sh --target rmmd rmmctl rmmd_share_client" >&2; exit 2; }
done
for t in unshare nsenter setpriv pivot_root findmnt /lib/systemd/systemd; do
  command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 2; }
done
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || { echo "the kernel has no overlayfs: refusing to run systemd on anything else" >&2; exit 2; }
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  cgroot=/sys/fs/cgroup
elif [ "$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ]; then
  cgroot=/sys/fs/cgroup/unified
else
  echo "no cgroup2 hierarchy to give systemd" >&2
  exit 2
fi
cgroup=$cgroot$(sed -n 's/^0:://p' /proc/self/cgroup)
cgroup=${cgroup%/}/rmmd-check.$$

if [ -d "$work/mnt" ] && [ -n "$(ls -A "$work/mnt")" ]; then
  echo "$work/mnt is not empty: another check running?" >&2
  exit 2
fi
rm -rf "$work/results"
mkdir -p "$work/mnt" "$work/results"
results=$work/results
canary=rmmd-check-canary.$$
probe=rmmd-check-probe.$$
lower_canary=$work/lower-canary.$$
echo "$canary" >"$results/canary-name"
echo "$probe" >"$results/probe-name"
echo "$lower_canary" >"$results/lower-canary-path"
touch "/tmp/$canary" "$lower_canary"

pid1=
cleanup() {
  local rc=$?
  if [ -n "$pid1" ] && kill -0 "$pid1" 2>/dev/null; then
    kill -KILL "$pid1"
    while kill -0 "$pid1" 2>/dev/null; do sleep 0.1; done
  fi
  if [ -n "${unshare_pid:-}" ]; then wait "$unshare_pid" 2>/dev/null || true; fi
  # systemd's own cgroups under ours, deepest first.
  if [ -d "$cgroup" ]; then
    find "$cgroup" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  fi
  rm -f "/tmp/$canary" "$lower_canary"
  echo
  echo "== cleanup: namespace PID 1 ${pid1:-(none)} killed; left of it:"
  if [ -n "$pid1" ]; then ps -o pid,args --ppid "$pid1" --pid "$pid1" --no-headers || true; fi
  [ -d "$cgroup" ] && echo "cgroup $cgroup is still there" || echo "cgroup removed"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$cgroup"
(
  echo "$BASHPID" >"$cgroup/cgroup.procs"
  exec unshare --mount --propagation private --pid --fork --net --uts --ipc --cgroup \
    "$src/scripts/systemd-container-check.sh" --inner "$work" "$src" "$build" 2>"$results/unshare.log"
) &
unshare_pid=$!
for _ in $(seq 600); do
  pid1=$(ps -o pid= --ppid "$unshare_pid" | tr -d ' ' || true)
  [ -n "$pid1" ] && break
  sleep 0.1
done
[ -n "$pid1" ] || { echo "the namespace did not start" >&2; exit 1; }

echo "== isolation (before systemd starts)"
for _ in $(seq 600); do
  [ -e "$results/probed" ] && break
  kill -0 "$pid1" 2>/dev/null || break
  sleep 0.1
done
[ -e "$results/probed" ] || { cat "$results/inner.log" >&2; echo "the root was not built" >&2; exit 1; }
cat "$results/probe.txt"
grep -v '^TARGET' "$results/mounts.txt" | sed 's/^/  mount: /'
ok=1
grep -q FAIL "$results/probe.txt" && ok=0
if [ -e "/tmp/$probe" ]; then echo "outside: FAIL: /tmp/$probe showed up in the real /tmp"; ok=0; else
  echo "outside: /tmp/$probe never showed up in the real /tmp"; fi
if [ -e "/tmp/$canary" ]; then echo "outside: /tmp/$canary is still in the real /tmp"; else
  echo "outside: FAIL: /tmp/$canary is gone"; ok=0; fi
if [ -e "$lower_canary" ]; then echo "outside: $lower_canary is still there"; else
  echo "outside: FAIL: $lower_canary was deleted in the real tree"; ok=0; fi
if [ "$ok" != 1 ]; then
  touch "$results/abort"
  echo "not isolated: systemd is not started" >&2
  exit 1
fi
touch "$results/go"

in_ns() {
  nsenter -t "$pid1" -m -u -i -n -p -C -r -w \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 \
    COLUMNS=200 "$@"
}
as_rmmd() { in_ns setpriv --reuid=rmmd --regid=rmmd --init-groups env RMMD_RUNTIME_DIR=/run/rmmd "$@"; }
step() { echo; echo "== $*"; }
# Runs a command and prints it (less the in_ns and as_rmmd prefixes, and
# as_rmmd as "(as rmmd)") with its output and a non-zero exit status.
show() {
  local shown=$* rc=0
  shown=${shown#in_ns }
  [ "${shown#as_rmmd }" = "$shown" ] || shown="(as rmmd) ${shown#as_rmmd }"
  echo "\$ $shown"
  "$@" >"$results/out" 2>&1 || rc=$?
  sed 's/^/  /' "$results/out"
  [ "$rc" = 0 ] || echo "  (exit $rc)"
  last_rc=$rc
}
# What the run showed, printed at the end; any FAIL makes the exit status 1.
verdicts=()
pass() { verdicts+=("PASS: $1"); }
fail() { verdicts+=("FAIL: $1"); }
last_out() { cat "$results/out"; }
# The fds PID 1 (systemd) holds that are rmmd's host buffer memfds, with a
# hash of each one's bytes read through /proc/1/fd.
# The hashes are left in $store_hashes.
store_fds() {
  local out
  # shellcheck disable=SC2016 # expanded by the shell inside
  out=$(in_ns sh -c 'n=0; for f in /proc/1/fd/*; do l=$(readlink "$f"); case $l in
    *memfd:rmmd:*) n=$((n+1)); echo "  systemd (PID 1) holds fd ${f##*/} -> $l, $(wc -c <"$f") bytes, sha256 $(sha256sum <"$f" | cut -d" " -f1)";;
    esac; done; echo "  rmmd memfds in PID 1: $n"')
  echo "$out"
  store_hashes=$(sed -n 's/.*sha256 \([0-9a-f]*\).*/\1/p' <<<"$out" | tr '\n' ' ')
  store_hashes=${store_hashes% }
}
fdstore_count() { in_ns systemctl show rmmd -p NFileDescriptorStore --value; }

step "systemd boots (PID $pid1 outside, 1 inside)"
state=
for _ in $(seq 300); do
  state=$(in_ns systemctl is-system-running 2>/dev/null || true)
  case $state in running | degraded) break ;; esac
  sleep 0.2
done
show in_ns systemctl --version
echo "system state: $state"
show in_ns systemctl --failed --no-legend

step "the unit as systemd reads it"
show in_ns systemd-analyze verify /etc/systemd/system/rmmd.service
show in_ns getent passwd rmmd

step "systemctl start rmmd"
show in_ns systemctl start rmmd
show in_ns systemctl status --no-pager -n 20 rmmd
show in_ns systemctl show rmmd -p MainPID,ActiveState,NFileDescriptorStore,FileDescriptorStoreMax,NRestarts

buf=weights bytes=8388608 seed=27
step "publish a persistent host buffer '$buf' ($bytes bytes, pattern of seed $seed)"
coproc producer { as_rmmd rmmd_share_client produce "$buf" "$bytes" "$seed" --pool host --persistent 2>&1; }
# shellcheck disable=SC2154 # producer_PID is set by coproc
producer_out=${producer[0]} producer_in=${producer[1]} producer_pid=$producer_PID
while IFS= read -r -u "$producer_out" line; do
  echo "  producer: $line"
  [ "$line" = published ] && break
  case $line in error*) exit 1 ;; esac
done
eval "exec ${producer_in}>&-"
while IFS= read -r -u "$producer_out" line; do echo "  producer: $line"; done
wait "$producer_pid"
show as_rmmd rmmctl stats
show as_rmmd rmmctl buffers
show in_ns systemctl show rmmd -p MainPID,NFileDescriptorStore
store_fds
published_hash=$store_hashes
what="published: systemd holds one fd for it (NFileDescriptorStore=1)"
if [ "$(fdstore_count)" = 1 ] &&
  [ -n "$published_hash" ] &&
  [ "${published_hash// /}" = "$published_hash" ]; then
  pass "$what"
else
  fail "$what"
fi
show in_ns ls -l /var/lib/rmmd
show in_ns od -A d -t x1 -N 16 /var/lib/rmmd/buffers.state

step "systemctl kill -s SIGKILL rmmd"
since=@$(date +%s)
old_pid=$(in_ns systemctl show rmmd -p MainPID --value)
show in_ns systemctl kill -s SIGKILL rmmd
sleep 0.3
show in_ns systemctl show rmmd -p MainPID,ActiveState,SubState,Result,NFileDescriptorStore
echo "  rmmd processes now: $(in_ns pgrep -x rmmd | tr '\n' ' ')"
store_fds
what="while rmmd is dead, systemd still holds the buffer with the same bytes"
if [ -z "$(in_ns pgrep -x rmmd)" ] &&
  [ "$store_hashes" = "$published_hash" ]; then
  pass "$what"
else
  fail "$what"
fi
echo "  waiting for the automatic restart (RestartSec=2s)"
for _ in $(seq 300); do
  new_pid=$(in_ns systemctl show rmmd -p MainPID --value)
  [ "$(in_ns systemctl is-active rmmd)" = active ] && [ "$new_pid" != 0 ] && [ "$new_pid" != "$old_pid" ] && break
  sleep 0.2
done
show in_ns systemctl show rmmd -p MainPID,ActiveState,NRestarts,NFileDescriptorStore
show in_ns journalctl -u rmmd -b --no-pager -o cat --since "$since" -g "served again|restart 1"
show as_rmmd rmmctl stats
store_fds
step "read '$buf' back after the crash"
show as_rmmd rmmd_share_client consume "$buf" "$bytes" "$seed" --wait-ms 5000 </dev/null
what="after SIGKILL and the automatic restart: a new rmmd serves '$buf' with the same bytes"
if [ "$new_pid" != "$old_pid" ] &&
  [ "$last_rc" = 0 ] &&
  last_out | grep -qx "verified $bytes [0-9]*" &&
  [ "$store_hashes" = "$published_hash" ]; then
  pass "$what"
else
  fail "$what"
fi

step "systemctl restart rmmd"
since=@$(date +%s)
old_pid=$(in_ns systemctl show rmmd -p MainPID --value)
show in_ns systemctl restart rmmd
show in_ns systemctl show rmmd -p MainPID,ActiveState,NRestarts,NFileDescriptorStore
show in_ns journalctl -u rmmd -b --no-pager -o cat --since "$since" -g "served again|restart 2"
show as_rmmd rmmctl stats
store_fds
show as_rmmd rmmd_share_client consume "$buf" "$bytes" "$seed" --wait-ms 5000 </dev/null
what="after systemctl restart: a new rmmd serves '$buf' with the same bytes"
if [ "$(in_ns systemctl show rmmd -p MainPID --value)" != "$old_pid" ] &&
  [ "$last_rc" = 0 ] &&
  last_out | grep -qx "verified $bytes [0-9]*" &&
  [ "$store_hashes" = "$published_hash" ]; then
  pass "$what"
else
  fail "$what"
fi

step "six more restarts within a minute (an operator's, or a crash loop's): the start limit must not drop the store"
for i in 1 2 3 4 5 6; do show in_ns systemctl restart rmmd; done
show in_ns systemctl show rmmd -p ActiveState,Result,NRestarts,NFileDescriptorStore,StartLimitBurst,StartLimitIntervalUSec
store_fds
show as_rmmd rmmd_share_client consume "$buf" "$bytes" "$seed" --wait-ms 5000 </dev/null
what="after six restarts in a row: rmmd is active and serves '$buf' with the same bytes"
if [ "$(in_ns systemctl show rmmd -p ActiveState --value)" = active ] &&
  [ "$last_rc" = 0 ] &&
  last_out | grep -qx "verified $bytes [0-9]*" &&
  [ "$store_hashes" = "$published_hash" ]; then
  pass "$what"
else
  fail "$what"
fi

step "a broken configuration and a restart: systemd keeps trying, and the store, until it is fixed"
in_ns cp /etc/rmmd/rmmd.conf /etc/rmmd/rmmd.conf.good
echo "no_such_setting: 1" | in_ns tee -a /etc/rmmd/rmmd.conf >/dev/null
show in_ns systemctl restart rmmd
sleep 7  # a few RestartSec=2s rounds of ExecStartPre refusing the file
show in_ns systemctl show rmmd -p ActiveState,SubState,NRestarts,NFileDescriptorStore
broken_state=$(in_ns systemctl show rmmd -p ActiveState --value)
broken_store=$(fdstore_count)
in_ns mv /etc/rmmd/rmmd.conf.good /etc/rmmd/rmmd.conf
for _ in $(seq 50); do
  [ "$(in_ns systemctl show rmmd -p ActiveState --value)" = active ] && break
  sleep 0.2
done
show in_ns systemctl show rmmd -p ActiveState,NRestarts,NFileDescriptorStore
store_fds
show as_rmmd rmmd_share_client consume "$buf" "$bytes" "$seed" --wait-ms 5000 </dev/null
what="while the file was broken the unit kept restarting ($broken_state) with the store ($broken_store fd); fixed, it serves '$buf' with the same bytes"
if [ "$broken_state" != failed ] && [ "$broken_store" = 1 ] &&
  [ "$last_rc" = 0 ] &&
  last_out | grep -qx "verified $bytes [0-9]*" &&
  [ "$store_hashes" = "$published_hash" ]; then
  pass "$what"
else
  fail "$what"
fi

step "drop the store: systemctl stop rmmd (systemd $(in_ns systemctl --version | awk 'NR==1{print $2}'), no FileDescriptorStorePreserve=)"
show in_ns systemctl stop rmmd
show in_ns systemctl show rmmd -p ActiveState,NFileDescriptorStore
store_fds
what="systemctl stop frees the store (systemd holds no fd of rmmd)"
if [ "$(fdstore_count)" = 0 ] &&
  [ -z "$store_hashes" ]; then
  pass "$what"
else
  fail "$what"
fi
show in_ns systemctl clean --what=fdstore rmmd
show in_ns ls -l /var/lib/rmmd
step "start again: the record whose fd did not come back is reported and dropped"
since=@$(date +%s)
show in_ns systemctl start rmmd
show in_ns journalctl -u rmmd -b --no-pager -o cat --since "$since" -g "weights|restart 3"
show as_rmmd rmmctl stats
show as_rmmd rmmd_share_client try-open "$buf" </dev/null
what="the next start reports the record whose fd did not come back and does not serve '$buf'"
if last_out | grep -q "^error not_found" &&
  in_ns journalctl -u rmmd -b -o cat --since "$since" | grep -q "buffer .$buf. .*not served"; then
  pass "$what"
else
  fail "$what"
fi
store_fds

show in_ns systemctl stop rmmd

step "what systemd (PID 1) logged about rmmd.service"
show in_ns journalctl -b --no-pager -o cat _PID=1 -g rmmd

step "FileDescriptorStorePreserve=yes in a drop-in on this systemd (docs: 254+ only)"
since=@$(date +%s)
in_ns mkdir -p /etc/systemd/system/rmmd.service.d
printf '[Service]\nFileDescriptorStorePreserve=yes\n' | in_ns tee /etc/systemd/system/rmmd.service.d/preserve.conf >/dev/null
show in_ns systemctl daemon-reload
show in_ns systemctl show rmmd -p FileDescriptorStorePreserve,FileDescriptorStoreMax
show in_ns journalctl -b --no-pager -o cat _PID=1 --since "$since" -g "Preserve"
show in_ns systemd-analyze verify /etc/systemd/system/rmmd.service
in_ns rm -r /etc/systemd/system/rmmd.service.d
show in_ns systemctl daemon-reload

echo
echo "== verdict"
printf '%s\n' "${verdicts[@]}"
for v in "${verdicts[@]}"; do [ "${v#FAIL}" = "$v" ] || exit 1; done
