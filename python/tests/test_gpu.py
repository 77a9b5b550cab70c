"""PyTorch and CuPy on rmmd's device memory (GPU host). Each scenario runs in
a child process (a process's allocator must be chosen before its first CUDA
allocation); these tests skip, saying why, without a GPU, PyTorch or CuPy."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, RMMCTL, SCRIPTS, Daemon, need_module, read_line, run_python, start_python, wait_until

pytestmark = pytest.mark.gpu

TORCH = str(SCRIPTS / "torch_client.py")
CUPY = str(SCRIPTS / "cupy_client.py")
EXAMPLES = REPO / "examples" / "python"
WAYS = ["mempool", "allocator"]
MODES = ["slab", "direct"]


def cuda_in_use(d: Daemon) -> int:
    return sum(int(p["in_use_bytes"]) for p in d.stats()["pools"] if p["pool"]["backend"] == "BACKEND_CUDA")


@pytest.fixture
def torch_daemon(gpu_daemon: Daemon) -> Daemon:
    need_module("torch")
    return gpu_daemon


@pytest.fixture
def cupy_daemon(gpu_daemon: Daemon) -> Daemon:
    need_module("cupy")
    return gpu_daemon


def session_of(d: Daemon, pid: int, client: str) -> dict[str, Any]:
    sessions = d.sessions_of(pid)
    assert [s["client_name"] for s in sessions] == [client], sessions
    return sessions[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
def test_torch_tensors_come_from_rmmd_and_go_back(torch_daemon: Daemon, way: str, mode: str, end: str) -> None:
    before = cuda_in_use(torch_daemon)
    child = start_python([TORCH, "hold", way, mode, "64"], torch_daemon.env())
    said = json.loads(read_line(child))
    assert said["sum"] == 7 * 4096
    mine = session_of(torch_daemon, child.pid, "torch")
    assert int(mine["bytes"]) >= 64 << 20  # the tensor (slab mode: in a slab)
    assert cuda_in_use(torch_daemon) >= before + (64 << 20)
    assert said["rmmd_stats"]["allocated_bytes"] >= 64 << 20
    if end == "exit":
        _, err = child.communicate("\n", timeout=120)
        assert child.returncode == 0 and err == "", err
    else:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    wait_until(lambda: not torch_daemon.sessions_of(child.pid), what="the session to end")
    wait_until(lambda: cuda_in_use(torch_daemon) == before, what="the memory to go back")


@pytest.mark.parametrize("way", WAYS)
def test_training_losses_are_the_same_as_with_pytorchs_allocator(torch_daemon: Daemon, way: str) -> None:
    env = torch_daemon.env(CUBLAS_WORKSPACE_CONFIG=":4096:8")
    reference = json.loads(run_python([TORCH, "train", "default", "slab", "20"], env).stdout)["losses"]
    got = json.loads(run_python([TORCH, "train", way, "slab", "20"], env).stdout)
    assert got["rmmd_stats"]["total_allocations"] > 0  # rmmd did lend the memory
    assert got["losses"] == reference, (
        f"max difference {max(abs(a - b) for a, b in zip(got['losses'], reference))}"
    )


def test_out_of_memory_in_a_mempool_is_pytorchs_error(torch_daemon: Daemon) -> None:
    said = json.loads(run_python([TORCH, "oom", "mempool", "direct", "16"], torch_daemon.env()).stdout)
    assert said["oom"], said  # torch.OutOfMemoryError, after PyTorch emptied its cache
    assert said["last_error"].startswith("rmmd: "), said  # what rmmd said, on that thread


def test_out_of_memory_with_rmmd_as_the_allocator_is_pytorchs_error(
    torch_daemon: Daemon, tmp_path: Path
) -> None:
    # use_rmmd_as_allocator() builds its allocate function against this
    # PyTorch (an empty cache: built here), which throws c10::OutOfMemoryError.
    env = torch_daemon.env(RMMD_CACHE_DIR=str(tmp_path))
    out = run_python([TORCH, "oom", "allocator", "direct", "16"], env)
    said = json.loads(out.stdout)
    assert said["raised"] == "OutOfMemoryError" and said["oom"], said
    assert said["message"].startswith("rmmd: ") and "capacity" in said["message"], said
    assert out.stderr == "", out.stderr  # no warning: the shim was built
    assert [p.name for p in tmp_path.glob("torch_oom-*.so")], list(tmp_path.iterdir())
    # The second process finds it in the cache.
    said = json.loads(run_python([TORCH, "oom", "allocator", "slab", "16"], env).stdout)
    assert said["raised"] == "OutOfMemoryError" and "rmmd: " in said["message"], said


def test_without_a_compiler_rmmd_as_the_allocator_warns_and_raises_runtime_error(
    torch_daemon: Daemon, tmp_path: Path
) -> None:
    env = torch_daemon.env(RMMD_CACHE_DIR=str(tmp_path), CXX="/bin/false")
    out = run_python([TORCH, "oom", "allocator", "direct", "16"], env)
    said = json.loads(out.stdout)
    assert said["raised"] == "RuntimeError" and "rmmd: " in said["message"], said
    assert "building the PyTorch shim failed" in out.stderr and "RuntimeWarning" in out.stderr
    assert not list(tmp_path.glob("torch_oom-*.so")) and not list(tmp_path.glob(".*"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("way", WAYS)
def test_exit_with_rmmd_prints_nothing(torch_daemon: Daemon, way: str, mode: str) -> None:
    out = run_python([TORCH, "leave", way, mode], torch_daemon.env())
    assert out.stderr == "" and out.stdout == ""
    out = run_python([TORCH, "leave", way, mode, "raise"], torch_daemon.env(), check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and lines[-1].startswith("RuntimeError: boom"), out.stderr
    assert not [line for line in lines if "rmmd" in line and "torch_client.py" not in line], out.stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("way", ["allocator", "pool"])
@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
def test_cupy_arrays_come_from_rmmd_and_go_back(cupy_daemon: Daemon, way: str, mode: str, end: str) -> None:
    before = cuda_in_use(cupy_daemon)
    child = start_python([CUPY, "hold", way, mode, "64"], cupy_daemon.env())
    said = json.loads(read_line(child))
    assert said["ok"]
    mine = session_of(cupy_daemon, child.pid, "cupy")
    assert int(mine["session_id"]) == said["session"]
    assert int(mine["bytes"]) >= 3 * (64 << 20)  # a, b and c
    assert said["rmmd_bytes"] >= 3 * (64 << 20)
    if end == "exit":
        _, err = child.communicate("\n", timeout=120)
        assert child.returncode == 0 and err == "", err
    else:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    wait_until(lambda: cuda_in_use(cupy_daemon) == before, what="the memory to go back")


@pytest.mark.parametrize(
    "way, error",
    [("allocator", "rmmd.OutOfMemoryError"), ("pool", "cupy.cuda.memory.OutOfMemoryError")],
)
def test_cupy_out_of_memory_is_a_memory_error_with_rmmds_message(
    cupy_daemon: Daemon, way: str, error: str
) -> None:
    said = json.loads(run_python([CUPY, "oom", way, "16"], cupy_daemon.env()).stdout)
    assert said["raised"] == error and said["memory_error"], said
    assert said["last_error"].startswith("rmmd: "), said  # rmmd's message, on that thread
    if way == "allocator":
        assert said["message"] == said["last_error"], said


@pytest.mark.parametrize("lanes", ["4", "auto"])
def test_carving_lanes_serve_threads_on_their_own_streams(cupy_daemon: Daemon, lanes: str) -> None:
    if lanes == "auto" and len(os.sched_getaffinity(0)) < 4:
        pytest.skip("automatic lanes need 4 CPUs to give 4 threads a lane each")
    child = start_python([CUPY, "lanes", lanes, "4"], cupy_daemon.env())
    assert json.loads(read_line(child))["holding"]
    mine = session_of(cupy_daemon, child.pid, "cupy-lanes")
    assert int(mine["bytes"]) >= 4 * (64 << 20)  # each lane carves from a slab of its own
    child.stdin.write("\n")
    child.stdin.flush()
    said = json.loads(read_line(child))
    assert said["ok"], said  # no lane overwrote another's arrays
    _, err = child.communicate("\n", timeout=60)
    assert child.returncode == 0 and err == "", err


def test_a_buffer_pytorch_fills_is_read_by_cupy_through_dlpack(gpu_daemon: Daemon) -> None:
    need_module("torch")
    need_module("cupy")
    consumer = start_python([CUPY, "consume", "gpu/torch-to-cupy"], gpu_daemon.env())  # waits
    producer = start_python([TORCH, "produce", "gpu/torch-to-cupy", "64"], gpu_daemon.env())
    made = json.loads(read_line(producer))
    assert made["data_ptr"] == made["ptr"]  # the tensor is the buffer: no copy
    got = json.loads(read_line(consumer))
    assert got["ok"] and got["first"] == 1.0 and got["id"] == made["id"]
    assert got["data_ptr"] == got["ptr"] and got["cai_ptr"] == got["ptr"]  # no copy there either
    assert consumer.wait(timeout=60) == 0
    _, err = producer.communicate("\n", timeout=60)
    assert producer.returncode == 0 and err == "", err
    _, err = consumer.communicate(timeout=60)
    assert err == "", err


@pytest.mark.parametrize(
    "example, needs, says",
    [
        ("torch_mempool.py", ["torch"], "rmmd lent"),
        ("torch_allocator.py", ["torch"], "through rmmd:"),
        ("cupy_allocator.py", ["cupy"], "the daemon counts"),
        ("share_torch_to_cupy.py", ["torch", "cupy"], "without a copy: ok"),
        ("shared_weights/run.py", ["torch"], "run: ok"),
    ],
)
def test_the_examples_run(gpu_daemon: Daemon, example: str, needs: list[str], says: str) -> None:
    for module in needs:
        need_module(module)
    out = run_python([str(EXAMPLES / example)], gpu_daemon.env(RMMD_RMMCTL=str(RMMCTL)))
    assert says in out.stdout, out.stdout
    assert out.stderr == "", out.stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("way", WAYS)
def test_a_captured_forward_and_backward_replays_like_pytorchs_allocator(
    torch_daemon: Daemon, way: str, mode: str
) -> None:
    """torch.cuda.graphs: a small model's forward and backward captured under
    rmmd (into the rmmd MemPool, or with rmmd as the whole process's
    allocator), replayed 1,000 times: the same bits as PyTorch's own
    allocator, nothing sent twice, and the ledger back to zero."""
    env = torch_daemon.env(CUBLAS_WORKSPACE_CONFIG=":4096:8")
    reference = json.loads(run_python([TORCH, "graph", "default", mode, "1000"], env).stdout)
    child = start_python([TORCH, "graph", way, mode, "1000"], env)
    got = json.loads(read_line(child, timeout=600))
    assert got["rmmd_stats"]["total_allocations"] > 0  # rmmd did lend the memory
    assert got["losses"] == reference["losses"]
    assert got["grads"] == reference["grads"]
    if way == "allocator":
        # What the graph allocated and freed during capture went back once
        # the graph was destroyed.
        assert got["after"] <= got["before"], got
    assert got["final"] == 0, got  # every tensor freed, the MemPool gone
    # The daemon's ledger for this session back to zero (idle slabs go back
    # after the resource's idle_trim).
    wait_until(
        lambda: int(session_of(torch_daemon, child.pid, "torch").get("allocation_count", 0)) == 0,
        timeout=60,
        what="the session's leases to go back",
    )
    _, err = child.communicate("\n", timeout=120)
    assert child.returncode == 0, err
    # A Free sent twice is refused (NOT_FOUND) and printed by the client.
    assert "rmmd:" not in err, err


DLPACK_INTO_TORCH = """
import faulthandler, sys
faulthandler.enable()
import torch, rmmd
mode, nbytes = sys.argv[1], int(sys.argv[2])
torch.cuda.set_device(0)
torch.empty(1, device="cuda")  # PyTorch's context and runtime first, as an engine's process has them
r = rmmd.Session(client_name="dlpack-into-torch").device_resource(0, mode=mode)
for stream in (None, torch.cuda.Stream()):
    with torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream()):
        a = r.allocation(nbytes)
        t = torch.from_dlpack(a)
        assert t.data_ptr() == a.ptr and t.numel() == nbytes and t.is_cuda
        t.fill_(7)
        torch.cuda.synchronize()
        assert int(t[:4096].sum()) == 7 * 4096 and int(t[-4096:].sum()) == 7 * 4096
        del t
        a.free()
