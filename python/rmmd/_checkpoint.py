"""A safetensors checkpoint (a Hugging Face model directory, or one file) as
rmmd reads it: its shards and their headers, the labels it carries, and the
plan of a publish: what each buffer holds (its manifest) and which reads of
the files fill which bytes of which buffer.

Directory layout (as ``transformers`` writes it): ``model.safetensors.index.json``
(``{"metadata": {...}, "weight_map": {tensor: file}}``) and the shards it
names, or a single ``model.safetensors``; ``config.json`` beside them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ._errors import InvalidArgumentError
from ._manifest import ITEMSIZE, TensorEntry
from ._st_header import FileTensor, Header, label_may_hold, read_header
from .tp import Plan

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
ALIGNMENT = 256
# Labels this module writes stay under the daemon's bound (256), leaving
# room for the daemon's own (rmmd.gpu_uuid, ...).
_LABEL_BUDGET = 200


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's files and what they say."""

    path: str
    """The directory (or the file, for a single file)."""
    files: tuple[str, ...]
    """The shards' paths, in the index's order (sorted by name)."""
    headers: tuple[Header, ...]
    config: Mapping[str, Any] | None
    labels: Mapping[str, str]
    """What the checkpoint says of itself, as labels: its files' metadata,
    ``config.*`` (config.json's scalar entries and its sha256) and
    ``checkpoint.*`` (shards, bytes, the headers' sha256)."""

    @property
    def data_bytes(self) -> int:
        return sum(h.file_size - h.data_start for h in self.headers)


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Reads the headers of the checkpoint at `path` (a directory or one
    ``.safetensors`` file) and checks that they agree with its index.

    Raises:
        InvalidArgumentError: no checkpoint there (the message says what was
            looked for), an index that names missing files or tensors the
            shards do not hold (or the reverse), a tensor in two shards, a
            malformed header or config.json.
        OSError: a file cannot be read.
    """
    path = os.fspath(path)
    index: dict[str, Any] | None = None
    index_raw = b""
    if os.path.isdir(path):
        directory = path
        index_path = os.path.join(path, INDEX_FILE)
        if os.path.exists(index_path):
            with open(index_path, "rb") as f:
                index_raw = f.read()
            index = _parse_index(index_path, index_raw)
            names = sorted(set(index["weight_map"].values()))
        elif os.path.exists(os.path.join(path, SINGLE_FILE)):
            names = [SINGLE_FILE]
        else:
            found = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
            if len(found) != 1:
                raise InvalidArgumentError(
                    f"rmmd: {path} has no {INDEX_FILE} or {SINGLE_FILE}, and "
                    + (f"{len(found)} .safetensors files ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}): "
                       "give the file, or write an index" if found else "no .safetensors file")
                )
            names = found
        files = [os.path.join(path, n) for n in names]
    elif os.path.isfile(path):
        directory = os.path.dirname(path) or "."
        files = [path]
    else:
        raise InvalidArgumentError(f"rmmd: {path}: no such file or directory")
    for f in files:
        if not os.path.isfile(f):
            raise InvalidArgumentError(f"rmmd: {path}: the index names {os.path.basename(f)}, which is not there")
    headers = [read_header(f) for f in files]
    _check_tensors(path, files, headers, index)
    config, config_raw = _read_config(directory) if os.path.isdir(path) else (None, b"")
    labels = _labels(path, files, headers, index_raw, config, config_raw)
    return Checkpoint(path, tuple(files), tuple(headers), config, labels)


def _parse_index(index_path: str, raw: bytes) -> dict[str, Any]:
    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidArgumentError(f"rmmd: {index_path} is not JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
        isinstance(v, str) and v and os.path.basename(v) == v for v in weight_map.values()
    ):
        raise InvalidArgumentError(
            f"rmmd: {index_path} has no weight_map of tensor names to file names in the directory"
        )
    return index


def _check_tensors(path: str, files: Sequence[str], headers: Sequence[Header], index: Mapping[str, Any] | None) -> None:
    where: dict[str, str] = {}
    for f, h in zip(files, headers):
        base = os.path.basename(f)
        for t in h.tensors:
            if t.name in where:
                raise InvalidArgumentError(f"rmmd: {path}: tensor '{t.name}' is in both {where[t.name]} and {base}")
            where[t.name] = base
    if not where:
        raise InvalidArgumentError(f"rmmd: {path} holds no tensors: nothing to publish")
    if index is None:
        return
    weight_map: Mapping[str, str] = index["weight_map"]
    for name, base in sorted(weight_map.items()):
        if name not in where:
            raise InvalidArgumentError(f"rmmd: {path}: the index puts tensor '{name}' in {base}, which lacks it")
        if where[name] != base:
            raise InvalidArgumentError(
                f"rmmd: {path}: the index puts tensor '{name}' in {base}, but it is in {where[name]}"
            )
    extra = sorted(set(where) - set(weight_map))
    if extra:
        raise InvalidArgumentError(
            f"rmmd: {path}: {where[extra[0]]} holds tensor '{extra[0]}', which the index does not name"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
        )


def _read_config(directory: str) -> tuple[dict[str, Any] | None, bytes]:
    config_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(config_path):
        return None, b""
    with open(config_path, "rb") as f:
        raw = f.read()
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidArgumentError(f"rmmd: {config_path} is not JSON ({e})") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"rmmd: {config_path} is not a JSON object")
    return config, raw


def _labels(
    path: str,
    files: Sequence[str],
    headers: Sequence[Header],
    index_raw: bytes,
    config: Mapping[str, Any] | None,
    config_raw: bytes,
) -> dict[str, str]:
    digest = hashlib.sha256(index_raw)
    for f, h in zip(files, headers):
        digest.update(os.path.basename(f).encode() + b"\0" + h.sha256.encode())
    out = {
        "checkpoint.shards": str(len(files)),
        "checkpoint.bytes": str(sum(h.file_size - h.data_start for h in headers)),
        "checkpoint.sha256": digest.hexdigest(),
    }
    # A Hugging Face cache snapshot (.../snapshots/<commit>/) names its revision.
    real = os.path.realpath(path if os.path.isdir(path) else os.path.dirname(path) or ".")
    if os.path.basename(os.path.dirname(real)) == "snapshots":
        out["revision"] = os.path.basename(real)
    if config is not None:
        out["config.sha256"] = hashlib.sha256(config_raw).hexdigest()
        for k in sorted(config):
            v = config[k]
            if isinstance(v, list) and all(isinstance(x, str) for x in v):
                text = ",".join(v)
            elif isinstance(v, str):
                text = v
            elif v is None or isinstance(v, (bool, int, float)):
                text = json.dumps(v)
            else:
                continue  # nested: in config.sha256 only
            if len(out) < _LABEL_BUDGET and label_may_hold(f"config.{k}", text):
                out[f"config.{k}"] = text
    for h in headers:
        for k in sorted(h.metadata):
            v = h.metadata[k]
            if len(out) < _LABEL_BUDGET and k not in out and label_may_hold(k, v):
                out[k] = v
    return out


# ---- the plan of a publish ----------------------------------------------------


@dataclass
class Copy:
    """Bytes of one read going to one buffer: `height` rows of `width`
    bytes, row i from ``src + i * spitch`` of the read to ``dst + i *
    dpitch`` of the buffer (one row: a plain copy)."""

    target: int
    dst: int
    src: int
    width: int
    height: int = 1
    spitch: int = 0
    dpitch: int = 0


@dataclass
class Read:
    """One read: bytes [src, src + nbytes) of file `shard`, and where they go."""

    shard: int
    src: int
    nbytes: int
    copies: list[Copy] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """One buffer of a publish: rank `rank`'s tensors."""

    rank: int
    entries: tuple[TensorEntry, ...]
    nbytes: int


