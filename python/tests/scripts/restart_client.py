"""Client processes for test_restart_gpu.py, which SIGKILLs and restarts rmmd
while they run (RMMD_RUNTIME_DIR names the daemon). Each prints lines of
JSON.

  publish NAME           (CuPy) a persistent buffer on GPU 0 of two float32
                         tensors, "w" (1024 x 1024) and "x" (1024 x 64), from
                         a fixed seed, with a manifest (labels: LABELS);
                         says its digest; exits (the buffer stays)
  consume NAME           (CuPy) opens NAME (expecting LABELS) in a session
                         that reconnects, every temporary from rmmd (direct
                         mode: each one a call to the daemon), and computes
                         its digest over and over; on a line "tick" says how
                         far it got, on "stop" closes everything and says
                         its last word
  check NAME             (CuPy) opens NAME by name and says its digest
  train STEPS GAP C...   (PyTorch) a small MLP on an rmmd MemPool: STEPS
                         steps from fixed seeds without a pause (the
                         reference), then (after a line on stdin) the same
                         STEPS again where at each
                         step C it says {"step": C} and goes on, and at
                         step C + GAP waits for a line on stdin (the daemon
                         was restarted), then takes a tensor larger than
                         anything cached from rmmd (the new daemon) and
                         checks it; says both runs' losses as float32 bit
                         patterns; on a line of stdin lets go of everything
                         and says what rmmd still lends it

A digest: the sum of the tensor's 32-bit words as unsigned integers, and
the sum of each word times its index + 1 (both mod 2**64), for "w" and for
"w @ x": equal digests, equal bytes for every purpose of the test.
"""

from __future__ import annotations

import json
import os
import select
import struct
import sys

LABELS = {"model": "restart-mlp", "revision": "r27"}
W_SHAPE = (1024, 1024)
X_SHAPE = (1024, 64)


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


# ---- CuPy -------------------------------------------------------------------


def digest(cupy, a) -> list[int]:  # type: ignore[no-untyped-def]
    words = a.ravel().view(cupy.uint32).astype(cupy.uint64)
    index = cupy.arange(1, words.size + 1, dtype=cupy.uint64)
    return [int(words.sum(dtype=cupy.uint64)), int((words * index).sum(dtype=cupy.uint64))]


def buffer_digest(cupy, tensors) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    w, x = tensors["w"], tensors["x"]
    return {"w": digest(cupy, w), "w@x": digest(cupy, w @ x)}


def publish(name: str) -> None:
    import cupy

    import rmmd

    session = rmmd.Session(client_name="restart-publisher")
    w_bytes = W_SHAPE[0] * W_SHAPE[1] * 4
    entries = [
        rmmd.TensorEntry("w", "float32", W_SHAPE, 0),
        rmmd.TensorEntry("x", "float32", X_SHAPE, w_bytes),
    ]
    nbytes = w_bytes + X_SHAPE[0] * X_SHAPE[1] * 4
    buf = rmmd.SharedBuffer.create(session, name, nbytes, device=0, persistent=True)
    buf.set_manifest(entries, LABELS)
    t = buf.tensors("cupy")
    rng = cupy.random.default_rng(27)
    t["w"][...] = rng.standard_normal(W_SHAPE, dtype=cupy.float32) / 32
    t["x"][...] = rng.standard_normal(X_SHAPE, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    said = buffer_digest(cupy, t)
    buf.publish()
    del t
    buf.close()
    session.close()
    say(published=name, digest=said, nbytes=nbytes)


def consume(name: str) -> None:
    import cupy

    import rmmd
    from rmmd.allocators.cupy import rmmd_allocator

    reconnects: list[int] = []
    session = rmmd.Session(client_name="restart-consumer", reconnect=60.0,
                           on_reconnect=lambda i: reconnects.append(i.reconnects))
    allocate = rmmd_allocator(session, mode="direct")
    cupy.cuda.set_allocator(allocate)
    buf = rmmd.SharedBuffer.open(session, name, expect=LABELS)
    tensors = buf.tensors("cupy")
    first = buffer_digest(cupy, tensors)
    iterations, differing = 1, 0
    say(opened=name, digest=first, pid=os.getpid())
    while True:
        if select.select([sys.stdin], [], [], 0)[0]:
            line = sys.stdin.readline().strip()
            if line == "tick":
                say(iterations=iterations, differing=differing, reconnects=session.reconnects,
                    told=len(reconnects))
            elif line in ("stop", ""):
                break
        if buffer_digest(cupy, tensors) != first:
            differing += 1
        iterations += 1
    last = buffer_digest(cupy, tensors)
    del tensors
    buf.close()
    cupy.cuda.Device().synchronize()
    held = allocate.resources[0].stats().allocated_bytes
    say(iterations=iterations, differing=differing, same_at_end=last == first,
        reconnects=session.reconnects, told=len(reconnects), rmmd_bytes_held=held)


def check(name: str) -> None:
    import cupy

    import rmmd

    with rmmd.Session(client_name="restart-check") as session:
        with rmmd.SharedBuffer.open(session, name, expect=LABELS) as buf:
            t = buf.tensors("cupy")
            said = buffer_digest(cupy, t)
            labels = {k: v for k, v in buf.labels.items() if not k.startswith("rmmd.")}
            del t
        say(digest=said, labels=labels)


# ---- PyTorch ------------------------------------------------------------------


def float_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def train(steps: int, gap: int, checkpoints: list[int]) -> None:
    # cuBLAS is deterministic with a fixed workspace (before it starts).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    from rmmd.allocators import torch as rmmd_torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    pool = rmmd_torch.rmmd_mem_pool(mode="slab")

    def run(pause: bool) -> list[int]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
            torch.nn.Linear(512, 10),
        ).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator(device="cpu").manual_seed(1)
        losses = []
        for step in range(steps):
            if pause and step in checkpoints:
                say(step=step)  # the test kills rmmd now, while this goes on
            if pause and step - gap in checkpoints:
                sys.stdin.readline()  # the daemon was started again
                r = checkpoints.index(step - gap) + 1
                # Larger than anything PyTorch's cache holds: from rmmd,
                # through the session that reconnects to the new daemon.
                fresh = torch.full((r * (24 << 20),), float(r), device="cuda")  # r * 96 MiB
                ok = bool((fresh[:: 1 << 20] == r).all())
                say(round=r, fresh_ok=ok, fresh_bytes=fresh.numel() * 4)
                del fresh
            x = torch.randn(64, 256, generator=gen).cuda()
            y = torch.randint(0, 10, (64,), generator=gen).cuda()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float_bits(loss.item()))
        return losses

    with rmmd_torch.use_mem_pool(pool):
        reference = run(pause=False)
        say(pid=os.getpid(), ready=True)
        sys.stdin.readline()  # go
        losses = run(pause=True)
    torch.cuda.synchronize()
    say(losses=losses, reference=reference)
    sys.stdin.readline()
    del pool
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    say(done=True, rmmd_stats=rmmd_torch.memory_stats(0))


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "publish":
        publish(argv[1])
    elif cmd == "consume":
        consume(argv[1])
    elif cmd == "check":
        check(argv[1])
    elif cmd == "train":
        train(int(argv[1]), int(argv[2]), [int(c) for c in argv[3:]])
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
