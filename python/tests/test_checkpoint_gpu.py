"""Checkpoints on the GPU host: a sharded directory published whole and
attached bitwise equal to safetensors.torch.load_file of each shard; TP 2
slices on two GPUs equal to the slices of the full tensors; the guard
refusing another plan or revision; JAX's arrays equal to NumPy's read of
the files; the transformers example. Each side in its own process.
Skipped, saying why, without a GPU (two for TP 2), PyTorch, safetensors,
JAX or transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import REPO, SCRIPTS, Daemon, gpu_count, need_module, read_line, run_python, start_python

pytestmark = pytest.mark.gpu

CLIENT = str(SCRIPTS / "checkpoint_client.py")
EXAMPLE = REPO / "examples" / "python" / "transformers_attach" / "run.py"


@pytest.fixture(scope="module")
def checkpoint(gpu_daemon: Daemon, tmp_path_factory: Any) -> Path:
    need_module("torch")
    need_module("safetensors")
    directory = tmp_path_factory.mktemp("ckpt") / "llama"
    run_python([CLIENT, "make", str(directory), "4"], gpu_daemon.env())
    return directory


def published(daemon: Daemon, directory: Path, name: str, devices: str, tp: int) -> Iterator[dict[str, Any]]:
    producer = start_python([CLIENT, "publish", str(directory), name, devices, str(tp)], daemon.env())
    said = json.loads(read_line(producer))
    yield said
    producer.communicate("\n", timeout=120)
    assert producer.returncode == 0


def test_a_sharded_directory_attaches_bitwise_equal_to_load_file(gpu_daemon: Daemon, checkpoint: Path) -> None:
    for said in published(gpu_daemon, checkpoint, "ckpt/whole", "0", 1):
        assert said["names"] == ["ckpt/whole"] and len(said["load"]["shards"]) == 4
        got = json.loads(run_python([CLIENT, "check", str(checkpoint), "ckpt/whole", "0", "1"], gpu_daemon.env()).stdout)
        assert got["tensors"] == 39 and all(got["same"].values()), got["same"]
        assert not got["writable"] and got["device"] == 0
        said = json.loads(run_python([CLIENT, "refuse", "ckpt/whole", "1"], gpu_daemon.env()).stdout)
        assert said["plan"] is None  # tp 1: no plan to differ
        assert "label 'revision' is 'r1', expected 'r2'" in said["revision"], said


def test_tp2_slices_on_two_gpus_equal_the_slices_of_the_full_tensors_and_the_guard(gpu_daemon: Daemon, checkpoint: Path) -> None:
    if gpu_count() < 2:
        pytest.skip(f"TP 2 needs two GPUs; this machine has {gpu_count()}")
    for said in published(gpu_daemon, checkpoint, "ckpt/tp2", "0,1", 2):
        assert said["names"] == ["ckpt/tp2/rank0", "ckpt/tp2/rank1"] and said["devices"] == [0, 1]
        for rank in (0, 1):
            got = json.loads(run_python([CLIENT, "check", str(checkpoint), "ckpt/tp2", str(rank), "2"],
                                        gpu_daemon.env()).stdout)
            assert got["device"] == rank and all(got["same"].values()), got["same"]
        said = json.loads(run_python([CLIENT, "refuse", "ckpt/tp2", "2"], gpu_daemon.env()).stdout)
        assert "label 'tp.plan.sha256' is" in said["plan"], said
        assert "label 'revision' is 'r1', expected 'r2'" in said["revision"], said


def test_jax_arrays_equal_numpys_read_of_the_files(gpu_daemon: Daemon, checkpoint: Path) -> None:
    need_module("jax")
    env = gpu_daemon.env(XLA_PYTHON_CLIENT_PREALLOCATE="false")
    for _ in published(gpu_daemon, checkpoint, "ckpt/jax", "0", 1):
        got = json.loads(run_python([CLIENT, "jax", str(checkpoint), "ckpt/jax"], env).stdout)
        assert all(got["same"].values()), got["same"]
        assert all(got["zero_copy"].values()) and got["copied"] == [], got
        # The checkpoint's int64 position_ids: refused by name without jax_enable_x64.
        assert got["wide"], got
        assert got["refused_64bit"] and got["wide"][0] in got["refused_64bit"], got
        assert "jax_enable_x64" in got["refused_64bit"], got


def test_the_transformers_example(gpu_daemon: Daemon, tmp_path: Path) -> None:
    need_module("torch")
    need_module("transformers")
    out = run_python([str(EXAMPLE), "--dir", str(tmp_path / "tiny-llama"), "--device", "0"], gpu_daemon.env(),
                     timeout=300, check=False)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["equal"] and got["max_abs_diff"] == 0.0 and got["parameters_in_buffer"]
    assert len(got["shards"]) >= 2 and got["labels"]["config.model_type"] == "llama"
    assert os.path.exists(tmp_path / "tiny-llama" / "model.safetensors.index.json")
