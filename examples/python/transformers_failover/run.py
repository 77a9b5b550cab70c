#!/usr/bin/env python3
"""An inference engine SIGKILLed mid-generation, and a standby that goes on
from its KV cache: the tokens equal an uninterrupted run's. A transformers
Llama whose static KV cache lives in an rmmd buffer (rmmd.failover).

  python run.py [--device 0] [--runtime-dir RUN] [--seed 0] [--kill-at random|N]
                [--batch 4] [--prompt-len 32] [--new-tokens 48] [--max-cache-len 256]
                [--dtype float32] [--no-graph] [--name failover-example/kv/rank0]

Three processes, each building the same small Llama from a config (random
weights from --seed; nothing is downloaded):

1. the reference generates greedily, uninterrupted, in memory of its own;
2. the active engine makes the KV buffer (``rmmd.failover.create_kv``:
   persistent, labelled with the model and the layout), takes its write
   lease (``rmmd.failover.active``), binds transformers' ``StaticCache`` to
   the buffer's keys and values (``rmmd.failover.bind_static_cache``),
   captures its decode step as a CUDA graph, prefills the prompt and
   decodes, writing each step's tokens and lengths into the buffer and
   stamping them with its lease generation; at decode step --kill-at
   (``random``: one drawn from --seed) it SIGKILLs itself, with its last
   step still queued on the GPU;
3. the standby, started beside it, builds the model, and once the active
   holds the lease maps the buffer
   (``rmmd.failover.standby``: read-only until the grant, at addresses the
   grant keeps), binds its cache, captures its graph and waits
   (``kv.wait()``). At the grant it reads
   where the dead engine stopped and decodes the rest from the KV cache as
   it is: the prompt is not computed again.

The last line printed is JSON: {"equal": true, "kill_step": ..., "resumed_at":
..., "standby_forwards": ..., "grant_s": ..., "first_token_s": ...}. Exit
status 0 only when the standby's tokens equal the reference's and it ran
exactly one forward per token it had left.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))


def said(proc: subprocess.Popen[str], timeout_what: str) -> dict[str, Any]:
    """The next JSON line of `proc` ({} where it ended first)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    return {"ended": proc.wait(), "while": timeout_what}


def say(**what: Any) -> None:
    print(json.dumps(what), flush=True)


# ---- the roles, each a process -------------------------------------------------------


