"""Reads of safetensors files into shared buffers, in parallel: the engine
behind rmmd.safetensors.publish_file and publish_dir.

`readers` threads each own `slots` slots of staging memory; a thread takes
the next read of the plan (reads are at most `chunk` bytes, in file order,
so the threads read neighbouring ranges of a file at once: the storage sees
several large requests in flight), fills a slot with it, queues the slot's
copies to every buffer it feeds, and goes on with its other slot while
those run; it refills a slot once the copies out of it are done (an event
per device). So up to readers x slots reads are in flight, each thread has a
stream per GPU, and all GPUs copy at once.

Staging memory for device buffers is page-locked (cudaHostAlloc, portable:
every GPU copies from it at full speed); for host buffers it is ordinary
anonymous memory and the copies are memmoves. Reads bypass the page cache
(O_DIRECT, aligned to 4 KiB) where `io` is ``"direct"``, or ``"auto"`` and
less than half of a file is cached (mincore), and the file system allows
it; otherwise they go through the page cache.

The destinations may come as a future (publish_dir creates the buffers on
another thread meanwhile): the threads read into their slots at once and
wait for it only before their first copy, so a buffer's creation (tens of
GiB for the driver to make and map) overlaps the first reads.

Each thread releases the GIL in every read, copy call and wait, so Python
is not the limit: a read of 32 MiB is one preadv.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

from . import _cuda
from ._checkpoint import Read
from ._errors import InvalidArgumentError

IO_ALIGNMENT = 4096
IO_MODES = ("auto", "direct", "buffered")


@dataclass(frozen=True)
class Destination:
    """A buffer the reads fill: its address, and its CUDA device (``None``:
    host memory this process may write)."""

    ptr: int
    device: int | None


@dataclass
class ShardStats:
    path: str
    nbytes: int
    io: str = "buffered"
    """``"direct"`` (O_DIRECT) or ``"buffered"`` (through the page cache)."""
    cached: float | None = None
    """The fraction of the file in the page cache before the reads (mincore)."""
    started: float = 0.0
    finished: float = 0.0
    done_bytes: int = 0

    @property
    def seconds(self) -> float:
        return max(self.finished - self.started, 0.0)

    @property
    def gib_per_s(self) -> float:
        return self.nbytes / (1 << 30) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class LoadStats:
    """What a load did: bytes read from the files, time, per shard."""

    nbytes: int = 0
    seconds: float = 0.0
    readers: int = 0
    chunk_bytes: int = 0
    staging: str = ""
    shards: list[ShardStats] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds of each step besides the reads, where the caller and the load
    timed them: ``plan`` (headers read, buffers and reads planned),
    ``open`` (the files opened, their cached share asked), ``staging`` (the
    staging memory made and page-locked), ``create`` (the buffers made, on
    a thread of their own during the reads), ``wait`` (the longest a reader
    waited for them before its first copy), ``publish`` (manifests and
    publication after the reads)."""

    @property
    def gib_per_s(self) -> float:
        return self.nbytes / (1 << 30) / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "seconds": self.seconds,
            "gib_per_s": self.gib_per_s,
            "readers": self.readers,
            "chunk_bytes": self.chunk_bytes,
            "staging": self.staging,
            "phases": dict(self.phases),
            "shards": [
                {"path": s.path, "bytes": s.nbytes, "seconds": s.seconds, "gib_per_s": s.gib_per_s, "io": s.io,
                 "cached": s.cached}
                for s in self.shards
            ],
        }


Destinations = Union[Sequence[Destination], "Future[Sequence[Destination]]"]
"""The buffers reads fill, or a future of them (waited for before the
first copy; its exception is the load's)."""

Progress = Callable[[LoadStats, int], None]
"""Called (from a reader thread, one call at a time) after each read's
copies are queued, with the stats so far and the shard's index."""


def cached_fraction(fd: int, size: int) -> float | None:
    """The fraction of the file's pages in the page cache (mincore), or None
    where it cannot be asked."""
    if size == 0:
        return 1.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                return None
            return (pages - vec.raw[:pages].count(0)) / pages  # the low bit says resident; others are 0
        finally:
            libc.munmap(addr, size)
    except (OSError, AttributeError):
        return None


