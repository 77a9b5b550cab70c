"""Safetensors checkpoints straight into shared buffers: a file, or a Hugging
Face model directory (``model.safetensors.index.json`` and its shards),
whole on one GPU or on several, or split into tensor-parallel ranks; the
headers become the buffers' manifests, the bytes go from the files through
staging memory to the devices with no framework in between.

    buf = rmmd.safetensors.publish_file("model.safetensors", "gpt/weights",
                                        labels={"revision": "abc"})
    model = rmmd.safetensors.publish_dir("Llama-3-8B/", "llama3", devices=[0, 1], tp=2,
                                         labels={"revision": "abc"}, persistent=True)
    # rank r, in any process:
    buf = rmmd.safetensors.open_rank(session, "llama3", rank=r, tp=2,
                                     plan=rmmd.tp.Plan.llama(), expect={"revision": "abc"})

The format (https://huggingface.co/docs/safetensors): 8 bytes of header
length, a JSON header (each tensor's dtype, shape and data offsets, and an
optional ``__metadata__`` of strings), then the data. Where the
``safetensors`` package is installed its reader checks each file too.

A buffer keeps a file's layout (the data as it is, each tensor at its
offset) where nothing of the file is split and every tensor's offset is a
multiple of its element size, as in files the safetensors package writes;
otherwise each tensor starts at a multiple of 256 bytes. The reads are
parallel, large and aligned (rmmd/_loader.py says how).

This module imports without PyTorch or the safetensors package.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from . import _cuda, _loader
from ._buffer import SharedBuffer
from ._checkpoint import Checkpoint, plan_buffers, plan_reads, read_checkpoint
from ._errors import InvalidArgumentError
from ._loader import Destination, LoadStats, Progress
from ._session import Pool, Session
from ._st_header import DTYPES, FileTensor, Header, read_header
from .tp import Plan

__all__ = [
    "publish_file",
    "publish_dir",
    "Published",
    "open_rank",
    "rank_expect",
    "buffer_names",
    "read_header",
    "read_checkpoint",
    "Header",
    "FileTensor",
    "Checkpoint",
    "LoadStats",
    "DTYPES",
]

DEFAULT_CHUNK_BYTES = 32 << 20


def default_readers() -> int:
    """Reader threads when none are asked for: 8, fewer on a machine with
    fewer than 4 CPUs (each thread mostly waits for the storage or the copy
    engine; 8 keeps a local NVMe or the page cache busy)."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def buffer_names(name: str, tp: int = 1, devices: Sequence[int | None] = (None,)) -> list[str]:
    """The buffers a publish of `name` makes: `name` itself for one buffer;
    ``name/rank<r>`` for each rank of a tensor-parallel publish (tp > 1);
    ``name/gpu<d>`` for each device of a replicated one (tp 1, several
    devices; d is the publisher's CUDA ordinal)."""
    if tp > 1:
        return [f"{name}/rank{r}" for r in range(tp)]
    if len(devices) > 1:
        return [f"{name}/gpu{d}" for d in devices]
    return [name]


