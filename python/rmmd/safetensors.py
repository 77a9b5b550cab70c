"""A ``.safetensors`` file straight into a shared buffer: its header becomes
the buffer's manifest, its bytes go from the file through pinned staging
memory to the device in overlapping chunks, with no PyTorch (or any other
framework's) copy in between.

    buf = rmmd.safetensors.publish_file("model.safetensors", "gpt/weights",
                                        labels={"revision": "abc"})
    # any process: rmmd.torch.load_state_dict("gpt/weights"), or
    # rmmd.SharedBuffer.open(session, "gpt/weights").tensors()

The format (https://huggingface.co/docs/safetensors): 8 bytes, the header's
length N as a little-endian unsigned 64-bit integer; N bytes of a JSON
object mapping each tensor's name to ``{"dtype", "shape", "data_offsets":
[begin, end]}`` (offsets relative to the byte after the header) and an
optional ``"__metadata__"`` of strings; then the data. Where the
``safetensors`` package is installed its reader checks the file too.

The buffer keeps the file's layout (the data as it is, each tensor at its
offset) where every tensor's offset is a multiple of its element size, as
in files the safetensors package writes (it orders tensors by alignment);
otherwise (a file written in another order: a 3-byte bool tensor before a
float32 one) each tensor is placed at an offset aligned to 256 bytes. The file's ``__metadata__``
becomes labels where the key is one a label may have.

This module imports without PyTorch or the safetensors package.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from . import _cuda
from ._buffer import SharedBuffer
from ._errors import Error, InvalidArgumentError
from ._manifest import ITEMSIZE, TensorEntry
from ._session import Pool, Session

__all__ = ["publish_file", "read_header", "Header", "DTYPES"]

# safetensors' dtype names -> the manifest's
DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}

# The safetensors package's own bound on a header.
MAX_HEADER_BYTES = 100_000_000
ALIGNMENT = 256
_LABEL_KEY = re.compile(r"[A-Za-z0-9._/:-]{1,128}")
_MAX_LABELS = 256
_MAX_LABEL_VALUE = 4096


@dataclass(frozen=True)
class FileTensor:
    """One tensor as the file holds it: bytes [begin, end) of the data."""

    name: str
    dtype: str  # the manifest's name
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """What a safetensors file's header says."""

    tensors: tuple[FileTensor, ...]  # by offset in the data
    metadata: Mapping[str, str]
    data_start: int  # the file offset of the data (8 + header length)
    file_size: int


