"""Model weights shared through rmmd on the GPU host: rmmd.torch.publish in
one process, attach and load_state_dict in others (each its own process, as
workers are), CuPy views, a read-only consumer that writes, and
rmmd.safetensors.publish_file against safetensors' own loader. Skipped,
saying why, without a GPU or PyTorch."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import SCRIPTS, Daemon, need_module, read_line, run_python, start_python

pytestmark = pytest.mark.gpu

CLIENT = str(SCRIPTS / "weights_client.py")
WEIGHT_BYTES = 4096 * 4096 * 4  # Tiny.big


@pytest.fixture
def torch_daemon(gpu_daemon: Daemon) -> Daemon:
    need_module("torch")
    return gpu_daemon


@pytest.fixture
def published(torch_daemon: Daemon, request: Any) -> Iterator[dict[str, Any]]:
    """Tiny published as 'weights/<test>' by a process that holds it."""
    name = f"weights/{request.node.name}".replace("[", "-").replace("]", "")
    producer = start_python([CLIENT, "publish", name], torch_daemon.env())
    said = json.loads(read_line(producer))
    said["name"] = name
    yield said
    out, err = producer.communicate("\n", timeout=120)
    assert producer.returncode == 0, err
    assert json.loads(out) == {"closed": True}


def test_publish_lays_out_tied_and_non_contiguous_tensors(published: dict[str, Any]) -> None:
    entries = published["entries"]
    assert entries["embed.weight"]["aliases"] == ["lm_head.weight"]  # tied: one copy
    assert "lm_head.weight" not in entries
    assert entries["mix_t"]["strides"] == [1, 32]  # transposed: kept as it is
    assert entries["scale"]["strides"] is None  # a strided slice: stored contiguous
    assert entries["gate"]["dtype"] == "bfloat16"
    assert all(e["offset"] % 256 == 0 for e in entries.values())
    assert published["labels"]["model"] == "tiny" and published["labels"]["framework"].startswith("torch ")
    assert published["labels"]["rmmd.gpu_uuid"].startswith("GPU-")


@pytest.mark.gpu_exclusive  # free_drop: the device's free memory, which every process changes
def test_a_module_on_the_meta_device_attaches_in_another_process(
    torch_daemon: Daemon, published: dict[str, Any]
) -> None:
    got = json.loads(run_python([CLIENT, "attach", published["name"], "revision=r1"], torch_daemon.env()).stdout)
    assert got["logits"] == published["logits"]  # bit for bit
    assert got["grown"] == 0  # torch.cuda.memory_allocated: no weights of its own
    assert got["free_drop"] < WEIGHT_BYTES // 2  # the device's free memory did not drop by the weights
    assert got["inside"]  # every parameter and buffer points into the shared buffer
    assert got["tied"] and not got["requires_grad"] and got["kept"] and not got["writable"]
    assert got["mix_t_strides"] == [1, 32] and got["scale_contiguous"]
    assert got["gate_dtype"] == "torch.bfloat16"


def test_attach_refuses_another_revision(torch_daemon: Daemon, published: dict[str, Any]) -> None:
    out = run_python([CLIENT, "attach", published["name"], "revision=r2"], torch_daemon.env(), check=False)
    assert out.returncode != 0
    assert f"buffer '{published['name']}': label 'revision' is 'r1', expected 'r2'" in out.stderr


def test_load_state_dict_gives_the_tensors_the_model_had(torch_daemon: Daemon, published: dict[str, Any]) -> None:
    got = json.loads(run_python([CLIENT, "load", published["name"]], torch_daemon.env()).stdout)
    assert got["same"] and all(got["same"].values()), got["same"]
    assert "lm_head.weight" in got["keys"] and got["tied"] and got["device"] == "cuda:0"


def test_cupy_gets_the_same_tensors(torch_daemon: Daemon, published: dict[str, Any]) -> None:
    need_module("cupy")
    got = json.loads(run_python([CLIENT, "cupy", published["name"]], torch_daemon.env()).stdout)
    assert got["tied"] and got["zero_copy"]
    assert "gate" not in got["sums"] and "lm_head.weight" in got["sums"]
    for name, total in got["sums"].items():
        assert total == pytest.approx(published["sums"][name], rel=1e-6, abs=1e-6), name


def test_a_read_only_consumer_that_writes_fails_alone(torch_daemon: Daemon, published: dict[str, Any]) -> None:
    env = torch_daemon.env()
    got = json.loads(run_python([CLIENT, "write", published["name"]], env, check=False).stdout.splitlines()[-1])
    assert not got["wrote"], "a write through a read-only mapping succeeded"
    # Every other holder still reads the original bytes.
    seen = json.loads(run_python([CLIENT, "read", published["name"]], env).stdout)
    assert seen["sums"]["big"] == pytest.approx(published["sums"]["big"], rel=1e-9, abs=1e-6)


def write_safetensors(path: Path, n_big: int) -> None:
    """A file of several dtypes, its data larger than the chunks below."""
    import numpy as np

    rng = np.random.default_rng(7)
    tensors = {
        "a.weight": rng.standard_normal((n_big, 1024)).astype(np.float32),
        "a.bias": rng.standard_normal(1024).astype(np.float16),
        "ids": np.arange(100, dtype=np.int64),
        "mask": rng.standard_normal(33) > 0,
    }
    code = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
            np.dtype(np.bool_): "BOOL"}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, a in tensors.items():
        header[name] = {"dtype": code[a.dtype], "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("chunk", [1 << 20, 64 << 20])  # many chunks, double-buffered; one
def test_a_safetensors_file_goes_to_the_gpu_as_torch_reads_it(
    torch_daemon: Daemon, tmp_path: Path, chunk: int
) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, 2000)  # 8 MB of float32
    name = f"st/gpu-{chunk}"
    producer = start_python([CLIENT, "st-publish", str(path), name, str(chunk)], torch_daemon.env())
    made = json.loads(read_line(producer))
    assert made["tensors"] == 4 and made["labels"]["from"] == "file" and made["labels"]["format"] == "pt"
    got = json.loads(run_python([CLIENT, "st-check", str(path), name], torch_daemon.env()).stdout)
    assert got["same"] and all(got["same"].values()), got
    producer.communicate("\n", timeout=120)
    assert producer.returncode == 0
