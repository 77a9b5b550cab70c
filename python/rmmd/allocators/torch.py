"""PyTorch over rmmd: device memory for tensors from the node's daemon.

Three ways, from the most to the least recommended:

1. A ``torch.cuda.MemPool`` over rmmd (:func:`rmmd_mem_pool`, entered with
   :func:`use_mem_pool`): PyTorch's own caching allocator works on top of
   rmmd's memory for what is allocated inside the block; the rest of the
   process keeps PyTorch's default allocator. PyTorch's caching, its
   statistics (``torch.cuda.memory_stats``), ``empty_cache`` and its
   out-of-memory error all keep working.
2. rmmd as the whole process's allocator (:func:`use_rmmd_as_allocator`,
   before the first CUDA allocation): every tensor comes from rmmd, with
   rmmd's slab mode as the only cache. ``torch.cuda.memory_stats`` does not
   work then; :func:`memory_stats` reports what PyTorch allocated.
3. Shared buffers as tensors (``torch.from_dlpack(rmmd.SharedBuffer...)``),
   beside either of the above or alone.

And a ``torch.cuda.MemPool`` over address-stable memory
(:func:`stable_mem_pool`): its segments keep their addresses while they
sleep and wake by tag (:func:`stable_tag`, :func:`stable_resource`); what
``rmmd.memory_saver`` (torch_memory_saver's API) is built on.

Both allocators go through rmmd's C ABI (``rmmd_torch_malloc`` and
``rmmd_torch_free`` of librmmd_c.so, loaded by
``torch.cuda.memory.CUDAPluggableAllocator``): one process-wide session
(client name ``torch``) and one resource per device, made at the first
allocation; the process's exit prints nothing and the daemon reclaims what
the session held. The whole-process way allocates through a few lines of
C++ built on the node against this PyTorch (:func:`build_oom_shim`), the
only way to raise ``torch.OutOfMemoryError`` from outside PyTorch.

This module imports without PyTorch; its functions need it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator

from .. import _lib
from .._errors import InvalidArgumentError, PreconditionError, Status, check
from .._resource import mode_value

ALLOC_FN_NAME = "rmmd_torch_malloc"
# The whole process's allocator: PyTorch does not check the pointer there, so
# it must raise instead of returning NULL. The shim built on the node raises
# torch.OutOfMemoryError; without it, librmmd_c.so's raising malloc throws a
# std::runtime_error, RuntimeError in Python.
OOM_ALLOC_FN_NAME = "rmmd_torch_malloc_oom"
RAISING_ALLOC_FN_NAME = "rmmd_torch_malloc_or_raise"
FREE_FN_NAME = "rmmd_torch_free"
STABLE_ALLOC_FN_NAME = "rmmd_torch_stable_malloc"
STABLE_FREE_FN_NAME = "rmmd_torch_stable_free"
_SHIM_SOURCE = Path(__file__).with_name("_torch_oom.cpp")

_lock = threading.Lock()
_configured: tuple[str | None, int] | None = None
_allocator: Any = None
_raising_allocator: Any = None  # the whole process's (use_rmmd_as_allocator)
_default_pool: Any = None
_stable_allocator: Any = None
_stable_resources: dict[int, Any] = {}  # device -> rmmd._stable.StableResource
_thread = threading.local()  # .tag: the calling thread's stable tag (None: "default")


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ModuleNotFoundError(
            f"rmmd.allocators.torch needs PyTorch, which does not import here ({e})"
        ) from e
    return torch


def library_path() -> str:
    """The librmmd_c.so that PyTorch loads (the one this package loaded)."""
    return _lib.path()


def configure(runtime_dir: str | os.PathLike[str] | None = None, mode: str | None = None) -> None:
    """Chooses the daemon and the mode of the process-wide session that
    PyTorch's allocations go through; must come before the first of them
    (the functions below call it).

    Args:
        runtime_dir: the daemon's runtime directory; ``None``:
            ``$RMMD_RUNTIME_DIR``, else ``/run/rmmd``.
        mode: ``"slab"`` (carve allocations out of leased slabs in this
            process: as fast as PyTorch's own allocator) or ``"direct"`` (one
            daemon allocation per tensor: a round trip each, for few large
            tensors); ``None``: ``$RMMD_TORCH_MODE``, else slab.

    Raises:
        PreconditionError: PyTorch already allocated through rmmd with other
            settings.
        InvalidArgumentError: an unknown mode.
    """
    global _configured
    if runtime_dir is None and mode is None:
        return  # the environment decides, at the first allocation
    m = mode_value(mode if mode is not None else os.environ.get("RMMD_TORCH_MODE") or "slab")
    want = (None if runtime_dir is None else os.fspath(runtime_dir), m)
    with _lock:
        if _configured == want:
            return
        lib = _lib.load()
        status = lib.rmmd_torch_configure(None if want[0] is None else want[0].encode(), m)
        if status == Status.FAILED_PRECONDITION:
            raise PreconditionError(
                "rmmd: PyTorch has allocated through rmmd already"
                + ("" if _configured is None else f" with runtime_dir={_configured[0]!r}")
                + "; its daemon and mode are set: configure rmmd before the first allocation",
                status=Status.FAILED_PRECONDITION,
            )
        check(status)
        _configured = want


def rmmd_allocator() -> Any:
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over rmmd (one per
    process)."""
    global _allocator
    torch = _torch()
    with _lock:
        if _allocator is None:
            _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                library_path(), ALLOC_FN_NAME, FREE_FN_NAME
            )
        return _allocator


