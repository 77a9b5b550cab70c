#!/usr/bin/env python3
"""Model weights as a shared asset, at the scale of real models: attach against size and against loading a file.

  python bench/python/weights_bench.py [--rmmd PATH | --runtime-dir DIR] [--out FILE.json]
        [--sizes-gib 1,10,100] [--tensors 1000] [--runs 5] [--procs 8]
        [--file-sizes-gib 1,10] [--cache cold,warm] [--file-dir DIR] [--quick] [--dry-run]

Per size S in --sizes-gib, a publisher process makes one weight set of
--tensors bf16 tensors totalling S GiB in one buffer on GPU 0: the buffer,
its manifest (names, dtypes, shapes, offsets; labels model and revision)
and the bytes, each tensor filled with a value of its own by a CUDA fill
(no host data; --publish-with torch uses rmmd.torch.publish of a state_dict
made on the GPU instead, which needs twice the memory). It holds the buffer
while fresh worker processes (each `python this-file --worker ...`: a new
interpreter, never a fork) measure:

  attach 1   one process at a time, --runs times: the timed span is
             rmmd.torch.load_state_dict(name, expect=labels) (a session, the
             open with the fingerprint guard, the manifest, --tensors torch
             views); --attach-with module attaches a module built on the meta
             device instead (rmmd.torch.attach), --attach-with steps makes the
             calls one by one and reports each (Session, SharedBuffer.open,
             .manifest, .tensors("torch")). p50 / p90 / max over the runs.
  attach 8   --procs processes at once, --runs rounds: each starts Python,
             imports torch, makes its CUDA context, says `ready`; when all
             have, the driver says `go` to each and each times its own attach.
             p50 / p90 / max over every process of every round.

Before a worker's timed span: the interpreter, torch, the CUDA context (so
no figure includes what any CUDA process pays at start; `startup_s` says
what that was). After it, untimed: every name is there, the views lie in one
range of the buffer's size, sampled tensors hold their values (the first
read's time is `first_read_s`), the process's free device memory before and
after (`device_memory_growth_bytes`).

For S also in --file-sizes-gib (the run's temp dir on local disk: --file-dir,
default $TMPDIR; the GPU host has about 64 GiB of disk), the driver writes
the same tensors (names, dtypes, shapes, values) as a .safetensors file, in
the format's documented layout, then, in fresh processes, --runs times each,
with the file's pages dropped from the page cache first (`cold`:
fsync + posix_fadvise(DONTNEED); the fraction still cached is measured with
mincore and recorded) and read through once (`warm`):

  load          safetensors.torch.load_file(path, device="cuda") + synchronize:
                what a restarted worker without rmmd does
  publish_file  rmmd.safetensors.publish_file(path, name) + synchronize:
                the file straight into a buffer through pinned staging
                (point 4); the buffer is closed (freed) after each run

Reported: GiB/s of each; per size, attach against load (the time a
restarted worker saves).

Targets (printed pass / MISS, and in the JSON): attach by 1 process p50
<= 1 s at the largest size; by --procs at once, every process <= 2 s at the
largest size; attach p50 at the largest size / at the smallest <= 2 (flat
against size). A missed target is a result.

It starts its own daemon (--rmmd, default $RMMD_DAEMON or build/daemon/rmmd:
`--runtime-dir <temp> --backend cuda --cuda-pool-bytes <what the run needs>`,
ready at READY=1) unless --runtime-dir names a running one. The rmmd
package is imported from python/ beside this file's checkout unless it is
importable; librmmd_c.so is found as the package finds it ($RMMD_LIBRARY);
safetensors from $PYTHONPATH (scripts/gpu-safetensors.sh installs it on the
GPU host). --dry-run (no GPU needed) prints the plan and writes and checks
a small .safetensors file of the first layout instead. --max-seconds (540)
bounds the run: parts not begun by then are skipped, saying so.

Exit status: 0 when every part ran (a missed target is a result), 1 when a
part failed or was skipped (`errors` in the JSON), 2 without a GPU or with a
bad command line, 3 past --max-seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import selectors
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import REPO, env_with_rmmd, verdict, write_json  # noqa: E402
from rmmd_python_bench import start_daemon  # noqa: E402  (the daemon, started the same way)
from weight_set import (  # noqa: E402
    GIB, Layout, bf16_bits, buffer_name, cached_fraction, drop_from_page_cache, filesystem_of, fill_value,
    labels_for, read_safetensors_header, read_through, sampled, write_safetensors,
)

SCHEMA = "rmmd-weights-bench/1"
TARGET_ATTACH_ONE_S = 1.0
TARGET_ATTACH_MANY_S = 2.0
TARGET_FLAT_RATIO = 2.0


# ---- workers (each a fresh process) -----------------------------------------


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def cuda_ready() -> Any:
    """torch, with this process's CUDA context made."""
    t = time.perf_counter()
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    return torch, time.perf_counter() - t


