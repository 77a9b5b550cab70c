#!/usr/bin/env python3
"""rmmd_chaos: a month of a busy node in an hour. One seeded, time-bounded
chaos run over many features at once, against the real rmmd under a service
manager that keeps its fd store.

    rmmd_chaos.py --seed S --minutes M [--rounds N] [--json FILE] [--bin-dir DIR]

Each round runs --events-per-round events, each kind drawn by one seeded
generator (random.Random(S)): worker clients of two uids (rmmd-test-a/-b,
chaos_worker.py: host or pinned allocations, buffers) started, stopped and
SIGKILLed; churn clients (the kill -9 soak's rmmd_soak_client: host, and on
a GPU pinned, direct, packed and slab; on a GPU also PyTorch through an rmmd
MemPool and as the whole-process allocator, and CuPy, with
--framework-python: chaos_framework_client.py) some SIGKILLed; buffers created
(persistent or not, shared with group rmmd or private), published, opened
read-only and read-write, by labels, listed by labels, closed, deleted;
write-lease handovers (an exclusive holder SIGKILLed or closing while
another waits); reclaim pressure (one uid's idle slabs wanted by the other);
a snoop of the other uid's marker; the outsider refused; rmmd SIGKILLed,
SIGTERMed, SIGHUPed with a change that applies and with one that needs a
restart; on a GPU, sleep with a named backup, SIGKILL asleep, restore.

After every event: every persistent buffer, opened read-only, word by word.
After every round: the ledger (rmmctl stats --json) equals what the clients
hold (each worker's bytes = its session's; in_use = sessions + shared
buffers; the tenants' rows sum to the pool); every persistent buffer listed
with its size; no /dev/shm/cuda.shm*; each worker that was alive across a
restart made progress after it (a ping that allocated, with its reconnect
count up); then every client stops and the daemon's fds (less one per buffer
it keeps), threads and VmRSS are compared with the highest of the first
--warmup-rounds quiet points (3), and on a GPU the driver's used memory less the daemons' ledgers
(their contexts alone, then) with the first quiet round's, within
--driver-slack-mib. At the end: every buffer deleted, every pool at 0, the fd store
empty, rmmd exits 0 on SIGTERM.

With --peering (the default where the openssl command exists; it says
why not otherwise) a second daemon, node B, under a service manager of its
own, peers with this one (node A) over mutual TLS, and the events add a
client of B opening A's buffers as nodeA:NAME, either daemon SIGKILLed or
SIGTERMed during it, and either node's certificate rotated (SIGHUP);
after every round the holds of B on A agree on both sides with what B's
clients hold, and at the end B's pools are at 0 and B exits 0
(chaos_peering.py says what exactly).

Every event line on stderr names the seed, round and event index, so a
failure repeats from `--seed S --rounds R+1`, timing aside. One summary line
on stdout; --json writes the same as JSON. Exit status 0: no failure; 1:
failures; 2: the soak could not run. Runs as root (CI, the GPU host) to use
three uids; as another user, every client is that user and the uid checks
are left out, saying so.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "python"))  # the rmmd package, for the checks and the workers' pattern
from chaos_events import Chaos  # noqa: E402
from chaos_node import ChaosError, Daemon, ensure_users  # noqa: E402
from chaos_peering import PeerSetup, why_no_peering  # noqa: E402


BUILD_DIR = ROOT / "build"


def find(name: str, subdirs: list[str], bin_dir: str | None) -> Path:
    """`name` in --bin-dir, $RMMD_BIN_DIR, or the build tree (--build-dir)."""
    for d in [bin_dir, os.environ.get("RMMD_BIN_DIR")]:
        if d and (Path(d) / name).exists():
            return Path(d) / name
    for sub in subdirs:
        p = BUILD_DIR / sub / name
        if p.exists():
            return p
    raise ChaosError(f"no {name}: give --bin-dir or RMMD_BIN_DIR, or build it")


def unreachable(programs: list[Path], files: list[Path]) -> str:
    """'' when the test users can run `programs` and read `files`; else why
    not (a build tree under a private home directory, as the C++ tests say)."""
    from chaos_node import CLIENT_USERS, DAEMON_USER, spawn_kwargs
    test = [f"-x {p}" for p in programs] + [f"-r {f}" for f in files]
    for user in (DAEMON_USER, *CLIENT_USERS):
        for t in test:
            if subprocess.run(["/usr/bin/test", *t.split(" ", 1)], **spawn_kwargs(user)).returncode:
                return f"user {user} cannot reach {t.split(' ', 1)[1]} (make the tree a+rX or use a bundle)"
    return ""


def cuda_runtime() -> Any:
    """CUDA's runtime library (ctypes), or None where there is none."""
    import ctypes
    for lib in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            return ctypes.CDLL(lib)
        except OSError:
            continue
    return None


