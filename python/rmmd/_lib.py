"""Loads librmmd_c.so and declares the C ABI (include/rmmd/rmmd.h) to ctypes.

Where the library is looked for, in this order:

1. beside the package: ``rmmd/lib/librmmd_c.so`` (a wheel or a copy that
   bundles it);
2. ``$RMMD_LIBRARY``: a path to the file (or to the directory holding it);
3. the system's library path: ``librmmd_c.so`` as the dynamic loader finds it
   (``ldconfig``'s cache, ``LD_LIBRARY_PATH``), e.g. from the ``.deb``.

When none loads, :func:`load` raises an ``OSError`` that names every path it
tried and why each failed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    CFUNCTYPE,
    c_char_p,
    c_int,
    c_int64,
    c_uint,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

LIBRARY_NAMES = ("librmmd_c.so", "librmmd_c.so.0")

# rmmd_status and the enums: C ints.
status_t = c_int


class ReconnectInfo(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("previous_session_id", c_uint64),
        ("session_id", c_uint64),
        ("reconnects", c_uint32),
        ("buffers_held_again", c_uint32),
        ("buffers_unknown", c_uint32),
    ]


# rmmd_reconnect_fn: void (*)(void* user_data, rmmd_reconnect_info const* info)
reconnect_fn = CFUNCTYPE(None, c_void_p, POINTER(ReconnectInfo))


class SessionOptions(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("runtime_dir", c_char_p),
        ("client_name", c_char_p),
        ("use_grpc", c_int),
        ("import_by_fabric", c_int),
        ("call_timeout_ms", c_uint32),
        ("on_reconnect", reconnect_fn),
        ("on_reconnect_user_data", c_void_p),
        ("reconnect_ms", c_int64),
    ]


# ResourceOptions.carving_lanes: a lane per thread that allocates
# (RMMD_CARVING_LANES_AUTO).
CARVING_LANES_AUTO = 0


# ResourceOptions.capture_checks (rmmd_capture_checks).
CAPTURE_CHECKS_AUTOMATIC = 0
CAPTURE_CHECKS_EVERY_CALL = 1
CAPTURE_CHECKS_SLOW_PATH_ONLY = 2


class ResourceOptions(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("kind", c_int),
        ("device", c_int),
        ("pool", c_char_p),
        ("mode", c_int),
        ("carving_lanes", c_uint),
        ("capture_checks", c_int),
    ]


class ResourceStats(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("allocated_bytes", c_uint64),
        ("allocation_count", c_uint64),
        ("high_water_bytes", c_uint64),
        ("total_allocations", c_uint64),
        ("device", c_int),
    ]


class BufferOptions(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("pool", c_char_p),
        ("device", c_int),
        ("persistent", c_int),
        ("has_gid", c_int),
        ("gid", c_uint32),
        ("alignment", c_size_t),
        ("allow_writers", c_int),
        ("reserved_0", c_int),
        ("pin", c_int),
    ]


class OpenOptions(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("wait_ms", c_uint32),
        ("access", c_int),
        ("expect_keys", POINTER(c_char_p)),
        ("expect_values", POINTER(c_char_p)),
        ("expect_count", c_size_t),
        ("peer", c_char_p),
        ("has_device", c_int),
        ("device", c_int),
        ("exclusive", c_int),
        ("reserved_0", c_int),
        ("standby", c_int),
        ("reserved_1", c_int),
        ("pin", c_int),
    ]


def label_arrays(labels: "dict[str, str]") -> "tuple[Any, Any, int]":
    """Checked labels as the C ABI takes them: key and value arrays and
    their count (each key once: a dict cannot name one twice)."""
    if not labels:
        return None, None, 0
    keys = (c_char_p * len(labels))(*(k.encode() for k in labels))
    values = (c_char_p * len(labels))(*(v.encode() for v in labels.values()))
    return keys, values, len(labels)


# rmmd_buffer_access
BUFFER_READ = 0
BUFFER_READ_WRITE = 1
PINNING_AUTOMATIC = 0
PINNING_REQUIRED = 1
PINNING_OFF = 2

RESOURCE_DEVICE = 0
RESOURCE_HOST = 1
RESOURCE_PINNED_HOST = 2
MODE_SLAB = 0
MODE_DIRECT = 1

session_t = c_void_p
resource_t = c_void_p
buffer_t = c_void_p
stable_t = c_void_p

# rmmd_sleep_backup
SLEEP_BACKUP_NONE = 0
SLEEP_BACKUP_HOST = 1

# name: (restype, argtypes). Every function of include/rmmd/rmmd.h.
_PROTOTYPES = {
    "rmmd_version": (c_char_p, []),
    "rmmd_version_number": (c_int, []),
    "rmmd_last_error_message": (c_char_p, []),
    "rmmd_status_name": (c_char_p, [status_t]),
    "rmmd_string_free": (None, [c_void_p]),
    "rmmd_session_create": (status_t, [POINTER(SessionOptions), POINTER(session_t)]),
    "rmmd_session_destroy": (status_t, [session_t]),
    "rmmd_session_id": (status_t, [session_t, POINTER(c_uint64)]),
    "rmmd_session_reconnects": (status_t, [session_t, POINTER(c_uint32)]),
    "rmmd_session_pools_json": (status_t, [session_t, POINTER(c_void_p)]),
    "rmmd_session_stats_json": (status_t, [session_t, POINTER(c_void_p)]),
    "rmmd_resource_create": (
        status_t,
        [session_t, POINTER(ResourceOptions), POINTER(resource_t)],
    ),
    "rmmd_resource_destroy": (status_t, [resource_t]),
    "rmmd_allocate": (
        status_t,
        [resource_t, c_size_t, c_size_t, c_void_p, POINTER(c_void_p)],
    ),
    "rmmd_deallocate": (status_t, [resource_t, c_void_p, c_size_t, c_size_t, c_void_p]),
    "rmmd_resource_get_stats": (status_t, [resource_t, POINTER(ResourceStats)]),
    "rmmd_buffer_create": (
        status_t,
        [session_t, c_char_p, c_size_t, POINTER(BufferOptions), POINTER(buffer_t)],
    ),
    "rmmd_buffer_open": (status_t, [session_t, c_char_p, c_uint32, POINTER(buffer_t)]),
    "rmmd_buffer_publish": (status_t, [buffer_t]),
    "rmmd_buffer_publish_on_stream": (status_t, [buffer_t, c_void_p]),
    "rmmd_buffer_close": (status_t, [buffer_t, c_void_p]),
    "rmmd_buffer_destroy": (status_t, [buffer_t]),
    "rmmd_buffer_pointer": (status_t, [buffer_t, POINTER(c_void_p)]),
    "rmmd_buffer_size": (status_t, [buffer_t, POINTER(c_size_t)]),
    "rmmd_buffer_id": (status_t, [buffer_t, POINTER(c_uint64)]),
    "rmmd_buffer_device": (status_t, [buffer_t, POINTER(c_int)]),
    "rmmd_buffer_delete": (status_t, [session_t, c_char_p, POINTER(c_size_t)]),
    "rmmd_buffer_open_with": (
        status_t,
        [session_t, c_char_p, POINTER(OpenOptions), POINTER(buffer_t)],
    ),
    "rmmd_buffer_set_manifest_json": (status_t, [buffer_t, c_char_p]),
    "rmmd_buffer_manifest_json": (status_t, [buffer_t, POINTER(c_void_p)]),
    "rmmd_buffer_access_mode": (status_t, [buffer_t, POINTER(c_int)]),
    "rmmd_buffer_lease_generation": (status_t, [buffer_t, POINTER(c_uint64)]),
    "rmmd_buffer_wait_lease": (status_t, [buffer_t, c_int64, POINTER(c_uint64)]),
    "rmmd_buffer_holds_lease": (status_t, [buffer_t, POINTER(c_int)]),
    "rmmd_buffer_pinned": (status_t, [buffer_t, POINTER(c_int)]),
    "rmmd_buffer_list_json": (
        status_t,
        [session_t, c_char_p, POINTER(c_char_p), POINTER(c_char_p), c_size_t, POINTER(c_void_p)],
    ),
    "rmmd_buffer_list_peer_json": (
        status_t,
        [session_t, c_char_p, c_char_p, POINTER(c_char_p), POINTER(c_char_p), c_size_t, POINTER(c_void_p)],
    ),
    "rmmd_buffer_open_by_labels": (
        status_t,
        [session_t, POINTER(c_char_p), POINTER(c_char_p), c_size_t, POINTER(OpenOptions), POINTER(buffer_t)],
    ),
    "rmmd_buffer_name": (status_t, [buffer_t, POINTER(c_void_p)]),
    "rmmd_buffer_describe_json": (status_t, [session_t, c_char_p, POINTER(c_void_p)]),
    "rmmd_peers_json": (status_t, [session_t, POINTER(c_void_p)]),
    "rmmd_torch_malloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "rmmd_torch_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
    "rmmd_torch_allocate": (status_t, [c_size_t, c_int, c_void_p, POINTER(c_void_p)]),
    "rmmd_torch_configure": (status_t, [c_char_p, c_int]),
    "rmmd_torch_get_stats": (status_t, [c_int, POINTER(ResourceStats)]),
    "rmmd_stable_resource_create": (status_t, [session_t, c_int, c_char_p, c_char_p, POINTER(stable_t)]),
    "rmmd_stable_resource_destroy": (status_t, [stable_t]),
    "rmmd_stable_allocate": (status_t, [stable_t, c_size_t, c_char_p, POINTER(c_void_p)]),
    "rmmd_stable_deallocate": (status_t, [stable_t, c_void_p, c_size_t, c_void_p]),
    "rmmd_stable_set_thread_tag": (status_t, [c_char_p]),
    "rmmd_stable_sleep": (
        status_t,
        [stable_t, POINTER(c_char_p), c_size_t, c_int, c_char_p, c_void_p, POINTER(c_uint64)],
    ),
    "rmmd_stable_wake": (status_t, [stable_t, POINTER(c_char_p), c_size_t, c_uint32, c_void_p, POINTER(c_uint64)]),
    "rmmd_stable_restore": (status_t, [stable_t, c_char_p, c_uint32, c_void_p, POINTER(c_void_p)]),
    "rmmd_stable_read_backup": (status_t, [stable_t, c_void_p, c_size_t, c_void_p, POINTER(c_size_t)]),
    "rmmd_stable_keep_backups": (status_t, [stable_t, c_int]),
    "rmmd_stable_drop_backups": (status_t, [session_t, c_char_p, POINTER(c_uint64)]),
    "rmmd_stable_sleepers_json": (status_t, [session_t, POINTER(c_void_p)]),
    "rmmd_torch_stable_malloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "rmmd_torch_stable_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
    "rmmd_torch_stable_resource": (status_t, [c_int, POINTER(stable_t)]),
    "rmmd_torch_stable_devices": (status_t, [POINTER(c_uint64)]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None


def _candidates() -> list[tuple[str, str]]:
    """(what, path or name) in the order they are tried."""
    out: list[tuple[str, str]] = []
    bundled = Path(__file__).resolve().parent / "lib"
    for name in LIBRARY_NAMES:
        out.append(("beside the package", str(bundled / name)))
    env = os.environ.get("RMMD_LIBRARY")
    if env:
        p = Path(env)
        if p.is_dir():
            for name in LIBRARY_NAMES:
                out.append(("$RMMD_LIBRARY", str(p / name)))
        else:
            out.append(("$RMMD_LIBRARY", env))
    else:
        out.append(("$RMMD_LIBRARY", ""))
    found = ctypes.util.find_library("rmmd_c")
    if found:
        out.append(("the system's library path (ldconfig)", found))
    for name in LIBRARY_NAMES:
        out.append(("the system's library path", name))
    return out


def _loaded_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the dynamic loader mapped for `lib` (what PyTorch must dlopen
    to share its state): read from /proc/self/maps."""
    if os.path.isabs(fallback):
        return os.path.realpath(fallback)
    addr = ctypes.cast(lib.rmmd_version, c_void_p).value or 0
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) < 6:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi:
                    return os.path.realpath(parts[5])
    except OSError:
        pass
    return fallback


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> ctypes.CDLL:
    """librmmd_c, loaded once per process, its functions declared."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried: list[str] = []
        for what, candidate in _candidates():
            if not candidate:
                tried.append(f"  {what}: not set")
                continue
            if os.path.isabs(candidate) and not os.path.exists(candidate):
                tried.append(f"  {candidate} ({what}): no such file")
                continue
            try:
                lib = ctypes.CDLL(candidate)
            except OSError as e:
                tried.append(f"  {candidate} ({what}): {e}")
                continue
            try:
                _declare(lib)
            except AttributeError as e:
                tried.append(f"  {candidate} ({what}): not rmmd's C library ({e})")
                continue
            _path = _loaded_path(lib, candidate)
            _lib = lib
            return lib
        raise OSError(
            "rmmd: cannot load librmmd_c.so; tried:\n"
            + "\n".join(tried)
            + "\nInstall rmmd (its .deb puts librmmd_c.so on the system's library "
            "path), or set RMMD_LIBRARY to the library's path (a build tree has "
            "it at build/client/librmmd_c.so)."
        )


def path() -> str:
    """The path of the loaded librmmd_c.so (loading it if need be)."""
    load()
    assert _path is not None
    return _path


def take_string(ptr: int | None) -> str:
    """A string an rmmd function returned (malloc'd), freed here."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", errors="replace")
    finally:
        load().rmmd_string_free(ptr)

