#!/usr/bin/env python3
"""CuPy with its device memory from the node's rmmd.

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/cupy_allocator.py
"""

import cupy

from rmmd.allocators.cupy import rmmd_allocator


def main() -> None:
    allocate = rmmd_allocator()  # a session of its own (client "cupy"), slab mode
    cupy.cuda.set_allocator(allocate)
    a = cupy.random.default_rng(0).random((4096, 4096), dtype=cupy.float32)
    b = a @ a.T
    print(f"trace {float(cupy.trace(b)):.1f}")
    stats = allocate.resources[cupy.cuda.runtime.getDevice()].stats()
    print(
        f"through rmmd: {stats.allocated_bytes / 2**20:.0f} MiB live in "
        f"{stats.allocation_count} arrays, {stats.high_water_bytes / 2**20:.0f} MiB at most"
    )
    me = allocate.session.session_stats()  # the daemon's view of this session
    print(f"the daemon counts {me['bytes'] / 2**20:.0f} MiB for session {me['session_id']}")


if __name__ == "__main__":
    main()
