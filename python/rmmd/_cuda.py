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


def host_alloc(nbytes: int) -> int:
    """`nbytes` of page-locked host memory (cudaHostAlloc); free with free_host."""
    lib = _find()
    ptr = c_void_p()
    _check(lib, lib.cudaHostAlloc(ctypes.byref(ptr), nbytes, 0), f"cudaHostAlloc({nbytes})")
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
