#!/usr/bin/env python3
"""rmmd from Python against the frameworks' own allocators (issue 13, point 6).

  python bench/python/rmmd_python_bench.py [--rmmd PATH | --runtime-dir DIR] [--out FILE.json]
        [--runs 2] [--steps 60] [--warmup 10] [--quick] [--direct] [--sections torch,cupy]

torch: a fixed training loop (--layers transformer blocks of --d-model, bf16,
AdamW; batch and sequence sized to use several GiB) timed per step
(torch.cuda.synchronize() after each; backward in the calling thread,
torch.autograd.set_multithreading_enabled(False), in every way), in three
ways, each run in its own process, --runs times, interleaved:

  default     PyTorch's own caching allocator
  mempool     a torch.cuda.MemPool over rmmd (slab mode), PyTorch's caching on
              top, entered with rmmd.allocators.torch.use_mem_pool
  allocator   rmmd as the whole process's allocator (slab mode)
  (--direct adds allocator_direct: the whole-process allocator in direct mode)

A run's figure is the median step time after --warmup steps; a way's figure
is the median of its runs' figures. The first and last losses are recorded
(the same for every way: same seeds, same work).

cupy: allocate/free pairs (cupy.empty then del) at 1 KiB, 64 KiB and 1 MiB,
with CuPy's default memory pool, with CuPy's MemoryPool over rmmd
(rmmd_memory_pool, slab mode: `rmmd_pool`) and with rmmd's CuPy allocator
(rmmd_allocator, slab mode, every allocation from rmmd: `rmmd`), each in its
own process, --runs times; per size the median over runs of a run's mean
pair time.

Targets (printed pass / MISS, and in the JSON): mempool and allocator step
time <= 1.02x default; CuPy pairs through rmmd (both ways) <= 1.5x CuPy's
pool at each size.

It starts its own daemon (--rmmd, default $RMMD_DAEMON or build/daemon/rmmd:
`--runtime-dir <temp> --backend cuda --cuda-pool-bytes 48GiB`, ready at
READY=1 on a notify socket it owns) unless --runtime-dir names a running one.
The rmmd package is imported from python/ beside this file's checkout unless
it is importable; librmmd_c.so is found as the package finds it
($RMMD_LIBRARY). Exit status: 0 when every part ran (a missed target is a
result), 1 when a part failed, 2 without a GPU or with a bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench_common import REPO, Daemon, env_with_rmmd, verdict, write_json

CUPY_SIZES = [1 << 10, 64 << 10, 1 << 20]
TARGET_STEP_RATIO = 1.02
TARGET_CUPY_RATIO = 1.5


# ---- workers (each in its own process) --------------------------------------


def torch_worker(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    if a.way in ("allocator", "allocator_direct"):
        from rmmd.allocators.torch import use_rmmd_as_allocator

        use_rmmd_as_allocator(mode="direct" if a.way == "allocator_direct" else "slab")
    import contextlib

    ctx: Any = contextlib.nullcontext()
    if a.way == "mempool":
        from rmmd.allocators.torch import rmmd_mem_pool, use_mem_pool

        ctx = use_mem_pool(rmmd_mem_pool(mode="slab"))  # backward passes included
    torch.manual_seed(0)
    # Every way runs backward in the calling thread (the MemPool's way needs
    # it to see backward's allocations), so they differ only in the memory.
    with ctx, torch.autograd.grad_mode.set_multithreading_enabled(False):
        layer = torch.nn.TransformerEncoderLayer(
            d_model=a.d_model, nhead=a.heads, dim_feedforward=4 * a.d_model, dropout=0.0,
            batch_first=True, device="cuda", dtype=torch.bfloat16,
        )
        model = torch.nn.TransformerEncoder(layer, num_layers=a.layers, enable_nested_tensor=False)
        head = torch.nn.Linear(a.d_model, a.vocab, device="cuda", dtype=torch.bfloat16)
        params = list(model.parameters()) + list(head.parameters())
        opt = torch.optim.AdamW(params, lr=1e-4)
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(a.batch, a.seq, a.d_model, device="cuda", dtype=torch.bfloat16, generator=gen)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda", generator=gen)
        times, losses = [], []
        torch.cuda.synchronize()
        for _ in range(a.warmup + a.steps):
            start = time.perf_counter()
            out = head(model(x))
            loss = torch.nn.functional.cross_entropy(out.float().view(-1, a.vocab), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
        measured = times[a.warmup:]
        result: dict[str, Any] = {
            "way": a.way,
            "median_step_ms": statistics.median(measured) * 1e3,
            "mean_step_ms": statistics.fmean(measured) * 1e3,
            "min_step_ms": min(measured) * 1e3,
            "first_loss": losses[0],
            "last_loss": losses[-1],
        }
        if a.way == "default" or a.way == "mempool":
            result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if a.way != "default":
            from rmmd.allocators.torch import memory_stats

            s = memory_stats(0)
            result["rmmd_high_water_gib"] = s["high_water_bytes"] / 2**30
            result["rmmd_total_allocations"] = s["total_allocations"]
    return result


def cupy_worker(a: argparse.Namespace) -> dict[str, Any]:
    import cupy

    if a.way == "rmmd":
        from rmmd.allocators.cupy import rmmd_allocator

        cupy.cuda.set_allocator(rmmd_allocator(mode="slab"))
    elif a.way == "rmmd_pool":
        from rmmd.allocators.cupy import rmmd_memory_pool

        cupy.cuda.set_allocator(rmmd_memory_pool(mode="slab").malloc)
    out: dict[str, Any] = {"way": a.way, "pair_us": {}}
    for size in CUPY_SIZES:
        for _ in range(a.pairs // 10):  # warm-up: the pool (or the slab) is there
            x = cupy.empty(size, dtype=cupy.uint8)
            del x
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(a.pairs):
            x = cupy.empty(size, dtype=cupy.uint8)
            del x
        elapsed = time.perf_counter() - start
        cupy.cuda.Device().synchronize()
        out["pair_us"][str(size)] = elapsed / a.pairs * 1e6
    return out


# ---- the daemon -------------------------------------------------------------


def start_daemon(program: Path, pool_bytes: str) -> Daemon:
    """rmmd with a CUDA pool of `pool_bytes` (as "48GiB"), ready when it returns."""
    return Daemon(program, ["--backend", "cuda", "--cuda-pool-bytes", pool_bytes, "--drain-timeout-ms", "0"],
                  "rmmd-pybench-")


# ---- the driver -------------------------------------------------------------


def run_worker(kind: str, way: str, a: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    args = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--way", way,
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
            "--seq", str(a.seq), "--d-model", str(a.d_model), "--heads", str(a.heads),
            "--layers", str(a.layers), "--vocab", str(a.vocab), "--pairs", str(a.pairs)]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=a.worker_timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} {way} exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_name(env: dict[str, str]) -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, env=env)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rmmd", default=os.environ.get("RMMD_DAEMON", str(REPO / "build/daemon/rmmd")))
    p.add_argument("--runtime-dir", help="use the daemon running there instead of starting one")
    p.add_argument("--pool-bytes", default="48GiB", help="--cuda-pool-bytes of the daemon it starts")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--sections", default="torch,cupy")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--pairs", type=int, default=20000)
    p.add_argument("--direct", action="store_true", help="also the whole-process allocator in direct mode")
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer steps and pairs")
    p.add_argument("--worker-timeout", type=float, default=600)
    p.add_argument("--worker", choices=["torch", "cupy"], help=argparse.SUPPRESS)
    p.add_argument("--way", help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.worker:
        print(json.dumps(torch_worker(a) if a.worker == "torch" else cupy_worker(a)), flush=True)
        return 0

    if a.quick:
        a.steps, a.warmup, a.pairs, a.runs = 15, 5, 2000, max(a.runs, 2)
    sections = [s for s in a.sections.split(",") if s]
    env = env_with_rmmd()
    if not shutil.which("nvidia-smi") and not Path("/dev/nvidia0").exists():
        print("rmmd_python_bench: no GPU here", file=sys.stderr)
        return 2

    daemon = None
    if a.runtime_dir:
        env["RMMD_RUNTIME_DIR"] = a.runtime_dir
    else:
        daemon = start_daemon(Path(a.rmmd), a.pool_bytes)
        env["RMMD_RUNTIME_DIR"] = daemon.runtime
    results: dict[str, Any] = {
        "gpu": gpu_name(env), "python": sys.version.split()[0], "config": {
            k: getattr(a, k) for k in ("runs", "steps", "warmup", "batch", "seq", "d_model", "heads",
                                       "layers", "vocab", "pairs")},
        "torch": {}, "cupy": {}, "targets": [], "errors": [],
    }
    try:
        if "torch" in sections:
            ways = ["default", "mempool", "allocator"] + (["allocator_direct"] if a.direct else [])
            runs: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
            for _ in range(a.runs):  # interleaved, so drift hits every way alike
                for w in ways:
                    try:
                        runs[w].append(run_worker("torch", w, a, env))
                    except Exception as e:  # noqa: BLE001
                        results["errors"].append(f"torch {w}: {e}")
            for w in ways:
                if runs[w]:
                    results["torch"][w] = {
                        "median_step_ms": statistics.median(r["median_step_ms"] for r in runs[w]),
                        "runs": runs[w],
                    }
            base = results["torch"].get("default", {}).get("median_step_ms")
            for w in ways[1:]:
                got = results["torch"].get(w, {}).get("median_step_ms")
                if base and got:
                    ratio = got / base
                    results["torch"][w]["ratio_to_default"] = ratio
                    if w in ("mempool", "allocator"):
                        results["targets"].append({"name": f"torch {w} step / default", "value": ratio,
                                                   "limit": TARGET_STEP_RATIO, "pass": ratio <= TARGET_STEP_RATIO})
        if "cupy" in sections:
            cruns: dict[str, list[dict[str, Any]]] = {"default": [], "rmmd_pool": [], "rmmd": []}
            for _ in range(a.runs):
                for w in cruns:
                    try:
                        cruns[w].append(run_worker("cupy", w, a, env))
                    except Exception as e:  # noqa: BLE001
                        results["errors"].append(f"cupy {w}: {e}")
            for w, rs in cruns.items():
                if rs:
                    results["cupy"][w] = {
                        "pair_us": {str(s): statistics.median(r["pair_us"][str(s)] for r in rs) for s in CUPY_SIZES},
                        "runs": rs,
                    }
            for w in ("rmmd_pool", "rmmd"):
                if not (cruns["default"] and cruns[w]):
                    continue
                for s in CUPY_SIZES:
                    ratio = results["cupy"][w]["pair_us"][str(s)] / results["cupy"]["default"]["pair_us"][str(s)]
                    results["targets"].append({"name": f"cupy pair {s} B {w} / cupy pool", "value": ratio,
                                               "limit": TARGET_CUPY_RATIO, "pass": ratio <= TARGET_CUPY_RATIO})
    finally:
        if daemon is not None:
            daemon.stop()

    print(f"rmmd_python_bench on {results['gpu']} (Python {results['python']})")
    for w, r in results["torch"].items():
        ratio = r.get("ratio_to_default")
        runs_ms = ", ".join(f"{x['median_step_ms']:.2f}" for x in r["runs"])
        losses = f"loss {r['runs'][0]['first_loss']:.4f} -> {r['runs'][0]['last_loss']:.4f}"
        print(f"  torch {w:<17} {r['median_step_ms']:8.2f} ms/step  (runs {runs_ms})"
              + (f"  {ratio:.3f}x default" if ratio else "") + f"  {losses}")
    for w, r in results["cupy"].items():
        print(f"  cupy  {w:<17} " + "  ".join(f"{int(s) >> 10} KiB {us:.2f} us" for s, us in r["pair_us"].items()))
    for t in results["targets"]:
        print(f"  target {t['name']}: {t['value']:.3f} <= {t['limit']}: {verdict(t['pass'])}")
    for e in results["errors"]:
        print(f"  error: {e}")
    if a.out:
        write_json(a.out, results)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
