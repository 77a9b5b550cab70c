#!/usr/bin/env python3
"""A worker: builds the small GPT of model.py on the meta device (no
memory), attaches the loader's published weights (rmmd.torch.attach: every
parameter becomes a read-only view of the shared buffer, the tied
embedding and output weights stay one tensor), generates tokens greedily
from the same prompt as every other worker and prints them; then holds the
weights until its stdin closes.

    python examples/python/shared_weights/worker.py [INDEX] [--revision R]

--revision R expects another revision than the model's own: the buffer's
labels differ, so the open is refused (the fingerprint guard) and the
worker exits with status 3.
"""

import argparse
import sys

import torch

import rmmd
import rmmd.torch
from model import NAME, NEW_TOKENS, PROMPT, Config, build


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("index", nargs="?", type=int, default=0)
    p.add_argument("--revision", help="expect this revision instead of the model's own")
    a = p.parse_args()
    me = f"worker {a.index}"
    config = Config()
    expect = config.labels()
    if a.revision:
        expect["revision"] = a.revision
    model = build(config, "meta")
    try:
        buf = rmmd.torch.attach(NAME, model, expect=expect)
    except rmmd.PreconditionError as e:
        print(f"{me}: refused: {e}", flush=True)
        return 3
    tied = model.head.weight.data_ptr() == model.embed.weight.data_ptr()
    inside = all(buf.ptr <= t.data_ptr() < buf.ptr + buf.nbytes for t in model.state_dict().values())
    print(f"{me}: attached '{NAME}' ({buf.nbytes / 2**20:.1f} MiB, read-only: {not buf.writable}); every "
          f"weight in the shared buffer: {inside}; tied weights one tensor: {tied}; this process's own "
          f"device allocations: {torch.cuda.memory_allocated() / 2**20:.1f} MiB", flush=True)
    tokens = model.generate(PROMPT, NEW_TOKENS)
    print(f"{me}: tokens " + " ".join(map(str, tokens)), flush=True)
    sys.stdin.read()  # hold the weights until told to go
    return 0 if tied and inside else 1


if __name__ == "__main__":
    sys.exit(main())
