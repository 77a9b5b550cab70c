#!/usr/bin/env python3
"""Loading a sharded checkpoint to the GPU, side by side: rmmd's publish
against safetensors, fastsafetensors and runai-model-streamer (0.17.1: PyPI has no 0.17.0 wheel), with a raw
read of the same files as the storage's ceiling, cold and warm.

  python bench/python/checkpoint_bench.py [--size-gib 20] [--shards 4] [--dir DIR]
        [--loaders raw-direct,raw-buffered,safetensors,fastsafetensors,runai,rmmd,rmmd-direct,rmmd-buffered]
        [--cache cold,warm] [--rounds 1] [--tp N] [--rmmd PATH | --runtime-dir DIR] [--out FILE.json]

The run writes a checkpoint directory of --size-gib GiB in --shards files
(model-0000k-of-0000n.safetensors, the index, config.json; bf16 tensors of
random bytes named as a Llama's, 256 MiB each) under --dir (default
$TMPDIR), unless one of that size is there. Each loader then runs in a
fresh process (python this-file --worker ...), timed there from after its
imports and CUDA context to every byte on GPU 0 (synchronized):

  raw-direct       the files read in 64 MiB O_DIRECT reads, one after the other (dd iflag=direct)
  raw-buffered     the same through the page cache
  safetensors      safetensors.torch.load_file(shard, device="cuda:0") per shard
  fastsafetensors  SafeTensorsFileLoader (nogds) copy_files_to_device, every tensor got
  runai            runai_model_streamer.SafetensorsStreamer, each tensor .to("cuda:0")
  rmmd             rmmd.safetensors.publish_dir(devices=[0]) (io auto)
  rmmd-direct, rmmd-buffered   the same with io forced
  rmmd-tp          publish_dir(tp=--tp, devices 0..tp-1) (with --tp > 1 and that many GPUs)

cold: each file's pages dropped first (fsync + posix_fadvise DONTNEED, and
`echo 1 > /proc/sys/vm/drop_caches` when run as root), the cached fraction
measured after (mincore); warm: every file read through first. The order of
the loaders turns each round (round 2 runs them backwards). Loaders whose
package is missing are skipped, saying so.

JSON (--out, and the last line printed): the machine, the storage (file
system, device, free space), and per cache mode and loader the seconds,
GiB/s and cached fraction of each run; then the issue's targets: rmmd at
least 1.0x the fastest peer, cold at least 0.9x raw-direct's (or the faster
raw read's). A missed target is a result, printed as MISS.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench_common import PACKAGE_DIR, REPO, Daemon, target_line
from weight_set import drop_from_page_cache, read_through

GIB = 1 << 30
TENSOR_BYTES = 256 << 20
ALL_LOADERS = ["raw-direct", "raw-buffered", "safetensors", "fastsafetensors", "runai", "rmmd", "rmmd-direct",
               "rmmd-buffered", "rmmd-tp"]
PEERS = ["safetensors", "fastsafetensors", "runai"]
NEEDS = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors", "runai": "runai_model_streamer"}

if str(PACKAGE_DIR) not in sys.path:
    sys.path.insert(0, str(PACKAGE_DIR))


# ---- the checkpoint -----------------------------------------------------------


def write_checkpoint(directory: Path, size_gib: float, shards: int) -> list[Path]:
    import numpy as np

    tensors = max(shards, int(size_gib * GIB) // TENSOR_BYTES)
    per_shard = -(-tensors // shards)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(38)
    # random bits, with the exponent kept finite (NaNs would not matter for speed)
    blocks = [rng.integers(0, 1 << 16, TENSOR_BYTES // 2, dtype=np.uint16) & 0xBFFF for _ in range(4)]
    weight_map = {}
    files = []
    names = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "self_attn.q_proj"]
    for k in range(shards):
        file = directory / f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        count = min(per_shard, tensors - k * per_shard)
        for i in range(count):
            n = k * per_shard + i
            shape = [8192, 16384] if names[n % 4] != "mlp.down_proj" else [16384, 8192]
            name = f"model.layers.{n // 4}.{names[n % 4]}.weight"
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [i * TENSOR_BYTES, (i + 1) * TENSOR_BYTES]}
            weight_map[name] = file.name
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(file, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            for i in range(count):
                # Four blocks of random bits made once (drawing 20 GiB took most of a minute), each
                # tensor one of them with its own first word: no file system here compresses or
                # dedups, and the loaders' speed does not depend on the values.
                block = blocks[(k * per_shard + i) % len(blocks)]
                block[0] = (k * per_shard + i) & 0xBFFF
                f.write(block.tobytes())
            f.flush()
            os.fsync(f.fileno())
        files.append(file)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "bench": "checkpoint_bench"}))
    (directory / "DONE").write_text(f"{size_gib} {shards}")
    return files


def drop(files: list[Path]) -> None:
    """Each file's pages out of the page cache; as root, the clean page cache too."""
    for f in files:
        drop_from_page_cache(f)
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError:
            pass


