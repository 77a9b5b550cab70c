"""Sessions: what the daemon knows of them, pools, stats, closing."""

from __future__ import annotations

import os

import pytest
from conftest import Daemon, wait_until

import rmmd


def test_a_session_is_seen_by_the_daemon_under_its_client_name(daemon: Daemon) -> None:
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="py-seen") as s:
        assert s.id > 0
        mine = [x for x in daemon.sessions_of(os.getpid()) if int(x["session_id"]) == s.id]
        assert len(mine) == 1
        assert mine[0]["client_name"] == "py-seen"
    wait_until(lambda: not [x for x in daemon.sessions_of(os.getpid()) if int(x["session_id"]) == s.id],
               what="the closed session to leave the daemon's stats")


def test_runtime_dir_from_the_environment(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMMD_RUNTIME_DIR", str(daemon.runtime_dir))
    with rmmd.Session() as s:
        assert s.id > 0


def test_pools(session: rmmd.Session) -> None:
    pools = session.pools
    assert [p.name for p in pools] == ["host"]
    host = session.host_pool
    assert host == session.pool("host")
    assert host.is_host and host.backend == "host" and host.device == -1
    assert host.capacity_bytes == 64 << 20
    assert host.max_alignment >= 4096
    with pytest.raises(rmmd.NotFoundError, match="no pool is named 'gpu9'"):
        session.pool("gpu9")


def test_stats_are_rmmctls_with_ints(session: rmmd.Session, daemon: Daemon) -> None:
    stats = session.stats()
    (pool,) = stats["pools"]
    assert pool["pool"]["id"] == 0 and pool["pool"]["name"] == "host"
    assert pool["pool"]["capacity_bytes"] == 64 << 20  # an int, not protobuf's string
    assert pool["in_use_bytes"] == 0  # zeros are there too
    assert set(pool) == set(daemon.stats()["pools"][0])  # the fields rmmctl prints
    me = session.session_stats()
    assert me is not None and me["client_name"] == "pytest" and me["pid"] == os.getpid()
    assert me["bytes"] == 0


def test_a_closed_session_says_so(daemon: Daemon) -> None:
    s = rmmd.Session(runtime_dir=str(daemon.runtime_dir))
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(rmmd.SessionError, match="closed"):
        s.stats()
    with pytest.raises(ConnectionError):
        s.host_resource()


def test_resources_keep_the_daemons_session_after_close(daemon: Daemon) -> None:
    s = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="py-keep")
    r = s.host_resource()
    ident = s.id
    s.close()
    a = r.allocation(4096)  # the resource still works
    assert [x for x in daemon.sessions_of(os.getpid()) if int(x["session_id"]) == ident]
    a.free()
    r.close()
    wait_until(lambda: not [x for x in daemon.sessions_of(os.getpid()) if int(x["session_id"]) == ident],
               what="the session to close with its last resource")