def _align(n: int, to: int = ALIGNMENT) -> int:
    return (n + to - 1) // to * to


def plan_buffers(
    ckpt: Checkpoint, tp: int, plan: Plan | None, keep_layout: bool = True
) -> tuple[list[Target], dict[tuple[int, str], int]]:
    """Each rank's manifest and size, and where each tensor goes in it
    ((rank, name) -> byte offset). A shard keeps its file's layout in a
    rank's buffer where nothing of it is split and every offset suits its
    dtype (and `keep_layout`); elsewhere each tensor starts at a multiple of
    256 bytes."""
    targets: list[Target] = []
    where: dict[tuple[int, str], int] = {}
    for rank in range(tp):
        entries: list[TensorEntry] = []
        cursor = 0
        for h in ckpt.headers:
            slices = {t.name: _slice(plan, t, rank, tp) for t in h.tensors}
            keep = keep_layout and all(s.dim is None for s in slices.values()) and all(
                t.begin % ITEMSIZE[t.dtype] == 0 for t in h.tensors if t.end > t.begin
            )
            base = _align(cursor)
            for t in h.tensors:
                shape = slices[t.name].shape
                nbytes = ITEMSIZE[t.dtype] * _numel(shape)
                if nbytes == 0:  # no bytes, so no place of its own: offset 0
                    entries.append(TensorEntry(t.name, t.dtype, shape, 0))
                    continue
                offset = base + t.begin if keep else _align(cursor)
                entries.append(TensorEntry(t.name, t.dtype, shape, offset))
                where[(rank, t.name)] = offset
                cursor = offset + nbytes
        targets.append(Target(rank, tuple(entries), max(_align(cursor), ALIGNMENT)))
    return targets, where


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _slice(plan: Plan | None, t: FileTensor, rank: int, tp: int) -> Any:
    if plan is None or tp == 1:
        return Plan([]).slice_of(t.name, t.shape, 0, 1)
    return plan.slice_of(t.name, t.shape, rank, tp)


