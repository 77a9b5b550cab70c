"""rmmd.failover on a host pool (no GPU): the KV layout and its header,
create_kv and the labels guard, an active writer's stamps, and a standby
taking over from a SIGKILLed writer with the bytes and lengths it left."""

from __future__ import annotations

import json
import signal
import struct
from typing import Any

import numpy as np
import pytest
from conftest import SCRIPTS, Daemon, read_line, start_python, wait_until

import rmmd
from rmmd import failover

CLIENT = str(SCRIPTS / "failover_client.py")
LAYOUT = failover.KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, max_batch=3, max_length=16, dtype="float32")


def test_the_layout_its_json_fingerprint_and_tensors() -> None:
    assert failover.KVLayout.from_json(LAYOUT.to_json()) == LAYOUT
    assert LAYOUT.fingerprint == failover.KVLayout.from_json(LAYOUT.to_json()).fingerprint
    other = failover.KVLayout(2, 2, 8, 3, 17, "float32")
    assert other.fingerprint != LAYOUT.fingerprint and other.to_json() != LAYOUT.to_json()
    entries = LAYOUT.entries()
    assert [e.name for e in entries] == ["header", "tokens", "k.0", "v.0", "k.1", "v.1"]
    assert entries[0].offset == 0 and LAYOUT.header_bytes % 4096 == 0
    spans = sorted((e.offset, e.offset + e.nbytes) for e in entries)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans  # no overlap
    assert all(e.offset % 256 == 0 for e in entries) and spans[-1][1] <= LAYOUT.nbytes
    assert entries[2].shape == (3, 2, 16, 8) and LAYOUT.layer_bytes == 3 * 2 * 16 * 8 * 4
    assert "tokens" not in [e.name for e in failover.KVLayout(1, 1, 1, 1, 1, tokens=False).entries()]
    with pytest.raises(rmmd.InvalidArgumentError, match="max_length"):
        failover.KVLayout(1, 1, 1, 1, 0)
    with pytest.raises(rmmd.InvalidArgumentError, match="dtype"):
        failover.KVLayout(1, 1, 1, 1, 1, dtype="float13")


def test_the_header_decodes_and_refuses_what_is_not_its_layout() -> None:
    raw = LAYOUT.initial_header(seed=42)
    assert len(raw) == LAYOUT.header_bytes and raw[:8] == b"RMMDKV01"
    state = failover.KVState.decode(raw, LAYOUT)
    assert state == failover.KVState(generation=0, commits=0, seed=42, lengths=(0, 0, 0))
    assert LAYOUT.to_json().encode() in raw
    with pytest.raises(rmmd.PreconditionError, match="RMMDKV01"):
        failover.KVState.decode(bytes(len(raw)), LAYOUT)
    other = failover.KVLayout(2, 2, 8, 3, 32, "float32")
    with pytest.raises(rmmd.PreconditionError, match='"max_length":16'):
        failover.KVState.decode(raw, other)  # names the layout it holds
    words = bytearray(raw)
    struct.pack_into("<q", words, 8 * failover.W_VERSION, 9)
    with pytest.raises(rmmd.PreconditionError, match="format 9"):
        failover.KVState.decode(bytes(words), LAYOUT)


def test_create_kv_is_idempotent_and_the_labels_guard_refuses_another_model_or_layout(
    daemon: Daemon, session: rmmd.Session
) -> None:
    pool = session.host_pool
    assert failover.create_kv(session, "fo/kv0", LAYOUT, model="m1", pool=pool, labels={"rank": "0"})
    assert not failover.create_kv(session, "fo/kv0", LAYOUT, model="m1", pool=pool)
    info = session.describe_buffer("fo/kv0")[0]
    assert info.persistent and info.allow_writers and info.holders == 0 and info.nbytes >= LAYOUT.nbytes
    assert info.labels["failover.model"] == "m1" and info.labels["rank"] == "0"
    assert failover.KVLayout.from_json(info.labels["failover.layout"]) == LAYOUT
    other = failover.KVLayout(2, 2, 8, 3, 32, "float32")
    with pytest.raises(rmmd.PreconditionError, match="failover.layout"):
        failover.create_kv(session, "fo/kv0", other, model="m1", pool=pool)
    with pytest.raises(rmmd.PreconditionError, match="failover.model"):
        failover.standby(session, "fo/kv0", LAYOUT, model="m2")
    with pytest.raises(rmmd.PreconditionError, match="failover.layout"):
        failover.active(session, "fo/kv0", other, model="m1")
    assert session.describe_buffer("fo/kv0")[0].holders == 0  # nothing was left open
    assert rmmd.SharedBuffer.delete(session, "fo/kv0") == 0