def rank_expect(
    tp: int = 1, rank: int = 0, plan: Plan | None = None, labels: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The labels guard for rank `rank` of a `tp`-way publish with `plan`,
    plus `labels` (``{"revision": ...}``): what :func:`open_rank` expects.
    Give it as ``expect=`` to ``SharedBuffer.open``, ``rmmd.torch.attach``
    or ``load_state_dict``: a buffer of another split is refused before
    anything is opened."""
    out = dict(labels or {})
    if tp > 1:
        out.update({"tp.size": str(tp), "tp.rank": str(rank)})
        if plan is not None:
            out["tp.plan.sha256"] = plan.sha256
    return out


def open_rank(
    session: Session,
    name: str,
    rank: int = 0,
    tp: int = 1,
    plan: Plan | None = None,
    expect: Mapping[str, str] | None = None,
    wait: float = 0.0,
    device: int | None = None,
) -> SharedBuffer:
    """Opens rank `rank`'s buffer of the `tp`-way publish `name`
    (``name/rank<r>``; `name` itself for tp 1), read-only, refused
    (PreconditionError naming the label) unless it holds that rank's slices
    of `plan` and carries `expect`."""
    target = f"{name}/rank{rank}" if tp > 1 else name
    return SharedBuffer.open(session, target, wait=wait, expect=rank_expect(tp, rank, plan, expect), device=device)


@dataclass
class Published:
    """What :func:`publish_dir` made: the buffers (the creator's holds, in
    rank or device order), their devices, and what the load did.
    ``close()`` lets go of them (non-persistent ones go with it)."""

    name: str
    buffers: list[SharedBuffer]
    devices: list[int | None]
    ranks: list[int]
    stats: LoadStats
    labels: dict[str, str]

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.buffers]

    def __iter__(self) -> Iterator[SharedBuffer]:
        return iter(self.buffers)

    def __len__(self) -> int:
        return len(self.buffers)

    def close(self) -> None:
        for b in self.buffers:
            b.close()

    def __enter__(self) -> "Published":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def publish_dir(
    path: str | os.PathLike[str],
    name: str,
    *,
    session: Session | None = None,
    devices: Sequence[int] | None = None,
    tp: int = 1,
    plan: Plan | str | None = None,
    labels: Mapping[str, str] | None = None,
    pool: str | Pool | None = None,
    persistent: bool = False,
    gid: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    readers: int | None = None,
    io: str = "auto",
    keep_layout: bool = True,
    progress: Progress | None = None,
) -> Published:
    """Publishes the checkpoint at `path` (a model directory, or one
    ``.safetensors`` file) as one buffer per device (tp 1) or per rank.

    Each buffer's manifest holds its tensors (a rank's: its slices, with
    their shapes) and labels: `labels`, then what the checkpoint says of
    itself (its files' ``__metadata__``; ``config.<key>`` for config.json's
    scalar entries and ``config.sha256``; ``checkpoint.shards``,
    ``checkpoint.bytes``, ``checkpoint.sha256`` of the headers and index;
    ``revision`` for a Hugging Face cache snapshot), and for tp > 1
    ``tp.size``, ``tp.rank``, ``tp.plan`` (the plan's JSON where it fits),
    ``tp.plan.name`` and ``tp.plan.sha256``.

    Args:
        devices: the GPUs (this process's ordinals); tp > 1: one per rank,
            rank r on devices[r] (default ``range(tp)``); tp 1: a whole copy
            on each (default: the current device). Buffers are named as
            :func:`buffer_names` says.
        tp, plan: ranks, and the :class:`rmmd.tp.Plan` (or a plan's name,
            or a JSON file) splitting tensors among them (default: "llama").
        pool: a pool by name instead of devices (a host pool: every rank's
            buffer there).
        persistent, gid: as :meth:`rmmd.SharedBuffer.create`.
        chunk_bytes, readers, io: reads of at most `chunk_bytes`, by
            `readers` threads (default :func:`default_readers`), through the
            page cache or not (``"auto"``, ``"direct"``, ``"buffered"``).
        keep_layout: keep each file's layout where nothing is split (fewer,
            larger copies); ``False``: every tensor at a multiple of 256 bytes.
        progress: called after each read (from a reader thread).

    Raises:
        InvalidArgumentError: no checkpoint at `path`, a malformed header or
            index, a plan that does not divide a tensor, devices that do not
            match `tp`; the daemon's refusals. Nothing is left published.
        OSError: a file cannot be read.
        AlreadyExistsError, OutOfMemoryError, PermissionError: as
            :meth:`rmmd.SharedBuffer.create`.
    """
    tp = int(tp)
    if tp < 1:
        raise InvalidArgumentError(f"rmmd: tp is {tp}; give 1 or more ranks")
    if int(chunk_bytes) <= 0:
        raise InvalidArgumentError(f"rmmd: chunk_bytes is {chunk_bytes}; give a positive size")
    if io not in _loader.IO_MODES:
        raise InvalidArgumentError(f"rmmd: io is {io!r}; give one of {', '.join(_loader.IO_MODES)}")
    if tp > 1 and not isinstance(plan, Plan):
        plan = Plan.load(plan or "llama")
    elif tp == 1:
        plan = None
    targets_devices = _devices(devices, tp, pool)
    planning = time.perf_counter()
    ckpt = read_checkpoint(path)
    chunk = -(-int(chunk_bytes) // _loader.IO_ALIGNMENT) * _loader.IO_ALIGNMENT
    ranks = list(range(tp)) if tp > 1 else [0] * len(targets_devices)
    layouts, where = plan_buffers(ckpt, tp, plan, keep_layout)
    reads = plan_reads(ckpt, ranks, tp, plan, where, chunk)
    names = buffer_names(name, tp, targets_devices)
    base = {**ckpt.labels, **(labels or {})}
    planned = time.perf_counter() - planning
    s = session if session is not None else Session(client_name="rmmd.safetensors")
    buffers: list[SharedBuffer] = []

    # "The current device" is the caller's, not the creating thread's.
    create_on = [_current_device_or_none() if d is None and pool is None else d for d in targets_devices]

    created = [0.0]

    def create() -> list[Destination]:
        t = time.perf_counter()
        for bname, dev, rank in zip(names, create_on, ranks):
            if dev is not None:
                # This thread's current device is 0 until set: the mapping's
                # device switch and back would make a context on GPU 0.
                _cuda.set_device(dev)
            buffers.append(
                SharedBuffer.create(s, bname, layouts[rank].nbytes, pool=pool, device=dev, persistent=persistent, gid=gid)
            )
        created[0] = time.perf_counter() - t
        return [Destination(b.ptr, None if b.is_host else b.device) for b in buffers]

    # The buffers are made (the daemon's cuMemCreate and export, this
    # process's import and mapping: part of the half second a 20 GiB publish
    # spent besides its reads) while the readers fill their first slots.
    creating = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmmd-publish")
    destinations = creating.submit(create)
    try:
        try:
            stats = _loader.load(
                ckpt.files, reads, destinations, chunk=chunk, readers=readers or default_readers(), io=io,
                progress=progress, to_devices=not _host_pool(s, pool),
            )
            destinations.result()  # with no reads (no tensors), nothing waited for it yet
        finally:
            creating.shutdown(wait=True)  # nothing is cleaned up while it runs
        publishing = time.perf_counter()
        for b, rank in zip(buffers, ranks):
            b.set_manifest(layouts[rank].entries, {**base, **_tp_labels(tp, rank, plan)})
        for b in buffers:
            b.publish()
        stats.phases.update(plan=planned, create=created[0], publish=time.perf_counter() - publishing)
    except BaseException:
        for b in buffers:
            if persistent:
                try:
                    SharedBuffer.delete(s, b.name)
                except Exception:  # noqa: BLE001: the first error is the one to raise
                    pass
            b.close()
        raise
    return Published(name, buffers, [b.device if not b.is_host else None for b in buffers], ranks, stats, base)


def _current_device_or_none() -> int | None:
    try:
        return _cuda.current_device()
    except Exception:  # noqa: BLE001: no CUDA here; SharedBuffer.create names the problem
        return None


def _host_pool(session: Session, pool: str | Pool | None) -> bool:
    """Whether `pool` is a host pool (its buffers need no page-locked
    staging); a name the session does not know is left to the create to
    refuse."""
    if pool is None:
        return False
    if isinstance(pool, Pool):
        return pool.is_host
    try:
        return session.pool(pool).is_host
    except Exception:  # noqa: BLE001: SharedBuffer.create names the problem
        return False


def _devices(devices: Sequence[int] | None, tp: int, pool: str | Pool | None) -> list[int | None]:
    if pool is not None:
        if devices is not None:
            raise InvalidArgumentError("rmmd: give devices or pool, not both")
        return [None] * tp
    if devices is None:
        return list(range(tp)) if tp > 1 else [None]
    out = [int(d) for d in devices]
    if not out or any(d < 0 for d in out) or len(set(out)) != len(out):
        raise InvalidArgumentError(f"rmmd: devices is {list(devices)}; give distinct CUDA ordinals >= 0")
    if tp > 1 and len(out) != tp:
        raise InvalidArgumentError(f"rmmd: tp {tp} takes one device per rank; devices {out} are {len(out)}")
    return list(out)


def _tp_labels(tp: int, rank: int, plan: Plan | None) -> dict[str, str]:
    if tp == 1 or plan is None:
        return {}
    out = {"tp.size": str(tp), "tp.rank": str(rank), "tp.plan.name": plan.name, "tp.plan.sha256": plan.sha256}
    text = plan.to_json()
    if len(text.encode()) <= 4096:
        out["tp.plan"] = text
    return out


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
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    readers: int | None = None,
    io: str = "auto",
) -> SharedBuffer:
    """Publishes the safetensors file at `path` as the shared buffer
    `name`: the header as the manifest (tensors; ``__metadata__`` and the
    ``checkpoint.*`` labels), the data copied in as :func:`publish_dir`
    does. Returns the creator's hold.

    Args:
        session: the session to create it in; ``None``: a new one.
        labels: the manifest's labels, before the file's.
        device: the GPU whose CUDA pool holds it; ``None``: the current one.
        pool: a pool by name instead (a host pool: no pinned staging).
        persistent, gid: as :meth:`rmmd.SharedBuffer.create`.
        chunk_bytes, readers, io: as :func:`publish_dir`.

    Raises:
        InvalidArgumentError: not a safetensors file, a malformed header, a
            dtype a buffer cannot hold; the daemon's refusals.
        OSError: the file cannot be read.
        AlreadyExistsError, OutOfMemoryError, PermissionError: as
            :meth:`rmmd.SharedBuffer.create`.
    """
    if os.path.isdir(os.fspath(path)):
        raise InvalidArgumentError(f"rmmd: {os.fspath(path)} is a directory: use publish_dir")
    published = publish_dir(
        path,
        name,
        session=session,
        devices=None if device is None else [device],
        labels=labels,
        pool=pool,
        persistent=persistent,
        gid=gid,
        chunk_bytes=chunk_bytes,
        readers=readers,
        io=io,
    )
    return published.buffers[0]

