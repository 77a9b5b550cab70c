"""Failover of an inference engine's KV cache (docs/failover.md): the KV
cache lives in a persistent rmmd buffer that outlives the engine, one
engine at a time writes it under the buffer's write lease, and a standby
process that mapped it beforehand takes over where the dead engine stopped.

    layout = rmmd.failover.KVLayout(num_layers=32, num_kv_heads=8, head_dim=128,
                                    max_batch=16, max_length=8192, dtype="bfloat16")
    rmmd.failover.create_kv(session, "engine/kv/rank0", layout, model="llama-8b@abc")  # once

    # the standby (the active engine: rmmd.failover.active(...), which returns at the grant)
    kv = rmmd.failover.standby(session, "engine/kv/rank0", layout, model="llama-8b@abc")
    rmmd.failover.bind_static_cache(cache, kv)      # transformers' StaticCache: its tensors are the buffer's
    generation, state = kv.wait()                   # the grant: state.lengths says where to go on

The buffer, one per engine rank, holds in this order: a header of int64
words (below), the token ids (``tokens``: int64 [max_batch, max_length],
optional), then each layer's keys and values ([max_batch, num_kv_heads,
max_length, head_dim], as transformers' StaticCache holds them).

Why a header inside the KV buffer and not a companion buffer: the engine
writes the header on the same stream as its keys and values, after them, so
stream order alone says that every length the header shows was written
before it (no host synchronisation per step, and a step can be one CUDA
graph replay); one buffer also means one lease, one mapping and one
persistence. The manifest (fixed at creation) carries what does not change:
the layout as tensors and as the label ``failover.layout`` (its canonical
JSON), and the model as ``failover.model``; a standby of another model or
layout is refused by the labels guard at its open, before it maps anything.

Header words (int64, little-endian): 0 magic ``RMMDKV01``, 1 format
version, 2 header bytes, 3 layout fingerprint, 4 the lease generation of the
last writer (stamped last), 5 commits (one per :meth:`KVStore.stamp`), 6 the
engine's seed, 7 the layout JSON's bytes, 8-15 engine words (free for the
engine), 16.. lengths (one per sequence: the tokens of it the buffer holds),
then the layout JSON. Each word is written whole, so a reader sees every
word either before or after a write, never half of it.

This module imports without PyTorch. Device buffers need it (their views
are torch tensors); host buffers (a host pool) give NumPy views.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ._buffer import SharedBuffer
from ._errors import AlreadyExistsError, InvalidArgumentError, PreconditionError
from ._manifest import ITEMSIZE, Manifest, TensorEntry
from ._session import Pool, Session
from ._views import tensor_views

__all__ = [
    "KVLayout", "KVState", "KVStore", "active", "bind_static_cache", "create_kv", "set_static_cache_length",
    "standby",
]

MAGIC = struct.unpack("<q", b"RMMDKV01")[0]
FORMAT_VERSION = 1
ENGINE_WORDS = 8
ALIGNMENT = 256
HEADER_ALIGNMENT = 4096
# Header word indices.
W_MAGIC, W_VERSION, W_HEADER_BYTES, W_FINGERPRINT, W_GENERATION, W_COMMITS, W_SEED, W_JSON_BYTES = range(8)
W_ENGINE = 8
W_LENGTHS = W_ENGINE + ENGINE_WORDS

LABEL_FORMAT = "failover.format"
LABEL_LAYOUT = "failover.layout"
LABEL_MODEL = "failover.model"


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class KVLayout:
    """The shape of one engine rank's KV cache: per layer, keys and values
    of [max_batch, num_kv_heads, max_length, head_dim] elements of `dtype`
    (a manifest dtype name: "bfloat16", "float16", ...); with `tokens`, an
    int64 [max_batch, max_length] table of token ids beside them."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_batch: int
    max_length: int
    dtype: str = "bfloat16"
    tokens: bool = True

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "max_batch", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"rmmd: KVLayout.{name} is an int >= 1, not {value!r}")
        if self.dtype not in ITEMSIZE:
            raise InvalidArgumentError(f"rmmd: KVLayout.dtype {self.dtype!r} is not a manifest dtype")

    @classmethod
    def for_config(cls, config: Any, max_batch: int, max_length: int, dtype: str = "bfloat16",
                   tokens: bool = True) -> "KVLayout":
        """The layout of a transformers decoder config (num_hidden_layers,
        num_key_value_heads, head_dim or hidden_size / num_attention_heads)."""
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(int(config.num_hidden_layers), int(heads), int(head_dim), max_batch, max_length, dtype, tokens)

    def to_json(self) -> str:
        """Canonical JSON: the label ``failover.layout`` and the header's copy."""
        return json.dumps({"format": FORMAT_VERSION, **asdict(self)}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "KVLayout":
        d = json.loads(text)
        d.pop("format", None)
        return cls(**d)

    @property
    def fingerprint(self) -> int:
        """A signed 64-bit digest of :meth:`to_json` (header word 3)."""
        return struct.unpack("<q", hashlib.sha256(self.to_json().encode()).digest()[:8])[0]

    @property
    def header_bytes(self) -> int:
        return _align(8 * (W_LENGTHS + self.max_batch) + len(self.to_json()), HEADER_ALIGNMENT)

    @property
    def layer_bytes(self) -> int:
        """One layer's keys (or values), in bytes."""
        return self.max_batch * self.num_kv_heads * self.max_length * self.head_dim * ITEMSIZE[self.dtype]

    def entries(self) -> list[TensorEntry]:
        """The manifest: ``header`` (int64 words), ``tokens``, then
        ``k.<layer>`` and ``v.<layer>`` for each layer."""
        out = [TensorEntry("header", "int64", (self.header_bytes // 8,), 0)]
        offset = self.header_bytes
        if self.tokens:
            out.append(TensorEntry("tokens", "int64", (self.max_batch, self.max_length), offset))
            offset = _align(offset + 8 * self.max_batch * self.max_length, ALIGNMENT)
        shape = (self.max_batch, self.num_kv_heads, self.max_length, self.head_dim)
        for i in range(self.num_layers):
            for kind in ("k", "v"):
                out.append(TensorEntry(f"{kind}.{i}", self.dtype, shape, offset))
                offset = _align(offset + self.layer_bytes, ALIGNMENT)
        return out

    @property
    def nbytes(self) -> int:
        """The buffer's size."""
        last = self.entries()[-1]
        return _align(last.offset + last.nbytes, ALIGNMENT)

    def labels(self, model: str) -> dict[str, str]:
        """The labels a KV buffer of this layout for `model` carries (and a
        standby expects)."""
        return {LABEL_FORMAT: str(FORMAT_VERSION), LABEL_LAYOUT: self.to_json(), LABEL_MODEL: model}

    def initial_header(self, seed: int = 0) -> bytes:
        """The header as :func:`create_kv` writes it: nothing committed yet."""
        text = self.to_json().encode()
        words = [0] * (W_LENGTHS + self.max_batch)
        words[W_MAGIC], words[W_VERSION], words[W_HEADER_BYTES] = MAGIC, FORMAT_VERSION, self.header_bytes
        words[W_FINGERPRINT], words[W_SEED], words[W_JSON_BYTES] = self.fingerprint, seed, len(text)
        raw = struct.pack(f"<{len(words)}q", *words) + text
        return raw + bytes(self.header_bytes - len(raw))


@dataclass(frozen=True)
class KVState:
    """What a KV buffer's header says: where its last writer stopped."""

    generation: int
    """The lease generation of the last writer that stamped it (0: none yet)."""
    commits: int
    """How many stamps it has had, all writers together."""
    seed: int
    lengths: tuple[int, ...]
    """Per sequence, how many of its tokens the buffer holds (written before the stamp)."""
    engine: tuple[int, ...] = field(default=(0,) * ENGINE_WORDS)
    """The engine's own words."""

    @classmethod
    def decode(cls, raw: bytes, layout: KVLayout) -> "KVState":
        """The state of a header's bytes; PreconditionError where they are
        not a header of `layout` (another format, another layout, never
        written by create_kv)."""
        n = W_LENGTHS + layout.max_batch
        if len(raw) < 8 * n:
            raise PreconditionError(f"rmmd: a KV header of {len(raw)} bytes is shorter than {8 * n}")
        words = struct.unpack_from(f"<{n}q", raw)
        if words[W_MAGIC] != MAGIC:
            raise PreconditionError("rmmd: the buffer has no KV header (its magic is not RMMDKV01)")
        if words[W_VERSION] != FORMAT_VERSION:
            raise PreconditionError(f"rmmd: KV header format {words[W_VERSION]}, this rmmd reads {FORMAT_VERSION}")
        if words[W_FINGERPRINT] != layout.fingerprint:
            start = 8 * n
            text = raw[start : start + max(0, words[W_JSON_BYTES])].decode(errors="replace")
            raise PreconditionError(f"rmmd: the KV buffer's layout is {text}, not {layout.to_json()}")
        return cls(
            generation=words[W_GENERATION],
            commits=words[W_COMMITS],
            seed=words[W_SEED],
            lengths=tuple(words[W_LENGTHS:n]),
            engine=tuple(words[W_ENGINE:W_LENGTHS]),
        )


def _framework(buf: SharedBuffer, framework: str | None) -> str:
    if framework is not None:
        return framework
    return "numpy" if buf.is_host else "torch"


def create_kv(
    session: Session,
    name: str,
    layout: KVLayout,
    *,
    model: str,
    labels: Mapping[str, str] | None = None,
    pool: str | Pool | None = None,
    device: int | None = None,
    gid: int | None = None,
    seed: int = 0,
) -> bool:
    """Makes the KV buffer `name` for `layout` and `model` (persistent,
    others may write it, nobody holds it after): the header written, the
    keys, values and tokens as they come (not zeroed). Idempotent: where
    `name` exists with the same layout and model, does nothing. Returns
    whether it made it.

    Args:
        labels: more labels for the manifest (``failover.*`` are this module's).
        pool, device, gid: as :meth:`rmmd.SharedBuffer.create` (a host pool:
            NumPy views, for tests and hosts without a GPU).
        seed: the header's seed word.

    Raises:
        PreconditionError: `name` exists with another layout or model
            (the message names the label that differs).
        and what :meth:`rmmd.SharedBuffer.create` raises.
    """
    all_labels = {**dict(labels or {}), **layout.labels(model)}
    try:
        buf = SharedBuffer.create(session, name, layout.nbytes, pool=pool, device=device, persistent=True,
                                  gid=gid, allow_writers=True)
    except AlreadyExistsError:
        # Made already (or being made by another engine): the guard says whether it is ours.
        SharedBuffer.open(session, name, wait=60, expect=layout.labels(model)).close()
        return False
    try:
        entry = layout.entries()[0]
        header = tensor_views(buf, Manifest((entry,)), _framework(buf, None))["header"]
        raw = layout.initial_header(seed)
        if buf.is_host:
            import numpy as np

            header.view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)
        else:
            import torch

            src = torch.frombuffer(bytearray(raw), dtype=torch.int64)
            header.copy_(src)
            torch.cuda.synchronize(buf.device)
        del header
        buf.set_manifest(layout.entries(), all_labels)
        buf.publish()
    except BaseException:
        SharedBuffer.delete(session, name)
        buf.close()
        raise
    buf.close()  # the creator's open would count as a writer in the lease's way
    return True


class KVStore:
    """One engine's hold of a KV buffer: its tensors (``keys[i]``,
    ``values[i]``, ``tokens``, and the header's ``lengths`` and ``engine``
    words, views of the buffer) and its write lease.

    Made by :func:`active` (holding the lease) or :func:`standby` (mapped,
    waiting: :meth:`wait`). Writes go to the tensors in stream order; after
    a step's data, the engine writes ``lengths`` (and its ``engine`` words)
    and calls :meth:`stamp`, on the same stream.
    """

    def __init__(self, buf: SharedBuffer, layout: KVLayout, framework: str) -> None:
        self.layout = layout
        self.framework = framework
        self._buf = buf
        self._generation = buf.lease_generation
        self._gen_word: Any = None
        self._view(buf)

    def _view(self, buf: SharedBuffer) -> None:
        views = buf.tensors(self.framework)
        layout = self.layout
        self.header = views["header"]
        self.lengths = self.header[W_LENGTHS : W_LENGTHS + layout.max_batch]
        self.engine = self.header[W_ENGINE:W_LENGTHS]
        self.tokens = views.get("tokens")
        self.keys = [views[f"k.{i}"] for i in range(layout.num_layers)]
        self.values = [views[f"v.{i}"] for i in range(layout.num_layers)]

    @property
    def buffer(self) -> SharedBuffer:
        return self._buf

    @property
    def generation(self) -> int:
        """This hold's lease generation; 0 while it does not hold the lease."""
        return self._generation

    @property
    def holds_lease(self) -> bool:
        return self._generation != 0

    def state(self) -> KVState:
        """The header as it is now (a device buffer: after the current
        stream's work; a synchronising read)."""
        if self.framework == "torch":
            raw = self.header.cpu().numpy().tobytes()
        else:
            import numpy as np

            raw = np.ascontiguousarray(self.header).tobytes()
        return KVState.decode(raw, self.layout)

    def _generation_word(self) -> Any:
        """A one-word tensor holding this hold's generation, which stamp()
        copies: a CUDA graph captured before the grant copies the right one."""
        if self._gen_word is None:
            if self.framework == "torch":
                import torch

                self._gen_word = torch.full((1,), self._generation, dtype=torch.int64, device=self.header.device)
            else:
                import numpy as np

                self._gen_word = np.full((1,), self._generation, dtype=np.int64)
        return self._gen_word

    def stamp(self) -> None:
        """Marks what was written so far as this holder's: the commit count
        + 1, then its lease generation, on the current stream (capturable in
        a CUDA graph; a standby may capture it before the grant)."""
        word = self._generation_word()
        if self.framework == "torch":
            self.header[W_COMMITS : W_COMMITS + 1].add_(1)
            self.header[W_GENERATION : W_GENERATION + 1].copy_(word)
        else:
            self.header[W_COMMITS] += 1
            self.header[W_GENERATION] = word[0]

    def wait(self, timeout: float | None = None) -> tuple[int, KVState]:
        """Waits for the write lease (``None``: for as long as it takes) and
        returns its generation and the header as the last writer left it.
        At once where this hold has it already.

        Raises:
            DeadlineError: the wait ended first (nothing changed; wait again).
        """
        if not self.holds_lease:
            self._generation = int(self._buf.wait_lease(timeout))  # the same mapping, read-write now
            if self.framework == "numpy":
                self._view(self._buf)  # NumPy arrays of a read-only mapping stay read-only: new ones, same addresses
            if self._gen_word is not None:
                self._gen_word[0] = self._generation  # what stamp() copies, in a graph too
        return self._generation, self.state()

    def close(self) -> None:
        """Lets go of the hold (and the lease) once no tensor made from it
        lives (this object drops its own; a cache bound to them keeps the
        hold until it goes too)."""
        self.header = self.lengths = self.engine = self.tokens = self._gen_word = None
        self.keys, self.values = [], []
        self._buf.close()

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        lease = f"lease generation {self._generation}" if self._generation else "waiting for the lease"
        return f"<rmmd.failover.KVStore '{self._buf.name}' {self.layout.num_layers} layers, {lease}>"


def _expect(layout: KVLayout, model: str, expect: Mapping[str, str] | None) -> dict[str, str]:
    return {**dict(expect or {}), **layout.labels(model)}


def active(session: Session, name: str, layout: KVLayout, *, model: str, wait: float = 0.0,
           expect: Mapping[str, str] | None = None, framework: str | None = None) -> KVStore:
    """The engine that writes now: opens the KV buffer `name` exclusively
    (its write lease; waits up to `wait` seconds in line), refused where its
    labels are not those of `layout` and `model` (and `expect`).

    Raises:
        PreconditionError: another layout or model (the labels guard), or a
            header that is not `layout`'s.
        DeadlineError: the lease stayed another's for `wait`.
        and what :meth:`rmmd.SharedBuffer.open` raises.
    """
    labels = _expect(layout, model, expect)
    buf = SharedBuffer.open(session, name, wait=wait, writable=True, exclusive=True, expect=labels)
    kv = KVStore(buf, layout, _framework(buf, framework))
    kv.state()  # the header is this layout's
    return kv


def standby(session: Session, name: str, layout: KVLayout, *, model: str, wait: float = 0.0,
            expect: Mapping[str, str] | None = None, framework: str | None = None) -> KVStore:
    """A standby engine: maps the KV buffer `name` now (read-only until the
    grant where the memory allows) and joins the lease's line; its tensors
    are there for building caches and capturing graphs; :meth:`KVStore.wait`
    returns at the grant. `wait`: how long to wait for the buffer to be
    published. Refused as :func:`active` is.

    The open is :meth:`rmmd.SharedBuffer.open` with ``standby=True``
    (docs/failover.md, "A standby that is ready"): where the lease is free
    it is this one's at once, and :meth:`KVStore.wait` returns at once.
    """
    labels = _expect(layout, model, expect)
    buf = SharedBuffer.open(session, name, wait=wait, writable=True, exclusive=True, standby=True, expect=labels)
    kv = KVStore(buf, layout, _framework(buf, framework))
    kv.state()
    return kv


def bind_static_cache(cache: Any, kv: KVStore) -> None:
    """Makes transformers' StaticCache (5.x: ``cache.layers[i].keys`` and
    ``.values``) hold `kv`'s tensors: the model's attention then reads and
    writes the KV buffer. A layer not yet initialised is, by its own
    ``lazy_initialization`` (which allocates one layer's keys and values,
    dropped at once for the buffer's), so that whatever else the installed
    transformers keeps per layer (its write counter) is there.
    :func:`set_static_cache_length` says where the next write goes."""
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) != kv.layout.num_layers:
        raise InvalidArgumentError(
            f"rmmd: bind_static_cache takes a transformers StaticCache of {kv.layout.num_layers} layers "
            f"(cache.layers), not {type(cache).__name__}")
    import torch

    for layer, k, v in zip(layers, kv.keys, kv.values):
        if getattr(layer, "max_cache_len", k.shape[2]) != k.shape[2]:
            raise InvalidArgumentError(
                f"rmmd: the cache's max_cache_len is {layer.max_cache_len}, the KV layout's {k.shape[2]}")
        if not getattr(layer, "is_initialized", False):
            empty_k = torch.empty((*k.shape[:2], 0, k.shape[3]), dtype=k.dtype, device=k.device)
            empty_v = torch.empty((*v.shape[:2], 0, v.shape[3]), dtype=v.dtype, device=v.device)
            try:
                layer.lazy_initialization(empty_k, empty_v)
            except TypeError:  # transformers whose layers take the keys only
                layer.lazy_initialization(empty_k)
        layer.keys, layer.values = k, v
        try:
            torch._dynamo.mark_static_address(k)
            torch._dynamo.mark_static_address(v)
        except Exception:  # only torch.compile cares
            pass


def set_static_cache_length(cache: Any, length: int) -> None:
    """Tells a transformers StaticCache that it holds `length` tokens, so
    that the next write goes to slot `length`: the layers' write counter
    (``cumulative_length``, a one-word tensor in transformers 5.x, set in
    place so that a CUDA graph that reads it sees the new value). Layers
    without one take their slots from ``cache_position`` instead."""
    for layer in cache.layers:
        counter = getattr(layer, "cumulative_length", None)
        if hasattr(counter, "fill_"):
            counter.fill_(length)
        elif isinstance(counter, int):
            layer.cumulative_length = length
