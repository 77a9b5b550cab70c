"""Model weights shared through rmmd, for PyTorch: one process publishes a
module's (or a state dict's) tensors into one named shared buffer with a
manifest; every other process attaches a module built on the meta device to
it, its parameters and buffers then views of the shared memory: no copy, and
the process's device memory does not grow by the weights.

    # the loader
    model = GPT(config).cuda()
    model.load_state_dict(torch.load("gpt.pt"))
    buf = rmmd.torch.publish("gpt/weights", model, labels={"revision": "abc"})

    # each worker
    with torch.device("meta"):
        model = GPT(config)
    rmmd.torch.attach("gpt/weights", model, expect={"revision": "abc"})
    model.eval()(tokens)                          # runs on the shared weights

How tensors are laid out: each at an offset aligned to 256 bytes, in the
state dict's order. Tensors that are the same view of the same storage (tied
weights: an embedding that is also the output projection) are stored once,
under one name with the others as aliases, and an attached module gets one
Parameter for all of them (tied again). Tensors that share storage in other
ways (one a slice of another) are stored as separate copies. A
non-contiguous tensor whose elements are dense (a transposed or permuted
one) is stored as it is, with its strides in the manifest, so consumers get
the same strides; one with gaps or repeated elements (a strided slice, an
expanded tensor) is stored contiguous.

This module imports without PyTorch; its functions need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ._buffer import SharedBuffer
from ._errors import InvalidArgumentError
from ._manifest import Manifest, TensorEntry
from ._session import Pool, Session
from ._views import _TORCH, tensor_views

if TYPE_CHECKING:
    import torch

__all__ = ["attach", "load_state_dict", "publish", "plan_layout", "ALIGNMENT"]

ALIGNMENT = 256
"""Bytes each tensor's offset is a multiple of."""


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor to copy into the buffer: where (its manifest entry), from
    what, and whether it is stored contiguous though the source is not."""

    entry: TensorEntry
    source: Any
    made_contiguous: bool


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    step = 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Row-major, dimensions of size 1 aside (their stride does not matter)."""
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, _contiguous_strides(shape)))


def _is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Its elements fill [0, numel) once each in some order of dimensions (a
    permutation of a contiguous layout): no gap, no element seen twice."""
    expected = 1
    for s, n in sorted((s, n) for n, s in zip(shape, strides) if n != 1):
        if s != expected:
            return False
        expected *= n
    return True


def dtype_name(dtype: Any) -> str:
    """The manifest's name of a torch.dtype ("float16", "bfloat16", ...)."""
    import torch

    for name, attr in _TORCH.items():
        if getattr(torch, attr, None) is dtype:
            return name
    raise InvalidArgumentError(
        f"rmmd: {dtype} has no manifest dtype; the dtypes a buffer can hold are: " + ", ".join(_TORCH)
    )


def _state_dict(module_or_state_dict: Any) -> dict[str, Any]:
    import torch

    if isinstance(module_or_state_dict, torch.nn.Module):
        state = module_or_state_dict.state_dict(keep_vars=True)
    elif isinstance(module_or_state_dict, Mapping):
        state = dict(module_or_state_dict)
    else:
        raise InvalidArgumentError(
            f"rmmd: publish takes a torch.nn.Module or a state dict, not {type(module_or_state_dict).__name__}"
        )
    out: dict[str, Any] = {}
    for name, value in state.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"rmmd: a state dict's keys are str, not {name!r}")
        if not isinstance(value, torch.Tensor):
            raise InvalidArgumentError(
                f"rmmd: '{name}' is a {type(value).__name__}, not a tensor: a buffer holds tensors only"
            )
        if value.is_meta:
            raise InvalidArgumentError(f"rmmd: '{name}' is on the meta device: it has no data to publish")
        if value.layout is not torch.strided or value.is_quantized:
            raise InvalidArgumentError(
                f"rmmd: '{name}' is a {value.layout} tensor{' (quantized)' if value.is_quantized else ''}: "
                "a buffer holds dense tensors only"
            )
        out[name] = value.detach()
    if not out:
        raise InvalidArgumentError("rmmd: the state dict has no tensors: nothing to publish")
    return out


