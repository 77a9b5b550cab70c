"""Buffers of another node from Python, on the two-GPU host: two real daemons
with runtime directories and TCP ports of their own stand for nodes A and B
of an NVLink domain, as tests/gpu/peering_test.cpp sets them up. A serves a
fabric pool on GPU 0 and grants CN=rmmd-nodeB the prefix "peertest/"; B
runs under CUDA_VISIBLE_DEVICES=1 and dials A with mutual TLS (certificates
from scripts/make-test-certs.sh). A PyTorch producer on A publishes a
pattern; consumers on B (processes of their own, CUDA_VISIBLE_DEVICES=1)
open "nodeA:NAME" and check it on their GPU (scripts/peering_client.py).

Skipped, saying why, without a GPU, with one GPU, without an IMEX channel
(/dev/nvidia-caps-imex-channels/channel0, made as root: DEVELOPERS.md, "On
the GPU host"), without the openssl command or without PyTorch. The
certificate script is $RMMD_TEST_CERTS_SCRIPT, else the checkout's
scripts/make-test-certs.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import REPO, SCRIPTS, Daemon, gpu_count, need_gpu, need_module, read_line, run_python, start_python, wait_until

pytestmark = pytest.mark.gpu

CLIENT = str(SCRIPTS / "peering_client.py")
IMEX_CHANNEL = Path("/dev/nvidia-caps-imex-channels/channel0")
BUFFER_BYTES = 64 << 20
SEED = 7
HOLD_LEASE_MS = 3000  # A drops a hold B has not renewed for this long
RENEW_EVERY_MS = 500


def certs_script() -> Path | None:
    """make-test-certs.sh, as harness/peer_setup.cpp finds it for the C++ tests."""
    named = os.environ.get("RMMD_TEST_CERTS_SCRIPT")
    if named:
        return Path(named)
    here = REPO / "scripts" / "make-test-certs.sh"
    return here if here.exists() else None


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tls_block(certs: Path, stem: str) -> str:
    return (
        "  tls {\n"
        f'    certificate_file: "{certs / (stem + ".pem")}"\n'
        f'    private_key_file: "{certs / (stem + ".key")}"\n'
        f'    trusted_ca_file: "{certs / "ca.pem"}"\n'
        "  }\n"
    )


TIMING = f"  hold_lease_ms: {HOLD_LEASE_MS}\n  renew_interval_ms: {RENEW_EVERY_MS}\n  keepalive_ms: 1000\n"


def config_a(certs: Path, port: int) -> str:
    """A's: a host pool and a fabric pool on its GPU; listens, grants nodeB "peertest/"."""
    return (
        'pools { name: "host" backend: HOST capacity_bytes: 67108864 }\n'
        'pools { name: "gpu" backend: CUDA device: 0 handle_types: [POSIX_FD, FABRIC]\n'
        "        limit_bytes: 8589934592 }\n"
        "peering {\n"
        '  node_name: "nodeA"\n'
        f'  listen_address: "127.0.0.1:{port}"\n'
        + tls_block(certs, "nodeA")
        + '  grants { identity: "CN=rmmd-nodeB" name_prefixes: "peertest/" }\n'
        + TIMING
        + "}\n"
    )


def config_b(certs: Path, port_a: int) -> str:
    """B's: dials A."""
    return (
        'pools { name: "host" backend: HOST capacity_bytes: 67108864 }\n'
        'pools { name: "gpu" backend: CUDA device: 0 handle_types: [POSIX_FD, FABRIC]\n'
        "        limit_bytes: 4294967296 }\n"
        "peering {\n"
        '  node_name: "nodeB"\n'
        + tls_block(certs, "nodeB")
        + f'  peers {{ name: "nodeA" address: "127.0.0.1:{port_a}" identity: "CN=rmmd-nodeA" }}\n'
        + TIMING
        + "}\n"
    )


