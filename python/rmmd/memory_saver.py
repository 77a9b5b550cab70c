"""torch_memory_saver's API over rmmd's address-stable memory.

A program written for SGLang's torch_memory_saver changes one line::

    from rmmd.memory_saver import torch_memory_saver    # was: from torch_memory_saver import ...

    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = Model().cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(n, device="cuda")
    torch_memory_saver.pause()          # every tag: the GPU is someone else's now
    torch_memory_saver.resume()         # same addresses; weights restored, kv not

Tensors made inside ``region`` come from a ``torch.cuda.MemPool`` per (tag,
backup, device) whose segments are rmmd's address-stable allocations
(``rmmd.allocators.torch.stable_mem_pool``): ``pause`` gives their memory
back to the node's daemon (its ledger shows it free; another process may be
lent it), ``resume`` maps new memory at the same addresses, so tensors and
CUDA graphs captured before stay valid. What differs from
torch_memory_saver (docs/python.md, "Sleep and wake: rmmd.memory_saver"):

- A resume that does not fit waits up to ``deadline`` seconds (10) while
  the daemon gets memory back from other tenants, then raises
  ``torch.OutOfMemoryError`` with the daemon's message (who holds the
  GPU), with nothing of it mapped; resume again once there is room.
- Backups live in host memory the daemon holds. ``pause(...,
  backup_name="engine-0")`` keeps them past this process: after a crash, a
  new process of the same uid takes them back with
  ``torch_memory_saver.restore("engine-0")``.
- ``cuda_graph`` works in every ``hook_mode``: the graph's memory comes
  from a stable MemPool too. There is no LD_PRELOAD and no hook mode:
  ``hook_mode`` is accepted and ignored.
- Pausing what is paused, or resuming what is awake, does nothing.
- ``retain_cpu_backup = True`` keeps the CPU backups past ``resume`` (in
  the daemon's host pool, counted against the uid's quota) as the room of
  the next pause, mapped and page-locked here: from the second pause on, a
  pause and a resume are the copies alone.
- No disk backups (``enable_disk_backup``, ``set_disk_backup_dir``): they
  raise ``NotImplementedError``.

The process-wide session is that of ``rmmd.allocators.torch`` (client
``torch``; its daemon: ``$RMMD_RUNTIME_DIR``, else ``/run/rmmd``, or
``rmmd.allocators.torch.configure(runtime_dir=...)`` before the first
allocation). This module imports without PyTorch; its methods need it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional

from ._errors import InvalidArgumentError, NotFoundError, OutOfMemoryError
from ._stable import StableAllocation, deadline_ms
from .allocators import torch as _alloc

_TAG_DEFAULT = "default"
# The rmmd tag of a region's memory that pause() backs up: a tag's memory
# with and without a CPU backup are two rmmd tags, since rmmd chooses the
# backup when it sleeps a tag and torch_memory_saver when it allocates.
BACKUP_TAG_SUFFIX = "+cpu_backup"
CPU_BACKUP_BACKENDS = ("mmap", "pinned")
DEFAULT_DEADLINE_S = 10.0


def rmmd_tag(tag: str, enable_cpu_backup: bool) -> str:
    """The rmmd tag (rmmctl sleepers shows it) of a region's memory."""
    return tag + BACKUP_TAG_SUFFIX if enable_cpu_backup else tag


def region_tag(tag: str) -> str:
    """The region's tag of memory tagged `tag` in rmmd."""
    return tag[: -len(BACKUP_TAG_SUFFIX)] if tag.endswith(BACKUP_TAG_SUFFIX) else tag


# The daemon's bound on a tag (docs/sleep.md, Errors), the suffix included.
MAX_TAG_BYTES = 128 - len(BACKUP_TAG_SUFFIX)


