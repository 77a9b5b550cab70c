"""rmmd.memory_saver: torch_memory_saver's API over address-stable memory.

On any machine: the module imports without PyTorch; its argument checks,
its pools per (tag, backup, device) and its thread tags, with a stand-in
PyTorch; the C ABI's stable entry points failing, and saying why, without
a GPU. On the GPU host (marked gpu; skipped, saying why, without a GPU or
PyTorch), each scenario in a process of its own
(scripts/memory_saver_client.py): addresses and backups across 100
pauses, a graph replayed after a resume, pause() of every tag, a resume
that cannot fit, a named backup restored into a new process after its
owner was SIGKILLed, the device's free memory while paused
(gpu_exclusive), and a torch_memory_saver script run unchanged with both
packages.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from conftest import SCRIPTS, Daemon, need_gpu, need_module, read_line, run_python, start_python, wait_until

CLIENT = str(SCRIPTS / "memory_saver_client.py")
TMS_SCRIPT = str(SCRIPTS / "tms_script.py")
MiB = 1 << 20


# ---- any machine ------------------------------------------------------------


def test_it_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from rmmd.memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver\n"
        "assert isinstance(torch_memory_saver, TorchMemorySaver) and torch_memory_saver.enabled\n"
        "with configure_subprocess():\n"
        "    pass\n"
        "try:\n"
        "    with torch_memory_saver.region():\n"
        "        pass\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
    )
    out = run_python(["-c", code], dict(os.environ))
    assert "rmmd.allocators.torch needs PyTorch" in out.stdout, out.stdout


# A stand-in PyTorch that records what rmmd.memory_saver asks of it.
FAKE_TORCH = r"""
import contextlib, itertools, json, sys, types
calls = []
ids = itertools.count(1)
class Pluggable:
    def __init__(self, path, alloc, free):
        calls.append(["pluggable", alloc, free])
    def allocator(self):
        return "stable allocator"
class MemPool:
    def __init__(self, allocator=None, **kw):
        self.allocator = allocator
        self.id = (0, next(ids))
@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    from rmmd.allocators import torch as rt
    calls.append(["use_mem_pool", pool.id, pool.allocator, rt.current_stable_tag()])
    yield
@contextlib.contextmanager
def graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):
    calls.append(["graph", cuda_graph, pool, capture_error_mode])
    yield
device = [0]
class OutOfMemoryError(RuntimeError):
    pass
torch = types.ModuleType("torch")
torch.OutOfMemoryError = OutOfMemoryError
torch.cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(CUDAPluggableAllocator=Pluggable),
    MemPool=MemPool, use_mem_pool=use_mem_pool, graph=graph,
    current_device=lambda: device[0],
    current_stream=lambda d=None: types.SimpleNamespace(cuda_stream=0))
sys.modules["torch"] = torch
"""

SAVER_SCRIPT = FAKE_TORCH + r"""
import rmmd
from rmmd.allocators import torch as rt
from rmmd.memory_saver import TorchMemorySaver
rt.configure(runtime_dir=sys.argv[1])
saver = TorchMemorySaver()
out = {}

def pool_of(**kw):
    with saver.region(**kw):
        return calls[-1][1]

out["weights"] = [pool_of(tag="weights", enable_cpu_backup=True), pool_of(tag="weights", enable_cpu_backup=True)]
out["weights_plain"] = pool_of(tag="weights")
device[0] = 1
out["weights_gpu1"] = pool_of(tag="weights", enable_cpu_backup=True)
device[0] = 0
with saver.region(tag="outer"):
    with saver.region(tag="inner", enable_cpu_backup=True, cpu_backup_backend="pinned"):
        pass
    out["after_inner"] = rt.current_stable_tag()
out["after_outer"] = rt.current_stable_tag()
out["region_calls"] = [c for c in calls if c[0] == "use_mem_pool"]
with saver.disable():
    out["disabled"] = [calls[-1][2], rt.current_stable_tag()]