def check_values(torch: Any, tensors: dict[str, Any], layout: Layout) -> float:
    """Reads the sampled tensors' first and last elements; returns the time
    the reads took. Raises if a value is wrong."""
    start = time.perf_counter()
    for i in sampled(len(layout.tensors)):
        t = tensors[layout.tensors[i].name]
        if tuple(t.shape) != layout.tensors[i].shape or t.dtype != torch.bfloat16:
            raise AssertionError(f"{layout.tensors[i].name}: {tuple(t.shape)} {t.dtype}")
        got = (float(t.reshape(-1)[0]), float(t.reshape(-1)[-1]))
        if got != (fill_value(i), fill_value(i)):
            raise AssertionError(f"{layout.tensors[i].name} holds {got}, expected {fill_value(i)}")
    return time.perf_counter() - start


def views_span(tensors: Iterable[Any]) -> int:
    lo = hi = None
    for t in tensors:
        p, n = t.data_ptr(), t.numel() * t.element_size()
        lo = p if lo is None else min(lo, p)
        hi = p + n if hi is None else max(hi, p + n)
    return (hi or 0) - (lo or 0)


def meta_module(torch: Any, layout: Layout) -> Any:
    """A module with the layout's parameters, built on the meta device."""
    root = torch.nn.Module()
    with torch.device("meta"):
        for t in layout.tensors:
            *path, leaf = t.name.split(".")
            m = root
            for part in path:
                if not hasattr(m, part):
                    m.add_module(part, torch.nn.Module())
                m = getattr(m, part)
            m.register_parameter(leaf, torch.nn.Parameter(torch.empty(t.shape, dtype=torch.bfloat16),
                                                          requires_grad=False))
    return root


def wait_for_go() -> float:
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("weights_bench worker: the driver went away")
    return time.time()