def rmmd_mem_pool(
    runtime_dir: str | os.PathLike[str] | None = None, mode: str | None = None, **kwargs: Any
) -> Any:
    """A ``torch.cuda.MemPool`` whose memory comes from rmmd, with PyTorch's
    caching allocator on top::

        pool = rmmd_mem_pool()
        with use_mem_pool(pool):            # or torch.cuda.use_mem_pool(pool)
            model = Model().cuda()          # parameters, activations, ...

    Tensors allocated inside the ``with`` block come from rmmd (and go back
    to the pool's cache when freed; ``torch.cuda.empty_cache()`` returns
    cached segments to rmmd). Keep the pool alive while its tensors live.
    Backward passes allocate on autograd's threads, outside the pool, unless
    entered through :func:`use_mem_pool`.
    `kwargs` go to ``torch.cuda.MemPool`` (e.g. ``use_on_oom``). When rmmd
    cannot lend more, PyTorch frees its cache, retries, and raises
    ``torch.OutOfMemoryError``; :func:`last_error` says what rmmd said.
    """
    configure(runtime_dir, mode)
    torch = _torch()
    return torch.cuda.MemPool(rmmd_allocator().allocator(), **kwargs)


def default_mem_pool() -> Any:
    """The process's rmmd MemPool, made at the first call by
    :func:`rmmd_mem_pool` (with the settings of :func:`configure`)."""
    global _default_pool
    if _default_pool is None:
        pool = rmmd_mem_pool()
        with _lock:
            if _default_pool is None:
                _default_pool = pool
    return _default_pool


@contextlib.contextmanager
def use_mem_pool(pool: Any = None, device: Any = None, backward: bool = True) -> Iterator[Any]:
    """``torch.cuda.use_mem_pool`` over an rmmd MemPool, backward passes
    included::

        with use_mem_pool():
            loss = model(x).sum()
            loss.backward()               # gradients from rmmd too

    `pool`: a MemPool from :func:`rmmd_mem_pool`; ``None``: the process's
    (:func:`default_mem_pool`). PyTorch routes a pool's allocations by
    thread, and autograd runs the backward of CUDA work on its own device
    threads, which do not see the pool (PyTorch issue 167353): with
    `backward` (the default) backward passes started inside the block run
    in the calling thread instead
    (``torch.autograd.set_multithreading_enabled(False)``), so their
    tensors come from the pool too. Yields the pool.
    """
    torch = _torch()
    if pool is None:
        pool = default_mem_pool()
    with torch.cuda.use_mem_pool(pool, device=device):
        if backward:
            with torch.autograd.grad_mode.set_multithreading_enabled(False):
                yield pool
        else:
            yield pool


