"""The events and invariants of the chaos soak (rmmd_chaos.py says what they
are). Chaos keeps what the driver believes the node holds (workers, their
allocations, buffers and who holds them) and compares the daemon with it."""

from __future__ import annotations

import glob
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from chaos_node import (CLIENT_USERS, OUTSIDER, ChaosError, Daemon, Program, Worker, gpu_contexts, spawn_kwargs,
                        user_ids)

RMMD_GROUP = "rmmd"
WEIGHTS = {
    "worker_start": 3, "worker_stop": 1, "worker_kill": 1, "alloc": 4, "free": 3, "churn": 2,
    "churn_kill": 1, "create": 3, "open_ro": 3, "open_rw": 1, "open_labels": 1, "list": 1, "close": 2,
    "delete": 1, "lease": 1, "reclaim": 1, "snoop": 1, "outsider": 1, "verify": 1,
    "daemon_kill": 0.4, "daemon_term": 0.3, "hup_apply": 0.3, "hup_restart": 0.2, "sleep": 1,
}
MAX_WORKERS = 6
MAX_BUFFERS = 10


sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_worker import first_difference, pattern  # noqa: E402


class Chaos:
    def __init__(self, rng: random.Random, seed: int, daemon: Daemon, args: Any, tools: dict[str, Path],
                 env: dict[str, str], gpus: int, multi_uid: bool, peering: Any = None) -> None:
        self.rng, self.seed, self.d, self.args, self.tools, self.gpus = rng, seed, daemon, args, tools, gpus
        self.multi_uid = multi_uid
        self.users: list[str | None] = list(CLIENT_USERS) if multi_uid else [None]
        self.env = env
        os.environ.update(env)
        sys.path.insert(0, env["PYTHONPATH"].split(os.pathsep)[0])
        import rmmd  # noqa: PLC0415 (after RMMD_LIBRARY is set)
        self.rmmd = rmmd
        self.markers = {u: rng.randbytes(16) for u in self.users}
        self.workers: list[Worker] = []
        self.buffers: dict[str, dict[str, Any]] = {}
        self.churn: list[Program] = []
        self.events: Counter[str] = Counter()
        self.checks: Counter[str] = Counter()
        self.failures: list[dict[str, Any]] = []
        self.round_no = 0
        self.event_no = 0
        self.said = 0
        self.serial = 0
        self.baseline: dict[str, int] | None = None
        self.driver_baseline: dict[str, int] | None = None
        self.driver_processes = ""
        self.baseline_start = -1
        self.log_dir = daemon.base / "clients"
        self.log_dir.mkdir()
        os.chmod(self.log_dir, 0o777)
        self.rmmd_gid = user_ids(RMMD_GROUP)[1] if multi_uid else os.getgid()  # type: ignore[index]
        kinds = dict(WEIGHTS)
        if not gpus:
            kinds.pop("sleep")
        if not multi_uid:
            for k in ("snoop", "outsider"):
                kinds.pop(k)
        # peering: a chaos_peering.PeerSetup and node B (a Daemon), or None.
        self.peer = None
        if peering is not None:
            from chaos_peering import PEER_GPU_WEIGHTS, PEER_WEIGHTS, PeerChaos  # noqa: PLC0415
            self.peer = PeerChaos(self, *peering)
            kinds.update(PEER_WEIGHTS)
            if gpus:
                kinds.update(PEER_GPU_WEIGHTS)
        self.peering_off = ""
        self.kinds = list(kinds)
        self.weights = [kinds[k] for k in self.kinds]

    # -- bookkeeping ----------------------------------------------------------

    def where(self) -> str:
        return f"[seed {self.seed} round {self.round_no} event {self.event_no}]"

    def say(self, text: str) -> None:
        self.said += 1
        print(f"rmmd_chaos {self.where()} {text}", file=sys.stderr, flush=True)

    def fail(self, what: str) -> None:
        self.say("FAILURE: " + what)
        self.failures.append({"seed": self.seed, "round": self.round_no, "event": self.event_no, "what": what})

    def check(self, kind: str, ok: bool, what: Callable[[], str] | str) -> bool:
        self.checks[kind] += 1
        if not ok:
            self.fail(f"{kind}: {what() if callable(what) else what}")
        return ok

    def next_name(self, kind: str) -> str:
        self.serial += 1
        return f"chaos/{kind}-{self.serial}"

    def client_env(self, **extra: str) -> dict[str, str]:
        return self.d.client_env(**self.env, **extra)

    def left_out(self, why_one_uid: str) -> list[str]:
        if self.peer is None:
            out = [f"peering (two daemons over mutual TLS): off: {self.peering_off}"]
        elif not self.gpus:
            out = ["peering: a remote read's bytes (a fabric buffer: GPUs and IMEX); the soak's buffers "
                   "are host buffers, which node A refuses to lend (FAILED_PRECONDITION), and without a "
                   "GPU the client refuses a remote open before asking (both checked): no remote hold "
                   "is ever made"]
        elif self.peer.no_fabric:
            out = [f"peering: a remote read's bytes: node A has no fabric pool ({self.peer.no_fabric})"]
        elif not self.peer.fabric_reads:
            out = [f"peering: a remote read's bytes: none this run (peer_fabric drawn "
                   f"{self.events.get('peer_fabric', 0)} times, no buffer read)"]
        else:
            out = []
        if getattr(self.args, "frameworks_left_out", ""):
            out += [f"PyTorch MemPool / whole-process allocator / CuPy clients: {self.args.frameworks_left_out}"]
        if not self.gpus:
            out += ["GPU modes (pinned, direct, packed, slab), sleep/wake, CUDA_VISIBLE_DEVICES "
                    "permutations and the driver's used-memory check: no GPU"]
        if why_one_uid:
            out += [f"three uids: {why_one_uid}"]
        return out

    # -- a round --------------------------------------------------------------

    def round(self, r: int) -> None:
        self.round_no = r
        self.event_no = -1
        for _ in range(self.rng.randrange(2, 5)):  # a busy node: clients from the start
            self.ev_worker_start()
        for i in range(self.args.events_per_round):
            self.event_no = i
            kind = self.rng.choices(self.kinds, self.weights)[0]
            said = self.said
            getattr(self.peer if kind.startswith("peer_") else self, "ev_" + kind)()
            # An event that found nothing to act on (no worker yet, ...) says nothing.
            self.events[kind if self.said > said else "nothing_to_do"] += 1
            self.check_persistent()
        self.event_no = self.args.events_per_round
        self.end_of_round()

    # -- workers --------------------------------------------------------------

    def pick_worker(self, user: Any = "any") -> Worker | None:
        live = [w for w in self.workers if user == "any" or w.user == user]
        return self.rng.choice(live) if live else None

    def ev_worker_start(self) -> None:
        if len(self.workers) >= MAX_WORKERS:
            return
        user = self.rng.choice(self.users)
        self.serial += 1
        pinned = bool(self.gpus) and self.rng.random() < 0.5
        w = Worker(self.args.python, self.client_env(), user, self.markers[user], pinned, self.log_dir,
                   f"w{self.serial}")
        w.allocs = {}  # type: ignore[attr-defined]
        w.counted = set()  # type: ignore[attr-defined]  # lent by the running daemon
        w.holds = set()  # type: ignore[attr-defined]
        self.workers.append(w)
        self.say(f"worker_start {w.name} as {user} pid {w.proc.pid}{' pinned' if pinned else ''}")

    def drop_worker(self, w: Worker) -> None:
        self.workers.remove(w)
        for name in list(w.holds):  # type: ignore[attr-defined]
            self.let_go(name, w.name)

    def ev_worker_stop(self) -> None:
        w = self.pick_worker()
        if w is None:
            return
        self.say(f"worker_stop {w.name}")
        self.drop_worker(w)
        status, rest = w.finish()
        self.check("client_exit", status == 0, lambda: f"{w.name} exited {status}: {rest} {w.stderr()}")

    def ev_worker_kill(self) -> None:
        w = self.pick_worker()
        if w is None:
            return
        self.say(f"worker_kill {w.name} (SIGKILL)")
        self.drop_worker(w)
        w.kill()

    def ev_alloc(self) -> None:
        w = self.pick_worker()
        if w is None:
            return
        n = int(2 ** self.rng.uniform(8, 20))
        s = self.rng.randrange(1 << 30)
        out = w.call("alloc", n=n, seed=s)
        self.say(f"alloc {w.name} {n} B -> {out}")
        if out["ok"]:
            w.allocs[out["id"]] = out["bytes"]  # type: ignore[attr-defined]
            w.counted.add(out["id"])  # type: ignore[attr-defined]
        else:
            self.check("client_answer", out["error"] == "OutOfMemoryError", f"{w.name} alloc: {out}")

    def ev_free(self) -> None:
        w = self.pick_worker()
        if w is None or not w.allocs:  # type: ignore[attr-defined]
            return
        i = self.rng.choice(sorted(w.allocs))  # type: ignore[attr-defined]
        out = w.call("free", id=i)
        del w.allocs[i]  # type: ignore[attr-defined]
        w.counted.discard(i)  # type: ignore[attr-defined]
        self.say(f"free {w.name} #{i} -> {out['ok']}")
        self.check("data_intact", out["ok"], lambda: f"{w.name} free #{i}: {out}")

    def ev_verify(self) -> None:
        for w in self.workers:
            out = w.call("verify")
            self.check("data_intact", out["ok"], lambda: f"{w.name} verify: {out}")
        self.say(f"verify {len(self.workers)} workers")

    # -- churn clients (the kill -9 soak's client) -----------------------------

    def ev_churn(self) -> None:
        modes = ["host"] + (["pinned", "cuda-direct", "cuda-packed", "cuda-slab"] if self.gpus else [])
        modes += list(getattr(self.args, "frameworks", []))
        mode = self.rng.choice(modes)
        user = self.rng.choice(self.users)
        lifetime = self.rng.randrange(50, 1500)
        max_bytes = 65536 if mode == "cuda-packed" else (4 << 20 if mode.startswith("cuda") else 1 << 20)
        ending = self.rng.choice(["free", "leave", "exit"])
        extra = {}
        if self.gpus > 1 and self.rng.random() < 0.5:
            order = list(range(self.gpus))
            self.rng.shuffle(order)
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, order))
        program = [str(self.tools["rmmd_soak_client"])]
        if mode.startswith(("torch", "cupy")):
            # PyTorch and CuPy as users plug rmmd in (chaos_framework_client.py).
            program = [self.args.framework_python, str(Path(__file__).resolve().parent / "chaos_framework_client.py")]
            extra["RMMD_TORCH_OOM_SHIM"] = "0"  # no compiler run in a client that may be killed
            max_bytes = 4 << 20
        argv = [*program, "cuda-direct" if mode == "cuda-packed" else mode,
                str(self.rng.randrange(1, 1 << 30)), str(lifetime), str(max_bytes), ending]
        self.churn.append(Program(argv, self.client_env(**extra), user))
        self.say(f"churn {mode} as {user} {lifetime} ms {ending} {extra}")

    def ev_churn_kill(self) -> None:
        live = [c for c in self.churn if c.proc.poll() is None]
        if live:
            c = self.rng.choice(live)
            self.say(f"churn_kill pid {c.proc.pid} (SIGKILL)")
            c.kill()
            c.killed = True  # type: ignore[attr-defined]

    def collect_churn(self) -> None:
        for c in self.churn:
            status, out = c.finish(timeout=60)
            if getattr(c, "killed", False) or status == -signal.SIGKILL:
                continue
            crossed = getattr(c, "crossed_restart", set())
            if crossed and status == 3 and ("no daemon is listening" in out or "draining" in out):
                continue  # it opened its session while rmmd was down: refused, as documented
            if "SIGKILL" in " ".join(crossed) and status == 3 and "without a welcome" in out:
                continue  # its hello reached a daemon that was killed before it answered
            self.check("client_exit", status == 0, lambda: f"{' '.join(c.argv)} exited {status}: {out}")
        self.churn = []

    # -- buffers --------------------------------------------------------------

    def let_go(self, name: str, holder: str) -> None:
        b = self.buffers.get(name)
        if b is None:
            return
        b["holders"].discard(holder)
        if not b["persistent"] and not b["holders"]:
            del self.buffers[name]

    def visible(self, b: dict[str, Any], user: Any) -> bool:
        return b["shared"] or b["user"] == user

    def ev_create(self) -> None:
        w = self.pick_worker()
        if w is None or len(self.buffers) >= MAX_BUFFERS:
            return
        name = self.next_name("buf")
        n = self.rng.randrange(16, 512) * 4096
        s = self.rng.randrange(1 << 30)
        persistent = self.rng.random() < 0.6
        shared = self.rng.random() < 0.7
        allow_writers = self.rng.random() < 0.3
        labels = {"chaos": "run", "id": str(self.serial)}
        out = w.call("create", name=name, n=n, seed=s, persistent=persistent,
                     gid=self.rmmd_gid if shared else None, labels=labels, allow_writers=allow_writers)
        self.say(f"create {name} by {w.name} {n} B persistent={persistent} shared={shared} -> {out['ok']}")
        if not out["ok"]:
            self.check("client_answer", out["error"] == "OutOfMemoryError", f"create {name}: {out}")
            return
        self.buffers[name] = {"user": w.user, "n": n, "seed": s, "persistent": persistent, "shared": shared,
                              "labels": labels, "allow_writers": allow_writers, "holders": {w.name},
                              "skip": 0}
        w.holds.add(name)  # type: ignore[attr-defined]

    def pick_buffer(self, pred: Callable[[dict[str, Any]], bool] = lambda b: True) -> str | None:
        names = sorted(n for n, b in self.buffers.items() if pred(b))
        return self.rng.choice(names) if names else None

    def ev_open_ro(self, writable: bool = False) -> None:
        w = self.pick_worker()
        name = self.pick_buffer(lambda b: not b.get("lease"))
        if w is None or name is None or name in w.holds:  # type: ignore[attr-defined]
            return
        b = self.buffers[name]
        out = w.call("open", name=name, seed=b["seed"], writable=writable)
        self.say(f"open {name} by {w.name} writable={writable} -> {out}")
        if not self.visible(b, w.user):
            # Hidden: the same answer as a name that does not exist.
            missing = w.call("open", name=name + "-none", seed=-1)
            self.check("private_hidden", not out["ok"] and out["error"] == "NotFoundError"
                       and out["message"].replace(name, "N") == missing["message"].replace(name + "-none", "N"),
                       lambda: f"{w.name} ({w.user}) opening another uid's private {name}: {out} vs {missing}")
            return
        if writable and not b["allow_writers"]:
            if b["user"] != w.user:
                self.check("writers_rule", not out["ok"] and out["error"] == "PermissionError",
                           lambda: f"{w.name} writable open of another uid's {name} (no writers): {out}")
                return
            if not out["ok"] and out["error"] == "PermissionError":
                return  # the creator's uid in another process: either answer is allowed here
        if self.check("open", out["ok"], lambda: f"{w.name} open {name}: {out}"):
            b["holders"].add(w.name)
            w.holds.add(name)  # type: ignore[attr-defined]

    def ev_open_rw(self) -> None:
        self.ev_open_ro(writable=True)

    def ev_open_labels(self) -> None:
        w = self.pick_worker()
        name = self.pick_buffer(lambda b: not b.get("lease") and self.visible(b, w.user) if w else False)
        if w is None or name is None or name in w.holds:  # type: ignore[attr-defined]
            return
        b = self.buffers[name]
        out = w.call("open_labels", labels=b["labels"], seed=b["seed"])
        self.say(f"open_labels {b['labels']} by {w.name} -> {out}")
        if self.check("open", out["ok"] and out["name"] == name, lambda: f"open by labels: {out}"):
            b["holders"].add(w.name)
            w.holds.add(name)  # type: ignore[attr-defined]

    def ev_list(self) -> None:
        w = self.pick_worker()
        if w is None:
            return
        out = w.call("list", labels={"chaos": "run"})
        want = sorted(n for n, b in self.buffers.items() if self.visible(b, w.user) and not b.get("lease"))
        self.say(f"list by {w.name} -> {len(out.get('names', []))} buffers")
        self.check("list_by_label", out["ok"] and out["names"] == want,
                   lambda: f"{w.name} ({w.user}) lists {out}, expected {want}")

    def ev_close(self) -> None:
        held = [(w, n) for w in self.workers for n in sorted(w.holds)]  # type: ignore[attr-defined]
        if not held:
            return
        w, name = self.rng.choice(held)
        out = w.call("close", name=name)
        self.say(f"close {name} by {w.name} -> {out['ok']}")
        self.check("client_answer", out["ok"], lambda: f"close {name}: {out}")
        w.holds.discard(name)  # type: ignore[attr-defined]
        self.let_go(name, w.name)

    def ev_delete(self) -> None:
        name = self.pick_buffer(lambda b: b["persistent"])
        if name is None:
            return
        self.delete(name)

    def delete(self, name: str) -> None:
        b = self.buffers[name]
        for w in self.workers:
            if name in w.holds:  # type: ignore[attr-defined]
                w.call("close", name=name)
                w.holds.discard(name)  # type: ignore[attr-defined]
        deleter = self.pick_worker(b["user"])
        if deleter is not None:
            out = deleter.call("delete", name=name)
            ok, what = out["ok"], str(out)
        else:
            p = Program([str(self.d.rmmctl), "buffers", "delete", name], self.client_env(), None)
            status, text = p.finish()
            ok, what = status == 0, text
        self.say(f"delete {name} by {deleter.name if deleter else 'rmmctl'} -> {ok}")
        self.check("client_answer", ok, lambda: f"delete {name}: {what}")
        del self.buffers[name]

    def check_persistent(self) -> None:
        """Every persistent buffer, read-only through a root session, word by word."""
        names = [n for n, b in self.buffers.items() if b["persistent"]]
        if not names:
            return
        s = self.rmmd.Session(runtime_dir=str(self.d.runtime_dir), client_name="chaos-check", reconnect=0)
        try:
            for name in names:
                b = self.buffers[name]
                try:
                    with self.rmmd.SharedBuffer.open(s, name) as buf:
                        v = buf.memoryview()
                        mark_ok = bytes(v[:16]) == self.markers[b["user"]]
                        nw = (b["n"] - 16) // 8
                        why = first_difference(bytes(v[16: 16 + nw * 8]), pattern(nw, b["seed"]), b["skip"])
                        self.check("persistent_bytes", mark_ok and why is None and buf.nbytes == b["n"],
                                   lambda: f"{name}: marker {'ok' if mark_ok else 'wrong'}, {why}, "
                                           f"{buf.nbytes} B (want {b['n']})")
                        del v
                except self.rmmd.Error as e:
                    self.check("persistent_bytes", False, f"{name}: cannot open: {e}")
        finally:
            s.close()

    # -- the write lease -------------------------------------------------------

    def ev_lease(self) -> None:
        if len(self.workers) < 3:
            return
        creator, x, y = self.rng.sample(self.workers, 3)
        name = self.next_name("lease")
        s = self.rng.randrange(1 << 30)
        out = creator.call("create", name=name, n=65536, seed=s, persistent=True, gid=self.rmmd_gid,
                           labels={}, allow_writers=True)
        if not self.check("client_answer", out["ok"], lambda: f"create {name}: {out}"):
            return
        creator.call("close", name=name)
        self.buffers[name] = {"user": creator.user, "n": 65536, "seed": s, "persistent": True, "shared": True,
                              "labels": {}, "allow_writers": True, "holders": set(), "skip": 1, "lease": True}
        first = x.call("open", name=name, seed=s, writable=True, exclusive=True, wait=5.0)
        if not self.check("lease", first["ok"], lambda: f"{x.name} exclusive open: {first}"):
            return
        y.send("open", name=name, seed=s, writable=True, exclusive=True, wait=20.0)
        time.sleep(self.rng.uniform(0, 0.2))  # a random moment of the wait
        how = self.rng.choice(["kill", "close"])
        if how == "kill":
            self.drop_worker(x)
            x.kill()
        else:
            x.call("close", name=name)
        second = y.reply(30)
        self.say(f"lease {name}: {x.name} gen {first.get('generation')} {how}, {y.name} -> {second}")
        self.check("lease", second["ok"] and second["generation"] > first["generation"]
                   and second["seen"] == first["generation"],
                   lambda: f"{y.name} after {x.name}'s {how}: {second} (first {first})")
        if second["ok"]:
            y.call("close", name=name)

    # -- reclaim, isolation, admission ---------------------------------------------

    def pool(self, stats: dict[str, Any], name: str = "host") -> dict[str, Any]:
        for p in stats["pools"]:
            if p["pool"]["name"] == name:
                return p
        raise ChaosError(f"no pool {name} in stats")

    def ev_reclaim(self) -> None:
        if len(self.users) < 2 and self.multi_uid:
            return
        self.collect_churn()
        holder_user, taker_user = self.rng.sample(self.users, 2) if self.multi_uid else (None, None)
        p = self.pool(self.d.stats())
        room = int(p["pool"]["capacity_bytes"]) - int(p["in_use_bytes"])
        slab = 4 << 20
        count = min(8, room // slab)
        if count < 1:
            return
        free_after = room - count * slab
        want = free_after + slab
        holder = Program([str(self.tools["rmmd_test_client"]), "idle-slabs", str(count), str(slab)],
                         self.client_env(), holder_user)
        if not self.check("reclaim", holder.wait_line("ready", 30) is not None,
                          lambda: f"idle-slabs: {holder.seen}"):
            holder.kill()
            return
        taker = Program([str(self.tools["rmmd_test_client"]), "allocate", str(want)], self.client_env(),
                        taker_user)
        got = taker.wait_line("", 30)
        gave = holder.wait_line("gave-back", 10)
        self.say(f"reclaim {count} idle slabs of {holder_user}, {taker_user} wants {want} B -> {got}; {gave}")
        self.check("reclaim", got is not None and got.startswith("allocated") and gave is not None,
                   lambda: f"taker: {taker.seen}, holder: {holder.seen}")
        for prog in (taker, holder):
            status, out = prog.finish()
            self.check("client_exit", status == 0, lambda: f"{prog.argv}: {status} {out}")

    def ev_snoop(self) -> None:
        victim, snooper = self.rng.sample(self.users, 2)
        snoop = Program([str(self.tools["rmmd_test_client"]), "snoop-host", str(65536)], self.client_env(),
                        snooper)
        if not self.check("isolation", snoop.wait_line("", 30) is not None, lambda: f"snoop: {snoop.seen}"):
            snoop.kill()
            return
        snoop.write(f"scan {self.markers[victim].hex()}\n")
        found = []
        while True:
            line = snoop.wait_line("", 60)
            if line is None or line.startswith("scanned"):
                break
            if line.startswith("found"):
                found.append(line)
        self.say(f"snoop by {snooper} for {victim}'s marker -> {found or 'nothing'}")
        self.check("isolation", line is not None and not found,
                   lambda: f"{snooper} read {victim}'s marker: {found} {snoop.seen[-5:]}")
        status, out = snoop.finish()
        self.check("client_exit", status == 0, lambda: f"snoop: {status} {out}")

    def ev_outsider(self) -> None:
        p = Program([str(self.tools["rmmd_test_client"]), "hold", "4096", "7", "1"], self.client_env(), OUTSIDER)
        status, out = p.finish()
        self.say(f"outsider -> status {status}")
        self.check("outsider_refused", status == 3 and "no permission to connect" in out,
                   lambda: f"the outsider's client: status {status}: {out}")

    # -- the daemon --------------------------------------------------------------

    def restarted(self, how: str) -> None:
        """After a restart: every worker makes progress (a ping that
        allocates) and says it reconnected; every buffer comes back."""
        for c in self.churn:
            if not hasattr(c, "crossed_restart"):
                c.crossed_restart = set()  # type: ignore[attr-defined]
            c.crossed_restart.add(how)  # type: ignore[attr-defined]
        for w in self.workers:
            # Lent by the daemon that is gone: kept and checked by the worker,
            # freed locally, in no ledger.
            w.counted.clear()  # type: ignore[attr-defined]
        for w in list(self.workers):
            before = w.reconnects
            out = w.call("ping", timeout=90)
            ok = out["ok"] and out["reconnects"] > before
            self.check("progress_after_restart", ok, lambda: f"{w.name} after {how}: {out} (before {before})")
            if out["ok"]:
                w.reconnects = out["reconnects"]

    def ev_daemon_kill(self) -> None:
        self.say("daemon_kill (SIGKILL)")
        self.d.signal(signal.SIGKILL)
        self.d.start()
        self.restarted("SIGKILL")

    def ev_daemon_term(self) -> None:
        self.say("daemon_term (SIGTERM)")
        status = self.d.signal(signal.SIGTERM)
        self.check("daemon_exit", status == 0, lambda: f"rmmd exited {status} on SIGTERM:\n{self.d.log_tail()}")
        self.d.start()
        self.restarted("SIGTERM")

    def ev_hup_apply(self) -> None:
        s = self.d.settings
        s["reclaim_timeout_ms"] = 500 if s["reclaim_timeout_ms"] == 300 else 300
        self.d.write_config()
        line = self.d.hup()
        self.say(f"hup_apply -> {line.strip()}")
        self.check("reload", f"reclaim_timeout_ms={s['reclaim_timeout_ms']}" in line, line)
        for w in self.workers:
            out = w.call("ping")
            self.check("progress_after_reload", out["ok"], lambda: f"{w.name}: {out}")

    def ev_hup_restart(self) -> None:
        s = self.d.settings
        # Never the value the running daemon has, or nothing would change.
        s["hello_timeout_ms"] = 2000 + (s["hello_timeout_ms"] - 2000 + 1000) % 4000
        if s["hello_timeout_ms"] == self.d.running_hello_timeout:
            s["hello_timeout_ms"] = 2000 + (s["hello_timeout_ms"] - 2000 + 1000) % 4000
        self.d.write_config()
        line = self.d.hup()
        self.say(f"hup_restart -> {line.strip()}")
        self.check("reload", "needs a restart" in line and "hello_timeout_ms" in line, line)

    def ev_sleep(self) -> None:
        user = self.rng.choice(self.users)
        name = self.next_name("sleep").replace("/", "-")
        n, s = self.rng.randrange(1, 64) << 20, self.rng.randrange(1 << 30)
        sleeper = Program([str(self.tools["rmmd_stable_client"]), "sleep", name, str(n), str(s)],
                          self.client_env(), user)
        asleep = sleeper.wait_line("asleep", 60)
        sleeper.kill()
        restore = Program([str(self.tools["rmmd_stable_client"]), "restore", name, str(n), str(s)],
                          self.client_env(), user)
        status, out = restore.finish(120)
        self.say(f"sleep {name} {n} B as {user}: {asleep}; SIGKILL asleep; restore -> {status}")
        self.check("sleep_wake", asleep is not None and status == 0 and "intact" in out,
                   lambda: f"{name}: {sleeper.seen} / {out}")

    # -- invariants ---------------------------------------------------------------

    def ledger_problems(self, stats: dict[str, Any]) -> list[str]:
        problems = []
        sessions = stats.get("sessions", [])
        by_pid = Counter()
        for s in sessions:
            by_pid[int(s["pid"])] += int(s.get("bytes", 0))
        for w in self.workers:
            held = sum(w.allocs[i] for i in w.counted)  # type: ignore[attr-defined]
            if by_pid[w.proc.pid] != held:
                problems.append(f"{w.name} holds {held} B, its session {by_pid[w.proc.pid]} B")
        # A session's bytes are across every pool: the sum of the pools'.
        in_use = sum(int(p.get("in_use_bytes", 0)) for p in stats["pools"])
        shared = sum(int(p.get("shared_bytes", 0)) for p in stats["pools"])
        sess = sum(int(s.get("bytes", 0)) for s in sessions)
        if in_use != sess + shared:
            problems.append(f"pools: in use {in_use} B != sessions {sess} + buffers {shared}")
        for p in stats["pools"]:
            in_use = int(p.get("in_use_bytes", 0))
            tenants = sum(int(t.get("in_use_bytes", 0)) for t in p.get("tenants", []))
            if tenants != in_use:
                problems.append(f"pool {p['pool']['name']}: tenants {tenants} B != in use {in_use}")
        listed = self.d.buffers()
        want = {n: b["n"] for n, b in self.buffers.items()}
        if listed != want:
            problems.append(f"buffers listed {sorted(listed.items())} != expected {sorted(want.items())}")
        host = self.pool(stats)
        want_shared = sum(b["n"] for b in self.buffers.values())
        if int(host.get("shared_bytes", 0)) != want_shared:
            problems.append(f"host pool's buffers {host.get('shared_bytes', 0)} B != expected {want_shared}")
        return problems

    def wait_ledger(self, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while True:
            stats = self.d.stats()
            problems = self.ledger_problems(stats)
            if not problems or time.monotonic() > deadline:
                self.check("ledger", not problems, lambda: f"{what}: " + "; ".join(problems))
                return stats
            time.sleep(0.2)

    def end_of_round(self) -> None:
        self.collect_churn()
        for w in self.workers:
            out = w.call("verify")
            self.check("data_intact", out["ok"], lambda: f"{w.name}: {out}")
        self.wait_ledger("with the round's clients")
        if self.peer is not None:
            self.peer.round_end()
        left = glob.glob("/dev/shm/cuda.shm*")
        self.check("dev_shm", not left, lambda: f"left in /dev/shm: {left}")
        # The quiet point: every client stops.
        for w in list(self.workers):
            self.drop_worker(w)
            status, rest = w.finish()
            self.check("client_exit", status == 0, lambda: f"{w.name} exited {status}: {rest} {w.stderr()}")
        stats = self.wait_ledger("at the quiet point")
        others = [s for s in stats.get("sessions", []) if s.get("command") != "rmmctl"]
        self.check("sessions_closed", not others, lambda: f"sessions left: {others}")
        self.check_daemon_level(stats)
        self.check_driver_memory()
        self.say(f"round {self.round_no} done: {len(self.buffers)} buffers, {sum(self.checks.values())} checks, "
                 f"{len(self.failures)} failures")

    def check_daemon_level(self, stats: dict[str, Any]) -> None:
        """Its fds, threads and VmRSS against the first quiet point's: one
        memfd per host buffer it lists, one per tenant at most (the client
        uids and root's), and the rest (sockets, gRPC's pollers) within
        --fd-slack of their level."""
        from chaos_node import proc_figures
        host_buffers = sum(1 for n in self.d.buffers())  # every buffer here is a host one
        f = proc_figures(self.d.pid)
        # Connections close on the daemon's threads after the client saw its
        # answer (rmmctl's own, a client's exit): the level is the lowest
        # reading within a few seconds, and it must come back within them.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
                self.baseline is None or f["fds"] > self.baseline["fds"] + self.args.fd_slack
                or f["buffer_memfds"] != host_buffers):
            time.sleep(0.25)
            g = proc_figures(self.d.pid)
            f = {k: min(f[k], g[k]) for k in f}
        self.check("daemon_buffer_fds", f["buffer_memfds"] == host_buffers,
                   lambda: f"{f['buffer_memfds']} buffer memfds for {host_buffers} buffers")
        self.check("daemon_tenant_fds", f["tenant_memfds"] <= len(self.users) + 1,
                   lambda: f"{f['tenant_memfds']} tenant memfds for {len(self.users)} client uids and root")
        if self.round_no < self.args.warmup_rounds:
            # The highest of the first quiet points is the level of every
            # later one, whichever start of rmmd it finds: with CUDA, a
            # start's first address-stable allocation or page-locking loads
            # driver state (about 15 MiB of RSS) once.
            self.baseline = f if self.baseline is None else {k: max(f[k], self.baseline[k]) for k in f}
            self.say(f"daemon baseline (round {self.round_no}): {self.baseline}")
            return
        b = self.baseline
        self.check("daemon_fds", f["fds"] <= b["fds"] + self.args.fd_slack,
                   lambda: f"fds {f['fds']} (less memfds) > {b['fds']} + {self.args.fd_slack}")
        self.check("daemon_threads", f["threads"] <= b["threads"] + self.args.thread_slack,
                   lambda: f"threads {f['threads']} > {b['threads']} + {self.args.thread_slack}")
        self.check("daemon_rss", f["rss_kib"] <= b["rss_kib"] + self.args.rss_slack_kib,
                   lambda: f"VmRSS {f['rss_kib']} KiB > {b['rss_kib']} + {self.args.rss_slack_kib}")
        self.say(f"daemon level {f} (baseline {b})")

    def unaccounted(self) -> dict[str, int]:
        """Per GPU: the driver's used memory less the ledgers of the daemons
        (node A's, and node B's where it peers on the same GPUs): at a quiet
        point, their CUDA contexts alone."""
        out = {g["gpu_uuid"]: int(g.get("unaccounted_bytes", 0)) for g in self.d.stats().get("gpu_memory", [])}
        if self.peer is not None:
            for g in self.peer.b.stats().get("gpu_memory", []):
                if g["gpu_uuid"] in out:
                    out[g["gpu_uuid"]] -= int(g.get("ledger_bytes", 0))
        return out

    def check_driver_memory(self) -> None:
        """On a GPU at the quiet point: the driver's used memory less the
        ledgers back at the first quiet point's level within
        --driver-slack-mib, on every GPU (memory rmmd lost track of, or a
        dead client's import the driver still holds, shows here)."""
        if not self.gpus:
            return
        slack = self.args.driver_slack_mib << 20
        deadline = time.monotonic() + 20
        while True:
            now = self.unaccounted()
            off = {u: now[u] - self.driver_baseline[u] for u in now if u in self.driver_baseline} \
                if self.driver_baseline is not None else {}
            if self.driver_baseline is None or all(abs(v) <= slack for v in off.values()) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # a dead client's context goes a moment after it
        if self.driver_baseline is None:
            self.driver_baseline = now
            self.driver_processes = gpu_contexts()
            self.say(f"driver baseline (used less the ledgers, per GPU): {now}; contexts: {self.driver_processes}")
            return
        self.check("driver_memory", all(abs(v) <= slack for v in off.values()),
                   lambda: f"the driver's used memory less the ledgers moved {off} B from {self.driver_baseline}; "
                           f"contexts now: {gpu_contexts()} (at the baseline: {self.driver_processes})")

    def finish(self) -> None:
        """The end: every buffer deleted, pools at 0, the store empty, exit 0."""
        self.event_no = -1
        if self.peer is not None:
            self.peer.finish()
        for name in sorted(self.buffers):
            self.delete(name)
        deadline = time.monotonic() + 20
        while True:
            stats = self.d.stats()
            busy = [(p["pool"]["name"], p.get("in_use_bytes", 0)) for p in stats["pools"]
                    if int(p.get("in_use_bytes", 0))]
            stored = self.d.manager.stored_names()
            if (not busy and not stored) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.check("end_pools_empty", not busy, lambda: f"pools in use at the end: {busy}")
        self.check("end_fd_store_empty", not stored, lambda: f"fd store at the end: {stored}")
        status = self.d.signal(signal.SIGTERM)
        self.check("end_daemon_exit", status == 0, lambda: f"rmmd exited {status}:\n{self.d.log_tail()}")

    def cleanup(self) -> None:
        if self.peer is not None:
            self.peer.cleanup()
        for w in self.workers:
            w.kill()
        for c in self.churn:
            c.kill()
