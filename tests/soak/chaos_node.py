"""The processes of the chaos soak (rmmd_chaos.py): rmmd under a service
manager that keeps its fd store (python/tests/service_manager.py, the
stand-in for systemd the Python tests use), run as user `rmmd` when this
process is root; the worker clients (chaos_worker.py) as other users; the
bundled C++ clients it reuses (rmmd_soak_client, rmmd_test_client,
rmmd_stable_client).

Nothing here chooses anything: rmmd_chaos.py's seeded generator does.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
from service_manager import ServiceManager  # noqa: E402

DAEMON_USER = "rmmd"
CLIENT_USERS = ("rmmd-test-a", "rmmd-test-b")
OUTSIDER = "rmmd-test-outsider"


class ChaosError(Exception):
    """A failure of the soak's own machinery (not an invariant)."""


def user_ids(name: str) -> tuple[int, int] | None:
    try:
        p = pwd.getpwnam(name)
        return p.pw_uid, p.pw_gid
    except KeyError:
        return None


def ensure_users() -> str:
    """As root, makes the test users as tests/tools/test_users.cpp does (rmmd
    and the two clients in group rmmd, the outsider in none); returns why not
    where it cannot ('' when they exist)."""
    if os.geteuid() != 0:
        return "not root: the daemon and the clients run as this user (one uid)"
    if user_ids(DAEMON_USER) is None:
        subprocess.run(["groupadd", "--system", "-f", DAEMON_USER], check=False)
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "-g", DAEMON_USER, DAEMON_USER], check=False)
    for u in CLIENT_USERS:
        if user_ids(u) is None:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            "-G", DAEMON_USER, u], check=False)
    if user_ids(OUTSIDER) is None:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        OUTSIDER], check=False)
    missing = [u for u in (DAEMON_USER, *CLIENT_USERS, OUTSIDER) if user_ids(u) is None]
    return f"cannot make users {missing}" if missing else ""


def spawn_kwargs(user: str | None) -> dict[str, Any]:
    """Popen's arguments that run a child as `user` (None: as this process)."""
    if user is None or os.geteuid() != 0:
        return {}
    uid, gid = user_ids(user)  # type: ignore[misc]
    groups = [g.gr_gid for g in grp.getgrall() if user in g.gr_mem]
    return {"user": uid, "group": gid, "extra_groups": groups}


