"""Host resources and allocations, seen through NumPy without a copy."""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest
from conftest import Daemon

import rmmd
from rmmd import _dlpack


def in_use(daemon: Daemon) -> int:
    return daemon.pool_in_use("host")


def test_allocate_and_deallocate_raw_pointers(session: rmmd.Session, daemon: Daemon) -> None:
    r = session.host_resource()
    assert r.is_host and r.device == -1
    p = r.allocate(1 << 20, alignment=4096)
    assert p % 4096 == 0
    ctypes.memset(p, 0xAB, 1 << 20)  # writable host memory
    assert ctypes.string_at(p + 1000, 2) == b"\xab\xab"
    assert r.stats() == rmmd.ResourceStats(
        allocated_bytes=1 << 20, allocation_count=1, high_water_bytes=1 << 20, total_allocations=1, device=-1
    )
    assert in_use(daemon) >= 1 << 20
    assert session.session_stats()["bytes"] >= 1 << 20
    r.deallocate(p, 1 << 20, alignment=4096)
    assert r.stats().allocated_bytes == 0 and r.stats().high_water_bytes == 1 << 20
    assert in_use(daemon) == 0
    assert r.allocate(0) == 0  # as RMM's resources: no memory, no request
    r.deallocate(0, 0)


def test_numpy_sees_an_allocation_without_a_copy(session: rmmd.Session) -> None:
    a = session.host_resource().allocation(4096)
    assert isinstance(a, rmmd.HostAllocation) and len(a) == 4096
    arr = np.asarray(a)  # __array_interface__ (or the buffer protocol, 3.12+)
    assert arr.dtype == np.uint8 and arr.shape == (4096,)
    assert arr.ctypes.data == a.ptr
    arr[:8] = np.arange(8)
    assert ctypes.string_at(a.ptr, 8) == bytes(range(8))
    view = np.frombuffer(a.memoryview(), dtype=np.uint32)
    assert view.ctypes.data == a.ptr and view[0] == 0x03020100
    if sys.version_info >= (3, 12):
        assert memoryview(a).nbytes == 4096  # PEP 688
    dl = np.from_dlpack(a)
    assert dl.ctypes.data == a.ptr and list(dl[:3]) == [0, 1, 2]
    assert not hasattr(a, "__cuda_array_interface__")
    assert a.__dlpack_device__() == (_dlpack.kDLCPU, 0)


def test_views_keep_an_allocation_alive(session: rmmd.Session, daemon: Daemon) -> None:
    r = session.host_resource()
    a = r.allocation(1 << 20)
    arr = np.asarray(a)
    mv = np.frombuffer(a.memoryview(), dtype=np.uint8)
    dl = np.from_dlpack(a)
    arr[:] = 7
    del a
    gc.collect()
    assert r.stats().allocation_count == 1  # the views hold it
    assert int(mv.sum()) == 7 << 20 and dl[5] == 7
    del arr, mv
    gc.collect()
    assert r.stats().allocation_count == 1  # the DLPack view still does
    del dl
    gc.collect()
    assert r.stats().allocation_count == 0
    assert in_use(daemon) == 0


def test_free_waits_for_dlpack_tensors(session: rmmd.Session) -> None:
    r = session.host_resource()
    a = r.allocation(4096)
    dl = np.from_dlpack(a)
    a.free()
    assert r.stats().allocation_count == 1  # freed when the tensor goes
    del dl
    gc.collect()
    assert r.stats().allocation_count == 0
    with pytest.raises(rmmd.InvalidArgumentError, match="freed"):
        np.asarray(a)


def test_allocations_free_themselves(session: rmmd.Session, daemon: Daemon) -> None:
    r = session.host_resource()
    with r.allocation(8192) as a:
        assert r.stats().allocation_count == 1
    assert r.stats().allocation_count == 0
    a.free()  # idempotent
    b = r.allocation(8192)
    del b
    gc.collect()
    assert r.stats().allocation_count == 0 and in_use(daemon) == 0


def test_closing_a_resource_gives_back_what_it_held(session: rmmd.Session, daemon: Daemon) -> None:
    r = session.host_resource()
    a = r.allocation(1 << 20)
    assert in_use(daemon) >= 1 << 20
    r.close()
    assert in_use(daemon) == 0
    a.free()  # nothing left to free: no error
    with pytest.raises(rmmd.InvalidArgumentError, match="closed"):
        r.allocate(10)


def test_a_dlpack_capsule_nobody_took_lets_go(session: rmmd.Session) -> None:
    r = session.host_resource()
    a = r.allocation(64)
    before = _dlpack.live_exports()
    capsule = a.__dlpack__()
    versioned = a.__dlpack__(max_version=(1, 0))
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    assert name(capsule) == b"dltensor" and name(versioned) == b"dltensor_versioned"
    assert _dlpack.live_exports() == before + 2
    del capsule, versioned
    gc.collect()
    assert _dlpack.live_exports() == before
    with pytest.raises(BufferError, match="does not copy"):
        a.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(2, 0))
    a.free()


def test_stream_objects_are_accepted(session: rmmd.Session) -> None:
    class TorchLike:
        cuda_stream = 0

    class CupyLike:
        ptr = 0

    class CudaCoreLike:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 0)

    r = session.host_resource()
    for s in (None, 0, TorchLike(), CupyLike(), CudaCoreLike()):
        r.deallocate(r.allocate(256, stream=s), 256, stream=s)
    with pytest.raises(rmmd.InvalidArgumentError, match="not a CUDA stream"):
        r.allocate(256, stream="default")
