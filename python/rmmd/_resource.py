"""Memory resources (rmmd::host_memory_resource, pinned_host_memory_resource,
ipc_memory_resource) and the allocations made from them."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _lib
from ._common import OwnsHandle, exiting, positive_size, stream_handle
from ._errors import InvalidArgumentError, check
from ._memory import Memory
from ._session import Pool, pool_name

if TYPE_CHECKING:
    from ._session import Session


@dataclass(frozen=True)
class ResourceStats:
    """What this process allocated through one resource (what a framework's
    own memory statistics cannot see under an external allocator)."""

    allocated_bytes: int
    """Live allocations' bytes (as asked for)."""
    allocation_count: int
    """Live allocations."""
    high_water_bytes: int
    """Most ``allocated_bytes`` at once."""
    total_allocations: int
    """Allocations since the resource was made."""
    device: int
    """The CUDA ordinal; -1 for host resources."""

    @classmethod
    def _from_c(cls, s: _lib.ResourceStats) -> "ResourceStats":
        return cls(
            allocated_bytes=s.allocated_bytes,
            allocation_count=s.allocation_count,
            high_water_bytes=s.high_water_bytes,
            total_allocations=s.total_allocations,
            device=s.device,
        )


class MemoryResource(OwnsHandle):
    """A memory resource over one of the daemon's pools: stream-ordered
    ``allocate``/``deallocate`` of raw pointers (as RMM's resources), and
    :meth:`allocation` for an object that frees itself.

    The resource keeps its Session's daemon session open. ``close()`` (or
    the resource's end) gives back everything still allocated from it.
    Thread-safe, except that it must not be closed while another thread
    uses it.
    """

    _kind: int
    _handle: int | None = None

    def __init__(self, session: "Session", options: _lib.ResourceOptions) -> None:
        lib = _lib.load()
        handle = _lib.resource_t()
        check(lib.rmmd_resource_create(session._require(), ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle.value
        self._session = session
        self._destroy = lib.rmmd_resource_destroy
        self._allocate = lib.rmmd_allocate
        self._deallocate = lib.rmmd_deallocate
        stats = self.stats()
        self._device = stats.device

    @property
    def session(self) -> "Session":
        return self._session

    @property
    def device(self) -> int:
        """This process's CUDA ordinal of the pool's GPU; -1 for host resources."""
        return self._device

    @property
    def is_host(self) -> bool:
        return self._device < 0

    def _require(self) -> int:
        if self._handle is None:
            raise InvalidArgumentError(f"rmmd: this {type(self).__name__} was closed")
        return self._handle

    def allocate(self, nbytes: int, alignment: int = 256, stream: Any = None) -> int:
        """Allocates `nbytes` bytes (ready on `stream`, as RMM's resources
        are); returns the address (0 for 0 bytes).

        Raises:
            OutOfMemoryError: a quota, the pool, or the device is full.
            InvalidArgumentError: a bad size or alignment.
            SessionError: the daemon is gone.
        """
        out = ctypes.c_void_p()
        check(
            self._allocate(
                self._require(),
                positive_size(nbytes),
                int(alignment),
                stream_handle(stream) or None,
                ctypes.byref(out),
            )
        )
        return out.value or 0

    def deallocate(self, ptr: int, nbytes: int, alignment: int = 256, stream: Any = None) -> None:
        """Frees what :meth:`allocate` returned, in `stream`'s order; the same
        `nbytes` and `alignment`. 0 does nothing."""
        if not ptr:
            return
        check(
            self._deallocate(
                self._require(), ptr, positive_size(nbytes), int(alignment), stream_handle(stream) or None
            )
        )

    def stats(self) -> ResourceStats:
        """What this process allocated through this resource."""
        s = _lib.ResourceStats(size=ctypes.sizeof(_lib.ResourceStats))
        check(_lib.load().rmmd_resource_get_stats(self._require(), ctypes.byref(s)))
        return ResourceStats._from_c(s)

    def allocation(self, nbytes: int, alignment: int = 256, stream: Any = None) -> "Allocation":
        """An allocation that frees itself (when garbage collected, at
        ``free()``, or at the end of a ``with`` block)."""
        cls = HostAllocation if self.is_host else DeviceAllocation
        return cls(self, nbytes, alignment=alignment, stream=stream)

    def close(self) -> None:
        """Gives back everything still allocated from this resource (its
        allocations must not be used afterwards). Idempotent."""
        super().close()

    def __enter__(self) -> "MemoryResource":
        return self

    def __repr__(self) -> str:
        return f"<rmmd.{type(self).__name__} device={self._device}{' closed' if self.closed else ''}>"


class HostResource(MemoryResource):
    """Shared host memory from a host pool (``Session.host_resource()``);
    page-locked, so the GPU reaches it too, when made with ``pinned=True``."""

    def __init__(self, session: "Session", pool: str | Pool | None = None, pinned: bool = False) -> None:
        kind = _lib.RESOURCE_PINNED_HOST if pinned else _lib.RESOURCE_HOST
        options = _lib.ResourceOptions(
            size=ctypes.sizeof(_lib.ResourceOptions),
            kind=kind,
            device=-1,
            pool=pool_name(pool),
            mode=_lib.MODE_SLAB,
        )
        super().__init__(session, options)
        self.pinned = pinned


_MODES = {"slab": _lib.MODE_SLAB, "direct": _lib.MODE_DIRECT}


def mode_value(mode: str) -> int:
    try:
        return _MODES[mode]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"rmmd: mode is {mode!r}; use 'slab' (the default) or 'direct'"
        ) from None


def lanes_value(lanes: int | str) -> int:
    """ResourceOptions.carving_lanes for `lanes`: "auto" is 0."""
    if lanes == "auto":
        return _lib.CARVING_LANES_AUTO
    if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 16:
        raise InvalidArgumentError(
            f"rmmd: lanes is {lanes!r}; give 'auto' (a lane per thread that allocates, "
            "the default) or 1 to 16"
        )
    return lanes


def capture_checks_value(graph_safe: bool | None) -> int:
    """ResourceOptions.capture_checks for `graph_safe`: None is automatic."""
    if graph_safe is None:
        return _lib.CAPTURE_CHECKS_AUTOMATIC
    if not isinstance(graph_safe, bool):
        raise InvalidArgumentError(f"rmmd: graph_safe is {graph_safe!r}; give True, False or None")
    return _lib.CAPTURE_CHECKS_EVERY_CALL if graph_safe else _lib.CAPTURE_CHECKS_SLOW_PATH_ONLY


class DeviceResource(MemoryResource):
    """Device memory from a CUDA pool (``Session.device_resource()``)."""

    def __init__(
        self,
        session: "Session",
        device: int | None = None,
        mode: str = "slab",
        pool: str | Pool | None = None,
        lanes: int | str = "auto",
        graph_safe: bool | None = None,
    ) -> None:
        options = _lib.ResourceOptions(
            size=ctypes.sizeof(_lib.ResourceOptions),
            kind=_lib.RESOURCE_DEVICE,
            device=-1 if device is None else int(device),
            pool=pool_name(pool),
            mode=mode_value(mode),
            carving_lanes=lanes_value(lanes),
            capture_checks=capture_checks_value(graph_safe),
        )
        super().__init__(session, options)
        self.mode = mode


class Allocation(Memory):
    """One allocation from a resource, freed when this object goes (or at
    ``free()``, or at the end of a ``with`` block), in the order of the
    stream it was made on. Views of it (memoryview, numpy arrays, tensors
    made through ``__cuda_array_interface__`` or DLPack) keep it alive."""

    def __init__(
        self, resource: MemoryResource, nbytes: int, alignment: int = 256, stream: Any = None
    ) -> None:
        self._resource: MemoryResource | None = None
        self._stream = stream_handle(stream)
        # Its free uses the stream later: keep a CuPy or CUDA Python stream
        # object, which destroys its handle when collected, alive till then.
        self._stream_owner = stream
        self._alignment = int(alignment)
        self._nbytes = positive_size(nbytes)
        self._ptr = resource.allocate(self._nbytes, self._alignment, self._stream)
        self._resource = resource
        self._device = resource.device
        # Device memory is ready on the stream it was allocated on.
        self._ready_stream = None if resource.is_host else self._stream

    @property
    def resource(self) -> MemoryResource | None:
        return self._resource

    @property
    def stream(self) -> int:
        """The stream it was allocated on and is freed on (0: the legacy default)."""
        return self._stream

    _free_pending = False

    def _dlpack_released(self) -> None:
        super()._dlpack_released()
        if self._exports == 0 and self._free_pending and not exiting():
            self.free()

    def _live(self) -> bool:
        r = self._resource
        return r is not None and not r.closed

    def free(self) -> None:
        """Frees it now, in its stream's order; while tensors made from it
        through DLPack live, once the last of them goes. Other views made of
        it (memoryview, ``__array_interface__``, ``__cuda_array_interface__``)
        must not be used afterwards. Idempotent; nothing happens once its
        resource is closed."""
        if self._exports > 0:
            self._free_pending = True
            return
        r, self._resource = self._resource, None
        if r is not None and not r.closed and self._ptr:
            r.deallocate(self._ptr, self._nbytes, self._alignment, self._stream)

    def __enter__(self) -> "Allocation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __del__(self) -> None:
        r = getattr(self, "_resource", None)
        if r is None or exiting():
            return
        self._resource = None
        handle = r._handle
        if handle and self._ptr:
            r._deallocate(handle, self._ptr, self._nbytes, self._alignment, self._stream or None)

    def __repr__(self) -> str:
        return (
            f"<rmmd.{type(self).__name__} ptr=0x{self._ptr:x} nbytes={self._nbytes} "
            f"device={self._device}{'' if self._live() else ' freed'}>"
        )


class HostAllocation(Allocation):
    """Host memory: ``numpy.asarray(a)``, ``numpy.frombuffer(a.memoryview())``
    and ``numpy.from_dlpack(a)`` see its bytes without a copy."""


class DeviceAllocation(Allocation):
    """Device memory: ``torch.as_tensor(a, device="cuda")``,
    ``cupy.asarray(a)`` (``__cuda_array_interface__``), ``torch.from_dlpack(a)``
    and ``cupy.from_dlpack(a)`` see its bytes without a copy."""