def setup(a: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """torch, the device, the model and the prompt (CUDA before the session:
    its files close before the session socket when the process dies)."""
    import torch

    from engine import build_model, llama_config, prompt_ids

    torch.cuda.set_device(a.device)
    device = torch.device("cuda", a.device)
    config = llama_config(max_positions=a.max_cache_len, dtype=a.dtype)
    model = build_model(config, a.seed, device, getattr(torch, a.dtype))
    return torch, device, model, prompt_ids(config, a.batch, a.prompt_len, a.seed, device)


def layout_of(a: argparse.Namespace, model: Any) -> Any:
    from rmmd import failover

    return failover.KVLayout.for_config(model.config, a.batch, a.max_cache_len, dtype=a.dtype)


def model_label(a: argparse.Namespace) -> str:
    return f"example-llama seed={a.seed} dtype={a.dtype}"


def reference_main(a: argparse.Namespace) -> int:
    from engine import Decoder

    torch, _, model, prompt = setup(a)
    dec = Decoder(model, a.batch, a.max_cache_len)
    if not a.no_graph:
        dec.capture()
    say(tokens=dec.generate(prompt, a.new_tokens).tolist())
    return 0


def active_main(a: argparse.Namespace) -> int:
    import rmmd
    from engine import Decoder, now
    from rmmd import failover

    torch, device, model, prompt = setup(a)
    session = rmmd.Session(client_name="failover-active")
    layout = layout_of(a, model)
    failover.create_kv(session, a.name, layout, model=model_label(a), device=a.device, seed=a.seed)
    kv = failover.active(session, a.name, layout, model=model_label(a), wait=60)
    dec = Decoder(model, a.batch, a.max_cache_len, kv)
    if not a.no_graph:
        dec.capture()
    say(holding=kv.generation)
    sys.stdin.readline()  # the standby is ready
    dec.resume(1)
    dec.prefill(prompt)
    dec.resume(dec.length)
    end = a.prompt_len + a.new_tokens
    step = 0
    while dec.length < end:
        if step == a.kill_at:
            say(dying=step, length=dec.length, t=now())
            os.kill(os.getpid(), signal.SIGKILL)  # the step before is still queued on the GPU
        dec.step()
        step += 1
    torch.cuda.synchronize()
    say(finished=dec.length)
    return 0


def standby_main(a: argparse.Namespace) -> int:
    import rmmd
    from engine import Decoder, now
    from rmmd import failover

    torch, device, model, prompt = setup(a)
    session = rmmd.Session(client_name="failover-standby")
    layout = layout_of(a, model)
    say(built=True)
    # Once the active holds the lease: a standby that came first to a free
    # lease would be granted it at once, and be the active engine.
    sys.stdin.readline()
    kv = failover.standby(session, a.name, layout, model=model_label(a), wait=120)
    dec = Decoder(model, a.batch, a.max_cache_len, kv)
    if not a.no_graph:
        dec.capture()  # before the grant: at the addresses the grant keeps
    say(ready=True, graph_before_grant=not a.no_graph)
    generation, state = kv.wait()
    granted = now()
    length = min(state.lengths[: a.batch])
    if length <= a.prompt_len:  # the dead engine's prefill never landed: nothing to reuse
        dec.resume(1)
        dec.prefill(prompt)
    dec.resume(max(length, dec.length))
    dec.step()
    torch.cuda.synchronize()
    first_token = now()
    end = a.prompt_len + a.new_tokens
    while dec.length < end:
        dec.step()
    tokens = dec.tokens[:, a.prompt_len : end].cpu().tolist()
    say(tokens=tokens, generation=generation, previous_generation=state.generation, resumed_at=length,
        forwards=dec.forwards, granted_t=granted, first_token_t=first_token,
        graph_before_grant=not a.no_graph, commits_seen=state.commits)
    kv.close()
    return 0


# ---- the run ---------------------------------------------------------------------------


def start(a: argparse.Namespace, role: str, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [sys.executable, str(HERE), "--role", role, *a.passed]
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def run(a: argparse.Namespace) -> dict[str, Any]:
    import rmmd

    env = dict(os.environ)
    session = rmmd.Session(client_name="failover-example")
    try:
        rmmd.SharedBuffer.delete(session, a.name)  # a buffer of an earlier run
    except rmmd.NotFoundError:
        pass
    reference = start(a, "reference", env)
    ref = said(reference, "reference")
    reference.wait(120)
    active = start(a, "active", env)
    standby = start(a, "standby", env)
    holding, built = said(active, "active: holding"), said(standby, "standby: built")
    assert active.stdin is not None and standby.stdin is not None
    standby.stdin.write("open\n")  # the active holds the lease: the standby may map the buffer and line up
    standby.stdin.flush()
    ready = said(standby, "standby: ready")
    active.stdin.write("go\n")
    active.stdin.flush()
    dying = said(active, "active: dying")
    active.wait(120)
    out = said(standby, "standby: tokens")
    standby.wait(120)
    remaining = a.prompt_len + a.new_tokens - out.get("resumed_at", 0)
    result = {
        "equal": bool(out.get("tokens")) and out.get("tokens") == ref.get("tokens"),
        "kill_step": a.kill_at, "killed_at_length": dying.get("length"), "active_status": active.returncode,
        "resumed_at": out.get("resumed_at"), "standby_forwards": out.get("forwards"),
        "prefix_recomputed": out.get("forwards") != remaining,
        "generation": out.get("generation"), "previous_generation": out.get("previous_generation"),
        "grant_s": out["granted_t"] - dying["t"] if "granted_t" in out and "t" in dying else None,
        "first_token_s": out["first_token_t"] - dying["t"] if "first_token_t" in out and "t" in dying else None,
        "graph_before_grant": out.get("graph_before_grant"),
        "tokens": a.batch * a.new_tokens, "first_tokens": (ref.get("tokens") or [[]])[0][:8],
        "holding": holding, "ready": ready, "standby_built": bool(built),
    }
    try:
        rmmd.SharedBuffer.delete(session, a.name)
    except rmmd.NotFoundError:
        pass
    session.close()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--runtime-dir", help="the daemon's runtime directory (default $RMMD_RUNTIME_DIR, else /run/rmmd)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-at", default="random", help="the decode step the active dies at (random: from --seed)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--max-cache-len", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--no-graph", action="store_true", help="decode eagerly")
    p.add_argument("--name", default="failover-example/kv/rank0", help="the KV buffer's name")
    p.add_argument("--role", choices=["reference", "active", "standby"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.prompt_len < 1 or a.new_tokens < 3 or a.prompt_len + a.new_tokens > a.max_cache_len or a.batch < 1:
        p.error("need --prompt-len >= 1, --new-tokens >= 3, --batch >= 1 and prompt + new tokens <= --max-cache-len")
    if a.kill_at == "random":
        a.kill_at = random.Random(a.seed).randrange(1, a.new_tokens - 1)
    else:
        a.kill_at = int(a.kill_at)
        if not 0 <= a.kill_at < a.new_tokens - 1:
            p.error(f"--kill-at is a decode step from 0 to {a.new_tokens - 2}")
    a.passed = ["--device", str(a.device), "--seed", str(a.seed), "--kill-at", str(a.kill_at), "--batch",
                str(a.batch), "--prompt-len", str(a.prompt_len), "--new-tokens", str(a.new_tokens),
                "--max-cache-len", str(a.max_cache_len), "--dtype", a.dtype, "--name", a.name,
                *(["--no-graph"] if a.no_graph else [])]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.runtime_dir:
        os.environ["RMMD_RUNTIME_DIR"] = a.runtime_dir  # this process's session and the roles'
    if a.role:
        return {"reference": reference_main, "active": active_main, "standby": standby_main}[a.role](a)
    result = run(a)
    print(json.dumps(result))
    return 0 if result["equal"] and not result["prefix_recomputed"] else 1


if __name__ == "__main__":
    sys.exit(main())