def test_an_active_writer_stamps_after_its_data(daemon: Daemon, session: rmmd.Session) -> None:
    failover.create_kv(session, "fo/kv1", LAYOUT, model="m", pool=session.host_pool, seed=5)
    with failover.active(session, "fo/kv1", LAYOUT, model="m") as kv:
        assert kv.holds_lease and kv.generation == 1 and "lease generation 1" in repr(kv)
        assert kv.state() == failover.KVState(0, 0, 5, (0, 0, 0))
        assert isinstance(kv.keys[0], np.ndarray) and kv.keys[1].shape == (3, 2, 16, 8)
        kv.keys[1][:, :, 0, :] = 1.5
        kv.tokens[:, 0] = [11, 12, 13]
        kv.lengths[:] = [1, 1, 1]
        kv.engine[0] = 99
        kv.stamp()
        kv.stamp()
        state = kv.state()
        assert (state.generation, state.commits, state.lengths, state.engine[0]) == (1, 2, (1, 1, 1), 99)
        assert kv.wait(0) == (1, state)  # holds it already
        with pytest.raises(rmmd.DeadlineError):
            failover.active(rmmd.Session(runtime_dir=str(daemon.runtime_dir)), "fo/kv1", LAYOUT, model="m",
                            wait=0.05)
    rmmd.SharedBuffer.delete(session, "fo/kv1")


def everywhere(t: Any) -> bool:
    """Every element of a NumPy array or torch tensor is true."""
    return bool(t.all())


def address(t: Any) -> int:
    return int(t.data_ptr()) if hasattr(t, "data_ptr") else int(t.__array_interface__["data"][0])


def take_over(daemon: Daemon, session: rmmd.Session, name: str, **where: Any) -> None:
    """A writer process (failover_client.py) writes 4 steps and is SIGKILLed;
    a standby mapped beforehand takes over with its bytes and lengths; the
    next writer finds the standby's stamp. `where`: create_kv's pool or device."""
    failover.create_kv(session, name, LAYOUT, model="m", **where)
    writer = start_python([CLIENT, name, "m", LAYOUT.to_json(), "--steps", "4"], daemon.env())
    first = json.loads(read_line(writer))
    assert first["generation"] == 1 and first["now"]["lengths"] == [4, 4, 4] and first["now"]["commits"] == 4
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="standby") as s:
        kv = failover.standby(s, name, LAYOUT, model="m")
        assert not kv.holds_lease and kv.generation == 0
        before = kv.keys[0]
        assert float(before[0, 0, 3, 0]) == 3 + 1  # mapped before the grant: the writer's bytes
        assert not kv.buffer.holds_lease  # in line (its mapping read-only until the grant)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        generation, state = kv.wait(timeout=30)
        assert generation == 2 and kv.holds_lease
        assert state.generation == 1 and state.lengths == (4, 4, 4) and state.seed == 7 and state.commits == 4
        assert address(kv.keys[0]) == address(before)  # the grant keeps the addresses
        for step in range(4):
            assert everywhere(kv.keys[1][:, :, step, :] == step + 1)
            assert everywhere(kv.values[0][:, :, step, :] == step + 1)
        kv.lengths[:] = 5
        kv.stamp()
        assert kv.state().generation == 2 and kv.state().commits == 5
        del before, state
        kv.close()
    # The next writer finds the standby's stamp.
    again = start_python([CLIENT, name, "m", LAYOUT.to_json(), "--steps", "1"], daemon.env())
    third = json.loads(read_line(again))
    assert third["generation"] == 3 and third["found"]["generation"] == 2 and third["found"]["lengths"] == [5, 5, 5]
    assert again.stdin is not None
    again.stdin.write("\n")
    again.stdin.flush()
    assert again.wait(timeout=30) == 0
    wait_until(lambda: session.describe_buffer(name)[0].holders == 0, what="the writer to let go")
    rmmd.SharedBuffer.delete(session, name)


def test_a_standby_takes_over_from_a_sigkilled_writer_where_it_stopped(daemon: Daemon, session: rmmd.Session) -> None:
    take_over(daemon, session, "fo/kv2", pool=session.host_pool)
