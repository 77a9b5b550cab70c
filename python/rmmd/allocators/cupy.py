"""CuPy over rmmd, two ways::

    import cupy
    from rmmd.allocators.cupy import rmmd_memory_pool, rmmd_allocator
    pool = rmmd_memory_pool()                 # 1. CuPy's pool over rmmd
    cupy.cuda.set_allocator(pool.malloc)
    cupy.cuda.set_allocator(rmmd_allocator()) # 2. every allocation from rmmd
    x = cupy.arange(1 << 20)     # device memory lent by the node's rmmd

With ``rmmd_allocator`` each CuPy allocation is one allocation of an rmmd
device resource (slab mode by default: carved in this process out of slabs
leased from the daemon), made on CuPy's current stream and freed on it when
CuPy lets the memory go; the Python call around it costs about 6 us a pair
on an H100 host, 2.6x CuPy's pool. ``rmmd_memory_pool`` keeps CuPy's own
pool on top, at its speed (docs/python.md).

This module imports without CuPy; the allocator needs it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Callable

from .. import _lib
from .._common import exiting
from .._errors import InvalidArgumentError, OutOfMemoryError, check

if TYPE_CHECKING:
    from .._resource import DeviceResource
    from .._session import Session


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as e:
        raise ModuleNotFoundError(
            f"rmmd.allocators.cupy needs CuPy, which does not import here ({e})"
        ) from e
    return cupy


class _Lease:
    """Owns one allocation for CuPy's UnownedMemory; frees it when CuPy
    drops the memory."""

    __slots__ = ("resource", "ptr", "nbytes", "stream", "stream_owner")

    def __init__(
        self, resource: "DeviceResource", ptr: int, nbytes: int, stream: int, stream_owner: Any
    ) -> None:
        self.resource = resource
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        # The free runs on `stream` later: a cupy.cuda.Stream destroys its
        # handle when collected, so the lease keeps the object alive.
        self.stream_owner = stream_owner

    def __del__(self) -> None:
        r = self.resource
        handle = r._handle
        if handle and self.ptr and not exiting():
            r._deallocate(handle, self.ptr, self.nbytes, 256, self.stream or None)


def rmmd_allocator(
    session: "Session | None" = None,
    device: int | None = None,
    mode: str = "slab",
    graph_safe: bool | None = True,
) -> Callable[[int], Any]:
    """A function for ``cupy.cuda.set_allocator``: ``nbytes -> cupy.cuda.MemoryPointer``.

    Args:
        session: the session to allocate through; ``None``: one made at the
            first allocation (``rmmd.Session(client_name="cupy")``).
        device: the only CUDA device to allocate on; ``None``: the current
            device of each call (one resource per device).
        mode: ``"slab"`` or ``"direct"`` (see ``Session.device_resource``).
        graph_safe: see ``Session.device_resource``; ``True`` (the default
            here): memory freed during a CUDA graph capture stays the
            graph's until it is destroyed, at about 30 ns a call, which a
            Python allocation never notices.

    The function raises ``rmmd.OutOfMemoryError`` (a ``MemoryError``) when
    rmmd cannot lend the memory. Its attributes ``session`` and
    ``resources`` (device -> DeviceResource) show what it made.
    """
    cupy = _cupy()
    from .._resource import capture_checks_value, mode_value
    from .._session import Session

    mode_value(mode)  # a bad mode fails here, not at the first allocation
    capture_checks_value(graph_safe)
    lock = threading.Lock()
    resources: dict[int, DeviceResource] = {}
    state: dict[str, Any] = {"session": session}
    allocate_c = _lib.load().rmmd_allocate
    get_device = cupy.cuda.runtime.getDevice
    current_stream = cupy.cuda.get_current_stream
    unowned = cupy.cuda.UnownedMemory
    memory_pointer = cupy.cuda.MemoryPointer
    c_void_p = ctypes.c_void_p
    byref = ctypes.byref

    def resource_for(dev: int) -> "DeviceResource":
        with lock:
            r = resources.get(dev)
            if r is None:
                if device is not None and dev != device:
                    raise InvalidArgumentError(
                        f"rmmd: this allocator serves CUDA device {device}; the current device is {dev}"
                    )
                s = state["session"]
                if s is None:
                    s = state["session"] = Session(client_name="cupy")
                    allocate.session = s  # type: ignore[attr-defined]
                r = resources[dev] = s.device_resource(device=dev, mode=mode, graph_safe=graph_safe)
            return r

    def allocate(nbytes: int) -> Any:
        dev = get_device()
        r = resources.get(dev) or resource_for(dev)
        owner = current_stream()
        stream = owner.ptr
        out = c_void_p()
        status = allocate_c(r._handle, nbytes, 256, stream or None, byref(out))
        if status:
            try:
                check(status)
            except Exception as e:
                _said.message = str(e)
                raise
        ptr = out.value or 0
        return memory_pointer(unowned(ptr, nbytes, _Lease(r, ptr, nbytes, stream, owner), dev), 0)

    allocate.resources = resources  # type: ignore[attr-defined]
    allocate.session = session  # type: ignore[attr-defined]
    return allocate


_said = threading.local()


def last_error() -> str:
    """rmmd's message for the last allocation it refused on this thread
    ("" if none): under :func:`rmmd_memory_pool`, CuPy raises its own
    ``OutOfMemoryError``, whose message is CuPy's."""
    return getattr(_said, "message", "")


def rmmd_memory_pool(
    session: "Session | None" = None,
    device: int | None = None,
    mode: str = "slab",
    graph_safe: bool | None = True,
) -> Any:
    """CuPy's own ``cupy.cuda.MemoryPool`` over rmmd (recommended)::

        pool = rmmd_memory_pool()
        cupy.cuda.set_allocator(pool.malloc)

    CuPy's pool caches and splits blocks per stream as it always does; only
    the blocks it lacks come from rmmd, through :func:`rmmd_allocator` (same
    arguments). So an allocation costs what it costs with CuPy's default
    pool, and the memory is rmmd's: counted under the session, reclaimed
    when the process ends. ``pool.free_all_blocks()`` gives cached blocks
    back to rmmd. When rmmd cannot lend more, CuPy's pool frees its cache,
    retries, and raises ``cupy.cuda.memory.OutOfMemoryError`` (a
    ``MemoryError``) with CuPy's message; :func:`last_error` has rmmd's.
    """
    cupy = _cupy()
    allocate = rmmd_allocator(session, device, mode, graph_safe)
    runtime_error = cupy.cuda.runtime.CUDARuntimeError
    # CuPy's pool frees its cache and retries only on the runtime's
    # cudaErrorMemoryAllocation (2); rmmd's MemoryError would pass through.
    memory_allocation = 2

    def allocate_for_pool(nbytes: int) -> Any:
        try:
            return allocate(nbytes)
        except OutOfMemoryError as e:
            raise runtime_error(memory_allocation) from e

    return cupy.cuda.MemoryPool(allocate_for_pool)


__all__ = ["last_error", "rmmd_allocator", "rmmd_memory_pool"]
