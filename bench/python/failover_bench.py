#!/usr/bin/env python3
"""Failover with the KV cache kept (issue 37's speed section), in one run
on GPU 0 of the GPU host.

  python bench/python/failover_bench.py [--start-daemon PATH_TO_rmmd | --runtime-dir DIR]
        [--weights-gib 8] [--kv-gib 8] [--batch 4] [--context 4096] [--contexts 4096,32768]
        [--grant-rounds 30] [--token-rounds 3] [--quick] [--json FILE] [--dry-run]

Sections (each process is failover_workers.py, which says what it does):

a. grant: SIGKILL of the writer of a KV buffer -> the lease granted to the
   standby waiting for it. --grant-rounds + 1 waiter processes (no PyTorch)
   line up for one buffer's lease; the bench SIGKILLs whoever holds it and
   times from just before the kill to the grant's return in the next one
   (CLOCK_MONOTONIC in both), round after round. Target: p50 <= 100 ms.
b. first token: a Llama sized by config to --weights-gib of bf16 weights
   (published once into rmmd, attached read-only by every process) and a
   KV buffer of --kv-gib (max length from it, --batch sequences). The
   active engine prefills --context tokens per sequence and decodes; the
   standby has attached the weights, mapped the KV and captured its decode
   graph (before the grant: the standby open keeps the addresses) and waits.
   The bench SIGKILLs the active: time to the standby's first new token
   (one decode step from where the active stopped). In the same round, a
   cold restart: a new process from the kill on (import, CUDA, attach the
   weights, an empty KV cache, the prefix computed again, one step).
   --token-rounds rounds. Target: standby p50 <= 500 ms.
c. prefix reuse: what a prefill of each of --contexts tokens costs (batch
   1, the same model): the time a standby that reuses the KV does not spend.

--start-daemon PATH (or --rmmd PATH): rmmd started with a CUDA pool for the
weights, the KV and 4 GiB more, --fabric off, and stopped at the end;
else --runtime-dir DIR (or $RMMD_RUNTIME_DIR) names a running one.
--quick: --weights-gib 1 --kv-gib 1 --grant-rounds 8 --token-rounds 1.

Prints a table, the targets (pass / MISS) and the JSON document as the last
line (also to --json FILE; schema rmmd-failover-bench/1). Exit status 0
when every section ran (a missed target is a result), 1 when one failed,
2 on a bad command line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _bench_common import (
    PACKAGE_DIR, Daemon, add_daemon_options, check_daemon_options, finish_document, parser_from_doc, rmmd_commit,
    running_daemon_dir, utc_now, verdict, worker_env,
)

sys.path.insert(0, str(PACKAGE_DIR))  # this checkout's rmmd, as the workers get it
WORKERS = Path(__file__).resolve().parent / "failover_workers.py"
SCHEMA = "rmmd-failover-bench/1"
WEIGHTS = "failover-bench/weights"  # failover_workers.WEIGHTS
GIB = 1 << 30
HIDDEN, INTERMEDIATE, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 8, 128, 32000
TARGETS = {"grant_p50_s": 0.100, "first_token_p50_s": 0.500}


def plan(a: argparse.Namespace) -> dict[str, Any]:
    """The model's layers and the KV's length from the sizes asked for."""
    per_layer = 2 * (HIDDEN * HIDDEN + HIDDEN * KV_HEADS * HEAD_DIM) + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN
    embeddings = 2 * VOCAB * HIDDEN + HIDDEN
    layers = max(1, math.ceil((a.weights_gib * GIB / 2 - embeddings) / per_layer))
    token_bytes = layers * 2 * KV_HEADS * HEAD_DIM * 2  # keys and values of every layer, bf16
    max_length = math.ceil(a.kv_gib * GIB / (a.batch * token_bytes) / 256) * 256
    max_length = max(max_length, a.context + 1024)
    return {"layers": layers, "hidden": HIDDEN, "intermediate": INTERMEDIATE, "weights_bytes": 2 * (
        layers * per_layer + embeddings), "kv_bytes": a.batch * max_length * token_bytes, "batch": a.batch,
        "max_length": max_length, "context": a.context, "contexts": a.contexts}


def model_args(p: dict[str, Any]) -> list[str]:
    return ["--layers", str(p["layers"]), "--hidden", str(p["hidden"]), "--intermediate", str(p["intermediate"]),
            "--batch", str(p["batch"]), "--max-length", str(p["max_length"]), "--context", str(p["context"]),
            "--contexts", ",".join(map(str, p["contexts"]))]


# ---- processes -----------------------------------------------------------------------


class Worker:
    """A failover_workers.py process; a thread reads its JSON lines into
    `sink` (its own queue unless given) as (worker, message)."""

    def __init__(self, role: str, args: list[str], env: dict[str, str], sink: queue.Queue | None = None) -> None:
        self.role = role
        self.sink: queue.Queue = sink if sink is not None else queue.Queue()
        self.proc = subprocess.Popen([sys.executable, str(WORKERS), role, *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.sink.put((self, json.loads(line)))
        self.sink.put((self, None))  # it ended

    def said(self, timeout: float = 600) -> dict[str, Any]:
        """Its next JSON line; RuntimeError with its stderr where it ends or stays silent."""
        try:
            _, message = self.sink.get(timeout=timeout)
        except queue.Empty:
            message = None
        if message is None:
            self.kill()
            raise RuntimeError(f"{self.role} said nothing (status {self.proc.poll()}): {''.join(self.stderr)[-3000:]}")
        return message

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def sigkill(self) -> float:
        """SIGKILL; the moment just before it."""
        t = time.monotonic()
        os.kill(self.proc.pid, signal.SIGKILL)
        return t

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)


def next_grant(sink: queue.Queue, timeout: float) -> tuple[Worker, dict[str, Any]]:
    """The next waiter that says it was granted the lease."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            w, message = sink.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"no waiter was granted the lease within {timeout} s") from None
        if message is None and w.proc.returncode != -signal.SIGKILL:
            w.proc.wait(30)
            if w.proc.returncode != -signal.SIGKILL:
                raise RuntimeError(f"a waiter ended: {''.join(w.stderr)[-3000:]}")
        if message and "granted" in message:
            return w, message


