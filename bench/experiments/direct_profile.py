#!/usr/bin/env python3
"""Profiles the direct path alone, system-wide, for docs/benchmarks.md.

Starts rmmd on GPU 0 and N ``rmmd_bench --worker direct 256 SECONDS``
processes (section c's direct clients: 256 B pairs in a loop), lets them
warm up, then records ``perf record -a -g`` while they run. Section c's own
run mixes the fast and gRPC modes and process start-up into any profile;
this records only the direct pairs. Prints the pairs per second and writes
perf's reports to --out:

- ``by-process-and-object.txt``: where the CPU time went, by command
  (rmmd's threads, the clients) and shared object (kernel, nvidia, libcuda);
- ``by-symbol.txt``: by command, object and symbol (self time);
- ``inclusive.txt``: inclusive time by symbol, kernel call chains included.

Usage, on the GPU host, with a gpu-bundle of rmmd and rmmd_bench and one of
Debian's perf::

    bench/experiments/direct_profile.py --bin BUNDLE/bin --procs 16 \\
        --seconds 5 --out DIR --perf "env LD_LIBRARY_PATH=P/lib P/bin/perf"
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wait_for(what: str, ready, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"direct_profile: timed out waiting for {what}")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, type=Path, help="the directory of rmmd and rmmd_bench")
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--bytes", type=int, default=256)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--perf", default="perf", help="the perf command (words split like a shell's)")
    ap.add_argument("--frequency", type=int, default=999)
    ap.add_argument("--rmmd-arg", action="append", default=[], help="one more argument for rmmd")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    perf = shlex.split(a.perf)

    with tempfile.TemporaryDirectory(prefix="rmmd-direct-profile-") as run:
        env = dict(os.environ, RMMD_RUNTIME_DIR=run)
        daemon = subprocess.Popen(
            [str(a.bin / "rmmd"), "--backend=cuda", "--cuda-pool-bytes", "16GiB", "--runtime-dir", run,
             *a.rmmd_arg],
            env=env, stdout=subprocess.DEVNULL, stderr=open(a.out / "rmmd.log", "w"),
        )  # fmt: skip
        workers: list[subprocess.Popen[str]] = []
        try:
            wait_for("rmmd's session socket", lambda: Path(run, "rmmd-session.sock").exists())
            for _ in range(a.procs):
                workers.append(
                    subprocess.Popen(
                        [str(a.bin / "rmmd_bench"), "--worker", "direct", str(a.bytes), str(a.seconds)],
                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    )  # fmt: skip
                )
            for w in workers:
                line = w.stdout.readline().strip()  # type: ignore[union-attr]
                if line != "ready":
                    raise SystemExit(f"direct_profile: a worker said {line!r}, not 'ready'")
            data = a.out / "perf.data"
            recorder = subprocess.Popen(
                [*perf, "record", "-a", "-g", "-F", str(a.frequency), "-o", str(data), "--",
                 "sleep", str(a.seconds)],
                stdout=subprocess.DEVNULL, stderr=open(a.out / "perf-record.log", "w"),
            )  # fmt: skip
            time.sleep(0.3)  # perf is recording
            for w in workers:
                w.stdin.write("go\n")  # type: ignore[union-attr]
                w.stdin.flush()  # type: ignore[union-attr]
            pairs = 0
            for w in workers:
                said = w.stdout.readline().split()  # type: ignore[union-attr]  # done PAIRS NS
                if len(said) != 3 or said[0] != "done":
                    raise SystemExit(f"direct_profile: a worker said {' '.join(said)!r}")
                pairs += int(said[1])
            recorder.wait(timeout=a.seconds + 60)
        finally:
            for w in workers:
                w.kill()
            daemon.terminate()
            daemon.wait(timeout=30)
    rate = pairs / a.seconds
    print(f"direct_profile: {a.procs} direct processes, {a.bytes} B pairs: {pairs} pairs in "
          f"{a.seconds:g} s, {rate:.0f} pairs/s")  # fmt: skip
    reports = {
        "by-process-and-object.txt": ["--no-children", "--sort", "comm,dso", "-g", "none"],
        "by-symbol.txt": ["--no-children", "--sort", "comm,dso,sym", "-g", "none"],
        "inclusive.txt": ["--children", "--sort", "comm,sym", "-g", "none"],
    }
    for name, how in reports.items():
        with open(a.out / name, "w") as f:
            subprocess.run([*perf, "report", "-i", str(data), "--stdio", *how],
                           stdout=f, stderr=subprocess.DEVNULL, check=False)  # fmt: skip
    (a.out / "perf.data").unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