def plan_layout(state: Mapping[str, Any], alignment: int = ALIGNMENT) -> tuple[list[PlannedTensor], int]:
    """Where each tensor of `state` goes in one buffer: the planned tensors
    (each with its manifest entry) and the buffer's size in bytes."""
    planned: list[PlannedTensor] = []
    by_view: dict[tuple[Any, ...], int] = {}
    aliases: dict[int, list[str]] = {}
    offset = 0
    for name, t in state.items():
        shape = tuple(int(n) for n in t.shape)
        strides = tuple(int(s) for s in t.stride())
        key = (
            t.device,
            t.dtype,
            t.untyped_storage().data_ptr(),
            int(t.storage_offset()),
            shape,
            strides,
        )
        if t.numel() and key in by_view:  # the same view of the same memory: tied
            aliases[by_view[key]].append(name)
            continue
        dtype = dtype_name(t.dtype)
        stored_strides: tuple[int, ...] | None = None
        made_contiguous = False
        if t.numel() and not _is_contiguous(shape, strides):
            if _is_dense(shape, strides):
                stored_strides = strides
            else:
                made_contiguous = True
        if t.numel():
            offset = _align(offset, alignment)
        # (an empty tensor has no bytes, so no place of its own: offset 0)
        entry = TensorEntry(
            name=name, dtype=dtype, shape=shape, offset=offset if t.numel() else 0, strides=stored_strides
        )
        if t.numel():
            by_view[key] = len(planned)
        aliases[len(planned)] = []
        planned.append(PlannedTensor(entry, t, made_contiguous))
        offset += entry.extent
    out = []
    for i, p in enumerate(planned):
        if aliases[i]:
            e = p.entry
            p = PlannedTensor(
                TensorEntry(e.name, e.dtype, e.shape, e.offset, e.strides, tuple(aliases[i])),
                p.source,
                p.made_contiguous,
            )
        out.append(p)
    return out, max(_align(offset, alignment), alignment)


def _session(session: Session | None) -> Session:
    return session if session is not None else Session(client_name="rmmd.torch")


def _target_device(state: Mapping[str, Any], device: Any) -> int | None:
    import torch

    if device is not None:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if d.type != "cuda":
            raise InvalidArgumentError(f"rmmd: device is a CUDA device, not {device!r} (use pool= for host memory)")
        return d.index if d.index is not None else torch.cuda.current_device()
    for t in state.values():
        if t.is_cuda:
            return t.device.index
    return None  # the current device


def publish(
    name: str,
    module_or_state_dict: Any,
    *,
    session: Session | None = None,
    labels: Mapping[str, str] | None = None,
    device: Any = None,
    pool: str | Pool | None = None,
    persistent: bool = False,
    gid: int | None = None,
    allow_writers: bool = False,
) -> SharedBuffer:
    """Publishes a module's state dict (parameters and persistent buffers),
    or a state dict, as the shared buffer `name`: every tensor laid out
    aligned in one buffer, copied in, the manifest set, the buffer
    published. Returns the creator's hold: the buffer lives while it (or
    any holder) does, or until deleted where `persistent`.

    Args:
        session: the session to create it in; ``None``: a new one.
        labels: the manifest's labels (model, revision, rank, ...); the
            label ``"framework"`` is ``"torch <version>"`` unless given.
        device: the GPU whose CUDA pool holds it; ``None``: that of the
            first CUDA tensor, else the current device.
        pool: a pool by name (a host pool for host memory) instead.
        persistent, gid, allow_writers: as :meth:`rmmd.SharedBuffer.create`.

    Raises:
        InvalidArgumentError: a tensor of a dtype a manifest cannot hold, a
            meta tensor, a non-tensor value; the daemon's refusals.
        AlreadyExistsError, OutOfMemoryError, PermissionError: as
            :meth:`rmmd.SharedBuffer.create`.
    """
    import torch

    state = _state_dict(module_or_state_dict)
    planned, nbytes = plan_layout(state)
    manifest_labels = {"framework": f"torch {torch.__version__}", **dict(labels or {})}
    s = _session(session)
    target = None if pool is not None else _target_device(state, device)
    buf = SharedBuffer.create(
        s, name, nbytes, pool=pool, device=target, persistent=persistent, gid=gid, allow_writers=allow_writers
    )
    try:
        _copy_in(buf, planned)
        buf.set_manifest([p.entry for p in planned], manifest_labels)
        buf.publish()
    except BaseException:
        if persistent:
            SharedBuffer.delete(s, name)
        buf.close()
        raise
    return buf