def _cache_dir() -> Path:
    if os.environ.get("RMMD_CACHE_DIR"):
        return Path(os.environ["RMMD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rmmd"


def build_oom_shim() -> str:
    """Builds (once per PyTorch and rmmd library; cached) the
    allocate function that :func:`use_rmmd_as_allocator` loads, and returns
    its path.

    It is ``_torch_oom.cpp`` of this package, compiled against the running
    PyTorch's headers and libc10 and linked to :func:`library_path`: when
    rmmd refuses an allocation it throws PyTorch's own C++ out-of-memory type,
    which Python sees as ``torch.OutOfMemoryError`` with rmmd's message. The
    compiler is ``$CXX``, else ``c++``, else ``g++`` (a few seconds); the
    cache is ``$RMMD_CACHE_DIR``, else ``$XDG_CACHE_HOME/rmmd``, else
    ``~/.cache/rmmd``. Run ``python -m rmmd.allocators.torch`` to build it
    ahead, in an image say.

    Raises:
        RuntimeError: no compiler, or it failed (its command and output are
            in the message).
    """
    torch = _torch()
    if not getattr(torch, "__file__", None):
        raise RuntimeError("rmmd: the torch module has no __file__, so no headers to build against")
    torch_dir = Path(torch.__file__).resolve().parent
    include, torch_lib = torch_dir / "include", torch_dir / "lib"
    lib = Path(library_path()).resolve()
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    abi = int(bool(getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", True)))
    source = _SHIM_SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join(
            [source, str(torch.__version__).encode(), bytes(torch_dir), bytes(lib), str(abi).encode()]
        )
    ).hexdigest()[:16]
    out = _cache_dir() / f"torch_oom-{key}.so"
    if out.exists():
        return str(out)
    if cxx is None:
        raise RuntimeError("rmmd: no C++ compiler to build the PyTorch shim (set $CXX or install g++)")
    if not (include / "c10" / "util" / "Exception.h").exists():
        raise RuntimeError(f"rmmd: PyTorch's C++ headers are not in {include}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}")
    said = []
    try:
        for std in ("c++20", "c++17"):  # newer PyTorch headers need C++20
            command = [
                cxx, f"-std={std}", "-O2", "-fPIC", "-shared",
                f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-isystem", str(include),
                str(_SHIM_SOURCE), "-o", str(tmp),
                f"-L{torch_lib}", "-lc10", f"-Wl,-rpath,{torch_lib}",
                str(lib), f"-Wl,-rpath,{lib.parent}",
            ]  # fmt: skip
            try:
                done = subprocess.run(command, capture_output=True, text=True, check=False)
            except OSError as e:  # no such compiler, say
                raise RuntimeError(f"rmmd: building the PyTorch shim failed: {cxx}: {e}") from e
            if done.returncode == 0:
                os.replace(tmp, out)  # atomic: ranks that build at once agree
                return str(out)
            said.append(f"$ {' '.join(command)}\n{done.stderr.strip()[-2000:]}")
    finally:
        tmp.unlink(missing_ok=True)
    raise RuntimeError("rmmd: building the PyTorch shim failed:\n" + "\n".join(said))


def _whole_process_allocator(torch: Any) -> Any:
    """The shim's allocator, else (with a warning) librmmd_c.so's raising
    malloc."""
    if os.environ.get("RMMD_TORCH_OOM_SHIM", "1") != "0":
        try:
            return torch.cuda.memory.CUDAPluggableAllocator(
                build_oom_shim(), OOM_ALLOC_FN_NAME, FREE_FN_NAME
            )
        except (OSError, RuntimeError) as e:
            warnings.warn(
                f"{e}\nrmmd: an allocation rmmd refuses raises RuntimeError, not "
                "torch.OutOfMemoryError (RMMD_TORCH_OOM_SHIM=0 chooses that quietly)",
                RuntimeWarning,
                stacklevel=3,
            )
    return torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), RAISING_ALLOC_FN_NAME, FREE_FN_NAME
    )


def use_rmmd_as_allocator(
    runtime_dir: str | os.PathLike[str] | None = None, mode: str | None = None
) -> Any:
    """Makes rmmd the allocator of every CUDA tensor of this process
    (``torch.cuda.memory.change_current_allocator``). Call it before the
    process's first CUDA allocation. Returns the allocator.

    An allocation rmmd refuses for want of memory raises
    ``torch.OutOfMemoryError`` with rmmd's message, other refusals
    ``RuntimeError``. That takes the allocate function :func:`build_oom_shim`
    builds the first time (a C++ compiler and PyTorch's headers, a few
    seconds); where it cannot be built, a ``RuntimeWarning`` says why and
    every refusal raises ``RuntimeError`` (``RMMD_TORCH_OOM_SHIM=0``: that
    way, without trying).

    Raises:
        PreconditionError: PyTorch has allocated CUDA memory already.
    """
    global _raising_allocator
    configure(runtime_dir, mode)
    torch = _torch()
    with _lock:
        if _raising_allocator is None:
            _raising_allocator = _whole_process_allocator(torch)
        allocator = _raising_allocator
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise PreconditionError(
            "rmmd: use_rmmd_as_allocator() must run before the process's first CUDA "
            f"allocation ({e})",
            status=Status.FAILED_PRECONDITION,
        ) from e
    return allocator


def memory_stats(device: Any = None) -> dict[str, int]:
    """What PyTorch allocated through rmmd on `device` (``None``: the
    current device), which ``torch.cuda.memory_stats`` cannot report under a
    pluggable allocator: ``allocated_bytes`` (live), ``allocation_count``
    (live), ``high_water_bytes``, ``total_allocations``; zeros before the
    first allocation. Under a MemPool these count the segments PyTorch's
    cache took from rmmd, not its tensors. What the session holds from the
    daemon (slabs included) is in ``rmmctl stats`` under client ``torch``.
    """
    if device is None:
        device = _torch().cuda.current_device()
    index = getattr(device, "index", device)
    if index is None:
        index = _torch().cuda.current_device()
    s = _lib.ResourceStats(size=ctypes.sizeof(_lib.ResourceStats))
    status = _lib.load().rmmd_torch_get_stats(int(index), ctypes.byref(s))
    if status == Status.NOT_FOUND:
        return {
            "allocated_bytes": 0,
            "allocation_count": 0,
            "high_water_bytes": 0,
            "total_allocations": 0,
            "device": int(index),
        }
    check(status)
    return {
        "allocated_bytes": s.allocated_bytes,
        "allocation_count": s.allocation_count,
        "high_water_bytes": s.high_water_bytes,
        "total_allocations": s.total_allocations,
        "device": s.device,
    }


def stable_allocator() -> Any:
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over address-stable
    memory (``rmmd_torch_stable_malloc``; one per process)."""
    global _stable_allocator
    torch = _torch()
    with _lock:
        if _stable_allocator is None:
            _stable_allocator = torch.cuda.memory.CUDAPluggableAllocator(
                library_path(), STABLE_ALLOC_FN_NAME, STABLE_FREE_FN_NAME
            )
        return _stable_allocator


def stable_mem_pool(runtime_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
    """A ``torch.cuda.MemPool`` over address-stable memory, for code that
    manages its pools itself (``rmmd.memory_saver`` makes one per tag)::

        pool = stable_mem_pool()
        with torch.cuda.use_mem_pool(pool), stable_tag("kv"):
            cache = torch.empty(n, device="cuda")           # a segment tagged "kv"
        stable_resource().sleep(["kv"])                     # given back; cache keeps its address
        stable_resource().wake(["kv"], deadline=30)         # mapped again there

    Each segment PyTorch's cache takes for it is one allocation of the
    process-wide stable resource of its device (docs/sleep.md), made on the
    process-wide session of this module (client ``torch``; `runtime_dir` as
    :func:`configure` takes it), and tagged with the tag of the thread that
    allocates it (:func:`stable_tag`; "default" without one). Keep one tag
    per pool: PyTorch reuses a pool's cached segments whatever the thread's
    tag is now. `kwargs` go to ``torch.cuda.MemPool``.
    """
    configure(runtime_dir, None)
    torch = _torch()
    return torch.cuda.MemPool(stable_allocator().allocator(), **kwargs)


def current_stable_tag() -> str | None:
    """The calling thread's stable tag (None: allocations get "default")."""
    return getattr(_thread, "tag", None)


def _set_thread_tag(tag: str | None) -> None:
    check(_lib.load().rmmd_stable_set_thread_tag(tag.encode() if tag else None))
    _thread.tag = tag


@contextlib.contextmanager
def stable_tag(tag: str | None) -> Iterator[None]:
    """Tags the address-stable allocations the calling thread makes inside
    the block (the segments :func:`stable_mem_pool` takes) with `tag`
    (None: "default"); nests, and restores the outer tag at the end."""
    if tag is not None and (not isinstance(tag, str) or not tag):
        raise InvalidArgumentError(f"rmmd: a tag is a non-empty str or None, not {tag!r}")
    previous = current_stable_tag()
    _set_thread_tag(tag)
    try:
        yield
    finally:
        _set_thread_tag(previous)


def stable_devices() -> list[int]:
    """The CUDA devices this process has a process-wide stable resource on
    (it allocated there through :func:`stable_mem_pool`, or restored)."""
    mask = ctypes.c_uint64()
    check(_lib.load().rmmd_torch_stable_devices(ctypes.byref(mask)))
    return [d for d in range(64) if mask.value >> d & 1]


def stable_resource(device: Any = None) -> Any:
    """The process-wide stable resource of `device` (``None``: the current
    device), made if need be: an ``rmmd._stable.StableResource`` whose
    ``sleep``, ``wake``, ``restore`` and ``read_backup`` act on every
    segment :func:`stable_mem_pool` took on that device."""
    from .._stable import StableResource

    if device is None:
        device = _torch().cuda.current_device()
    index = getattr(device, "index", device)
    if index is None:
        index = _torch().cuda.current_device()
    index = int(index)
    with _lock:
        found = _stable_resources.get(index)
        if found is None:
            handle = _lib.stable_t()
            check(_lib.load().rmmd_torch_stable_resource(index, ctypes.byref(handle)))
            found = _stable_resources[index] = StableResource(handle.value, index)
        return found


def last_error() -> str:
    """What rmmd said about the calling thread's last failed call (an
    allocation PyTorch made on this thread that rmmd refused, say); "" if
    none failed."""
    raw = _lib.load().rmmd_last_error_message()
    return raw.decode("utf-8", errors="replace") if raw else ""


__all__ = [
    "build_oom_shim",
    "configure",
    "current_stable_tag",
    "default_mem_pool",
    "last_error",
    "library_path",
    "memory_stats",
    "rmmd_allocator",
    "rmmd_mem_pool",
    "stable_allocator",
    "stable_devices",
    "stable_mem_pool",
    "stable_resource",
    "stable_tag",
    "use_mem_pool",
    "use_rmmd_as_allocator",
]


if __name__ == "__main__":
    # python -m rmmd.allocators.torch: build the shim now (an image's build
    # step, say) and say where it is.
    try:
        print(build_oom_shim())
    except RuntimeError as e:
        sys.exit(str(e))
