"""Shared buffers as JAX arrays, without a copy: each tensor of a buffer's
manifest handed to ``jax.dlpack.from_dlpack`` as a DLPack tensor of its own
(its dtype, shape and strides, on the buffer's GPU).

    import rmmd.jax
    params = rmmd.jax.attach("llama3/rank0", expect={"revision": "abc"})
    params["model.embed_tokens.weight"]          # a jax.Array on the buffer's device

What JAX cannot do, and where a copy would be forced:

- JAX has no read-only arrays: a buffer opened for reading is mapped
  read-only by the GPU, which JAX does not know. JAX never writes an input
  in place unless it is donated (``jax.jit(..., donate_argnums=...)``); a
  donated attached array makes XLA write into the read-only mapping, which
  fails with a CUDA error in that process. Do not donate them.
- XLA takes only dense row-major arrays (and, on GPU, memory it may treat
  as aligned): a tensor stored with other strides (a transposed weight
  from ``rmmd.torch.publish``), or at an offset that is not a multiple of
  its element size, is not zero-copy. ``copy=False`` (the default) raises
  for such a tensor, naming it; ``copy=True`` lets JAX copy those (and says
  which in the result's ``copied``). Buffers from
  ``rmmd.safetensors.publish_dir`` hold dense row-major tensors, at their
  files' offsets or at multiples of 256 bytes (``keep_layout=False``).
- bfloat16 and float8 need JAX's ``ml_dtypes`` (JAX ships it). 64-bit
  types (int64, uint64, float64, complex128: a checkpoint's ``position_ids``)
  need ``jax_enable_x64`` (``jax.config.update("jax_enable_x64", True)`` or
  ``JAX_ENABLE_X64=1``): without it JAX converts them to 32 bits, a copy, so
  ``copy=False`` raises naming the tensor and the three ways out (enable
  64-bit types, leave the tensor out with ``names``, or ``copy=True``).
- The arrays keep the buffer open (its hold is released when the last one
  is collected).

This module imports without JAX; its functions need it.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_int64
from typing import Any, Iterable, Mapping

from . import _dlpack
from ._buffer import SharedBuffer
from ._errors import InvalidArgumentError
from ._manifest import TensorEntry
from ._session import Session
from ._views import select

__all__ = ["attach", "arrays", "Attached"]

# What JAX converts to 32 bits unless jax_enable_x64 is on.
_WIDE = frozenset({"int64", "uint64", "float64", "complex128"})

# DLPack's type codes (dlpack.h, DLDataTypeCode).
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat, _kDLComplex, _kDLBool = 0, 1, 2, 4, 5, 6
_kDLFloat8_e4m3fn, _kDLFloat8_e5m2 = 10, 12
_CODES: dict[str, tuple[int, int]] = {
    "bool": (_kDLBool, 8),
    "uint8": (_kDLUInt, 8),
    "int8": (_kDLInt, 8),
    "uint16": (_kDLUInt, 16),
    "int16": (_kDLInt, 16),
    "float16": (_kDLFloat, 16),
    "bfloat16": (_kDLBfloat, 16),
    "uint32": (_kDLUInt, 32),
    "int32": (_kDLInt, 32),
    "float32": (_kDLFloat, 32),
    "uint64": (_kDLUInt, 64),
    "int64": (_kDLInt, 64),
    "float64": (_kDLFloat, 64),
    "float8_e4m3fn": (_kDLFloat8_e4m3fn, 8),
    "float8_e5m2": (_kDLFloat8_e5m2, 8),
    "complex64": (_kDLComplex, 64),
    "complex128": (_kDLComplex, 128),
}


class _Tensor:
    """One manifest entry of a buffer as a DLPack producer (what
    ``jax.dlpack.from_dlpack`` takes): the buffer's hold is counted as an
    export while JAX's array lives."""

    def __init__(self, buf: SharedBuffer, entry: TensorEntry) -> None:
        self._buf = buf
        self._entry = entry

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._buf.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> object:
        buf, t = self._buf, self._entry
        if copy:
            raise BufferError("rmmd: __dlpack__ shares memory; it does not copy (copy=True)")
        # The whole buffer's capsule orders the consumer's stream after the
        # buffer's and counts the export; it is then narrowed to this tensor.
        whole = buf.__dlpack__(stream=stream, max_version=max_version)
        return _narrow(whole, buf, t)