def _check_tag(tag: Any) -> str:
    """`tag`, or InvalidArgumentError: refused here, not at the first
    allocation (where PyTorch would call it out of memory)."""
    if not isinstance(tag, str) or not tag:
        raise InvalidArgumentError(f"rmmd.memory_saver: a tag is a non-empty str, not {tag!r}")
    if len(tag) > MAX_TAG_BYTES or not all(" " <= c <= "~" for c in tag):
        raise InvalidArgumentError(
            f"rmmd.memory_saver: tag {tag!r}: a tag is 1 to {MAX_TAG_BYTES} printable ASCII characters"
        )
    if tag.endswith(BACKUP_TAG_SUFFIX):
        raise InvalidArgumentError(
            f"rmmd.memory_saver: tag {tag!r} ends in {BACKUP_TAG_SUFFIX!r}, which marks the tags of "
            "memory with a CPU backup; choose another tag"
        )
    return tag


def _check_backup(enable_cpu_backup: bool, cpu_backup_backend: Optional[str]) -> None:
    if cpu_backup_backend is None:
        return
    if not enable_cpu_backup:
        raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
    if cpu_backup_backend not in CPU_BACKUP_BACKENDS:
        raise ValueError(
            f"cpu_backup_backend is {cpu_backup_backend!r}; give one of {CPU_BACKUP_BACKENDS} "
            "(under rmmd both mean host memory the daemon holds)"
        )


def _no_disk_backup() -> NotImplementedError:
    return NotImplementedError(
        "rmmd.memory_saver keeps backups in host memory the daemon holds, not on disk: use "
        "enable_cpu_backup=True (and pause(backup_name=...) to keep them past this process)"
    )


