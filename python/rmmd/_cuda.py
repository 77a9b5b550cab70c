"""The few CUDA runtime calls the package makes itself (ordering a consumer's
stream after a buffer's stream), through the libcudart that librmmd_c.so
already loaded into the process: no CUDA Python package needed."""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, c_char_p, c_int, c_uint, c_void_p

from . import _lib
from ._errors import InternalError

_lock = threading.Lock()
_cudart: ctypes.CDLL | None = None

_EVENT_DISABLE_TIMING = 0x02


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