def gpu_count() -> int:
    """The GPUs CUDA sees (0 without a runtime or a device)."""
    try:
        import ctypes
        cudart = cuda_runtime()
        n = ctypes.c_int(0)
        return n.value if cudart is not None and cudart.cudaGetDeviceCount(ctypes.byref(n)) == 0 else 0
    except Exception:
        return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="0: a random one (printed)")
    p.add_argument("--minutes", type=float, default=1.0, help="stop starting rounds after this")
    p.add_argument("--rounds", type=int, default=0, help="at most this many rounds (0: no cap)")
    p.add_argument("--events-per-round", type=int, default=24)
    p.add_argument("--json", help="write the summary as JSON here")
    p.add_argument("--bin-dir", help="rmmd, rmmctl, librmmd_c.so and the test clients (else the build tree)")
    p.add_argument("--build-dir", default=str(ROOT / "build"), help="a build tree (default: build/)")
    p.add_argument("--rmmd", help="the daemon (e.g. build-tsan/daemon/rmmd)")
    p.add_argument("--library", help="librmmd_c.so for the workers")
    p.add_argument("--python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable,
                   help="the workers' Python (3.9 or later; the client users must be able to run it)")
    p.add_argument("--framework-python", default="",
                   help="the Python of the PyTorch and CuPy clients (GPU only; default: --python); a "
                        "framework it cannot import is left out, saying so")
    p.add_argument("--driver-slack-mib", type=int, default=256,
                   help="how far the driver's used memory less the daemons' ledgers may move from its "
                        "first quiet point's level (contexts come and go in steps of about 500 MiB)")
    p.add_argument("--backend", choices=["auto", "host", "cuda"], default="auto")
    p.add_argument("--pool-mib", type=int, default=96, help="the host pool")
    p.add_argument("--rss-slack-kib", type=int, default=4096)
    p.add_argument("--warmup-rounds", type=int, default=3,
                   help="the daemon's level (fds, threads, RSS) is the highest of these first quiet points")
    p.add_argument("--thread-slack", type=int, default=4)
    p.add_argument("--fd-slack", type=int, default=2,
                   help="fds besides memfds above the level (gRPC's pollers come and go)")
    p.add_argument("--daemon-env", action="append", default=[], metavar="K=V",
                   help="set for rmmd only (e.g. LD_LIBRARY_PATH of a sanitized build's libraries)")
    p.add_argument("--peering", action=argparse.BooleanOptionalAction, default=None,
                   help="a second daemon (node B) peered with this one over mutual TLS, and its events "
                        "(default: on where the openssl command exists)")
    p.add_argument("--keep", action="store_true", help="keep the daemon's directory and logs")
    p.add_argument("--tsan-log-dir", help="a TSan daemon's log_path directory: any report there fails the run")
    return p.parse_args()


def frameworks(python: str, gpus: int) -> tuple[list[str], str]:
    """The framework clients `python` can run (chaos_framework_client.py's
    modes), and why the others are left out."""
    if not gpus:
        return [], "no GPU"
    modes: list[str] = []
    why: list[str] = []
    for module, names in (("torch", ["torch-pool", "torch-process"]), ("cupy", ["cupy"])):
        out = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
        if out.returncode == 0:
            modes += names
        else:
            why.append(f"{python} cannot import {module}")
    return modes, "; ".join(why)


def summary_line(s: dict[str, Any]) -> str:
    events = " ".join(f"{k}={v}" for k, v in sorted(s["events"].items()))
    fails = "; ".join(f"[seed {f['seed']} round {f['round']} event {f['event']}] {f['what']}"
                      for f in s["failures"][:5])
    return (f"rmmd_chaos: {s['result']} seed={s['seed']} rounds={s['rounds']} minutes={s['minutes']:.1f} "
            f"gpus={s['gpus']} uids={s['uids']} peering={s['peering'].split(':')[0]} events[{sum(s['events'].values())}]: {events} "
            + (f"remote_reads={s['remote_reads']} " if s["gpus"] and s["peering"] == "on" else "")
            + f"checks={s['checks']} failures={len(s['failures'])}" + (f": {fails}" if fails else ""))


