"""The ends of things: a client killed or exiting (the daemon reclaims what
it held, and nothing is printed), the daemon gone (calls fail with
SessionError, memory already mapped stays usable)."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from conftest import SCRIPTS, Daemon, read_line, run_python, start_python, wait_until

import rmmd

CLIENT = str(SCRIPTS / "host_client.py")


def test_a_killed_clients_memory_goes_back(daemon: Daemon) -> None:
    holder = start_python([CLIENT, "hold", str(8 << 20)], daemon.env())
    read_line(holder)
    assert daemon.pool_in_use("host") >= 8 << 20
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    wait_until(lambda: daemon.pool_in_use("host") == 0 and not daemon.sessions_of(holder.pid),
               what="the killed client's memory to go back")


def test_exit_without_closing_anything_prints_nothing(daemon: Daemon) -> None:
    out = run_python([CLIENT, "leave", str(1 << 20)], daemon.env())
    assert out.stderr == "" and out.stdout == ""
    wait_until(lambda: daemon.pool_in_use("host") == 0, what="the memory to go back")


def test_exit_through_an_exception_prints_only_the_traceback(daemon: Daemon) -> None:
    out = run_python([CLIENT, "raise", str(1 << 20)], daemon.env(), check=False)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: boom"
    assert not [line for line in lines if line.startswith("rmmd")]
    wait_until(lambda: daemon.pool_in_use("host") == 0, what="the memory to go back")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_the_daemon_gone(fresh_daemon, how: str) -> None:  # type: ignore[no-untyped-def]
    d: Daemon = fresh_daemon("--backend", "host", "--host-pool-bytes", "64MiB")
    # Without reconnecting (test_reconnect.py has that): the next call fails.
    s = rmmd.Session(runtime_dir=str(d.runtime_dir), client_name="orphaned", reconnect=0)
    r = s.host_resource()
    a = r.allocation(1 << 20)
    arr = np.asarray(a)
    arr[:] = 5
    d.kill(getattr(signal, how))
    with pytest.raises(rmmd.SessionError) as e:
        s.stats()
    assert isinstance(e.value, ConnectionError)
    assert e.value.status == rmmd.Status.SESSION
    with pytest.raises(rmmd.SessionError):
        r.allocate(4096)
    with pytest.raises(rmmd.SessionError):
        rmmd.SharedBuffer.create(s, "gone/x", 4096, pool=s.host_pool)
    with pytest.raises(rmmd.SessionError):
        rmmd.Session(runtime_dir=str(d.runtime_dir))
    if how == "SIGKILL":
        # What was mapped stays usable (a daemon that drains frees what the
        # sessions it cuts held, so their host memory reads as zeros then).
        assert int(arr.sum()) == 5 << 20
    del arr, a  # and letting go of it neither raises nor crashes
    r.close()
    s.close()


def test_a_client_whose_daemon_dies_ends_normally(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    d: Daemon = fresh_daemon("--backend", "host", "--host-pool-bytes", "64MiB")
    holder = start_python([CLIENT, "hold", str(1 << 20)], d.env())
    json.loads(read_line(holder))
    d.kill(signal.SIGKILL)
    out, err = holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    # Its free finds the daemon gone: what it freed went with the daemon, so
    # the free is done here, and nothing is printed (a session that does not
    # reconnect says so once for the resource).
    lines = err.strip().splitlines()
    assert len(lines) <= 1 and all("the daemon is gone" in line for line in lines), err
