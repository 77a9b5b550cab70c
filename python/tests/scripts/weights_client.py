"""A process of the model-weights tests on the GPU host (RMMD_RUNTIME_DIR
names the daemon). Prints one line of JSON when it has done its part;
`publish` and `st-publish` then wait for a line on stdin before they close.

  publish NAME [--pool P]      rmmd.torch.publish of Tiny (seed 0) on GPU 0
  attach NAME [--expect K=V]   Tiny on the meta device, rmmd.torch.attach;
                               its logits, memory growth, where its
                               parameters point
  load NAME                    rmmd.torch.load_state_dict, against Tiny's own
  cupy NAME                    buffer.tensors("cupy"): each tensor's sum
  write NAME                   a read-only consumer writes a weight
  read NAME                    the sums again (after another process wrote)
  st-publish PATH NAME CHUNK   rmmd.safetensors.publish_file to GPU 0
  st-check PATH NAME           load_state_dict(NAME) against the file read by
                               safetensors.torch.load_file(device="cuda")
                               (or by NumPy where safetensors is missing)
"""

from __future__ import annotations

import json
import sys

import torch

import rmmd
import rmmd.safetensors
import rmmd.torch


class Tiny(torch.nn.Module):
    """Tied embedding and output weights, a transposed (dense,
    non-contiguous) buffer, a strided slice (with gaps), a bfloat16
    parameter, and a 64 MiB weight, so that memory growth shows."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(2)])
        self.norm = torch.nn.LayerNorm(32)
        self.lm_head = torch.nn.Linear(32, 64, bias=False)
        self.lm_head.weight = self.embed.weight
        self.gate = torch.nn.Parameter(torch.randn(32).to(torch.bfloat16))
        self.big = torch.nn.Parameter(torch.randn(4096, 4096))
        self.register_buffer("mix_t", torch.randn(32, 32).t())
        self.register_buffer("scale", torch.randn(64, 32)[:, ::2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) @ self.mix_t
        h = h @ self.big[:32, :32]
        for layer in self.layers:
            h = torch.relu(layer(h))
        h = self.norm(h * self.gate.float())
        h = h + self.scale[x][..., :1]  # a gather: no sum whose order the layout could change
        return self.lm_head(h)


WEIGHT_BYTES = 4096 * 4096 * 4


def reference() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def tokens() -> torch.Tensor:
    return (torch.arange(16, device="cuda").reshape(2, 8) * 7) % 64


def hexof(t: torch.Tensor) -> str:
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes().hex()


def sums(tensors: dict) -> dict[str, float]:  # type: ignore[type-arg]
    return {k: float(v.double().sum()) if hasattr(v, "double") else float(v.astype("float64").sum())
            for k, v in tensors.items()}


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def main(argv: list[str]) -> int:
    cmd = argv[0]
    session = rmmd.Session(client_name=f"weights-{cmd}")
    if cmd == "publish":
        model = reference().cuda().eval()
        with torch.no_grad():
            logits = model(tokens())
        buf = rmmd.torch.publish(argv[1], model, session=session, pool=option(argv, "--pool"),
                                 labels={"model": "tiny", "revision": "r1"})
        m = buf.manifest
        say(id=buf.id, nbytes=buf.nbytes, logits=hexof(logits), labels=buf.labels,
            sums=sums(model.state_dict()),
            entries={t.name: {"offset": t.offset, "strides": t.strides, "aliases": list(t.aliases),
                              "dtype": t.dtype} for t in m.tensors})
        sys.stdin.readline()
        buf.close()
        say(closed=True)
    elif cmd == "attach":
        torch.zeros(1, device="cuda")  # the CUDA context first, then measure
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        free_before = torch.cuda.mem_get_info()[0]
        with torch.device("meta"):
            model = Tiny()
        expect = dict(kv.split("=", 1) for kv in argv[2:] if "=" in kv) or None
        buf = rmmd.torch.attach(argv[1], model, session=session, expect=expect)
        grown = torch.cuda.memory_allocated() - allocated
        free_drop = free_before - torch.cuda.mem_get_info()[0]
        inside = all(buf.ptr <= p.data_ptr() < buf.ptr + buf.nbytes
                     for p in list(model.parameters()) + list(model.buffers()))
        with torch.no_grad():
            logits = model.eval()(tokens())
        say(logits=hexof(logits), grown=grown, free_drop=free_drop, inside=inside,
            tied=model.lm_head.weight is model.embed.weight,
            requires_grad=any(p.requires_grad for p in model.parameters()),
            mix_t_strides=list(model.mix_t.stride()), scale_contiguous=model.scale.is_contiguous(),
            gate_dtype=str(model.gate.dtype), kept=model._rmmd_buffer is buf, writable=buf.writable)
    elif cmd == "load":
        tensors = rmmd.torch.load_state_dict(argv[1], session=session)
        want = reference().state_dict()
        same = {k: bool(torch.equal(tensors[k].cpu(), v)) for k, v in want.items()}
        say(same=same, keys=sorted(tensors), device=str(tensors["big"].device),
            tied=tensors["lm_head.weight"] is tensors["embed.weight"])
    elif cmd == "cupy":
        import cupy

        buf = rmmd.SharedBuffer.open(session, argv[1])
        # bfloat16 is no CuPy dtype: every tensor but that one
        arrays = buf.tensors("cupy", names=[t.name for t in buf.manifest.tensors if t.dtype != "bfloat16"])
        out = {k: float(cupy.asnumpy(a.astype(cupy.float64).sum())) for k, a in arrays.items()}
        say(sums=out, tied=arrays["lm_head.weight"] is arrays["embed.weight"],
            zero_copy=int(arrays["big"].data.ptr) == buf.ptr + buf.manifest["big"].offset)
    elif cmd == "write":
        tensors = rmmd.torch.load_state_dict(argv[1], session=session)
        try:
            tensors["big"].add_(1)
            torch.cuda.synchronize()
            say(wrote=True)
        except RuntimeError as e:
            say(wrote=False, error=str(e).splitlines()[0])
        return 0
    elif cmd == "read":
        tensors = rmmd.torch.load_state_dict(argv[1], session=session)
        say(sums=sums(tensors))
    elif cmd == "st-publish":
        buf = rmmd.safetensors.publish_file(argv[1], argv[2], session=session, device=0,
                                            chunk_bytes=int(argv[3]), labels={"from": "file"})
        say(id=buf.id, nbytes=buf.nbytes, labels=buf.labels, tensors=len(buf.manifest))
        sys.stdin.readline()
        buf.close()
        say(closed=True)
    elif cmd == "st-check":
        tensors = rmmd.torch.load_state_dict(argv[2], session=session)
        try:
            from safetensors.torch import load_file

            want = load_file(argv[1], device="cuda")
            how = "safetensors.torch.load_file"
        except ImportError:
            want = by_numpy(argv[1])
            how = "numpy"
        same = {k: bool(torch.equal(tensors[k], v)) and tensors[k].dtype == v.dtype for k, v in want.items()}
        say(same=same, how=how, keys=sorted(tensors))
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


def by_numpy(path: str) -> dict[str, torch.Tensor]:
    import numpy as np

    header = rmmd.safetensors.read_header(path)
    data = np.fromfile(path, dtype=np.uint8)[header.data_start:]
    out = {}
    for t in header.tensors:
        raw = torch.from_numpy(data[t.begin:t.end].copy())
        out[t.name] = raw.view(getattr(torch, t.dtype)).reshape(t.shape).cuda()
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
