#!/usr/bin/env python3
"""Sleep and wake, side by side: rmmd.memory_saver against SGLang's
torch_memory_saver (0.0.10, hook mode "torch") on the same GPU and sizes,
in one run (issue 36's bench section).

  python bench/python/sleep_bench.py [--kv-gib 60] [--weights-gib 8] [--weights-tensors 1000]
        [--repeats 5] [--impls tms,rmmd] [--rmmd PATH | --runtime-dir DIR] [--out FILE.json]

Each implementation runs in a fresh process (python this-file --worker
IMPL), on GPU 0, which makes, under its ``region``s:

  kv       --kv-gib tensors of 1 GiB, no backup (a KV cache)
  weights  --weights-gib GiB in --weights-tensors tensors, with a CPU
           backup, each filled with its own byte

and times, --repeats times each: ``pause("kv")`` and ``resume("kv")``;
``pause("weights")`` (the copy to host included) and ``resume("weights")``
(the copy back included), every weight checked after each resume (a sum on
the GPU against the one before). Each call is timed to its return, after
which the device is synchronized (outside the timed span: both return with
the work done). Addresses are checked to stay.

Beside it, in the same run:

  pinned   cudaMemcpy of a 4 GiB page-locked host tensor to the GPU and
           back: the host link's bandwidth, against which a backup's copy
           is measured
  handoff  (rmmd) another process, its CUDA context made and its session
           opened, is told the moment ``pause("kv")`` returns and allocates
           --handoff-gib GiB from the daemon's pool (direct), which has room
           for it only once the pause gave the KV back; the time from
           pause's return to its allocation served. (torch_memory_saver's
           memory goes back to the driver, with no bound a tenant could
           be held to: there is nothing to compare.)

rmmd's side needs a daemon with a CUDA pool for both sets and the
handoff's allocation, and a host pool that holds the weights' backup:
--rmmd PATH starts one (--cuda-pool-bytes --kv-gib + --weights-gib + 4 GiB,
--host-pool-bytes --weights-gib + 1 GiB, its open-file limit raised for the
backups' and allocations' fds) and stops it at the end; --runtime-dir uses
a running one.

Targets (issue 36): rmmd's pause and resume without backup each at most
1.1x torch_memory_saver's (medians); its backup and restore each at least
80% of the pinned bandwidth; the handoff at most 50 ms. A miss is a result,
printed as MISS. JSON (--out, and the last line printed): the GPU, sizes,
every figure, the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GIB = 1 << 30

# ---- the workers (each in a process of its own) ------------------------------


def _saver(impl: str) -> Any:
    if impl == "rmmd":
        from rmmd.memory_saver import torch_memory_saver
    else:
        from torch_memory_saver import torch_memory_saver

        torch_memory_saver.hook_mode = "torch"
    return torch_memory_saver


def _timed(fn: Any, torch: Any) -> float:
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    torch.cuda.synchronize()
    return seconds


def _handoff_taker(impl: str, nbytes: int) -> subprocess.Popen[str]:
    """A process with its CUDA context (and, for rmmd, its session) made,
    waiting for a line on stdin; it then allocates `nbytes` and prints the
    CLOCK_MONOTONIC time its allocation was served."""
    proc = subprocess.Popen([sys.executable, __file__, "--worker", f"taker-{impl}", "--handoff-bytes", str(nbytes)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the handoff taker ({impl}) did not start")
    return proc


def taker_worker(impl: str, nbytes: int) -> None:
    import torch

    torch.cuda.set_device(0)
    torch.empty(1, device="cuda")  # its context, before the clock starts
    if impl == "rmmd":
        import rmmd

        mr = rmmd.Session(client_name="sleep-bench-taker").device_resource(0, mode="direct")
        allocate = lambda: mr.allocate(nbytes)  # noqa: E731
    else:
        allocate = lambda: torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # noqa: E731
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        held = allocate()
        served = time.monotonic()
        print(json.dumps({"served": served}), flush=True)
    except Exception as e:  # the engine's pause gave back too little: a result
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        held = None
    sys.stdin.readline()
    del held


def engine_worker(impl: str, a: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.cuda.set_device(0)
    saver = _saver(impl)
    out: dict[str, Any] = {"impl": impl}
    with saver.region(tag="kv"):
        kv = [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(a.kv_gib)]
    per = (int(a.weights_gib * GIB) // a.weights_tensors) // 4096 * 4096
    with saver.region(tag="weights", enable_cpu_backup=True):
        weights = [torch.empty(per, dtype=torch.uint8, device="cuda") for _ in range(a.weights_tensors)]
    for i, w in enumerate(weights):
        w.fill_(1 + i % 251)
    torch.cuda.synchronize()

    def weights_sum() -> int:
        return int(sum(w.view(torch.int32).sum(dtype=torch.int64) for w in weights).item())

    want = weights_sum()
    addresses = [t.data_ptr() for t in kv + weights]
    out["kv_bytes"] = a.kv_gib * GIB
    out["weights_bytes"] = per * a.weights_tensors
    runs: dict[str, list[float]] = {"kv_pause": [], "kv_resume": [], "weights_pause": [], "weights_resume": []}
    checks = []
    for _ in range(a.repeats):
        runs["kv_pause"].append(_timed(lambda: saver.pause("kv"), torch))
        runs["kv_resume"].append(_timed(lambda: saver.resume("kv"), torch))
        runs["weights_pause"].append(_timed(lambda: saver.pause("weights"), torch))
        runs["weights_resume"].append(_timed(lambda: saver.resume("weights"), torch))
        checks.append(weights_sum() == want)
    out["runs"] = runs
    out["weights_restored"] = all(checks)
    out["addresses_kept"] = addresses == [t.data_ptr() for t in kv + weights]

    if impl != "rmmd":  # the driver's memory has no owner to hand it over: nothing to time
        return out
    # The handoff: another process allocates what pause("kv") gave back.
    taker = _handoff_taker(impl, a.handoff_gib * GIB)
    assert taker.stdin is not None and taker.stdout is not None
    saver.pause("kv")
    returned = time.monotonic()
    taker.stdin.write("go\n")
    taker.stdin.flush()
    got = json.loads(taker.stdout.readline())
    taker.stdin.write("done\n")
    taker.stdin.flush()
    taker.wait(60)
    out["handoff"] = ({"seconds": got["served"] - returned} if "served" in got else got)
    saver.resume("kv")
    torch.cuda.synchronize()
    return out


def pinned_worker() -> dict[str, Any]:
    import torch

    torch.cuda.set_device(0)
    n = 4 * GIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d, d2h = [], []
    for _ in range(3):
        h2d.append(_timed(lambda: dev.copy_(host, non_blocking=False), torch))
        d2h.append(_timed(lambda: host.copy_(dev, non_blocking=False), torch))
    return {"bytes": n, "h2d_gb_s": n / min(h2d) / 1e9, "d2h_gb_s": n / min(d2h) / 1e9}


# ---- the driver ------------------------------------------------------------------


def start_daemon(rmmd_path: str, cuda_bytes: int, host_bytes: int) -> tuple[subprocess.Popen[bytes], str]:
    runtime = tempfile.mkdtemp(prefix="rmmd-sleep-bench-")
    notify_path = os.path.join(runtime, "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(60)
    log = open(os.path.join(runtime, "rmmd.log"), "wb")

    def more_files() -> None:  # one fd per stable allocation and per backup (docs/sleep.md)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    proc = subprocess.Popen([rmmd_path, "--runtime-dir", runtime, "--backend", "cuda", "--cuda-pool-bytes",
                             str(cuda_bytes), "--host-pool-bytes", str(host_bytes), "--drain-timeout-ms", "0"],
                            env=dict(os.environ, NOTIFY_SOCKET=notify_path), stdout=log, stderr=log,
                            preexec_fn=more_files)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if b"READY=1" in notify.recv(4096):
                return proc, runtime
        except socket.timeout:
            break
    proc.kill()
    raise SystemExit(f"rmmd did not start; log: {open(os.path.join(runtime, 'rmmd.log')).read()}")


def run_worker(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=1800)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": f"exit {out.returncode}: {out.stderr[-3000:]}"}
    return json.loads(lines[-1])


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=name,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def importable(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def targets(results: dict[str, Any], pinned: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ours, theirs = results.get("rmmd", {}), results.get("tms", {})
    med = lambda r, k: statistics.median(r["runs"][k])  # noqa: E731
    if "runs" in ours and "runs" in theirs:
        for k in ("kv_pause", "kv_resume"):
            ratio = med(ours, k) / med(theirs, k)
            out.append({"what": f"{k}: rmmd / torch_memory_saver (medians)", "value": ratio, "limit": 1.1,
                        "pass": ratio <= 1.1})
    if "runs" in ours and "h2d_gb_s" in pinned:
        for k, link in (("weights_pause", "d2h_gb_s"), ("weights_resume", "h2d_gb_s")):
            share = ours["weights_bytes"] / med(ours, k) / 1e9 / pinned[link]
            out.append({"what": f"{k}: rmmd's GB/s / pinned {link[:3]}", "value": share, "limit": 0.8,
                        "pass": share >= 0.8})
    if "seconds" in ours.get("handoff", {}):
        ms = ours["handoff"]["seconds"] * 1e3
        out.append({"what": "handoff: pause's return to another tenant's allocation served (ms)", "value": ms,
                    "limit": 50.0, "pass": ms <= 50.0})
    return out


def report(results: dict[str, Any], pinned: dict[str, Any]) -> None:
    print(f"pinned 4 GiB: {pinned.get('h2d_gb_s', 0):.1f} GB/s to the GPU, {pinned.get('d2h_gb_s', 0):.1f} GB/s back")
    for impl, r in results.items():
        if "runs" not in r:
            print(f"{impl}: {r}")
            continue
        line = [f"{impl:5}"]
        for k, v in r["runs"].items():
            nbytes = r["kv_bytes"] if k.startswith("kv") else r["weights_bytes"]
            line.append(f"{k} {statistics.median(v) * 1e3:8.1f} ms ({nbytes / statistics.median(v) / 1e9:6.1f} GB/s)")
        print("  ".join(line))
        print(f"      weights restored: {r['weights_restored']}, addresses kept: {r['addresses_kept']}"
              + (f", handoff: {r['handoff']}" if "handoff" in r else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv-gib", type=int, default=60)
    p.add_argument("--weights-gib", type=float, default=8.0)
    p.add_argument("--weights-tensors", type=int, default=1000)
    p.add_argument("--handoff-gib", type=int, default=0, help="default: --kv-gib")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--impls", default="tms,rmmd")
    p.add_argument("--rmmd", default=os.environ.get("RMMD_DAEMON"))
    p.add_argument("--runtime-dir")
    p.add_argument("--out")
    p.add_argument("--worker")
    p.add_argument("--handoff-bytes", type=int, default=0)
    a = p.parse_args()
    a.handoff_gib = a.handoff_gib or a.kv_gib
    if a.worker:
        if a.worker.startswith("taker-"):
            taker_worker(a.worker[len("taker-"):], a.handoff_bytes)
            return 0
        result = pinned_worker() if a.worker == "pinned" else engine_worker(a.worker, a)
        print(json.dumps(result), flush=True)
        # Out without tearing down: torch_memory_saver's hook mode "torch"
        # aborts when its MemPools free their memory outside a region (at
        # exit), which has nothing to do with what was measured.
        os._exit(0)

    sizes = ["--kv-gib", str(a.kv_gib), "--weights-gib", str(a.weights_gib), "--weights-tensors",
             str(a.weights_tensors), "--handoff-gib", str(a.handoff_gib), "--repeats", str(a.repeats)]
    env = dict(os.environ)
    pinned = run_worker(["--worker", "pinned"], env)
    results: dict[str, Any] = {}
    impls = a.impls.split(",")
    if "tms" in impls:
        results["tms"] = (run_worker(["--worker", "tms", *sizes], env) if importable("torch_memory_saver")
                          else {"skipped": "torch_memory_saver does not import"})
    if "rmmd" in impls:
        daemon = None
        runtime = a.runtime_dir
        if runtime is None:
            if not a.rmmd:
                raise SystemExit("rmmd's side needs --rmmd PATH (a daemon to start) or --runtime-dir DIR")
            cuda = int((a.kv_gib + a.weights_gib + 4) * GIB)
            daemon, runtime = start_daemon(a.rmmd, cuda, int((a.weights_gib + 1) * GIB))
        try:
            results["rmmd"] = run_worker(["--worker", "rmmd", *sizes], dict(env, RMMD_RUNTIME_DIR=runtime))
        finally:
            if daemon is not None:
                daemon.terminate()
                daemon.wait(60)
    report(results, pinned)
    checks = targets(results, pinned)
    for t in checks:
        print(f"{'pass' if t['pass'] else 'MISS'}  {t['what']}: {t['value']:.3f} (limit {t['limit']})")
    doc = {"gpu": gpu_name(), "sizes": {"kv_gib": a.kv_gib, "weights_gib": a.weights_gib,
                                        "weights_tensors": a.weights_tensors, "handoff_gib": a.handoff_gib,
                                        "repeats": a.repeats},
           "pinned": pinned, "results": results, "targets": checks}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
