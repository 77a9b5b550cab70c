"""Buffers of another node (NODE:NAME, peer=) and Session.peers(), against a
daemon without peering: what the package refuses before it asks, and the
empty list of peers; then two host daemons that peer (certificates from
scripts/make-test-certs.sh): what Session.node_name, peers() and peer() say,
and what Session.buffers(peer=...) and SharedBuffer.open_by_labels find
(host pools have no fabric handle: nothing of the other node is listed).
Buffers opened from the other node need GPUs: test_peering_gpu.py on the
GPU host (and tests/gpu/peering_test.cpp)."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from conftest import REPO, Daemon, wait_until

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


@pytest.mark.parametrize("device", ["cuda:1", True, -1, 1.0, "1"])
def test_device_is_a_cuda_ordinal_checked_before_any_request(session: rmmd.Session, device: object) -> None:
    with pytest.raises(rmmd.InvalidArgumentError, match=r"device is this process's CUDA ordinal \(an int >= 0\)"):
        rmmd.SharedBuffer.open(session, "nodeA:w", device=device)  # type: ignore[arg-type]


def test_device_is_a_check_for_a_buffer_of_this_node(session: rmmd.Session) -> None:
    made = rmmd.SharedBuffer.create(session, "py/peers/on-device", 4096, pool=session.host_pool)
    made.publish()
    pool = session.host_pool.name
    with pytest.raises(
        rmmd.InvalidArgumentError,
        match=f"it is in host pool '{pool}', on no GPU, not on device 0: a buffer of this node is mapped "
        "on its pool's GPU",
    ):
        rmmd.SharedBuffer.open(session, "py/peers/on-device", device=0)
    rmmd.SharedBuffer.open(session, "py/peers/on-device", device=None).close()
    # The refused open kept no hold: the creator's is the one left.
    assert rmmd.SharedBuffer.delete(session, "py/peers/on-device") == 1
    made.close()


def test_a_buffer_of_another_node_needs_a_gpu_in_this_process(session: rmmd.Session) -> None:
    from rmmd import _cuda

    if _cuda.device_count() > 0:
        pytest.skip("this process sees a GPU: the case is one without any")
    for device in (None, 0):
        with pytest.raises(
            rmmd.InvalidArgumentError,
            match=r"open buffer 'nodeA:w': a buffer of another node is mapped on a GPU, and this "
            r"process sees none \(cudaError",
        ):
            rmmd.SharedBuffer.open(session, "nodeA:w", device=device)


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


def test_without_peering_there_is_no_node_name(session: rmmd.Session) -> None:
    assert session.node_name is None
    assert session.peer("nodeA") is None


def test_peer_ready_is_the_state() -> None:
    assert rmmd.PeerInfo._from_json({"node_name": "a", "state": "ready"}).ready
    assert not rmmd.PeerInfo._from_json({"node_name": "a", "state": "probe_failed"}).ready


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def peered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    """Host daemons A and B that dial each other with mutual TLS, as
    tests/integration/peering_test.cpp sets them up."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command: scripts/make-test-certs.sh makes the certificates with it")
    work = tmp_path_factory.mktemp("peering")
    made = subprocess.run(
        ["/bin/bash", str(REPO / "scripts" / "make-test-certs.sh"), str(work)],
        capture_output=True, text=True, timeout=60,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    ports = {"nodeA": _free_port(), "nodeB": _free_port()}

    def config(me: str, other: str, grants: str) -> Path:
        path = work / f"{me}.conf"
        path.write_text(
            f"peering {{ node_name: '{me}' listen_address: '127.0.0.1:{ports[me]}' "
            f"tls {{ certificate_file: '{work / (me + '.pem')}' private_key_file: '{work / (me + '.key')}' "
            f"trusted_ca_file: '{work / 'ca.pem'}' }} {grants} "
            f"peers {{ name: '{other}' address: '127.0.0.1:{ports[other]}' identity: 'CN=rmmd-{other}' "
            "tls_server_name: 'localhost' } hold_lease_ms: 2000 renew_interval_ms: 500 }\n"
        )
        return path

    a_conf = config("nodeA", "nodeB", "grants { identity: 'CN=rmmd-nodeB' name_prefixes: 'models/' }")
    b_conf = config("nodeB", "nodeA", "")
    started: list[Daemon] = []
    try:
        started.append(Daemon("--backend", "host", "--config", str(a_conf)))
        started.append(Daemon("--backend", "host", "--config", str(b_conf)))
        yield started[0], started[1]
    finally:
        for d in started:
            d.stop()


def test_a_peering_daemon_names_its_node_and_its_peer(peered: tuple[Daemon, Daemon]) -> None:
    a, b = peered
    with rmmd.Session(runtime_dir=str(b.runtime_dir), client_name="pytest-peers") as s:
        assert s.node_name == "nodeB"
        # Both dialed (B's peers entry) and dialed by A: "both", once settled.
        seen = wait_until(
            lambda: (p := s.peer("nodeA")) is not None and p.direction == "both" and p.state != "connecting" and p,
            timeout=30,
            what="B to see A both ways",
        )
        assert seen.identity == "CN=rmmd-nodeA" and seen.address.startswith("127.0.0.1:"), seen
        # Host pools have no fabric handle to probe: not ready, and it says why.
        assert seen.ready == (seen.state == "ready")
        assert seen.ready or seen.problem, seen
        assert seen.holds_we_have == 0 and seen.bytes_we_hold == 0
        assert [p.node_name for p in s.peers()] == ["nodeA"]
        assert s.peer("nodeZ") is None
    with rmmd.Session(runtime_dir=str(a.runtime_dir), client_name="pytest-peers") as s:
        assert s.node_name == "nodeA"
        on_a = wait_until(lambda: s.peer("nodeB"), timeout=30, what="A to see B")
        assert on_a.identity == "CN=rmmd-nodeB" and on_a.holds_they_have == 0, on_a


def test_peer_wants_a_node_name(session: rmmd.Session) -> None:
    with pytest.raises(rmmd.InvalidArgumentError, match="a node's name is a str"):
        session.peer(7)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def lonely_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Node B's host daemon whose one peer, nodeX, has no daemon at its port."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command: scripts/make-test-certs.sh makes the certificates with it")
    work = tmp_path_factory.mktemp("lonely")
    made = subprocess.run(
        ["/bin/bash", str(REPO / "scripts" / "make-test-certs.sh"), str(work)],
        capture_output=True, text=True, timeout=60,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    conf = work / "nodeB.conf"
    conf.write_text(
        f"peering {{ node_name: 'nodeB' tls {{ certificate_file: '{work / 'nodeB.pem'}' "
        f"private_key_file: '{work / 'nodeB.key'}' trusted_ca_file: '{work / 'ca.pem'}' }} "
        f"peers {{ name: 'nodeX' address: '127.0.0.1:{_free_port()}' identity: 'CN=rmmd-nodeA' "
        "tls_server_name: 'localhost' } }\n"
    )
    d = Daemon("--backend", "host", "--host-pool-bytes", "64MiB", "--config", str(conf))
    yield d
    d.stop()


def test_a_node_nobody_answers_for_is_a_session_error_in_words_and_the_session_goes_on(
    lonely_b: Daemon,
) -> None:
    from rmmd import _cuda

    if _cuda.device_count() == 0:
        # The package refuses a buffer of another node before asking where
        # no GPU could map it (the test above); tests/integration/
        # peering_test.cpp checks the daemon's answer and the C++ words here.
        pytest.skip("needs a process that sees a GPU (run_gpu.sh on the GPU host); no fabric or IMEX needed")
    with rmmd.Session(runtime_dir=str(lonely_b.runtime_dir), client_name="pytest-lonely") as s:
        with pytest.raises(rmmd.SessionError) as caught:
            rmmd.SharedBuffer.open(s, "nodeX:w", device=0)
        said = str(caught.value)
        assert isinstance(caught.value, ConnectionError), said
        assert "open buffer 'nodeX:w': node 'nodeX' cannot be reached from this node's rmmd" in said, said
        assert "rmmctl peers" in said and "the daemon is gone" not in said, said
        # This node's daemon, and the session, go on.
        made = rmmd.SharedBuffer.create(s, "py/lonely/w", 4096, pool=s.host_pool)
        made.publish()
        rmmd.SharedBuffer.open(s, "py/lonely/w").close()
        made.close()
        assert s.peer("nodeX") is not None and not s.peer("nodeX").ready  # type: ignore[union-attr]


def test_without_peering_listing_a_peer_is_not_found(session: rmmd.Session) -> None:
    with pytest.raises(
        rmmd.NotFoundError, match=r"list buffers: no peer 'nodeA' in peering.peers \(peering is off on this node\)"
    ):
        session.buffers(peer="nodeA")
    with pytest.raises(rmmd.InvalidArgumentError, match="peer is a node's name"):
        session.buffers(peer=7)  # type: ignore[arg-type]


def test_open_by_labels_opens_the_one_match_here_and_names_the_others(session: rmmd.Session) -> None:
    made = []
    for rank in ("0", "1"):
        b = rmmd.SharedBuffer.create(session, f"py/peers/by-labels/{rank}", 4096, pool=session.host_pool)
        b.set_manifest([], labels={"model": "py-m1", "rank": rank})
        b.publish()
        made.append(b)
    try:
        one = rmmd.SharedBuffer.open_by_labels(session, {"model": "py-m1", "rank": "1"})
        assert one.name == "py/peers/by-labels/1" and one.peer is None
        assert one.labels["rank"] == "1" and not one.writable
        one.close()
        with pytest.raises(
            rmmd.PreconditionError,
            match=r"2 buffers carry them \('py/peers/by-labels/0', 'py/peers/by-labels/1'\)",
        ):
            rmmd.SharedBuffer.open_by_labels(session, {"model": "py-m1"})
        with pytest.raises(rmmd.NotFoundError, match=r"open the buffer labelled \{model=py-m2\}"):
            rmmd.SharedBuffer.open_by_labels(session, {"model": "py-m2"})
        with pytest.raises(rmmd.InvalidArgumentError, match="no labels given"):
            rmmd.SharedBuffer.open_by_labels(session, {})
    finally:
        for b in made:
            b.close()


def test_b_lists_as_buffers_through_its_daemon(peered: tuple[Daemon, Daemon]) -> None:
    a, b = peered
    with rmmd.Session(runtime_dir=str(a.runtime_dir), client_name="pytest-peers") as sa, rmmd.Session(
        runtime_dir=str(b.runtime_dir), client_name="pytest-peers"
    ) as sb:
        made = rmmd.SharedBuffer.create(sa, "models/py-listed", 4096, pool=sa.host_pool)
        made.set_manifest([], labels={"model": "py-m1"})
        made.publish()
        try:
            wait_until(
                lambda: (p := sb.peer("nodeA")) is not None and p.state in ("ready", "probe_failed"),
                timeout=30,
                what="B's link to A to be usable",
            )
            # A host pool's buffer cannot be opened from another node: not listed.
            assert sb.buffers(peer="nodeA") == []
            assert sb.buffers(peer="nodeA", labels={"model": "py-m1"}) == []
            assert [x.name for x in sa.buffers(labels={"model": "py-m1"})] == ["models/py-listed"]
            with pytest.raises(rmmd.NotFoundError, match="no peer 'nodeZ' in peering.peers"):
                sb.buffers(peer="nodeZ")
            with pytest.raises(rmmd.NotFoundError, match="that node's grant lets this node open carries them"):
                rmmd.SharedBuffer.open_by_labels(sb, {"model": "py-m1"}, peer="nodeA")
        finally:
            made.close()


def test_buffer_info_of_another_node_says_its_peer() -> None:
    info = rmmd.BufferInfo._from_wire(
        {"name": "models/w", "size": "4096", "state": "BUFFER_STATE_PUBLISHED", "peer": "nodeA"}
    )
    assert info.peer == "nodeA" and info.nbytes == 4096 and info.published and info.id == 0
    assert rmmd.BufferInfo._from_wire({"name": "w"}).peer is None