def start_daemon(rmmd_path: str, pool_bytes: int) -> Daemon:
    """rmmd with a CUDA pool of `pool_bytes` on GPU 0, --fabric off."""
    return Daemon(rmmd_path, ["--backend", "cuda", "--fabric", "off", "--cuda-pool-bytes", str(pool_bytes),
                              "--host-pool-bytes", str(256 << 20), "--drain-timeout-ms", "0"], "rmmd-failover-bench-")


# ---- sections ------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    p99 = s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]
    return {"n": len(s), "p50_s": statistics.median(s), "p99_s": p99, "min_s": s[0], "max_s": s[-1], "all_s": s}


def section_grant(a: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    import rmmd

    name = "failover-bench/grant"
    with rmmd.Session(client_name="failover-bench") as session:
        cuda = [x for x in session.pools if x.backend == "cuda" and x.device == 0]
        # A daemon without a CUDA pool (a build machine): a host buffer, to try the section there.
        pool = cuda[0] if cuda else session.host_pool
        buf = rmmd.SharedBuffer.create(session, name, 64 << 20, pool=pool, persistent=True, allow_writers=True)
        buf.publish()
        buf.close()
        sink: queue.Queue = queue.Queue()
        waiters = [Worker("waiter", ["--name", name], env, sink) for _ in range(a.grant_rounds + 1)]
        try:
            holder, _ = next_grant(sink, 120)  # the first: whoever asked first
            # The others in line (each says so before it waits, or, without the standby open, just before).
            wait_until_in_line(session, name, a.grant_rounds)
            grants: list[float] = []
            generations = []
            for _ in range(a.grant_rounds):
                killed_at = holder.sigkill()
                holder, got = next_grant(sink, 60)
                grants.append(got["granted"] - killed_at)
                generations.append(got["generation"])
        finally:
            for w in waiters:
                w.kill()
            rmmd.SharedBuffer.delete(session, name)
    return {**summary(grants), "generations": generations, "waiters_in_line": a.grant_rounds, "pool": pool.name}


def wait_until_in_line(session: Any, name: str, waiters: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        lease = session.describe_buffer(name)[0].lease
        if lease is not None and len(lease.waiters) >= waiters:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{waiters} waiters not in line after {timeout} s ({lease})")
        time.sleep(0.05)


def section_first_token(a: argparse.Namespace, p: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    import rmmd

    rounds = []
    for r in range(a.token_rounds):
        name = f"failover-bench/kv/round{r}"
        margs = [*model_args(p), "--name", name]
        active = Worker("active", margs, env)
        standby = Worker("standby", margs, env)
        cold = None
        try:
            standby.said(900)  # attached
            ready = active.said(900)
            standby.tell("open")
            standby_ready = standby.said(900)
            time.sleep(0.5)  # the active decodes; the kill lands mid-step
            killed_at = active.sigkill()
            cold = Worker("cold", margs, env)  # a restart without the KV: from the kill on
            took = standby.said(300)
            cold_said = cold.said(900)
            rounds.append({
                "standby_first_token_s": took["first_token"] - killed_at, "grant_s": took["granted"] - killed_at,
                "cold_first_token_s": cold_said["first_token"] - killed_at, "resumed_at": took["resumed_at"],
                "context_at_ready": ready["length"], "kv_bytes": ready["kv_bytes"],
            })
            print(f"first token, round {r}: standby {rounds[-1]['standby_first_token_s'] * 1e3:.0f} ms, "
                  f"cold {rounds[-1]['cold_first_token_s']:.2f} s", file=sys.stderr, flush=True)
        finally:
            for w in (active, standby, cold):
                if w is not None:
                    w.kill()
            delete_buffer(name)
    standby_s = [x["standby_first_token_s"] for x in rounds]
    cold_s = [x["cold_first_token_s"] for x in rounds]
    return {"rounds": rounds, "standby": summary(standby_s), "cold": summary(cold_s),
            "grant": summary([x["grant_s"] for x in rounds])}


def delete_buffer(name: str) -> None:
    import rmmd

    with rmmd.Session(client_name="failover-bench") as session:
        try:
            rmmd.SharedBuffer.delete(session, name)
        except rmmd.NotFoundError:
            pass


def run_section(doc: dict[str, Any], key: str, fn: Any, *args: Any) -> None:
    started = time.monotonic()
    try:
        doc["sections"][key] = fn(*args)
    except Exception as e:  # noqa: BLE001 (one section failing leaves the others' figures)
        doc["sections"][key] = {"error": f"{type(e).__name__}: {e}"}
        doc["errors"].append({"section": key, "error": doc["sections"][key]["error"]})
    doc["sections"][key]["seconds"] = time.monotonic() - started
    print(f"section {key}: {'failed' if 'error' in doc['sections'][key] else 'ran'}", file=sys.stderr, flush=True)


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    s = doc["sections"]
    grant = s.get("grant", {}).get("p50_s")
    first = s.get("first_token", {}).get("standby", {}).get("p50_s")

    def verdict(value: float | None, limit: float) -> dict[str, Any]:
        return {"value_s": value, "limit_s": limit, "pass": None if value is None else value <= limit}

    return {"grant_p50_s": verdict(grant, TARGETS["grant_p50_s"]),
            "first_token_p50_s": verdict(first, TARGETS["first_token_p50_s"])}


def table(doc: dict[str, Any]) -> str:
    s, lines = doc["sections"], [f"failover bench ({doc['plan']['layers']} layers, weights "
                                 f"{doc['plan']['weights_bytes'] / GIB:.1f} GiB, KV {doc['plan']['kv_bytes'] / GIB:.1f} GiB)"]
    g = s.get("grant", {})
    if "p50_s" in g:
        lines.append(f"a. SIGKILL -> grant: p50 {g['p50_s'] * 1e3:.1f} ms, p99 {g['p99_s'] * 1e3:.1f} ms "
                     f"({g['n']} rounds)")
    f = s.get("first_token", {})
    if f.get("standby", {}).get("n"):
        lines.append(f"b. SIGKILL -> first token: standby p50 {f['standby']['p50_s'] * 1e3:.0f} ms "
                     f"(grant p50 {f['grant']['p50_s'] * 1e3:.1f} ms); cold restart p50 {f['cold']['p50_s']:.2f} s")
    for length, c in s.get("prefix", {}).get("contexts", {}).items():
        lines.append(f"c. context {length}: prefill {c['prefill_s'] * 1e3:.0f} ms saved by reusing the KV "
                     f"(a decode step after it: {c['decode_step_s'] * 1e3:.1f} ms)")
    for key, t in doc["targets"].items():
        shown = "n/a" if t["value_s"] is None else f"{t['value_s'] * 1e3:.1f} ms"
        lines.append(f"target {key} <= {t['limit_s'] * 1e3:.0f} ms: {shown} {verdict(t['pass'])}")
    for e in doc["errors"]:
        lines.append(f"error in {e['section']}: {e['error'][:500]}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser_from_doc(__doc__)
    add_daemon_options(p, "start this rmmd")
    p.add_argument("--weights-gib", type=float, default=8.0)
    p.add_argument("--kv-gib", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=4096, help="the active's prefix per sequence (b)")
    p.add_argument("--contexts", default="4096,32768", help="prefill lengths timed (c)")
    p.add_argument("--grant-rounds", type=int, default=30)
    p.add_argument("--token-rounds", type=int, default=3)
    p.add_argument("--sections", default="grant,first_token,prefix")
    p.add_argument("--quick", action="store_true", help="a small model and KV, few rounds")
    p.add_argument("--json", "--out", dest="json", metavar="FILE", help="write the JSON document here too")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    a = p.parse_args(argv)
    if a.quick:
        a.weights_gib, a.kv_gib, a.grant_rounds, a.token_rounds = 1.0, 1.0, 8, 1
    a.contexts = [int(x) for x in a.contexts.split(",") if x]
    a.sections = [x for x in a.sections.split(",") if x]
    check_daemon_options(p, a)
    if a.grant_rounds < 1 or a.token_rounds < 1 or a.batch < 1:
        p.error("rounds and --batch are >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    p = plan(a)
    started = time.monotonic()
    doc: dict[str, Any] = {"schema": SCHEMA, "command": sys.argv, "plan": p, "errors": [], "sections": {},
                           "started_utc": utc_now(),
                           "config": {k: v for k, v in vars(a).items() if k not in ("json",)}}
    if a.dry_run:
        print(json.dumps(doc, indent=1))
        return 0
    daemon = None
    runtime = running_daemon_dir(a)
    if a.start_daemon:
        daemon = start_daemon(a.start_daemon, p["weights_bytes"] + p["kv_bytes"] + 4 * GIB)
        runtime = daemon.runtime
    if not runtime:
        print("failover_bench: give --start-daemon PATH or --runtime-dir DIR", file=sys.stderr)
        return 2
    os.environ["RMMD_RUNTIME_DIR"] = runtime
    env = worker_env(RMMD_RUNTIME_DIR=runtime)
    doc["rmmd_commit"] = rmmd_commit()
    try:
        if "grant" in a.sections:
            run_section(doc, "grant", section_grant, a, env)
        if {"first_token", "prefix"} & set(a.sections):
            delete_buffer(WEIGHTS)  # an earlier run's
            run_section(doc, "publish", lambda: Worker("publish", model_args(p), env).said(900))
        if "first_token" in a.sections:
            run_section(doc, "first_token", section_first_token, a, p, env)
        if "prefix" in a.sections:
            run_section(doc, "prefix", lambda: Worker("prefill", model_args(p), env).said(900))
    finally:
        if {"first_token", "prefix"} & set(a.sections):
            delete_buffer(WEIGHTS)
        if daemon is not None:
            daemon.stop()
    doc["targets"] = targets(doc)
    doc["seconds"] = time.monotonic() - started
    finish_document(doc, a.json, table(doc))
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
