#!/usr/bin/env python3
"""An inference engine that sleeps while another process trains on its GPU
memory, and wakes to generate the same tokens: a transformers Llama under
torch_memory_saver's API, served by rmmd.

  python run.py [--device 0] [--runtime-dir RUN] [--rmmctl PATH] [--other-user rmmd-client-b | none]
                [--seed 0] [--batch 16] [--prompt-len 16] [--new-tokens 32] [--max-cache-len 8192] [--no-graph]

1. A small Llama from a config (random weights, torch.manual_seed(seed);
   nothing is downloaded), bf16, eager attention, built on the CPU and moved
   to the GPU under ``torch_memory_saver.region("weights",
   enable_cpu_backup=True)``; a StaticCache, the decode step's static
   inputs and the tokens under ``region("kv")``; the decode step captured
   in a CUDA graph through ``torch_memory_saver.cuda_graph(tag="graph")``
   (``from rmmd.memory_saver import torch_memory_saver``: the one line that
   differs from a torch_memory_saver program).
2. Generates greedily: the prompt (random token ids, fixed seed) in one
   eager forward, then one graph replay per token; records the tokens.
3. ``torch_memory_saver.pause()``: the weights are copied to host memory the
   daemon holds, the KV cache and the graph's memory are dropped, and all
   of it is given back to the daemon's pool.
4. A trainer process, of another uid where it can be (run as root: the
   user --other-user, made with useradd if missing, started with runuser;
   otherwise the same uid, and the output says why), takes what the pool
   has free now (up to --trainer-max-gib) as a training set from rmmd
   (``rmmd.allocators.torch.rmmd_mem_pool``), trains a small MLP on it
   for --train-steps steps, and exits.
5. ``torch_memory_saver.resume()``: new memory at the same addresses, the
   weights restored; generates again from the same prompt. The tokens
   must be equal to the first run's, the weights' bytes and every
   address unchanged.

``rmmctl pools`` and ``rmmctl sleepers`` (``sessions`` while the trainer
holds the memory) are printed at each moment the memory moves (rmmctl from
--rmmctl, $RMMD_RMMCTL or PATH; the daemon from --runtime-dir, else
$RMMD_RUNTIME_DIR, else /run/rmmd). The last line printed is JSON:
{"equal": true, ...} with the figures (pause and resume seconds, bytes
given back and backed up, the trainer's uid and figures, the pool at each
moment). Exit status 0 only when the tokens are equal, the weights
restored, the addresses kept and the trainer done; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
MIB = 1 << 20
GIB = 1 << 30


# ---- rmmctl: what the daemon shows --------------------------------------------


class Rmmctl:
    """rmmctl of the daemon at `runtime_dir` (None: rmmctl's default)."""

    def __init__(self, path: str | None, runtime_dir: str | None) -> None:
        self.path = path or os.environ.get("RMMD_RMMCTL") or shutil.which("rmmctl")
        self.runtime = ["--runtime-dir", runtime_dir] if runtime_dir else []
        self.moments: list[dict[str, Any]] = []

    def run(self, *args: str) -> str | None:
        if not self.path:
            return None
        out = subprocess.run([self.path, *self.runtime, *args], capture_output=True, text=True, timeout=60)
        return out.stdout if out.returncode == 0 else f"(rmmctl {' '.join(args)} failed: {out.stderr.strip()})"

    def json(self, *args: str) -> dict[str, Any]:
        said = self.run(*args, "--json")
        try:
            return json.loads(said) if said else {}
        except json.JSONDecodeError:
            return {}

    def show(self, moment: str, *commands: str, uuid: str = "") -> dict[str, Any]:
        """Prints each `rmmctl COMMAND` under a heading; records the CUDA
        pool of `uuid` (or the fullest one) and the host pools' use."""
        for command in commands:
            print(f"\n== {moment}: rmmctl {command} ==")
            said = self.run(command)
            print(said.rstrip() if said is not None else "(no rmmctl: give --rmmctl PATH or put it on PATH)")
        figures = {"moment": moment, **pool_figures(self.json("stats"), uuid)}
        self.moments.append(figures)
        sys.stdout.flush()
        return figures

    def sleeper(self, pid: int) -> dict[str, Any]:
        """This process's line of `rmmctl sleepers --json`."""
        for s in self.json("sleepers").get("sleepers", []):
            if int(s.get("pid", 0)) == pid:
                return s
        return {}


def uuid_digits(uuid: str) -> str:
    """A GPU UUID's hex digits (rmmd writes nvidia-smi's "GPU-..." form, PyTorch not)."""
    return "".join(c for c in uuid.lower().removeprefix("gpu-") if c in "0123456789abcdef")


def pool_figures(stats: dict[str, Any], uuid: str) -> dict[str, Any]:
    cuda = [p for p in stats.get("pools", []) if p.get("pool", {}).get("backend") == "BACKEND_CUDA"]
    ours = [p for p in cuda if uuid and uuid_digits(uuid) == uuid_digits(p["pool"].get("gpu_uuid", ""))] or sorted(
        cuda, key=lambda p: -int(p.get("in_use_bytes", 0)))[:1]
    host = [p for p in stats.get("pools", []) if p.get("pool", {}).get("backend") == "BACKEND_HOST"]
    out: dict[str, Any] = {"host_in_use_bytes": sum(int(p.get("in_use_bytes", 0)) for p in host)}
    if ours:
        p = ours[0]
        out.update({
            "cuda_pool": p["pool"]["name"],
            "cuda_capacity_bytes": int(p["pool"].get("capacity_bytes", 0)),
            "cuda_in_use_bytes": int(p.get("in_use_bytes", 0)),
            "cuda_tenants": {t["tenant"]: int(t.get("in_use_bytes", 0)) for t in p.get("tenants", [])},
        })
    return out


# ---- the trainer: another process, another uid where it can be -------------------


def trainer_main(a: argparse.Namespace) -> int:
    """Takes --trainer-bytes of training data from rmmd, says so, waits for
    a line on stdin, trains, says how it went."""
    import torch
    from rmmd.allocators.torch import rmmd_mem_pool, use_mem_pool

    started = time.monotonic()
    torch.cuda.set_device(a.device)
    pool = rmmd_mem_pool()  # the daemon of $RMMD_RUNTIME_DIR
    width = 1024
    with use_mem_pool(pool):
        gen = torch.Generator(device="cuda").manual_seed(a.seed)
        rows = max(1024, a.trainer_bytes // (width * 4))
        data = torch.randn(rows, width, device="cuda", generator=gen)  # the training set, in the freed memory
        teacher = torch.randn(width, width, device="cuda", generator=gen) / width**0.5
        model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                    torch.nn.Linear(4 * width, width)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.cuda.synchronize()
        print(json.dumps({"holding_bytes": data.nbytes, "uid": os.getuid(), "pid": os.getpid(),
                          "set_up_s": time.monotonic() - started}), flush=True)
        sys.stdin.readline()  # the engine shows what the daemon sees
        losses = []
        for step in range(a.train_steps):
            idx = torch.randint(0, rows, (512,), device="cuda", generator=gen)
            x = data[idx]
            loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step in (0, a.train_steps - 1):
                losses.append(float(loss))
        torch.cuda.synchronize()
    print(json.dumps({"trained_steps": a.train_steps, "first_loss": losses[0], "last_loss": losses[-1],
                      "seconds": time.monotonic() - started}), flush=True)
    return 0


def make_user(user: str) -> str:
    """Makes `user` (a system user without home or shell, in group rmmd
    where that group exists); empty, or why it could not."""
    argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    if subprocess.run(["getent", "group", "rmmd"], capture_output=True).returncode == 0:
        argv += ["--groups", "rmmd"]
    out = subprocess.run([*argv, user], capture_output=True, text=True)
    return "" if out.returncode == 0 else f"useradd {user}: {out.stderr.strip()}"


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """`argv` run as `user` (None: as this process), with what it needs of
    this environment passed on (runuser resets some of it)."""
    if not user:
        return argv
    keep = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "RMMD_LIBRARY", "RMMD_RUNTIME_DIR", "CUDA_VISIBLE_DEVICES")
    passed = [f"{k}={os.environ[k]}" for k in keep if k in os.environ]
    return ["runuser", "-u", user, "--", "env", "HOME=/tmp", *passed, *argv]


def trainer_user(wanted: str) -> tuple[str | None, str]:
    """The user to run the trainer as (None: this uid), and what to say."""
    import pwd

    if wanted in ("", "none"):
        return None, "the same uid (--other-user none)"
    if os.geteuid() != 0:
        return None, f"the same uid ({os.getuid()}): not root, so no process of another user can be started"
    if not shutil.which("runuser"):
        return None, "the same uid: runuser is not installed"
    note = ""
    try:
        pwd.getpwnam(wanted)
    except KeyError:
        why = make_user(wanted)
        if why:
            return None, f"the same uid: {why}"
        note = f" (made now: useradd --system {wanted})"
    probe = subprocess.run(
        as_user(wanted, [sys.executable, "-c", "import torch, rmmd; rmmd.Session(client_name='probe').close()"]),
        capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, (f"the same uid: as {wanted} the trainer cannot import torch and rmmd or open a session "
                      f"({last}); the checkout, librmmd_c.so and the daemon's sockets must be reachable by it")
    return wanted, f"uid {pwd.getpwnam(wanted).pw_uid} ({wanted}){note}"


def start_trainer(a: argparse.Namespace, user: str | None, nbytes: int) -> subprocess.Popen[str]:
    argv = [sys.executable, str(HERE), "--worker", "trainer", "--device", str(a.device), "--seed", str(a.seed),
            "--trainer-bytes", str(nbytes), "--train-steps", str(a.train_steps)]
    return subprocess.Popen(as_user(user, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def said(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The trainer's next line of JSON ({} if it ended first)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    return {}


# ---- the engine ------------------------------------------------------------------------


class Engine:
    """The model, its static KV cache and its decode step (a CUDA graph),
    all under torch_memory_saver's regions."""

    def __init__(self, a: argparse.Namespace, saver: Any) -> None:
        import torch
        import transformers

        self.torch, self.a = torch, a
        dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=a.max_cache_len,
            tie_word_embeddings=False, attn_implementation="eager", **{dtype_kw: "bfloat16"})
        device = torch.device("cuda", a.device)
        torch.manual_seed(a.seed)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval().requires_grad_(False)
        with saver.region(tag="weights", enable_cpu_backup=True):
            self.model = model.to(device)
        b, length = a.batch, a.max_cache_len
        with saver.region(tag="kv"):
            self.cache = transformers.StaticCache(config=config, max_cache_len=length)
            self.cache.early_initialization(batch_size=b, num_heads=config.num_key_value_heads,
                                            head_dim=config.head_dim, dtype=torch.bfloat16, device=device)
            self.ids = torch.zeros(b, 1, dtype=torch.long, device=device)
            self.pos = torch.zeros(b, 1, dtype=torch.long, device=device)
            self.mask = torch.zeros(b, 1, 1, length, dtype=torch.bfloat16, device=device)
            self.tokens = torch.zeros(b, a.new_tokens, dtype=torch.long, device=device)
        self.masked = torch.finfo(torch.bfloat16).min
        self.prompt = torch.randint(0, config.vocab_size, (b, a.prompt_len),
                                    generator=torch.Generator().manual_seed(a.seed + 1)).to(device)
        self.graph = None if a.no_graph else self._capture(saver)

    def _decode_step(self) -> Any:
        out = self.model(input_ids=self.ids, position_ids=self.pos, attention_mask=self.mask,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].argmax(-1)

    def _capture(self, saver: Any) -> Any:
        """The decode step as a CUDA graph, its memory pauseable (tag "graph")."""
        torch = self.torch
        self.cache.reset()  # the warm-up's values do not matter: generate() starts from a reset cache
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                self._decode_step()  # warm-up outside the capture (cuBLAS, the allocator)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), saver.cuda_graph(cuda_graph=graph, tag="graph"):
            self.next_token = self._decode_step()
        torch.cuda.synchronize()
        return graph

    def _step(self) -> Any:
        if self.graph is None:
            with self.torch.no_grad():
                return self._decode_step()
        self.graph.replay()
        return self.next_token

    def generate(self) -> Any:
        """Greedy: the prompt eagerly, then one step per token; the tokens
        (batch x new_tokens) on the CPU."""
        torch, a = self.torch, self.a
        p, length = a.prompt_len, a.max_cache_len
        self.cache.reset()  # zeroes the keys, values and lengths (what a resume leaves is undefined)
        causal = torch.full((p, length), self.masked, dtype=torch.bfloat16, device=self.prompt.device)
        causal[:, :p] = torch.triu(causal[:, :p], diagonal=1)
        with torch.no_grad():
            out = self.model(input_ids=self.prompt, attention_mask=causal.expand(a.batch, 1, p, length),
                             position_ids=torch.arange(p, device=self.prompt.device).expand(a.batch, p),
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.tokens[:, 0] = out.logits[:, -1].argmax(-1)
        self.mask.fill_(self.masked)
        self.mask[..., : p + 1] = 0
        self.pos.fill_(p)
        for k in range(1, a.new_tokens):
            self.ids.copy_(self.tokens[:, k - 1 : k])
            self.tokens[:, k] = self._step()
            self.pos.add_(1)
            self.mask[..., p + k] = 0
        return self.tokens.cpu()

    def weight_sums(self) -> Any:
        """Each parameter's and buffer's byte sum, computed on the GPU."""
        torch = self.torch
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return torch.stack([t.detach().reshape(-1).view(torch.uint8).sum(dtype=torch.int64) for t in tensors]).cpu()

    def addresses(self) -> list[int]:
        layers = self.cache.layers
        return ([t.data_ptr() for t in self.model.parameters()] + [x.keys.data_ptr() for x in layers]
                + [x.values.data_ptr() for x in layers] + [self.ids.data_ptr(), self.mask.data_ptr()])


# ---- the run ---------------------------------------------------------------------------


def sleep_and_train(a: argparse.Namespace, engine: Engine, saver: Any, ctl: Rmmctl, uuid: str,
                    trainer_as: tuple[str | None, str]) -> dict[str, Any]:
    """Pause, the trainer (as `trainer_as`: user, what to say) on the
    freed memory, resume: the figures."""
    torch = engine.torch
    out: dict[str, Any] = {}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    awake = ctl.moments[-1]
    reserved = torch.cuda.memory_reserved(a.device)
    t0 = time.monotonic()
    saver.pause()  # every tag: the weights backed up, the KV cache and the graph's memory dropped
    out["pause_s"] = time.monotonic() - t0
    asleep = ctl.show("asleep (weights on host, KV and graph given back)", "sleepers", "pools", uuid=uuid)
    me = ctl.sleeper(os.getpid())
    out["given_back_bytes"] = int(me.get("sleeping_bytes", 0))
    out["backup_bytes"] = int(me.get("backup_bytes", 0))
    room = asleep.get("cuda_capacity_bytes", 0) - asleep.get("cuda_in_use_bytes", 0)
    nbytes = min(room - 512 * MIB if room else int(0.75 * reserved), int(a.trainer_max_gib * GIB))
    user, who = trainer_as
    print(f"\n== the trainer runs as {who}, on {nbytes / GIB:.2f} GiB of training data ==", flush=True)
    trainer = start_trainer(a, user, max(nbytes, 64 * MIB))
    holding = said(trainer)
    out["trainer"] = {"user": user, "runs_as": who, "other_uid": user is not None, **holding}
    if holding:
        ctl.show("the trainer holds the freed memory", "pools", "sessions", uuid=uuid)
    assert trainer.stdin is not None
    try:
        trainer.stdin.write("\n")  # go on: train
        trainer.stdin.flush()
    except BrokenPipeError:
        pass  # it ended already; its status says how
    out["trainer"].update(said(trainer))
    out["trainer"]["exit_status"] = trainer.wait(600)
    ctl.show("the trainer exited", "pools", uuid=uuid)
    if "cuda_capacity_bytes" in awake:
        free_awake = awake["cuda_capacity_bytes"] - awake["cuda_in_use_bytes"]
        out["pool"] = {"free_awake_bytes": free_awake, "free_asleep_bytes": room,
                       "trainer_needed_the_sleep": out["trainer"].get("holding_bytes", 0) > free_awake}
    t0 = time.monotonic()
    saver.resume(deadline=60)  # rmmd's: waits up to 60 s for the trainer's memory to come back
    out["resume_s"] = time.monotonic() - t0
    ctl.show("awake again (same addresses, weights restored)", "sleepers", "pools", uuid=uuid)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--runtime-dir", help="the daemon's runtime directory (default $RMMD_RUNTIME_DIR, else /run/rmmd)")
    p.add_argument("--rmmctl", help="rmmctl to show the daemon's view (default $RMMD_RMMCTL, else PATH)")
    p.add_argument("--other-user", default="rmmd-client-b", help="the trainer's user, as root ('none': this uid)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--max-cache-len", type=int, default=8192, help="the KV cache's length (8192: 1 GiB at batch 16)")
    p.add_argument("--no-graph", action="store_true", help="decode eagerly (to tell a capture problem apart)")
    p.add_argument("--train-steps", type=int, default=50)
    p.add_argument("--trainer-max-gib", type=float, default=8.0, help="most training data the trainer takes (8)")
    p.add_argument("--worker", choices=["trainer"], help=argparse.SUPPRESS)
    p.add_argument("--trainer-bytes", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.prompt_len < 1 or a.new_tokens < 2 or a.prompt_len + a.new_tokens > a.max_cache_len or a.batch < 1:
        p.error("need --prompt-len >= 1, --new-tokens >= 2, --batch >= 1 and prompt + new tokens <= --max-cache-len")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker == "trainer":
        return trainer_main(a)
    if a.runtime_dir:
        os.environ["RMMD_RUNTIME_DIR"] = a.runtime_dir  # this process's session and the trainer's
    import torch

    from rmmd.memory_saver import torch_memory_saver  # instead of: from torch_memory_saver import ...

    torch.cuda.set_device(a.device)
    uuid = str(getattr(torch.cuda.get_device_properties(a.device), "uuid", ""))
    ctl = Rmmctl(a.rmmctl, a.runtime_dir)
    engine = Engine(a, torch_memory_saver)
    ctl.show("loaded (weights, KV cache and graph awake)", "pools", uuid=uuid)
    t0 = time.monotonic()
    first = engine.generate()
    generate_s = [time.monotonic() - t0]
    sums, addresses = engine.weight_sums(), engine.addresses()

    trainer_as = trainer_user(a.other_user)  # before the pause: the engine sleeps only while the trainer runs
    figures = sleep_and_train(a, engine, torch_memory_saver, ctl, uuid, trainer_as)

    restored = bool(torch.equal(engine.weight_sums(), sums))
    kept = engine.addresses() == addresses
    t0 = time.monotonic()
    second = engine.generate()
    generate_s.append(time.monotonic() - t0)
    equal = bool(torch.equal(first, second))
    trainer_done = figures["trainer"].get("exit_status") == 0 and "trained_steps" in figures["trainer"]
    print(json.dumps({
        "equal": equal, "weights_restored": restored, "addresses_kept": kept, "trainer_done": trainer_done,
        "tokens": first.numel(), "first_tokens": first[0, :8].tolist(), "graph": engine.graph is not None,
        "generate_s": generate_s, **figures, "moments": ctl.moments, "rmmctl": ctl.path,
    }))
    return 0 if equal and restored and kept and trainer_done else 1


if __name__ == "__main__":
    sys.exit(main())
