"""rmmd.Session: one session with the node's daemon (rmmd::session)."""

from __future__ import annotations

import ctypes
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from . import _lib
from ._common import OwnsHandle
from ._errors import InvalidArgumentError, NotFoundError, SessionError, check
from ._manifest import BufferInfo, Manifest, checked_labels

if TYPE_CHECKING:
    from ._resource import DeviceResource, HostResource


@dataclass(frozen=True)
class ReconnectInfo:
    """What a Session that reconnected to a restarted daemon passes to its
    ``on_reconnect`` callable (``rmmd::reconnect_info``)."""

    previous_session_id: int
    """The id the daemon that went away gave the session."""
    session_id: int
    """The new daemon's id for it (``Session.id`` now)."""
    reconnects: int
    """The session's reconnects so far, this one included."""
    buffers_held_again: int
    """Open shared buffers the new daemon holds for the session again."""
    buffers_unknown: int
    """Open shared buffers the new daemon does not know (they stay mapped)."""


@dataclass(frozen=True)
class PeerInfo:
    """Another node's daemon this node's daemon peers with (``rmmctl
    peers``; ``rmmd.v1.PeerInfo``)."""

    node_name: str
    address: str
    """HOST:PORT of its peer listener (dialed), or where it came from (accepted)."""
    identity: str
    """The subject of the certificate it showed ("CN=rmmd-nodeA,...")."""
    direction: str
    """"dialed" (in peering.peers), "accepted" (it dialed us) or "both"."""
    state: str
    """"connecting", "ready", "probe_failed" or "unreachable"."""
    problem: str
    """In words, where the state is not "ready"."""
    probe_ok: bool
    """This node imported the peer's probe allocation and read it back."""
    their_probe_ok: bool
    """The peer imported this node's probe."""
    holds_we_have: int
    """This node's clients' holds on the peer's buffers."""
    bytes_we_hold: int
    holds_they_have: int
    """The peer's holds on this node's buffers."""
    bytes_they_hold: int
    last_contact_unix_ms: int

    @property
    def ready(self) -> bool:
        """Its buffers can be opened: ``state == "ready"``."""
        return self.state == "ready"

    @classmethod
    def _from_json(cls, d: dict[str, Any]) -> "PeerInfo":
        def num(key: str) -> int:
            return int(d.get(key, 0) or 0)

        return cls(
            node_name=d.get("node_name", ""),
            address=d.get("address", ""),
            identity=d.get("identity", ""),
            direction=d.get("direction", ""),
            state=d.get("state", ""),
            problem=d.get("problem", ""),
            probe_ok=bool(d.get("probe_ok", False)),
            their_probe_ok=bool(d.get("their_probe_ok", False)),
            holds_we_have=num("holds_we_have"),
            bytes_we_hold=num("bytes_we_hold"),
            holds_they_have=num("holds_they_have"),
            bytes_they_hold=num("bytes_they_hold"),
            last_contact_unix_ms=num("last_contact_unix_ms"),
        )


@dataclass(frozen=True)
class Pool:
    """One of the daemon's pools, as this process sees it (``rmmctl pools``)."""

    id: int
    name: str
    backend: str
    """``"cuda"`` or ``"host"``."""
    device: int
    """This process's CUDA ordinal of the pool's GPU (matched by UUID, so
    ``CUDA_VISIBLE_DEVICES`` may renumber); -1 for host pools and for a GPU
    this process cannot see."""
    capacity_bytes: int
    max_alignment: int
    pinnable: bool = False
    """Host pools: usable page-locked, from the GPU too."""
    has_fabric_handle: bool = False
    gpu_uuid: str = ""
    pci_bus_id: str = ""

    @property
    def is_host(self) -> bool:
        return self.backend == "host"

    @classmethod
    def _from_json(cls, d: dict[str, Any]) -> "Pool":
        known = {f: d[f] for f in cls.__dataclass_fields__ if f in d}
        return cls(**known)


# The 64-bit fields of rmmd.v1.Stats, which protobuf's JSON mapping writes as
# strings; stats() gives them as ints.
_INT64_FIELDS = frozenset(
    {
        "capacity_bytes",
        "max_alignment",
        "in_use_bytes",
        "high_water_bytes",
        "allocation_count",
        "total_allocations",
        "backend_reserved_bytes",
        "backend_used_bytes",
        "release_threshold_bytes",
        "carved_bytes",
        "carved_allocations",
        "idle_bytes",
        "reclaimable_bytes",
        "reclaim_waits",
        "reclaim_served",
        "reclaim_refused",
        "shared_buffers",
        "shared_bytes",
        "shared_holders",
        "session_id",
        "bytes",
        "started_unix_ms",
        "buffers_held",
    }
)


