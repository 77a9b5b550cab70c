#!/usr/bin/env python3
"""One copy of a model's weights for N workers: starts the loader
(serve_weights.py), which publishes a small GPT's weights, then N worker
processes (worker.py) that attach them and generate tokens from the same
prompt; checks that every worker printed the loader's tokens, that a worker
expecting another revision is refused, and shows with `rmmctl buffers` that
the GPU holds one copy, held by the loader and every worker.

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/shared_weights/run.py [N]

N: the number of workers (default 2). rmmctl is $RMMD_RMMCTL, else the
one on PATH.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from model import NAME

HERE = Path(__file__).resolve().parent


def start(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / script), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def tokens_of(proc: subprocess.Popen) -> list[int]:
    """Echoes what `proc` prints up to its tokens line; returns the tokens."""
    for line in proc.stdout:
        print(line, end="", flush=True)
        who, _, rest = line.partition(": ")
        if rest.startswith("tokens "):
            return [int(t) for t in rest.split()[1:]]
    raise SystemExit(f"run: {proc.args[1]} ended (status {proc.wait()}) before printing its tokens")


def rmmctl(*args: str) -> str:
    program = os.environ.get("RMMD_RMMCTL") or shutil.which("rmmctl")
    if not program:
        raise SystemExit("run: no rmmctl: put it on PATH or name it in RMMD_RMMCTL")
    return subprocess.run([program, *args], check=True, capture_output=True, text=True).stdout


def main() -> int:
    workers_wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    loader = start("serve_weights.py")
    workers: list[subprocess.Popen] = []
    try:
        reference = tokens_of(loader)
        workers = [start("worker.py", str(i)) for i in range(workers_wanted)]
        same = [tokens_of(w) == reference for w in workers]
        print(f"run: {sum(same)} of {workers_wanted} workers generated the loader's tokens"
              + (": all the same" if all(same) else ": MISMATCH"), flush=True)

        guard = subprocess.run([sys.executable, str(HERE / "worker.py"), "99", "--revision", "another"],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True)
        print(guard.stdout, end="")
        refused = guard.returncode == 3
        print(f"run: a worker expecting another revision was {'refused' if refused else 'NOT refused'}",
              flush=True)

        print(rmmctl("buffers"), end="")
        listed = [b for b in json.loads(rmmctl("--json", "buffers")).get("buffers", []) if b["name"] == NAME]
        holders = int(listed[0]["holders"]) if len(listed) == 1 else 0
        one_copy = len(listed) == 1 and holders == 1 + workers_wanted
        print(f"run: one copy: {len(listed)} buffer named '{NAME}', {int(listed[0]['size']) / 2**20:.1f} MiB, "
              f"held by {holders} sessions (the loader and {workers_wanted} workers)" if listed else
              f"run: no buffer named '{NAME}' listed", flush=True)
    finally:
        for p in [*workers, loader]:
            p.stdin.close()  # each lets go of the weights and exits
        statuses = [p.wait(timeout=60) for p in [*workers, loader]]
    ok = all(same) and refused and one_copy and not any(statuses)
    print(f"run: {'ok' if ok else 'FAILED'}" + ("" if not any(statuses) else f" (exit statuses {statuses})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
