#!/usr/bin/env python3
"""Trains a small model whose memory comes from the node's rmmd, with
PyTorch's own caching allocator on top (a torch.cuda.MemPool over rmmd).

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/torch_mempool.py

While it runs, `rmmctl stats` shows its session (client "torch") and what
it holds. docs/python.md says when to choose this way.
"""

import torch

from rmmd.allocators.torch import memory_stats, rmmd_mem_pool, use_mem_pool


def main() -> None:
    pool = rmmd_mem_pool()  # $RMMD_RUNTIME_DIR (else /run/rmmd), slab mode
    torch.manual_seed(0)
    # Inside the block, tensors come from rmmd: parameters, activations,
    # optimizer state, and (use_mem_pool runs backward in this thread)
    # gradients. Outside it, PyTorch's default allocator serves as usual.
    with use_mem_pool(pool):
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
    rmmd_view = memory_stats()  # the segments PyTorch's cache took from rmmd
    print(
        f"rmmd lent {rmmd_view['allocated_bytes'] / 2**20:.0f} MiB in "
        f"{rmmd_view['allocation_count']} segments; PyTorch's statistics work as usual: "
        f"{torch.cuda.memory_allocated() / 2**20:.0f} MiB allocated, "
        f"{torch.cuda.memory_reserved() / 2**20:.0f} MiB reserved"
    )


if __name__ == "__main__":
    main()
