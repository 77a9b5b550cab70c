"""A CuPy client process for the GPU tests (RMMD_RUNTIME_DIR names the
daemon). Prints one line of JSON when it has done its part.

  hold MODE MIB     arrays through rmmd's CuPy allocator; wait for stdin; exit
  consume NAME      open a shared buffer (waiting for it) and read it through DLPack
"""

from __future__ import annotations

import json
import os
import sys

import cupy

import rmmd
from rmmd.allocators.cupy import rmmd_allocator


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "hold":
        mode, mib = argv[1], int(argv[2])
        allocate = rmmd_allocator(mode=mode)
        cupy.cuda.set_allocator(allocate)
        a = cupy.arange((mib << 20) // 4, dtype=cupy.float32)
        b = cupy.ones_like(a)
        c = a + b
        expected = float(((mib << 20) // 4) * ((mib << 20) // 4 + 1) / 2)
        ok = abs(float(c.sum(dtype=cupy.float64)) - expected) < 1e-6 * expected
        stats = allocate.resources[cupy.cuda.runtime.getDevice()].stats()
        say(pid=os.getpid(), ok=ok, ptr=int(a.data.ptr), session=allocate.session.id,
            allocated_bytes=stats.allocated_bytes)
        sys.stdin.readline()
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
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
