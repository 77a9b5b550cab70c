"""One framework client of the chaos soak: PyTorch or CuPy allocating from
rmmd the way users plug it in, started (and some SIGKILLed) by
rmmd_chaos.py like the kill -9 soak's rmmd_soak_client, with the same
arguments and endings.

    python chaos_framework_client.py MODE SEED LIFETIME_MS MAX_BYTES ENDING

MODE:
  torch-pool     torch.cuda.MemPool over rmmd (rmmd.allocators.torch.rmmd_mem_pool,
                 entered with use_mem_pool)
  torch-process  rmmd as the process's whole CUDA allocator
                 (rmmd.allocators.torch.use_rmmd_as_allocator, before any tensor)
  cupy           CuPy's allocator set to rmmd's (rmmd.allocators.cupy.rmmd_allocator)

For LIFETIME_MS it allocates uint8 arrays of random sizes (log-uniform in
[64, MAX_BYTES]) on GPU 0, fills each with a byte of its own, and frees
random ones after checking every byte, holding at most HELD_AT_MOST bytes
(a framework allocates fast: unbounded, one client filled the soak's 4 GiB
pool in a second). Then it prints "done OPS ALLOCS" and
ends as ENDING says: free (checks and frees everything, returns), leave
(returns holding them: the interpreter's exit frees them), exit
(os._exit(0) holding them: the daemon reclaims them when the session's
socket closes). A lost byte: "corrupted ..." and exit status 1; an
exception: "error: ..." (with what rmmd said last, where it refused) and
status 3; bad arguments: status 2.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from typing import Any, Callable

MODES = ("torch-pool", "torch-process", "cupy")
HELD_AT_MOST = 128 << 20


def torch_side(mode: str) -> tuple[Callable[[int, int], Any], Callable[[Any, int], bool], Any]:
    """alloc(n, value), intact(array, value), and the context to run in."""
    import contextlib

    import torch

    from rmmd.allocators import torch as rmmd_torch

    if mode == "torch-process":
        rmmd_torch.use_rmmd_as_allocator()  # before anything initialises CUDA's allocator
        torch.cuda.set_device(0)
        scope: Any = contextlib.nullcontext()
    else:
        torch.cuda.set_device(0)
        scope = rmmd_torch.use_mem_pool(rmmd_torch.rmmd_mem_pool(), device=0)

    def alloc(n: int, value: int) -> Any:
        return torch.full((n,), value, dtype=torch.uint8, device="cuda")

    def intact(t: Any, value: int) -> bool:
        return bool((t == value).all().item())

    return alloc, intact, scope


def cupy_side() -> tuple[Callable[[int, int], Any], Callable[[Any, int], bool], Any]:
    import contextlib

    # Its kernel cache, where this uid may write (HOME may be another uid's).
    os.environ.setdefault("CUPY_CACHE_DIR", f"/tmp/rmmd-chaos-cupy-{os.getuid()}")
    import cupy

    from rmmd.allocators import cupy as rmmd_cupy

    cupy.cuda.Device(0).use()
    cupy.cuda.set_allocator(rmmd_cupy.rmmd_allocator())

    def alloc(n: int, value: int) -> Any:
        return cupy.full((n,), value, dtype=cupy.uint8)

    def intact(a: Any, value: int) -> bool:
        return bool((a == value).all().get())

    return alloc, intact, contextlib.nullcontext()


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[0] not in MODES or argv[4] not in ("free", "leave", "exit"):
        print(f"usage: chaos_framework_client.py {'|'.join(MODES)} SEED LIFETIME_MS MAX_BYTES free|leave|exit",
              file=sys.stderr)
        return 2
    mode, seed, lifetime_ms, max_bytes, ending = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    rng = random.Random(seed)
    alloc, intact, scope = cupy_side() if mode == "cupy" else torch_side(mode)
    held: list[tuple[Any, int, int]] = []
    ops = allocs = held_bytes = 0
    with scope:
        until = time.monotonic() + lifetime_ms / 1000
        while time.monotonic() < until:
            ops += 1
            if held and (rng.random() < 0.4 or held_bytes > HELD_AT_MOST):
                array, value, n = held.pop(rng.randrange(len(held)))
                held_bytes -= n
                if not intact(array, value):
                    print(f"corrupted: {array.numel() if hasattr(array, 'numel') else array.size} bytes "
                          f"lost their value {value}", flush=True)
                    return 1
                del array
                continue
            n = int(math.exp(rng.uniform(math.log(64), math.log(max_bytes))))
            value = rng.randrange(1, 256)
            held.append((alloc(n, value), value, n))
            held_bytes += n
            allocs += 1
        print(f"done {ops} {allocs}", flush=True)
        if ending == "exit":
            os._exit(0)
        if ending == "free":
            for array, value, _ in held:
                if not intact(array, value):
                    print(f"corrupted: an array lost its value {value}", flush=True)
                    return 1
            held.clear()
    return 0


def rmmd_said(mode: str) -> str:
    """What rmmd said about this thread's last refused call (the framework's
    own error names none of it)."""
    try:
        if mode == "cupy":
            from rmmd.allocators import cupy as allocator
        else:
            from rmmd.allocators import torch as allocator  # type: ignore[no-redef]
        return allocator.last_error()
    except Exception:  # noqa: BLE001 (only words for the line)
        return ""


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as e:  # noqa: BLE001 (the soak reads the line)
        said = rmmd_said(sys.argv[1] if len(sys.argv) > 1 else "")
        print(f"error: {type(e).__name__}: {e}" + (f" (rmmd: {said})" if said else ""), flush=True)
        sys.exit(3)