class Node:
    """One node's daemon and the environment of its clients."""

    def __init__(self, name: str, config: Path, visible_devices: str) -> None:
        self.name = name
        self.visible_devices = visible_devices
        self.daemon = Daemon("--config", str(config), env={"CUDA_VISIBLE_DEVICES": visible_devices})

    def env(self) -> dict[str, str]:
        return self.daemon.env(CUDA_VISIBLE_DEVICES=self.visible_devices)

    def view(self, buffer: str | None = None) -> dict[str, Any]:
        """What Session.node_name and Session.peers() say here (and the holders
        of `buffer`), asked by a process of this node (this one stays
        without CUDA)."""
        args = [CLIENT, "peers"] + ([buffer] if buffer else [])
        return json.loads(run_python(args, self.env()).stdout.splitlines()[-1])

    def peer(self, node_name: str, buffer: str | None = None) -> tuple[dict[str, Any] | None, int | None]:
        seen = self.view(buffer)
        return next((p for p in seen["peers"] if p["node_name"] == node_name), None), seen["holders"]

    def log(self) -> str:
        return self.daemon.log()[-4000:]


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[Node, Node]]:
    """A (GPU 0, listening) and B (GPU 1, dialing A), B seeing A ready."""
    need_gpu()
    if gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs (CUDA sees {gpu_count()}): B's consumer runs on GPU 1")
    if not IMEX_CHANNEL.exists():
        pytest.skip(
            f"no IMEX channel ({IMEX_CHANNEL}): fabric handles cannot be imported; "
            'create it as root (DEVELOPERS.md, "On the GPU host")'
        )
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command: scripts/make-test-certs.sh makes the certificates with it")
    script = certs_script()
    if script is None:
        pytest.skip("scripts/make-test-certs.sh not found: set RMMD_TEST_CERTS_SCRIPT")
    need_module("torch")
    work = Path(tempfile.mkdtemp(prefix="rmmd-py-peering-"))
    started: list[Node] = []
    try:
        made = subprocess.run(
            ["/bin/bash", str(script), str(work / "certs")], capture_output=True, text=True, timeout=60
        )
        assert made.returncode == 0, made.stdout + made.stderr
        port_a = free_loopback_port()
        (work / "a.conf").write_text(config_a(work / "certs", port_a))
        (work / "b.conf").write_text(config_b(work / "certs", port_a))
        a = Node("nodeA", work / "a.conf", "0")
        started.append(a)
        b = Node("nodeB", work / "b.conf", "1")
        started.append(b)
        wait_for_ready(a, b)
        yield a, b
    finally:
        for n in reversed(started):
            n.daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


def eventually(predicate: Callable[[], Any], describe: Callable[[], str], timeout: float = 10.0) -> Any:
    """wait_until, the failure saying what `describe` says then (the
    daemons' views and logs as they are when the wait ends)."""
    try:
        return wait_until(predicate, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}: {describe()}") from None


def wait_for_ready(a: Node, b: Node) -> None:
    """Until B sees A ready and A sees B, both having proved the fabric probe."""
    eventually(
        lambda: (p := b.peer("nodeA")[0]) is not None and p["state"] == "ready",
        lambda: f"B to see A ready; B: {b.view()}\nB's log:\n{b.log()}\nA's log:\n{a.log()}",
        timeout=30,
    )
    eventually(
        lambda: (p := a.peer("nodeB")[0]) is not None and p["their_probe_ok"],
        lambda: f"A to hear that B imported its probe; A: {a.view()}\nA's log:\n{a.log()}",
        timeout=30,
    )


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Client processes, killed at the end if the test left them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)


def start(children: list[subprocess.Popen[str]], node: Node, *args: str) -> subprocess.Popen[str]:
    p = start_python([CLIENT, *args], node.env())
    children.append(p)
    return p


def finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    """Tells a holding client to go on, and returns its last line."""
    out, err = p.communicate("\n", timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def produce(children: list[subprocess.Popen[str]], a: Node, name: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    producer = start(children, a, "produce", name, str(BUFFER_BYTES), str(SEED))
    made = json.loads(read_line(producer))
    assert made["created"] == name and made["nbytes"] == BUFFER_BYTES, made
    return producer, made


def test_both_nodes_are_ready_with_the_probe_imported_both_ways(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    on_b = b.view()
    assert on_b["node_name"] == "nodeB"
    [seen_a] = [p for p in on_b["peers"] if p["node_name"] == "nodeA"]
    assert seen_a["state"] == "ready" and seen_a["probe_ok"] and seen_a["their_probe_ok"], seen_a
    assert seen_a["identity"] == "CN=rmmd-nodeA" and seen_a["direction"] in ("dialed", "both"), seen_a
    on_a = a.view()
    assert on_a["node_name"] == "nodeA"
    [seen_b] = [p for p in on_a["peers"] if p["node_name"] == "nodeB"]
    assert seen_b["state"] == "ready" and seen_b["probe_ok"] and seen_b["their_probe_ok"], seen_b
    assert seen_b["identity"] == "CN=rmmd-nodeB" and seen_b["direction"] in ("accepted", "both"), seen_b


def test_a_remote_open_reads_the_same_bytes_read_only_and_holds_on_a(
    nodes: tuple[Node, Node], children: list[subprocess.Popen[str]]
) -> None:
    a, b = nodes
    name = "peertest/py-read"
    producer, made = produce(children, a, name)
    assert a.peer("nodeB", name)[1] == 1  # the producer

    consumer = start(children, b, "consume", f"nodeA:{name}", str(BUFFER_BYTES), str(SEED))
    got = json.loads(read_line(consumer))
    assert got["verified"], got
    assert got["digest"] == made["digest"]
    print(f"note: B's consumer read {got['nbytes']} bytes of nodeA:{name}, sha256 {got['digest']}")
    assert got["nbytes"] == BUFFER_BYTES and got["peer"] == "nodeA" and got["name"] == name, got
    assert got["repr"].startswith(f"<rmmd.SharedBuffer 'nodeA:{name}' "), got["repr"]
    assert not got["writable"], got
    # On B's GPU (GPU 1 of the host, device 0 of the consumer), not A's.
    assert got["device"] == 0 and got["tensor_device"] == "cuda:0", got
    if made["gpu"] and got["gpu"]:
        assert got["gpu"] != made["gpu"], (made["gpu"], got["gpu"])
    # The manifest came from A: a zero-copy tensor by name, the label checked by expect=.
    assert got["manifest_same"] and got["manifest_zero_copy"], got
    assert got["cai_same"] in (True, None), got  # None: no CuPy there

    # Session.peers() on B, while the consumer holds it: A ready, the hold.
    [seen_a] = [p for p in got["peers"] if p["node_name"] == "nodeA"]
    assert seen_a["state"] == "ready" and seen_a["holds_we_have"] == 1, seen_a
    assert seen_a["bytes_we_hold"] >= BUFFER_BYTES, seen_a
    # A's view: B's hold counts like a local one.
    on_a = eventually(
        lambda: (v := a.peer("nodeB", name))[1] == 2 and v,
        lambda: f"A to count B's hold on {name}; A: {a.view(name)}",
    )
    assert on_a[0]["holds_they_have"] == 1 and on_a[0]["bytes_they_hold"] >= BUFFER_BYTES, on_a

    # Read-only: a write from B fails in the writer alone.
    wrote = json.loads(run_python([CLIENT, "write", f"nodeA:{name}"], b.env(), check=False).stdout.splitlines()[-1])
    assert not wrote["wrote"] and not wrote["writable"], wrote
    print(f"note: a write through B's read-only mapping: {wrote['error']}")

    # Closing ends the hold on A; the bytes there are untouched.
    assert finish(consumer) == {"intact": True, "closed": True}
    eventually(
        lambda: (v := a.peer("nodeB", name))[1] == 1 and v[0] is not None and v[0]["holds_they_have"] == 0,
        lambda: f"A to let go of B's hold on {name}; A: {a.view(name)}",
    )
    assert b.peer("nodeA")[0]["holds_we_have"] == 0  # type: ignore[index]
    assert finish(producer) == {"intact": True}


def test_device_chooses_the_consumers_gpu_not_its_current_one(
    nodes: tuple[Node, Node], children: list[subprocess.Popen[str]]
) -> None:
    a, b = nodes
    name = "peertest/py-device"
    producer, made = produce(children, a, name)
    # A consumer of node B that sees both GPUs: device=1 maps it on GPU 1
    # while its current device stays 0.
    both = b.daemon.env(CUDA_VISIBLE_DEVICES="0,1")
    consumer = start_python([CLIENT, "consume", f"nodeA:{name}", str(BUFFER_BYTES), str(SEED), "1"], both)
    children.append(consumer)
    got = json.loads(read_line(consumer))
    assert got["verified"] and got["digest"] == made["digest"], got
    assert got["device"] == 1 and got["tensor_device"] == "cuda:1" and got["current_device"] == 0, got
    if made["gpu"] and got["gpu"]:
        assert got["gpu"] != made["gpu"], (made["gpu"], got["gpu"])  # GPU 1 of the host, not A's
    assert finish(consumer) == {"intact": True, "closed": True}
    # Under CUDA_VISIBLE_DEVICES=1 there is no device 1: refused before B's daemon is asked.
    said = json.loads(run_python([CLIENT, "try-open", f"nodeA:{name}", "1"], b.env()).stdout.splitlines()[-1])
    assert not said["opened"] and said["error"] == "InvalidArgumentError", said
    assert "device 1: this process sees 1 GPU (CUDA_VISIBLE_DEVICES decides which)" in said["message"], said
    eventually(
        lambda: (v := a.peer("nodeB", name))[1] == 1 and v[0] is not None and v[0]["holds_they_have"] == 0,
        lambda: f"A to let go of B's hold on {name}; A: {a.view(name)}",
    )
    assert finish(producer) == {"intact": True}


def test_b_lists_as_buffers_and_opens_one_by_its_labels(
    nodes: tuple[Node, Node], children: list[subprocess.Popen[str]]
) -> None:
    a, b = nodes
    name = "peertest/py-labelled"
    seed = 11  # the producer labels its buffer seed=11: no other test's buffer carries it
    producer = start(children, a, "produce", name, str(BUFFER_BYTES), str(seed))
    made = json.loads(read_line(producer))
    assert made["created"] == name, made
    consumed = run_python([CLIENT, "consume-labelled", "nodeA", str(BUFFER_BYTES), str(seed)], b.env())
    got = json.loads(consumed.stdout.splitlines()[-1])
    [entry] = got["listed"]
    assert entry["name"] == name and entry["peer"] == "nodeA" and entry["nbytes"] == BUFFER_BYTES, entry
    assert entry["labels"]["seed"] == str(seed) and entry["id"] == 0, entry
    assert got["verified"] and got["name"] == name and got["peer"] == "nodeA", got
    assert not got["writable"] and got["labels"]["seed"] == str(seed), got
    finish(producer)


def test_a_sigkilled_consumer_loses_its_hold_on_a(
    nodes: tuple[Node, Node], children: list[subprocess.Popen[str]]
) -> None:
    a, b = nodes
    name = "peertest/py-killed"
    producer, _ = produce(children, a, name)
    consumer = start(children, b, "consume", f"nodeA:{name}", str(BUFFER_BYTES), str(SEED))
    assert json.loads(read_line(consumer))["verified"]
    eventually(lambda: a.peer("nodeB", name)[1] == 2, lambda: f"A to count B's hold on {name}; A: {a.view(name)}")

    consumer.kill()  # SIGKILL: B's session ends, B gives its hold back (or A's lease ends it)
    consumer.communicate(timeout=30)
    eventually(
        lambda: (v := a.peer("nodeB", name))[1] == 1 and v[0] is not None and v[0]["holds_they_have"] == 0,
        lambda: f"A to drop the killed consumer's hold on {name}; A: {a.view(name)}\nA's log:\n{a.log()}",
        timeout=HOLD_LEASE_MS / 1000 + 15,
    )
    assert b.peer("nodeA")[0]["holds_we_have"] == 0  # type: ignore[index]
    assert finish(producer) == {"intact": True}


def test_a_buffer_outside_the_grant_is_permission_denied_in_the_daemons_words(
    nodes: tuple[Node, Node], children: list[subprocess.Popen[str]]
) -> None:
    a, b = nodes
    producer, _ = produce(children, a, "private/py-w")
    said = json.loads(run_python([CLIENT, "try-open", "nodeA:private/py-w"], b.env()).stdout.splitlines()[-1])
    assert not said["opened"], said
    assert said["error"] == "PermissionError" and said["builtin_permission_error"], said
    assert said["status"] == "PERMISSION_DENIED", said
    # A's words: who asked, for what, and why.
    assert "private/py-w" in said["message"] and "CN=rmmd-nodeB" in said["message"], said
    assert "peering.grants" in said["message"], said
    # The node that refused, named once.
    assert "open buffer 'nodeA:private/py-w': node 'nodeA' refused: peer 'CN=rmmd-nodeB' may not" in said["message"], said
    assert "peer 'nodeA'" not in said["message"], said
    print(f"note: B's open of nodeA:private/py-w: {said['message']}")
    on_a, holders = a.peer("nodeB", "private/py-w")
    assert holders == 1 and on_a is not None and on_a["holds_they_have"] == 0, (on_a, holders)

    # A node B does not peer with.
    nowhere = json.loads(run_python([CLIENT, "try-open", "nodeZ:peertest/py-w"], b.env()).stdout.splitlines()[-1])
    assert nowhere["error"] == "NotFoundError" and "nodeZ" in nowhere["message"], nowhere
    assert finish(producer) == {"intact": True}


def test_a_sigkilled_node_b_loses_its_holds_on_a_when_its_lease_ends(
    nodes: tuple[Node, Node], children: list[subprocess.Popen[str]]
) -> None:
    a, b = nodes
    name = "peertest/py-node-killed"
    producer, _ = produce(children, a, name)
    consumer = start(children, b, "consume", f"nodeA:{name}", str(BUFFER_BYTES), str(SEED))
    assert json.loads(read_line(consumer))["verified"]
    eventually(lambda: a.peer("nodeB", name)[1] == 2, lambda: f"A to count B's hold on {name}; A: {a.view(name)}")

    b.daemon.kill(signal.SIGKILL)  # no close comes: A's lease ends the hold
    eventually(
        lambda: (v := a.peer("nodeB", name))[1] == 1 and (v[0] is None or v[0]["holds_they_have"] == 0),
        lambda: f"A to drop the hold of the killed node B on {name}; A: {a.view(name)}\nA's log:\n{a.log()}",
        timeout=HOLD_LEASE_MS / 1000 + 15,
    )
    consumer.kill()
    consumer.communicate(timeout=30)
    assert finish(producer) == {"intact": True}

    # B again, for whatever runs after this test.
    b.daemon.restart()
    wait_for_ready(a, b)
