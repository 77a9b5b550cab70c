"""A process of the checkpoint tests on the GPU host (RMMD_RUNTIME_DIR names
the daemon). Prints one line of JSON when it has done its part; `publish`
then waits for a line on stdin before it closes its buffers.

  make DIR SHARDS          a Llama-named checkpoint, random (seed 38):
                           bf16, f32, f16 and i64 tensors in SHARDS files,
                           the index and config.json
  publish DIR NAME DEVS TP rmmd.safetensors.publish_dir(devices=DEVS (0,1), tp=TP)
  check DIR NAME RANK TP   open_rank(rank, tp, llama plan, revision r1): every
                           tensor against safetensors.torch.load_file of its
                           shard on the buffer's GPU (rank's slice for TP),
                           byte for byte
  refuse NAME TP           the guard: another plan, another revision
  jax DIR NAME             rmmd.jax.attach(NAME): every array against NumPy's
                           read of the file's bytes, and its address
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import rmmd
import rmmd.safetensors
import rmmd.tp

PLAN = rmmd.tp.Plan.llama()


def make(directory: Path, shards: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(38)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(512, 256, generator=g).bfloat16()}
    for i in range(4):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = torch.randn(256, 256, generator=g).bfloat16()
        t[f"{p}.self_attn.k_proj.weight"] = torch.randn(128, 256, generator=g).bfloat16()
        t[f"{p}.self_attn.v_proj.weight"] = torch.randn(128, 256, generator=g).bfloat16()
        t[f"{p}.self_attn.q_proj.bias"] = torch.randn(256, generator=g).half()
        t[f"{p}.self_attn.o_proj.weight"] = torch.randn(256, 256, generator=g).float()
        t[f"{p}.mlp.gate_proj.weight"] = torch.randn(1024, 256, generator=g).bfloat16()
        t[f"{p}.mlp.up_proj.weight"] = torch.randn(1024, 256, generator=g).bfloat16()
        t[f"{p}.mlp.down_proj.weight"] = torch.randn(256, 1024, generator=g).bfloat16()
        t[f"{p}.input_layernorm.weight"] = torch.randn(256, generator=g).float()
    t["lm_head.weight"] = torch.randn(512, 256, generator=g).bfloat16()
    t["position_ids"] = torch.arange(77, dtype=torch.int64)
    directory.mkdir(parents=True, exist_ok=True)
    names = list(t)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: t[n] for n in names[k::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 256}))
    print(json.dumps({"tensors": len(t), "shards": shards}), flush=True)


def publish(directory: str, name: str, devices: str, tp: int) -> None:
    devs = [int(d) for d in devices.split(",")]
    published = rmmd.safetensors.publish_dir(directory, name, devices=devs, tp=tp, labels={"revision": "r1"},
                                             chunk_bytes=1 << 20)  # many reads, rows of a split across them
    print(json.dumps({"names": published.names, "devices": published.devices, "load": published.stats.as_dict()}),
          flush=True)
    sys.stdin.readline()
    published.close()


def check(directory: str, name: str, rank: int, tp: int) -> None:
    import torch
    from safetensors.torch import load_file

    session = rmmd.Session(client_name="check")
    buf = rmmd.safetensors.open_rank(session, name, rank, tp, PLAN if tp > 1 else None, expect={"revision": "r1"})
    torch.cuda.set_device(buf.device)
    got = buf.tensors("torch")
    same = {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        for n, full in load_file(str(shard), device=f"cuda:{buf.device}").items():
            want = full
            sl = PLAN.slice_of(n, full.shape, rank, tp)
            if sl.dim is not None:
                want = full.narrow(sl.dim, sl.start, sl.stop - sl.start)
            g = got[n]
            same[n] = (g.shape == want.shape and g.dtype == want.dtype and g.device == want.device
                       and bool(torch.equal(g.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))))
    print(json.dumps({"same": same, "device": buf.device, "writable": buf.writable, "tensors": len(got)}), flush=True)


def refuse(name: str, tp: int) -> None:
    session = rmmd.Session(client_name="refuse")
    said = {}
    other = rmmd.tp.Plan(PLAN.rules[:-1], name="llama")  # down_proj replicated: another plan
    for what, kwargs in (("plan", {"plan": other}), ("revision", {"plan": PLAN, "expect": {"revision": "r2"}})):
        try:
            rmmd.safetensors.open_rank(session, name, 0, tp, **kwargs).close()
            said[what] = None
        except rmmd.PreconditionError as e:
            said[what] = str(e)
    print(json.dumps(said), flush=True)


def jax_check(directory: str, name: str) -> None:
    import numpy as np

    import jax

    import rmmd.jax
    from rmmd._views import numpy_dtype

    # Without 64-bit types JAX would convert int64 tensors (position_ids):
    # copy=False refuses, naming the tensor and the way out.
    try:
        rmmd.jax.attach(name, expect={"revision": "r1"})
        refused_64bit = None
    except rmmd.InvalidArgumentError as e:
        refused_64bit = str(e)
    jax.config.update("jax_enable_x64", True)
    attached = rmmd.jax.attach(name, expect={"revision": "r1"})
    buf = attached.buffer
    same, zero_copy = {}, {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        header = rmmd.safetensors.read_header(shard)
        raw = np.memmap(shard, dtype=np.uint8, mode="r")
        for t in header.tensors:
            want = raw[header.data_start + t.begin : header.data_start + t.end].view(numpy_dtype(t.dtype)).reshape(t.shape)
            a = attached[t.name]
            got = np.asarray(a)
            same[t.name] = got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()
            zero_copy[t.name] = a.unsafe_buffer_pointer() == buf.ptr + buf.manifest[t.name].offset
    wide = sorted(t.name for t in buf.manifest.tensors if t.dtype in ("int64", "uint64", "float64", "complex128"))
    print(json.dumps({"same": same, "zero_copy": zero_copy, "copied": attached.copied,
                      "wide": wide, "refused_64bit": refused_64bit,
                      "device": str(next(iter(attached.values())).devices())}), flush=True)


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(Path(args[0]), int(args[1]))
    elif cmd == "publish":
        publish(args[0], args[1], args[2], int(args[3]))
    elif cmd == "check":
        check(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "refuse":
        refuse(args[0], int(args[1]))
    elif cmd == "jax":
        jax_check(args[0], args[1])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
