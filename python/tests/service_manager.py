"""A stand-in for systemd's service manager with a file-descriptor store, for
tests of buffers that outlive rmmd: it speaks the documented protocol from
the manager's side, with the semantics of harness/service_manager.cpp (the
C++ tests' stand-in), which follows systemd's src/core/service.c.

- The notify socket: an AF_UNIX datagram socket with SO_PASSCRED, whose path
  the service gets as NOTIFY_SOCKET. Each datagram is newline-separated
  assignments (READY=1, STATUS=..., FDSTORE=1, FDNAME=..., FDSTOREREMOVE=1),
  fds by SCM_RIGHTS. As systemd with NotifyAccess=main, a message from any
  pid but the service's main pid is ignored and its fds closed (one without
  credentials, or truncated, too).
- The store: FDSTORE=1 keeps the message's fds under its FDNAME ("stored" if
  none, or if the name is not valid); an fd already in the store (the same
  open file) is not kept twice; past `fd_store_max` the fd is closed and a
  line is logged; fds without FDSTORE=1 are closed. FDSTOREREMOVE=1 with
  FDNAME closes every stored fd of that name. Stored fds stay stored when
  they are passed to the next start; they go only by FDSTOREREMOVE,
  clear_store() (``systemctl clean --what=fdstore``) or close().
- Starting the service: the stored fds at 3, 4, ... in store order, with
  LISTEN_FDS=<n>, LISTEN_FDNAMES=<names joined by ':'> and LISTEN_PID=<the
  service's own pid> (set only where there is at least one fd). Python cannot
  run code between fork and exec without preexec_fn, which is unsafe in a
  process with threads (this one receives on a thread), so the child is a
  small Python that puts the fds in place, sets LISTEN_PID to its own pid and
  execs the service: the pid stays the same, so it is the main pid.

log() holds what systemd would write to its journal about the service.

Thread safety: a thread of its own receives the notify messages; every
method may be called from any thread, but start() and kill() from one at a
time.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

# systemd accepts up to 768 fds (NOTIFY_FD_MAX) in one message.
_NOTIFY_FD_MAX = 768
_UCRED = struct.Struct("iII")  # pid, uid, gid

# Run as `python -S -c _EXEC_WITH_FDS PROGRAM ARGS...`: the fds named by
# _RMMD_PASSED_FDS (all numbered at or above 3 + their count) go to 3, 4, ...
_EXEC_WITH_FDS = """\
import os, sys
high = [int(fd) for fd in os.environ.pop("_RMMD_PASSED_FDS").split(",") if fd]
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i, inheritable=True)
for fd in high:
    os.close(fd)
if high:
    os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[1], sys.argv[1:])
"""


@dataclass(frozen=True)
class NotifyMessage:
    """A message the manager received."""

    sender: int  # -1: without credentials
    text: str
    fds: int


@dataclass
class _StoredFd:
    name: str
    fd: int


def valid_fd_name(name: str) -> bool:
    """systemd's fdname_is_valid."""
    return len(name) <= 255 and all(" " <= c < "\x7f" and c != ":" for c in name)


def _field(text: str, key: str) -> str | None:
    for line in text.split("\n"):
        if line.startswith(key + "="):
            return line[len(key) + 1 :]
    return None


def _same_open_file(a: int, b: int) -> bool:
    """Whether `a` and `b` are the same open file (systemd's same_fd, without
    kcmp: the same inode and the same file status flags)."""
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino) and fcntl.fcntl(a, fcntl.F_GETFL) == fcntl.fcntl(
        b, fcntl.F_GETFL
    )


