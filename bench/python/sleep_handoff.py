#!/usr/bin/env python3
"""The other process of sleep_bench.py's handoff: started before the
engine pauses, with its CUDA context made, it waits for a word on stdin
and then allocates the bytes the pause freed, and says when they were
served (CLOCK_MONOTONIC, which the engine's clock shares).

  python sleep_handoff.py --kind rmmd|torch --bytes N [--room N]

rmmd: the allocation comes from the daemon of $RMMD_RUNTIME_DIR (a session
of its own, direct mode). torch: torch.empty, after this process filled
the device but for --room bytes, so that only memory the engine frees can
serve it. Line protocol (one JSON object a line on stdout): {"ready": ...}
at start; then, for each line on stdin, "probe" (try the allocation now:
{"refused": ...}), "go" (allocate and write it: {"served": t, "written": t}
or {"error": ...}), "free" ({"freed": true}), "exit".

Taker (imported by sleep_bench.py) starts one, as another user where
asked, and asks it, each answer awaited with a deadline.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

MIB = 1 << 20


# ---- talking to child processes ------------------------------------------------


class JsonLines:
    """The JSON objects a child prints, one a line (other lines skipped),
    each awaited with a deadline (os.read on the pipe: nothing waits in a
    buffer that select cannot see)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    if line.startswith(b"{"):
                        return json.loads(line)
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError(f"{what}: nothing after {timeout:.0f} s")
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"{what}: the process ended (status {self.proc.wait()})")
                self.buffer += chunk


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def as_user(user: str | None, argv: list[str], env: dict[str, str]) -> list[str]:
    """`argv` run as `user` (None: as this process), with the variables a
    worker needs passed on explicitly (runuser resets some)."""
    if not user:
        return argv
    keep = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "RMMD_LIBRARY", "RMMD_RUNTIME_DIR", "CUDA_VISIBLE_DEVICES",
            "PYTHONUNBUFFERED")
    passed = [f"{k}={env[k]}" for k in keep if k in env]
    if shutil.which("runuser"):
        prefix = ["runuser", "-u", user, "--"]
    else:
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"]
    return [*prefix, "env", "HOME=/tmp", *passed, *argv]


# ---- the taker: another process that wants the freed memory ---------------------


def _torch_ballast(torch: Any, room: int) -> tuple[Any, int]:
    """Fills the device but for about `room` bytes; returns the ballast and
    the free bytes left."""
    free, _ = torch.cuda.mem_get_info()
    size = free - room
    for _ in range(16):
        if size <= 0:
            return None, free
        try:
            ballast = torch.empty(size, dtype=torch.uint8, device="cuda")
            return ballast, torch.cuda.mem_get_info()[0]
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            size -= 128 * MIB
    return None, torch.cuda.mem_get_info()[0]


def taker_worker(kind: str, nbytes: int, room: int) -> None:
    """The protocol of this file's docstring, on stdin and stdout."""
    import torch

    torch.cuda.set_device(0)
    torch.empty(1, device="cuda")  # the context, before any clock starts
    said: dict[str, Any] = {"ready": True, "uid": os.getuid(), "kind": kind}
    if kind == "rmmd":
        import rmmd

        mr = rmmd.Session(client_name="sleep-bench-taker").device_resource(0, mode="direct")
        take: Callable[[], Any] = lambda: mr.allocation(nbytes)  # noqa: E731
        view: Callable[[Any], Any] = torch.from_dlpack
        give: Callable[[Any], None] = lambda held: held.free()  # noqa: E731
    else:
        ballast, said["free_after_ballast_bytes"] = _torch_ballast(torch, room)
        said["ballast_bytes"] = 0 if ballast is None else ballast.numel()
        take = lambda: torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # noqa: E731
        view = lambda held: held  # noqa: E731
        give = lambda held: None  # noqa: E731
    emit(said)
    held = None
    for line in sys.stdin:
        command = line.strip()
        if command == "probe":
            try:
                probe = take()
                give(probe)
                del probe
                emit({"refused": False})
            except Exception as e:  # noqa: BLE001 (refused is the expected answer)
                emit({"refused": True, "why": f"{type(e).__name__}: {str(e)[:300]}"})
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        elif command == "go":
            try:
                held = take()
                served = time.monotonic()
                written_view = view(held)
                written_view.fill_(7)
                torch.cuda.synchronize()
                written = time.monotonic()
                del written_view
                emit({"served": served, "written": written})
            except Exception as e:  # noqa: BLE001 (a refusal is a result)
                emit({"error": f"{type(e).__name__}: {str(e)[:300]}"})
        elif command == "free":
            if held is not None:
                give(held)
                held = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            emit({"freed": True})
        elif command == "exit":
            break


class Taker:
    """A taker process and its questions (each answer within `timeout`)."""

    def __init__(self, kind: str, nbytes: int, room: int, user: str | None, timeout: float = 300) -> None:
        env = dict(os.environ)
        # A preloaded engine's taker is a plain PyTorch process.
        kept = [p for p in env.pop("LD_PRELOAD", "").split(":") if p and "torch_memory_saver" not in p]
        if kept:
            env["LD_PRELOAD"] = ":".join(kept)
        argv = [sys.executable, os.path.abspath(__file__), "--kind", kind, "--bytes", str(nbytes), "--room", str(room)]
        self.timeout = timeout
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(as_user(user, argv, env), env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr)
        self.lines = JsonLines(self.proc)
        self.ready = self.call(lambda: self.lines.next(timeout, f"the {kind} taker's start"))

    def call(self, step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`step`, or its error with the end of the taker's stderr."""
        try:
            return step()
        except (OSError, RuntimeError, TimeoutError) as e:
            self.stderr.seek(0)
            raise RuntimeError(f"{e}; its stderr ends: {self.stderr.read()[-1500:].decode(errors='replace')}") from e

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None

        def step() -> dict[str, Any]:
            self.proc.stdin.write(command.encode() + b"\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            return self.lines.next(self.timeout, f"the taker's answer to {command!r}")

        return self.call(step)

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"exit\n")
            self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--kind", choices=["rmmd", "torch"], required=True)
    p.add_argument("--bytes", type=int, required=True, help="what to allocate at 'go'")
    p.add_argument("--room", type=int, default=0, help="torch: the free bytes to leave when filling the device")
    a = p.parse_args()
    faulthandler.enable()  # a crash shows its Python stack in the taker's stderr
    taker_worker(a.kind, a.bytes, a.room)
    return 0


if __name__ == "__main__":
    sys.exit(main())
