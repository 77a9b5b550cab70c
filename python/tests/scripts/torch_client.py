"""A PyTorch client process for the GPU tests (RMMD_RUNTIME_DIR names the
daemon). Prints one line of JSON when it has done its part; `hold` and
`produce` then wait for a line on stdin.

  hold WAY MODE MIB        a MIB-MiB tensor through rmmd; wait; exit
  train WAY MODE STEPS     a small transformer's losses (WAY default: PyTorch's own allocator)
  oom WAY MODE GIB         ask for more than the pool has; say what happened
  leave WAY MODE [raise]   allocate and compute, then exit (or raise) without cleaning up
  produce NAME MIB         a shared buffer on GPU 0 filled by PyTorch through DLPack
  graph WAY MODE REPLAYS   a small model's forward and backward captured by torch.cuda.graph
                           (into the rmmd MemPool for WAY mempool), replayed REPLAYS times;
                           its losses and gradients, and rmmd's live bytes before and after
  restarts WAY MODE N      a tensor through rmmd, then N times: a line on stdin (the daemon
                           was restarted), the tensor checked and written, a new one made
                           (round R: R * 96 MiB, from the new daemon) and computed with;
                           one line of JSON each

WAY: mempool (a torch.cuda.MemPool over rmmd) or allocator (rmmd for the
whole process); MODE: slab or direct.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import torch

import rmmd
from rmmd.allocators import torch as rmmd_torch


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def with_rmmd(way: str, mode: str):  # type: ignore[no-untyped-def]
    """A context manager under which tensors come from rmmd."""
    import contextlib

    if way == "allocator":
        rmmd_torch.use_rmmd_as_allocator(mode=mode)
        return contextlib.nullcontext()
    if way == "mempool":
        pool = rmmd_torch.rmmd_mem_pool(mode=mode)
        globals()["_pool"] = pool  # alive as long as its tensors
        return rmmd_torch.use_mem_pool(pool)  # backward passes included
    if way == "default":
        return contextlib.nullcontext()
    raise SystemExit(f"unknown way {way}")


def train(steps: int) -> list[float]:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=2), torch.nn.Linear(128, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 64, 128, generator=gen).cuda()
        y = torch.randint(0, 10, (16, 64), generator=gen).cuda()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 10), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def clear_cublas_workspaces() -> None:
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def graph(way: str, mode: str, replays: int) -> dict[str, object]:
    """Forward and backward of a small MLP captured once and replayed; every
    replay's loss and the last replay's gradients, as exact bit patterns."""
    import gc

    torch.manual_seed(0)
    pool = globals().get("_pool")
    # PyTorch captures into a MemPool given to torch.cuda.graph(pool=...),
    # and refuses one that use_mem_pool already routes to: the model and the
    # warm-up use the pool through use_mem_pool, the capture through pool=.
    with with_pool(pool):
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(),
            torch.nn.Linear(128, 10),
        ).cuda()
        gen = torch.Generator(device="cpu").manual_seed(1)
        static_x = torch.randn(32, 64, generator=gen).cuda()
        static_y = torch.randint(0, 10, (32,), generator=gen).cuda()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up, as torch.cuda.graphs asks
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(static_x), static_y).backward()
        torch.cuda.current_stream().wait_stream(side)
        model.zero_grad(set_to_none=True)
    clear_cublas_workspaces()
    torch.cuda.synchronize()
    before = rmmd_torch.memory_stats(0)["allocated_bytes"] if way != "default" else 0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id if pool is not None else None):
        static_loss = torch.nn.functional.cross_entropy(model(static_x), static_y)
        static_loss.backward()
    losses = []
    for _ in range(replays):
        static_x.copy_(torch.randn(32, 64, generator=gen))
        static_y.copy_(torch.randint(0, 10, (32,), generator=gen))
        g.replay()
        losses.append(static_loss.item().hex())
    grads = [p.grad.detach().cpu().contiguous().view(torch.int32).tolist() for p in model.parameters()]
    # The graph and what it made go; what it held goes back to rmmd.
    del g, static_loss
    model.zero_grad(set_to_none=True)
    gc.collect()
    clear_cublas_workspaces()
    torch.cuda.synchronize()
    if pool is not None:
        torch.cuda.empty_cache()
    after = before
    if way == "allocator":
        # The graph's user objects are let go on a CUDA thread; the resource
        # frees what they held at its next call.
        import time

        deadline = time.monotonic() + 30
        while True:
            with with_pool(pool):
                torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            after = rmmd_torch.memory_stats(0)["allocated_bytes"]
            if after <= before or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    return {"losses": losses, "grads": grads, "before": before, "after": after}


def with_pool(pool):  # type: ignore[no-untyped-def]
    import contextlib

    return rmmd_torch.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "hold":
        way, mode, mib = argv[1], argv[2], int(argv[3])
        with with_rmmd(way, mode):
            t = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
            t.fill_(7)
            torch.cuda.synchronize()
        stats = rmmd_torch.memory_stats(0)
        say(pid=os.getpid(), data_ptr=t.data_ptr(), sum=int(t[:4096].sum().item()), rmmd_stats=stats)
        sys.stdin.readline()
    elif cmd == "train":
        way, mode, steps = argv[1], argv[2], int(argv[3])
        # Backward in this thread whatever the way (the MemPool needs it: see
        # rmmd.allocators.torch.use_mem_pool), so the ways differ only in
        # where memory comes from.
        with with_rmmd(way, mode), torch.autograd.grad_mode.set_multithreading_enabled(False):
            losses = train(steps)
        say(losses=losses, rmmd_stats=rmmd_torch.memory_stats(0) if way != "default" else None)
    elif cmd == "oom":
        way, mode, gib = argv[1], argv[2], int(argv[3])
        with with_rmmd(way, mode):
            torch.ones(1 << 20, device="cuda")  # the session exists
            try:
                t = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
            except Exception as e:  # noqa: BLE001 (the test wants to see which)
                say(raised=type(e).__name__, oom=isinstance(e, torch.OutOfMemoryError),
                    message=str(e), last_error=rmmd_torch.last_error())
                return 0
            # No exception: say where the tensor is (touching it could fault).
            say(raised=None, data_ptr=t.data_ptr(), last_error=rmmd_torch.last_error())
            os._exit(0)  # no CUDA work on a tensor that may be at address 0
    elif cmd == "leave":
        way, mode = argv[1], argv[2]
        with with_rmmd(way, mode):
            kept = [torch.randn(1 << k, device="cuda") for k in range(10, 24)]
            total = sum(float(t.sum().item()) for t in kept)
        globals()["kept"] = kept  # freed, if at all, while the interpreter exits
        if "raise" in argv:
            raise RuntimeError(f"boom {total:.1f}")
    elif cmd == "produce":
        name, mib = argv[1], int(argv[2])
        session = rmmd.Session(client_name="torch-producer")
        buf = rmmd.SharedBuffer.create(session, name, mib << 20, device=0)
        t = torch.from_dlpack(buf).view(torch.float32)
        t.copy_(torch.arange(t.numel(), dtype=torch.float32, device="cuda"))
        stream = torch.cuda.current_stream()
        buf.publish(stream)  # once the stream has written it
        say(ptr=buf.ptr, data_ptr=t.data_ptr(), id=buf.id, nbytes=buf.nbytes)
        sys.stdin.readline()
        del t
        buf.close()
    elif cmd == "graph":
        way, mode, replays = argv[1], argv[2], int(argv[3])
        # The MemPool is made here, and entered by graph() where PyTorch allows.
        ctx = with_rmmd(way, mode)
        if way == "mempool":
            ctx = contextlib.nullcontext()
        with ctx, torch.autograd.grad_mode.set_multithreading_enabled(False):
            said = graph(way, mode, replays)
        if way != "default":
            # Everything let go: the MemPool too (PyTorch then gives its
            # segments back to rmmd).
            import gc

            globals().pop("_pool", None)
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            if way == "allocator":
                torch.empty(1, device="cuda")  # a call into the resource frees what graphs held
            torch.cuda.synchronize()
            said["final"] = rmmd_torch.memory_stats(0)["allocated_bytes"]
            said["rmmd_stats"] = rmmd_torch.memory_stats(0)
        say(pid=os.getpid(), **said)
        if way != "default":
            sys.stdin.readline()
    elif cmd == "restarts":
        way, mode, rounds = argv[1], argv[2], int(argv[3])
        with with_rmmd(way, mode):
            old = torch.arange(4 << 20, dtype=torch.float32, device="cuda")  # 16 MiB
            torch.cuda.synchronize()
            say(pid=os.getpid(), ready=True)
            for r in range(1, rounds + 1):
                sys.stdin.readline()  # the daemon was killed and started again
                # Memory from an earlier daemon: still there, still writable.
                old_ok = bool(torch.equal(old, torch.arange(old.numel(), dtype=torch.float32,
                                                            device="cuda") + (r - 1)))
                old += 1
                # From the new daemon: larger than any block PyTorch's cache
                # holds (it keeps what earlier rounds freed, and would serve
                # a tensor from that without a call to rmmd, so the session
                # would not reconnect) and than any free slab (slab mode).
                new = torch.full((r * (24 << 20),), float(r), device="cuda")  # r * 96 MiB
                new_ok = bool(torch.equal(new[: old.numel()].add_(old), old + r))
                torch.cuda.synchronize()
                say(round=r, old_ok=old_ok, new_ok=new_ok, new_bytes=new.numel() * 4)
                del new
            sys.stdin.readline()
            del old
            globals().pop("_pool", None)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        say(done=True, rmmd_stats=rmmd_torch.memory_stats(0))
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
