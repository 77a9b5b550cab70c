"""rmmd.SharedBuffer: named shared buffers (docs/sharing.md)."""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from . import _lib
from ._common import exiting, positive_size, stream_handle
from ._errors import InvalidArgumentError, PreconditionError, check
from ._manifest import Manifest, TensorEntry, as_manifest, checked_labels
from ._memory import Memory
from ._session import Pool, pool_name
from ._views import select, tensor_views

if TYPE_CHECKING:
    from ._session import Session

_MAX_WAIT_MS = 2**32 - 1


class SharedBuffer(Memory):
    """One hold of a named shared buffer by this process: the creator's,
    from :meth:`create`, or a consumer's, from :meth:`open`.

    A producer creates a buffer under a name, writes it, and publishes it;
    any allowed process opens it by name and uses the same bytes, without a
    copy. The daemon frees it when the last holder lets go (``close()``, or
    the holder's exit, even by SIGKILL), unless it was created persistent.

    Device buffers are handed to frameworks through
    ``__cuda_array_interface__`` and DLPack (``torch.from_dlpack(buf)``,
    ``cupy.from_dlpack(buf)``); host buffers through the buffer protocol,
    ``__array_interface__`` and DLPack (``numpy.asarray(buf)``,
    ``numpy.from_dlpack(buf)``). Each view keeps the buffer object alive;
    ``close()`` waits for tensors made through DLPack before letting go.

    A buffer may carry a manifest (:meth:`set_manifest`, by its creator
    before publishing): named tensors and labels, so that consumers get
    typed views (:meth:`tensors`) without knowing the layout.

    Consumers open it read-only unless they ask for ``writable=True`` and
    the creator allowed writers: device buffers of their own allocation are
    then mapped read-only by the GPU (a write is a CUDA error in the writing
    process only), host buffers with ``PROT_READ`` (NumPy views are not
    writeable; a write through a raw pointer is a segmentation fault). A
    buffer served from a pool pointer (``--cuda-shared-buffer-memory=pool``)
    cannot be mapped read-only: there it is the API's contract only.

    One object is not to be used from two threads at once.
    """

    def __init__(self) -> None:  # use create() or open()
        raise TypeError("rmmd: make a SharedBuffer with SharedBuffer.create() or SharedBuffer.open()")

    @classmethod
    def _wrap(cls, session: "Session", handle: int, name: str) -> "SharedBuffer":
        self = cls.__new__(cls)
        self._handle = handle
        self._session = session
        self._name = name
        self._peer: str | None = None
        self._close_pending: int | None = None
        self._manifest: Manifest | None = None
        lib = _lib.load()
        self._close_fn = lib.rmmd_buffer_close
        try:
            access = ctypes.c_int()
            check(lib.rmmd_buffer_access_mode(handle, ctypes.byref(access)))
            ptr = ctypes.c_void_p()
            check(lib.rmmd_buffer_pointer(handle, ctypes.byref(ptr)))
            size = ctypes.c_size_t()
            check(lib.rmmd_buffer_size(handle, ctypes.byref(size)))
            ident = ctypes.c_uint64()
            check(lib.rmmd_buffer_id(handle, ctypes.byref(ident)))
            device = ctypes.c_int()
            check(lib.rmmd_buffer_device(handle, ctypes.byref(device)))
            generation = ctypes.c_uint64()
            check(lib.rmmd_buffer_lease_generation(handle, ctypes.byref(generation)))
        except BaseException:
            self._handle = None
            lib.rmmd_buffer_destroy(handle)
            raise
        self._ptr = ptr.value or 0
        self._nbytes = size.value
        self._id = ident.value
        self._device = device.value
        self._lease_generation = generation.value
        self._standby = False
        self._read_only = access.value == _lib.BUFFER_READ
        self._ready_stream = None
        self._stream_owner: Any = None  # keeps the publish stream's object alive
        self._stream: int | None = None
        return self

    @classmethod
    def create(
        cls,
        session: "Session",
        name: str,
        nbytes: int,
        pool: str | Pool | None = None,
        device: int | None = None,
        persistent: bool = False,
        gid: int | None = None,
        alignment: int = 256,
        allow_writers: bool = False,
        pinned: bool | None = None,
    ) -> "SharedBuffer":
        """Creates `nbytes` bytes named `name` (1-255 bytes of
        ``[A-Za-z0-9._/-]``), held by this process and seen by no other until
        :meth:`publish`. The memory is ready on every stream.

        Args:
            pool: the pool (name or Pool; ``session.host_pool`` for shared
                host memory); ``None``: the CUDA pool of `device`.
            device: this process's CUDA ordinal whose pool to use when `pool`
                is None; ``None``: the current device.
            persistent: keep it after its last holder is gone, until deleted
                (``SharedBuffer.delete``, ``rmmctl buffers delete NAME``). A
                restart of the daemon keeps it where a service manager keeps
                rmmd's fd store (docs/operations.md, "Restart and upgrade");
                elsewhere it lives as long as the daemon.
            gid: members of this group may open it too (else: this uid and root).
            alignment: a power of two up to the pool's ``max_alignment``.
            allow_writers: others may open it with ``writable=True``; else
                every other holder reads only.
            pinned: a host pool's buffer: page-locked in this process as
                :meth:`open` says.

        Raises:
            InvalidArgumentError: a bad name, size, alignment or pool; a
                `pinned` that is not a bool or None; ``pinned=True`` in a
                pool that is not pinnable.
            AlreadyExistsError: the name is taken.
            OutOfMemoryError: a quota or the pool is full.
            PermissionError, SessionError.
        """
        options = _lib.BufferOptions(
            size=ctypes.sizeof(_lib.BufferOptions),
            pool=pool_name(pool),
            device=-1 if device is None else int(device),
            persistent=1 if persistent else 0,
            has_gid=0 if gid is None else 1,
            gid=0 if gid is None else int(gid),
            alignment=int(alignment),
            allow_writers=1 if allow_writers else 0,
            reserved_0=0,
            pin=_pinning(f"create buffer '{name}'", pinned),
        )
        handle = _lib.buffer_t()
        check(
            _lib.load().rmmd_buffer_create(
                session._require(), _name(name), positive_size(nbytes), ctypes.byref(options), ctypes.byref(handle)
            )
        )
        buf = cls._wrap(session, handle.value, name)
        buf._creator = True
        return buf

    @classmethod
    def open(
        cls,
        session: "Session",
        name: str,
        wait: float = 0.0,
        writable: bool = False,
        expect: Mapping[str, str] | None = None,
        peer: str | None = None,
        device: int | None = None,
        exclusive: bool = False,
        standby: bool = False,
        pinned: bool | None = None,
    ) -> "SharedBuffer":
        """Opens the published buffer `name`, for reading unless `writable`.
        With `wait` (seconds), waits up to that long for it to be created
        and published; without, fails at once when it is missing or
        unpublished.

        `name` may be ``"NODE:NAME"``: a buffer of another node of the
        NVLink domain, which this node's daemon asks NODE's daemon for
        (peering in rmmd.conf, docs/operations.md "Across nodes"); the memory
        is imported by its fabric handle on `device` (the current CUDA device
        by default), read-only unless `writable` was granted.

        Args:
            writable: open it for writing too (only where its creator allowed
                writers); else the mapping is read-only.
            expect: the fingerprint guard: labels the buffer must carry with
                exactly these values (``{"revision": "abc", "rank": "0"}``);
                otherwise PreconditionError naming the first key that differs
                (in key order), and nothing is opened.
            peer: the node, as ``"NODE:"`` in the name would say it (both
                may be given only when they agree).
            device: a buffer of another node: this process's CUDA ordinal
                (an int, as ``torch.device("cuda", n).index`` gives it) that
                maps it; ``None``: the current device. A buffer of this node
                is mapped on its pool's GPU: there `device` is a check, and
                one that is not the pool's device (or a host pool's buffer)
                is InvalidArgumentError, with nothing left open.
            exclusive: take the buffer's write lease (docs/failover.md;
                needs ``writable=True`` and a buffer of this node): at most
                one session holds it. While another holds it (or has the
                buffer open writable without it), waits up to `wait` in
                line, first come first served; the daemon grants it when the
                holder closes this kind of open or its process ends (exit,
                crash, SIGKILL). :attr:`lease_generation` says which grant
                it is.
            standby: with `exclusive`: a standby (docs/failover.md, "A
                standby that is ready"). The open does not wait for the
                lease (`wait` still applies to the buffer's publication):
                it returns at once with the buffer mapped, holding the lease
                where it is free and standing in line for it otherwise, so
                that the process captures its CUDA graphs against the memory
                before it may write. Until the grant the mapping is
                read-only where the memory allows (a VMM allocation: a
                kernel's write is a CUDA error; a host buffer: a write is
                SIGSEGV); a pool pointer (``--cuda-shared-buffer-memory=pool``)
                is writable from the start. :meth:`wait_lease` waits for the
                grant and makes the same mapping writable: the address does
                not change.
            pinned: a host buffer of a pinnable pool: whether this process
                page-locks its mapping (so kernels use its address and copies
                run at full speed). ``None``: where the process has a CUDA
                context already (PyTorch, CuPy and JAX make one at their
                first GPU call), else a plain mapping, and no context is made
                for it (one costs about 500 MiB of a GPU's memory).
                ``True``: page-locked, making a context on the current
                device where there is none. ``False``: plain (unless this
                session has the buffer mapped page-locked with the same
                access already). Device buffers
                ignore it. :attr:`pinned` says what happened.

        Raises:
            InvalidArgumentError: a malformed name or node (``':'`` twice,
                an empty node, a node that differs from `peer`), or a
                `device` that is not an int >= 0, before any request; a
                buffer of another node in a process that sees no GPU (or no
                GPU `device`); a buffer of this node that is not on `device`.
            NotFoundError: no buffer has the name (or the wait ended first),
                none that this uid or gid may open (answered in the same
                words, so it stays hidden), or no peer of this node's daemon
                has the node's name.
            PreconditionError: not published yet (or the wait ended first),
                or a label differs from `expect`.
            PermissionError: `writable`
                where the creator did not allow writers; another node's
                grants do not name it for this node.
            DeadlineError: `exclusive` (not `standby`), and the lease stayed
                with another session until the wait ended (a
                :class:`TimeoutError`; nothing changed). PreconditionError:
                this session holds the lease already or stands in line for
                it; or a `writable` open (not exclusive) while another
                session holds or waits for the lease. InvalidArgumentError:
                `standby` without `exclusive`; a `pinned` that is not a
                bool or None; ``pinned=True`` in a pool that is not
                pinnable (``rmmd --host-pool-pinned=off``).
            InternalError: ``pinned=True`` and the mapping could not be
                page-locked (no GPU, ``ulimit -l``: the CUDA error named);
                nothing stays open.
            SessionError: the daemon is gone or draining; or, for a buffer
                of another node, this node's daemon cannot reach that node's
                (the message says so; ``Session.peers()`` and ``rmmctl
                peers`` say why), while this session goes on working.
        """
        options = _open_options(
            f"open buffer '{name}'", peer, wait, writable, expect, device, exclusive, standby, pinned
        )
        handle = _lib.buffer_t()
        check(
            _lib.load().rmmd_buffer_open_with(
                session._require(), _name(name), ctypes.byref(options), ctypes.byref(handle)
            )
        )
        # The library checked the address: NODE:NAME has one ':'.
        node, _, plain = name.rpartition(":")
        buf = cls._wrap(session, handle.value, plain)
        buf._creator = False
        buf._peer = peer or node or None
        buf._standby = standby
        return buf

    @classmethod
    def open_by_labels(
        cls,
        session: "Session",
        labels: Mapping[str, str],
        peer: str | None = None,
        wait: float = 0.0,
        writable: bool = False,
        expect: Mapping[str, str] | None = None,
        device: int | None = None,
        pinned: bool | None = None,
    ) -> "SharedBuffer":
        """Opens the one published buffer whose manifest carries every one of
        `labels` with that value, on node `peer` (``None``: this node), as
        :meth:`open` would open it by name, with `labels` added to `expect`
        (so what is opened carries them even if the name changed hands
        between the search and the open). :meth:`Session.buffers` with the
        same labels shows the candidates.

        Raises:
            InvalidArgumentError: no labels, or a label `expect` gives
                another value.
            NotFoundError: no buffer carries them (the message names them),
                or no peer of this node's daemon has the node's name.
            PreconditionError: several buffers carry them (the message names
                them: add a label that tells them apart).
            and what :meth:`open` raises (`device` and `pinned` as there).
        """
        options = _open_options(
            "open a buffer by labels", peer, wait, writable, expect, device, pinned=pinned
        )
        label_keys, label_values, label_count = _lib.label_arrays(checked_labels(labels, "labels"))
        handle = _lib.buffer_t()
        check(
            _lib.load().rmmd_buffer_open_by_labels(
                session._require(), label_keys, label_values, label_count, ctypes.byref(options), ctypes.byref(handle)
            )
        )
        name = ctypes.c_void_p()
        try:
            check(_lib.load().rmmd_buffer_name(handle.value, ctypes.byref(name)))
        except BaseException:
            _lib.load().rmmd_buffer_destroy(handle.value)
            raise
        buf = cls._wrap(session, handle.value, _lib.take_string(name.value) or "")
        buf._creator = False
        buf._peer = peer or None
        return buf

    @staticmethod
    def delete(session: "Session", name: str) -> int:
        """Deletes the buffer `name`: the name is free at once, the memory
        goes after the last holder. Returns how many sessions hold it still.

        Raises:
            NotFoundError: no buffer has the name.
            PermissionError: only the creator's uid and root may delete it.
        """
        holders = ctypes.c_size_t()
        check(_lib.load().rmmd_buffer_delete(session._require(), _name(name), ctypes.byref(holders)))
        return holders.value

    # -- what it is ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def id(self) -> int:
        """The daemon's id for it (``rmmctl buffers`` shows it)."""
        return self._id

    @property
    def session(self) -> "Session":
        return self._session

    @property
    def peer(self) -> str | None:
        """The node whose daemon holds the memory, for a buffer opened as
        ``"NODE:NAME"``; ``None`` for this node's buffers."""
        return self._peer

    @property
    def exclusive(self) -> bool:
        """Whether this is an exclusive open (``exclusive=True``): it holds
        the buffer's write lease or, a standby, stands in line for it."""
        return self._lease_generation != 0 or self._standby

    @property
    def pinned(self) -> bool:
        """Whether this host buffer is page-locked in this process (by this
        open or an earlier one of the same mapping; the `pinned` argument
        of :meth:`open` says when); False for device memory."""
        out = ctypes.c_int()
        check(_lib.load().rmmd_buffer_pinned(self._require(), ctypes.byref(out)))
        return out.value != 0

    @property
    def holds_lease(self) -> bool:
        """Whether this open holds the buffer's write lease: an exclusive
        open; a standby once :meth:`wait_lease` returned (or when the lease
        was free at its open)."""
        return self._lease_generation != 0

    def wait_lease(self, timeout: float | None = None) -> int:
        """A standby open (``standby=True``): waits up to `timeout` seconds
        (``None``: without end) for the write lease and returns its
        generation, at once where this open holds it already. At the grant
        the mapping becomes writable in place: the address (and every array,
        tensor or CUDA graph made from it) stays valid.

        Raises:
            DeadlineError: the wait ended first (a :class:`TimeoutError`,
                naming the holder); nothing changed: the standby stays in
                line, wait again.
            PreconditionError: not a standby open.
            NotFoundError: the buffer was deleted while it stood in line.
            InvalidArgumentError: a negative or NaN `timeout`.
            SessionError: the session ended, or the daemon is gone or
                draining.
            RmmdError: the mapping could not be made writable (the lease is
                held all the same; the message names the CUDA or mprotect
                error).
        """
        if timeout is not None and (timeout < 0 or math.isnan(timeout)):
            raise InvalidArgumentError(f"rmmd: wait_lease: timeout is {timeout}; give seconds >= 0 or None")
        timeout_ms = -1 if timeout is None else min(_MAX_WAIT_MS, int(math.ceil(timeout * 1000)))
        generation = ctypes.c_uint64()
        check(_lib.load().rmmd_buffer_wait_lease(self._require(), timeout_ms, ctypes.byref(generation)))
        self._lease_generation = generation.value
        return self._lease_generation

    @property
    def lease_generation(self) -> int:
        """The generation of the write lease this open holds; 0: none. Every
        later grant of the buffer's lease has a larger one, so a write
        stamped with it tells this holder's writes from an earlier holder's
        late ones."""
        return self._lease_generation

    @property
    def writable(self) -> bool:
        """Whether this hold may write: the creator's, or a ``writable`` open."""
        return not self._read_only

    @property
    def manifest(self) -> Manifest:
        """What the buffer holds (tensors and labels, the daemon's own
        labels such as ``rmmd.gpu_uuid`` among them); empty when it has no
        manifest."""
        if self._manifest is None:
            out = ctypes.c_void_p()
            check(_lib.load().rmmd_buffer_manifest_json(self._require(), ctypes.byref(out)))
            self._manifest = Manifest.from_json(_lib.take_string(out.value))
        return self._manifest

    @property
    def labels(self) -> dict[str, str]:
        """The manifest's labels."""
        return dict(self.manifest.labels)

    def set_manifest(
        self,
        tensors: Manifest | Iterable[TensorEntry] | Mapping[str, TensorEntry],
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Says what the buffer holds: `tensors` (TensorEntry objects, or a
        Manifest) and `labels` (added to a Manifest's own). Creator only,
        before :meth:`publish`; a later call replaces the manifest.

        Raises:
            InvalidArgumentError: the daemon's checks (docs/sharing.md) refuse
                the table: a bad name or label, a tensor past the buffer's
                end, two tensors that overlap, too many of them; the message
                names the tensor or label.
            PreconditionError: not the creator, or published already.
        """
        handle = self._require()
        if not self._creator:
            raise PreconditionError(
                f"rmmd: shared buffer '{self._name}' was opened, not created, by this "
                "process: only its creator sets its manifest"
            )
        manifest = as_manifest(tensors, labels)
        self._manifest = None
        check(_lib.load().rmmd_buffer_set_manifest_json(handle, manifest.to_json().encode()))

    def tensors(self, framework: str | None = None, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The manifest's tensors as views of this buffer (no copy): name ->
        array, each alias mapped to the same object as its tensor.

        Args:
            framework: ``"torch"``, ``"cupy"`` or ``"numpy"`` (host buffers);
                ``None``: torch where this process imported it, else cupy for
                a device buffer and numpy for a host buffer.
            names: only these tensors (by name or alias; each with all its
                names); ``None``: all. NotFoundError for a name it lacks.

        Every view keeps the buffer open. NumPy views of a read-only buffer
        are not writeable; NumPy has no bfloat16 or float8 unless the
        ``ml_dtypes`` package is installed.
        """
        self._require_live()
        return tensor_views(self, select(self.manifest, names), framework)

    @property
    def stream(self) -> int | None:
        """The stream :meth:`close` uses by default: :meth:`publish`'s."""
        return self._stream

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _live(self) -> bool:
        return self._handle is not None and self._close_pending is None

    def _require(self) -> int:
        if self._handle is None or self._close_pending is not None:
            raise InvalidArgumentError(f"rmmd: shared buffer '{self._name}' was closed")
        return self._handle

    # -- publish and close --------------------------------------------------

    def publish(self, stream: Any = None) -> None:
        """Publishes the buffer: other sessions may open it from then on.

        Without `stream`, now: the writes are complete (host writes, or a
        synchronised stream). With `stream`, once that stream has done what
        is queued on it so far (the creator's writes): this returns at once
        and a host function on the stream tells the daemon; the stream
        becomes the buffer's stream (for ``close()``, and what
        ``__cuda_array_interface__`` and ``__dlpack__`` order consumers
        after). Creator only.

        Raises:
            PreconditionError: not the creator, or published already.
        """
        handle = self._require()
        if not self._creator:
            raise PreconditionError(
                f"rmmd: shared buffer '{self._name}' was opened, not created, by this "
                "process: only its creator publishes it"
            )
        lib = _lib.load()
        if stream is None:
            check(lib.rmmd_buffer_publish(handle))
        else:
            s = stream_handle(stream)
            check(lib.rmmd_buffer_publish_on_stream(handle, s or None))
            self._stream = s
            # The stream object too: a CuPy or CUDA Python stream destroys its
            # handle when collected, and close() uses it later.
            self._stream_owner = stream
            if not self.is_host:
                self._ready_stream = s

    def close(self, stream: Any = None) -> None:
        """Lets go of this hold in `stream`'s order (``None``: the publish
        stream, else the legacy default stream; host buffers without a
        stream: at once). The memory goes back when the last holder is gone
        (unless persistent). While tensors made from it through DLPack live,
        the close happens when the last of them goes. Idempotent."""
        if self._handle is None:
            return
        s = self._stream if stream is None else stream_handle(stream)
        if self._exports > 0:
            self._close_pending = s or 0
            return
        handle, self._handle = self._handle, None
        check(self._close_fn(handle, s or None))

    def _dlpack_released(self) -> None:
        super()._dlpack_released()
        if self._exports == 0 and self._close_pending is not None and self._handle and not exiting():
            handle, self._handle = self._handle, None
            self._close_fn(handle, self._close_pending or None)

    def __enter__(self) -> "SharedBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle and not exiting():
            self._handle = None
            self._close_fn(handle, self._stream or None)

    def __repr__(self) -> str:
        where = "host" if self.is_host else f"device {self._device}"
        state = " closed" if self._handle is None else ""
        # A buffer of another node shows as it was opened, NODE:NAME.
        name = self._name if self._peer is None else f"{self._peer}:{self._name}"
        lease = f" write lease generation {self._lease_generation}" if self._lease_generation else ""
        return f"<rmmd.SharedBuffer '{name}' id={self._id} {self._nbytes} bytes on {where}{lease}{state}>"


def _open_options(
    what: str,
    peer: str | None,
    wait: float,
    writable: bool,
    expect: Mapping[str, str] | None,
    device: int | None,
    exclusive: bool = False,
    standby: bool = False,
    pinned: bool | None = None,
) -> "_lib.OpenOptions":
    """The C options of an open, checked (InvalidArgumentError) before any request."""
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
        raise InvalidArgumentError(
            f"rmmd: {what}: device is this process's CUDA ordinal "
            f"(an int >= 0) or None for the current one, not {device!r}"
        )
    if peer is not None and not isinstance(peer, str):
        raise InvalidArgumentError(f"rmmd: peer is a node's name (str), not {peer!r}")
    if wait < 0 or math.isnan(wait):
        raise InvalidArgumentError(f"rmmd: wait is {wait}; give seconds >= 0")
    if exclusive and not writable:
        raise InvalidArgumentError(
            f"rmmd: {what}: an exclusive open takes the write lease, so it is a writable open: "
            "pass writable=True too"
        )
    if standby and not exclusive:
        raise InvalidArgumentError(
            f"rmmd: {what}: a standby stands in line for the write lease, so it is an exclusive "
            "open: pass exclusive=True (and writable=True) too"
        )
    keys, values, count = _lib.label_arrays(checked_labels(expect, "expect"))
    return _lib.OpenOptions(
        size=ctypes.sizeof(_lib.OpenOptions),
        wait_ms=min(_MAX_WAIT_MS, int(math.ceil(wait * 1000))),
        access=_lib.BUFFER_READ_WRITE if writable else _lib.BUFFER_READ,
        expect_keys=keys,
        expect_values=values,
        expect_count=count,
        peer=peer.encode() if peer else None,
        has_device=0 if device is None else 1,
        device=0 if device is None else device,
        exclusive=1 if exclusive else 0,
        standby=1 if standby else 0,
        reserved_1=0,
        pin=_pinning(what, pinned),
    )


def _pinning(what: str, pinned: bool | None) -> int:
    """The C ABI's rmmd_pinning of a `pinned` argument (None, True, False)."""
    if pinned is None:
        return _lib.PINNING_AUTOMATIC
    if not isinstance(pinned, bool):
        raise InvalidArgumentError(
            f"rmmd: {what}: pinned is True (page-lock it), False (a plain mapping) or None "
            f"(page-locked where this process has a CUDA context already), not {pinned!r}"
        )
    return _lib.PINNING_REQUIRED if pinned else _lib.PINNING_OFF


def _name(name: str) -> bytes:
    if not isinstance(name, str):
        raise InvalidArgumentError(f"rmmd: a shared buffer's name is a str, not {name!r}")
    return name.encode()