def _copy_in(buf: SharedBuffer, planned: list[PlannedTensor]) -> None:
    """Copies every planned tensor to its place in `buf`, done on return."""
    import torch

    targets = tensor_views(buf, Manifest(tuple(p.entry for p in planned)), "torch")
    if buf.is_host:
        for p in planned:
            targets[p.entry.name].copy_(p.source)
        return
    stream = torch.cuda.Stream(device=buf.device)
    # The sources' pending work on the current streams comes first.
    stream.wait_stream(torch.cuda.current_stream(buf.device))
    for dev in {p.source.device for p in planned if p.source.is_cuda and p.source.device.index != buf.device}:
        stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        for p in planned:
            targets[p.entry.name].copy_(p.source, non_blocking=True)
    stream.synchronize()


def _open(name: str, session: Session | None, expect: Mapping[str, str] | None, writable: bool) -> SharedBuffer:
    return SharedBuffer.open(_session(session), name, writable=writable, expect=expect)


def load_state_dict(
    name: str,
    *,
    session: Session | None = None,
    expect: Mapping[str, str] | None = None,
    writable: bool = False,
) -> dict[str, "torch.Tensor"]:
    """The tensors of the shared buffer `name` as a state dict: name (and
    alias) -> a tensor viewing the shared memory (no copy). The buffer stays
    open while any of them lives.

    Raises:
        NotFoundError, PermissionError: as :meth:`rmmd.SharedBuffer.open`.
        PreconditionError: a label differs from `expect`.
    """
    buf = _open(name, session, expect, writable)
    try:
        return buf.tensors("torch")
    finally:
        buf.close()  # the tensors hold it open until the last one goes


def attach(
    name: str,
    module: "torch.nn.Module",
    *,
    session: Session | None = None,
    expect: Mapping[str, str] | None = None,
    writable: bool = False,
    strict: bool = True,
) -> SharedBuffer:
    """Makes `module`'s parameters and persistent buffers views of the
    shared buffer `name` (``load_state_dict(..., assign=True)``): build the
    module on the meta device (``with torch.device("meta"): m = Model()``)
    so that it has no memory of its own. Parameters are
    ``torch.nn.Parameter`` with ``requires_grad=False``; names that are
    aliases of one tensor in the buffer get one Parameter (tied weights stay
    tied). The buffer stays open while the module lives (it is kept as
    ``module._rmmd_buffer``, the hold returned).

    Args:
        expect: the fingerprint guard (:meth:`rmmd.SharedBuffer.open`).
        writable: open it for writing (where the creator allowed writers);
            by default the mapping is read-only and a write is a CUDA error.
        strict: as ``torch.nn.Module.load_state_dict``; also refuses a
            module whose non-persistent buffers are on the meta device
            (nothing in the buffer fills them: compute them after attaching
            with ``strict=False``, or make them persistent before publishing).

    Raises:
        RuntimeError: torch's own (missing or unexpected keys, a shape that
            differs).
        InvalidArgumentError: meta tensors nothing would fill (`strict`).
        NotFoundError, PermissionError, PreconditionError: as
            :meth:`rmmd.SharedBuffer.open`.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"rmmd: attach takes a torch.nn.Module, not {type(module).__name__}")
    if strict:
        persistent = set(module.state_dict(keep_vars=True))
        unfilled = [n for n, b in module.named_buffers(remove_duplicate=False) if b.is_meta and n not in persistent]
        if unfilled:
            raise InvalidArgumentError(
                "rmmd: these buffers of the module are on the meta device and not in its state dict, so "
                "nothing in a shared buffer fills them: " + ", ".join(unfilled) + " (attach with strict=False "
                "and compute them after, or register them as persistent buffers before publishing)"
            )
    buf = _open(name, session, expect, writable)
    try:
        views = buf.tensors("torch")
        parameter_names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
        parameters: dict[int, torch.nn.Parameter] = {}
        state: dict[str, Any] = {}
        for key, view in views.items():
            if key in parameter_names:
                p = parameters.get(id(view))
                if p is None:
                    p = parameters[id(view)] = torch.nn.Parameter(view, requires_grad=False)
                state[key] = p
            else:
                state[key] = view
        module.load_state_dict(state, strict=strict, assign=True)
        # load_state_dict gives each Parameter the meta one's requires_grad.
        for p in parameters.values():
            p.requires_grad_(False)
        module._rmmd_buffer = buf
    except BaseException:
        buf.close()
        raise
    return buf

