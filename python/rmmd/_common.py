"""Small helpers shared by the modules of the package."""

from __future__ import annotations

import atexit
import sys
from typing import Any

from ._errors import InvalidArgumentError, check

# Set once the interpreter begins to exit: objects freed from then on leave
# their memory to the process's end (the daemon reclaims what a session held
# when its socket closes), so nothing runs, or prints, at exit.
_exiting = False


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


atexit.register(_mark_exiting)
_is_finalizing = sys.is_finalizing


def exiting() -> bool:
    """True once the interpreter has begun to exit."""
    return _exiting or _is_finalizing()


def stream_handle(stream: Any) -> int:
    """A cudaStream_t as an int from what a caller passes as a stream.

    Accepts ``None`` and ``0`` (the legacy default stream), an int (the
    handle; 1 and 2 are CUDA's legacy and per-thread default streams), or a
    stream object of a framework: anything with ``__cuda_stream__()`` (CUDA
    Python, CCCL), ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or ``.handle``
    (Numba).
    """
    if stream is None:
        return 0
    if isinstance(stream, int):
        if stream < 0:
            raise InvalidArgumentError(f"rmmd: stream {stream} is not a CUDA stream handle")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto()
        return int(value[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if value is not None:
            value = getattr(value, "value", value)  # a ctypes c_void_p
            return int(value or 0)
    raise InvalidArgumentError(
        f"rmmd: {type(stream).__name__} is not a CUDA stream (pass an int handle, "
        "a torch.cuda.Stream, a cupy.cuda.Stream, or an object with __cuda_stream__)"
    )


def positive_size(nbytes: int, what: str = "nbytes") -> int:
    """`nbytes` as a non-negative int, or InvalidArgumentError."""
    try:
        n = int(nbytes)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"rmmd: {what} must be an int, not {nbytes!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"rmmd: {what} is negative ({n})")
    return n


class OwnsHandle:
    """An object that owns one C ABI handle (``self._handle``, freed with
    ``self._destroy``): ``close()`` (idempotent), ``closed``, a ``with``
    block, and a quiet free when collected (none while the interpreter
    exits: the process's end closes the session)."""

    _handle: Any = None
    _destroy: Any = None

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            check(self._destroy(handle))

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle and not exiting():
            self._handle = None
            self._destroy(handle)