def _ints(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: (int(v) if k in _INT64_FIELDS and isinstance(v, str) else _ints(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


class Session(OwnsHandle):
    """A session with the node's rmmd daemon: what every resource and shared
    buffer is made from.

    The daemon knows the process by the session socket's peer credentials,
    counts what the session holds against its quotas, and frees it all when
    the session ends (``close()``, or the process's exit, even by SIGKILL).

    Args:
        runtime_dir: the daemon's runtime directory; ``None``:
            ``$RMMD_RUNTIME_DIR``, else ``/run/rmmd``.
        client_name: shown by ``rmmctl stats`` beside the session.
        use_grpc: send Allocate and Free as gRPC calls instead of datagrams on
            the session socket.
        import_by_fabric: import CUDA pools by fabric handle (needs an IMEX
            channel).
        call_timeout_ms: how long one call to the daemon may take; 0: 30 s.
        reconnect: seconds to wait, when the daemon goes away (a restart, an
            upgrade, a crash), for one to serve the runtime directory again,
            then reconnect to it; ``0`` or ``None``: never (every later call
            raises SessionError). Memory held from before stays valid and is
            freed locally; new allocations come from the new daemon; open
            shared buffers stay mapped and are held again where the new daemon
            has them. Calls made meanwhile wait. One line on stderr per
            reconnect. A daemon that does not come back in time: calls raise
            SessionError, as without reconnect.
        on_reconnect: called with a :class:`ReconnectInfo` after each
            reconnect, on the thread that reconnected (a caller's, or the
            session's own); it may use the session. What it raises is printed
            and dropped.

    Raises:
        SessionError: no daemon answers there, or it refused the session.
        PermissionError: this uid or gid may not use the daemon.

    A Session may be used from several threads; it must not be closed while
    another thread uses it. Resources and buffers made from it keep the
    daemon's session open until they are gone too.
    """

    def __init__(
        self,
        runtime_dir: str | None = None,
        client_name: str | None = None,
        use_grpc: bool = False,
        import_by_fabric: bool = False,
        call_timeout_ms: int = 0,
        reconnect: float | None = 60.0,
        on_reconnect: Callable[[ReconnectInfo], None] | None = None,
    ) -> None:
        self._handle: int | None = None
        lib = _lib.load()
        if reconnect is not None and reconnect < 0:
            raise InvalidArgumentError(
                f"rmmd: reconnect={reconnect!r}: give seconds to wait for a daemon to come "
                "back, or 0 (or None) for no reconnect"
            )
        reconnect_ms = -1 if not reconnect else max(1, int(reconnect * 1000))
        # Kept as long as the session: the C library calls it.
        self._on_reconnect = (
            _lib.reconnect_fn(0) if on_reconnect is None else _reconnect_callback(on_reconnect)
        )
        options = _lib.SessionOptions(
            size=ctypes.sizeof(_lib.SessionOptions),
            runtime_dir=None if runtime_dir is None else str(runtime_dir).encode(),
            client_name=None if client_name is None else client_name.encode(),
            use_grpc=1 if use_grpc else 0,
            import_by_fabric=1 if import_by_fabric else 0,
            call_timeout_ms=int(call_timeout_ms),
            on_reconnect=self._on_reconnect,
            on_reconnect_user_data=None,
            reconnect_ms=reconnect_ms,
        )
        handle = _lib.session_t()
        check(lib.rmmd_session_create(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle.value
        self._destroy = lib.rmmd_session_destroy
        self._pools: list[Pool] | None = None

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Ends this object's share of the session: the daemon closes it once
        every resource and buffer made from it is gone too. Idempotent."""
        super().close()

    def __enter__(self) -> "Session":
        return self

    def _require(self) -> int:
        if self._handle is None:
            raise SessionError("rmmd: this Session was closed")
        return self._handle

    # -- what it is ---------------------------------------------------------

    @property
    def id(self) -> int:
        """The daemon's id for this session (``rmmctl stats`` shows it)."""
        value = ctypes.c_uint64()
        check(_lib.load().rmmd_session_id(self._require(), ctypes.byref(value)))
        return value.value

    @property
    def reconnects(self) -> int:
        """How many times this session has reconnected to a restarted daemon."""
        value = ctypes.c_uint32()
        check(_lib.load().rmmd_session_reconnects(self._require(), ctypes.byref(value)))
        return value.value

    @property
    def pools(self) -> list[Pool]:
        """The daemon's pools (from the session's welcome)."""
        if self._pools is None:
            out = ctypes.c_void_p()
            check(_lib.load().rmmd_session_pools_json(self._require(), ctypes.byref(out)))
            self._pools = [Pool._from_json(p) for p in json.loads(_lib.take_string(out.value))]
        return list(self._pools)

    def pool(self, name: str) -> Pool:
        """The pool named `name`; NotFoundError if there is none."""
        for p in self.pools:
            if p.name == name:
                return p
        raise NotFoundError(
            f"rmmd: no pool is named '{name}'; the daemon serves: "
            + ", ".join(p.name for p in self.pools)
        )

    @property
    def host_pool(self) -> Pool:
        """The first host pool (every daemon serves one)."""
        for p in self.pools:
            if p.is_host:
                return p
        raise NotFoundError("rmmd: the daemon serves no host pool")

    def stats(self) -> dict[str, Any]:
        """The daemon's stats, as ``rmmctl stats --json`` prints them
        (``rmmd.v1.Stats``: ``pools`` and ``sessions``), with the 64-bit
        counts as ints."""
        out = ctypes.c_void_p()
        check(_lib.load().rmmd_session_stats_json(self._require(), ctypes.byref(out)))
        return _ints(json.loads(_lib.take_string(out.value)))

    def session_stats(self) -> dict[str, Any] | None:
        """This session's entry in :meth:`stats` (``None`` if it is missing)."""
        stats = self.stats()  # may reconnect, which gives the session a new id
        me = self.id
        for s in stats.get("sessions", []):
            if s.get("session_id") == me:
                return s
        return None

    # -- shared buffers -----------------------------------------------------

    def buffers(
        self, prefix: str = "", labels: Mapping[str, str] | None = None, peer: str | None = None
    ) -> list[BufferInfo]:
        """The shared buffers this process may see (its uid's, its groups'
        and, for root, all; ``rmmctl buffers``), by name: those whose name
        starts with `prefix` and whose manifest carries every one of
        `labels` with that value.

        With `peer` (a node's name as this node's rmmd.conf names it in
        peering.peers), that node's buffers instead: those its grant lets
        this node open, published and in a fabric pool (at most 4096), each
        with ``peer`` set; open one as ``"NODE:NAME"``. NotFoundError for a
        node peering.peers does not name, SessionError while it cannot be
        reached."""
        if not isinstance(prefix, str):
            raise InvalidArgumentError(f"rmmd: prefix is a str, not {prefix!r}")
        if peer is not None and not isinstance(peer, str):
            raise InvalidArgumentError(f"rmmd: peer is a node's name (str), not {peer!r}")
        keys, values, count = _lib.label_arrays(checked_labels(labels, "labels"))
        out = ctypes.c_void_p()
        check(
            _lib.load().rmmd_buffer_list_peer_json(
                self._require(),
                peer.encode() if peer else None,
                prefix.encode() if prefix else None,
                keys,
                values,
                count,
                ctypes.byref(out),
            )
        )
        listed = json.loads(_lib.take_string(out.value) or "{}")
        return [BufferInfo._from_wire(b) for b in listed.get("buffers", [])]

    def describe_buffer(self, name: str) -> tuple[BufferInfo, Manifest]:
        """One buffer and its manifest by name, without opening it.
        NotFoundError for a name this process may not see."""
        if not isinstance(name, str):
            raise InvalidArgumentError(f"rmmd: a shared buffer's name is a str, not {name!r}")
        out = ctypes.c_void_p()
        check(_lib.load().rmmd_buffer_describe_json(self._require(), name.encode(), ctypes.byref(out)))
        described = json.loads(_lib.take_string(out.value) or "{}")
        return BufferInfo._from_wire(described.get("info", {})), Manifest._from_wire(described.get("manifest"))

    # -- other nodes --------------------------------------------------------

    def _peers_listing(self) -> dict[str, Any]:
        out = ctypes.c_void_p()
        check(_lib.load().rmmd_peers_json(self._require(), ctypes.byref(out)))
        return json.loads(_lib.take_string(out.value) or "{}")

    @property
    def node_name(self) -> str | None:
        """This node's name as its daemon's peering.node_name says it (what
        other nodes put before ``':'`` to open its buffers); ``None`` where
        peering is off."""
        return self._peers_listing().get("node_name") or None

    def peers(self) -> list[PeerInfo]:
        """The other nodes' daemons this node's daemon peers with (``rmmctl
        peers``): state, the fabric probe both ways, holds each way. Empty
        where peering is off (docs/operations.md, "Across nodes")."""
        return [PeerInfo._from_json(p) for p in self._peers_listing().get("peers", [])]

    def peer(self, node_name: str) -> PeerInfo | None:
        """The peer named `node_name` in :meth:`peers`; ``None`` where this
        node's daemon has none of that name (not in its peering.peers, and
        it has not dialed in), as after a peer's restart until it has."""
        if not isinstance(node_name, str):
            raise InvalidArgumentError(f"rmmd: a node's name is a str, not {node_name!r}")
        return next((p for p in self.peers() if p.node_name == node_name), None)

    # -- resources ----------------------------------------------------------

    def host_resource(self, pool: str | Pool | None = None, pinned: bool = False) -> "HostResource":
        """A resource of shared host memory (rmmd::host_memory_resource, or
        rmmd::pinned_host_memory_resource with `pinned`: page-locked, so
        the GPU reaches it too). `pool`: a host pool (name or Pool); ``None``:
        the first."""
        from ._resource import HostResource

        return HostResource(self, pool=pool, pinned=pinned)

    def device_resource(
        self,
        device: int | None = None,
        mode: str = "slab",
        pool: str | Pool | None = None,
        lanes: int | str = "auto",
        graph_safe: bool | None = None,
    ) -> "DeviceResource":
        """A resource of device memory (rmmd::ipc_memory_resource) from the
        CUDA pool of `device` (``None``: the current device) or the pool
        named `pool`. `mode`: ``"slab"`` (carve allocations out of leased
        slabs in this process: fast) or ``"direct"`` (one daemon allocation
        each: for few, large or long-lived buffers; up to 64 KiB a packed
        lease). `lanes` (slab mode): carving lanes, one RMM pool each, a
        thread's allocations carved by one, so that threads allocating at
        once do not queue on one lock. ``"auto"`` (the default): one lane
        while one thread allocates, a lane per allocating thread once a
        second one does, up to the process's CPUs (at most 16); 1 to 16:
        that many. Each lane leases slabs of its own; idle ones go back as
        any idle slab does, and show in ``rmmctl stats`` as idle bytes.
        `graph_safe` (CUDA graphs, slab mode): ``True`` asks CUDA on every
        allocation and free whether the stream is capturing (about 30 ns
        each): memory freed during a capture stays the graph's until the
        graph is destroyed. ``False`` or ``None`` (the default) asks only
        where a slab would be leased: carving under capture does what RMM's
        pool does, and memory freed during a capture is the slab's again at
        once. Direct mode checks every call whatever it says."""
        from ._resource import DeviceResource

        return DeviceResource(
            self, device=device, mode=mode, pool=pool, lanes=lanes, graph_safe=graph_safe
        )

    def __repr__(self) -> str:
        if self._handle is None:
            return "<rmmd.Session closed>"
        return f"<rmmd.Session id={self.id}>"


def pool_name(pool: str | Pool | None) -> bytes | None:
    if pool is None:
        return None
    if isinstance(pool, Pool):
        return pool.name.encode()
    if isinstance(pool, str):
        return pool.encode()
    raise InvalidArgumentError(f"rmmd: pool must be a name or a Pool, not {pool!r}")


def _reconnect_callback(on_reconnect: Callable[[ReconnectInfo], None]) -> Any:
    """on_reconnect as the C library calls it (ctypes takes the GIL)."""

    def call(_user: int | None, info: Any) -> None:
        i = info.contents
        try:
            on_reconnect(
                ReconnectInfo(
                    previous_session_id=i.previous_session_id,
                    session_id=i.session_id,
                    reconnects=i.reconnects,
                    buffers_held_again=i.buffers_held_again,
                    buffers_unknown=i.buffers_unknown,
                )
            )
        except BaseException as e:  # noqa: BLE001 - nothing may cross into C
            print(f"rmmd: on_reconnect raised {e!r}", file=sys.stderr)

    return _lib.reconnect_fn(call)
