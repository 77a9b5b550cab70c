#!/usr/bin/env python3
"""Sleep and wake, side by side in one run on one GPU: rmmd.memory_saver
against SGLang's torch_memory_saver (0.0.10) in both of its hook modes.

  python bench/python/sleep_bench.py [--kv-gib 60] [--weights-gib 8] [--weights-tensors 1000]
        [--repeats 5] [--handoff-repeats 3] [--pinned-gib 4] [--impls tms-torch,tms-preload,rmmd]
        [--start-daemon PATH_TO_rmmd [--keep-released-memory SECONDS] | --runtime-dir DIR]
        [--taker-user USER] [--json FILE] [--dry-run]

Each implementation runs in a process of its own (this file again, with
--worker: no CUDA state shared) and hands its figures back as JSON:
tms-torch (hook_mode "torch"), tms-preload (hook_mode "preload": that
worker alone starts with LD_PRELOAD naming the package's preload library,
as configure_subprocess() sets it) and rmmd (rmmd.memory_saver: the same
calls). On GPU 0 each makes, under its regions, "kv": --kv-gib tensors of
1 GiB, no backup; "weights": --weights-gib GiB in --weights-tensors uint8
tensors with a CPU backup, random bytes (fixed seed). Then --repeats
cycles of pause("kv"), resume("kv"), pause("weights"), resume("weights"),
each call timed from the call (device idle) to the device idle after it
(the time to its return kept beside). After each weights resume every
tensor's byte sum (int64, on the GPU) is checked against the sums before
the first pause. The weights' GB/s count the bytes PyTorch reserved for
them, the segments that are copied (8 MiB tensors sit two to a 20 MiB
segment: 8 GiB of tensors are about 9.8 GiB of segments).

In the same run: "pinned", --pinned-gib GiB of page-locked host memory
copied to GPU 0 and back, 5 times each way (a process of its own): the
host link that backups (device to host) and restores (host to device) are
measured against. "handoff", after the cycles: a taker process
(sleep_handoff.py), started beforehand (its CUDA context made), is told
the moment pause("kv") returns and allocates the KV's bytes, for rmmd from
the daemon (a session of its own, direct mode), for torch_memory_saver by
torch.empty; the time from pause's return to the allocation served
(CLOCK_MONOTONIC in both), and to the memory written, --handoff-repeats
times (the KV resumed between). It fits only in the freed memory: rmmd's
pool (--start-daemon) has room for it only once the KV sleeps;
torch_memory_saver's taker first fills the device but for min(1 GiB, half
the KV). `fenced` is the taker's same allocation tried once before the
first pause: refused, as it should be.
--taker-user USER runs the taker as USER (runuser; root only): another uid
is another rmmd tenant. Without it, or where USER cannot import torch and
rmmd or reach the daemon (the JSON says why), it is another session.

Targets: rmmd's pause and resume of the KV each at most 1.1x
torch_memory_saver's (medians; against each hook mode that ran); rmmd's
weights pause and resume each at least 80% of the pinned copy's GB/s
(medians); rmmd's handoff (median, fenced) at most 50 ms. A miss is a
result, printed as MISS.

rmmd's side needs a daemon: --runtime-dir DIR (else $RMMD_RUNTIME_DIR), or
--start-daemon PATH (or --rmmd PATH): rmmd started with --cuda-pool-bytes
the KV + 1.25x the weights' segments + min(2 GiB, half the KV),
--host-pool-bytes twice the weights' segments + 1 GiB (the backups),
--fabric off, its open-file limit raised (an fd per stable allocation and
per backup), --keep-released-memory SECONDS (0: the daemon's default; with
more, what pause("kv") gives back stays the daemon's for the uid's next
allocation: a taker of the same uid gets it without the driver's clearing,
one of another uid never), and stopped at the end. Smoke: --kv-gib 2 --weights-gib 1
--weights-tensors 100.

Prints a table, the targets (pass / MISS) and the JSON document as the last
line (also to --json FILE, or --out; schema rmmd-sleep-bench/1: gpu,
config, plan, pinned, impls, targets, errors). Exit status: 0 when every
part ran (a missed target is a result), 1 when a part failed (errors), 2 on
a bad command line or without a GPU. --dry-run prints the plan only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _bench_common import (  # noqa: E402 (beside this file)
    Daemon, add_daemon_options, check_daemon_options, finish_document, parser_from_doc, raise_open_file_limit,
    rmmd_commit, running_daemon_dir, target_line, utc_now, worker_env,
)
from sleep_handoff import Taker, as_user, emit  # noqa: E402 (beside this file)

GIB = 1 << 30
MIB = 1 << 20
SCHEMA = "rmmd-sleep-bench/1"
IMPLS = ("tms-torch", "tms-preload", "rmmd")
CYCLE_KEYS = ("kv_pause", "kv_resume", "weights_pause", "weights_resume")
WORKER_TIMEOUT_S = 1800


# ---- sizes -------------------------------------------------------------------


def weights_tensor_bytes(weights_gib: float, tensors: int) -> int:
    """Each weights tensor's bytes: --weights-gib over the count, 4 KiB-aligned."""
    return max(4096, int(weights_gib * GIB) // tensors // 4096 * 4096)


def segment_bytes(tensor_bytes: int, count: int) -> int:
    """What PyTorch's caching allocator reserves for `count` tensors of
    `tensor_bytes` allocated one after another (its default settings):
    sizes to 1 MiB share 2 MiB segments, sizes under 10 MiB share 20 MiB
    ones, larger ones get a segment of their own rounded to 2 MiB."""
    size = -(-tensor_bytes // 512) * 512
    if size >= 10 * MIB:
        return count * (-(-size // (2 * MIB)) * 2 * MIB)
    segment = 2 * MIB if size <= MIB else 20 * MIB
    per_segment = segment // size
    return -(-count // per_segment) * segment


def make_plan(a: argparse.Namespace) -> dict[str, Any]:
    tensor = weights_tensor_bytes(a.weights_gib, a.weights_tensors)
    segments = segment_bytes(tensor, a.weights_tensors)
    kv = a.kv_gib * GIB
    slack = min(2 * GIB, kv // 2)
    return {
        "kv_bytes": kv,
        "weights_tensor_bytes": tensor,
        "weights_bytes": tensor * a.weights_tensors,
        "weights_segment_bytes_estimate": segments,
        "handoff_bytes": kv,
        # Room for the handoff only once the KV sleeps: free before the
        # pause is about `slack` (< the KV), after it the KV plus that;
        # a quarter more for the weights in case the estimate is short.
        "daemon_cuda_pool_bytes": kv + segments * 5 // 4 + slack,
        "daemon_host_pool_bytes": 2 * segments + GIB,
        "torch_taker_room_bytes": min(GIB, kv // 2),
    }


# ---- the engine: one implementation's pauses and resumes -------------------------


def _saver(impl: str) -> Any:
    if impl == "rmmd":
        from rmmd.memory_saver import torch_memory_saver
    else:
        from torch_memory_saver import torch_memory_saver

        torch_memory_saver.hook_mode = "torch" if impl == "tms-torch" else "preload"
    return torch_memory_saver


def _timed(torch: Any, call: Callable[[], Any]) -> tuple[float, float]:
    """Seconds from the call (the device idle) to its return, and to the
    device idle after it."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    returned = time.perf_counter() - t0
    torch.cuda.synchronize()
    return returned, time.perf_counter() - t0


def engine_memory(saver: Any, torch: Any, a: argparse.Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    """The KV and the weights under their regions, the weights random."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    with saver.region(tag="kv"):
        kv = [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(a.kv_gib)]
    after_kv = torch.cuda.memory_reserved()
    with saver.region(tag="weights", enable_cpu_backup=True):
        weights = [torch.empty(plan["weights_tensor_bytes"], dtype=torch.uint8, device="cuda")
                   for _ in range(a.weights_tensors)]
    after_weights = torch.cuda.memory_reserved()
    generator = torch.Generator(device="cuda").manual_seed(0)
    for w in weights:
        w.random_(generator=generator)
    torch.cuda.synchronize()
    return {"kv": kv, "weights": weights, "kv_reserved": after_kv - before,
            "weights_reserved": after_weights - after_kv}


def weights_sums(torch: Any, weights: list[Any]) -> Any:
    """Every tensor's byte sum, on the GPU, brought back as one small tensor."""
    return torch.stack([w.sum(dtype=torch.int64) for w in weights]).cpu()


def engine_cycles(saver: Any, torch: Any, mem: dict[str, Any], repeats: int, want: Any) -> dict[str, Any]:
    calls = {"kv_pause": lambda: saver.pause("kv"), "kv_resume": lambda: saver.resume("kv"),
             "weights_pause": lambda: saver.pause("weights"), "weights_resume": lambda: saver.resume("weights")}
    to_idle: dict[str, list[float]] = {k: [] for k in CYCLE_KEYS}
    to_return: dict[str, list[float]] = {k: [] for k in CYCLE_KEYS}
    restored = []
    for _ in range(repeats):
        for key in CYCLE_KEYS:
            returned, idle = _timed(torch, calls[key])
            to_return[key].append(returned)
            to_idle[key].append(idle)
        restored.append(bool(torch.equal(weights_sums(torch, mem["weights"]), want)))
    return {"seconds": to_idle, "seconds_to_return": to_return, "weights_restored": restored}


def engine_handoff(saver: Any, torch: Any, impl: str, a: argparse.Namespace,
                   plan: dict[str, Any]) -> dict[str, Any]:
    """Another process allocates the KV's bytes the moment pause("kv")
    returns, --handoff-repeats times."""
    kind = "rmmd" if impl == "rmmd" else "torch"
    taker = Taker(kind, plan["handoff_bytes"], plan["torch_taker_room_bytes"], a.taker_user or None)
    out: dict[str, Any] = {"taker": taker.ready, "bytes": plan["handoff_bytes"]}
    try:
        out["fenced"] = taker.ask("probe")
        served, written = [], []
        for _ in range(a.handoff_repeats):
            torch.cuda.synchronize()
            saver.pause("kv")
            returned = time.monotonic()
            got = taker.ask("go")
            freed = taker.ask("free")
            saver.resume("kv")
            torch.cuda.synchronize()
            if "served" not in got or not freed.get("freed"):
                out["error"] = got.get("error", f"the taker said {got} then {freed}")
                break
            served.append(got["served"] - returned)
            written.append(got["written"] - returned)
        out["served_seconds"] = served
        out["written_seconds"] = written
    finally:
        taker.close()
    return out


def engine_worker(impl: str, a: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.cuda.set_device(0)
    plan = make_plan(a)
    saver = _saver(impl)
    saver.retain_cpu_backup = a.retain_cpu_backup
    mem = engine_memory(saver, torch, a, plan)
    addresses = [t.data_ptr() for t in mem["kv"] + mem["weights"]]
    out: dict[str, Any] = {"impl": impl, "kv_bytes": plan["kv_bytes"], "kv_reserved_bytes": mem["kv_reserved"],
                           "weights_bytes": plan["weights_bytes"], "weights_reserved_bytes": mem["weights_reserved"]}
    want = weights_sums(torch, mem["weights"])
    out.update(engine_cycles(saver, torch, mem, a.repeats, want))
    if a.handoff_repeats > 0:
        try:
            out["handoff"] = engine_handoff(saver, torch, impl, a, plan)
        except Exception as e:  # noqa: BLE001 (the cycles' figures still count)
            out["handoff"] = {"error": f"{type(e).__name__}: {e}"}
    # Once more after the handoffs (the KV paused and resumed beside the weights).
    out["weights_restored"].append(bool(torch.equal(weights_sums(torch, mem["weights"]), want)))
    out["addresses_kept"] = addresses == [t.data_ptr() for t in mem["kv"] + mem["weights"]]
    return out


def pinned_worker(a: argparse.Namespace) -> dict[str, Any]:
    """The host link both ways, and the GPU's identity."""
    import torch

    if not torch.cuda.is_available():
        return {"no_gpu": "torch.cuda.is_available() is False"}
    torch.cuda.set_device(0)
    props = torch.cuda.get_device_properties(0)
    n = int(a.pinned_gib * GIB)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d, d2h = [], []
    for _ in range(5):
        h2d.append(_timed(torch, lambda: dev.copy_(host))[1])
        d2h.append(_timed(torch, lambda: host.copy_(dev))[1])
    return {
        "gpu": {"name": props.name, "uuid": str(getattr(props, "uuid", "")), "memory_bytes": props.total_memory,
                "torch": torch.__version__, "cuda": torch.version.cuda,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
        "bytes": n, "h2d_seconds": h2d, "d2h_seconds": d2h,
        "h2d_gb_s": n / statistics.median(h2d) / 1e9, "d2h_gb_s": n / statistics.median(d2h) / 1e9,
        "h2d_best_gb_s": n / min(h2d) / 1e9, "d2h_best_gb_s": n / min(d2h) / 1e9,
    }


# ---- the daemon ----------------------------------------------------------------------


def start_daemon(rmmd_path: str, plan: dict[str, Any], allow_uids: list[int], keep_released: float = 0) -> Daemon:
    """rmmd with the plan's pools on GPU 0 and the host, --fabric off, its
    open-file limit raised; with `allow_uids`, only they may use it, and
    its sockets are reachable by them; `keep_released`: its
    --keep-released-memory."""
    args = ["--backend", "cuda", "--fabric", "off", "--cuda-pool-bytes", str(plan["daemon_cuda_pool_bytes"]),
            "--host-pool-bytes", str(plan["daemon_host_pool_bytes"]), "--drain-timeout-ms", "0",
            "--keep-released-memory", str(keep_released)]
    for uid in allow_uids:
        args += ["--allow-uid", str(uid)]
    daemon = Daemon(rmmd_path, args, "rmmd-sleep-bench-", preexec_fn=raise_open_file_limit)
    if allow_uids:
        open_to_every_uid(daemon.runtime)
    return daemon


def open_to_every_uid(runtime: str) -> None:
    """Lets another uid reach the sockets (the daemon decides who may use them)."""
    os.chmod(runtime, 0o755)
    for name in ("rmmd-session.sock", "rmmd.sock"):
        try:
            os.chmod(os.path.join(runtime, name), 0o666)
        except OSError:
            pass


# ---- the driver ----------------------------------------------------------------------


def run_worker(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    try:
        out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True,
                             timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"the worker {' '.join(args[:2])} passed {WORKER_TIMEOUT_S} s"}
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": f"exit {out.returncode}: {out.stderr[-3000:]}"}
    return json.loads(lines[-1])


def python_says(code: str, env: dict[str, str], user: str | None = None) -> tuple[bool, str]:
    """Whether `python -c code` exits 0 (as `user`), and its last line (or error)."""
    try:
        out = subprocess.run(as_user(user, [sys.executable, "-c", code], env), env=env, capture_output=True,
                             text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    text = (out.stdout if out.returncode == 0 else out.stderr).strip().splitlines()
    return out.returncode == 0, text[-1] if text else f"exit {out.returncode}"


def preload_library(env: dict[str, str]) -> tuple[str | None, str]:
    ok, said = python_says("from torch_memory_saver.utils import get_binary_path_from_package as g\n"
                           "print(g('torch_memory_saver_hook_mode_preload'))", env)
    return (said, "") if ok else (None, said)


def user_uid(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def check_taker_user(user: str, env: dict[str, str]) -> str:
    """Empty when `user` can run a taker here (PyTorch, rmmd's package and
    library, this file); else why not."""
    if os.geteuid() != 0:
        return f"--taker-user {user} needs root (this process runs as uid {os.getuid()})"
    if user_uid(user) is None:
        return f"there is no user {user} (useradd --system --no-create-home {user})"
    code = f"import torch, rmmd; rmmd._lib.load(); open({str(HERE / 'sleep_handoff.py')!r}).close(); print('ok')"
    ok, said = python_says(code, env, user)
    return "" if ok else f"as {user}: {said} (the checkout and librmmd_c.so must be readable by {user})"


def check_taker_session(user: str, env: dict[str, str]) -> str:
    """Empty when `user` may open a session with the daemon of `env`."""
    ok, said = python_says("import rmmd; rmmd.Session(client_name='sleep-bench-probe').close(); print('ok')",
                           env, user)
    return "" if ok else f"as {user}: {said} (the daemon must admit {user} and its sockets be reachable)"


def targets(impls: dict[str, Any], pinned: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ours = impls.get("rmmd", {})
    med = lambda r, k: statistics.median(r["seconds"][k])  # noqa: E731
    if "seconds" not in ours:
        return out
    for ref in ("tms-torch", "tms-preload"):
        theirs = impls.get(ref, {})
        if "seconds" not in theirs:
            continue
        for key in ("kv_pause", "kv_resume"):
            ratio = med(ours, key) / med(theirs, key)
            out.append({"name": f"{key}_vs_{ref}", "what": f"{key}: rmmd / torch_memory_saver ({ref}), medians",
                        "value": ratio, "limit": 1.1, "pass": ratio <= 1.1})
    if "h2d_gb_s" in pinned:
        for key, link in (("weights_pause", "d2h_gb_s"), ("weights_resume", "h2d_gb_s")):
            share = copied_bytes(ours) / med(ours, key) / 1e9 / pinned[link]
            out.append({"name": f"{key}_share_of_pinned", "value": share, "limit": 0.8, "pass": share >= 0.8,
                        "what": f"{key}: rmmd's GB/s / the pinned copy's ({link[:3]})"})
    handoff = ours.get("handoff", {})
    if handoff.get("served_seconds"):
        ms = statistics.median(handoff["served_seconds"]) * 1e3
        fenced = bool(handoff.get("fenced", {}).get("refused"))
        out.append({"name": "handoff_ms", "value": ms, "limit": 50.0, "pass": ms <= 50.0 and fenced,
                    "what": "handoff: pause's return to the taker's allocation served (ms, median)"
                    + ("" if fenced else "; NOT fenced: the taker's allocation fitted before the pause")})
    return out


def copied_bytes(r: dict[str, Any]) -> int:
    """The weights' reserved bytes (what is copied), else their tensor bytes."""
    return max(r.get("weights_reserved_bytes", 0), r["weights_bytes"])


def table(doc: dict[str, Any]) -> str:
    pinned = doc["pinned"]
    lines = [f"GPU: {doc['gpu'].get('name', '?')} {doc['gpu'].get('uuid', '')}",
             f"pinned {pinned.get('bytes', 0) / GIB:.0f} GiB: {pinned.get('h2d_gb_s', 0):.1f} GB/s to the GPU, "
             f"{pinned.get('d2h_gb_s', 0):.1f} GB/s back (medians of 5)"]
    lines.append(f"{'impl':12} {'kv pause':>10} {'kv resume':>10} {'w pause':>10} {'w resume':>10} "
                 f"{'backup GB/s':>12} {'restore GB/s':>12} {'handoff ms':>11} restored  addresses")
    for impl, r in doc["impls"].items():
        if "seconds" not in r:
            lines.append(f"{impl:12} {r.get('skipped') or r.get('error', '?')}"[:2000])
            continue
        ms = {k: statistics.median(v) * 1e3 for k, v in r["seconds"].items()}
        gbs = {k: copied_bytes(r) / ms[k] / 1e6 for k in ("weights_pause", "weights_resume")}
        pct = {k: f"({100 * gbs[k] / pinned[link]:3.0f}%)" if pinned.get(link) else ""
               for k, link in (("weights_pause", "d2h_gb_s"), ("weights_resume", "h2d_gb_s"))}
        h = r.get("handoff", {})
        fence = " " if h.get("fenced", {}).get("refused") else "!"
        handoff = (f"{statistics.median(h['served_seconds']) * 1e3:10.1f}{fence}" if h.get("served_seconds")
                   else f"{'error' if 'error' in h else '-':>11}")
        lines.append(f"{impl:12} {ms['kv_pause']:10.1f} {ms['kv_resume']:10.1f} {ms['weights_pause']:10.1f} "
                     f"{ms['weights_resume']:10.1f} {gbs['weights_pause']:6.1f}{pct['weights_pause']:>6} "
                     f"{gbs['weights_resume']:6.1f}{pct['weights_resume']:>6} {handoff} "
                     f"{str(all(r['weights_restored'])):9} {r['addresses_kept']}")
        if "error" in h:
            lines.append(f"{'':12} handoff: {h['error']}"[:2000])
    lines.append("(ms: medians, call to device idle; GB/s: the weights' reserved bytes, % of the pinned copy;\n"
                 " handoff !: not fenced, the taker's allocation fitted before the pause too)")
    for t in doc["targets"]:
        lines.append(target_line(t, f"{t['value']:.3f}", f"limit {t['limit']}"))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser_from_doc(__doc__)
    p.add_argument("--kv-gib", type=int, default=60, help="KV: this many 1 GiB tensors, no backup (60)")
    p.add_argument("--weights-gib", type=float, default=8.0, help="weights: GiB with a CPU backup (8)")
    p.add_argument("--weights-tensors", type=int, default=1000, help="weights: in this many tensors (1000)")
    p.add_argument("--repeats", type=int, default=5, help="pause/resume cycles of each (5)")
    p.add_argument("--handoff-repeats", type=int, default=3, help="handoffs per implementation (3; 0: none)")
    p.add_argument("--pinned-gib", type=float, default=4.0, help="the pinned copy's size (4)")
    p.add_argument("--retain-cpu-backup", action="store_true",
                   help="every implementation keeps its CPU backups past resume (retain_cpu_backup = True): "
                        "the cycles after the first copy into the backups kept")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, of {','.join(IMPLS)}")
    add_daemon_options(p, "start this rmmd for rmmd's side, and stop it at the end")
    p.add_argument("--keep-released-memory", type=float, default=0.0, metavar="SECONDS",
                   help="the started rmmd's --keep-released-memory (0: memory a sleep gives back goes to the "
                        "driver at once)")
    p.add_argument("--taker-user", default="", help="run the handoff's taker as this user (root only)")
    p.add_argument("--json", "--out", dest="json", metavar="FILE", help="write the JSON document here too")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.impls = ["tms-torch" if x == "tms" else x for x in a.impls.split(",") if x]
    bad = [x for x in a.impls if x not in IMPLS]
    if bad or a.kv_gib < 1 or a.weights_tensors < 1 or a.weights_gib <= 0 or a.repeats < 1 or a.pinned_gib <= 0:
        p.error(f"sizes must be positive and --impls of {','.join(IMPLS)} (got {bad or a.impls})")
    check_daemon_options(p, a)
    return a


def worker_main(a: argparse.Namespace) -> int:
    if a.worker == "pinned":
        emit(pinned_worker(a))
    elif a.worker in IMPLS:
        emit(engine_worker(a.worker, a))
    else:
        print(f"sleep_bench: no worker {a.worker!r}", file=sys.stderr)
        return 2
    # Out without tearing down: torch_memory_saver's hook mode "torch"
    # aborts when its MemPools free their memory outside a region (at
    # exit), which has nothing to do with what was measured.
    sys.stderr.flush()
    os._exit(0)


def sizes_args(a: argparse.Namespace, taker_user: str) -> list[str]:
    return ["--kv-gib", str(a.kv_gib), "--weights-gib", str(a.weights_gib), "--weights-tensors",
            str(a.weights_tensors), "--repeats", str(a.repeats), "--handoff-repeats", str(a.handoff_repeats),
            "--taker-user", taker_user] + (["--retain-cpu-backup"] if a.retain_cpu_backup else [])


def run_tms(impl: str, a: argparse.Namespace, base: dict[str, str]) -> dict[str, Any]:
    ok, said = python_says("import torch_memory_saver", base)
    if not ok:
        return {"skipped": f"torch_memory_saver does not import: {said}"}
    env = dict(base)
    if impl == "tms-preload":
        library, why = preload_library(base)
        if library is None:
            return {"skipped": f"no preload library: {why}"}
        env["LD_PRELOAD"] = ":".join([library] + ([base["LD_PRELOAD"]] if base.get("LD_PRELOAD") else []))
    return run_worker(["--worker", impl, *sizes_args(a, a.taker_user)], env)


def run_rmmd(a: argparse.Namespace, plan: dict[str, Any], base: dict[str, str], doc: dict[str, Any]) -> dict[str, Any]:
    runtime = running_daemon_dir(a)
    if runtime is None and not a.start_daemon:
        return {"error": "rmmd's side needs --start-daemon PATH or --runtime-dir DIR (or $RMMD_RUNTIME_DIR)"}
    daemon = None
    if runtime is None:
        taker_uid = user_uid(a.taker_user) if a.taker_user else None
        # Naming uids replaces the daemon's default policy: this process's too.
        allow = sorted({0, os.getuid(), taker_uid}) if taker_uid is not None else []
        daemon = start_daemon(a.start_daemon, plan, allow, a.keep_released_memory)
        runtime = daemon.runtime
        doc["daemon"] = {"started": a.start_daemon, "cuda_pool_bytes": plan["daemon_cuda_pool_bytes"],
                         "host_pool_bytes": plan["daemon_host_pool_bytes"], "allow_uids": allow,
                         "keep_released_memory_s": a.keep_released_memory}
    else:
        doc["daemon"] = {"runtime_dir": runtime}
    env = dict(base, RMMD_RUNTIME_DIR=runtime)
    try:
        taker_user = a.taker_user
        if taker_user:
            why = check_taker_session(taker_user, env)
            if why:
                doc["config"]["taker"]["rmmd_why_not"] = why
                taker_user = ""
        return run_worker(["--worker", "rmmd", *sizes_args(a, taker_user)], env)
    finally:
        if daemon is not None:
            doc["daemon"]["log_tail"] = daemon.stop()


def gpu_identity(pinned: dict[str, Any]) -> dict[str, Any]:
    """torch's view of GPU 0, with nvidia-smi's driver for the same UUID."""
    gpu = dict(pinned.get("gpu", {}))
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,driver_version,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return gpu
    digits = lambda u: "".join(c for c in u.lower().removeprefix("gpu-") if c in "0123456789abcdef")  # noqa: E731
    for row in out.strip().splitlines():
        uuid, driver, name = ([x.strip() for x in row.split(",", 2)] + ["", ""])[:3]
        if gpu.get("uuid") and digits(gpu["uuid"]) == digits(uuid):
            gpu.update({"uuid": uuid, "driver": driver, "smi_name": name})
    return gpu


def versions() -> dict[str, Any]:
    from importlib import metadata

    out: dict[str, Any] = {}
    try:
        out["torch_memory_saver"] = metadata.version("torch_memory_saver")
    except metadata.PackageNotFoundError:
        out["torch_memory_saver"] = None
    out["rmmd_commit"] = rmmd_commit()
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker_main(a)
    plan = make_plan(a)
    started = time.monotonic()
    doc: dict[str, Any] = {
        "schema": SCHEMA, "command": sys.argv, "started_utc": utc_now(),
        "config": {"kv_gib": a.kv_gib, "weights_gib": a.weights_gib, "weights_tensors": a.weights_tensors,
                   "repeats": a.repeats, "handoff_repeats": a.handoff_repeats, "pinned_gib": a.pinned_gib,
                   "impls": a.impls, "taker": {"user": a.taker_user or None},
                   "retain_cpu_backup": a.retain_cpu_backup},
        "plan": plan, "versions": versions(), "errors": [],
    }
    if a.dry_run:
        print(json.dumps(doc, indent=1))
        return 0
    base = worker_env()
    if a.taker_user:
        why = check_taker_user(a.taker_user, base)
        doc["config"]["taker"] = {"user": None if why else a.taker_user, "uid": user_uid(a.taker_user),
                                  "why_not": why or None}
        a.taker_user = "" if why else a.taker_user
    pinned = run_worker(["--worker", "pinned", "--pinned-gib", str(a.pinned_gib)], base)
    if "no_gpu" in pinned or "error" in pinned:
        print(f"sleep_bench: the pinned copy on GPU 0 failed: {pinned.get('no_gpu') or pinned.get('error')}",
              file=sys.stderr)
        return 2
    doc["gpu"], doc["pinned"] = gpu_identity(pinned), {k: v for k, v in pinned.items() if k != "gpu"}
    doc["impls"] = {}
    for impl in a.impls:
        try:
            r = run_tms(impl, a, base) if impl != "rmmd" else run_rmmd(a, plan, base, doc)
        except Exception as e:  # noqa: BLE001 (one part failing leaves the others' figures)
            r = {"error": f"{type(e).__name__}: {e}"}
        doc["impls"][impl] = r
        if "error" in r or "error" in r.get("handoff", {}):
            doc["errors"].append({"impl": impl, "error": r.get("error") or r["handoff"]["error"]})
        if "seconds" in r and not (all(r["weights_restored"]) and r["addresses_kept"]):
            doc["errors"].append({"impl": impl, "error": "weights not restored bitwise or addresses moved"})
        print(f"{impl}: {'ran' if 'seconds' in r else r.get('skipped') or 'failed'}", file=sys.stderr, flush=True)
    doc["targets"] = targets(doc["impls"], doc["pinned"])
    doc["seconds"] = time.monotonic() - started
    finish_document(doc, a.json, table(doc))
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
