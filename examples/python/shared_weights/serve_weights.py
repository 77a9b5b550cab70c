#!/usr/bin/env python3
"""The loader: builds the small GPT of model.py on the GPU, publishes its
weights under one name with rmmd.torch.publish (every tensor in one shared
buffer, a manifest saying where each is, labels model and revision) and
holds the buffer until its stdin closes (Ctrl-D). Workers (worker.py)
attach the same bytes; run.py starts the loader and the workers together.

    RMMD_RUNTIME_DIR=/tmp/rmmd python examples/python/shared_weights/serve_weights.py

The loader's own copy of the model is freed once published: the buffer is
the only copy on the GPU.
"""

import sys

import torch

import rmmd
import rmmd.torch
from model import NAME, NEW_TOKENS, PROMPT, Config, build


def main() -> None:
    config = Config()
    model = build(config, "cuda")
    buf = rmmd.torch.publish(NAME, model, labels=config.labels())
    manifest = buf.manifest
    print(f"loader: published '{NAME}': {len(manifest.tensors)} tensors, {buf.nbytes / 2**20:.1f} MiB, "
          f"labels {dict(manifest.labels)}", flush=True)
    tokens = model.generate(PROMPT, NEW_TOKENS)  # from its own copy, for comparison
    print("loader: tokens " + " ".join(map(str, tokens)), flush=True)
    del model
    torch.cuda.empty_cache()
    print("loader: holding the weights; close stdin (Ctrl-D) to let go", flush=True)
    sys.stdin.read()
    buf.close()  # the memory goes back with the last holder


if __name__ == "__main__":
    main()