def _narrow(capsule: object, buf: SharedBuffer, t: TensorEntry) -> object:
    """Rewrites the 1-D uint8 DLPack tensor of the whole buffer in `capsule`
    (made by rmmd._dlpack.export, not yet consumed) as tensor `t`."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = get_name(capsule)
    address = get_pointer(capsule, name)
    entry = _dlpack._live[address]
    managed = entry[0]
    tensor = managed.dl_tensor
    code, bits = _CODES[t.dtype]
    shape = (c_int64 * max(len(t.shape), 1))(*t.shape)
    strides = (c_int64 * max(len(t.shape), 1))(*t.element_strides)
    tensor.ndim = len(t.shape)
    tensor.dtype = _dlpack.DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(shape, POINTER(c_int64))
    tensor.strides = ctypes.cast(strides, POINTER(c_int64))
    tensor.data = (buf.ptr + t.offset) or None
    tensor.byte_offset = 0
    _dlpack._live[address] = (*entry, shape, strides)  # kept until the deleter runs
    return capsule


class Attached(dict):  # type: ignore[type-arg]
    """name (and alias) -> jax.Array, plus ``buffer`` (the SharedBuffer)
    and ``copied`` (the names JAX copied instead of sharing; empty with
    ``copy=False``)."""

    buffer: SharedBuffer
    copied: list[str]


def _x64_enabled(jax: Any) -> bool:
    """Whether JAX keeps 64-bit types (jax_enable_x64), as its dtype
    canonicalisation says."""
    import numpy

    return bool(jax.dtypes.canonicalize_dtype(numpy.int64) == numpy.int64)


def arrays(buf: SharedBuffer, names: Iterable[str] | None = None, copy: bool = False) -> Attached:
    """The manifest's tensors of the open buffer `buf` as jax.Arrays on its
    device (see the module's text for when a copy is forced)."""
    import jax
    import jax.dlpack

    if buf.is_host:
        raise InvalidArgumentError(f"rmmd: {buf!r} is host memory; rmmd.jax attaches device buffers")
    device = next((d for d in jax.devices() if d.platform == "gpu" and d.local_hardware_id == buf.device), None)
    if device is None:
        raise InvalidArgumentError(f"rmmd: JAX sees no GPU with CUDA ordinal {buf.device} (jax.devices(): "
                                   f"{jax.devices()})")
    out = Attached()
    out.buffer = buf
    out.copied = []
    manifest = select(buf.manifest, names)
    x64 = _x64_enabled(jax)
    for t in manifest.tensors:
        if t.dtype in _WIDE and not x64:
            if not copy:
                raise InvalidArgumentError(
                    f"rmmd: tensor '{t.name}' of buffer '{buf.name}' is {t.dtype} and JAX's 64-bit types are off: "
                    "JAX would convert it to 32 bits, a copy (enable them with "
                    "jax.config.update('jax_enable_x64', True) or JAX_ENABLE_X64=1, leave the tensor out with "
                    "names=..., or pass copy=True)"
                )
            out.copied.append(t.name)
        dense = t.strides is None or t.strides == t.contiguous_strides
        aligned = (buf.ptr + t.offset) % t.itemsize == 0
        if not (dense and aligned) and t.name not in out.copied:
            if not copy:
                raise InvalidArgumentError(
                    f"rmmd: tensor '{t.name}' of buffer '{buf.name}' is "
                    + ("not dense row-major" if not dense else "at an offset its element size does not divide")
                    + ": JAX would copy it (pass copy=True to let it)"
                )
            out.copied.append(t.name)
        array = jax.dlpack.from_dlpack(_Tensor(buf, t), device=device, copy=None if copy else False)
        if not copy and t.numel and array.unsafe_buffer_pointer() != buf.ptr + t.offset:
            raise InvalidArgumentError(f"rmmd: JAX copied tensor '{t.name}' of buffer '{buf.name}' (copy=False)")
        for n in t.names:
            out[n] = array
    return out


def attach(
    name: str,
    *,
    session: Session | None = None,
    expect: Mapping[str, str] | None = None,
    names: Iterable[str] | None = None,
    copy: bool = False,
    wait: float = 0.0,
) -> Attached:
    """Opens the published buffer `name` (read-only, with the labels guard
    `expect`) and returns its tensors as jax.Arrays, zero-copy (see the
    module's text); the buffer stays open while any array lives."""
    s = session if session is not None else Session(client_name="rmmd.jax")
    buf = SharedBuffer.open(s, name, wait=wait, expect=expect)
    try:
        result = arrays(buf, names, copy)
    except BaseException:
        buf.close()
        raise
    buf.close()  # happens when the last array goes (the arrays hold DLPack exports)
    return result
