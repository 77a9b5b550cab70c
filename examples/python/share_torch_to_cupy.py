#!/usr/bin/env python3
"""A producer process fills a named shared buffer with PyTorch; a consumer
process (this script again, started by the producer) reads the same device
bytes with CuPy, through DLPack: no copy on either side.

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/share_torch_to_cupy.py

The consumer opens the buffer with a wait, so it may start first.
"""

import subprocess
import sys

import rmmd

NAME = "examples/torch-to-cupy"
NBYTES = 64 << 20


def produce() -> None:
    import torch

    session = rmmd.Session(client_name="torch-producer")
    consumer = subprocess.Popen([sys.executable, __file__, "--consume"])  # waits for the buffer
    with rmmd.SharedBuffer.create(session, NAME, NBYTES, device=0) as buf:
        weights = torch.from_dlpack(buf).view(torch.float32)  # the buffer's memory
        assert weights.data_ptr() == buf.ptr
        weights.copy_(torch.arange(weights.numel(), dtype=torch.float32, device="cuda"))
        buf.publish(torch.cuda.current_stream())  # consumers see it once the copy is done
        print(f"producer: published '{NAME}', {buf.nbytes >> 20} MiB on GPU {buf.device}")
        status = consumer.wait()
        del weights
    # The buffer goes back to the daemon's pool with its last holder.
    sys.exit(status)


def consume() -> None:
    import cupy

    session = rmmd.Session(client_name="cupy-consumer")
    with rmmd.SharedBuffer.open(session, NAME, wait=30) as buf:
        weights = cupy.from_dlpack(buf).view(cupy.float32)  # the same device bytes
        assert weights.data.ptr == buf.ptr
        ok = bool((weights == cupy.arange(weights.size, dtype=cupy.float32)).all())
        print(f"consumer: read '{NAME}' through DLPack without a copy: {'ok' if ok else 'MISMATCH'}")
        del weights
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    consume() if "--consume" in sys.argv else produce()