class ServiceManager:
    """Binds `notify_socket` (which must not exist) and receives on it until
    close()."""

    def __init__(self, notify_socket: Path, fd_store_max: int = 4096) -> None:
        self.notify_socket = Path(notify_socket)
        self.fd_store_max = fd_store_max
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._socket.bind(str(self.notify_socket))
        self._stop_r, self._stop_w = os.pipe()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._process: subprocess.Popen[bytes] | None = None
        self._main_pid = -1
        self._first_message_of_service = 0
        self._store: list[_StoredFd] = []
        self._messages: list[NotifyMessage] = []
        self._log: list[str] = []
        self._closed = False
        self._receiver = threading.Thread(target=self._receive_loop, name="notify-socket", daemon=True)
        self._receiver.start()

    # -- the service ----------------------------------------------------------

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], stdout: IO[Any] | int | None = None
    ) -> subprocess.Popen[bytes]:
        """Starts `argv` (argv[0] a path) with `env` plus NOTIFY_SOCKET and
        the LISTEN_ variables, the stored fds at 3.. (stdout and stderr to
        `stdout`). REQUIRES: no service runs."""
        with self._lock:
            if self._main_pid > 0:
                raise RuntimeError("ServiceManager.start: the service runs")
            passed = [(s.name, s.fd) for s in self._store]
        n = len(passed)
        # Each fd above 3 + n first, so that placing them at 3.. never
        # overwrites one not yet placed.
        high: list[int] = []
        try:
            for _, fd in passed:
                high.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + n))
            environment = {
                k: v for k, v in env.items() if k != "NOTIFY_SOCKET" and not k.startswith("LISTEN_")
            }
            environment["NOTIFY_SOCKET"] = str(self.notify_socket)
            if n:
                environment["LISTEN_FDS"] = str(n)
                environment["LISTEN_FDNAMES"] = ":".join(name for name, _ in passed)
            environment["_RMMD_PASSED_FDS"] = ",".join(str(fd) for fd in high)
            # Held while the process starts: a message it sends at once is
            # handled once its pid is the main pid.
            with self._lock:
                process = subprocess.Popen(
                    [sys.executable, "-S", "-c", _EXEC_WITH_FDS, *argv],
                    env=environment,
                    pass_fds=high,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=subprocess.STDOUT if stdout is not None else None,
                )
                self._process = process
                self._main_pid = process.pid
                self._first_message_of_service = len(self._messages)
                self._changed.notify_all()
            return process
        finally:
            for fd in high:
                os.close(fd)

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        """Sends `sig` to the service (SIGKILL: a crash) and reaps it; the
        store stays. Returns its exit status (Popen.returncode), None if
        none ran."""
        with self._lock:
            process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
        status = process.wait(timeout=60)
        with self._lock:
            # What the service sent before it died is its own, as systemd
            # dispatches notify messages before SIGCHLD: a FDSTOREREMOVE
            # sent just before a SIGKILL still takes its fd out.
            deadline = time.monotonic() + 10
            while self._pending() and time.monotonic() < deadline:
                self._changed.wait(0.05)
            self._process = None
            self._main_pid = -1
            self._changed.notify_all()
        return status

    @property
    def main_pid(self) -> int:
        """The service's pid, -1 if none runs (or it exited and was reaped by kill())."""
        with self._lock:
            return self._main_pid

    def wait_for(self, text: str, timeout: float) -> str | None:
        """The first message of the current service (since its start)
        holding `text`; None after `timeout` s or once the service exited
        without sending it."""
        deadline = time.monotonic() + timeout
        with self._lock:
            seen = self._first_message_of_service
            pid = self._main_pid
            process = self._process
            while True:
                for m in self._messages[seen:]:
                    if m.sender == pid and text in m.text:
                        return m.text
                seen = len(self._messages)
                if pid <= 0 or self._main_pid != pid or process is None or time.monotonic() > deadline:
                    return None
                if process.poll() is not None and not self._pending():
                    # Exited, and the receiver has handled all it sent.
                    for m in self._messages[seen:]:
                        if m.sender == pid and text in m.text:
                            return m.text
                    return None
                self._changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))

    def _pending(self) -> bool:
        return bool(select.select([self._socket], [], [], 0)[0])

    # -- the store ------------------------------------------------------------

    def stored_names(self) -> list[str]:
        """The names of the stored fds, in store order."""
        with self._lock:
            return [s.name for s in self._store]

    def wait_for_store(self, done: Callable[[list[str]], bool], timeout: float) -> bool:
        """Waits until `done(stored_names())` holds; False after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done([s.name for s in self._store]):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def clear_store(self) -> None:
        """Closes every stored fd."""
        with self._lock:
            for s in self._store:
                os.close(s.fd)
            self._store.clear()
            self._changed.notify_all()

    def messages(self) -> list[NotifyMessage]:
        """Every message received, accepted or not, in order."""
        with self._lock:
            return list(self._messages)

    def log(self) -> list[str]:
        """What systemd would log about the service, in order."""
        with self._lock:
            return list(self._log)

    def close(self) -> None:
        """SIGKILLs the service if it runs, stops receiving, closes every
        stored fd and removes the socket file. Once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self.kill(signal.SIGKILL)
        if self._receiver.is_alive():
            os.write(self._stop_w, b"x")
            self._receiver.join(timeout=30)
        os.close(self._stop_r)
        os.close(self._stop_w)
        self._socket.close()
        self.notify_socket.unlink(missing_ok=True)
        self.clear_store()

    # -- receiving ------------------------------------------------------------

    def _receive_loop(self) -> None:
        ancillary = socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(4 * _NOTIFY_FD_MAX)
        while True:
            ready, _, _ = select.select([self._socket, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            # Received and handled under the lock, so that kill() sees a
            # message either still queued or handled, never in between.
            self._lock.acquire()
            try:
                data, ancdata, flags, _ = self._socket.recvmsg(
                    4096, ancillary, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                self._lock.release()
                continue
            except OSError:
                self._lock.release()
                return
            fds: list[int] = []
            sender: int | None = None
            for level, kind, payload in ancdata:
                if level != socket.SOL_SOCKET:
                    continue
                if kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                    fds.extend(got)
                elif kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                    sender = _UCRED.unpack(payload[: _UCRED.size])[0]
            message = NotifyMessage(
                sender=-1 if sender is None else sender, text=data.decode(errors="replace"), fds=len(fds)
            )
            try:
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    self._refuse(message, fds, "notification message truncated, ignoring")
                elif sender is None:
                    self._refuse(message, fds, "notification message without credentials, ignoring")
                else:
                    self._handle(message, fds)
                self._changed.notify_all()
            finally:
                self._lock.release()

    # Called with the lock held.
    def _refuse(self, message: NotifyMessage, fds: list[int], why: str) -> None:
        self._log.append(why)
        for fd in fds:
            os.close(fd)
        self._messages.append(message)

    # Called with the lock held.
    def _handle(self, message: NotifyMessage, fds: list[int]) -> None:
        text = message.text
        if self._main_pid <= 0 or message.sender != self._main_pid:
            self._refuse(
                message,
                fds,
                f"notification message from PID {message.sender}, but reception only permitted "
                f"for main PID {self._main_pid}",
            )
            return
        if _field(text, "FDSTORE") == "1":
            name = _field(text, "FDNAME")
            if name is None or not valid_fd_name(name):
                self._log.append("passed FDNAME= name is invalid, ignoring")
                name = "stored"
            for fd in fds:
                self._add_to_store(fd, name)
        elif fds:
            self._log.append("got file descriptors via the notification socket without FDSTORE=1, closing")
            for fd in fds:
                os.close(fd)
        if _field(text, "FDSTOREREMOVE") == "1":
            name = _field(text, "FDNAME")
            if name is None or not valid_fd_name(name):
                self._log.append("FDSTOREREMOVE=1 requested, but no valid file descriptor name passed, ignoring")
            else:
                for s in [s for s in self._store if s.name == name]:
                    os.close(s.fd)
                self._store = [s for s in self._store if s.name != name]
        self._messages.append(message)

    # Called with the lock held.
    def _add_to_store(self, fd: int, name: str) -> None:
        if any(_same_open_file(s.fd, fd) for s in self._store):
            os.close(fd)
            return
        if len(self._store) >= self.fd_store_max:
            self._log.append(
                f"failed to add fd '{name}' to the store: the store is full ({self.fd_store_max} fds, "
                "FileDescriptorStoreMax=)"
            )
            os.close(fd)
            return
        self._store.append(_StoredFd(name, fd))
