"""Address-stable memory from Python (docs/sleep.md): a handle on an
``rmmd_stable_resource_t`` of the C ABI (``rmmd::stable_memory_resource``),
whose allocations sleep and wake by tag at the addresses they keep, and the
allocations a ``restore`` brings back into a new process.

The handles this package makes are those of the process-wide resources that
PyTorch's MemPools allocate from (``rmmd.allocators.torch.stable_resource``,
``rmmd.memory_saver``): closing one frees nothing, the process-wide resource
keeps its allocations for the process's life.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, Iterable

from . import _lib
from ._common import OwnsHandle, exiting, positive_size, stream_handle
from ._errors import InvalidArgumentError, check
from ._memory import Memory

# The daemon refuses a wake deadline over 10 minutes (docs/sleep.md, Errors).
MAX_DEADLINE_S = 600.0


def deadline_ms(deadline: float) -> int:
    """A wake's deadline in seconds as the C ABI's milliseconds."""
    try:
        seconds = float(deadline)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"rmmd: deadline must be a number of seconds, not {deadline!r}") from None
    if not 0.0 <= seconds <= MAX_DEADLINE_S:
        raise InvalidArgumentError(
            f"rmmd: deadline is {seconds} s; give 0 to {MAX_DEADLINE_S:.0f} s (how long a wake "
            "that does not fit waits for memory to come back)"
        )
    return int(seconds * 1000)


def tag_array(tags: Iterable[str] | str | None) -> tuple[Any, int]:
    """`tags` as the C ABI takes them (None or empty: every tag)."""
    if tags is None:
        return None, 0
    if isinstance(tags, str):
        tags = [tags]
    listed = list(tags)
    for t in listed:
        if not isinstance(t, str) or not t:
            raise InvalidArgumentError(f"rmmd: a tag is a non-empty str, not {t!r}")
    if not listed:
        return None, 0
    return (ctypes.c_char_p * len(listed))(*(t.encode() for t in listed)), len(listed)


class StableResource(OwnsHandle):
    """One handle on an address-stable resource of device ``device``.

    ``sleep`` gives the memory of some tags back to the node (keeping a host
    copy where asked), ``wake`` maps new memory at the same addresses and
    restores the copies, ``restore`` takes over what a process of this uid
    left asleep under a backup name, ``read_backup`` reads a sleeping
    allocation's copy. Each raises rmmd's exceptions (a wake that does not
    fit by its deadline: :class:`rmmd.OutOfMemoryError`, naming who holds
    the pool, with nothing mapped).
    """

    def __init__(self, handle: int, device: int) -> None:
        self._handle = handle
        self._device = device
        self._destroy = _lib.load().rmmd_stable_resource_destroy

    @property
    def device(self) -> int:
        return self._device

    def _require(self) -> int:
        if self._handle is None:
            raise InvalidArgumentError("rmmd: this StableResource was closed")
        return self._handle

    def sleep(
        self,
        tags: Iterable[str] | str | None = None,
        *,
        backup: bool = False,
        backup_name: str | None = None,
        stream: Any = None,
    ) -> int:
        """Sleeps the awake allocations tagged with one of `tags` (None:
        every tag); with `backup`, their contents are copied (on `stream`)
        into host memory the daemon holds, kept past this process's end
        under `backup_name` where one is given. Returns the device bytes
        given back."""
        array, count = tag_array(tags)
        released = ctypes.c_uint64()
        check(
            _lib.load().rmmd_stable_sleep(
                self._require(),
                array,
                count,
                _lib.SLEEP_BACKUP_HOST if backup else _lib.SLEEP_BACKUP_NONE,
                backup_name.encode() if backup_name else None,
                stream_handle(stream) or None,
                ctypes.byref(released),
            )
        )
        return released.value

    def wake(self, tags: Iterable[str] | str | None = None, *, deadline: float = 10.0, stream: Any = None) -> int:
        """Wakes the sleeping allocations tagged with one of `tags` (None:
        every tag) at their addresses, all or none, restoring their backups
        on `stream`; waits up to `deadline` seconds for room. Returns the
        bytes woken."""
        array, count = tag_array(tags)
        woken = ctypes.c_uint64()
        check(
            _lib.load().rmmd_stable_wake(
                self._require(), array, count, deadline_ms(deadline), stream_handle(stream) or None,
                ctypes.byref(woken),
            )  # fmt: skip
        )
        return woken.value

    def restore(self, backup_name: str, *, deadline: float = 10.0, stream: Any = None) -> list["StableAllocation"]:
        """The allocations a process of this uid left asleep under
        `backup_name` when it ended, woken at new addresses of this process
        with their backups restored."""
        if not isinstance(backup_name, str) or not backup_name:
            raise InvalidArgumentError(f"rmmd: backup_name is a non-empty str, not {backup_name!r}")
        out = ctypes.c_void_p()
        check(
            _lib.load().rmmd_stable_restore(
                self._require(), backup_name.encode(), deadline_ms(deadline), stream_handle(stream) or None,
                ctypes.byref(out),
            )  # fmt: skip
        )
        restored = json.loads(_lib.take_string(out.value))
        return [StableAllocation(self, int(a["ptr"]), int(a["size"]), a["tag"]) for a in restored]

    def keep_backups(self, keep: bool = True) -> None:
        """Whether a wake keeps the host backups it restored from (the
        default) as the room of the next sleep with a backup: they stay
        mapped and page-locked in this process, charged to the host pool
        and the uid's quota while awake, so that from the second sleep on a
        sleep and a wake are the copies alone, at the host link's speed.
        ``False``: a wake gives the host memory back, and each sleep pays
        the page-locking again."""
        check(_lib.load().rmmd_stable_keep_backups(self._require(), 1 if keep else 0))

    def read_backup(self, ptr: int, nbytes: int) -> bytearray | None:
        """A copy of `nbytes` bytes at `ptr` from the host backup of the
        sleeping allocation that holds them; None where that allocation is
        awake or sleeps without a backup.

        Raises:
            NotFoundError: the bytes are not inside one of this resource's
                allocations.
        """
        n = positive_size(nbytes)
        out = bytearray(max(n, 1))  # the C ABI takes no NULL, even for 0 bytes
        copied = ctypes.c_size_t()
        buffer = (ctypes.c_char * len(out)).from_buffer(out)
        check(_lib.load().rmmd_stable_read_backup(self._require(), ptr, n, buffer, ctypes.byref(copied)))
        if copied.value != n:
            return None
        del out[n:]
        return out

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        """Frees an allocation of this resource after `stream`'s work."""
        check(_lib.load().rmmd_stable_deallocate(self._require(), ptr, int(nbytes), stream_handle(stream) or None))

    def __repr__(self) -> str:
        return f"<rmmd.StableResource device={self._device}{' closed' if self.closed else ''}>"


