"""What a shared buffer holds: rmmd.TensorEntry, rmmd.Manifest and
rmmd.BufferInfo, and their JSON (protobuf's JSON mapping of
rmmd.v1.BufferManifest and rmmd.v1.BufferInfo, which the C ABI speaks).

The bounds the daemon enforces (docs/sharing.md) are checked there, not
here: a manifest the daemon refuses raises InvalidArgumentError naming the
tensor or label. Only what a Python caller can get wrong in Python's own
terms (a dtype name, a negative dimension) is refused here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from ._errors import InvalidArgumentError

# name -> bytes per element: the manifest's element types (rmmd.v1.DType),
# named as the C++ rmmd::to_string(dtype) names them.
ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "uint32": 4,
    "int32": 4,
    "float32": 4,
    "uint64": 8,
    "int64": 8,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "complex128": 16,
}

# The wire's enum numbers (rmmd.v1.DType), for a peer that prints enums as ints.
_DTYPE_NUMBER = {name: i + 1 for i, name in enumerate(ITEMSIZE)}
_DTYPE_BY_NUMBER = {v: k for k, v in _DTYPE_NUMBER.items()}


def check_dtype(name: str) -> str:
    if name not in ITEMSIZE:
        raise InvalidArgumentError(
            f"rmmd: unknown dtype {name!r}; a manifest's dtypes are: " + ", ".join(ITEMSIZE)
        )
    return name


def _dtype_from_wire(value: Any) -> str:
    if isinstance(value, int):
        if value in _DTYPE_BY_NUMBER:
            return _DTYPE_BY_NUMBER[value]
    elif isinstance(value, str) and value.startswith("DTYPE_"):
        name = value[len("DTYPE_") :].lower()
        if name in ITEMSIZE:
            return name
    raise InvalidArgumentError(f"rmmd: the daemon sent an unknown dtype {value!r}")


def _field(d: Mapping[str, Any], snake: str, default: Any = None) -> Any:
    """d[snake] or d[lowerCamel]: protobuf's JSON mapping writes either,
    as the printer was told."""
    if snake in d:
        return d[snake]
    parts = snake.split("_")
    camel = parts[0] + "".join(p.title() for p in parts[1:])
    return d.get(camel, default)


def _dims(values: Any, what: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"rmmd: {what} must be a sequence of ints, not {values!r}") from None
    if any(v < 0 for v in out):
        raise InvalidArgumentError(f"rmmd: {what} {out} has a negative value")
    return out


@dataclass(frozen=True)
class TensorEntry:
    """One named tensor inside a buffer: elements of `dtype` from byte
    `offset`, laid out by `shape` and `strides` (in elements, as PyTorch
    counts them; ``None``: contiguous, row-major). `aliases` are other names
    of the same tensor (tied weights)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...] | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidArgumentError(f"rmmd: a tensor's name is a str, not {self.name!r}")
        check_dtype(self.dtype)
        object.__setattr__(self, "shape", _dims(self.shape, f"tensor '{self.name}': shape"))
        if self.strides is not None:
            strides = _dims(self.strides, f"tensor '{self.name}': strides")
            if len(strides) != len(self.shape):
                raise InvalidArgumentError(
                    f"rmmd: tensor '{self.name}': {len(strides)} strides for {len(self.shape)} dimensions"
                )
            object.__setattr__(self, "strides", strides)
        offset = int(self.offset)
        if offset < 0:
            raise InvalidArgumentError(f"rmmd: tensor '{self.name}': offset {offset} is negative")
        object.__setattr__(self, "offset", offset)
        aliases = (self.aliases,) if isinstance(self.aliases, str) else tuple(self.aliases)
        object.__setattr__(self, "aliases", aliases)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes of its elements (numel * itemsize)."""
        return self.numel * self.itemsize

    @property
    def contiguous_strides(self) -> tuple[int, ...]:
        out = []
        step = 1
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))

    @property
    def element_strides(self) -> tuple[int, ...]:
        """`strides`, or the contiguous ones where it is ``None``."""
        return self.contiguous_strides if self.strides is None else self.strides

    @property
    def extent(self) -> int:
        """The bytes from `offset` that its elements span (0 when empty)."""
        if any(n == 0 for n in self.shape):
            return 0
        return self.itemsize * (1 + sum((n - 1) * s for n, s in zip(self.shape, self.element_strides)))

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def _to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "dtype": "DTYPE_" + self.dtype.upper(),
            "shape": [str(n) for n in self.shape],
            "byteOffset": str(self.offset),
        }
        if self.strides is not None:
            out["strides"] = [str(s) for s in self.strides]
        if self.aliases:
            out["aliases"] = list(self.aliases)
        return out

    @classmethod
    def _from_wire(cls, d: Mapping[str, Any]) -> "TensorEntry":
        strides = _field(d, "strides") or None
        return cls(
            name=d.get("name", ""),
            dtype=_dtype_from_wire(d.get("dtype")),
            shape=tuple(int(n) for n in d.get("shape", ())),
            offset=int(_field(d, "byte_offset", 0)),
            strides=None if strides is None else tuple(int(s) for s in strides),
            aliases=tuple(d.get("aliases", ())),
        )


@dataclass(frozen=True)
class Manifest(Mapping[str, TensorEntry]):
    """What a buffer holds: its tensors and labels. A read-only mapping from
    each tensor's name, and each alias, to its :class:`TensorEntry`
    (``manifest["lm_head.weight"]``, ``"x" in manifest``); iterating gives
    the names of the tensors (not the aliases), in the table's order."""

    tensors: tuple[TensorEntry, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tensors = tuple(self.tensors)
        for t in tensors:
            if not isinstance(t, TensorEntry):
                raise InvalidArgumentError(f"rmmd: a manifest's tensors are TensorEntry, not {t!r}")
        object.__setattr__(self, "tensors", tensors)
        labels = dict(self.labels or {})
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgumentError(f"rmmd: labels are str to str, not {k!r}: {v!r}")
        object.__setattr__(self, "labels", labels)
        index: dict[str, TensorEntry] = {}
        for t in tensors:
            for n in t.names:
                index.setdefault(n, t)  # duplicates: the daemon names them
        object.__setattr__(self, "_index", index)

    def __getitem__(self, name: str) -> TensorEntry:
        return self._index[name]  # type: ignore[attr-defined]

    def __contains__(self, name: object) -> bool:
        return name in self._index  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[str]:
        return (t.name for t in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __bool__(self) -> bool:
        return bool(self.tensors) or bool(self.labels)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return self.tensors == other.tensors and dict(self.labels) == dict(other.labels)

    def __hash__(self) -> int:
        return hash((self.tensors, tuple(sorted(self.labels.items()))))

    @property
    def nbytes(self) -> int:
        """The bytes the tensors' elements take (aliases counted once)."""
        return sum(t.nbytes for t in self.tensors)

    def to_json(self) -> str:
        """The JSON the C ABI takes (rmmd.v1.BufferManifest)."""
        return json.dumps(
            {
                "tensors": [t._to_wire() for t in self.tensors],
                "labels": [{"key": k, "value": v} for k, v in sorted(self.labels.items())],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        d = json.loads(text) if text else {}
        return cls._from_wire(d)

    @classmethod
    def _from_wire(cls, d: Mapping[str, Any] | None) -> "Manifest":
        d = d or {}
        return cls(
            tensors=tuple(TensorEntry._from_wire(t) for t in d.get("tensors", ())),
            labels=labels_from_wire(d.get("labels")),
        )


def labels_from_wire(labels: Any) -> dict[str, str]:
    """Labels as the C ABI's JSON carries them: [{"key": k, "value": v}]
    (protobuf's JSON of repeated rmmd.v1.Label)."""
    return {str(label.get("key", "")): str(label.get("value", "")) for label in labels or ()}


def checked_labels(labels: Mapping[str, str] | None, what: str) -> dict[str, str]:
    """`labels` as a dict of str to str; InvalidArgumentError otherwise."""
    if not labels:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidArgumentError(f"rmmd: {what} is a dict of labels, not {labels!r}")
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgumentError(f"rmmd: {what}: labels are str to str, not {k!r}: {v!r}")
    return dict(labels)


def as_manifest(tensors: Any, labels: Mapping[str, str] | None) -> Manifest:
    """A Manifest from what set_manifest() takes: a Manifest (with labels
    added to its own), or TensorEntry objects (a sequence, or a mapping
    name -> TensorEntry)."""
    if isinstance(tensors, Manifest):
        if not labels:
            return tensors
        return Manifest(tensors.tensors, {**tensors.labels, **labels})
    if isinstance(tensors, Mapping):
        tensors = list(tensors.values())
    if not isinstance(tensors, Sequence) and not hasattr(tensors, "__iter__"):
        raise InvalidArgumentError(f"rmmd: set_manifest takes a Manifest or TensorEntry objects, not {tensors!r}")
    return Manifest(tuple(tensors), dict(labels or {}))


_BUFFER_STATES = {
    0: "unspecified",
    1: "writing",
    2: "published",
    3: "deleted",
}


def _state(value: Any) -> str:
    if isinstance(value, int):
        return _BUFFER_STATES.get(value, str(value))
    if isinstance(value, str) and value.startswith("BUFFER_STATE_"):
        return value[len("BUFFER_STATE_") :].lower()
    return "unspecified" if value is None else str(value)


@dataclass(frozen=True)
class LeaseInfo:
    """A buffer's write lease as the daemon lists it (docs/failover.md)."""

    generation: int
    """The latest grant's (0: never granted)."""
    holder_session: int
    """The session holding it now; 0: nobody."""
    holder_pid: int
    holder_uid: int
    waiters: tuple[tuple[int, int, int], ...]
    """The sessions waiting for it, in the order they are served: (session, pid, uid)."""
    plain_writers: int
    """Other sessions holding plain read-write opens, which a grant waits for."""

    @classmethod
    def _from_wire(cls, d: Mapping[str, Any]) -> "LeaseInfo":
        waiters = tuple(
            (int(_field(w, "session_id", 0)), int(w.get("pid", 0)), int(w.get("uid", 0)))
            for w in d.get("waiters", [])
        )
        return cls(
            generation=int(d.get("generation", 0)),
            holder_session=int(_field(d, "holder_session_id", 0)),
            holder_pid=int(_field(d, "holder_pid", 0)),
            holder_uid=int(_field(d, "holder_uid", 0)),
            waiters=waiters,
            plain_writers=int(_field(d, "plain_writers", 0)),
        )


@dataclass(frozen=True)
class BufferInfo:
    """A buffer as the daemon lists it (``rmmctl buffers``)."""

    id: int
    name: str
    pool: str
    """The pool's name."""
    nbytes: int
    creator_uid: int
    gid: int | None
    """Members of this group may open it too (``None``: the creator's uid only)."""
    holders: int
    """Sessions that hold it now."""
    published: bool
    persistent: bool
    allow_writers: bool
    labels: Mapping[str, str]
    tensor_count: int
    state: str = "published"
    """``"writing"``, ``"published"`` or ``"deleted"``."""
    creator_pid: int = 0
    peer: str | None = None
    """The node whose buffer it is (``Session.buffers(peer=...)``); ``None``:
    this node. Such an entry has no id, pool or creator (that node's)."""
    lease: LeaseInfo | None = None
    """Its write lease; ``None`` while nobody ever asked for it."""

    @classmethod
    def _from_wire(cls, d: Mapping[str, Any]) -> "BufferInfo":
        state = _state(_field(d, "state"))
        gid = _field(d, "gid")
        return cls(
            id=int(_field(d, "buffer_id", 0)),
            name=d.get("name", ""),
            pool=_field(d, "pool_name", ""),
            nbytes=int(d.get("size", 0)),
            creator_uid=int(_field(d, "creator_uid", 0)),
            gid=None if gid is None else int(gid),
            holders=int(d.get("holders", 0)),
            published=state == "published",
            persistent=bool(d.get("persistent", False)),
            allow_writers=bool(_field(d, "allow_writers", False)),
            labels=labels_from_wire(d.get("labels")),
            tensor_count=int(_field(d, "tensor_count", 0)),
            state=state,
            creator_pid=int(_field(d, "creator_pid", 0)),
            peer=d.get("peer") or None,
            lease=LeaseInfo._from_wire(d["lease"]) if d.get("lease") is not None else None,
        )
