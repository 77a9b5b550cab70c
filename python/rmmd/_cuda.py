"""The few CUDA runtime calls the package makes itself (ordering a consumer's
stream after a buffer's stream; pinned staging memory, a stream and events
for copies from files to device buffers), through the libcudart that
librmmd_c.so already loaded into the process: no CUDA Python package
needed."""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_void_p
from typing import Iterator

from . import _lib
from ._errors import InternalError

_lock = threading.Lock()
_cudart: ctypes.CDLL | None = None

_EVENT_DISABLE_TIMING = 0x02
_STREAM_NON_BLOCKING = 0x01
_MEMCPY_HOST_TO_DEVICE = 1


def _find() -> ctypes.CDLL:
    global _cudart
    if _cudart is not None:
        return _cudart
    with _lock:
        if _cudart is not None:
            return _cudart
        _lib.load()
        path = None
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6 and "/libcudart.so" in parts[5]:
                    path = parts[5]
                    break
        if path is None:
            raise InternalError("rmmd: libcudart is not loaded in this process")
        lib = ctypes.CDLL(path)
        for name, restype, argtypes in (
            ("cudaEventCreateWithFlags", c_int, [POINTER(c_void_p), c_uint]),
            ("cudaEventRecord", c_int, [c_void_p, c_void_p]),
            ("cudaStreamWaitEvent", c_int, [c_void_p, c_void_p, c_uint]),
            ("cudaEventDestroy", c_int, [c_void_p]),
            ("cudaGetErrorName", c_char_p, [c_int]),
            ("cudaGetDevice", c_int, [POINTER(c_int)]),
            ("cudaSetDevice", c_int, [c_int]),
            ("cudaHostAlloc", c_int, [POINTER(c_void_p), c_size_t, c_uint]),
            ("cudaFreeHost", c_int, [c_void_p]),
            ("cudaMemcpyAsync", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_void_p]),
            ("cudaMemcpy2DAsync", c_int, [c_void_p, c_size_t, c_void_p, c_size_t, c_size_t, c_size_t, c_int,
                                          c_void_p]),
            ("cudaStreamCreateWithFlags", c_int, [POINTER(c_void_p), c_uint]),
            ("cudaStreamSynchronize", c_int, [c_void_p]),
            ("cudaStreamDestroy", c_int, [c_void_p]),
            ("cudaEventSynchronize", c_int, [c_void_p]),
        ):
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _cudart = lib
        return lib


def _check(lib: ctypes.CDLL, err: int, what: str) -> None:
    if err != 0:
        name = lib.cudaGetErrorName(err)
        raise InternalError(f"rmmd: {what} failed: {(name or b'?').decode()}")


def order_after(consumer: int, producer: int, device: int) -> None:
    """Makes work queued on stream `consumer` from now on wait for what is
    queued on stream `producer` so far, without blocking the host. Both are
    streams of CUDA device `device` (the memory's), which is made current
    meanwhile: an event must be recorded on a stream of its own device, and
    the default streams (handles 1 and 2) are the current device's."""
    if consumer == producer:
        return
    lib = _find()
    previous = c_int(-1)
    _check(lib, lib.cudaGetDevice(ctypes.byref(previous)), "cudaGetDevice")
    switch = previous.value != device
    if switch:
        _check(lib, lib.cudaSetDevice(device), "cudaSetDevice")
    try:
        event = c_void_p()
        _check(lib, lib.cudaEventCreateWithFlags(ctypes.byref(event), _EVENT_DISABLE_TIMING),
               "cudaEventCreateWithFlags")
        try:
            _check(lib, lib.cudaEventRecord(event, c_void_p(producer or None)), "cudaEventRecord")
            _check(lib, lib.cudaStreamWaitEvent(c_void_p(consumer or None), event, 0),
                   "cudaStreamWaitEvent")
        finally:
            lib.cudaEventDestroy(event)
    finally:
        if switch:
            lib.cudaSetDevice(previous.value)


def device_count() -> int:
    """CUDA devices this process sees (0 where CUDA has none, or no driver)."""
    lib = _find()
    fn = lib.cudaGetDeviceCount
    fn.restype = c_int
    fn.argtypes = [POINTER(c_int)]
    n = c_int(0)
    return n.value if fn(ctypes.byref(n)) == 0 else 0


def current_device() -> int:
    lib = _find()
    device = c_int(-1)
    _check(lib, lib.cudaGetDevice(ctypes.byref(device)), "cudaGetDevice")
    return device.value


def set_device(device: int) -> None:
    lib = _find()
    _check(lib, lib.cudaSetDevice(device), f"cudaSetDevice({device})")


@contextmanager
def on_device(device: int) -> Iterator[None]:
    """Makes `device` the current CUDA device meanwhile."""
    lib = _find()
    previous = c_int(-1)
    _check(lib, lib.cudaGetDevice(ctypes.byref(previous)), "cudaGetDevice")
    switch = previous.value != device
    if switch:
        _check(lib, lib.cudaSetDevice(device), "cudaSetDevice")
    try:
        yield
    finally:
        if switch:
            lib.cudaSetDevice(previous.value)


_HOST_ALLOC_PORTABLE = 0x01