def worker_publish(a: argparse.Namespace, layout: Layout) -> None:
    torch, context_s = cuda_ready()
    import rmmd

    labels = labels_for(layout)
    name = buffer_name(layout)
    times: dict[str, float] = {}
    t = time.perf_counter()
    if a.publish_with == "torch":
        import rmmd.torch

        state = {}
        for i, x in enumerate(layout.tensors):
            state[x.name] = torch.empty(x.shape, dtype=torch.bfloat16, device="cuda").fill_(fill_value(i))
        torch.cuda.synchronize()
        times["fill_s"] = time.perf_counter() - t
        t = time.perf_counter()
        buf = rmmd.torch.publish(name, state, labels=labels, device=0)
        torch.cuda.synchronize()
        times["publish_s"] = time.perf_counter() - t
        del state
        torch.cuda.empty_cache()
    else:
        session = rmmd.Session(client_name="weights-bench-publisher")
        buf = rmmd.SharedBuffer.create(session, name, layout.nbytes, device=0)
        times["create_s"] = time.perf_counter() - t
        t = time.perf_counter()
        buf.set_manifest([rmmd.TensorEntry(name=x.name, dtype="bfloat16", shape=x.shape, offset=x.offset,
                                           strides=None) for x in layout.tensors], labels=labels)
        times["set_manifest_s"] = time.perf_counter() - t
        t = time.perf_counter()
        raw = torch.from_dlpack(buf).view(torch.uint8)
        for i, x in enumerate(layout.tensors):
            bits = bf16_bits(fill_value(i))
            raw[x.offset:x.offset + x.nbytes].view(torch.int16).fill_(bits - 65536 if bits >= 32768 else bits)
        torch.cuda.synchronize()
        times["fill_s"] = time.perf_counter() - t
        del raw
        t = time.perf_counter()
        buf.publish()
        times["publish_s"] = time.perf_counter() - t
    try:
        import safetensors

        st_version = safetensors.__version__
    except ImportError:
        st_version = None
    emit({"published": name, "nbytes": buf.nbytes, "tensors": len(layout.tensors), "labels": labels,
          "times": times, "context_s": context_s, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
          "safetensors": st_version, "device": torch.cuda.get_device_name(0), "rmmd": getattr(rmmd, "__version__", "")})
    sys.stdin.readline()  # hold it until the driver is done with it
    buf.close()


def worker_attach(a: argparse.Namespace, layout: Layout) -> None:
    started = time.time()
    torch, context_s = cuda_ready()
    import rmmd
    import rmmd.torch

    expect = labels_for(layout)
    name = buffer_name(layout)
    module = meta_module(torch, layout) if a.attach_with == "module" else None
    free_before = torch.cuda.mem_get_info()[0]
    emit({"ready": True, "startup_s": time.time() - a.spawned_at, "context_s": context_s})
    go = wait_for_go()
    steps: dict[str, float] = {}
    held: Any = None
    t0 = time.perf_counter()
    if a.attach_with == "load_state_dict":
        tensors = rmmd.torch.load_state_dict(name, expect=expect)
    elif a.attach_with == "module":
        held = rmmd.torch.attach(name, module, expect=expect)
        tensors = dict(module.state_dict(keep_vars=True))
    else:
        session = rmmd.Session(client_name="weights-bench-attach")
        t1 = time.perf_counter()
        buf = rmmd.SharedBuffer.open(session, name, expect=expect)
        t2 = time.perf_counter()
        manifest = buf.manifest
        t3 = time.perf_counter()
        tensors = buf.tensors("torch")
        t4 = time.perf_counter()
        steps = {"session_s": t1 - t0, "open_s": t2 - t1, "manifest_s": t3 - t2, "views_s": t4 - t3,
                 "manifest_tensors": len(manifest.tensors)}
    attach_s = time.perf_counter() - t0
    missing = [t.name for t in layout.tensors if t.name not in tensors]
    if missing:
        raise AssertionError(f"{len(missing)} tensors missing, e.g. {missing[:3]}")
    span = views_span(tensors[t.name] for t in layout.tensors)
    first_read_s = check_values(torch, tensors, layout)
    emit({"attach_s": attach_s, "first_read_s": first_read_s, "go_at": go, "started_at": started,
          "views_span_bytes": span, "views_in_one_buffer": span <= layout.nbytes,
          "device_memory_growth_bytes": free_before - torch.cuda.mem_get_info()[0],
          "torch_allocated_bytes": torch.cuda.memory_allocated(), **steps})
    del tensors, held  # let go only now


