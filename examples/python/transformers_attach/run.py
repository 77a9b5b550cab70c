#!/usr/bin/env python3
"""A transformers model whose weights live in rmmd, built on the meta device
from its config and attached, with logits bitwise equal to the same model
loaded by from_pretrained from the same directory.

  python run.py [--dir DIR] [--runtime-dir RUN] [--device 0] [--seed 0]

1. Writes a checkpoint directory (unless DIR already holds one): a small
   Llama from a config, random weights (torch.manual_seed(seed)),
   save_pretrained in 2+ shards (model.safetensors.index.json). Nothing is
   downloaded.
2. Publishes it with rmmd.safetensors.publish_dir (labels: revision).
3. Builds the model on the meta device from config.json alone and attaches
   the buffer (rmmd.torch.attach: parameters become views of the buffer,
   read-only on the GPU; non-persistent buffers such as the rotary
   inverse frequencies are computed after, as from_pretrained computes them).
4. Loads the same directory with from_pretrained on the same GPU and
   compares logits of the same tokens bit for bit.

Prints one line of JSON: {"equal": true, "max_abs_diff": 0.0, ...}; exit
status 0 only when the logits are bitwise equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers

import rmmd
import rmmd.safetensors
import rmmd.torch


# transformers 5 calls it dtype; 4.x torch_dtype.
DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def tiny_config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **{DTYPE_KW: "bfloat16"},
    )


def write_checkpoint(directory: Path, seed: int) -> None:
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(tiny_config()).to(torch.bfloat16)
    # A small max_shard_size makes several shards and the index.
    model.save_pretrained(directory, max_shard_size="300KB", safe_serialization=True)


def attach_model(
    name: str, directory: Path, device: int, session: rmmd.Session, revision: str
) -> tuple[torch.nn.Module, rmmd.SharedBuffer]:
    """The model on the meta device, attached: its parameters are views of
    the buffer; and that buffer as this process mapped it."""
    config = transformers.AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, **{DTYPE_KW: torch.bfloat16})
    held = rmmd.torch.attach(name, model, session=session, expect={"revision": revision}, strict=False)
    # What a state dict leaves out (non-persistent buffers: the rotary
    # inverse frequencies) is made again by the module that owns it, from
    # the config, on the CPU and then moved, as a model made on the CPU
    # computes it.
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if any(b.is_meta for b in child.buffers(recurse=False)):
                fresh = type(child)(config=model.config).to(torch.device("cuda", device))
                setattr(parent, child_name, fresh)
    left = [n for n, b in model.named_buffers() if b.is_meta] + [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"not in the checkpoint and not made again: {left}")
    return model.eval(), held


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", type=Path)
    p.add_argument("--runtime-dir")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="examples/tiny-llama")
    a = p.parse_args()
    torch.cuda.set_device(a.device)
    tmp = None
    directory = a.dir
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="rmmd-tiny-llama-")
        directory = Path(tmp.name)
    if not (directory / "config.json").exists():
        write_checkpoint(directory, a.seed)
    shards = sorted(f.name for f in directory.glob("*.safetensors"))

    session = rmmd.Session(runtime_dir=a.runtime_dir, client_name="transformers-example")
    revision = f"seed{a.seed}"
    published = rmmd.safetensors.publish_dir(directory, a.name, session=session, devices=[a.device],
                                             labels={"revision": revision})
    attached, held = attach_model(a.name, directory, a.device, session, revision)

    reference = transformers.AutoModelForCausalLM.from_pretrained(
        directory, device_map={"": a.device}, **{DTYPE_KW: torch.bfloat16}
    ).eval()
    tokens = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(1)).cuda(a.device)
    with torch.no_grad():
        ours = attached(tokens).logits
        theirs = reference(tokens).logits
    torch.cuda.synchronize()
    equal = bool(torch.equal(ours.view(torch.int16), theirs.view(torch.int16)))
    # Views of this process's mapping of the buffer (the publisher's own
    # mapping, published.buffers[0], is another range of addresses).
    inside = all(held.ptr <= t.data_ptr() < held.ptr + held.nbytes for t in attached.parameters())
    print(json.dumps({
        "equal": equal,
        "max_abs_diff": float((ours.float() - theirs.float()).abs().max()),
        "shards": shards,
        "parameters_in_buffer": inside,
        "labels": {k: v for k, v in published.buffers[0].labels.items() if k.startswith(("config.model_type", "revision", "checkpoint.shards"))},
        "load_gib_per_s": published.stats.gib_per_s,
    }))
    published.close()
    session.close()
    if tmp is not None:
        tmp.cleanup()
    return 0 if equal and inside else 1


if __name__ == "__main__":
    sys.exit(main())