class StableAllocation(Memory):
    """An address-stable allocation that ``restore`` brought into this
    process: ``nbytes`` bytes at ``ptr`` on CUDA device ``device``, tagged
    ``tag``, handed to frameworks by ``__cuda_array_interface__`` and DLPack
    (``torch.as_tensor(a, device="cuda")``, ``torch.from_dlpack(a)``). Freed
    by :meth:`free`, or when it and every view of it are gone; it sleeps and
    wakes with its tag like any other allocation of its resource."""

    def __init__(self, resource: StableResource, ptr: int, nbytes: int, tag: str) -> None:
        self._resource = resource
        self._ptr = ptr
        self._nbytes = nbytes
        self._device = resource.device
        self.tag = tag

    def _live(self) -> bool:
        return self._ptr != 0

    def free(self, stream: Any = None) -> None:
        """Gives the memory back (after `stream`'s work). Idempotent."""
        ptr, self._ptr = self._ptr, 0
        if ptr:
            self._resource.deallocate(ptr, self._nbytes, stream)

    def __del__(self) -> None:
        if self._ptr and not exiting():
            try:
                self.free()
            except Exception:  # noqa: BLE001 (nothing may raise from a collection)
                pass

    def __repr__(self) -> str:
        state = "freed" if not self._ptr else f"ptr={self._ptr:#x}"
        return f"<rmmd.StableAllocation {state} nbytes={self._nbytes} device={self._device} tag={self.tag!r}>"
