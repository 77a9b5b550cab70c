"""Sessions that reconnect when their daemon is killed and started again on
the same runtime directory (``rmmd.Session(reconnect=..., on_reconnect=...)``):
host memory held from before stays usable and is freed locally, new
allocations come from the new daemon, the callback runs once per restart;
with ``reconnect=0`` the next call raises SessionError as before.
tests/integration/reconnect_test.cpp checks the same in C++, and the GPU
test below PyTorch's MemPool on rmmd across restarts."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import numpy as np
import pytest
from conftest import SCRIPTS, Daemon, need_gpu, need_module, read_line, start_python

import rmmd

HOST = ("--backend", "host", "--host-pool-bytes", "64MiB")


def mine(d: Daemon, session_id: int) -> dict[str, Any]:
    found = [s for s in d.sessions_of(os.getpid()) if int(s["session_id"]) == session_id]
    assert len(found) == 1, d.stats()
    return found[0]


# SIGTERM: a graceful stop (systemctl restart) closes the sessions itself and
# frees what they held; memory a reconnecting client still maps must keep
# its bytes all the same: the stopping daemon neither zeroes nor punches it.
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_host_memory_rides_through_three_restarts(fresh_daemon, capfd, stop) -> None:  # type: ignore[no-untyped-def]
    d: Daemon = fresh_daemon(*HOST)
    told: list[rmmd.ReconnectInfo] = []
    s = rmmd.Session(runtime_dir=str(d.runtime_dir), client_name="py-rider", reconnect=30.0,
                     on_reconnect=told.append)
    r = s.host_resource()
    held = [r.allocation(1 << 20) for _ in range(2)]
    for i, a in enumerate(held):
        np.asarray(a)[:] = i + 1
    for restart in range(1, 4):
        previous = s.id
        d.restart(stop)
        for i, a in enumerate(held):  # still there, still writable
            arr = np.asarray(a)
            assert int(arr.min()) == int(arr.max()) == i + restart
            arr += 1
        fresh = r.allocation(1 << 20)  # reconnects; from the new daemon
        np.asarray(fresh)[:] = 9
        assert s.reconnects == restart
        assert len(told) == restart
        assert told[-1].reconnects == restart and told[-1].previous_session_id == previous
        assert told[-1].session_id == s.id
        assert mine(d, s.id)["client_name"] == "py-rider"
        assert int(mine(d, s.id)["bytes"]) == 1 << 20  # the new allocation only
        del fresh
        assert d.pool_in_use("host") == 0
    del held  # freed here: the daemons that lent them are gone
    assert d.pool_in_use("host") == 0
    err = capfd.readouterr().err
    assert err.count("reconnected to the daemon at") == 3, err
    r.close()
    s.close()


def test_reconnect_off_raises_as_before(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    d: Daemon = fresh_daemon(*HOST)
    s = rmmd.Session(runtime_dir=str(d.runtime_dir), reconnect=0)
    r = s.host_resource()
    d.restart(signal.SIGKILL)
    with pytest.raises(rmmd.SessionError, match="daemon is gone"):
        r.allocate(4096)
    assert s.reconnects == 0
    r.close()
    s.close()


def test_a_negative_reconnect_is_refused() -> None:
    with pytest.raises(rmmd.InvalidArgumentError, match="reconnect"):
        rmmd.Session(runtime_dir="/nonexistent", reconnect=-1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["slab", "direct"])
def test_torch_mempool_rides_through_restarts(fresh_daemon, mode: str) -> None:  # type: ignore[no-untyped-def]
    need_gpu()
    need_module("torch")
    d: Daemon = fresh_daemon("--backend", "cuda", "--cuda-pool-bytes", "4GiB",
                             "--host-pool-bytes", "64MiB")
    child = start_python([str(SCRIPTS / "torch_client.py"), "restarts", "mempool", mode, "3"],
                         d.env())
    first = json.loads(read_line(child))
    assert first["ready"]
    pid = int(first["pid"])
    assert child.stdin is not None
    for r in range(1, 4):
        d.restart(signal.SIGKILL)
        child.stdin.write("\n")
        child.stdin.flush()
        said = json.loads(read_line(child))
        # Round r's tensor is r * 96 MiB: larger than what PyTorch cached,
        # so it comes from rmmd, which reconnects to the new daemon.
        assert said == {"round": r, "old_ok": True, "new_ok": True,
                        "new_bytes": r * (96 << 20)}, said
        sessions = d.sessions_of(pid)
        assert len(sessions) == 1, sessions  # the reconnected session, and no other
    child.stdin.write("\n")
    child.stdin.flush()
    last = json.loads(read_line(child))
    assert last["done"]
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert err.count("reconnected to the daemon at") == 3, err
