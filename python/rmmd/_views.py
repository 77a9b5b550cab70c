"""The tensors of a manifest as zero-copy views of one buffer, for PyTorch,
CuPy and NumPy: one array of the whole buffer's bytes, made through DLPack
(so the buffer stays open while it lives: close() waits for it), then per
tensor a slice of its bytes viewed as its dtype with its shape and strides.
Every view holds that one array."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterable

from ._errors import InvalidArgumentError, NotFoundError
from ._manifest import Manifest, TensorEntry

if TYPE_CHECKING:
    from ._memory import Memory

FRAMEWORKS = ("torch", "cupy", "numpy")

# dtype name -> the torch.dtype attribute
_TORCH = {
    "bool": "bool",
    "uint8": "uint8",
    "int8": "int8",
    "uint16": "uint16",
    "int16": "int16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "uint32": "uint32",
    "int32": "int32",
    "float32": "float32",
    "uint64": "uint64",
    "int64": "int64",
    "float64": "float64",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "complex64": "complex64",
    "complex128": "complex128",
}

# The manifest's dtypes NumPy lacks, which the ml_dtypes package adds.
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def default_framework(memory: "Memory") -> str:
    """torch where this process imported it, else cupy for device memory
    and numpy for host memory."""
    if "torch" in sys.modules:
        return "torch"
    return "numpy" if memory.is_host else "cupy"


def torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, _TORCH[name], None)
    if dtype is None:
        raise InvalidArgumentError(f"rmmd: this PyTorch ({torch.__version__}) has no torch.{_TORCH[name]}")
    return dtype


def numpy_dtype(name: str) -> Any:
    import numpy as np

    if name in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise InvalidArgumentError(
                f"rmmd: NumPy has no {name}; install ml_dtypes (pip install ml-dtypes) to get "
                f"{name} arrays, or use framework='torch'"
            ) from None
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _torch_views(memory: "Memory", manifest: Manifest) -> dict[str, Any]:
    import torch
    import torch.utils.dlpack

    if memory.is_host:
        capsule = memory.__dlpack__()
    else:
        # Ordered after the buffer's stream on this thread's current stream,
        # as torch.from_dlpack would ask; an unversioned capsule, which every
        # PyTorch takes (read-only CUDA mappings are enforced by the GPU).
        stream = torch.cuda.current_stream(memory.device).cuda_stream
        capsule = memory.__dlpack__(stream=stream or None)
    base = torch.utils.dlpack.from_dlpack(capsule)

    def view(t: TensorEntry) -> Any:
        dtype = torch_dtype(t.dtype)
        raw = base[t.offset : t.offset + t.extent]
        return raw.view(dtype).as_strided(t.shape, t.element_strides)

    return _each(manifest, view)


def _cupy_views(memory: "Memory", manifest: Manifest) -> dict[str, Any]:
    if memory.is_host:
        raise InvalidArgumentError(
            f"rmmd: {memory!r} is host memory; CuPy arrays are device memory "
            "(use framework='numpy' or 'torch')"
        )
    import cupy

    with cupy.cuda.Device(memory.device):
        base = cupy.from_dlpack(memory)  # ordered after the buffer's stream

    def view(t: TensorEntry) -> Any:
        dtype = numpy_dtype(t.dtype)
        raw = base[t.offset : t.offset + t.extent].view(dtype)
        strides = tuple(s * dtype.itemsize for s in t.element_strides)
        return cupy.lib.stride_tricks.as_strided(raw, shape=t.shape, strides=strides)

    return _each(manifest, view)


def _numpy_views(memory: "Memory", manifest: Manifest) -> dict[str, Any]:
    if not memory.is_host:
        raise InvalidArgumentError(
            f"rmmd: {memory!r} is device memory; NumPy arrays are host memory "
            "(use framework='torch' or 'cupy')"
        )
    import numpy as np

    base = np.from_dlpack(memory)
    if memory._read_only and base.flags.writeable:  # a NumPy older than DLPack 1.0
        base.flags.writeable = False
    writeable = bool(base.flags.writeable)

    def view(t: TensorEntry) -> Any:
        dtype = numpy_dtype(t.dtype)
        raw = base[t.offset : t.offset + t.extent].view(dtype)
        strides = tuple(s * dtype.itemsize for s in t.element_strides)
        return np.lib.stride_tricks.as_strided(raw, shape=t.shape, strides=strides, writeable=writeable)

    return _each(manifest, view)


def _each(manifest: Manifest, view: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in manifest.tensors:
        v = view(t)
        for n in t.names:
            out[n] = v
    return out


def select(manifest: Manifest, names: Iterable[str] | None) -> Manifest:
    """The part of `manifest` with the tensors named in `names` (a name or an
    alias: the tensor comes with all its names); None: all of it."""
    if names is None:
        return manifest
    if isinstance(names, str):
        names = (names,)
    wanted = set()
    for n in names:
        if n not in manifest:
            raise NotFoundError(f"rmmd: the buffer holds no tensor named '{n}'")
        wanted.add(manifest[n].name)
    return Manifest(tuple(t for t in manifest.tensors if t.name in wanted), manifest.labels)


def tensor_views(memory: "Memory", manifest: Manifest, framework: str | None) -> dict[str, Any]:
    """name (and alias) -> a view of `memory` for each tensor of `manifest`."""
    if framework is None:
        framework = default_framework(memory)
    if framework not in FRAMEWORKS:
        raise InvalidArgumentError(
            f"rmmd: framework is one of {', '.join(FRAMEWORKS)} (or None), not {framework!r}"
        )
    for t in manifest.tensors:
        if t.extent and t.offset + t.extent > memory.nbytes:
            raise InvalidArgumentError(
                f"rmmd: tensor '{t.name}' runs past the buffer ({t.offset} + {t.extent} > {memory.nbytes} bytes)"
            )
    if not manifest.tensors:
        return {}
    return {"torch": _torch_views, "cupy": _cupy_views, "numpy": _numpy_views}[framework](memory, manifest)
