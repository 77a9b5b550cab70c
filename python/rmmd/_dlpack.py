"""DLPack export in pure ctypes: a PyCapsule holding a DLManagedTensor (or a
DLManagedTensorVersioned, DLPack 1.x) over memory rmmd owns.

Lifetimes: the object that owns the memory (a SharedBuffer, an allocation)
stays alive while any capsule or tensor made from it lives: a registry keyed
by the managed tensor's address holds it, and the deleter (called by the
consumer when its tensor goes, or by the capsule's destructor when nobody
consumed it) drops that reference and tells the owner.
"""

from __future__ import annotations

import ctypes
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64
from ctypes import c_uint8, c_uint16, c_uint32, c_uint64, c_void_p, py_object
from typing import Any, Protocol

kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLUInt = 1

# The newest DLPack version this module writes.
VERSION = (1, 0)
FLAG_READ_ONLY = 1 << 0


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
        ("flags", c_uint64),
        ("dl_tensor", DLTensor),
    ]


class Owner(Protocol):
    def _dlpack_released(self) -> None: ...


# address of a managed tensor -> (the ctypes struct, its shape array, owner)
_live: dict[int, tuple[Structure, Any, Owner]] = {}


def _release(address: int, _live: dict = _live) -> None:  # type: ignore[type-arg]
    entry = _live.pop(address, None)
    if entry is not None:
        entry[2]._dlpack_released()


# The callbacks below may run while the interpreter exits (a tensor freed
# then): they reach what they need through default arguments, not module
# globals, and never let an exception out (ctypes would print it).
_DELETER_T = CFUNCTYPE(None, c_void_p)


@_DELETER_T
def _deleter(address: int | None, _release: Any = _release) -> None:  # called by the consumer
    try:
        if address:
            _release(address)
    except BaseException:  # noqa: BLE001
        pass


_DELETER_ADDRESS = ctypes.cast(_deleter, c_void_p).value

# The capsule names must outlive every capsule: module-level C strings.
_NAME_BUF = ctypes.create_string_buffer(b"dltensor")
_NAME_VERSIONED_BUF = ctypes.create_string_buffer(b"dltensor_versioned")
_NAME = c_char_p(ctypes.addressof(_NAME_BUF))
_NAME_VERSIONED = c_char_p(ctypes.addressof(_NAME_VERSIONED_BUF))

_api = ctypes.pythonapi
_capsule_new = _api.PyCapsule_New
_capsule_new.restype = py_object
_capsule_new.argtypes = [c_void_p, c_char_p, c_void_p]
# The destructor gets the capsule while it is being destroyed: as a raw
# address (a py_object would take a reference to a dying object).
_capsule_is_valid = _api.PyCapsule_IsValid
_capsule_is_valid.restype = c_int
_capsule_is_valid.argtypes = [c_void_p, c_char_p]
_capsule_get_pointer = _api.PyCapsule_GetPointer
_capsule_get_pointer.restype = c_void_p
_capsule_get_pointer.argtypes = [c_void_p, c_char_p]

_DESTRUCTOR_T = CFUNCTYPE(None, c_void_p)


@_DESTRUCTOR_T
def _capsule_destructor(
    capsule: int | None,
    _names: tuple = (_NAME, _NAME_VERSIONED),  # type: ignore[type-arg]
    _is_valid: Any = _capsule_is_valid,
    _get_pointer: Any = _capsule_get_pointer,
    _release: Any = _release,
) -> None:
    # A consumer that took the tensor renamed the capsule ("used_dltensor"):
    # then the tensor is the consumer's to delete. Otherwise nobody took it.
    try:
        if not capsule:
            return
        for name in _names:
            if _is_valid(capsule, name):
                _release(_get_pointer(capsule, name))
                return
    except BaseException:  # noqa: BLE001
        pass


_DESTRUCTOR_ADDRESS = ctypes.cast(_capsule_destructor, c_void_p).value


def wants_versioned(max_version: Any) -> bool:
    """Whether a consumer that passed `max_version` reads DLPack 1.x."""
    if max_version is None:
        return False
    try:
        return int(max_version[0]) >= 1
    except (TypeError, ValueError, IndexError):
        return False


def export(
    owner: Owner,
    ptr: int,
    nbytes: int,
    device_type: int,
    device_id: int,
    versioned: bool = False,
    read_only: bool = False,
) -> object:
    """A DLPack capsule over `nbytes` bytes at `ptr` (a 1-D uint8 tensor),
    keeping `owner` alive until the consumer's tensor (or the capsule) goes;
    then ``owner._dlpack_released()`` is called."""
    shape = (c_int64 * 1)(nbytes)
    tensor = DLTensor(
        data=ptr or None,
        device=DLDevice(device_type, device_id),
        ndim=1,
        dtype=DLDataType(kDLUInt, 8, 1),
        shape=ctypes.cast(shape, POINTER(c_int64)),
        strides=None,
        byte_offset=0,
    )
    managed: Structure
    if versioned:
        managed = DLManagedTensorVersioned(
            version=DLPackVersion(*VERSION),
            manager_ctx=None,
            deleter=_DELETER_ADDRESS,
            flags=FLAG_READ_ONLY if read_only else 0,
            dl_tensor=tensor,
        )
        name = _NAME_VERSIONED
    else:
        managed = DLManagedTensor(dl_tensor=tensor, manager_ctx=None, deleter=_DELETER_ADDRESS)
        name = _NAME
    address = ctypes.addressof(managed)
    _live[address] = (managed, shape, owner)
    try:
        return _capsule_new(address, name, _DESTRUCTOR_ADDRESS)
    except BaseException:
        _release(address)
        raise


def live_exports() -> int:
    """How many capsules or consumer tensors are alive (for tests)."""
    return len(_live)
