"""Peering in the chaos soak (rmmd_chaos.py --peering): a second daemon,
node B, under its own service-manager stand-in, peered with node A (the
soak's daemon) over mutual TLS on 127.0.0.1, and the events and invariants
that involve both.

    A: listen_address 127.0.0.1:PORT, grants { identity CN=rmmd-nodeB,
       name_prefixes "chaos/" }, hold_lease_ms 2000, renew_interval_ms 500
    B: peers { name nodeA, identity CN=rmmd-nodeA, tls_server_name localhost }

The certificates come from scripts/make-test-certs.sh (one CA; nodeA and
nodeB), copied to the files the configs name; a rotation writes a new key
and a new certificate from the same CA for one node (openssl, renamed over
the old files whole) and sends that node SIGHUP.

Events (drawn by the soak's one generator, as every other kind):
  peer_open    a reader client of node B (chaos_worker.py at B's socket)
               lists A's buffers across the link (Session.buffers(peer=)),
               which must reach A within 20 s, then opens `nodeA:NAME`
               read-only, NAME one of A's buffers (or a name A does not
               have); an open that succeeds has its bytes checked by the
               reader against the seed A's producer wrote, and is closed.
               The soak's buffers are host buffers, which A does not lend
               to other nodes (FAILED_PRECONDITION, "exports no fabric
               handles"), so A's listing must be empty; and a client
               without a GPU refuses a remote open before asking its
               daemon (client/shared_buffer.cpp), which is checked in its
               words. So on a CPU machine no remote hold is ever made, and
               what is exercised is the link: mutual TLS, the grant, Hello.
  peer_fabric  (where there is a GPU) one of A's workers creates a buffer
               in A's CUDA pool that exports fabric handles, written on
               its GPU, and publishes it; a reader of B opens it as
               nodeA:NAME and reads it on its GPU word by word; while the
               remote hold lasts A's and B's `rmmctl peers` must both count
               it; then both close it (it is not persistent: it goes). A
               node without a fabric pool (no IMEX channel) is said once
               and the event does nothing from then on.
  peer_kill    a reader's listing under way, either daemon SIGKILLed at a
               random moment and started again; then a call across reaches
               A again (B's link says Hello to A's new daemon).
  peer_term    either daemon SIGTERMed (it must exit 0) and started again.
  peer_rotate  either node's certificate and key replaced, SIGHUP; A's log
               says the listener serves it, or B's that its link dials
               with it; then a call across reaches A again.
  peer_new_ca  both nodes moved to a new CA in three steps, each a SIGHUP
               of A then B with its log line checked and a call across
               reaching A after it: both trust the old and the new CA (the
               trusted-CA file holds both); both get certificates of the
               new CA; both trust the new CA alone. Later rotations sign
               with the new CA.
After every round (round_end): A's `rmmctl peers` holds of nodeB's equal
B's holds on nodeA equal the holds B's readers have (within a lease plus
20 s: a dead B's holds end when their lease does); B's link to A is up
(ready, or probe_failed: no fabric pool); at B's quiet point no session and
every pool at 0. At the end: the same, B's fd store empty, B exits 0 on
SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from chaos_node import ChaosError, Daemon, Worker, user_ids

ROOT = Path(__file__).resolve().parent.parent.parent
PEER_WEIGHTS = {"peer_open": 2.0, "peer_kill": 0.4, "peer_term": 0.2, "peer_rotate": 0.4, "peer_new_ca": 0.1}
# Only where there is a GPU (a fabric pool needs one).
PEER_GPU_WEIGHTS = {"peer_fabric": 1.0}
MAX_READERS = 2
HOLD_LEASE_MS = 2000
# How long a remote open may find the link down after a restart or a
# rotation (reconnect backoff, a new listener, a Hello) before it fails.
REACH_S = 20.0
UNREACHABLE = "cannot be reached"


def why_no_peering() -> str:
    """'' when this machine can run the peering events; else why not."""
    if shutil.which("openssl") is None:
        return "no openssl command to make the test certificates (scripts/make-test-certs.sh)"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODE_EXT = """basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