print("ok")
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nbytes", [1 << 20, 3 << 30])
def test_a_device_allocation_becomes_a_torch_tensor_through_dlpack(torch_daemon: Daemon, mode: str, nbytes: int) -> None:
    # What the sleep bench's taker does (there, with 60 GiB, it ended on SIGSEGV):
    # in a process that made PyTorch's context first, torch.from_dlpack of an
    # allocation, written by PyTorch, on the default stream and on one of its own.
    out = run_python(["-c", DLPACK_INTO_TORCH, mode, str(nbytes)], torch_daemon.env())
    assert out.stdout.strip() == "ok", out
    wait_until(lambda: cuda_in_use(torch_daemon) == 0, what="the CUDA pools back to 0")


REFUSED_THEN_SERVED = """
import faulthandler, sys
faulthandler.enable()
import torch, rmmd
mode = sys.argv[1]
GiB = 1 << 30
torch.cuda.set_device(0)
torch.empty(1, device="cuda")
r = rmmd.Session(client_name="refused-then-served").device_resource(0, mode=mode)
held = r.allocation(6 * GiB)  # of the daemon's 8 GiB pool
try:
    r.allocation(4 * GiB)
    raise SystemExit("the 4 GiB allocation fitted beside 6 GiB in an 8 GiB pool")
except MemoryError:
    pass
held.free()
a = r.allocation(4 * GiB)  # served now: what the sleep bench's taker does after the pause
t = torch.from_dlpack(a)
t.fill_(3)
torch.cuda.synchronize()
assert int(t[-4096:].sum()) == 3 * 4096
del t
a.free()
print("ok")
"""


@pytest.mark.parametrize("mode", MODES)
def test_an_allocation_refused_then_served_once_memory_came_back(torch_daemon: Daemon, mode: str) -> None:
    # The sleep bench's handoff taker (a refused probe, then the allocation
    # once the engine slept) ended on SIGSEGV inside rmmd_allocate with 10
    # and 60 GiB; torch.from_dlpack of a fresh 3 GiB allocation did not.
    out = run_python(["-c", REFUSED_THEN_SERVED, mode], torch_daemon.env())
    assert out.stdout.strip() == "ok", out
    wait_until(lambda: cuda_in_use(torch_daemon) == 0, what="the CUDA pools back to 0")