class _File:
    """A shard open for reading: through the page cache, and with O_DIRECT
    where that was chosen and the file system allows it."""

    def __init__(self, path: str, io: str, stats: ShardStats) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.size = os.fstat(self.fd).st_size
        self.direct_fd = -1
        stats.cached = cached_fraction(self.fd, self.size) if io == "auto" else None
        want_direct = io == "direct" or (io == "auto" and stats.cached is not None and stats.cached < 0.5)
        if want_direct and hasattr(os, "O_DIRECT"):
            try:
                self.direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
            except OSError:  # tmpfs and others refuse O_DIRECT: the page cache then
                self.direct_fd = -1
        self.stats = stats
        stats.io = "direct" if self.direct_fd >= 0 else "buffered"

    def read(self, slot: memoryview, src: int, nbytes: int) -> int:
        """Reads bytes [src, src + nbytes) into `slot`; returns where in the
        slot they start (O_DIRECT reads whole aligned blocks around them)."""
        if self.direct_fd >= 0:
            lo = src - src % IO_ALIGNMENT
            hi = -(-(src + nbytes) // IO_ALIGNMENT) * IO_ALIGNMENT
            try:
                got = self._read_direct(slot[: hi - lo], lo)
            except OSError:  # EINVAL: this file system after all
                self._stop_direct()
            else:
                if got >= src + nbytes - lo:
                    return src - lo
                raise InvalidArgumentError(f"rmmd: {self.path} ended early, at byte {lo + got}")
        _read_fully(self.fd, slot[:nbytes], src, self.path)
        return 0

    def _read_direct(self, view: memoryview, offset: int) -> int:
        done = 0
        while done < len(view):
            n = os.preadv(self.direct_fd, [view[done:]], offset + done)
            if n <= 0:
                break
            done += n
            if n % IO_ALIGNMENT:  # the end of the file
                break
        return done

    def _stop_direct(self) -> None:
        fd, self.direct_fd = self.direct_fd, -1
        if fd >= 0:
            os.close(fd)
            self.stats.io = "buffered"

    def close(self) -> None:
        fd, self.direct_fd = self.direct_fd, -1
        if fd >= 0:
            os.close(fd)
        os.close(self.fd)


def _read_fully(fd: int, view: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise InvalidArgumentError(f"rmmd: {path} ended early, at byte {offset + done}")
        done += n


class _Staging:
    """`count` slots of `slot_bytes`, 4 KiB aligned: page-locked where some
    destination is a GPU, else anonymous memory."""

    def __init__(self, count: int, slot_bytes: int, pinned: bool) -> None:
        self.slot_bytes = slot_bytes
        nbytes = count * slot_bytes
        self._host_ptr = 0
        self._map: mmap.mmap | None = None
        if pinned:
            self._host_ptr = _cuda.host_alloc(nbytes, portable=True)
            self.ptr = self._host_ptr
            self.source = "cudaHostAlloc"
        else:
            self._map = mmap.mmap(-1, nbytes)
            self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
            self.source = "anonymous memory"
        self._array = (ctypes.c_ubyte * nbytes).from_address(self.ptr)
        self.view = memoryview(self._array).cast("B")

    def slot(self, i: int) -> tuple[int, memoryview]:
        at = i * self.slot_bytes
        return self.ptr + at, self.view[at : at + self.slot_bytes]

    def close(self) -> None:
        self.view.release()
        del self._array
        if self._host_ptr:
            _cuda.free_host(self._host_ptr)
            self._host_ptr = 0
        if self._map is not None:
            self._map.close()
            self._map = None


def load(
    files: Sequence[str],
    reads: Sequence[Read],
    destinations: Destinations,
    *,
    chunk: int,
    readers: int,
    slots: int = 2,
    io: str = "auto",
    progress: Progress | None = None,
    to_devices: bool | None = None,
) -> LoadStats:
    """Does `reads` (planned with reads of at most `chunk` bytes) into
    `destinations`, with `readers` threads of `slots` slots each; returns
    once every copy is done. `to_devices`: whether some destination is a
    GPU's (page-locked staging), which a future of them must say.

    Raises:
        InvalidArgumentError: a bad `io`, or a file shorter than its header says.
        OSError: a file cannot be read.
        InternalError: a CUDA call failed (named).
    """
    if io not in IO_MODES:
        raise InvalidArgumentError(f"rmmd: io is {io!r}; give one of {', '.join(IO_MODES)}")
    readers = max(1, min(int(readers), len(reads) or 1))
    stats = LoadStats(readers=readers, chunk_bytes=chunk)
    stats.shards = [ShardStats(f, 0) for f in files]
    for r in reads:
        stats.shards[r.shard].nbytes += r.nbytes
    stats.nbytes = sum(s.nbytes for s in stats.shards)
    opened: list[_File] = []
    try:
        t0 = time.perf_counter()
        for f, s in zip(files, stats.shards):
            opened.append(_File(f, io, s))
        t1 = time.perf_counter()
        stats.phases["open"] = t1 - t0
        if to_devices is None:
            if isinstance(destinations, Future):
                raise InvalidArgumentError("rmmd: a future of destinations needs to_devices")
            to_devices = any(d.device is not None for d in destinations)
        staging = _Staging(readers * slots, chunk + 2 * IO_ALIGNMENT, to_devices)
        stats.staging = staging.source
        stats.phases["staging"] = time.perf_counter() - t1
        try:
            _run(opened, reads, destinations, to_devices, staging, readers, slots, stats, progress)
        finally:
            staging.close()
    finally:
        for f in opened:
            f.close()
    return stats


def _run(
    files: Sequence[_File],
    reads: Sequence[Read],
    destinations: Destinations,
    to_devices: bool,
    staging: _Staging,
    readers: int,
    slots: int,
    stats: LoadStats,
    progress: Progress | None,
) -> None:
    lock = threading.Lock()
    next_read = [0]
    failed: list[BaseException] = []
    caller_device = _current_device() if to_devices else None

    def targets() -> Sequence[Destination]:
        if not isinstance(destinations, Future):
            return destinations
        if destinations.done():
            return destinations.result()
        t = time.perf_counter()
        try:
            return destinations.result()
        finally:
            waited = time.perf_counter() - t
            with lock:
                stats.phases["wait"] = max(stats.phases.get("wait", 0.0), waited)

    def take() -> Read | None:
        with lock:
            if failed or next_read[0] >= len(reads):
                return None
            r = reads[next_read[0]]
            next_read[0] += 1
            shard = stats.shards[r.shard]
            if shard.started == 0.0:
                shard.started = time.perf_counter()
            return r

    def reader(index: int) -> None:
        streams: dict[int, _cuda.DeviceStream] = {}
        pending: list[list[Any]] = [[] for _ in range(slots)]  # per slot: events to wait for
        turn = 0
        try:
            while True:
                r = take()
                if r is None:
                    break
                slot = index * slots + turn
                for event in pending[turn]:
                    _cuda.wait_event(event)
                pending[turn] = []
                ptr, view = staging.slot(slot)
                base = files[r.shard].read(view, r.src, r.nbytes)
                pending[turn] = _copy(r, ptr + base, targets(), streams)
                turn = (turn + 1) % slots
                with lock:
                    shard = stats.shards[r.shard]
                    shard.done_bytes += r.nbytes
                    if shard.done_bytes == shard.nbytes:
                        shard.finished = time.perf_counter()
                    if progress is not None:
                        progress(stats, r.shard)
            for events in pending:
                for event in events:
                    _cuda.wait_event(event)
            for s in streams.values():
                s.synchronize()
        except BaseException as e:  # noqa: BLE001: handed to the caller
            with lock:
                failed.append(e)
        finally:
            for s in streams.values():
                s.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(i,), name=f"rmmd-reader-{i}", daemon=True) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats.seconds = time.perf_counter() - t0
    if caller_device is not None:
        _cuda.set_device(caller_device)
    if failed:
        raise failed[0]


def _copy(r: Read, src: int, destinations: Sequence[Destination], streams: dict[int, "_cuda.DeviceStream"]) -> list[Any]:
    """Queues (device) or does (host) the copies of read `r`, whose bytes
    are at `src`; returns the events marking the queued ones."""
    used: list[int] = []
    for c in r.copies:
        d = destinations[c.target]
        if d.device is None:
            if c.height == 1:
                ctypes.memmove(d.ptr + c.dst, src + c.src, c.width)
            else:
                for i in range(c.height):
                    ctypes.memmove(d.ptr + c.dst + i * c.dpitch, src + c.src + i * c.spitch, c.width)
            continue
        stream = streams.get(d.device)
        if stream is None:
            stream = streams[d.device] = _cuda.DeviceStream(d.device)
        stream.copy(d.ptr + c.dst, c.dpitch, src + c.src, c.spitch, c.width, c.height)
        if d.device not in used:
            used.append(d.device)
    return [streams[dev].mark() for dev in used]


def _current_device() -> int:
    return _cuda.current_device()
