"""Fixtures for the rmmd package's tests: the real daemon, started per test
module (or per test, where a test stops it), ready when it sends READY=1 to
a notify socket the test owns.

Where things are (each may be set; the defaults are a build tree's paths):

- ``RMMD_LIBRARY``: librmmd_c.so (build/client/librmmd_c.so)
- ``RMMD_DAEMON``:  the rmmd program (build/daemon/rmmd)
- ``RMMD_RMMCTL``:  rmmctl (build/rmmctl/rmmctl)

GPU tests (marked ``gpu``) skip, saying why, where CUDA sees no GPU or
PyTorch or CuPy is missing.
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


class Daemon:
    """A real rmmd in its own runtime directory."""

    def __init__(self, *args: str, ready_timeout: float = 30.0) -> None:
        if not DAEMON.exists():
            pytest.fail(f"no rmmd program at {DAEMON} (build it, or set RMMD_DAEMON)")
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="rmmd-py-"))
        self.log_path = self.runtime_dir / "rmmd.log"
        if "--drain-timeout-ms" not in args:
            args = (*args, "--drain-timeout-ms", "0")  # tests stop it at once
        self.args = [str(DAEMON), "--runtime-dir", str(self.runtime_dir), *args]
        self._start(ready_timeout)

    def restart(self, sig: int = signal.SIGKILL, ready_timeout: float = 30.0) -> None:
        """Kills the daemon with `sig` and starts it again in the same runtime
        directory (its log goes on in the same file)."""
        self.kill(sig)
        self._start(ready_timeout)

    def _start(self, ready_timeout: float) -> None:
        notify_path = self.runtime_dir / "notify.sock"
        notify_path.unlink(missing_ok=True)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(notify_path))
        env = dict(os.environ, NOTIFY_SOCKET=str(notify_path))
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
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """A daemon with one 64 MiB host pool, shared by a test module."""
    d = Daemon("--backend", "host", "--host-pool-bytes", "64MiB")
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon() -> Iterator[Callable[..., Daemon]]:
    """Starts daemons of a test's own (stopped at its end): fresh_daemon(*flags)."""
    started: list[Daemon] = []

    def start(*args: str) -> Daemon:
        d = Daemon(*args)
        started.append(d)
        return d

    yield start
    for d in started:
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
