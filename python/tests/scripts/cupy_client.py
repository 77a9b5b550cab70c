"""A CuPy client process for the GPU tests (RMMD_RUNTIME_DIR names the
daemon). Prints one line of JSON when it has done its part.

  hold WAY MODE MIB   arrays through rmmd; wait for stdin; exit
  oom WAY GIB         ask for more than the pool has; say what happened
  consume NAME        open a shared buffer (waiting for it) and read it through DLPack
  lanes N [T]         a slab resource with N carving lanes (or "auto"), T threads (N
                      if not given) on T streams; says when all hold their arrays,
                      checks them after a line on stdin

WAY: allocator (rmmd_allocator: every allocation from rmmd) or pool
(rmmd_memory_pool: CuPy's MemoryPool over rmmd); MODE: slab or direct.
"""

from __future__ import annotations

import json
import os
import sys

import cupy

import rmmd
from rmmd.allocators import cupy as rmmd_cupy
from rmmd.allocators.cupy import rmmd_allocator, rmmd_memory_pool


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "hold":
        way, mode, mib = argv[1], argv[2], int(argv[3])
        session = rmmd.Session(client_name="cupy")
        if way == "pool":
            pool = rmmd_memory_pool(session, mode=mode)
            cupy.cuda.set_allocator(pool.malloc)
        else:
            allocate = rmmd_allocator(session, mode=mode)
            cupy.cuda.set_allocator(allocate)
        a = cupy.arange((mib << 20) // 4, dtype=cupy.float32)
        b = cupy.ones_like(a)
        c = a + b
        expected = float(((mib << 20) // 4) * ((mib << 20) // 4 + 1) / 2)
        ok = abs(float(c.sum(dtype=cupy.float64)) - expected) < 1e-6 * expected
        if way == "pool":
            held = pool.total_bytes()  # every byte of CuPy's pool came from rmmd
        else:
            held = allocate.resources[cupy.cuda.runtime.getDevice()].stats().allocated_bytes
        say(pid=os.getpid(), ok=ok, ptr=int(a.data.ptr), session=session.id, rmmd_bytes=held)
        sys.stdin.readline()
    elif cmd == "oom":
        way, gib = argv[1], int(argv[2])
        if way == "pool":
            pool = rmmd_memory_pool()
            cupy.cuda.set_allocator(pool.malloc)
        else:
            cupy.cuda.set_allocator(rmmd_allocator())
        cupy.ones(1 << 20)  # the session exists
        try:
            cupy.empty(gib << 30, dtype=cupy.uint8)
        except Exception as e:  # noqa: BLE001 (the test wants to see which)
            say(raised=type(e).__module__ + "." + type(e).__name__,
                memory_error=isinstance(e, MemoryError), message=str(e),
                last_error=rmmd_cupy.last_error())
            return 0
        say(raised=None)
    elif cmd == "consume":
        name = argv[1]
        session = rmmd.Session(client_name="cupy-consumer")
        with rmmd.SharedBuffer.open(session, name, wait=60) as buf:
            a = cupy.from_dlpack(buf).view(cupy.float32)
            ok = bool((a == cupy.arange(a.size, dtype=cupy.float32)).all())
            cai = cupy.asarray(buf).view(cupy.float32)  # __cuda_array_interface__ too
            say(ok=ok, ptr=buf.ptr, data_ptr=int(a.data.ptr), cai_ptr=int(cai.data.ptr),
                id=buf.id, device=buf.device, first=float(a[1].item()))
            del a, cai
    elif cmd == "lanes":
        import threading

        lanes = argv[1] if argv[1] == "auto" else int(argv[1])
        count = int(argv[2]) if len(argv) > 2 else int(lanes)
        session = rmmd.Session(client_name="cupy-lanes")
        resource = session.device_resource(lanes=lanes)
        results: list[bool] = []
        holding = threading.Barrier(count + 1)
        checking = threading.Barrier(count + 1)

        def work(t: int) -> None:
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                held = [resource.allocation(4096 << (i % 6), stream=stream) for i in range(64)]
                arrays = [cupy.asarray(a).view(cupy.uint8) for a in held]
                for i, a in enumerate(arrays):
                    a.fill((t * 64 + i) % 251)
                holding.wait()  # every lane has carved: each holds a slab of its own
                checking.wait()
                ok = all(bool((a == (t * 64 + i) % 251).all()) for i, a in enumerate(arrays))
                stream.synchronize()
                results.append(ok)
                del arrays
                for a in held:
                    a.free()
            stream.synchronize()

        threads = [threading.Thread(target=work, args=(t,)) for t in range(count)]
        for th in threads:
            th.start()
        holding.wait()
        say(holding=True, session=session.id)
        sys.stdin.readline()
        checking.wait()
        for th in threads:
            th.join()
        say(ok=len(results) == count and all(results), session=session.id)
        sys.stdin.readline()
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
