"""A session that makes no call while rmmd, under a service manager that
keeps its fd store (service_manager.py), is SIGKILLed and started again:
whichever call it makes first afterwards reconnects and is answered by the
new daemon, which serves the persistent buffer published before the
restart again. tests/integration/reconnect_test.cpp (IdleRestart) checks
the same for every C++ call and every C ABI call that talks to the
daemon."""

from __future__ import annotations

import signal
from typing import Any, Callable

import pytest
from conftest import Daemon

import rmmd

HOST = ("--backend", "host", "--host-pool-bytes", "64MiB")
KEPT = "idle/kept"


def _allocate(s: rmmd.Session) -> Any:
    r = s.host_resource()
    r.deallocate(r.allocate(4096), 4096)
    r.close()


def _create(s: rmmd.Session) -> Any:
    with rmmd.SharedBuffer.create(s, "idle/new", 4096, pool=s.host_pool) as b:
        b.set_manifest([], labels={"model": "fresh"})
        b.publish()


def _open(s: rmmd.Session) -> Any:
    rmmd.SharedBuffer.open(s, KEPT, expect={"model": "idle"}).close()


def _open_by_labels(s: rmmd.Session) -> Any:
    rmmd.SharedBuffer.open_by_labels(s, {"model": "idle"}).close()


def _buffers(s: rmmd.Session) -> Any:
    assert [b.name for b in s.buffers()] == [KEPT]


CALLS: dict[str, Callable[[rmmd.Session], Any]] = {
    "stats": lambda s: s.stats(),
    "session_stats": lambda s: s.session_stats(),
    "buffers": _buffers,
    "describe_buffer": lambda s: s.describe_buffer(KEPT),
    "peers": lambda s: s.peers(),
    "SharedBuffer.open": _open,
    "SharedBuffer.open_by_labels": _open_by_labels,
    "SharedBuffer.create": _create,
    "SharedBuffer.delete": lambda s: rmmd.SharedBuffer.delete(s, KEPT),
    "host_resource.allocate": _allocate,
}


@pytest.mark.parametrize("call", list(CALLS))
def test_the_first_call_after_an_idle_restart_reconnects(fresh_daemon, capfd, call: str) -> None:  # type: ignore[no-untyped-def]
    d: Daemon = fresh_daemon(*HOST, keep_buffers=True)
    with rmmd.Session(runtime_dir=str(d.runtime_dir), reconnect=0) as producer:
        with rmmd.SharedBuffer.create(producer, KEPT, 4096, pool=producer.host_pool,
                                      persistent=True) as b:
            b.set_manifest([], labels={"model": "idle"})
            b.publish()
    d.wait_until_kept([KEPT])
    s = rmmd.Session(runtime_dir=str(d.runtime_dir), client_name="py-idle", reconnect=120.0)
    d.restart(signal.SIGKILL)
    result = CALLS[call](s)
    assert s.reconnects == 1
    if call == "session_stats":
        assert result is not None and result["client_name"] == "py-idle", result
    err = capfd.readouterr().err
    assert err.count("reconnected to the daemon at") == 1, err
    s.close()
