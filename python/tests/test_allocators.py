"""The framework modules' own logic, on any machine: CuPy's allocator over a
host resource standing in for a device one, with a stand-in CuPy; the
PyTorch entry points' configuration and failure path, with a stand-in
PyTorch. (test_gpu.py runs the real frameworks on a GPU.)"""

from __future__ import annotations

import gc
import json
import os
import sys
import types
from typing import Any

import pytest
from conftest import Daemon, run_python

import rmmd


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    class Stream:
        ptr = 0

    def unowned(ptr: int, size: int, owner: Any, device_id: int) -> Any:
        return types.SimpleNamespace(ptr=ptr, size=size, owner=owner, device_id=device_id)

    def memory_pointer(mem: Any, offset: int) -> Any:
        return types.SimpleNamespace(mem=mem, ptr=mem.ptr + offset)

    cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        get_current_stream=lambda: Stream(),
        UnownedMemory=unowned,
        MemoryPointer=memory_pointer,
    )
    fake = types.SimpleNamespace(cuda=cuda)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_the_cupy_allocator_frees_when_cupy_lets_go(
    fake_cupy: Any, session: rmmd.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmmd.allocators.cupy import rmmd_allocator

    made: list[rmmd.MemoryResource] = []

    def host_instead(
        self: rmmd.Session,
        device: int | None = None,
        mode: str = "slab",
        pool: Any = None,
        graph_safe: bool | None = None,
    ) -> Any:
        assert graph_safe is True  # the CuPy allocator's default: graph-safe
        r = self.host_resource()
        made.append(r)
        return r

    monkeypatch.setattr(rmmd.Session, "device_resource", host_instead)
    allocate = rmmd_allocator(session=session)
    p = allocate(1 << 16)
    assert p.ptr != 0 and p.mem.size == 1 << 16 and p.mem.device_id == 0
    (r,) = made
    assert allocate.resources == {0: r}
    assert r.stats().allocation_count == 1
    q = allocate(0)
    assert q.ptr == 0
    del p, q
    gc.collect()
    assert r.stats().allocation_count == 0
    with pytest.raises(rmmd.OutOfMemoryError):
        allocate(1 << 30)  # more than the pool


def test_the_cupy_allocator_for_one_device_refuses_another(
    fake_cupy: Any, session: rmmd.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmmd.allocators.cupy import rmmd_allocator

    monkeypatch.setattr(rmmd.Session, "device_resource", lambda self, **kw: self.host_resource())
    allocate = rmmd_allocator(session=session, device=1)
    with pytest.raises(rmmd.InvalidArgumentError, match="serves CUDA device 1"):
        allocate(256)
    with pytest.raises(rmmd.InvalidArgumentError, match="'slab'"):
        rmmd_allocator(session=session, mode="carve")


TORCH_SCRIPT = r"""
import ctypes, json, sys, types
calls = []
class Pluggable:
    def __init__(self, path, alloc, free):
        calls.append(("pluggable", path, alloc, free))
    def allocator(self):
        return "the _cuda_CUDAAllocator"
def change_current_allocator(a):
    calls.append(("change", type(a).__name__))
    if len([c for c in calls if c[0] == "change"]) > 1:
        raise RuntimeError("Can't swap an already initialized allocator")
torch = types.ModuleType("torch")
torch.cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(CUDAPluggableAllocator=Pluggable, change_current_allocator=change_current_allocator),
    MemPool=lambda allocator, **kw: ("MemPool", allocator, kw),
    current_device=lambda: 0)
sys.modules["torch"] = torch
import rmmd
from rmmd.allocators import torch as rt
out = {}
out["zeros"] = rt.memory_stats()
rt.configure(runtime_dir=sys.argv[1], mode="direct")
rt.configure(runtime_dir=sys.argv[1], mode="direct")  # the same again: nothing to do
out["pool"] = list(rt.rmmd_mem_pool(use_on_oom=True))
import warnings
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    rt.use_rmmd_as_allocator()
out["warnings"] = [str(w.message) for w in said]
try:
    rt.use_rmmd_as_allocator()
except rmmd.PreconditionError as e:
    out["second"] = str(e)
out["calls"] = calls
lib = rmmd._lib.load()
for name in (rt.ALLOC_FN_NAME, rt.RAISING_ALLOC_FN_NAME, rt.FREE_FN_NAME, "rmmd_torch_allocate"):
    getattr(lib, name)  # the names PyTorch and the shim look up exist
got = ctypes.c_void_p(1234)
out["allocate"] = [lib.rmmd_torch_allocate(1024, 0, None, ctypes.byref(got)), got.value]
out["allocate_null"] = lib.rmmd_torch_allocate(1024, 0, None, None)
# No GPU here: the first allocation fails, and says why, on this thread.
out["ptr"] = lib.rmmd_torch_malloc(1024, 0, None)
out["last_error"] = rt.last_error()
lib.rmmd_torch_free(None, 0, 0, None)
try:
    rt.configure(runtime_dir=sys.argv[1], mode="slab")
except rmmd.PreconditionError as e:
    out["late"] = str(e)
print(json.dumps(out))
"""


def test_the_torch_entry_points(daemon: Daemon) -> None:
    out = json.loads(run_python(["-c", TORCH_SCRIPT, str(daemon.runtime_dir)], dict(os.environ)).stdout)
    assert out["zeros"] == {"allocated_bytes": 0, "allocation_count": 0, "high_water_bytes": 0,
                            "total_allocations": 0, "device": 0}
    assert out["calls"][0] == ["pluggable", rmmd.library_path(), "rmmd_torch_malloc", "rmmd_torch_free"]
    assert out["pool"] == ["MemPool", "the _cuda_CUDAAllocator", {"use_on_oom": True}]
    # The MemPool's allocator, then the whole process's, once: this fake
    # torch has no headers to build the shim against, so a warning says so
    # and the raising malloc of librmmd_c.so stands in.
    assert out["calls"][1] == [
        "pluggable", rmmd.library_path(), "rmmd_torch_malloc_or_raise", "rmmd_torch_free"
    ]
    assert len(out["warnings"]) == 1 and "raises RuntimeError, not torch.OutOfMemoryError" in (
        out["warnings"][0]
    ), out["warnings"]
    # The shim's entry point: a status, nothing written on failure.
    assert out["allocate"][0] != 0 and out["allocate"][1] == 1234, out["allocate"]
    assert out["allocate_null"] == rmmd.Status.INVALID_ARGUMENT
    assert [c[0] for c in out["calls"]] == ["pluggable", "pluggable", "change", "change"]
    assert "before the process's first CUDA allocation" in out["second"]
    assert out["ptr"] is None and out["last_error"].startswith("rmmd: ")
    assert "configure rmmd before the first allocation" in out["late"]


# A stand-in PyTorch install for build_oom_shim(): c10's exception types as
# the shim uses them, and an empty libc10.so to link against.
FAKE_C10_HEADER = r"""
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
namespace c10 {
struct SourceLocation { const char* function; const char* file; std::uint32_t line; };
class Error : public std::runtime_error {
 public:
  Error(SourceLocation, std::string msg) : std::runtime_error(std::move(msg)) {}
};
class OutOfMemoryError : public Error { using Error::Error; };
}  // namespace c10
"""

# Calls the built shim as PyTorch would and says what it threw.
SHIM_CALLER = r"""
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <cstdio>
int main(int argc, char** argv) {
  // As in Python: the package has loaded librmmd_c.so before PyTorch loads
  // the shim (whose DT_NEEDED is the library's soname, found loaded).
  if (!dlopen(argv[2], RTLD_NOW)) { std::printf("dlopen: %s\n", dlerror()); return 1; }
  void* shim = dlopen(argv[1], RTLD_NOW);
  if (!shim) { std::printf("dlopen: %s\n", dlerror()); return 1; }
  auto malloc_fn = reinterpret_cast<void* (*)(std::size_t, int, void*)>(dlsym(shim, "rmmd_torch_malloc_oom"));
  auto free_fn = dlsym(shim, "rmmd_torch_free");  // PyTorch finds it through the shim
  if (!malloc_fn || !free_fn) { std::printf("missing symbol\n"); return 1; }
  try {
    malloc_fn(1024, 0, nullptr);
    std::printf("no throw\n");
  } catch (c10::OutOfMemoryError const& e) {
    std::printf("OutOfMemoryError %s\n", e.what());
  } catch (c10::Error const& e) {
    std::printf("Error %s\n", e.what());
  }
  return 0;
}
"""

SHIM_SCRIPT = r"""
import json, sys, types
torch = types.ModuleType("torch")
torch.__file__ = sys.argv[1] + "/__init__.py"
torch.__version__ = sys.argv[2]
torch._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
sys.modules["torch"] = torch
from rmmd.allocators import torch as rt
print(json.dumps({"path": rt.build_oom_shim()}))
"""


@pytest.fixture
def fake_torch_dir(tmp_path: Any) -> Any:
    import shutil
    import subprocess

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here")
    root = tmp_path / "torch"
    (root / "include" / "c10" / "util").mkdir(parents=True)
    (root / "include" / "c10" / "util" / "Exception.h").write_text(FAKE_C10_HEADER)
    (root / "lib").mkdir()
    subprocess.run(["c++", "-shared", "-fPIC", "-x", "c++", "/dev/null", "-o", str(root / "lib" / "libc10.so")],
                   check=True)  # fmt: skip
    return root


def test_the_oom_shim_is_built_once_and_throws_pytorchs_types(
    daemon: Daemon, fake_torch_dir: Any, tmp_path: Any
) -> None:
    import subprocess

    cache = tmp_path / "cache"
    env = dict(os.environ, RMMD_CACHE_DIR=str(cache), RMMD_RUNTIME_DIR=str(daemon.runtime_dir))
    env.pop("CXX", None)
    first = json.loads(run_python(["-c", SHIM_SCRIPT, str(fake_torch_dir), "2.11.0"], env).stdout)["path"]
    assert os.path.dirname(first) == str(cache) and os.path.exists(first)
    assert sorted(p.name for p in cache.iterdir()) == [os.path.basename(first)]  # no temporary left
    # Cached: found again without a compiler.
    again = json.loads(
        run_python(["-c", SHIM_SCRIPT, str(fake_torch_dir), "2.11.0"], dict(env, CXX="/bin/false")).stdout
    )["path"]
    assert again == first
    # Another PyTorch version is another shim; a broken compiler says so.
    out = run_python(["-c", SHIM_SCRIPT, str(fake_torch_dir), "2.12.0"], dict(env, CXX="/bin/false"), check=False)
    assert out.returncode != 0 and "building the PyTorch shim failed" in out.stderr, out.stderr
    out = run_python(["-c", SHIM_SCRIPT, str(fake_torch_dir), "2.12.0"], dict(env, CXX="/no/such/c++"), check=False)
    assert out.returncode != 0 and "/no/such/c++" in out.stderr, out.stderr
    # The shim over librmmd_c.so: no GPU here, so the first allocation fails
    # and the shim throws c10::Error (not the out-of-memory type) with rmmd's message.
    caller = tmp_path / "caller"
    (tmp_path / "caller.cpp").write_text(SHIM_CALLER)
    subprocess.run(["c++", "-std=c++17", "-I", str(fake_torch_dir / "include"), str(tmp_path / "caller.cpp"),
                    "-o", str(caller), "-ldl"], check=True)  # fmt: skip
    said = subprocess.run([str(caller), first, rmmd.library_path()], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert said.returncode == 0, said.stdout + said.stderr
    assert said.stdout.startswith("Error rmmd: "), said.stdout
