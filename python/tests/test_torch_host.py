"""rmmd.torch with CPU tensors in the host pool: publish a module, attach a
meta-device copy of it, load_state_dict; how tensors are laid out (tied,
non-contiguous, empty). Runs wherever PyTorch is installed, GPU or not
(test_weights_gpu.py does device buffers, across processes)."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from conftest import Daemon, need_module

import rmmd


@pytest.fixture
def torch() -> Any:
    need_module("torch")
    import torch

    return torch


def tiny(torch: Any) -> Any:
    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 16)
            self.proj = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(16, 50, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.register_buffer("mix_t", torch.randn(16, 16).t())  # dense, not contiguous
            self.register_buffer("every_other", torch.randn(50, 8)[:, ::2])  # gaps
            self.register_buffer("nothing", torch.zeros(0, 3))
            self.gate = torch.nn.Parameter(torch.randn(16, dtype=torch.bfloat16))

        def forward(self, x: Any) -> Any:
            h = self.embed(x) @ self.mix_t
            h = torch.tanh(self.proj(h)) * self.gate.float()
            return self.head(h) + self.every_other[x][..., :1]

    return Tiny


def test_the_layout_stores_tied_weights_once_and_keeps_dense_strides(torch: Any) -> None:
    import rmmd.torch

    torch.manual_seed(0)
    model = tiny(torch)()
    planned, nbytes = rmmd.torch.plan_layout(model.state_dict())
    entries = {p.entry.name: p for p in planned}
    assert entries["embed.weight"].entry.aliases == ("head.weight",) and "head.weight" not in entries
    assert entries["mix_t"].entry.strides == (1, 16) and not entries["mix_t"].made_contiguous
    assert entries["every_other"].entry.strides is None and entries["every_other"].made_contiguous
    assert entries["nothing"].entry.extent == 0
    assert entries["gate"].entry.dtype == "bfloat16"
    assert all(p.entry.offset % 256 == 0 for p in planned)
    spans = sorted((p.entry.offset, p.entry.offset + p.entry.extent) for p in planned if p.entry.extent)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no overlap
    assert nbytes >= spans[-1][1] and nbytes % 256 == 0


def test_a_published_module_attaches_to_a_meta_module(torch: Any, daemon: Daemon, session: rmmd.Session) -> None:
    import rmmd.torch

    torch.manual_seed(0)
    Tiny = tiny(torch)
    model = Tiny().eval()
    x = torch.tensor([[1, 5, 7], [49, 0, 3]])
    with torch.no_grad():
        want = model(x)
    buf = rmmd.torch.publish("torch/tiny", model, session=session, pool=session.host_pool,
                             labels={"revision": "r1"})
    assert buf.labels["framework"] == f"torch {torch.__version__}" and buf.labels["revision"] == "r1"
    other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="worker")
    with torch.device("meta"):
        worker = Tiny()
    held = rmmd.torch.attach("torch/tiny", worker, session=other, expect={"revision": "r1"})
    assert worker._rmmd_buffer is held and not held.writable
    with torch.no_grad():
        got = worker.eval()(x)
    assert torch.equal(got, want)  # bit for bit
    assert worker.head.weight is worker.embed.weight  # tied: one Parameter
    assert not any(p.requires_grad for p in worker.parameters())
    assert worker.mix_t.stride() == (1, 16) and worker.every_other.is_contiguous()
    for t in list(worker.parameters()) + list(worker.buffers()):
        assert t.device.type == "cpu"
        if t.numel():
            assert held.ptr <= t.data_ptr() < held.ptr + held.nbytes  # views of the buffer
    state = rmmd.torch.load_state_dict("torch/tiny", session=other)
    assert state["head.weight"] is state["embed.weight"]
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v), k
    with pytest.raises(rmmd.PreconditionError, match="label 'revision' is 'r1', expected 'r2'"):
        rmmd.torch.attach("torch/tiny", Tiny().to("meta"), session=other, expect={"revision": "r2"})
    del worker, state, held, t  # (t: the last of the views looked at)
    gc.collect()
    assert other.buffers(prefix="torch/tiny")[0].holders == 1  # the worker let go with its module
    buf.close()
    other.close()


def test_attach_refuses_meta_buffers_nothing_fills(torch: Any, daemon: Daemon, session: rmmd.Session) -> None:
    import rmmd.torch

    class WithTable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    with rmmd.torch.publish("torch/table", WithTable(), session=session, pool=session.host_pool):
        with torch.device("meta"):
            m = WithTable()
        other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="worker")
        with pytest.raises(rmmd.InvalidArgumentError, match="table"):
            rmmd.torch.attach("torch/table", m, session=other)
        rmmd.torch.attach("torch/table", m, session=other, strict=False)
        assert torch.equal(m.w, torch.ones(4)) and m.table.is_meta


def test_publish_refuses_what_a_buffer_cannot_hold(torch: Any, session: rmmd.Session) -> None:
    import rmmd.torch

    with pytest.raises(rmmd.InvalidArgumentError, match="meta device"):
        rmmd.torch.publish("torch/meta", {"w": torch.empty(3, device="meta")}, session=session,
                           pool=session.host_pool)
    with pytest.raises(rmmd.InvalidArgumentError, match="not a tensor"):
        rmmd.torch.publish("torch/odd", {"w": 3}, session=session, pool=session.host_pool)
    assert session.buffers(prefix="torch/meta") == [] and session.buffers(prefix="torch/odd") == []