class TorchMemorySaver:
    """torch_memory_saver's ``TorchMemorySaver`` over rmmd (the module's
    docstring says what differs). Use the module's ``torch_memory_saver``.

    Thread safety: every method may be called from any thread; a pause or
    a resume holds the device's stable resource meanwhile (allocations of
    new segments wait for it). ``region`` sets the calling thread's tag.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (tag, enable_cpu_backup, device) -> the region's MemPool
        self._pools: dict[tuple[str, bool, int], Any] = {}
        # (a pool token not ours, tag, enable_cpu_backup, device) -> the
        # stable MemPool that graphs captured with that token share
        self._shared_graph_pools: dict[tuple[Any, str, bool, int], Any] = {}
        self._by_id: dict[Any, Any] = {}  # MemPool.id -> each MemPool made here
        self._backup_tags: set[str] = set()  # rmmd tags of memory with a CPU backup
        self._memory_margin_bytes = 0
        self._retain_cpu_backup = False

    # -- where tensors come from --------------------------------------------

    @contextlib.contextmanager
    def region(
        self,
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        enable_disk_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """Tensors allocated in the block are pauseable, under `tag`; with
        `enable_cpu_backup`, ``pause`` keeps a host copy that ``resume``
        restores. `cpu_backup_backend` ("pinned" or "mmap") is checked as
        torch_memory_saver does and otherwise ignored.

        Raises:
            NotImplementedError: `enable_disk_backup`.
            InvalidArgumentError: an empty tag, or one ending in "+cpu_backup".
        """
        _check_backup(enable_cpu_backup, cpu_backup_backend)
        if enable_disk_backup:
            raise _no_disk_backup()
        tag = _check_tag(tag)
        torch = _alloc._torch()
        pool = self._region_pool(tag, bool(enable_cpu_backup), torch.cuda.current_device())
        with torch.cuda.use_mem_pool(pool), _alloc.stable_tag(rmmd_tag(tag, enable_cpu_backup)):
            yield

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph: Any,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """``torch.cuda.graph(cuda_graph, pool, stream, capture_error_mode)``
        whose memory is pauseable under `tag`. The capture allocates from a
        stable MemPool: a new one per graph where `pool` is None; the same
        one for every graph given the same `pool` token (a
        ``torch.cuda.graph_pool_handle()``, another graph's ``pool()``), so
        graphs that share a token share memory, as in PyTorch."""
        _check_backup(enable_cpu_backup, cpu_backup_backend)
        tag = _check_tag(tag)
        torch = _alloc._torch()
        mem_pool = self._graph_pool(pool, tag, bool(enable_cpu_backup), torch.cuda.current_device())
        with torch.cuda.graph(cuda_graph, pool=mem_pool.id, stream=stream, capture_error_mode=capture_error_mode):
            with _alloc.stable_tag(rmmd_tag(tag, enable_cpu_backup)):
                yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Tensors allocated in the block (inside a region, say) come from
        PyTorch's own allocator, in a MemPool of their own, and are not
        paused."""
        torch = _alloc._torch()
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool), _alloc.stable_tag(None):
            yield
        del pool

    # -- pause and resume ---------------------------------------------------

    def pause(self, tag: Optional[str] = None, *, backup_name: Optional[str] = None) -> None:
        """Gives back the device memory of `tag`'s regions (None: every
        tag), after the device's work is done; regions with
        ``enable_cpu_backup`` are copied to host memory first. Tensors keep
        their addresses; using them before ``resume`` is an illegal address.

        `backup_name` (rmmd's): the host copies outlive this process, for
        :meth:`restore` in a new one (one device's copies per name).
        """
        torch = _alloc._torch()
        if tag is not None:
            _check_tag(tag)
        if backup_name is not None and (not isinstance(backup_name, str) or not backup_name):
            raise InvalidArgumentError(f"rmmd.memory_saver: backup_name is a non-empty str, not {backup_name!r}")
        devices = _alloc.stable_devices()
        if backup_name and len(devices) > 1:
            raise InvalidArgumentError(
                f"rmmd.memory_saver: backup_name {backup_name!r} would name the backups of devices "
                f"{devices}; a name keeps one device's (pause each device's process separately)"
            )
        with self._lock:
            backed = sorted(self._backup_tags) if tag is None else [rmmd_tag(tag, True)]
        for device in devices:
            r = _alloc.stable_resource(device)
            stream = torch.cuda.current_stream(device)
            if backed:
                r.sleep(backed, backup=True, backup_name=backup_name, stream=stream)
            r.sleep(None if tag is None else [tag], stream=stream)

    def resume(self, tag: Optional[str] = None, *, deadline: float = DEFAULT_DEADLINE_S) -> None:
        """Maps new memory at the same addresses for `tag`'s paused regions
        (None: every tag) and restores their CPU backups; all or none on
        each device.

        `deadline` (rmmd's, seconds, at most 600): how long a resume that
        does not fit waits for memory to come back.

        Raises:
            torch.OutOfMemoryError: it did not fit by the deadline; the
                message names who holds the GPU. Nothing of it is mapped.
        """
        torch = _alloc._torch()
        if tag is not None:
            _check_tag(tag)
        deadline_ms(deadline)  # checked before anything wakes
        tags = None if tag is None else [tag, rmmd_tag(tag, True)]
        for device in _alloc.stable_devices():
            r = _alloc.stable_resource(device)
            r.keep_backups(self._retain_cpu_backup)
            try:
                r.wake(tags, deadline=deadline, stream=torch.cuda.current_stream(device))
            except OutOfMemoryError as e:
                raise torch.OutOfMemoryError(str(e)) from e

    def restore(
        self, backup_name: str, *, device: Any = None, deadline: float = DEFAULT_DEADLINE_S
    ) -> list[StableAllocation]:
        """rmmd's: takes over the memory a process of this uid paused under
        `backup_name` and did not resume before it ended (a crash, say): each
        allocation (a segment of a region's MemPool) woken at a new address
        of this process on `device` (None: the current one), its CPU backup
        restored. Each is an ``rmmd._stable.StableAllocation`` (``.ptr``,
        ``.nbytes``, ``.tag``: the region's tag; ``torch.as_tensor(a,
        device="cuda")`` or ``torch.from_dlpack(a)`` gives a uint8 tensor
        over it), freed when it and its tensors are gone, and paused and
        resumed with its tag from now on.

        Raises:
            rmmd.NotFoundError: no backups are kept under that name.
            torch.OutOfMemoryError: they did not fit by the deadline.
        """
        torch = _alloc._torch()
        if not isinstance(backup_name, str) or not backup_name:
            raise InvalidArgumentError(f"rmmd.memory_saver: backup_name is a non-empty str, not {backup_name!r}")
        deadline_ms(deadline)
        r = _alloc.stable_resource(device)
        try:
            restored = r.restore(backup_name, deadline=deadline, stream=torch.cuda.current_stream(r.device))
        except OutOfMemoryError as e:
            raise torch.OutOfMemoryError(str(e)) from e
        with self._lock:
            self._backup_tags.update(a.tag for a in restored if a.tag.endswith(BACKUP_TAG_SUFFIX))
        for a in restored:
            a.tag = region_tag(a.tag)
        return restored

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        """A CPU tensor with `x`'s contents as the paused region's CPU backup
        holds them (dtype, shape and strides of `x`), or None where `x`'s
        memory is awake or has no backup. Always a copy: the backup is the
        daemon's memory (`zero_copy` is accepted; writes to the result do
        not reach the backup)."""
        torch = _alloc._torch()
        if not getattr(x, "is_cuda", False):
            raise ValueError(f"get_cpu_backup takes a CUDA tensor, not one on {getattr(x, 'device', x)!r}")
        if not x.is_contiguous():
            raise ValueError(f"get_cpu_backup takes a contiguous tensor (shape {tuple(x.shape)}, strides {x.stride()})")
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if device not in _alloc.stable_devices():
            return None
        try:
            data = _alloc.stable_resource(device).read_backup(x.data_ptr(), x.nbytes)
        except NotFoundError:
            return None  # not a region's memory
        if data is None:
            return None
        if not data:
            return torch.empty(x.shape, dtype=x.dtype)
        return torch.frombuffer(data, dtype=torch.uint8).view(x.dtype).view(x.shape)

    # -- torch_memory_saver's settings --------------------------------------

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> Any:
        raise AttributeError("hook_mode can be set, not read")

    @hook_mode.setter
    def hook_mode(self, hook_mode: str) -> None:
        """Accepted ("preload" or "torch") and ignored: rmmd needs no hook."""
        if hook_mode not in ("preload", "torch"):
            raise ValueError(f"hook_mode is {hook_mode!r}; give 'preload' or 'torch'")

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("memory_margin_bytes can be set, not read")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        """Accepted and ignored: whether a resume fits is the daemon's to
        say, from its pools and the other tenants' memory."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"memory_margin_bytes is a byte count, not {value!r}")
        self._memory_margin_bytes = value

    @property
    def retain_cpu_backup(self) -> bool:
        """Whether resume keeps the CPU backups it restored from (False, as
        torch_memory_saver's default): kept, they stay in the daemon's host
        pool, mapped and page-locked in this process and counted against
        the uid's quota while the regions are awake, and each later pause
        and resume is the copy alone, at the host link's speed; dropped,
        every pause page-locks new host memory again, which costs most of
        its time."""
        return self._retain_cpu_backup

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"retain_cpu_backup is a bool, not {value!r}")
        self._retain_cpu_backup = value

    def set_disk_backup_dir(self, path: str) -> None:
        raise _no_disk_backup()

    # -- the pools ------------------------------------------------------------

    def _new_pool_locked(self) -> Any:
        pool = _alloc.stable_mem_pool()
        self._by_id[pool.id] = pool
        return pool

    def _note_backup_locked(self, tag: str, enable_cpu_backup: bool) -> None:
        if enable_cpu_backup:
            self._backup_tags.add(rmmd_tag(tag, True))

    def _region_pool(self, tag: str, enable_cpu_backup: bool, device: int) -> Any:
        key = (tag, enable_cpu_backup, device)
        with self._lock:
            self._note_backup_locked(tag, enable_cpu_backup)
            found = self._pools.get(key)
            if found is None:
                found = self._pools[key] = self._new_pool_locked()
            return found

    def _graph_pool(self, token: Any, tag: str, enable_cpu_backup: bool, device: int) -> Any:
        with self._lock:
            self._note_backup_locked(tag, enable_cpu_backup)
            if token is None:
                return self._new_pool_locked()  # the graph's own, as PyTorch's private pool
            token = tuple(token)
            if token in self._by_id:
                return self._by_id[token]
            key = (token, tag, enable_cpu_backup, device)
            found = self._shared_graph_pools.get(key)
            if found is None:
                found = self._shared_graph_pools[key] = self._new_pool_locked()
            return found


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """torch_memory_saver's (it sets LD_PRELOAD for child processes); rmmd
    needs nothing set, so this does nothing."""
    yield


# The process's one saver, as torch_memory_saver's module has it.
torch_memory_saver = TorchMemorySaver()

__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]