def host_alloc(nbytes: int, portable: bool = False) -> int:
    """`nbytes` of page-locked host memory (cudaHostAlloc; `portable`: for
    copies to every GPU, not only the current one's); free with free_host."""
    lib = _find()
    ptr = c_void_p()
    flags = _HOST_ALLOC_PORTABLE if portable else 0
    _check(lib, lib.cudaHostAlloc(ctypes.byref(ptr), nbytes, flags), f"cudaHostAlloc({nbytes})")
    return ptr.value or 0


def free_host(ptr: int) -> None:
    lib = _find()
    _check(lib, lib.cudaFreeHost(c_void_p(ptr)), "cudaFreeHost")


class CopyStream:
    """A non-blocking stream of the current device with `slots` events:
    host-to-device copies queued on it, each slot's event recorded after its
    copy, so that the host may wait for one slot's copy before refilling
    that slot's staging memory while the other's copy runs. Make it on the
    device it copies to; close() synchronises and destroys."""

    def __init__(self, slots: int) -> None:
        self._lib = _find()
        stream = c_void_p()
        _check(self._lib, self._lib.cudaStreamCreateWithFlags(ctypes.byref(stream), _STREAM_NON_BLOCKING),
               "cudaStreamCreateWithFlags")
        self._stream = stream
        self._events: list[c_void_p] = []
        self._pending = [False] * slots
        try:
            for _ in range(slots):
                event = c_void_p()
                _check(self._lib, self._lib.cudaEventCreateWithFlags(ctypes.byref(event), _EVENT_DISABLE_TIMING),
                       "cudaEventCreateWithFlags")
                self._events.append(event)
        except BaseException:
            self.close()
            raise

    def wait_slot(self, slot: int) -> None:
        """Blocks until the last copy from `slot` is done (its memory is free)."""
        if self._pending[slot]:
            _check(self._lib, self._lib.cudaEventSynchronize(self._events[slot]), "cudaEventSynchronize")
            self._pending[slot] = False

    def copy_to_device(self, dst: int, src: int, nbytes: int, slot: int) -> None:
        """Queues a copy of `nbytes` from host `src` to device `dst`, then
        slot's event."""
        _check(self._lib, self._lib.cudaMemcpyAsync(c_void_p(dst), c_void_p(src), nbytes,
                                                    _MEMCPY_HOST_TO_DEVICE, self._stream), "cudaMemcpyAsync")
        _check(self._lib, self._lib.cudaEventRecord(self._events[slot], self._stream), "cudaEventRecord")
        self._pending[slot] = True

    def synchronize(self) -> None:
        _check(self._lib, self._lib.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        self._pending = [False] * len(self._pending)

    def close(self) -> None:
        if self._stream is None:
            return
        self._lib.cudaStreamSynchronize(self._stream)
        for event in self._events:
            self._lib.cudaEventDestroy(event)
        self._events = []
        self._lib.cudaStreamDestroy(self._stream)
        self._stream = None  # type: ignore[assignment]


class DeviceStream:
    """A non-blocking stream of one device, for copies from pinned host
    memory, with an event to mark what was queued so far. Every call makes
    the stream's device current on the calling thread first (a thread may
    feed several devices)."""

    def __init__(self, device: int) -> None:
        self._lib = _find()
        self.device = device
        _check(self._lib, self._lib.cudaSetDevice(device), f"cudaSetDevice({device})")
        stream = c_void_p()
        _check(self._lib, self._lib.cudaStreamCreateWithFlags(ctypes.byref(stream), _STREAM_NON_BLOCKING),
               "cudaStreamCreateWithFlags")
        self._stream: c_void_p | None = stream

    def copy(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
        """Queues `height` rows of `width` bytes from host `src` (rows
        `spitch` apart) to device `dst` (rows `dpitch` apart)."""
        lib = self._lib
        _check(lib, lib.cudaSetDevice(self.device), "cudaSetDevice")
        if height == 1:
            err = lib.cudaMemcpyAsync(c_void_p(dst), c_void_p(src), width, _MEMCPY_HOST_TO_DEVICE, self._stream)
            _check(lib, err, "cudaMemcpyAsync")
        else:
            err = lib.cudaMemcpy2DAsync(c_void_p(dst), dpitch, c_void_p(src), spitch, width, height,
                                        _MEMCPY_HOST_TO_DEVICE, self._stream)
            _check(lib, err, "cudaMemcpy2DAsync")

    def mark(self) -> c_void_p:
        """An event recorded after what is queued so far (wait with
        :func:`wait_event`, which destroys it)."""
        lib = self._lib
        _check(lib, lib.cudaSetDevice(self.device), "cudaSetDevice")
        event = c_void_p()
        _check(lib, lib.cudaEventCreateWithFlags(ctypes.byref(event), _EVENT_DISABLE_TIMING),
               "cudaEventCreateWithFlags")
        try:
            _check(lib, lib.cudaEventRecord(event, self._stream), "cudaEventRecord")
        except BaseException:
            lib.cudaEventDestroy(event)
            raise
        return event

    def synchronize(self) -> None:
        _check(self._lib, self._lib.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def close(self) -> None:
        if self._stream is None:
            return
        self._lib.cudaStreamSynchronize(self._stream)
        self._lib.cudaStreamDestroy(self._stream)
        self._stream = None


def wait_event(event: c_void_p) -> None:
    """Blocks until `event` (from DeviceStream.mark) completed; destroys it."""
    lib = _find()
    try:
        _check(lib, lib.cudaEventSynchronize(event), "cudaEventSynchronize")
    finally:
        lib.cudaEventDestroy(event)