out["pluggable"] = [c for c in calls if c[0] == "pluggable"]
del calls[:]
with saver.cuda_graph("g1"):
    pass
with saver.cuda_graph("g2"):
    pass
with saver.cuda_graph("g3", pool=(7, 7), tag="graph"):
    pass
with saver.cuda_graph("g4", pool=(7, 7), tag="graph", capture_error_mode="relaxed"):
    pass
with saver.cuda_graph("g5", pool=out["weights_plain"]):
    pass
out["graphs"] = [c for c in calls if c[0] == "graph"]

def refusal(f):
    try:
        f()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None

def enter(**kw):
    with saver.region(**kw):
        pass

def set_attr(name, value):
    setattr(saver, name, value)

out["refusals"] = {
    "empty tag": refusal(lambda: enter(tag="")),
    "tag with the suffix": refusal(lambda: enter(tag="kv+cpu_backup")),
    "long tag": refusal(lambda: enter(tag="t" * 118)),
    "unprintable tag": refusal(lambda: enter(tag="k\tv")),
    "disk backup": refusal(lambda: enter(enable_disk_backup=True)),
    "backend without backup": refusal(lambda: enter(cpu_backup_backend="pinned")),
    "unknown backend": refusal(lambda: enter(enable_cpu_backup=True, cpu_backup_backend="disk")),
    "pause empty tag": refusal(lambda: saver.pause("")),
    "pause empty backup name": refusal(lambda: saver.pause(backup_name="")),
    "resume long deadline": refusal(lambda: saver.resume(deadline=601)),
    "resume deadline text": refusal(lambda: saver.resume(deadline="soon")),
    "hook mode": refusal(lambda: set_attr("hook_mode", "ld_preload")),
    "read hook mode": refusal(lambda: saver.hook_mode),
    "read margin": refusal(lambda: saver.memory_margin_bytes),
    "negative margin": refusal(lambda: set_attr("memory_margin_bytes", -1)),
    "retain": refusal(lambda: set_attr("retain_cpu_backup", 1)),
    "disk dir": refusal(lambda: saver.set_disk_backup_dir("/tmp")),
    "restore no name": refusal(lambda: saver.restore("")),
}
saver.hook_mode = "torch"
saver.memory_margin_bytes = 1 << 30
saver.retain_cpu_backup = True
out["accepted"] = [saver.enabled, saver.retain_cpu_backup]
saver.retain_cpu_backup = False
# No stable allocation yet: nothing to pause or resume, no device, no backup.
saver.pause()
saver.resume()
saver.pause("weights")
out["devices"] = rt.stable_devices()
tensor = types.SimpleNamespace(is_cuda=True, is_contiguous=lambda: True, device=types.SimpleNamespace(index=0),
                               data_ptr=lambda: 4096, nbytes=64, shape=(16,), stride=lambda: (1,))
