"""Named shared buffers in the host pool, between Python processes."""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest
from conftest import SCRIPTS, Daemon, read_line, run_python, start_python, wait_until

import rmmd

CLIENT = str(SCRIPTS / "host_client.py")


def test_a_buffer_one_process_writes_another_reads(daemon: Daemon) -> None:
    producer = start_python([CLIENT, "produce", "share/a", str(4 << 20)], daemon.env())
    made = json.loads(read_line(producer))
    assert made["nbytes"] == 4 << 20
    got = json.loads(run_python([CLIENT, "consume", "share/a"], daemon.env()).stdout)
    assert got == {"ok": True, "id": made["id"], "nbytes": 4 << 20, "session": got["session"]}
    out, err = producer.communicate("\n", timeout=60)
    assert json.loads(out) == {"closed": True} and err == "" and producer.returncode == 0
    # Its last holder gone, the buffer is freed and its name free again.
    wait_until(lambda: daemon.pool_in_use("host") == 0, what="the buffer to be freed")
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir)) as s:
        with pytest.raises(rmmd.NotFoundError):
            rmmd.SharedBuffer.open(s, "share/a")


def test_this_process_reads_what_another_wrote_through_its_own_mapping(
    daemon: Daemon, session: rmmd.Session
) -> None:
    producer = start_python([CLIENT, "produce", "share/b", "65536"], daemon.env())
    made = json.loads(read_line(producer))
    with rmmd.SharedBuffer.open(session, "share/b") as buf:
        assert buf.id == made["id"] and buf.is_host and buf.device == -1 and buf.name == "share/b"
        arr = np.asarray(buf)
        assert arr.ctypes.data == buf.ptr  # no copy
        expected = np.arange(16384, dtype=np.uint64) * 2654435761 % (1 << 32)
        assert np.array_equal(arr.view(np.uint32), expected.astype(np.uint32))
        assert np.array_equal(np.from_dlpack(buf).view(np.uint32)[:4], expected[:4].astype(np.uint32))
        assert not arr.flags.writeable  # opened for reading: mapped read-only
        with pytest.raises(ValueError, match="read-only"):
            arr[:4] = 0xEE
    producer.communicate("\n", timeout=60)


def test_a_consumer_started_first_waits_for_the_producer(daemon: Daemon) -> None:
    consumer = start_python([CLIENT, "consume", "share/late", "--wait", "60"], daemon.env())
    wait_until(lambda: daemon.sessions_of(consumer.pid), what="the consumer's session")
    producer = start_python([CLIENT, "produce", "share/late", "8192"], daemon.env())
    made = json.loads(read_line(producer))
    got = json.loads(read_line(consumer))
    assert got["ok"] and got["id"] == made["id"]
    assert consumer.wait(timeout=60) == 0
    producer.communicate("\n", timeout=60)


def test_a_persistent_buffer_outlives_its_creator_until_deleted(daemon: Daemon, session: rmmd.Session) -> None:
    producer = start_python([CLIENT, "produce", "share/kept", "8192", "--persistent"], daemon.env())
    read_line(producer)
    producer.communicate("\n", timeout=60)
    assert producer.returncode == 0
    got = json.loads(run_python([CLIENT, "consume", "share/kept"], daemon.env()).stdout)
    assert got["ok"]
    held = rmmd.SharedBuffer.open(session, "share/kept")
    assert rmmd.SharedBuffer.delete(session, "share/kept") == 1  # this session holds it
    with pytest.raises(rmmd.NotFoundError):
        rmmd.SharedBuffer.open(session, "share/kept")
    assert np.asarray(held).view(np.uint32)[1] == 2654435761 % (1 << 32)  # still usable
    held.close()
    wait_until(lambda: daemon.pool_in_use("host") == 0, what="the deleted buffer to be freed")


def test_close_waits_for_dlpack_tensors(daemon: Daemon, session: rmmd.Session) -> None:
    with rmmd.SharedBuffer.create(session, "share/dl", 4096, pool=session.host_pool) as buf:
        np.asarray(buf)[:] = 3
        buf.publish()
        other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="dl-reader")
        opened = rmmd.SharedBuffer.open(other, "share/dl")
        tensor = np.from_dlpack(opened)
        opened.close()
        assert not opened.closed  # the tensor still uses it
        stats = {s["session_id"]: s for s in daemon.stats()["sessions"]}
        assert int(stats[str(other.id)]["buffers_held"]) == 1
        assert int(tensor.sum()) == 3 * 4096
        with pytest.raises(rmmd.InvalidArgumentError, match="closed"):
            opened.__dlpack__()
        del tensor
        gc.collect()
        assert opened.closed
        stats = {s["session_id"]: s for s in daemon.stats()["sessions"]}
        assert int(stats[str(other.id)]["buffers_held"]) == 0
        other.close()


def test_a_creator_killed_before_publishing_leaves_nothing(daemon: Daemon, session: rmmd.Session) -> None:
    code = (
        "import rmmd, sys; s = rmmd.Session();"
        "b = rmmd.SharedBuffer.create(s, 'share/orphan', 1 << 20, pool=s.host_pool);"
        "print('made', flush=True); sys.stdin.readline()"
    )
    child = start_python(["-c", code], daemon.env())
    assert read_line(child) == "made"
    assert daemon.pool_in_use("host") >= 1 << 20
    child.kill()
    child.wait(timeout=30)
    wait_until(lambda: daemon.pool_in_use("host") == 0, what="the orphan to be freed")
    with rmmd.SharedBuffer.create(session, "share/orphan", 4096, pool=session.host_pool):
        pass  # the name is free again


def test_the_pid_of_a_holder_is_in_the_daemons_stats(daemon: Daemon) -> None:
    holder = start_python([CLIENT, "hold", str(1 << 20)], daemon.env())
    made = json.loads(read_line(holder))
    (mine,) = daemon.sessions_of(holder.pid)
    assert int(mine["session_id"]) == made["session"] and mine["client_name"] == "py-hold"
    assert int(mine["bytes"]) >= 1 << 20
    holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    wait_until(lambda: not daemon.sessions_of(holder.pid), what="the session to end")
    assert os.path.exists(daemon.runtime_dir)