def read_header(path: str | os.PathLike[str]) -> Header:
    """Reads and checks the header of the safetensors file at `path`.

    Raises:
        InvalidArgumentError: not a safetensors file, or one whose header is
            malformed (the message says where).
        OSError: the file cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise InvalidArgumentError(f"rmmd: {path}: {size} bytes, too short for a safetensors file")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise InvalidArgumentError(
                f"rmmd: {path}: the header is said to be {n} bytes, in a file of {size} "
                "(not a safetensors file?)"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidArgumentError(f"rmmd: {path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise InvalidArgumentError(f"rmmd: {path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidArgumentError(f"rmmd: {path}: __metadata__ is not an object of strings")
    data_start = 8 + n
    data_bytes = size - data_start
    tensors = [_file_tensor(path, name, info, data_bytes) for name, info in header.items()]
    tensors.sort(key=lambda t: (t.begin, t.end))
    # The format: the data is the tensors' bytes, each after the other,
    # with no hole and nothing after the last.
    previous: FileTensor | None = None
    for t in tensors:
        end = previous.end if previous is not None else 0
        if t.begin < end:
            raise InvalidArgumentError(
                f"rmmd: {path}: tensors '{previous.name}' and '{t.name}' overlap in the data "  # type: ignore[union-attr]
                f"([{previous.begin}, {previous.end}) and [{t.begin}, {t.end}))"  # type: ignore[union-attr]
            )
        if t.begin > end:
            raise InvalidArgumentError(
                f"rmmd: {path}: the data has a hole: bytes [{end}, {t.begin}) before tensor '{t.name}' "
                "belong to no tensor"
            )
        previous = t
    end = previous.end if previous is not None else 0
    if end != data_bytes:
        raise InvalidArgumentError(
            f"rmmd: {path}: the data is {data_bytes} bytes, but its tensors end at byte {end}"
        )
    out = Header(tuple(tensors), dict(metadata), data_start, size)
    _check_with_package(path, out)
    return out


def _file_tensor(path: str, name: str, info: Any, data_bytes: int) -> FileTensor:
    if not isinstance(info, dict):
        raise InvalidArgumentError(f"rmmd: {path}: tensor '{name}' is not an object in the header")
    dtype = info.get("dtype")
    if dtype not in DTYPES:
        raise InvalidArgumentError(
            f"rmmd: {path}: tensor '{name}' has dtype {dtype!r}, which a buffer cannot hold "
            f"(it holds {', '.join(DTYPES)})"
        )
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidArgumentError(f"rmmd: {path}: tensor '{name}' has shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise InvalidArgumentError(f"rmmd: {path}: tensor '{name}' has data_offsets {offsets!r}")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    want = numel * ITEMSIZE[DTYPES[dtype]]
    if end - begin != want:
        raise InvalidArgumentError(
            f"rmmd: {path}: tensor '{name}' ({dtype}, shape {shape}) is {want} bytes, but its "
            f"data_offsets [{begin}, {end}) span {end - begin}"
        )
    if end > data_bytes:
        raise InvalidArgumentError(
            f"rmmd: {path}: tensor '{name}' ends at byte {end} of the data, which has {data_bytes}"
        )
    return FileTensor(name, DTYPES[dtype], tuple(shape), begin, end)


def _check_with_package(path: str, header: Header) -> None:
    """Where the safetensors package is installed, its reader must see the
    same tensors and metadata (it refuses files our reader might miss)."""
    try:
        from safetensors import safe_open
    except ImportError:
        return
    try:
        with safe_open(path, framework="numpy") as f:
            names = set(f.keys())
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors_rust.SafetensorError
        raise InvalidArgumentError(f"rmmd: {path}: the safetensors package refuses it: {e}") from None
    ours = {t.name for t in header.tensors}
    if names != ours or dict(metadata) != dict(header.metadata):
        raise InvalidArgumentError(
            f"rmmd: {path}: the safetensors package reads another header "
            f"({len(names)} tensors) than rmmd does ({len(ours)})"
        )


@dataclass(frozen=True)
class _Segment:
    """Bytes [src, src + nbytes) of the file go to [dst, dst + nbytes) of the buffer."""

    src: int
    dst: int
    nbytes: int


def _layout(header: Header) -> tuple[list[TensorEntry], list[_Segment], int]:
    """The manifest's entries, the copies to make and the buffer's size:
    the file's layout where every offset suits its dtype, else each tensor
    aligned to 256 bytes."""
    keep = all(t.begin % ITEMSIZE[t.dtype] == 0 for t in header.tensors if t.end > t.begin)
    entries: list[TensorEntry] = []
    segments: list[_Segment] = []
    offset = 0
    for t in header.tensors:
        n = t.end - t.begin
        if n == 0:  # no bytes, so no place of its own: offset 0
            entries.append(TensorEntry(t.name, t.dtype, t.shape, 0))
            continue
        if keep:
            offset = t.begin
        else:
            offset = (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        entries.append(TensorEntry(t.name, t.dtype, t.shape, offset))
        src = header.data_start + t.begin
        last = segments[-1] if segments else None
        if last is not None and last.src + last.nbytes == src and last.dst + last.nbytes == offset:
            segments[-1] = _Segment(last.src, last.dst, last.nbytes + n)
        else:
            segments.append(_Segment(src, offset, n))
        offset += n
    return entries, segments, max((offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT, ALIGNMENT)


def _labels(metadata: Mapping[str, str], labels: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's labels, then the file's metadata where a key is one a
    label may have, up to the daemon's bound on labels."""
    out = dict(labels or {})
    for k in sorted(metadata):
        if len(out) >= _MAX_LABELS:
            break
        v = metadata[k]
        if (
            k not in out
            and _LABEL_KEY.fullmatch(k)
            and not k.startswith("rmmd.")
            and len(v.encode("utf-8")) <= _MAX_LABEL_VALUE
        ):
            out[k] = v
    return out