out["backup"] = saver.get_cpu_backup(tensor)
print(json.dumps(out))
"""


def test_pools_tags_and_refusals_with_a_stand_in_torch(daemon: Daemon) -> None:
    out = json.loads(run_python(["-c", SAVER_SCRIPT, str(daemon.runtime_dir)], dict(os.environ)).stdout)
    # A MemPool per (tag, backup, device), as torch_memory_saver keys them.
    a, b = out["weights"]
    assert a == b and out["weights_plain"] != a and out["weights_gpu1"] not in (a, out["weights_plain"])
    # Inside a region, the thread's stable tag is the rmmd tag; regions nest.
    # (use_mem_pool is entered just before the region's tag is set: the
    # inner region's sees the outer's.)
    assert [c[3] for c in out["region_calls"]] == [None] * 5 + ["outer"]
    assert out["after_inner"] == "outer" and out["after_outer"] is None
    assert all(c[2] == "stable allocator" for c in out["region_calls"])
    assert out["disabled"] == [None, None]  # PyTorch's own allocator, no tag
    # Graphs: a pool of their own without a token, one per token otherwise,
    # and one of the saver's pools as it is.
    g1, g2, g3, g4, g5 = out["graphs"]
    assert g1[2] != g2[2] and g3[2] == g4[2] and g3[2] not in (g1[2], g2[2], [7, 7])
    assert g4[3] == "relaxed" and g5[2] == out["weights_plain"]
    r = out["refusals"]
    assert r["empty tag"][0] == "InvalidArgumentError"
    assert r["tag with the suffix"][0] == "InvalidArgumentError" and "+cpu_backup" in r["tag with the suffix"][1]
    assert r["disk backup"][0] == "NotImplementedError" and "host memory the daemon holds" in r["disk backup"][1]
    assert r["long tag"][0] == "InvalidArgumentError" and "1 to 117 printable" in r["long tag"][1]
    assert r["unprintable tag"][0] == "InvalidArgumentError"
    assert r["backend without backup"] == ["ValueError", "cpu_backup_backend requires enable_cpu_backup=True"]
    assert r["unknown backend"][0] == "ValueError"
    assert r["pause empty tag"][0] == "InvalidArgumentError"
    assert r["pause empty backup name"][0] == "InvalidArgumentError"
    assert r["resume long deadline"][0] == "InvalidArgumentError" and "600" in r["resume long deadline"][1]
    assert r["resume deadline text"][0] == "InvalidArgumentError"
    assert r["hook mode"][0] == "ValueError"
    assert r["read hook mode"][0] == "AttributeError"
    assert r["read margin"][0] == "NotImplementedError"
    assert r["negative margin"][0] == "ValueError"
    assert r["retain"][0] == "ValueError"
    assert r["disk dir"][0] == "NotImplementedError"
    assert r["restore no name"][0] == "InvalidArgumentError"
    assert out["accepted"] == [True, True]
    assert out["devices"] == [] and out["backup"] is None
    assert out["pluggable"] == [["pluggable", "rmmd_torch_stable_malloc", "rmmd_torch_stable_free"]]


def test_the_region_tags_are_set_inside_the_block(daemon: Daemon) -> None:
    script = FAKE_TORCH + r"""
from rmmd.allocators import torch as rt
from rmmd.memory_saver import torch_memory_saver as saver
rt.configure(runtime_dir=sys.argv[1])
seen = []
with saver.region(tag="weights", enable_cpu_backup=True):
    seen.append(rt.current_stable_tag())
    with saver.region(tag="kv"):
        seen.append(rt.current_stable_tag())
    seen.append(rt.current_stable_tag())
with saver.cuda_graph("g", tag="graph"):
    seen.append(rt.current_stable_tag())
seen.append(rt.current_stable_tag())
print(json.dumps(seen))
"""
    seen = json.loads(run_python(["-c", script, str(daemon.runtime_dir)], dict(os.environ)).stdout)
    assert seen == ["weights+cpu_backup", "kv", "weights+cpu_backup", "graph", None]


def test_the_stable_entry_points_say_why_without_a_gpu(daemon: Daemon) -> None:
    script = FAKE_TORCH + r"""
import ctypes
import rmmd
from rmmd.allocators import torch as rt
rt.configure(runtime_dir=sys.argv[1])
lib = rmmd._lib.load()
out = {"ptr": lib.rmmd_torch_stable_malloc(1 << 20, 0, None), "last_error": rt.last_error()}
try:
    rt.stable_resource(0)
except rmmd.Error as e:
    out["resource"] = [type(e).__name__, str(e)]
with rt.stable_tag("kv"):
    out["tag"] = rt.current_stable_tag()
try:
    with rt.stable_tag(""):
        pass
except rmmd.InvalidArgumentError as e:
    out["empty"] = str(e)
