"""The synthetic weight set of bench/python/weights_bench.py: its layout
(names, shapes, offsets), its values, its labels, and the same tensors as a
.safetensors file on local disk with the page cache under control. No GPU,
no framework: the bench's driver and its workers both use it."""

from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
COLS = 4096  # the inner dimension of every 2-D tensor; 1-D tensors (norms) have this many elements
ITEMSIZE = 2  # bf16
ALIGN = 256
MODEL_LABEL = "rmmd-bench-synthetic"
SAMPLED = 5  # tensors whose values a worker checks after its timed span
# The tensors of one block, as in a Llama-style model; the norms are 1-D.
SLOTS = [
    ("input_layernorm.weight", 1),
    ("self_attn.q_proj.weight", 2),
    ("self_attn.k_proj.weight", 2),
    ("self_attn.v_proj.weight", 2),
    ("self_attn.o_proj.weight", 2),
    ("post_attention_layernorm.weight", 1),
    ("mlp.up_proj.weight", 2),
    ("mlp.down_proj.weight", 2),
]


# ---- the weight set ---------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    offset: int  # bytes from the buffer's (and the file's data's) start

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE


@dataclass(frozen=True)
class Layout:
    """N bf16 tensors totalling about S bytes, laid out back to back (every
    size is a multiple of 8 KiB, so each offset is aligned)."""

    tensors: tuple[Tensor, ...]
    nbytes: int

    @staticmethod
    def make(target_bytes: int, count: int) -> "Layout":
        kinds = [SLOTS[i % len(SLOTS)] for i in range(count)]
        small = sum(1 for _, dims in kinds if dims == 1)
        large = count - small
        if large == 0:
            raise ValueError("a weight set needs at least 2 tensors")
        rows = (target_bytes - small * COLS * ITEMSIZE) // (large * COLS * ITEMSIZE)
        if rows < 1:
            raise ValueError(f"{target_bytes} bytes are too few for {count} tensors of {COLS} columns")
        tensors, offset = [], 0
        for i, (slot, dims) in enumerate(kinds):
            shape = (COLS,) if dims == 1 else (rows, COLS)
            t = Tensor(f"model.layers.{i // len(SLOTS)}.{slot}", shape, offset)
            tensors.append(t)
            offset += (t.nbytes + ALIGN - 1) // ALIGN * ALIGN
        return Layout(tuple(tensors), offset)


def fill_value(index: int) -> float:
    """Tensor `index`'s value: exact in bf16 (at most 8 significant bits)."""
    return ((index % 251) + 1) / 8


def bf16_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0] >> 16


def sampled(count: int) -> list[int]:
    return sorted({0, 1, count // 2, count - 2, count - 1} & set(range(count)))[:SAMPLED]


def labels_for(layout: Layout) -> dict[str, str]:
    return {"model": MODEL_LABEL, "revision": f"{len(layout.tensors)}-tensors-{layout.nbytes}-bytes"}


def buffer_name(layout: Layout) -> str:
    return f"bench/weights/{layout.nbytes}"


# ---- the file ---------------------------------------------------------------


def write_safetensors(path: Path, layout: Layout, labels: dict[str, str]) -> float:
    """Writes `layout` with its values as a .safetensors file (the format's
    documented layout: an 8-byte little-endian header length, the JSON
    header padded with spaces to 8 bytes, the data; offsets relative to the
    data's start, tensors back to back). Returns the seconds it took,
    fsync included."""
    header: dict[str, Any] = {"__metadata__": labels}
    data_offset = 0
    for t in layout.tensors:
        header[t.name] = {"dtype": "BF16", "shape": list(t.shape),
                          "data_offsets": [data_offset, data_offset + t.nbytes]}
        data_offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    chunk = 64 << 20
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for i, t in enumerate(layout.tensors):
            pattern = struct.pack("<H", bf16_bits(fill_value(i))) * (min(t.nbytes, chunk) // ITEMSIZE)
            left = t.nbytes
            while left:
                n = min(left, len(pattern))
                f.write(pattern[:n] if n < len(pattern) else pattern)
                left -= n
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_through(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        view = memoryview(bytearray(16 << 20))
        while f.readinto(view):
            pass


def cached_fraction(path: Path) -> float | None:
    """The fraction of `path`'s pages in the page cache (mincore), or None
    where it cannot be asked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        size = path.stat().st_size
        page = mmap.PAGESIZE
        pages = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = ctypes.create_string_buffer(pages)
                if libc.mincore(addr, size, vec) != 0:
                    return None
                return sum(b & 1 for b in vec.raw) / pages
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        return None


def read_safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def filesystem_of(path: Path) -> str:
    best, fstype = "", "?"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1].rstrip("/") + "/") and len(parts[1]) > len(best):
                best, fstype = parts[1], parts[2]
    return fstype
