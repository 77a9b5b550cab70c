"""rmmd's exceptions: one per status of the C ABI (DESIGN.md's error table),
each a subclass of the built-in exception a Python programmer would catch."""

from __future__ import annotations

import builtins
import enum

from . import _lib


class Status(enum.IntEnum):
    """rmmd_status: the values are gRPC's status codes."""

    SUCCESS = 0
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    OUT_OF_MEMORY = 8
    FAILED_PRECONDITION = 9
    INTERNAL = 13
    SESSION = 14


class Error(Exception):
    """Base of every rmmd error.

    Attributes:
        status: the C ABI's status (:class:`Status`); ``None`` for errors
            raised by the Python layer itself.
        message: what rmmd said (``rmmd_last_error_message()``), also ``str(e)``.
    """

    status: Status | None
    message: str

    # `status` is keyword-only: the OSError subclasses below would read a
    # second positional argument as (errno, strerror).
    def __init__(self, message: str, *, status: Status | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class InvalidArgumentError(Error, ValueError):
    """INVALID_ARGUMENT: a bad size, alignment, name, pool or handle."""


class NotFoundError(Error, FileNotFoundError):
    """NOT_FOUND: no shared buffer of that name (or no such allocation).

    A :class:`FileNotFoundError`: shared buffers live in a namespace of
    path-like names, opened by name, and this is the error an open of a
    missing name raises in Python; it pairs with :class:`AlreadyExistsError`
    (a :class:`FileExistsError`).
    """


class AlreadyExistsError(Error, FileExistsError):
    """ALREADY_EXISTS: a shared buffer of that name exists."""


class PermissionError(Error, builtins.PermissionError):  # noqa: A001 (mirrors the built-in)
    """PERMISSION_DENIED: the uid or gid may not do it."""


class OutOfMemoryError(Error, MemoryError):
    """OUT_OF_MEMORY: a quota, the pool's limit, or the device is full."""


class PreconditionError(Error, RuntimeError):
    """FAILED_PRECONDITION: not yet (a buffer not published), not the creator,
    too late (configured after the first allocation), a pool without the
    handle type asked for."""


class InternalError(Error, RuntimeError):
    """INTERNAL: a CUDA or system error, named in the message."""


class DeadlineError(Error, TimeoutError):
    """DEADLINE_EXCEEDED: a wait ended before what it waited for came (a
    shared buffer's write lease still held by another session, named in the
    message). Nothing changed, and the session is fine: wait again."""


class SessionError(Error, ConnectionError):
    """SESSION: no daemon, the daemon is gone or draining, the session is lost
    or closed."""


_BY_STATUS: dict[int, type[Error]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.DEADLINE_EXCEEDED: DeadlineError,
    Status.NOT_FOUND: NotFoundError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.PERMISSION_DENIED: PermissionError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.FAILED_PRECONDITION: PreconditionError,
    Status.INTERNAL: InternalError,
    Status.SESSION: SessionError,
}


def error_for(status: int, message: str) -> Error:
    """The exception for a C status and its message."""
    try:
        s: Status | None = Status(status)
    except ValueError:
        s = None
    cls = _BY_STATUS.get(status, InternalError)
    if s is None:
        message = f"{message} (rmmd status {status})"
    return cls(message, status=s)


def check(status: int) -> None:
    """Raises the exception for `status` (with this thread's message) unless
    it is success."""
    if status == 0:
        return
    raw = _lib.load().rmmd_last_error_message()
    message = raw.decode("utf-8", errors="replace") if raw else ""
    raise error_for(status, message or f"rmmd: failed with status {status}")