def read_all_through(files: list[Path]) -> None:
    """Every file read once, so its pages sit in the page cache (warm)."""
    for f in files:
        read_through(f)


def cached(files: list[Path]) -> float:
    from rmmd._loader import cached_fraction

    total = done = 0
    for f in files:
        size = f.stat().st_size
        fd = os.open(f, os.O_RDONLY)
        try:
            c = cached_fraction(fd, size) or 0.0
        finally:
            os.close(fd)
        total += size
        done += c * size
    return done / total if total else 0.0


# ---- the workers (each a fresh process) ---------------------------------------


def raw_read(files: list[str], direct: bool) -> None:
    import mmap

    block = 64 << 20
    m = mmap.mmap(-1, block)
    view = memoryview(m)
    for f in files:
        fd = os.open(f, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            offset = 0
            while True:
                n = os.preadv(fd, [view], offset)
                offset += n
                if n < block:
                    break
        finally:
            os.close(fd)


def worker(a: argparse.Namespace) -> None:
    files = sorted(str(p) for p in Path(a.dir).glob("*.safetensors"))
    loader = a.worker
    torch = None
    if not loader.startswith("raw"):
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda:0")
    if loader == "safetensors":
        from safetensors.torch import load_file
    elif loader == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader
    elif loader == "runai":
        from runai_model_streamer import SafetensorsStreamer
    elif loader.startswith("rmmd"):
        import rmmd
        import rmmd.safetensors

        session = rmmd.Session(runtime_dir=a.runtime_dir, client_name="checkpoint-bench")
    keep: list[Any] = []
    t0 = time.perf_counter()
    if loader in ("raw-direct", "raw-buffered"):
        raw_read(files, loader == "raw-direct")
    elif loader == "safetensors":
        for f in files:
            keep.append(load_file(f, device="cuda:0"))
    elif loader == "fastsafetensors":
        fl = SafeTensorsFileLoader(None, "cuda:0", nogds=True)  # the GPU host has no GDS
        fl.add_filenames({0: files})
        fb = fl.copy_files_to_device()
        keep.append({k: fb.get_tensor(k) for k in fl.get_keys()})
    elif loader == "runai":
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            keep.append({name: t.to("cuda:0", non_blocking=False) for name, t in streamer.get_tensors()})
    elif loader.startswith("rmmd"):
        io = {"rmmd-direct": "direct", "rmmd-buffered": "buffered"}.get(loader, "auto")
        tp = a.tp if loader == "rmmd-tp" else 1
        devices = list(range(tp)) if tp > 1 else [0]
        # RMMD_BENCH_READERS, RMMD_BENCH_CHUNK_MIB: other reader counts and read
        # sizes than publish_dir's defaults, to sweep them.
        tuning: dict[str, int] = {}
        if os.environ.get("RMMD_BENCH_READERS"):
            tuning["readers"] = int(os.environ["RMMD_BENCH_READERS"])
        if os.environ.get("RMMD_BENCH_CHUNK_MIB"):
            tuning["chunk_bytes"] = int(os.environ["RMMD_BENCH_CHUNK_MIB"]) << 20
        published = rmmd.safetensors.publish_dir(a.dir, f"bench/{loader}-{os.getpid()}", session=session,
                                                 devices=devices, tp=tp, io=io, **tuning)
        keep.append(published)
    if torch is not None:
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"seconds": seconds, "bytes": sum(os.path.getsize(f) for f in files)}
    if loader.startswith("rmmd"):
        out["load"] = keep[0].stats.as_dict()
        keep[0].close()
    print(json.dumps(out), flush=True)


# ---- the driver ---------------------------------------------------------------