def _read_fully(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise InvalidArgumentError(f"rmmd: the file ended early, at byte {offset + done}")
        done += n


def _chunks(segments: list[_Segment], chunk: int) -> Iterator[_Segment]:
    for s in segments:
        for start in range(0, s.nbytes, chunk):
            n = min(chunk, s.nbytes - start)
            yield _Segment(s.src + start, s.dst + start, n)


class _Staging:
    """Page-locked host memory to stage chunks in: from the session's
    pinnable host pool where it has one (rmmd's memory, counted as the
    session's), else from cudaHostAlloc."""

    def __init__(self, session: Session, nbytes: int) -> None:
        self._allocation: Any = None
        self._cuda_ptr = 0
        for pool in session.pools:
            if pool.is_host and pool.pinnable:
                try:
                    resource = session.host_resource(pool=pool, pinned=True)
                    self._allocation = resource.allocation(nbytes)
                    self._resource = resource
                    self.ptr = self._allocation.ptr
                    self.view = self._allocation.memoryview()
                    self.source = f"host pool '{pool.name}'"
                    return
                except Error:  # full, or not pinnable here: the CUDA runtime's then
                    self._allocation = None
        self._cuda_ptr = _cuda.host_alloc(nbytes)
        self.ptr = self._cuda_ptr
        self.view = memoryview((ctypes.c_ubyte * nbytes).from_address(self.ptr)).cast("B")
        self.source = "cudaHostAlloc"

    def close(self) -> None:
        self.view.release()
        if self._allocation is not None:
            self._allocation.free()
            self._resource.close()
            self._allocation = None
        if self._cuda_ptr:
            _cuda.free_host(self._cuda_ptr)
            self._cuda_ptr = 0


def _copy_to_host(buf: SharedBuffer, fd: int, segments: list[_Segment]) -> None:
    """A host buffer is the destination and readable memory itself: the file
    is read straight into it."""
    view = buf.memoryview()
    try:
        for s in segments:
            _read_fully(fd, view[s.dst : s.dst + s.nbytes], s.src)
    finally:
        view.release()


def _copy_to_device(buf: SharedBuffer, fd: int, segments: list[_Segment], chunk_bytes: int) -> str:
    """Reads chunk k+1 into one staging slot while chunk k's copy to the
    device runs from the other. Returns where the staging memory came from."""
    total = sum(s.nbytes for s in segments)
    chunk = min(chunk_bytes, max(total, 1))
    slots = 2 if total > chunk else 1
    staging = _Staging(buf.session, chunk * slots)
    try:
        with _cuda.on_device(buf.device):
            stream = _cuda.CopyStream(slots)
            try:
                slot = 0
                for c in _chunks(segments, chunk):
                    stream.wait_slot(slot)
                    at = slot * chunk
                    _read_fully(fd, staging.view[at : at + c.nbytes], c.src)
                    stream.copy_to_device(buf.ptr + c.dst, staging.ptr + at, c.nbytes, slot)
                    slot = (slot + 1) % slots
                stream.synchronize()
            finally:
                stream.close()
    finally:
        staging.close()
    return staging.source


def publish_file(
    path: str | os.PathLike[str],
    name: str,
    *,
    session: Session | None = None,
    labels: Mapping[str, str] | None = None,
    device: int | None = None,
    pool: str | Pool | None = None,
    persistent: bool = False,
    gid: int | None = None,
    chunk_bytes: int = 64 << 20,
) -> SharedBuffer:
    """Publishes the safetensors file at `path` as the shared buffer
    `name`: the header as the manifest (tensors, and ``__metadata__`` as
    labels), the data copied in through pinned staging memory in chunks of
    `chunk_bytes`, two at a time (one read from the file while the other is
    copied to the device). Returns the creator's hold.

    Args:
        session: the session to create it in; ``None``: a new one.
        labels: the manifest's labels, before the file's metadata.
        device: the GPU whose CUDA pool holds it; ``None``: the current one.
        pool: a pool by name instead (a host pool: the file is read straight
            into the buffer, no staging).
        persistent, gid: as :meth:`rmmd.SharedBuffer.create`.

    Raises:
        InvalidArgumentError: not a safetensors file, a malformed header, a
            dtype a buffer cannot hold; the daemon's refusals.
        OSError: the file cannot be read.
        AlreadyExistsError, OutOfMemoryError, PermissionError: as
            :meth:`rmmd.SharedBuffer.create`.
    """
    if int(chunk_bytes) <= 0:
        raise InvalidArgumentError(f"rmmd: chunk_bytes is {chunk_bytes}; give a positive size")
    header = read_header(path)
    if not header.tensors:
        raise InvalidArgumentError(f"rmmd: {os.fspath(path)} holds no tensors: nothing to publish")
    entries, segments, nbytes = _layout(header)
    s = session if session is not None else Session(client_name="rmmd.safetensors")
    buf = SharedBuffer.create(s, name, nbytes, pool=pool, device=device, persistent=persistent, gid=gid)
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if buf.is_host:
                _copy_to_host(buf, fd, segments)
            else:
                _copy_to_device(buf, fd, segments, int(chunk_bytes))
        finally:
            os.close(fd)
        buf.set_manifest(entries, _labels(header.metadata, labels))
        buf.publish()
    except BaseException:
        if persistent:
            SharedBuffer.delete(s, name)
        buf.close()
        raise
    return buf