def worker_file(a: argparse.Namespace, layout: Layout) -> None:
    torch, context_s = cuda_ready()
    if a.worker == "load":
        from safetensors.torch import load_file
    else:
        import rmmd
        import rmmd.safetensors
    emit({"ready": True, "startup_s": time.time() - a.spawned_at, "context_s": context_s})
    wait_for_go()
    t0 = time.perf_counter()
    if a.worker == "load":
        tensors = load_file(a.path, device="cuda")
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        buf = None
    else:
        buf = rmmd.safetensors.publish_file(a.path, a.name)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        tensors = buf.tensors("torch")
    check_values(torch, tensors, layout)
    out = {"seconds": seconds, "torch_allocated_bytes": torch.cuda.memory_allocated(), "tensors": len(tensors)}
    del tensors
    if buf is not None:
        buf.close()
    emit(out)


# ---- the driver -------------------------------------------------------------


class Worker:
    """One worker process: a fresh interpreter running this file."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args, "--spawned-at", repr(time.time())],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            text = self.proc.stdout.readline() if sel.select(timeout) else ""
        if not text:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise RuntimeError(f"worker {' '.join(self.proc.args[2:5])} said nothing "
                               f"(status {self.proc.returncode}); stderr:\n{err[-3000:]}")
        return json.loads(text)

    def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float) -> None:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise RuntimeError(f"worker {' '.join(self.proc.args[2:5])} did not exit")
        if self.proc.returncode != 0:
            raise RuntimeError(f"worker exited with {self.proc.returncode}: {err[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def worker_args(a: argparse.Namespace, kind: str, size_bytes: int, *extra: str) -> list[str]:
    return ["--worker", kind, "--size-bytes", str(size_bytes), "--tensors", str(a.tensors),
            "--attach-with", a.attach_with, "--publish-with", a.publish_with, *extra]


def run_together(a: argparse.Namespace, env: dict[str, str], args_list: list[list[str]]) -> list[dict[str, Any]]:
    """Starts one worker per argument list, waits until all are ready, says
    `go` to each, and returns each one's result (ready line merged in)."""
    workers = [Worker(args, env) for args in args_list]
    try:
        ready = [w.line(a.worker_timeout) for w in workers]
        for w in workers:
            w.say("go")
        results = [dict(r, **w.line(a.worker_timeout)) for r, w in zip(ready, workers)]
        for w in workers:
            w.finish(a.worker_timeout)
        return results
    finally:
        for w in workers:
            w.kill()


def percentiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def q(p: float) -> float:  # nearest rank
        return s[max(0, math.ceil(p * len(s)) - 1)]

    return {"n": len(s), "p50_s": statistics.median(s), "p90_s": q(0.9), "max_s": s[-1], "min_s": s[0]}


def gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        name, driver, mem = [x.strip() for x in out.stdout.strip().split(",")[:3]]
        info.update(name=name, driver=driver, memory_mib=int(float(mem)))
    try:
        info["proc_driver_version"] = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        info.setdefault("driver", info["proc_driver_version"].split("Kernel Module")[-1].split()[0])
    except (OSError, IndexError):
        pass
    return info


