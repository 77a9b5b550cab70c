"""``python -m rmmd``: commands for operators.

    python -m rmmd publish DIR --name NAME [--devices 0,1] [--tp N] [--plan llama|FILE]
                              [--label k=v ...] [--persistent] [--pool POOL]
                              [--io auto|direct|buffered] [--readers N] [--chunk-mib N]
                              [--runtime-dir DIR] [--json]

``publish`` publishes a safetensors checkpoint (a Hugging Face model
directory or one file) as rmmd.safetensors.publish_dir does, showing a
progress line on a terminal, then one line per shard (bytes, time, GiB/s,
how it was read) and the buffers made. Without ``--persistent`` the
buffers live as long as the command: it holds them until interrupted
(Ctrl-C, SIGTERM). ``--json`` prints the result as one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any, Sequence

GIB = 1 << 30


def _labels(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"rmmd publish: --label takes KEY=VALUE, not {item!r}")
        out[key] = value
    return out


def _devices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise SystemExit(f"rmmd publish: --devices takes CUDA ordinals like 0,1, not {text!r}") from None


class _ProgressLine:
    """One line on stderr, rewritten in place on a terminal (at most 10 times a second)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, stats: Any, shard: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        done = sum(s.done_bytes for s in stats.shards)
        if now - self.last < 0.1 and done < self.total:
            return
        self.last = now
        width = 30
        filled = int(width * done / self.total) if self.total else width
        rate = done / GIB / max(now - self.t0, 1e-9)
        shards_done = sum(1 for s in stats.shards if s.finished)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done / GIB:6.2f}/{self.total / GIB:.2f} GiB "
            f"{rate:6.2f} GiB/s  shards {shards_done}/{len(stats.shards)}"
        )
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def publish(a: argparse.Namespace) -> int:
    import rmmd
    import rmmd.safetensors
    import rmmd.tp

    ckpt = rmmd.safetensors.read_checkpoint(a.dir)
    session = rmmd.Session(runtime_dir=a.runtime_dir, client_name="rmmd publish")
    line = _ProgressLine(ckpt.data_bytes, sys.stderr.isatty() and not a.json)
    t0 = time.perf_counter()
    published = rmmd.safetensors.publish_dir(
        a.dir,
        a.name,
        session=session,
        devices=_devices(a.devices),
        tp=a.tp,
        plan=a.plan if a.tp > 1 else None,
        labels=_labels(a.label),
        pool=a.pool,
        persistent=a.persistent,
        chunk_bytes=a.chunk_mib << 20,
        readers=a.readers,
        io=a.io,
        progress=line,
    )
    seconds = time.perf_counter() - t0
    line.end()
    stats = published.stats
    result = {
        "name": a.name,
        "buffers": [
            {"name": b.name, "device": d, "rank": r, "bytes": b.nbytes, "tensors": len(b.manifest)}
            for b, d, r in zip(published.buffers, published.devices, published.ranks)
        ],
        "persistent": a.persistent,
        "seconds": seconds,
        "load": stats.as_dict(),
        "labels": published.labels,
    }
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{ckpt.path}: {len(ckpt.files)} shard(s), {ckpt.data_bytes / GIB:.2f} GiB, "
              f"{a.readers or rmmd.safetensors.default_readers()} readers, {stats.chunk_bytes >> 20} MiB reads, "
              f"staging in {stats.staging}")
        for i, s in enumerate(stats.shards, 1):
            cached = "" if s.cached is None else f", {s.cached:.0%} cached"
            print(f"  shard {i}/{len(stats.shards)} {s.path.rsplit('/', 1)[-1]}: {s.nbytes / GIB:.2f} GiB "
                  f"in {s.seconds:.2f} s ({s.gib_per_s:.2f} GiB/s, {s.io}{cached})")
        print(f"read {stats.nbytes / GIB:.2f} GiB in {stats.seconds:.2f} s ({stats.gib_per_s:.2f} GiB/s); "
              f"published in {seconds:.2f} s:")
        for b in result["buffers"]:
            where = "host" if b["device"] is None else f"GPU {b['device']}"
            rank = f" rank {b['rank']}/{a.tp}" if a.tp > 1 else ""
            print(f"  {b['name']}{rank} on {where}: {b['bytes'] / GIB:.2f} GiB, {b['tensors']} tensors")
    sys.stdout.flush()
    if not a.persistent:
        _hold(published, quiet=a.json)
    published.close()
    session.close()
    return 0


def _hold(published: Any, quiet: bool) -> None:
    """Holds the buffers until SIGINT or SIGTERM."""
    done = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not quiet:
        print("holding the buffers (not persistent) until interrupted (Ctrl-C)", flush=True)
    while not done.wait(1.0):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmmd", description="rmmd commands for operators")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("publish", help="publish a safetensors checkpoint (a model directory or a file)")
    p.add_argument("dir", help="the checkpoint: a Hugging Face model directory, or a .safetensors file")
    p.add_argument("--name", required=True, help="the buffer's name (NAME/rank<r> or NAME/gpu<d> for several)")
    p.add_argument("--devices", help="GPUs, as 0,1,... (tp > 1: one per rank; default: 0..tp-1, or the current)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--plan", default="llama", help="rank plan: a name (llama) or a JSON file (default llama)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a label (repeat)")
    p.add_argument("--persistent", action="store_true", help="keep the buffers after this command ends")
    p.add_argument("--pool", help="a pool by name instead of GPUs (a host pool)")
    p.add_argument("--io", default="auto", choices=("auto", "direct", "buffered"),
                   help="O_DIRECT or the page cache (auto: O_DIRECT for files mostly not cached)")
    p.add_argument("--readers", type=int, help="reader threads (default 8, fewer on a small machine)")
    p.add_argument("--chunk-mib", type=int, default=32, help="the size of one read, MiB (default 32)")
    p.add_argument("--runtime-dir", help="the daemon's runtime directory (default $RMMD_RUNTIME_DIR or /run/rmmd)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = parser.parse_args(argv)
    import rmmd

    try:
        return publish(a)
    except (rmmd.Error, OSError) as e:
        print(f"rmmd publish: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
