"""The processes of failover_bench.py, each started as
``failover_workers.py ROLE [options]`` and speaking one JSON line per
moment on stdout (times are CLOCK_MONOTONIC, which every process of the
host shares):

- ``waiter NAME``: no PyTorch; takes the write lease of the KV buffer NAME
  (a standby open, then wait_lease), says ``{"granted": t, "generation": g}``, then waits for stdin to close.
- ``publish``: random weights of the bench's model (shapes from its
  config, bf16, made on the GPU), published persistent as WEIGHTS.
- ``active``: attaches the weights, makes the KV buffer (create_kv), takes
  its lease, captures its decode step, prefills --context tokens per
  sequence, says ``{"ready": ...}`` and decodes until it is SIGKILLed.
- ``standby``: attaches the weights, maps the KV buffer
  (rmmd.failover.standby), captures its graph (the addresses stay at the
  grant), says ready, waits; at the grant, one decode step from where the active
  stopped: ``{"granted": t, "first_token": t}``.
- ``cold``: what a restart without rmmd's KV does, from its own start:
  attaches the weights, allocates an empty KV cache, prefills the same
  context again, one decode step: ``{"first_token": t}``.
- ``prefill``: the time a prefill of each --contexts length takes (batch
  1), which a standby that reuses the KV does not spend.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "python" / "transformers_failover"))

WEIGHTS = "failover-bench/weights"
MODEL = "failover-bench-llama"


def say(**what: Any) -> None:
    print(json.dumps(what), flush=True)


def config(a: argparse.Namespace) -> Any:
    from engine import llama_config

    return llama_config(layers=a.layers, hidden=a.hidden, heads=a.hidden // 128, kv_heads=8, vocab=32000,
                        intermediate=a.intermediate, max_positions=max(a.max_length, 40960), dtype="bfloat16",
                        attn="sdpa")


def waiter_main(a: argparse.Namespace) -> int:
    import rmmd
    from rmmd import failover

    session = rmmd.Session(client_name="failover-bench-waiter")
    buf = rmmd.SharedBuffer.open(session, a.name, writable=True, exclusive=True, standby=True, wait=60)
    say(waiting=True, pid=os.getpid())
    generation = buf.wait_lease(3600)
    say(granted=time.monotonic(), generation=generation, pid=os.getpid())
    sys.stdin.read()
    return 0


def meta_model(a: argparse.Namespace) -> Any:
    import torch
    import transformers

    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config(a)).to(torch.bfloat16)


def publish_main(a: argparse.Namespace) -> int:
    import rmmd
    import rmmd.torch
    import torch

    torch.cuda.set_device(0)
    session = rmmd.Session(client_name="failover-bench-publish")
    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {}
    for name, t in meta_model(a).state_dict().items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(t.shape, dtype=torch.bfloat16, device="cuda")
        else:
            state[name] = (torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float32) * 0.02).to(
                torch.bfloat16)
    buf = rmmd.torch.publish(WEIGHTS, state, session=session, persistent=True, labels={"model": MODEL})
    say(weights_bytes=buf.nbytes, tensors=len(state))
    buf.close()
    return 0


def attached_model(a: argparse.Namespace, session: Any) -> Any:
    """The model on the meta device with the published weights attached
    (read-only); the rotary embedding made again from the config."""
    import rmmd.torch
    import torch

    model = meta_model(a)
    rmmd.torch.attach(WEIGHTS, model, session=session, expect={"model": MODEL}, strict=False)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if any(b.is_meta for b in child.buffers(recurse=False)):
                setattr(parent, child_name, type(child)(config=model.config).to(torch.device("cuda", 0)))
    return model.eval()


def layout(a: argparse.Namespace, model: Any) -> Any:
    from rmmd import failover

    return failover.KVLayout.for_config(model.config, a.batch, a.max_length)


def context(a: argparse.Namespace, model: Any, length: int, batch: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=gen).to("cuda")


def active_main(a: argparse.Namespace) -> int:
    import rmmd
    import torch
    from engine import Decoder
    from rmmd import failover

    torch.cuda.set_device(0)
    session = rmmd.Session(client_name="failover-bench-active")
    model = attached_model(a, session)
    kv_layout = layout(a, model)
    failover.create_kv(session, a.name, kv_layout, model=MODEL, device=0)
    kv = failover.active(session, a.name, kv_layout, model=MODEL, wait=60)
    dec = Decoder(model, a.batch, a.max_length, kv)
    dec.capture()
    dec.resume(1)
    dec.prefill(context(a, model, a.context, a.batch))
    dec.resume(dec.length)
    torch.cuda.synchronize()
    say(ready=True, kv_bytes=kv.buffer.nbytes, length=dec.length, generation=kv.generation)
    while dec.length < a.max_length - 1:
        dec.step()
        torch.cuda.synchronize()  # one step at a time: the kill finds at most one queued
    time.sleep(3600)
    return 0


def standby_main(a: argparse.Namespace) -> int:
    import rmmd
    import torch
    from engine import Decoder
    from rmmd import failover

    torch.cuda.set_device(0)
    session = rmmd.Session(client_name="failover-bench-standby")
    model = attached_model(a, session)
    say(attached=True)
    sys.stdin.readline()  # the active holds the lease (a standby first in a free line would be granted it)
    kv = failover.standby(session, a.name, layout(a, model), model=MODEL, wait=600)
    dec = Decoder(model, a.batch, a.max_length, kv)
    dec.capture()  # before the grant, at the addresses it keeps
    torch.cuda.synchronize()
    say(ready=True)
    generation, state = kv.wait()
    granted = time.monotonic()
    dec.resume(min(state.lengths))
    dec.step()
    torch.cuda.synchronize()
    say(granted=granted, first_token=time.monotonic(), generation=generation, resumed_at=min(state.lengths))
    sys.stdin.read()
    return 0


def cold_main(a: argparse.Namespace) -> int:
    import rmmd
    import torch
    from engine import Decoder

    torch.cuda.set_device(0)
    session = rmmd.Session(client_name="failover-bench-cold")
    model = attached_model(a, session)
    dec = Decoder(model, a.batch, a.max_length)  # an empty KV cache of its own
    dec.capture()
    dec.resume(1)
    dec.prefill(context(a, model, a.context, a.batch))
    dec.resume(dec.length)
    dec.step()
    torch.cuda.synchronize()
    say(first_token=time.monotonic(), length=dec.length)
    return 0


def prefill_main(a: argparse.Namespace) -> int:
    import rmmd
    import torch
    from engine import Decoder

    torch.cuda.set_device(0)
    session = rmmd.Session(client_name="failover-bench-prefill")
    model = attached_model(a, session)
    longest = max(a.contexts)
    dec = Decoder(model, 1, longest + 64)
    out: dict[str, Any] = {}
    dec.resume(1)
    dec.prefill(context(a, model, 256, 1))  # warm-up
    for length in a.contexts:
        prompt = context(a, model, length, 1)
        torch.cuda.synchronize()
        t0 = time.monotonic()
        dec.prefill(prompt)
        torch.cuda.synchronize()
        prefill_s = time.monotonic() - t0
        dec.resume(dec.length)
        t0 = time.monotonic()
        dec.step()
        torch.cuda.synchronize()
        out[str(length)] = {"prefill_s": prefill_s, "decode_step_s": time.monotonic() - t0}
    say(contexts=out)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["waiter", "publish", "active", "standby", "cold", "prefill"])
    p.add_argument("--name", default="failover-bench/kv/rank0")
    p.add_argument("--layers", type=int, default=19)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-length", type=int, default=27648)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--contexts", default="4096,32768")
    a = p.parse_args(argv)
    a.contexts = [int(x) for x in a.contexts.split(",") if x]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    return {"waiter": waiter_main, "publish": publish_main, "active": active_main, "standby": standby_main,
            "cold": cold_main, "prefill": prefill_main}[a.role](a)


if __name__ == "__main__":
    sys.exit(main())