class Run:
    """The figures and the clock of one run."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.start = time.monotonic()
        self.errors: list[str] = []
        self.targets: list[dict[str, Any]] = []

    def time_left(self, what: str) -> bool:
        if time.monotonic() - self.start < self.a.max_seconds:
            return True
        self.errors.append(f"{what}: skipped, the run passed --max-seconds {self.a.max_seconds}")
        return False

    def target(self, name: str, value: float, limit: float) -> None:
        self.targets.append({"name": name, "value": value, "limit": limit, "pass": value <= limit})


def measure_attach(run: Run, env: dict[str, str], size: dict[str, Any], nbytes: int) -> None:
    a = run.a
    ones: list[dict[str, Any]] = []
    for _ in range(a.runs):
        if not run.time_left(f"attach 1 at {size['size_gib']} GiB"):
            break
        ones += run_together(a, env, [worker_args(a, "attach", nbytes)])
    rounds: list[list[dict[str, Any]]] = []
    for _ in range(a.runs if a.procs > 1 else 0):
        if not run.time_left(f"attach {a.procs} at {size['size_gib']} GiB"):
            break
        rounds.append(run_together(a, env, [worker_args(a, "attach", nbytes)] * a.procs))
    if ones:
        size["attach_1"] = {**percentiles([r["attach_s"] for r in ones]), "runs": ones}
    if rounds:
        every = [r for rs in rounds for r in rs]
        size[f"attach_{a.procs}"] = {
            **percentiles([r["attach_s"] for r in every]),
            # Did they overlap: the latest start against the earliest end, per round.
            "overlapped_rounds": sum(
                1 for rs in rounds if max(r["go_at"] for r in rs) < min(r["go_at"] + r["attach_s"] for r in rs)),
            "rounds": rounds,
        }


def measure_file(run: Run, env: dict[str, str], size: dict[str, Any], layout: Layout, tmp: Path) -> None:
    a = run.a
    path = tmp / f"weights-{layout.nbytes}.safetensors"
    free = shutil.disk_usage(tmp).free
    if free < layout.nbytes + (1 << 30):
        run.errors.append(f"file at {size['size_gib']} GiB: {tmp} has {free / GIB:.1f} GiB free; skipped")
        return
    f: dict[str, Any] = {"path": str(path), "write_s": write_safetensors(path, layout, labels_for(layout))}
    f["file_bytes"] = path.stat().st_size
    size["file"] = f
    try:
        for cache in a.cache:
            for kind in ("load", "publish_file"):
                rs = []
                for i in range(a.runs):
                    if not run.time_left(f"{kind} {cache} at {size['size_gib']} GiB"):
                        break
                    if cache == "cold":
                        drop_from_page_cache(path)
                    else:
                        read_through(path)
                    resident = cached_fraction(path)
                    extra = ["--path", str(path), "--name", f"bench/weights-file/{layout.nbytes}-{cache}-{i}"]
                    r = run_together(a, env, [worker_args(a, kind, layout.nbytes, *extra)])[0]
                    r["cached_fraction_before"] = resident
                    rs.append(r)
                if rs:
                    p = percentiles([r["seconds"] for r in rs])
                    f[f"{kind}_{cache}"] = {**p, "gib_per_s": layout.nbytes / GIB / p["p50_s"], "runs": rs}
            load = f.get(f"load_{cache}", {}).get("p50_s")
            attach = size.get("attach_1", {}).get("p50_s")
            if load and attach:
                f[f"restart_saves_{cache}_s"] = load - attach
                f[f"load_over_attach_{cache}"] = load / attach
    finally:
        path.unlink(missing_ok=True)


def measure_size(run: Run, env: dict[str, str], size_gib: float, tmp: Path) -> dict[str, Any]:
    a = run.a
    layout = Layout.make(int(size_gib * GIB), a.tensors)
    size: dict[str, Any] = {"size_gib": size_gib, "nbytes": layout.nbytes, "tensors": len(layout.tensors),
                            "name": buffer_name(layout), "labels": labels_for(layout)}
    publisher = Worker(worker_args(a, "publish", layout.nbytes), env)
    try:
        size["publish"] = publisher.line(a.worker_timeout)
        measure_attach(run, env, size, layout.nbytes)
        if among(size_gib, a.file_sizes_gib):
            measure_file(run, env, size, layout, tmp)
        publisher.say("done")
        publisher.finish(a.worker_timeout)
    finally:
        publisher.kill()
    return size


def judge(run: Run, sizes: list[dict[str, Any]]) -> None:
    a = run.a
    with_one = [s for s in sizes if "attach_1" in s]
    if with_one:
        big = max(with_one, key=lambda s: s["nbytes"])
        run.target(f"attach by 1 process p50 at {big['size_gib']} GiB (s)", big["attach_1"]["p50_s"],
                   TARGET_ATTACH_ONE_S)
        many = big.get(f"attach_{a.procs}")
        if many:
            run.target(f"attach by {a.procs} at once, slowest process at {big['size_gib']} GiB (s)",
                       many["max_s"], TARGET_ATTACH_MANY_S)
        small = min(with_one, key=lambda s: s["nbytes"])
        if small is not big:
            run.target(f"attach p50 at {big['size_gib']} GiB / at {small['size_gib']} GiB",
                       big["attach_1"]["p50_s"] / small["attach_1"]["p50_s"], TARGET_FLAT_RATIO)


def summary(results: dict[str, Any]) -> str:
    g = results["gpu"]
    lines = [f"weights_bench on {g.get('name', '?')} (driver {g.get('driver', '?')}), "
             f"torch {results.get('torch', '?')}, safetensors {results.get('safetensors') or 'missing'}, "
             f"{results['config']['tensors']} tensors, attach with {results['config']['attach_with']}"]
    procs = results["config"]["procs"]
    for s in results["sizes"]:
        pub = s.get("publish", {}).get("times", {})
        lines.append(f"  {s['size_gib']:g} GiB ({s['nbytes']} bytes): published in "
                     + ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in pub.items()))
        for key, who in (("attach_1", "1 process"), (f"attach_{procs}", f"{procs} at once")):
            if key in s:
                x = s[key]
                lines.append(f"    attach by {who:<12} p50 {x['p50_s'] * 1e3:8.1f} ms  p90 {x['p90_s'] * 1e3:8.1f} ms"
                             f"  max {x['max_s'] * 1e3:8.1f} ms  (n={x['n']})")
        steps = [r for r in s.get("attach_1", {}).get("runs", []) if "open_s" in r]
        if steps:
            lines.append("      steps p50: " + ", ".join(
                f"{k[:-2]} {statistics.median(r[k] for r in steps) * 1e3:.1f} ms"
                for k in ("session_s", "open_s", "manifest_s", "views_s")))
        f = s.get("file", {})
        if f:
            lines.append(f"    file {f['file_bytes']} bytes written in {f['write_s']:.1f} s")
        for key, x in f.items():
            if isinstance(x, dict) and "p50_s" in x:
                cached = [r["cached_fraction_before"] for r in x["runs"] if r.get("cached_fraction_before") is not None]
                lines.append(f"    {key:<20} p50 {x['p50_s']:8.3f} s  {x['gib_per_s']:6.2f} GiB/s"
                             + (f"  (page cache before: {statistics.mean(cached):.0%})" if cached else ""))
        for cache in results["config"]["cache"]:
            if f"restart_saves_{cache}_s" in f:
                lines.append(f"    a restarted worker ({cache} file) saves {f[f'restart_saves_{cache}_s']:.3f} s: "
                             f"load is {f[f'load_over_attach_{cache}']:.0f}x attach")
    for t in results["targets"]:
        lines.append(f"  target {t['name']}: {t['value']:.3f} <= {t['limit']}: {verdict(t['pass'])}")
    for e in results["errors"]:
        lines.append(f"  error: {e}")
    return "\n".join(lines)


def dry_run(a: argparse.Namespace, tmp: Path) -> int:
    print(f"weights_bench --dry-run: sizes {a.sizes_gib} GiB, {a.tensors} tensors, runs {a.runs}, procs {a.procs}, "
          f"files at {a.file_sizes_gib} GiB in {tmp} ({filesystem_of(tmp)}), cache {a.cache}, "
          f"daemon --cuda-pool-bytes {a.pool_bytes}")
    for s in a.sizes_gib:
        layout = Layout.make(int(s * GIB), a.tensors)
        t = layout.tensors
        print(f"  {s:g} GiB: '{buffer_name(layout)}' {layout.nbytes} bytes, {len(t)} tensors "
              f"({t[1].name} {t[1].shape}, {t[0].name} {t[0].shape}), labels {labels_for(layout)}")
    layout = Layout.make(8 << 20, a.tensors)  # a small file of the same shape of set
    path = tmp / "dry-run.safetensors"
    seconds = write_safetensors(path, layout, labels_for(layout))
    header = read_safetensors_header(path)
    assert len([k for k in header if k != "__metadata__"]) == len(layout.tensors)
    assert header["__metadata__"] == labels_for(layout)
    drop_from_page_cache(path)
    cold = cached_fraction(path)
    read_through(path)
    warm = cached_fraction(path)
    print(f"  wrote {path.stat().st_size} bytes in {seconds:.3f} s; page cache after the drop {cold}, "
          f"after a read {warm}")
    try:
        import safetensors

        tensors = dict(safetensors.deserialize(path.read_bytes()))  # any dtype, no framework
        for i in sampled(len(layout.tensors)):
            x = layout.tensors[i]
            got = tensors[x.name]
            want = struct.pack("<H", bf16_bits(fill_value(i)))
            assert (got["dtype"], tuple(got["shape"])) == ("BF16", x.shape), (x.name, got["dtype"], got["shape"])
            assert bytes(got["data"][:2]) == want and bytes(got["data"][-2:]) == want, x.name
        print(f"  safetensors {safetensors.__version__} reads it back: {len(tensors)} tensors, "
              "the sampled ones with their dtype, shape and values")
    except ImportError:
        print("  (safetensors is not installed here: the file was checked by its header only)")
    path.unlink()
    return 0


def among(size: float, sizes: list[float]) -> bool:
    return any(abs(size - s) < 1e-9 for s in sizes)


def parse_sizes(text: str) -> list[float]:
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are GiB, comma-separated: {text!r}") from None
    if any(not (s > 0) for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be > 0 GiB: {text!r}")
    return sizes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rmmd", default=os.environ.get("RMMD_DAEMON", str(REPO / "build/daemon/rmmd")))
    p.add_argument("--runtime-dir", help="use the daemon running there instead of starting one")
    p.add_argument("--pool-bytes", help="--cuda-pool-bytes of the daemon it starts (default: what the run needs)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--sizes-gib", type=parse_sizes, help="weight set sizes (default 1,10,100; --quick 1,10)")
    p.add_argument("--file-sizes-gib", type=parse_sizes,
                   help="sizes also loaded from a local file (default 1,10; --quick 1); each must be in --sizes-gib")
    p.add_argument("--tensors", type=int, default=1000)
    p.add_argument("--runs", type=int, help="runs (and rounds) per figure (default 5; --quick 3)")
    p.add_argument("--procs", type=int, default=8, help="processes attaching at once")
    p.add_argument("--cache", default="cold,warm", help="file measurements: cold, warm or both")
    p.add_argument("--attach-with", choices=["load_state_dict", "module", "steps"], default="load_state_dict")
    p.add_argument("--publish-with", choices=["manifest", "torch"], default="manifest",
                   help="manifest: SharedBuffer.create + set_manifest + a CUDA fill; torch: rmmd.torch.publish "
                        "of a state_dict on the GPU (twice the memory)")
    p.add_argument("--file-dir", default=None, help="where the .safetensors files go (default $TMPDIR)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 and 10 GiB, 3 runs, the file at 1 GiB")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write and check a small file; no GPU")
    p.add_argument("--max-seconds", type=float, default=540)
    p.add_argument("--worker-timeout", type=float, default=300)
    p.add_argument("--worker", choices=["publish", "attach", "load", "publish_file"], help=argparse.SUPPRESS)
    p.add_argument("--size-bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    p.add_argument("--spawned-at", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.worker:
        # The layout again from the size the driver asked for (made with a
        # size that is already a layout's, it comes out the same).
        layout = Layout.make(a.size_bytes, a.tensors)
        {"publish": worker_publish, "attach": worker_attach}.get(a.worker, worker_file)(a, layout)
        return 0

    a.sizes_gib = a.sizes_gib or ([1.0, 10.0] if a.quick else [1.0, 10.0, 100.0])
    a.file_sizes_gib = a.file_sizes_gib if a.file_sizes_gib is not None else ([1.0] if a.quick else [1.0, 10.0])
    a.runs = a.runs or (3 if a.quick else 5)
    a.cache = [c for c in a.cache.split(",") if c]
    if bad := [c for c in a.cache if c not in ("cold", "warm")]:
        p.error(f"--cache takes cold and warm, comma-separated, not {bad}")
    if bad := [s for s in a.file_sizes_gib if not among(s, a.sizes_gib)]:
        p.error(f"--file-sizes-gib must be among --sizes-gib: {bad}")
    if a.tensors < 2 or a.runs < 1 or a.procs < 1:
        p.error("--tensors >= 2, --runs >= 1, --procs >= 1")
    try:
        for s in a.sizes_gib:
            Layout.make(int(s * GIB), a.tensors)
    except ValueError as e:
        p.error(str(e))
    if not a.pool_bytes:
        # The set, and publish_file's copy of it beside it.
        need = max(s * GIB * (2 if among(s, a.file_sizes_gib) else 1) for s in a.sizes_gib)
        a.pool_bytes = f"{math.ceil(need / GIB) + 4}GiB"
    tmp = Path(tempfile.mkdtemp(prefix="rmmd-weights-", dir=a.file_dir))
    try:
        if a.dry_run:
            return dry_run(a, tmp)
        return measure(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(a: argparse.Namespace, tmp: Path) -> int:
    env = env_with_rmmd()
    gpu = gpu_info()
    if "name" not in gpu and not Path("/dev/nvidia0").exists():
        print("weights_bench: no GPU here (nvidia-smi finds none); --dry-run checks the host side", file=sys.stderr)
        return 2
    print(f"weights_bench on {gpu.get('name', '?')} (driver {gpu.get('driver', '?')}), "
          f"{gpu.get('memory_mib', 0) / 1024:.0f} GiB", flush=True)
    run = Run(a)
    results: dict[str, Any] = {
        "schema": SCHEMA, "command": sys.argv, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": a.quick, "host": {"name": platform.node(), "cpus": os.cpu_count()}, "gpu": gpu,
        "python": sys.version.split()[0],
        "config": {"sizes_gib": a.sizes_gib, "file_sizes_gib": a.file_sizes_gib, "tensors": a.tensors,
                   "runs": a.runs, "procs": a.procs, "cache": a.cache, "attach_with": a.attach_with,
                   "publish_with": a.publish_with, "pool_bytes": a.pool_bytes},
        "file_dir": {"path": str(tmp), "filesystem": filesystem_of(tmp)},
        "sizes": [], "targets": run.targets, "errors": run.errors,
    }
    daemon = None
    status = 0
    try:
        if a.runtime_dir:
            env["RMMD_RUNTIME_DIR"] = a.runtime_dir
        else:
            daemon = start_daemon(Path(a.rmmd), a.pool_bytes)
            env["RMMD_RUNTIME_DIR"] = daemon.runtime
            results["daemon"] = {"argv": daemon.proc.args}
        for s in a.sizes_gib:
            if not run.time_left(f"{s:g} GiB"):
                status = 3
                break
            try:
                size = measure_size(run, env, s, tmp)
            except Exception as e:  # noqa: BLE001 (a failed size is reported; the next one runs)
                run.errors.append(f"{s:g} GiB: {e}")
                continue
            results["sizes"].append(size)
            pub = size.get("publish", {})
            results.update({k: pub[k] for k in ("torch", "torch_cuda", "safetensors") if k in pub})
            print(f"  {s:g} GiB done ({time.monotonic() - run.start:.0f} s)", flush=True)
        judge(run, results["sizes"])
    finally:
        if daemon is not None:
            daemon.stop()
    results["seconds"] = time.monotonic() - run.start
    print(summary(results))
    if a.out:
        write_json(a.out, results)
    if status:
        return status
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
