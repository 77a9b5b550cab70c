"""rmmd.safetensors.publish_dir: a Hugging Face style checkpoint directory
(index, shards, config.json) as buffers of the host pool, whole or split
into tensor-parallel ranks by an rmmd.tp.Plan, the guard refusing another
plan or revision, and ``python -m rmmd publish``. The GPU side is
test_checkpoint_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Daemon
from test_safetensors import write_safetensors

import rmmd
import rmmd.safetensors
import rmmd.tp

PLAN = rmmd.tp.Plan([("*.q_proj.weight", 0), ("*.q_proj.bias", 0), ("*.o_proj.weight", 1), ("conv*", 1)],
                    name="test")


def model_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(38)
    out: dict[str, np.ndarray] = {}
    for layer in range(3):
        p = f"model.layers.{layer}"
        out[f"{p}.self_attn.q_proj.weight"] = rng.standard_normal((8, 6)).astype(np.float32)
        out[f"{p}.self_attn.q_proj.bias"] = rng.standard_normal(8).astype(np.float16)
        out[f"{p}.self_attn.o_proj.weight"] = rng.standard_normal((6, 8)).astype(np.float32)
        out[f"{p}.norm.weight"] = rng.standard_normal(6).astype(np.float32)
    out["conv3d"] = rng.standard_normal((3, 4, 5)).astype(np.float32)  # split along dim 1 of 3
    out["ids"] = np.arange(10, dtype=np.int64)
    out["flags"] = np.array([True, False, True])
    return out


def write_checkpoint(directory: Path, shards: int = 3, config: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """A transformers-style directory: model-0000k-of-0000n.safetensors, the
    index and config.json."""
    tensors = model_tensors()
    names = list(tensors)
    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for k in range(shards):
        part = {n: tensors[n] for n in names[k::shards]}
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(directory / file, part, {"format": "pt"})
        weight_map.update({n: file for n in part})
    index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config or {
        "model_type": "tiny", "architectures": ["TinyForCausalLM"], "hidden_size": 6, "rms_norm_eps": 1e-5,
        "rope_scaling": {"type": "linear"}, "tie_word_embeddings": False,
    }))
    return tensors


def rank_slice(name: str, a: np.ndarray, rank: int, tp: int, plan: rmmd.tp.Plan = PLAN) -> np.ndarray:
    dim = plan.dim_of(name)
    if dim is None or tp == 1:
        return a
    n = a.shape[dim] // tp
    index = [slice(None)] * a.ndim
    index[dim] = slice(rank * n, (rank + 1) * n)
    return a[tuple(index)]


def check(buf: rmmd.SharedBuffer, want: dict[str, np.ndarray]) -> None:
    got = buf.tensors("numpy")
    assert set(got) == set(want)
    for name, a in want.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert np.array_equal(got[name], a), name


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_a_sharded_directory_becomes_one_buffer_with_its_config_as_labels(
    tmp_path: Path, daemon: Daemon, session: rmmd.Session, io: str
) -> None:
    tensors = write_checkpoint(tmp_path / "m")
    with rmmd.safetensors.publish_dir(tmp_path / "m", f"ckpt/one-{io}", session=session, pool=session.host_pool,
                                      labels={"revision": "r1"}, io=io, chunk_bytes=4096) as published:
        assert published.names == [f"ckpt/one-{io}"]
        assert [s.io for s in published.stats.shards] == [io] * 3
        phases = published.stats.phases
        assert {"plan", "open", "staging", "create", "publish"} <= set(phases), phases
        assert all(v >= 0 for v in phases.values()) and published.stats.as_dict()["phases"] == phases
        buf = published.buffers[0]
        check(buf, tensors)
        labels = buf.labels
        assert labels["revision"] == "r1" and labels["format"] == "pt"
        assert labels["config.model_type"] == "tiny" and labels["config.architectures"] == "TinyForCausalLM"
        assert labels["config.hidden_size"] == "6" and labels["config.rms_norm_eps"] == "1e-05"
        assert labels["config.tie_word_embeddings"] == "false" and "config.rope_scaling" not in labels
        assert len(labels["config.sha256"]) == 64 and labels["checkpoint.shards"] == "3"
        assert labels["checkpoint.bytes"] == str(published.stats.nbytes)
        # Files that keep their layout: each shard's tensors as in the file, after the last shard's.
        assert all(t.offset % t.itemsize == 0 for t in buf.manifest.tensors)
        other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="reader")
        with other:
            with rmmd.SharedBuffer.open(other, f"ckpt/one-{io}", expect={"revision": "r1"}) as seen:
                check(seen, tensors)
            with pytest.raises(rmmd.PreconditionError, match="label 'revision' is 'r1', expected 'r2'"):
                rmmd.SharedBuffer.open(other, f"ckpt/one-{io}", expect={"revision": "r2"})


def test_a_single_file_directory_and_a_file(tmp_path: Path, session: rmmd.Session) -> None:
    tensors = model_tensors()
    (tmp_path / "d").mkdir()
    write_safetensors(tmp_path / "d" / "model.safetensors", tensors)
    for path, name in ((tmp_path / "d", "ckpt/dir1"), (tmp_path / "d" / "model.safetensors", "ckpt/file1")):
        with rmmd.safetensors.publish_dir(path, name, session=session, pool=session.host_pool) as published:
            check(published.buffers[0], tensors)
            assert published.buffers[0].labels["checkpoint.shards"] == "1"


@pytest.mark.parametrize("chunk", [4096, 64, 1 << 20])  # rows split across reads; pieces; one read
def test_tp_ranks_hold_their_slices_and_the_rest_whole(tmp_path: Path, session: rmmd.Session, chunk: int) -> None:
    tensors = write_checkpoint(tmp_path / "m")
    with rmmd.safetensors.publish_dir(tmp_path / "m", f"ckpt/tp-{chunk}", session=session, pool=session.host_pool,
                                      tp=2, plan=PLAN, chunk_bytes=chunk, labels={"revision": "r1"}) as published:
        assert published.names == [f"ckpt/tp-{chunk}/rank0", f"ckpt/tp-{chunk}/rank1"]
        for rank, buf in enumerate(published.buffers):
            check(buf, {n: rank_slice(n, a, rank, 2) for n, a in tensors.items()})
            assert all(t.offset % 256 == 0 for t in buf.manifest.tensors if t.nbytes)
            labels = buf.labels
            assert (labels["tp.size"], labels["tp.rank"], labels["tp.plan.name"]) == ("2", str(rank), "test")
            assert rmmd.tp.Plan.from_json(labels["tp.plan"]) == PLAN
            assert labels["tp.plan.sha256"] == PLAN.sha256
        # Each tensor was read once, whatever number of ranks it feeds.
        assert published.stats.nbytes == sum(a.nbytes for a in tensors.values())


def test_a_rank_whose_buffer_cannot_be_made_fails_the_publish_and_leaves_nothing(
    tmp_path: Path, session: rmmd.Session
) -> None:
    # The buffers are made while the reads start: the refusal of rank 1's
    # (its name taken) is the publish's, rank 0's buffer goes, and the
    # buffer that held the name is untouched.
    write_checkpoint(tmp_path / "m")
    with rmmd.SharedBuffer.create(session, "ckpt/taken/rank1", 4096, pool=session.host_pool) as taken:
        taken.publish()
        with pytest.raises(rmmd.AlreadyExistsError, match="ckpt/taken/rank1"):
            rmmd.safetensors.publish_dir(tmp_path / "m", "ckpt/taken", session=session, pool=session.host_pool,
                                         tp=2, plan=PLAN, chunk_bytes=4096, persistent=True)
        assert [b.name for b in session.buffers(prefix="ckpt/taken")] == ["ckpt/taken/rank1"]
        assert session.describe_buffer("ckpt/taken/rank1")[0].nbytes == 4096


def test_the_guard_refuses_another_plan_rank_or_revision(tmp_path: Path, daemon: Daemon, session: rmmd.Session) -> None:
    tensors = write_checkpoint(tmp_path / "m")
    published = rmmd.safetensors.publish_dir(tmp_path / "m", "ckpt/guard", session=session, pool=session.host_pool,
                                             tp=2, plan=PLAN, labels={"revision": "r1"})
    with published:
        other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="rank1")
        with other:
            with rmmd.safetensors.open_rank(other, "ckpt/guard", rank=1, tp=2, plan=PLAN,
                                            expect={"revision": "r1"}) as buf:
                check(buf, {n: rank_slice(n, a, 1, 2) for n, a in tensors.items()})
            other_plan = rmmd.tp.Plan([*PLAN.rules[:-1]], name="test")  # conv3d replicated instead
            with pytest.raises(rmmd.PreconditionError,
                               match=f"label 'tp.plan.sha256' is '{PLAN.sha256}', expected '{other_plan.sha256}'"):
                rmmd.safetensors.open_rank(other, "ckpt/guard", rank=1, tp=2, plan=other_plan)
            with pytest.raises(rmmd.PreconditionError, match="label 'revision' is 'r1', expected 'r0'"):
                rmmd.safetensors.open_rank(other, "ckpt/guard", rank=0, tp=2, plan=PLAN, expect={"revision": "r0"})
            # rank 0's buffer opened as rank 1 (a name mixed up): refused by tp.rank
            with pytest.raises(rmmd.PreconditionError, match="label 'tp.rank' is '0', expected '1'"):
                rmmd.SharedBuffer.open(other, "ckpt/guard/rank0", expect=rmmd.safetensors.rank_expect(2, 1, PLAN))
            with pytest.raises(rmmd.PreconditionError, match="label 'tp.size' is '2', expected '4'"):
                rmmd.safetensors.open_rank(other, "ckpt/guard", rank=0, tp=4, plan=PLAN)
            with pytest.raises(rmmd.NotFoundError):
                rmmd.safetensors.open_rank(other, "ckpt/guard", rank=3, tp=4, plan=PLAN)


def test_a_plan_that_does_not_divide_a_tensor_is_refused_and_nothing_is_made(
    tmp_path: Path, session: rmmd.Session
) -> None:
    write_checkpoint(tmp_path / "m")
    with pytest.raises(rmmd.InvalidArgumentError, match=r"'conv3d' \(shape \[3, 4, 5\]\) along dim 1 into 3 ranks"):
        rmmd.safetensors.publish_dir(tmp_path / "m", "ckpt/bad", session=session, pool=session.host_pool,
                                     tp=3, plan=rmmd.tp.Plan([("conv*", 1)]))
    with pytest.raises(rmmd.InvalidArgumentError, match="along dim 3, which it does not have"):
        rmmd.safetensors.publish_dir(tmp_path / "m", "ckpt/bad", session=session, pool=session.host_pool,
                                     tp=2, plan=rmmd.tp.Plan([("ids", 3)]))
    assert session.buffers(prefix="ckpt/bad") == []


def test_an_index_that_disagrees_with_its_shards_is_refused(tmp_path: Path, session: rmmd.Session) -> None:
    write_checkpoint(tmp_path / "m")
    index_path = tmp_path / "m" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    cases = [
        ({**index["weight_map"], "ids": "model-00001-of-00003.safetensors"}, "puts tensor 'ids' in model-00001"),
        ({**index["weight_map"], "ghost": "model-00001-of-00003.safetensors"}, "puts tensor 'ghost' in"),
        ({**index["weight_map"], "ghost": "model-00009-of-00009.safetensors"}, "names model-00009-of-00009"),
        ({k: v for k, v in index["weight_map"].items() if k != "ids"}, "holds tensor 'ids', which the index"),
    ]
    for weight_map, message in cases:
        index_path.write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(rmmd.InvalidArgumentError, match=message):
            rmmd.safetensors.publish_dir(tmp_path / "m", "ckpt/bad", session=session, pool=session.host_pool)
    with pytest.raises(rmmd.InvalidArgumentError, match="no such file or directory"):
        rmmd.safetensors.publish_dir(tmp_path / "nothing", "ckpt/bad", session=session, pool=session.host_pool)
    assert session.buffers(prefix="ckpt/bad") == []


def test_the_publish_command(tmp_path: Path, daemon: Daemon) -> None:
    tensors = write_checkpoint(tmp_path / "m")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(PLAN.to_json())
    out = subprocess.run(
        [sys.executable, "-m", "rmmd", "publish", str(tmp_path / "m"), "--name", "ckpt/cli", "--pool", "host",
         "--tp", "2", "--plan", str(plan_file), "--label", "revision=r7", "--persistent", "--chunk-mib", "1"],
        env=daemon.env(), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'm'}: 3 shard(s)")
    assert [ln.split(":")[0].strip() for ln in lines[1:4]] == [
        f"shard {k}/3 model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)
    ]
    assert all("GiB/s" in ln for ln in lines[1:5])
    assert "ckpt/cli/rank0 rank 0/2 on host" in out.stdout and "ckpt/cli/rank1 rank 1/2 on host" in out.stdout
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir)) as s:
        for rank in (0, 1):
            with rmmd.safetensors.open_rank(s, "ckpt/cli", rank, 2, PLAN, expect={"revision": "r7"}) as buf:
                check(buf, {n: rank_slice(n, a, rank, 2) for n, a in tensors.items()})
            rmmd.SharedBuffer.delete(s, f"ckpt/cli/rank{rank}")
    listed = daemon.rmmctl("buffers")
    assert "ckpt/cli" not in listed
    bad = subprocess.run([sys.executable, "-m", "rmmd", "publish", str(tmp_path / "none"), "--name", "x"],
                         env=daemon.env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "rmmd publish: rmmd:" in bad.stderr and "no such file" in bad.stderr


def test_json_output_of_the_command(tmp_path: Path, daemon: Daemon) -> None:
    write_checkpoint(tmp_path / "m")
    out = subprocess.run(
        [sys.executable, "-m", "rmmd", "publish", str(tmp_path / "m"), "--name", "ckpt/json", "--pool", "host",
         "--persistent", "--json"],
        env=daemon.env(), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [b["name"] for b in got["buffers"]] == ["ckpt/json"] and got["buffers"][0]["tensors"] == 15
    assert len(got["load"]["shards"]) == 3 and got["load"]["bytes"] > 0
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir)) as s:
        rmmd.SharedBuffer.delete(s, "ckpt/json")
    assert os.environ.get("RMMD_RUNTIME_DIR") is None
