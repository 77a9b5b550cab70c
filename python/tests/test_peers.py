"""Buffers of another node (NODE:NAME, peer=) and Session.peers(), against a
daemon without peering: what the package refuses before it asks, and the
empty list of peers. The two-daemon case runs on the GPU host
(tests/gpu/peering_test.cpp)."""

from __future__ import annotations

import dataclasses

import pytest

import rmmd


@pytest.mark.parametrize(
    ("name", "peer", "says"),
    [
        ("nodeA:models:llama", None, "it has ':' twice"),
        ("a::b", None, "it has ':' twice"),
        (":models/llama", None, "the node before ':' is empty"),
        ("node/A:w", None, r"byte 4 of the node name \(0x2f\) is not allowed"),
        ("nodeA:", None, "the name is empty"),
        ("w", "bad node", r"byte 3 of the node name \(0x20\)"),
        ("nodeA:w", "nodeB", "it names node 'nodeA' and the peer option names node 'nodeB'"),
    ],
)
def test_a_malformed_address_is_refused_before_any_request(
    session: rmmd.Session, name: str, peer: str | None, says: str
) -> None:
    with pytest.raises(rmmd.InvalidArgumentError, match=f"open buffer '{name}': {says}"):
        rmmd.SharedBuffer.open(session, name, peer=peer)


def test_peer_must_be_a_str(session: rmmd.Session) -> None:
    with pytest.raises(rmmd.InvalidArgumentError, match="peer is a node's name"):
        rmmd.SharedBuffer.open(session, "w", peer=7)  # type: ignore[arg-type]


def test_a_local_buffer_has_no_peer(session: rmmd.Session) -> None:
    made = rmmd.SharedBuffer.create(session, "py/peers/local", 4096, pool=session.host_pool)
    made.publish()
    opened = rmmd.SharedBuffer.open(session, "py/peers/local")
    assert made.peer is None and opened.peer is None
    opened.close()
    made.close()


def test_without_peering_there_are_no_peers(session: rmmd.Session) -> None:
    assert session.peers() == []


def test_peer_info_is_a_typed_record() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(rmmd.PeerInfo)}
    assert list(fields)[:5] == ["node_name", "address", "identity", "direction", "state"]
    info = rmmd.PeerInfo._from_json(
        {"node_name": "nodeA", "state": "ready", "probe_ok": True, "bytes_we_hold": "67108864"}
    )
    assert info.node_name == "nodeA" and info.probe_ok and not info.their_probe_ok
    assert info.bytes_we_hold == 64 << 20 and info.holds_they_have == 0
