#!/usr/bin/env python3
"""Makes rmmd the allocator of every CUDA tensor of this process, then trains
a small model.

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/torch_allocator.py

use_rmmd_as_allocator() must come before the process's first CUDA
allocation. torch.cuda.memory_stats() does not work under a pluggable
allocator; rmmd.allocators.torch.memory_stats() reports what PyTorch
allocated through rmmd instead.
"""

import torch

from rmmd.allocators.torch import memory_stats, use_rmmd_as_allocator


def main() -> None:
    use_rmmd_as_allocator()  # first: $RMMD_RUNTIME_DIR (else /run/rmmd), slab mode
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    for step in range(20):
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 5 == 0:
            print(f"step {step:2d}  loss {loss.item():.4f}")
    s = memory_stats()
    print(
        f"through rmmd: {s['allocated_bytes'] / 2**20:.0f} MiB live in {s['allocation_count']} "
        f"tensors, {s['high_water_bytes'] / 2**20:.0f} MiB at most, "
        f"{s['total_allocations']} allocations in all"
    )


if __name__ == "__main__":
    main()