def gpu_contexts() -> str:
    """Every process with a CUDA context, as the driver lists them: pid, MiB,
    owner uid and command line (what a moved driver-memory level is made of)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"(nvidia-smi: {e})"
    rows = []
    for line in out.strip().splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()[:160]
        except OSError:
            uid, cmd = "?", "(gone)"
        rows.append(f"pid {pid} {mib} MiB uid {uid}: {cmd}")
    return "; ".join(rows) or "(none listed)"


def proc_figures(pid: int) -> dict[str, int]:
    """The daemon's open fds (host buffers' memfds, counted once per memfd:
    a buffer a reader opened also has its memfd open read-only; a tenant's
    memfd; the rest), threads and VmRSS (KiB), from /proc."""
    out = {"fds": 0, "buffer_memfds": 0, "tenant_memfds": 0, "threads": 0, "rss_kib": 0}
    buffer_inodes: set[int] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            inode = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
        except OSError:
            continue  # closed meanwhile
        if ":buffer" in target and target.startswith("/memfd:rmmd"):
            buffer_inodes.add(inode)
            out["buffer_memfds"] = len(buffer_inodes)
        elif target.startswith("/memfd:rmmd") and ":uid " in target:
            out["tenant_memfds"] += 1
        else:
            out["fds"] += 1
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            out["rss_kib"] = int(line.split()[1])
    return out


class Daemon:
    """rmmd with a host pool of `pool_bytes` (and the CUDA pools where there
    are GPUs and `backend` says cuda), a config file it reloads on SIGHUP,
    its state file in a directory restarts keep, under a ServiceManager of
    its own. `peering`: the config's `peering { ... }` block ('' for none;
    chaos_peering.py writes it), which restarts and reloads keep."""

    def __init__(self, rmmd: Path, rmmctl: Path, backend: str, pool_bytes: int,
                 extra_env: dict[str, str], as_user: str | None, peering: str = "",
                 name: str = "rmmd") -> None:
        self.rmmd, self.rmmctl = rmmd, rmmctl
        self.name = name
        self.peering = peering
        self.base = Path(tempfile.mkdtemp(prefix=f"{name}-chaos-"))
        os.chmod(self.base, 0o755)
        self.runtime_dir = self.base / "run"
        self.state_dir = self.base / "state"
        self.state_dir.mkdir()
        self.config = self.base / "rmmd.conf"
        self.log_path = self.base / "rmmd.log"
        self.as_user = as_user
        self.manager = ServiceManager(self.state_dir / "notify.sock")
        if self.as_user:
            uid, gid = user_ids(self.as_user)  # type: ignore[misc]
            for p in (self.base, self.state_dir, self.state_dir / "notify.sock"):
                os.chown(p, uid, gid)
        self.settings = {"reclaim_timeout_ms": 300, "hello_timeout_ms": 2000, "log_level": "INFO"}
        self.write_config()
        self.args = [str(rmmd), "--runtime-dir", str(self.runtime_dir), "--config", str(self.config),
                     "--state-file", str(self.state_dir / "buffers.state"), "--backend", backend,
                     "--host-pool-bytes", str(pool_bytes), "--drain-timeout-ms", "2000"]
        if backend == "cuda":
            self.args += ["--cuda-pool-bytes", str(4 << 30)]
        self.env = dict(os.environ, **extra_env)
        self.env.pop("RMMD_RUNTIME_DIR", None)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start()

    def write_config(self) -> None:
        s = self.settings
        self.config.write_text(
            f"reclaim_timeout_ms: {s['reclaim_timeout_ms']}\n"
            f"hello_timeout_ms: {s['hello_timeout_ms']}\n"
            f"log_level: {s['log_level']}\n"
            + (f"{self.peering}\n" if self.peering else ""))
        os.chmod(self.config, 0o644)

    def start(self, timeout: float = 60.0) -> None:
        argv = self.args
        if self.as_user:
            argv = ["/usr/bin/setpriv", f"--reuid={self.as_user}", f"--regid={self.as_user}",
                    "--init-groups", *argv]
        with open(self.log_path, "ab") as log:
            self.process = self.manager.start(argv, self.env, stdout=log)
        self.running_hello_timeout = self.settings["hello_timeout_ms"]
        if self.manager.wait_for("READY=1", timeout) is None:
            raise ChaosError(f"{self.name} did not report READY=1 (status {self.process.poll()}); log tail:\n"
                             + self.log_tail())
        self.starts += 1

    def signal(self, sig: int) -> int | None:
        """Sends `sig` and reaps it (SIGKILL, SIGTERM): its exit status."""
        return self.manager.kill(sig)

    def hup(self, timeout: float = 20.0) -> str:
        """SIGHUP after the config changed; the 'reloaded ...' line it logs."""
        before = self.log_path.read_text(errors="replace").count("reloaded ")
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = [l for l in self.log_path.read_text(errors="replace").splitlines() if "reloaded " in l]
            if len(lines) > before:
                return lines[-1]
            time.sleep(0.05)
        raise ChaosError("no 'reloaded' line within 20 s of SIGHUP")

    @property
    def pid(self) -> int:
        return self.manager.main_pid

    def client_env(self, **extra: str) -> dict[str, str]:
        return dict(os.environ, RMMD_RUNTIME_DIR=str(self.runtime_dir), **extra)

    def stats(self) -> dict[str, Any]:
        out = subprocess.run([str(self.rmmctl), "stats", "--json"], env=self.client_env(),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ChaosError(f"rmmctl stats --json: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def rmmctl_json(self, *args: str) -> dict[str, Any]:
        """`rmmctl ARGS --json` against this daemon, parsed."""
        out = subprocess.run([str(self.rmmctl), *args, "--json"], env=self.client_env(),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ChaosError(f"{self.name}: rmmctl {' '.join(args)} --json: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def buffers(self) -> dict[str, int]:
        """Every buffer the daemon lists (rmmctl buffers --json): name -> size."""
        out = subprocess.run([str(self.rmmctl), "buffers", "--json"], env=self.client_env(),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ChaosError(f"rmmctl buffers --json: {out.stderr.strip()}")
        return {b["name"]: int(b.get("size", 0)) for b in json.loads(out.stdout).get("buffers", [])}

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def close(self, keep: bool) -> None:
        if self.manager.main_pid > 0:
            self.signal(signal.SIGKILL)
        self.manager.close()
        if not keep:
            shutil.rmtree(self.base, ignore_errors=True)


class Worker:
    """A chaos_worker.py process of `user`, answering JSON line commands."""

    def __init__(self, python: str, env: dict[str, str], user: str | None, marker: bytes,
                 pinned: bool, log_dir: Path, name: str) -> None:
        self.user, self.marker, self.name = user, marker, name
        self.stderr_path = log_dir / f"{name}.stderr"
        args = [python, str(HERE / "chaos_worker.py"), marker.hex()] + (["--pinned"] if pinned else [])
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, bufsize=1, **spawn_kwargs(user))
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.pending = 0
        first = self.reply(60)
        if not first.get("ready"):
            raise ChaosError(f"worker {name} did not start: {first} {self.stderr()}")
        self.reconnects = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        self.pending += 1

    def reply(self, timeout: float = 60.0) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise ChaosError(f"worker {self.name} gave no answer in {timeout} s") from None
        if line is None:
            raise ChaosError(f"worker {self.name} ended (status {self.proc.poll()}): {self.stderr()}")
        self.pending = max(0, self.pending - 1)
        return json.loads(line)

    def call(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.reply(timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """Closes stdin (it checks and frees what it holds) and waits."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        rest = []
        while True:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                break
            if line is None:
                break
            rest.append(line.strip())
        return status, "\n".join(rest)


class Program:
    """A bundled C++ client (rmmd_soak_client, rmmd_test_client, ...) as `user`,
    its output read line by line."""

    def __init__(self, argv: list[str], env: dict[str, str], user: str | None) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, **spawn_kwargs(user))
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, prefix: str, timeout: float = 60.0) -> str | None:
        """The first line starting with `prefix`; None if the program ended or
        the time passed first."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self.lines.put(None)
                return None
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def write(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        while self.wait_line("", 2) is not None:
            pass
        return status, "\n".join(self.seen[-20:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