def main() -> int:
    global BUILD_DIR
    a = parse()
    BUILD_DIR = Path(a.build_dir)
    seed = a.seed or random.SystemRandom().randrange(1, 1 << 31)
    start = time.monotonic()
    why_one_uid = ensure_users()
    gpus = gpu_count() if a.backend != "host" else 0
    backend = "cuda" if gpus and a.backend != "host" else "host"
    rmmd = Path(a.rmmd) if a.rmmd else find("rmmd", ["daemon"], a.bin_dir)
    rmmctl = find("rmmctl", ["rmmctl"], a.bin_dir)
    library = Path(a.library) if a.library else find("librmmd_c.so", ["client"], a.bin_dir)
    tools = {n: find(n, ["tests"], a.bin_dir) for n in ("rmmd_soak_client", "rmmd_test_client")}
    if gpus:
        tools["rmmd_stable_client"] = find("rmmd_stable_client", ["tests"], a.bin_dir)
        # This process's own CUDA context, before the driver-memory baseline:
        # it reads persistent host buffers, and opening a pinnable pool's
        # buffer page-locks it, which makes a context (docs/sharing.md).
        cuda_runtime().cudaFree(None)
    a.framework_python = a.framework_python or a.python
    a.frameworks, a.frameworks_left_out = frameworks(a.framework_python, gpus)
    if not why_one_uid:
        why_one_uid = unreachable([rmmd, rmmctl, library, *tools.values(), Path(a.python)]
                                  + ([Path(a.framework_python)] if a.frameworks else []),
                                  [HERE / "chaos_worker.py", HERE / "chaos_framework_client.py",
                                   ROOT / "python" / "rmmd" / "__init__.py"])
    env = {"RMMD_LIBRARY": str(library),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])}
    print(f"rmmd_chaos: seed {seed}, {a.minutes} min, backend {backend}, {gpus} GPU(s), daemon {rmmd}"
          + (f"; one uid only: {why_one_uid}" if why_one_uid else ""), file=sys.stderr, flush=True)
    daemon_env = dict(kv.split("=", 1) for kv in a.daemon_env)
    daemon_user = None if why_one_uid else "rmmd"
    why_no_peer = why_no_peering() if a.peering is not False else "--no-peering"
    if a.peering and why_no_peer:
        print(f"rmmd_chaos: --peering: {why_no_peer}", file=sys.stderr)
        return 2
    setup = PeerSetup(daemon_user) if not why_no_peer else None
    print(f"rmmd_chaos: peering {'on: node B peers with node A over mutual TLS' if setup else 'off: ' + why_no_peer}",
          file=sys.stderr, flush=True)
    daemon = Daemon(rmmd, rmmctl, backend, a.pool_mib << 20, daemon_env, daemon_user,
                    peering=setup.block_a if setup else "", name="nodeA" if setup else "rmmd")
    node_b = None
    if setup:
        node_b = Daemon(rmmd, rmmctl, backend, a.pool_mib << 20, daemon_env, daemon_user,
                        peering=setup.block_b, name="nodeB")
    chaos = Chaos(random.Random(seed), seed, daemon, a, tools, env, gpus, multi_uid=not why_one_uid,
                  peering=(setup, node_b) if setup else None)
    chaos.peering_off = why_no_peer
    rounds = 0
    status = "pass"
    try:
        while (a.rounds == 0 or rounds < a.rounds) and time.monotonic() - start < a.minutes * 60:
            chaos.round(rounds)
            rounds += 1
        chaos.finish()
    except (ChaosError, OSError, ValueError, KeyError) as e:
        chaos.fail(f"the soak stopped: {e}\n{traceback.format_exc()}\nrmmd log:\n{daemon.log_tail()}")
        status = "error"
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        chaos.cleanup()
        failed_early = status != "pass"
        keep = a.keep or failed_early or bool(chaos.failures)
        daemon.close(keep=keep)
        if node_b is not None:
            node_b.close(keep=keep)
            setup.certs.close(keep=keep)  # type: ignore[union-attr]
    if a.tsan_log_dir:
        reports = [p for p in glob.glob(os.path.join(a.tsan_log_dir, "*")) if os.path.getsize(p) > 0]
        chaos.checks["tsan_reports"] += 1
        if reports:
            chaos.fail(f"ThreadSanitizer reports: {reports}")
    s = {"result": "pass" if status == "pass" and not chaos.failures else "fail",
         "status": status, "seed": seed, "rounds": rounds, "minutes": (time.monotonic() - start) / 60,
         "backend": backend, "gpus": gpus, "uids": 2 if not why_one_uid else 1,
         "events": dict(sorted(chaos.events.items())), "checks": sum(chaos.checks.values()),
         "check_kinds": dict(sorted(chaos.checks.items())), "failures": chaos.failures,
         "peering": "on" if setup else f"off: {why_no_peer}",
         "daemon_starts": daemon.starts, "node_b_starts": node_b.starts if node_b else 0, "daemon_dir": str(daemon.base) if daemon.base.exists() else "",
         "remote_reads": chaos.peer.fabric_reads if chaos.peer else 0,
         "left_out": chaos.left_out(why_one_uid)}
    print(summary_line(s), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(s, indent=1) + "\n")
    return 0 if s["result"] == "pass" else (2 if status == "error" and not rounds else 1)


if __name__ == "__main__":
    sys.exit(main())
