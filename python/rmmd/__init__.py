"""rmmd from Python: sessions with the node's rmmd daemon, host and device
memory lent by it, named shared buffers, and allocators for PyTorch and CuPy.

Pure Python over rmmd's C ABI (``librmmd_c.so``, loaded with ctypes): one
package serves every Python 3 version. ``docs/python.md`` is the guide.

    import rmmd, numpy
    with rmmd.Session(client_name="example") as session:
        host = session.host_resource()
        a = host.allocation(1 << 20)
        numpy.asarray(a)[:4] = [1, 2, 3, 4]      # the shared memory, no copy

Framework allocators live in their own modules, imported when asked for:
``rmmd.allocators.torch`` and ``rmmd.allocators.cupy``; so do the helpers
that share model weights: ``rmmd.torch`` (publish, attach, load_state_dict)
and ``rmmd.safetensors`` (publish_file).
"""

from __future__ import annotations

from . import _lib
from ._buffer import SharedBuffer
from ._errors import (
    AlreadyExistsError,
    DeadlineError,
    Error,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfMemoryError,
    PermissionError,
    PreconditionError,
    SessionError,
    Status,
)
from ._manifest import BufferInfo, LeaseInfo, Manifest, TensorEntry
from ._memory import Memory
from ._resource import (
    Allocation,
    DeviceAllocation,
    DeviceResource,
    HostAllocation,
    HostResource,
    MemoryResource,
    ResourceStats,
)
from ._session import PeerInfo, Pool, ReconnectInfo, Session

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "Allocation",
    "BufferInfo",
    "DeadlineError",
    "DeviceAllocation",
    "DeviceResource",
    "Error",
    "HostAllocation",
    "HostResource",
    "InternalError",
    "InvalidArgumentError",
    "LeaseInfo",
    "Manifest",
    "Memory",
    "MemoryResource",
    "NotFoundError",
    "OutOfMemoryError",
    "PeerInfo",
    "PermissionError",
    "Pool",
    "PreconditionError",
    "ReconnectInfo",
    "ResourceStats",
    "Session",
    "SessionError",
    "SharedBuffer",
    "Status",
    "TensorEntry",
    "library_path",
    "library_version",
]


def library_path() -> str:
    """The path of the librmmd_c.so this package loaded."""
    return _lib.path()


def library_version() -> str:
    """The loaded librmmd_c.so's version ("0.1.0")."""
    return _lib.load().rmmd_version().decode()

# Public classes show as rmmd.X (in tracebacks, reprs and docs), not as the
# private module that defines them.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