out["devices"] = rt.stable_devices()
print(json.dumps(out))
"""
    out = json.loads(run_python(["-c", script, str(daemon.runtime_dir)], dict(os.environ)).stdout)
    # The host-only daemon has no CUDA pool: refused, with rmmd's reason.
    assert out["ptr"] is None and out["last_error"].startswith("rmmd: "), out
    assert out["resource"][1].startswith("rmmd: "), out
    assert out["tag"] == "kv" and "non-empty" in out["empty"] and out["devices"] == []


# ---- the GPU host -------------------------------------------------------------


def cuda_in_use(d: Daemon) -> int:
    return sum(int(p["in_use_bytes"]) for p in d.stats()["pools"] if p["pool"]["backend"] == "BACKEND_CUDA")


def host_in_use(d: Daemon) -> int:
    return sum(int(p["in_use_bytes"]) for p in d.stats()["pools"] if p["pool"]["backend"] == "BACKEND_HOST")


@pytest.fixture
def torch_daemon(gpu_daemon: Daemon) -> Daemon:
    need_module("torch")
    return gpu_daemon


def said(line: str) -> dict[str, Any]:
    return json.loads(line)


def finish(child: Any) -> None:
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err


@pytest.mark.gpu
@pytest.mark.parametrize("retain", [False, True])
def test_addresses_and_backups_survive_100_pauses(torch_daemon: Daemon, retain: bool) -> None:
    before = cuda_in_use(torch_daemon)
    args = [CLIENT, "cycles", "100"] + (["retain"] if retain else [])
    out = said(run_python(args, torch_daemon.env(), timeout=600).stdout)
    assert out == {
        "cycles": 100,
        "moved": 0,
        "bad": 0,
        "backup_ok": True,
        "backup_none_for_kv": True,
        "backup_none_awake": True,
    }, out
    wait_until(lambda: cuda_in_use(torch_daemon) == before and host_in_use(torch_daemon) == 0,
               what="the memory to go back")  # fmt: skip


@pytest.mark.gpu
def test_a_graph_captured_with_cuda_graph_replays_bitwise_after_resume(torch_daemon: Daemon) -> None:
    before = cuda_in_use(torch_daemon)
    out = said(run_python([CLIENT, "graph"], torch_daemon.env()).stdout)
    assert out == {"same_address": True, "bitwise_equal": True}, out
    wait_until(lambda: cuda_in_use(torch_daemon) == before, what="the memory to go back")


@pytest.mark.gpu
def test_pause_without_a_tag_gives_back_every_tag(torch_daemon: Daemon) -> None:
    before = cuda_in_use(torch_daemon)
    child = start_python([CLIENT, "every_tag"], torch_daemon.env())
    assert said(read_line(child)) == {"paused": True}
    (mine,) = torch_daemon.sessions_of(child.pid)
    assert mine["client_name"] == "torch"
    assert cuda_in_use(torch_daemon) == before, "every tag's memory is back in the pool"
    assert host_in_use(torch_daemon) >= 8 * MiB  # tag b's backup
    sleepers = json.loads(torch_daemon.rmmctl("sleepers", "--json"))
    assert "b+cpu_backup" in json.dumps(sleepers), sleepers
    child.stdin.write("\n")
    child.stdin.flush()
    assert said(read_line(child)) == {"resumed": True, "b_restored": True}
    finish(child)
    wait_until(lambda: cuda_in_use(torch_daemon) == before and host_in_use(torch_daemon) == 0,
               what="the memory to go back")  # fmt: skip


@pytest.mark.gpu
def test_a_resume_that_cannot_fit_is_torchs_out_of_memory_and_maps_nothing(fresh_daemon: Any) -> None:
    need_gpu()
    need_module("torch")
    d = fresh_daemon("--backend", "cuda", "--cuda-pool-bytes", "1GiB", "--host-pool-bytes", "256MiB")
    saver = start_python([CLIENT, "resume_short", "768"], d.env())
    assert said(read_line(saver)) == {"paused": True}
    holder = start_python([CLIENT, "hold", "768"], d.env())
    assert said(read_line(holder)) == {"held": 768 * MiB}
    saver.stdin.write("\n")
    saver.stdin.flush()
    out = said(read_line(saver))
    assert out["raised"] == "OutOfMemoryError", out
    assert out["message"].startswith("rmmd: ") and "holds" in out["message"], out
    assert cuda_in_use(d) == 768 * MiB, "only the holder's: nothing of the failed resume"
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert said(read_line(holder)) == {"freed": True}
    finish(holder)
    saver.stdin.write("\n")
    saver.stdin.flush()
    assert said(read_line(saver)) == {"resumed": True, "same_address": True, "written": True}
    finish(saver)
    wait_until(lambda: cuda_in_use(d) == 0, what="the memory to go back")


@pytest.mark.gpu
def test_a_named_backup_is_restored_into_a_new_process_after_a_sigkill(torch_daemon: Daemon) -> None:
    before = cuda_in_use(torch_daemon)
    owner = start_python([CLIENT, "sleep_named", "saver-test/engine-0", "64"], torch_daemon.env())
    assert said(read_line(owner))["asleep"] is True
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=60)
    wait_until(lambda: not torch_daemon.sessions_of(owner.pid), what="the owner's session to end")
    assert cuda_in_use(torch_daemon) == before
    assert host_in_use(torch_daemon) == 64 * MiB, "the backup is kept under its name"
    out = said(run_python([CLIENT, "restore", "saver-test/engine-0", "64"], torch_daemon.env()).stdout)
    assert out == {"restored": [{"tag": "weights", "nbytes": 64 * MiB}], "intact": True}, out
    wait_until(lambda: cuda_in_use(torch_daemon) == before and host_in_use(torch_daemon) == 0,
               what="the memory to go back")  # fmt: skip


@pytest.mark.gpu
@pytest.mark.gpu_exclusive
def test_paused_memory_is_free_on_the_device(torch_daemon: Daemon) -> None:
    size = 1024 * MiB
    out = said(run_python([CLIENT, "free_memory", "1024"], torch_daemon.env()).stdout)
    assert out["paused"] - out["before"] >= size * 0.9, out
    assert out["paused"] - out["resumed"] >= size * 0.9, out
    assert out["written"] is True


def results(stdout: str) -> list[str]:
    """The lines tms_script.py prints (without whatever else a package logs)."""
    return [line for line in stdout.splitlines() if line.split(":")[0] in TMS_LABELS]


TMS_LINES = [
    "addresses kept: True",
    "weights restored: True",
    "kv usable: 4194304.0",
    "graph replays the same: True",
    "cpu backup while paused: True",
    "cpu backup once resumed: None",
    "weights restored again: True",
]
TMS_LABELS = {line.split(":")[0] for line in TMS_LINES} | {"weights checksum"}


@pytest.mark.gpu
def test_a_torch_memory_saver_script_runs_unchanged_with_rmmd(torch_daemon: Daemon) -> None:
    before = cuda_in_use(torch_daemon)
    out = run_python([TMS_SCRIPT], torch_daemon.env(TMS_IMPL="rmmd"))
    lines = [line for line in results(out.stdout) if not line.startswith("weights checksum:")]
    assert lines == TMS_LINES, out.stdout + out.stderr
    wait_until(lambda: cuda_in_use(torch_daemon) == before, what="the memory to go back")


@pytest.mark.gpu
def test_the_script_prints_the_same_with_torch_memory_saver(torch_daemon: Daemon) -> None:
    probe = run_python(
        ["-c", "from torch_memory_saver.utils import get_binary_path_from_package as g\n"
               "print(g('torch_memory_saver_hook_mode_preload'))"],
        dict(os.environ), check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"torch_memory_saver does not import here ({why})")
    preload = probe.stdout.strip().splitlines()[-1]
    theirs = run_python([TMS_SCRIPT], dict(os.environ, TMS_IMPL="torch_memory_saver", LD_PRELOAD=preload))
    ours = run_python([TMS_SCRIPT], torch_daemon.env(TMS_IMPL="rmmd"))
    assert results(ours.stdout) == results(theirs.stdout), (
        f"rmmd:\n{ours.stdout}\ntorch_memory_saver:\n{theirs.stdout}{theirs.stderr}"
    )
    assert len(results(ours.stdout)) == len(TMS_LINES) + 1
