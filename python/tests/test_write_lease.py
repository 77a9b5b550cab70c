"""A shared buffer's write lease (docs/failover.md) from Python: the
exclusive open, its generation, the wait in line, DeadlineError, a holder
SIGKILLed while another process waits, and a standby: mapped before its
grant, read-only until then, granted at the same address."""

from __future__ import annotations

import json
import signal
import threading

import numpy as np
import pytest
from conftest import SCRIPTS, Daemon, read_line, start_python, wait_until

import rmmd

CLIENT = str(SCRIPTS / "host_client.py")


def make_kv(session: rmmd.Session, name: str) -> None:
    """A persistent host buffer others may write, which nobody holds."""
    with rmmd.SharedBuffer.create(
        session, name, 1 << 20, pool=session.host_pool, persistent=True, allow_writers=True
    ) as buf:
        buf.publish()


def test_the_lease_its_generation_the_wait_and_deadline_error(daemon: Daemon, session: rmmd.Session) -> None:
    make_kv(session, "lease/kv0")
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="standby") as standby:
        with pytest.raises(rmmd.InvalidArgumentError, match="writable=True"):
            rmmd.SharedBuffer.open(standby, "lease/kv0", exclusive=True)
        active = rmmd.SharedBuffer.open(session, "lease/kv0", writable=True, exclusive=True)
        assert active.exclusive and active.lease_generation == 1 and active.writable
        assert "write lease generation 1" in repr(active)
        with pytest.raises(rmmd.DeadlineError) as e:
            rmmd.SharedBuffer.open(standby, "lease/kv0", writable=True, exclusive=True, wait=0.05)
        assert isinstance(e.value, TimeoutError) and e.value.status == rmmd.Status.DEADLINE_EXCEEDED
        assert f"held by session {session.id}" in str(e.value)
        # A plain writer is refused while the lease is held; a reader is not.
        with pytest.raises(rmmd.PreconditionError, match="while a session holds the lease"):
            rmmd.SharedBuffer.open(standby, "lease/kv0", writable=True)
        rmmd.SharedBuffer.open(standby, "lease/kv0").close()

        got: list[rmmd.SharedBuffer] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                rmmd.SharedBuffer.open(standby, "lease/kv0", writable=True, exclusive=True, wait=30)
            )
        )
        waiter.start()
        wait_until(
            lambda: len(session.describe_buffer("lease/kv0")[0].lease.waiters) == 1,
            what="the standby in line",
        )
        info = session.describe_buffer("lease/kv0")[0]
        assert info.lease.holder_session == session.id and info.lease.generation == 1
        assert info.lease.waiters[0][0] == standby.id
        active.close()
        waiter.join(timeout=30)
        assert got and got[0].lease_generation == 2
        listed = [b for b in session.buffers(prefix="lease/") if b.name == "lease/kv0"][0]
        assert listed.lease.holder_session == standby.id and listed.lease.waiters == ()
        got[0].close()
    assert rmmd.SharedBuffer.delete(session, "lease/kv0") == 0


def test_a_sigkilled_holders_lease_goes_to_the_process_waiting(daemon: Daemon, session: rmmd.Session) -> None:
    make_kv(session, "lease/kv1")
    holder = start_python([CLIENT, "lease", "lease/kv1"], daemon.env())
    first = json.loads(read_line(holder))
    assert first["generation"] == 1 and first["seen"] == 0
    standby = start_python([CLIENT, "lease", "lease/kv1", "--wait", "60"], daemon.env())
    wait_until(
        lambda: len(session.describe_buffer("lease/kv1")[0].lease.waiters) == 1,
        what="the standby in line",
    )
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    second = json.loads(read_line(standby))
    # The next generation, and the bytes the dead holder wrote.
    assert second["generation"] == 2 and second["seen"] == 1
    standby.communicate("\n", timeout=60)
    with rmmd.SharedBuffer.open(session, "lease/kv1") as buf:
        assert int(np.asarray(buf).view(np.uint64)[0]) == 2
    assert rmmd.SharedBuffer.delete(session, "lease/kv1") == 0


def test_a_standby_is_mapped_at_once_and_granted_at_the_same_address(
    daemon: Daemon, session: rmmd.Session
) -> None:
    make_kv(session, "lease/kv2")
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="standby") as other:
        with pytest.raises(rmmd.InvalidArgumentError, match="exclusive=True"):
            rmmd.SharedBuffer.open(other, "lease/kv2", writable=True, standby=True)
        active = rmmd.SharedBuffer.open(session, "lease/kv2", writable=True, exclusive=True)
        np.asarray(active).view(np.uint64)[0] = 41
        standby = rmmd.SharedBuffer.open(other, "lease/kv2", writable=True, exclusive=True, standby=True)
        assert standby.exclusive and not standby.holds_lease and standby.lease_generation == 0
        before = standby.ptr
        assert int(np.asarray(standby).view(np.uint64)[0]) == 41  # it reads before its grant
        with pytest.raises(rmmd.DeadlineError) as e:
            standby.wait_lease(0.05)
        assert isinstance(e.value, TimeoutError) and "the standby stays in line" in str(e.value)
        info = session.describe_buffer("lease/kv2")[0]
        assert [w[0] for w in info.lease.waiters] == [other.id]  # still in line, as rmmctl shows
        with pytest.raises(rmmd.PreconditionError, match="stands in line"):
            rmmd.SharedBuffer.open(other, "lease/kv2", writable=True, exclusive=True, standby=True)

        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(standby.wait_lease(30)))
        waiter.start()
        active.close()
        waiter.join(timeout=30)
        assert got == [2]
        assert standby.holds_lease and standby.lease_generation == 2 and standby.ptr == before
        words = np.asarray(standby).view(np.uint64)
        assert int(words[0]) == 41
        words[0] = 2  # writable now, in place
        assert standby.wait_lease(0) == 2  # granted: at once
        standby.close()
    assert rmmd.SharedBuffer.delete(session, "lease/kv2") == 0


def test_a_standby_cannot_write_before_its_grant_and_takes_over_from_a_sigkill(
    daemon: Daemon, session: rmmd.Session
) -> None:
    make_kv(session, "lease/kv3")
    holder = start_python([CLIENT, "lease", "lease/kv3"], daemon.env())
    assert json.loads(read_line(holder))["generation"] == 1
    early = start_python([CLIENT, "standby", "lease/kv3", "--write-early"], daemon.env())
    assert json.loads(read_line(early))["standby"] == 0
    assert early.wait(timeout=30) == -signal.SIGSEGV
    standby = start_python([CLIENT, "standby", "lease/kv3"], daemon.env())
    first = json.loads(read_line(standby))
    assert first["standby"] == 0 and not first["holds"]
    wait_until(
        lambda: len(session.describe_buffer("lease/kv3")[0].lease.waiters) == 1,
        what="the standby in line",
    )
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    second = json.loads(read_line(standby))
    assert second == {"generation": 2, "seen": 1, "same": True, "holds": True}
    standby.communicate("\n", timeout=60)
    assert standby.returncode == 0
    assert rmmd.SharedBuffer.delete(session, "lease/kv3") == 0
