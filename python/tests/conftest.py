"""Fixtures for the rmmd package's tests: the real daemon, started per test
module (or per test, where a test stops it), ready when it sends READY=1 to
a notify socket the test owns.

Where things are (each may be set; the defaults are a build tree's paths):

- ``RMMD_LIBRARY``: librmmd_c.so (build/client/librmmd_c.so)
- ``RMMD_DAEMON``:  the rmmd program (build/daemon/rmmd)
- ``RMMD_RMMCTL``:  rmmctl (build/rmmctl/rmmctl)

GPU tests (marked ``gpu``) skip, saying why, where CUDA sees no GPU or
PyTorch or CuPy is missing.

Buffers that outlive the daemon: ``Daemon(..., keep_buffers=True)`` (and the
``kept_daemon`` fixture, ``fresh_daemon(..., keep_buffers=True)``) run rmmd
under this process as its service manager with an fd store
(service_manager.py, as harness/service_manager.cpp for the C++ tests).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from service_manager import ServiceManager

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _path_from(env: str, default: Path) -> Path:
    value = os.environ.get(env)
    return Path(value).resolve() if value else default


LIBRARY = _path_from("RMMD_LIBRARY", REPO / "build" / "client" / "librmmd_c.so")
DAEMON = _path_from("RMMD_DAEMON", REPO / "build" / "daemon" / "rmmd")
RMMCTL = _path_from("RMMD_RMMCTL", REPO / "build" / "rmmctl" / "rmmctl")

# This process and every Python process a test starts import the package
# from this checkout and load this library.
sys.path.insert(0, str(PYTHON_DIR))
os.environ["RMMD_LIBRARY"] = str(LIBRARY)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(PYTHON_DIR)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
)
os.environ.pop("RMMD_RUNTIME_DIR", None)  # each test names its daemon


def pytest_report_header(config: Any) -> list[str]:
    return [f"rmmd: library {LIBRARY}", f"rmmd: daemon {DAEMON}", f"rmmd: rmmctl {RMMCTL}"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """``RMMD_PYTEST_SHARD=I/N`` keeps every Nth selected test from the Ith:
    N processes at once run the suite's tests in turn, so the long tests of
    one file (test_gpu.py's) spread over all of them (scripts/gpu-check.sh)."""
    shard = os.environ.get("RMMD_PYTEST_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    kept = [item for n, item in enumerate(items) if n % count == index]
    config.hook.pytest_deselected(items=[item for n, item in enumerate(items) if n % count != index])
    items[:] = kept


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Polls `predicate` until it returns something true; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.01)


def _proto_fields(message: bytes, number: int) -> list[bytes]:
    """The values of the length-delimited field `number` of a serialized
    protobuf message (enough of the wire format to read a state file's names)."""

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = message[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, at

    out: list[bytes] = []
    at = 0
    while at < len(message):
        key, at = varint(at)
        wire = key & 7
        if wire == 0:
            _, at = varint(at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            n, at = varint(at)
            if key >> 3 == number:
                out.append(message[at : at + n])
            at += n
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {at}")
    return out


class Daemon:
    """A real rmmd in its own runtime directory.

    With ``keep_buffers``, this process is its service manager, as systemd
    is where it is PID 1 (service_manager.ServiceManager): rmmd's published
    buffers go to the manager's fd store and come back to every restart,
    and rmmd's state file (``state_file``) lives in a directory of its own
    (``state_dir``, beside the notify socket) that restarts keep. Without,
    the daemon keeps nothing across a restart, as under no service manager.
    """

    def __init__(
        self,
        *args: str,
        ready_timeout: float = 30.0,
        keep_buffers: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        if not DAEMON.exists():
            pytest.fail(f"no rmmd program at {DAEMON} (build it, or set RMMD_DAEMON)")
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="rmmd-py-"))
        self.log_path = self.runtime_dir / "rmmd.log"
        if "--drain-timeout-ms" not in args:
            args = (*args, "--drain-timeout-ms", "0")  # tests stop it at once
        self.manager: ServiceManager | None = None
        self.state_dir: Path | None = None
        self.state_file: Path | None = None
        if keep_buffers:
            self.state_dir = Path(tempfile.mkdtemp(prefix="rmmd-py-kept-"))
            self.state_file = self.state_dir / "buffers.state"
            self.manager = ServiceManager(self.state_dir / "notify.sock")
            args = (*args, "--state-file", str(self.state_file))
        self.args = [str(DAEMON), "--runtime-dir", str(self.runtime_dir), *args]
        self.daemon_env = dict(os.environ, **(env or {}))  # the daemon's (CUDA_VISIBLE_DEVICES, ...)
        self._start(ready_timeout)

    def restart(self, sig: int = signal.SIGKILL, ready_timeout: float = 30.0) -> None:
        """Kills the daemon with `sig` and starts it again in the same runtime
        directory (its log goes on in the same file)."""
        self.kill(sig)
        self._start(ready_timeout)

    def _start(self, ready_timeout: float) -> None:
        if self.manager is not None:
            self._start_managed(ready_timeout)
            return
        notify_path = self.runtime_dir / "notify.sock"
        notify_path.unlink(missing_ok=True)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(notify_path))
        env = dict(self.daemon_env, NOTIFY_SOCKET=str(notify_path))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        try:
            deadline = time.monotonic() + ready_timeout
            notify.settimeout(0.1)
            while True:
                try:
                    if b"READY=1" in notify.recv(4096):
                        break
                except socket.timeout:
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    why = (
                        f"it exited with status {self.process.returncode}"
                        if self.process.poll() is not None
                        else f"not ready after {ready_timeout} s"
                    )
                    self.stop()
                    pytest.fail(f"rmmd did not report READY=1 ({why}); log:\n{self.log()}")
        finally:
            notify.close()

    def _start_managed(self, ready_timeout: float) -> None:
        assert self.manager is not None
        with open(self.log_path, "ab") as log:
            self.process = self.manager.start(self.args, self.daemon_env, stdout=log)
        if self.manager.wait_for("READY=1", ready_timeout) is None:
            why = (
                f"it exited with status {self.process.returncode}"
                if self.process.poll() is not None
                else f"not ready after {ready_timeout} s"
            )
            self.stop()
            pytest.fail(f"rmmd did not report READY=1 ({why}); log:\n{self.log()}")

    def stored_buffers(self) -> list[str]:
        """The names of the buffer fds in the manager's store
        ("rmmd-buffer-<id>.<buffer name>"), in store order."""
        assert self.manager is not None, "a Daemon(keep_buffers=True) has a store"
        return [n for n in self.manager.stored_names() if n.startswith("rmmd-buffer-")]

    def wait_for_stored(self, names: list[str], timeout: float = 20.0) -> bool:
        """Waits until the store holds exactly one buffer fd per name of
        `names` and no other buffer fd."""
        assert self.manager is not None, "a Daemon(keep_buffers=True) has a store"
        want = sorted(names)

        def done(stored: list[str]) -> bool:
            held = [n.split(".", 1)[1] for n in stored if n.startswith("rmmd-buffer-") and "." in n]
            return sorted(held) == want and len(held) == len([n for n in stored if n.startswith("rmmd-buffer-")])

        return self.manager.wait_for_store(done, timeout)

    def state_file_buffers(self) -> list[str] | None:
        """The buffer names rmmd's state file records, in its order; None
        where there is no whole file (daemon/restart/state_file.hpp: magic,
        payload length, CRC-32C, then a BufferRegistryState, whose field 4
        holds the StoredBuffer records, each naming its buffer in field 3)."""
        assert self.state_file is not None, "a Daemon(keep_buffers=True) has a state file"
        try:
            raw = self.state_file.read_bytes()
        except OSError:
            return None
        if raw[:8] != b"RMMDST01" or len(raw) < 20:
            return None
        length = int.from_bytes(raw[8:16], "little")
        payload = raw[20:]
        if len(payload) != length:
            return None
        return [
            value.decode()
            for record in _proto_fields(payload, 4)
            for value in _proto_fields(record, 3)
        ]

    def wait_until_kept(self, names: list[str], timeout: float = 20.0) -> None:
        """Waits until the store holds a buffer fd for each of `names`
        (and no other) and the state file records exactly them: a SIGKILL
        then loses none of them."""
        assert self.wait_for_stored(names, timeout), f"store: {self.stored_buffers()}\n{self.log()}"
        wait_until(
            lambda: sorted(self.state_file_buffers() or []) == sorted(names),
            timeout,
            f"the state file to record {names} (it has {self.state_file_buffers()})",
        )

    def restart_stats(self) -> dict[str, int]:
        """Stats.restart as ``rmmctl stats --json`` says it, every figure an
        int (0 where the JSON leaves a zero out)."""
        r = self.stats().get("restart", {})
        return {
            k: int(r.get(k, 0))
            for k in ("restarts", "readopted_buffers", "readopted_bytes", "dropped_at_start")
        } | {"keeping_buffers": bool(r.get("keeping_buffers", False))}

    @property
    def pid(self) -> int:
        return self.process.pid

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a client of this daemon."""
        return dict(os.environ, RMMD_RUNTIME_DIR=str(self.runtime_dir), **extra)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def rmmctl(self, *args: str) -> str:
        out = subprocess.run(
            [str(RMMCTL), *args], env=self.env(), capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, f"rmmctl {' '.join(args)}: {out.stderr}"
        return out.stdout

    def stats(self) -> dict[str, Any]:
        """What ``rmmctl stats --json`` says (the daemon's view, from outside)."""
        return json.loads(self.rmmctl("stats", "--json"))

    def sessions_of(self, pid: int) -> list[dict[str, Any]]:
        return [s for s in self.stats().get("sessions", []) if int(s.get("pid", 0)) == pid]

    def pool_in_use(self, name: str) -> int:
        for p in self.stats()["pools"]:
            if p["pool"]["name"] == name:
                return int(p["in_use_bytes"])
        raise AssertionError(f"no pool named {name}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.manager is not None:
            self.manager.kill(sig)
        elif self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        if self.manager is not None:
            self.manager.close()  # the store's fds too: what it kept goes
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """A daemon with one 64 MiB host pool, shared by a test module."""
    d = Daemon("--backend", "host", "--host-pool-bytes", "64MiB")
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon() -> Iterator[Callable[..., Daemon]]:
    """Starts daemons of a test's own (stopped at its end):
    fresh_daemon(*flags, keep_buffers=False)."""
    started: list[Daemon] = []

    def start(*args: str, keep_buffers: bool = False) -> Daemon:
        d = Daemon(*args, keep_buffers=keep_buffers)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def kept_daemon() -> Iterator[Daemon]:
    """A daemon with one 64 MiB host pool under this process as its service
    manager: published buffers outlive it (Daemon(keep_buffers=True))."""
    d = Daemon("--backend", "host", "--host-pool-bytes", "64MiB", keep_buffers=True)
    yield d
    d.stop()


@pytest.fixture
def session(daemon: Daemon) -> Iterator[Any]:
    import rmmd

    with rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="pytest") as s:
        yield s


def run_python(
    args: list[str], env: dict[str, str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Runs `python args...` (a script of tests/scripts, or -c) to its end."""
    out = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert out.returncode == 0, f"{args} exited with {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def start_python(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Starts `python args...` with pipes on stdin, stdout and stderr."""
    return subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """The next line `proc` prints (fails, with its stderr, if it ends first)."""
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout)
    sel.close()
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"{proc.args} said nothing (status {proc.returncode}); stderr:\n{err}")
    return line.strip()


# ---- GPU --------------------------------------------------------------------

_gpu_probe: dict[str, Any] = {}


def gpu_count() -> int:
    """CUDA devices this machine has, asked in a child process (this one
    stays without a CUDA context)."""
    if "count" not in _gpu_probe:
        out = run_python(
            ["-c", "from rmmd import _cuda; print(_cuda.device_count())"], dict(os.environ), check=False
        )
        try:
            _gpu_probe["count"] = int(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            _gpu_probe["count"] = 0
            _gpu_probe["why"] = (out.stderr.strip().splitlines() or ["?"])[-1]
    return _gpu_probe["count"]


def need_gpu() -> None:
    if gpu_count() == 0:
        pytest.skip(f"no GPU here ({_gpu_probe.get('why', 'CUDA sees no device')})")


def need_module(name: str) -> None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed in {sys.executable}")


@pytest.fixture(scope="module")
def gpu_daemon() -> Iterator[Daemon]:
    """A daemon with a CUDA pool per GPU (8 GiB each) and a host pool."""
    need_gpu()
    d = Daemon(
        "--backend", "cuda", "--cuda-pool-bytes", "8GiB", "--host-pool-bytes", "256MiB"
    )
    yield d
    d.stop()