def start_daemon(rmmd_path: str, pool_bytes: int) -> Daemon:
    """rmmd with a CUDA pool of `pool_bytes`; exits the bench where it does not start."""
    try:
        return Daemon(rmmd_path, ["--backend", "cuda", "--cuda-pool-bytes", str(pool_bytes), "--drain-timeout-ms", "0"],
                      "rmmd-ckpt-bench-")
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def storage(directory: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"dir": str(directory)}
    try:
        df = subprocess.run(["df", "-T", "-B1", str(directory)], capture_output=True, text=True).stdout.splitlines()[-1]
        dev, fstype, size, used, free = df.split()[:5]
        out.update({"device": dev, "fs": fstype, "size_bytes": int(size), "free_bytes": int(free)})
    except (OSError, ValueError, IndexError):
        pass
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-gib", type=float, default=20.0)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    p.add_argument("--loaders", default=",".join(ALL_LOADERS))
    p.add_argument("--cache", default="cold,warm")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tp", type=int, default=0, help="rmmd-tp's ranks (default: every GPU, if 2 or more)")
    p.add_argument("--rmmd", default=os.environ.get("RMMD_DAEMON", str(REPO / "build" / "daemon" / "rmmd")))
    p.add_argument("--runtime-dir")
    p.add_argument("--out")
    p.add_argument("--worker")
    a = p.parse_args()
    if a.worker:
        worker(a)
        return 0
    import importlib.util

    directory = Path(a.dir) / f"rmmd-ckpt-{a.size_gib:g}g-{a.shards}"
    t0 = time.perf_counter()
    if not (directory / "DONE").exists():
        print(f"writing {a.size_gib:g} GiB in {a.shards} shards to {directory} ...", flush=True)
        write_checkpoint(directory, a.size_gib, a.shards)
    written_s = time.perf_counter() - t0
    files = sorted(directory.glob("*.safetensors"))
    nbytes = sum(f.stat().st_size for f in files)
    gpus = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True).stdout.strip() or 0)
    tp = a.tp or (gpus if gpus >= 2 else 0)
    loaders = []
    skipped = {}
    for name in a.loaders.split(","):
        if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
            skipped[name] = f"{NEEDS[name]} is not installed"
        elif name == "rmmd-tp" and tp < 2:
            skipped[name] = f"needs 2+ GPUs (this machine has {gpus})"
        else:
            loaders.append(name)
    daemon = None
    runtime = a.runtime_dir
    if runtime is None and any(n.startswith("rmmd") for n in loaders):
        daemon = start_daemon(a.rmmd, int(nbytes * 1.25) + 2 * GIB)
        runtime = daemon.runtime
    results: dict[str, Any] = {
        "machine": {"host": socket.gethostname(), "gpus": gpus, "cpus": os.cpu_count(), "root": os.geteuid() == 0},
        "storage": storage(directory),
        "checkpoint": {"bytes": nbytes, "shards": len(files), "written_s": written_s},
        "skipped": skipped,
        "runs": {},
    }
    try:
        for mode in a.cache.split(","):
            for r in range(a.rounds):
                order = loaders if r % 2 == 0 else list(reversed(loaders))
                for name in order:
                    if mode == "cold":
                        drop(files)
                    else:
                        read_all_through(files)
                    before = cached(files)
                    cmd = [sys.executable, __file__, "--worker", name, "--dir", str(directory),
                           "--runtime-dir", runtime or "", "--tp", str(tp)]
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                    entry: dict[str, Any] = {"cached_before": before}
                    if out.returncode != 0:
                        entry["error"] = out.stderr.strip().splitlines()[-3:]
                    else:
                        got = json.loads(out.stdout.strip().splitlines()[-1])
                        entry.update(got)
                        entry["gib_per_s"] = got["bytes"] / GIB / got["seconds"]
                    results["runs"].setdefault(mode, {}).setdefault(name, []).append(entry)
                    rate = f"{entry['gib_per_s']:.2f} GiB/s in {entry['seconds']:.2f} s" if "seconds" in entry else f"FAILED {entry['error']}"
                    print(f"{mode:4} {name:16} {rate}  (cached before: {before:.0%})", flush=True)
                    load = entry.get("load") or {}
                    if load.get("phases"):
                        # rmmd: the reads and copies, and each step besides them (seconds)
                        steps = ", ".join(f"{k} {v:.3f}" for k, v in load["phases"].items())
                        print(f"{'':21} reads and copies {load['seconds']:.3f}; {steps}", flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
    results["targets"] = judge(results)
    for t in results["targets"]:
        print(target_line(t, f"{t['value']:.2f}", f">= {t['limit']}"))
    text = json.dumps(results)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))
    print(text)
    return 0


def best(results: dict[str, Any], mode: str, name: str) -> float | None:
    runs = [r["gib_per_s"] for r in results["runs"].get(mode, {}).get(name, []) if "gib_per_s" in r]
    return max(runs) if runs else None


def judge(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mode in results["runs"]:
        ours = max((v for v in (best(results, mode, n) for n in ("rmmd", "rmmd-direct", "rmmd-buffered")) if v),
                   default=None)
        auto = best(results, mode, "rmmd")
        peers = [v for v in (best(results, mode, n) for n in PEERS) if v]
        if auto and peers:
            out.append({"what": f"{mode}: rmmd (io auto) / the fastest peer", "value": auto / max(peers), "limit": 1.0,
                        "pass": auto / max(peers) >= 1.0})
        raw = [v for v in (best(results, mode, n) for n in ("raw-direct", "raw-buffered")) if v]
        if mode == "cold" and auto and raw:
            out.append({"what": "cold: rmmd (io auto) / the faster raw read", "value": auto / max(raw), "limit": 0.9,
                        "pass": auto / max(raw) >= 0.9})
        tp = best(results, mode, "rmmd-tp")
        if mode == "cold" and tp and raw:
            out.append({"what": "cold: rmmd-tp / the faster raw read", "value": tp / max(raw), "limit": 0.9,
                        "pass": tp / max(raw) >= 0.9})
        if ours and auto and ours > auto * 1.05:
            out.append({"what": f"{mode}: rmmd io auto / the best forced io", "value": auto / ours, "limit": 0.95,
                        "pass": False})
    return out


if __name__ == "__main__":
    sys.exit(main())
