#!/usr/bin/env python3
"""CuPy with its device memory from the node's rmmd: CuPy's own memory pool,
its blocks lent by rmmd (rmmd_allocator() instead makes every allocation an
rmmd allocation; docs/python.md says when to pick which).

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/cupy_allocator.py
"""

import cupy

import rmmd
from rmmd.allocators.cupy import rmmd_memory_pool


def main() -> None:
    session = rmmd.Session(client_name="cupy")
    pool = rmmd_memory_pool(session)  # slab mode
    cupy.cuda.set_allocator(pool.malloc)
    a = cupy.random.default_rng(0).random((4096, 4096), dtype=cupy.float32)
    b = a @ a.T
    print(f"trace {float(cupy.trace(b)):.1f}")
    print(
        f"CuPy's pool: {pool.used_bytes() / 2**20:.0f} MiB in use of "
        f"{pool.total_bytes() / 2**20:.0f} MiB, every block from rmmd"
    )
    me = session.session_stats()  # the daemon's view of this session
    print(f"the daemon counts {me['bytes'] / 2**20:.0f} MiB for session {me['session_id']}")
    del a, b
    pool.free_all_blocks()  # cached blocks back to rmmd now, not at exit


if __name__ == "__main__":
    main()
