"""A persistent host buffer that outlives rmmd: the daemon runs under this
process as its service manager with an fd store (Daemon(keep_buffers=True)),
is SIGKILLed and started again three times, and the buffer comes back each
time with its bytes and manifest; a consumer session that reconnects keeps
reading the mapping it had and opens the buffer again by name; a process
started after the restarts opens it too. tests/integration/
buffers_outlive_daemon_test.cpp checks the same in C++ (and the corrupt,
missing and unknown cases), test_restart_gpu.py the GPU case with PyTorch
and CuPy."""

from __future__ import annotations

import json
import signal
import subprocess

import numpy as np
from conftest import RMMCTL, SCRIPTS, Daemon, read_line, run_python, start_python, wait_until

import rmmd

CLIENT = str(SCRIPTS / "host_client.py")
NAME = "team/kept-weights"
NBYTES = 1 << 20
EXPECT = {"model": "pattern", "revision": "r1"}


def pattern(nbytes: int) -> np.ndarray:
    """What host_client.py produce writes."""
    return (np.arange(nbytes // 4, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)


def test_a_persistent_host_buffer_rides_through_three_sigkills(kept_daemon: Daemon, capfd) -> None:  # type: ignore[no-untyped-def]
    d = kept_daemon
    want = pattern(NBYTES)
    producer = start_python([CLIENT, "produce", NAME, str(NBYTES), "--persistent", "--manifest"], d.env())
    made = json.loads(read_line(producer))
    d.wait_until_kept([NAME])
    assert d.restart_stats()["keeping_buffers"], d.stats()

    told: list[rmmd.ReconnectInfo] = []
    s = rmmd.Session(runtime_dir=str(d.runtime_dir), client_name="py-kept-reader", reconnect=30.0,
                     on_reconnect=told.append)
    held = rmmd.SharedBuffer.open(s, NAME, expect=EXPECT)
    assert held.id == made["id"]
    held_view = np.asarray(held).view(np.uint32)
    assert np.array_equal(held_view, want)
    before = s.describe_buffer(NAME)
    assert before[1].labels["revision"] == "r1" and list(before[1]) == ["pattern"]
    # The creator lets go: the daemon (and the fd store) and this reader hold it.
    out, err = producer.communicate("\n", timeout=60)
    assert producer.returncode == 0 and json.loads(out.splitlines()[-1]) == {"closed": True}, err

    for restart in range(1, 4):
        previous = s.id
        d.restart(signal.SIGKILL)
        # The mapping this process had reads the same bytes, daemon or none.
        assert np.array_equal(held_view, want)
        # The next call reconnects; the buffer is there by name, same bytes,
        # same manifest, the same uid's and persistent.
        with rmmd.SharedBuffer.open(s, NAME, expect=EXPECT) as again:
            assert np.array_equal(np.asarray(again).view(np.uint32), want)
            assert np.array_equal(held_view, np.asarray(again).view(np.uint32))
        assert s.reconnects == restart and len(told) == restart
        assert told[-1].previous_session_id == previous and told[-1].session_id == s.id
        info, manifest = s.describe_buffer(NAME)
        assert manifest == before[1]
        assert info.persistent and info.published and info.nbytes == NBYTES, info
        assert info.creator_uid == before[0].creator_uid and info.pool == "host", info
        # The reader's open buffer is held again through its new session.
        assert info.holders == 1, info
        figures = d.restart_stats()
        assert figures["restarts"] == restart, figures
        assert figures["readopted_buffers"] == 1 and figures["readopted_bytes"] >= NBYTES, figures
        assert figures["dropped_at_start"] == 0 and figures["keeping_buffers"], figures
        assert d.wait_for_stored([NAME]), d.stored_buffers()
        assert d.pool_in_use("host") >= NBYTES  # charged to the pool again

    err = capfd.readouterr().err
    assert err.count("reconnected to the daemon at") == 3, err
    assert err.count("1 open shared buffer(s) held again") == 3, err
    # A process that started after the restarts opens it by name.
    got = json.loads(run_python([CLIENT, "consume", NAME], d.env()).stdout)
    assert got["ok"] and got["nbytes"] == NBYTES, got
    text = subprocess.run([str(RMMCTL), "stats"], env=d.env(), capture_output=True, text=True, timeout=30)
    assert "restarts: 3; buffers served again after the last: 1 (" in text.stdout, text.stdout

    del held_view
    held.close()
    s.close()
    # Deleted: out of the store and the state file, and the pool is empty.
    d.rmmctl("buffers", "delete", NAME)
    assert d.wait_for_stored([]), d.stored_buffers()
    wait_until(lambda: d.state_file_buffers() == [], what="the state file to record no buffer")
    wait_until(lambda: d.pool_in_use("host") == 0, what="the host pool to be empty")
    d.restart(signal.SIGKILL)
    assert [b["name"] for b in d.stats().get("buffers", [])] == []
    assert d.pool_in_use("host") == 0
    assert d.manager is not None and d.manager.log() == [], d.manager.log()


def test_a_delete_the_client_heard_of_survives_a_sigkill_right_after_it(kept_daemon: Daemon) -> None:
    # As a publish is answered once the buffer is kept, a delete is answered
    # once it is out of the store and the state file: a SIGKILL the moment
    # the client hears "deleted" does not bring the buffer back.
    d = kept_daemon
    s = rmmd.Session(runtime_dir=str(d.runtime_dir), client_name="py-deleter", reconnect=30.0)
    for round_ in range(5):
        name = f"team/deleted-{round_}"
        with rmmd.SharedBuffer.create(s, name, 1 << 20, pool=s.host_pool, persistent=True) as buf:
            buf.publish()
        d.wait_until_kept([name])
        assert rmmd.SharedBuffer.delete(s, name) == 0
        d.restart(signal.SIGKILL)
        assert s.buffers(prefix="team/") == [], f"round {round_}: the deleted buffer is served again"
        assert d.stored_buffers() == [] and d.pool_in_use("host") == 0, d.stored_buffers()
    s.close()
