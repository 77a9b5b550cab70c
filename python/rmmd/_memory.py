"""What allocations and shared buffers have in common: how their memory is
handed to other libraries (the buffer protocol and ``__array_interface__``
for host memory; ``__cuda_array_interface__`` for device memory; DLPack for
both), without a copy and without letting the memory go while they use it."""

from __future__ import annotations

import ctypes
from typing import Any

from . import _cuda, _dlpack
from ._common import stream_handle
from ._errors import InvalidArgumentError


class Memory:
    """Bytes lent by rmmd: a 1-D array of ``nbytes`` unsigned bytes at ``ptr``.

    Host memory (``device == -1``) is seen through the buffer protocol
    (``memoryview(m)`` on Python 3.12+, :meth:`memoryview` everywhere),
    ``__array_interface__`` (so ``numpy.asarray(m)`` works on every Python)
    and DLPack (``numpy.from_dlpack(m)``). Device memory is seen through
    ``__cuda_array_interface__`` (version 3) and DLPack
    (``torch.from_dlpack(m)``, ``cupy.from_dlpack(m)``). Every view keeps
    this object alive.
    """

    # Set by subclasses.
    _ptr: int = 0
    _nbytes: int = 0
    _device: int = -1
    # The stream the memory is ready on, where it is not ready on every
    # stream (None: ready everywhere).
    _ready_stream: int | None = None
    # Capsules and consumer tensors made by __dlpack__ and still alive.
    _exports: int = 0
    # Mapped read-only (a shared buffer opened for reading): host views say
    # so (a write would be a segmentation fault, not an exception).
    _read_only: bool = False

    # -- subclasses provide -------------------------------------------------

    def _live(self) -> bool:
        raise NotImplementedError

    def _require_live(self) -> None:
        if not self._live():
            raise InvalidArgumentError(f"rmmd: this {type(self).__name__} was freed or closed")

    def _dlpack_released(self) -> None:
        self._exports -= 1

    # -- what it is ---------------------------------------------------------

    @property
    def ptr(self) -> int:
        """The address of the first byte (0 for an empty one)."""
        return self._ptr

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def device(self) -> int:
        """This process's CUDA ordinal of the memory's GPU; -1 for host memory."""
        return self._device

    @property
    def is_host(self) -> bool:
        return self._device < 0

    def __len__(self) -> int:
        return self._nbytes

    # -- host memory --------------------------------------------------------

    def memoryview(self) -> memoryview:
        """A memoryview of the bytes (host memory only), read-only where the
        memory is mapped read-only; it keeps this object alive."""
        if not self.is_host:
            raise TypeError(
                f"rmmd: this {type(self).__name__} is device memory: use "
                "__cuda_array_interface__ or DLPack (torch.from_dlpack, cupy.from_dlpack)"
            )
        self._require_live()
        array = (ctypes.c_ubyte * self._nbytes).from_address(self._ptr) if self._nbytes else (
            ctypes.c_ubyte * 0
        )()
        array._rmmd_owner = self  # type: ignore[attr-defined]
        view = memoryview(array).cast("B")
        return view.toreadonly() if self._read_only else view

    def __buffer__(self, flags: int) -> memoryview:  # PEP 688 (Python 3.12+)
        return self.memoryview()

    @property
    def __array_interface__(self) -> dict[str, Any]:
        if not self.is_host:
            raise AttributeError("__array_interface__ (device memory has __cuda_array_interface__)")
        self._require_live()
        return {
            "shape": (self._nbytes,),
            "typestr": "|u1",
            "data": (self._ptr, self._read_only),
            "version": 3,
        }

    # -- device memory ------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self.is_host:
            raise AttributeError("__cuda_array_interface__ (host memory has __array_interface__)")
        self._require_live()
        stream = self._ready_stream
        return {
            "shape": (self._nbytes,),
            "typestr": "|u1",
            "data": (self._ptr, False),
            "version": 3,
            "strides": None,
            # CUDA Array Interface v3: None, no synchronisation needed; else
            # the stream the data is ready on (1: the legacy default stream,
            # never 0).
            "stream": None if stream is None else (stream or 1),
        }

    # -- DLPack -------------------------------------------------------------

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.is_host:
            return (_dlpack.kDLCPU, 0)
        return (_dlpack.kDLCUDA, self._device)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """A DLPack capsule over the bytes (a 1-D uint8 tensor), as the
        Python array API standard specifies: `stream` is the consumer's
        (None: the legacy default stream; -1: no ordering); work the
        consumer queues on it is ordered after the stream this memory is
        ready on. rmmd shares memory and never copies (`copy=True` and a
        different `dl_device` raise BufferError)."""
        self._require_live()
        if copy:
            raise BufferError("rmmd: __dlpack__ shares memory; it does not copy (copy=True)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"rmmd: the memory is on {self.__dlpack_device__()}, not on {tuple(dl_device)}"
            )
        if not self.is_host and self._ready_stream is not None and stream != -1:
            consumer = 1 if stream is None else stream_handle(stream) or 1
            _cuda.order_after(consumer, self._ready_stream or 1, self._device)
        device_type, device_id = self.__dlpack_device__()
        self._exports += 1
        return _dlpack.export(
            self,
            self._ptr,
            self._nbytes,
            device_type,
            device_id,
            versioned=_dlpack.wants_versioned(max_version),
            # Host memory mapped read-only says so (NumPy makes its array
            # read-only); device memory does not: the GPU enforces it, and a
            # consumer that refuses read-only tensors could not take it.
            read_only=self._read_only and self.is_host,
        )
