"""The safetensors format's header, read and checked in pure Python (no
framework, no safetensors package needed; where that package is installed
its reader must agree).

The format (https://huggingface.co/docs/safetensors): 8 bytes, the header's
length N as a little-endian unsigned 64-bit integer; N bytes of a JSON
object mapping each tensor's name to ``{"dtype", "shape", "data_offsets":
[begin, end]}`` (offsets relative to the byte after the header) and an
optional ``"__metadata__"`` of strings; then the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from ._errors import InvalidArgumentError
from ._manifest import ITEMSIZE

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
LABEL_KEY = re.compile(r"[A-Za-z0-9._/:-]{1,128}")
MAX_LABELS = 256
MAX_LABEL_VALUE = 4096


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
    sha256: str = ""
    """The sha256 of the file's first `data_start` bytes (length and header):
    what tells one checkpoint's files from another's without reading the data."""


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
    digest = hashlib.sha256(prefix + raw).hexdigest()
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
    out = Header(tuple(tensors), dict(metadata), data_start, size, digest)
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



def label_may_hold(key: str, value: str) -> bool:
    """Whether the daemon takes `key` = `value` as a label set by a client
    (its key's characters and length, no ``rmmd.`` prefix, the value's length)."""
    return bool(LABEL_KEY.fullmatch(key)) and not key.startswith("rmmd.") and len(value.encode("utf-8")) <= MAX_LABEL_VALUE