def plan_reads(
    ckpt: Checkpoint,
    ranks: Sequence[int],
    tp: int,
    plan: Plan | None,
    where: Mapping[tuple[int, str], int],
    chunk: int,
) -> list[Read]:
    """The reads that fill buffers whose ranks are `ranks` (buffer i holds
    rank ranks[i]), each at most `chunk` bytes, in file order: each tensor
    read once, whatever number of buffers it goes to; consecutive tensors of
    a file in one read where they fit."""
    reads: list[Read] = []
    for s, h in enumerate(ckpt.headers):
        for t in h.tensors:
            if t.end == t.begin:
                continue
            for src, nbytes, copies in _pieces(t, ranks, tp, plan, where, chunk):
                _add(reads, Read(s, h.data_start + src, nbytes, copies), chunk)
    return reads


def _pieces(
    t: FileTensor, ranks: Sequence[int], tp: int, plan: Plan | None, where: Mapping[tuple[int, str], int], chunk: int
) -> list[tuple[int, int, list[Copy]]]:
    """Tensor `t` as reads of at most `chunk` bytes (offsets in the data)
    and the copies each feeds."""
    n = t.end - t.begin
    sl = _slice(plan, t, 0, tp)
    out: list[tuple[int, int, list[Copy]]] = []
    if sl.dim is None:
        for a in range(0, n, chunk):
            m = min(chunk, n - a)
            out.append((t.begin + a, m, [Copy(i, where[(r, t.name)] + a, 0, m) for i, r in enumerate(ranks)]))
        return out
    # Split along dim d: the tensor is `outer` rows of `row` bytes, each row
    # tp pieces of `piece` bytes, rank r's the r-th of every row.
    d = sl.dim
    outer = _numel(t.shape[:d])
    row = n // outer
    piece = row // tp
    if row <= chunk:
        per_read = max(1, chunk // row)
        for a in range(0, outer, per_read):
            h = min(per_read, outer - a)
            copies = [
                Copy(i, where[(r, t.name)] + a * piece, r * piece, piece, h, row, piece) for i, r in enumerate(ranks)
            ]
            out.append((t.begin + a * row, h * row, copies))
        return out
    for a in range(outer):
        for r in range(tp):
            base = a * row + r * piece
            for b in range(0, piece, chunk):
                m = min(chunk, piece - b)
                copies = [Copy(i, where[(rr, t.name)] + a * piece + b, 0, m) for i, rr in enumerate(ranks) if rr == r]
                if copies:
                    out.append((t.begin + base + b, m, copies))
    return out


def _add(reads: list[Read], new: Read, chunk: int) -> None:
    """Appends `new`, or joins it to the last read where it follows it in
    the same file and the two fit in `chunk`; a plain copy that continues
    the last one's to the same buffer is made one with it."""
    last = reads[-1] if reads else None
    if last is None or last.shard != new.shard or last.src + last.nbytes != new.src or last.nbytes + new.nbytes > chunk:
        reads.append(new)
        return
    shift = last.nbytes
    last.nbytes += new.nbytes
    for c in new.copies:
        c.src += shift
        prev = next((p for p in reversed(last.copies) if p.target == c.target), None)
        if (
            prev is not None
            and prev.height == 1
            and c.height == 1
            and prev.dst + prev.width == c.dst
            and prev.src + prev.width == c.src
        ):
            prev.width += c.width
        else:
            last.copies.append(c)