"""


class PeerCerts:
    """The test CA and the two nodes' live certificate files (what the
    configs name), readable by the daemons' user."""

    def __init__(self, as_user: str | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rmmd-chaos-certs-"))
        self.made = self.dir / "made"
        out = subprocess.run([str(ROOT / "scripts" / "make-test-certs.sh"), str(self.made)],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise ChaosError(f"make-test-certs.sh: {out.stdout} {out.stderr}")
        (self.dir / "node.ext").write_text(NODE_EXT)
        self.owner = user_ids(as_user) if as_user else None
        shutil.copy(self.made / "ca.pem", self.dir / "ca.pem")
        for node in ("nodeA", "nodeB"):
            for ext in ("pem", "key"):
                shutil.copy(self.made / f"{node}.{ext}", self.dir / f"{node}.{ext}")
        self.rotations: Counter[str] = Counter()
        self.ca = self.made / "ca"  # the stem of the CA that signs rotations
        self.cas = 0
        self.own()

    def own(self) -> None:
        self.dir.chmod(0o755)
        for p in self.dir.iterdir():
            if p.is_file():
                if self.owner:
                    os.chown(p, *self.owner)
                p.chmod(0o600 if p.suffix == ".key" else 0o644)

    def tls(self, node: str) -> str:
        return (f"tls {{ certificate_file: '{self.dir / (node + '.pem')}' "
                f"private_key_file: '{self.dir / (node + '.key')}' trusted_ca_file: '{self.dir / 'ca.pem'}' }}")

    def rotate(self, node: str) -> None:
        """A new key and certificate (same CN, same CA) for `node`, each
        renamed over the live file whole."""
        self.rotations[node] += 1
        stem = self.dir / f"{node}-next{self.rotations[node]}"
        run = lambda *argv: subprocess.run(argv, check=True, capture_output=True, timeout=60)  # noqa: E731
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", f"{stem}.key")
        run("openssl", "req", "-new", "-key", f"{stem}.key", "-subj", f"/CN=rmmd-{node}", "-out", f"{stem}.csr")
        run("openssl", "x509", "-req", "-in", f"{stem}.csr", "-CA", f"{self.ca}.pem",
            "-CAkey", f"{self.ca}.key", "-CAcreateserial", "-CAserial", str(self.dir / "ca.srl"),
            "-days", "30", "-sha256", "-extfile", str(self.dir / "node.ext"), "-out", f"{stem}.pem")
        Path(f"{stem}.csr").unlink()
        self.own()
        Path(f"{stem}.key").rename(self.dir / f"{node}.key")
        Path(f"{stem}.pem").rename(self.dir / f"{node}.pem")

    def new_ca(self) -> None:
        """A move to a new CA, step 1: a new CA made, and the trusted-CA
        file (renamed over whole) holding the old and the new. Later
        certificates (rotate()) are the new CA's."""
        self.cas += 1
        stem = self.dir / f"ca{self.cas}"
        run = lambda *argv: subprocess.run(argv, check=True, capture_output=True, timeout=60)  # noqa: E731
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{stem}.key")
        run("openssl", "req", "-x509", "-new", "-key", f"{stem}.key", "-sha256", "-days", "30",
            "-subj", f"/O=rmmd test/CN=rmmd chaos CA {self.cas}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash", "-out", f"{stem}.pem")
        both = self.dir / "ca-both.pem"
        both.write_text(Path(f"{self.ca}.pem").read_text() + Path(f"{stem}.pem").read_text())
        self.ca = stem
        self.own()
        both.rename(self.dir / "ca.pem")

    def trust_new_ca_alone(self) -> None:
        """Step 3: the trusted-CA file holds the new CA alone."""
        alone = self.dir / "ca-alone.pem"
        shutil.copy(f"{self.ca}.pem", alone)
        self.own()
        alone.rename(self.dir / "ca.pem")

    def close(self, keep: bool) -> None:
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class PeerSetup:
    """The two configs' peering blocks, made before either daemon starts."""

    def __init__(self, as_user: str | None) -> None:
        self.certs = PeerCerts(as_user)
        self.port = free_port()
        lease = f"hold_lease_ms: {HOLD_LEASE_MS} renew_interval_ms: 500"
        self.block_a = (f"peering {{ node_name: 'nodeA' listen_address: '127.0.0.1:{self.port}' "
                        f"{self.certs.tls('nodeA')} grants {{ identity: 'CN=rmmd-nodeB' name_prefixes: 'chaos/' }} "
                        f"{lease} }}")
        self.block_b = (f"peering {{ node_name: 'nodeB' {self.certs.tls('nodeB')} "
                        f"peers {{ name: 'nodeA' address: '127.0.0.1:{self.port}' identity: 'CN=rmmd-nodeA' "
                        f"tls_server_name: 'localhost' }} {lease} }}")


def peer_row(listing: dict[str, Any], node: str) -> dict[str, Any] | None:
    for p in listing.get("peers", []):
        if p.get("node_name") == node:
            return p
    return None


class PeerChaos:
    """The peering events; `c` is the soak's Chaos (its generator, checks,
    node A), `b` node B."""

    def __init__(self, chaos: Any, setup: PeerSetup, node_b: Daemon) -> None:
        self.c, self.setup, self.b = chaos, setup, node_b
        self.readers: list[Worker] = []
        self.held = 0  # remote holds B's readers have now (as the driver believes)
        self.no_fabric = ""  # why A has no fabric pool, once a create found none
        self.fabric_reads = 0

    # -- helpers ------------------------------------------------------------------

    def node(self, which: str) -> Daemon:
        return self.c.d if which == "A" else self.b

    def reader(self) -> Worker:
        if self.readers and (len(self.readers) >= MAX_READERS or self.c.rng.random() < 0.7):
            return self.c.rng.choice(self.readers)
        user = self.c.rng.choice(self.c.users)
        self.c.serial += 1
        w = Worker(self.c.args.python, self.b.client_env(**self.c.env), user, self.c.markers[user], False,
                   self.c.log_dir, f"r{self.c.serial}")
        w.reconnects = 0
        self.readers.append(w)
        self.c.say(f"peer reader {w.name} on nodeB as {user} pid {w.proc.pid}")
        return w

    def target(self) -> tuple[str, int, bool]:
        """A buffer of A to open (name, seed, exists): mostly one the soak
        made, at times a name A does not have."""
        name = self.c.pick_buffer(lambda b: not b.get("lease"))
        if name is None or self.c.rng.random() < 0.15:
            return self.c.next_name("none"), -1, False
        return name, self.c.buffers[name]["seed"], True

    def down(self, out: dict[str, Any]) -> bool:
        """An answer that says node A cannot be reached (now)."""
        return not out["ok"] and (UNREACHABLE in out.get("message", "") or out.get("error") == "SessionError")

    def judge_list(self, w: Worker, out: dict[str, Any], what: str) -> None:
        """A's listing for B: the soak's buffers are all in A's host pool,
        which a remote open refuses, so A lists none of them."""
        self.c.check("peer_list", out["ok"] and out["names"] == [],
                     lambda: f"{what}: {w.name} lists nodeA's buffers: {out}")

    def judge_open(self, w: Worker, name: str, exists: bool, out: dict[str, Any], what: str) -> None:
        if out["ok"]:
            # A fabric buffer: the reader checked every word after the marker.
            self.held += 1
            self.c.check("peer_read_bytes", exists, lambda: f"{what}: opened nodeA:{name}, which A does not have")
            close = w.call("close", name="nodeA:" + name)
            self.held -= 1
            self.c.check("client_answer", close["ok"], lambda: f"{what}: close nodeA:{name}: {close}")
        elif out["error"] == "corrupted":
            self.c.check("peer_read_bytes", False, lambda: f"{what}: nodeA:{name}: {out}")
        elif not self.c.gpus:
            # The client maps another node's buffer on a GPU: without one it
            # refuses before asking its daemon (client/shared_buffer.cpp).
            self.c.check("peer_open_answer", out["error"] == "InvalidArgumentError"
                         and "this process sees none" in out["message"],
                         lambda: f"{what}: nodeA:{name} with no GPU: {out}")
        elif not exists:
            self.c.check("peer_open_answer", out["error"] == "NotFoundError",
                         lambda: f"{what}: nodeA:{name} (A has none): {out}")
        else:
            # A host pool exports no fabric handles: A's own refusal, naming it.
            self.c.check("peer_open_answer", out["error"] == "PreconditionError"
                         and "exports no fabric handles" in out["message"],
                         lambda: f"{what}: nodeA:{name}: {out}")

    def call_reaching_a(self, w: Worker, op: str, **args: Any) -> tuple[dict[str, Any], int]:
        """`w`'s call `op`, made again every 0.2 s while its answer says node
        A cannot be reached, for up to REACH_S: the last answer, and how many
        calls it took."""
        deadline = time.monotonic() + REACH_S
        tries = 0
        while True:
            tries += 1
            out = w.call(op, timeout=90, **args)
            if not self.down(out) or time.monotonic() > deadline:
                return out, tries
            time.sleep(0.2)

    def open_reaching_a(self, w: Worker, what: str) -> None:
        """B's client lists A's buffers across the link, which must reach A
        within REACH_S (the link comes back after a restart or a rotation),
        then opens one of A's buffers as nodeA:NAME; both judged."""
        out, tries = self.call_reaching_a(w, "list", labels={"chaos": "run"}, peer="nodeA")
        if not self.c.check("peer_reach", not self.down(out),
                            lambda: f"{what}: {w.name} listing nodeA's buffers for {REACH_S} s: {out}"):
            return
        self.judge_list(w, out, what)
        name, seed, exists = self.target()
        got = w.call("open", name="nodeA:" + name, seed=seed, timeout=90)
        self.c.say(f"{what}: {w.name} lists nodeA's buffers -> {out.get('names')}"
                   + (f" after {tries} tries" if tries > 1 else "")
                   + f"; opens nodeA:{name} -> {'ok' if got['ok'] else got['error']}")
        self.judge_open(w, name, exists, got, what)

    def restart(self, which: str, sig: int, pending: Worker | None = None) -> dict[str, Any] | None:
        """SIGKILL or SIGTERM node `which`, start it again; `pending`'s
        answer to the call it had under way (collected before the pings)."""
        d = self.node(which)
        status = d.signal(sig)
        if sig == signal.SIGTERM:
            self.c.check("daemon_exit", status == 0,
                         lambda: f"node{which} exited {status} on SIGTERM:\n{d.log_tail()}")
        d.start()
        answer = pending.reply(90) if pending is not None else None
        if which == "A":
            self.c.restarted(f"node A's {signal.Signals(sig).name}")
        else:
            self.held = 0  # B's holds went with it: A ends them once their lease ends
            for w in self.readers:  # B's clients go on (reconnect) as A's do
                before = w.reconnects
                out = w.call("ping", timeout=90)
                self.c.check("progress_after_restart", out["ok"] and out["reconnects"] > before,
                             lambda: f"{w.name} after node B's restart: {out} (before {before})")
                if out["ok"]:
                    w.reconnects = out["reconnects"]
        return answer

    # -- events ---------------------------------------------------------------------

    def ev_peer_open(self) -> None:
        self.open_reaching_a(self.reader(), "peer_open")

    def ev_peer_fabric(self) -> None:
        if self.no_fabric:
            return
        w = self.c.pick_worker()
        if w is None:
            return
        name = self.c.next_name("fabric")
        n = self.c.rng.randrange(16, 16384) * 4096  # 64 KiB to 64 MiB
        seed = self.c.rng.randrange(1 << 30)
        made = w.call("create_fabric", name=name, n=n, seed=seed, gid=self.c.rmmd_gid,
                      labels={"chaos": "fabric"}, timeout=90)
        if not made["ok"]:
            if made["error"] == "NoFabricPool":
                self.no_fabric = made["message"]
                self.c.say(f"peer_fabric: node A has no fabric pool ({self.no_fabric}); no remote read this run")
                return
            self.c.check("client_answer", made["error"] == "OutOfMemoryError",
                         lambda: f"peer_fabric: create {name} ({n} B) by {w.name}: {made}")
            return
        r = self.reader()
        got, _ = self.call_reaching_a(r, "open", name="nodeA:" + name, seed=seed)
        self.c.say(f"peer_fabric: {w.name} made {name} ({n} B) in {made.get('pool')}; {r.name} opens "
                   f"nodeA:{name} -> {'ok' if got['ok'] else got}")
        if self.c.check("peer_read_bytes", got["ok"], lambda: f"peer_fabric: {r.name}, nodeA:{name} ({n} B): {got}"):
            self.held += 1
            self.fabric_reads += 1
            self.wait_holds(f"peer_fabric, {r.name} holding nodeA:{name}")
            closed = r.call("close", name="nodeA:" + name)
            self.held -= 1
            self.c.check("client_answer", closed["ok"], lambda: f"peer_fabric: close nodeA:{name}: {closed}")
            self.wait_holds(f"peer_fabric, {r.name} closed nodeA:{name}")
        gone = w.call("close", name=name)
        self.c.check("client_answer", gone["ok"], lambda: f"peer_fabric: {w.name} closes {name}: {gone}")

    def ev_peer_kill(self) -> None:
        w = self.reader()
        which = self.c.rng.choice(["A", "B"])
        w.send("list", labels={"chaos": "run"}, peer="nodeA")
        time.sleep(self.c.rng.uniform(0, 0.05))
        self.c.say(f"peer_kill node{which} (SIGKILL) while {w.name} lists nodeA's buffers")
        out = self.restart(which, signal.SIGKILL, pending=w)
        assert out is not None
        self.c.say(f"peer_kill: the listing across the kill -> {out}")
        if not self.down(out):  # before the kill, or after the restart
            self.judge_list(w, out, "peer_kill")
        self.open_reaching_a(w, f"peer_kill node{which}, then")

    def ev_peer_term(self) -> None:
        which = self.c.rng.choice(["A", "B"])
        self.c.say(f"peer_term node{which} (SIGTERM)")
        self.restart(which, signal.SIGTERM)
        self.open_reaching_a(self.reader(), f"peer_term node{which}, then")

    def reload(self, which: str, what: str) -> None:
        """SIGHUP node `which`; its log must say within 20 s that its
        listener (A) serves, or its link (B) dials with, the certificate
        files as they are now."""
        d = self.node(which)
        before = d.log_path.read_text(errors="replace").count("reloaded certificate")
        line = d.hup()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lines = [l for l in d.log_path.read_text(errors="replace").splitlines() if "reloaded certificate" in l]
            if len(lines) > before:
                break
            time.sleep(0.05)
        self.c.say(f"{what}: {line.strip()}; {lines[-1].strip() if len(lines) > before else 'no peering line'}")
        want = "listener on" if which == "A" else "now dial with the reloaded certificate"
        self.c.check("peer_rotate", len(lines) > before and want in lines[-1],
                     lambda: f"node{which}'s log after SIGHUP: {d.log_tail(8)}")

    def ev_peer_rotate(self) -> None:
        which = self.c.rng.choice(["A", "B"])
        self.setup.certs.rotate("node" + which)
        self.reload(which, f"peer_rotate node{which} (rotation {self.setup.certs.rotations['node' + which]})")
        self.open_reaching_a(self.reader(), f"peer_rotate node{which}, then")

    def ev_peer_new_ca(self) -> None:
        certs = self.setup.certs
        steps = [("both CAs trusted", certs.new_ca),
                 ("certificates of the new CA", lambda: [certs.rotate(n) for n in ("nodeA", "nodeB")]),
                 ("the new CA alone trusted", certs.trust_new_ca_alone)]
        for step, change in steps:
            change()
            for which in ("A", "B"):
                self.reload(which, f"peer_new_ca {certs.cas} ({step}) node{which}")
            self.open_reaching_a(self.reader(), f"peer_new_ca {certs.cas} ({step}), then")

    # -- invariants -----------------------------------------------------------------

    def holds_problem(self) -> str:
        a = peer_row(self.c.d.rmmctl_json("peers"), "nodeB")
        b = peer_row(self.b.rmmctl_json("peers"), "nodeA")
        theirs = int(a.get("holds_they_have", 0)) if a else 0
        ours = int(b.get("holds_we_have", 0)) if b else -1
        if b is None:
            return "node B lists no peer nodeA"
        if b.get("state") not in ("ready", "probe_failed"):
            return f"node B's link to nodeA is {b.get('state')}: {b.get('problem')}"
        if theirs != self.held or ours != self.held:
            return f"A has {theirs} holds of nodeB's, B {ours} on nodeA, its readers {self.held}"
        return ""

    def wait_holds(self, what: str) -> None:
        """Within a lease and a few seconds (a dead B's holds end with it)."""
        deadline = time.monotonic() + HOLD_LEASE_MS / 1000 + REACH_S
        while (problem := self.holds_problem()) and time.monotonic() < deadline:
            time.sleep(0.25)
        self.c.check("peer_holds", not problem, lambda: f"{what}: {problem}")

    def round_end(self) -> None:
        """Before the soak's quiet point: holds agree; then B's quiet point."""
        for w in self.readers:
            out = w.call("verify")
            self.c.check("data_intact", out["ok"], lambda: f"{w.name}: {out}")
        self.wait_holds("end of round")
        for w in self.readers:
            status, rest = w.finish()
            self.c.check("client_exit", status == 0, lambda: f"{w.name} exited {status}: {rest} {w.stderr()}")
        self.readers = []
        self.held = 0
        self.wait_holds("at node B's quiet point")
        self.quiet_b("at node B's quiet point")

    def quiet_b(self, what: str) -> None:
        deadline = time.monotonic() + 20
        while True:
            stats = self.b.stats()
            busy = [(p["pool"]["name"], p.get("in_use_bytes", 0)) for p in stats["pools"]
                    if int(p.get("in_use_bytes", 0))]
            others = [s for s in stats.get("sessions", []) if s.get("command") != "rmmctl"]
            if (not busy and not others) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.c.check("peer_b_quiet", not busy and not others,
                     lambda: f"{what}: pools in use {busy}, sessions {others}")

    def finish(self) -> None:
        """The end: no holds either way, B's pools at 0, its store empty, B exits 0."""
        for w in self.readers:
            w.finish()
        self.readers = []
        self.held = 0
        self.wait_holds("at the end")
        self.quiet_b("at the end")
        stored = self.b.manager.stored_names()
        self.c.check("end_fd_store_empty", not stored, lambda: f"node B's fd store at the end: {stored}")
        status = self.b.signal(signal.SIGTERM)
        self.c.check("end_daemon_exit", status == 0, lambda: f"node B exited {status}:\n{self.b.log_tail()}")

    def cleanup(self) -> None:
        for w in self.readers:
            w.kill()
