"""Page-locking host buffers (docs/sharing.md, "Host buffers and CUDA
contexts"): an open makes no CUDA context unless asked (``pinned=True``),
page-locks where the process has one already, and a refusal names its cause
and leaves nothing open. The GPU cases count the primary contexts of a
child process through the driver (cuDevicePrimaryCtxGetState): this pytest
process stays without one."""

import json
import os
import textwrap

import pytest

import rmmd
from conftest import Daemon, gpu_count, need_gpu, run_python

MiB = 1 << 20


def _pinnable(fresh_daemon, pinned: str = "on") -> Daemon:  # type: ignore[no-untyped-def]
    return fresh_daemon("--backend", "host", "--host-pool-bytes", "16MiB", "--host-pool-pinned", pinned)


def test_a_pinned_argument_that_is_not_a_bool_or_none_is_refused_before_any_request(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    d = _pinnable(fresh_daemon)
    with rmmd.Session(runtime_dir=str(d.runtime_dir)) as s:
        a = rmmd.SharedBuffer.create(s, "pin/args", MiB, pool=s.host_pool)
        a.publish()
        for bad in ("yes", 1, 0.0):
            with pytest.raises(rmmd.InvalidArgumentError, match="pinned is True .* not"):
                rmmd.SharedBuffer.open(s, "pin/args", pinned=bad)  # type: ignore[arg-type]
            with pytest.raises(rmmd.InvalidArgumentError, match="create buffer 'pin/other': pinned"):
                rmmd.SharedBuffer.create(s, "pin/other", MiB, pool=s.host_pool, pinned=bad)  # type: ignore[arg-type]
        assert [b.name for b in s.buffers(prefix="pin/")] == ["pin/args"]
        assert s.describe_buffer("pin/args")[0].holders == 1
        a.close()


def test_a_plain_mapping_when_asked_and_on_a_pool_that_is_not_pinnable(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    for pinned in ("on", "off"):
        d = _pinnable(fresh_daemon, pinned)
        with rmmd.Session(runtime_dir=str(d.runtime_dir)) as s:
            a = rmmd.SharedBuffer.create(s, "pin/plain", MiB, pool=s.host_pool, pinned=False)
            a.publish()
            r = rmmd.SharedBuffer.open(s, "pin/plain", pinned=False)
            assert not a.pinned and not r.pinned
            r.close()
            a.close()


def test_pinned_true_on_a_pool_that_is_not_pinnable_names_the_flag_and_opens_nothing(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    d = _pinnable(fresh_daemon, "off")
    with rmmd.Session(runtime_dir=str(d.runtime_dir)) as s, rmmd.Session(runtime_dir=str(d.runtime_dir)) as other:
        a = rmmd.SharedBuffer.create(s, "pin/np", MiB, pool=s.host_pool)
        a.publish()
        with pytest.raises(rmmd.InvalidArgumentError, match=r"pin/np.*not pinnable.*--host-pool-pinned=on.*pinned=False\)"):
            rmmd.SharedBuffer.open(other, "pin/np", pinned=True)
        with pytest.raises(rmmd.InvalidArgumentError, match="not pinnable"):
            rmmd.SharedBuffer.create(other, "pin/np2", MiB, pool=other.host_pool, pinned=True)
        assert s.describe_buffer("pin/np")[0].holders == 1  # the refused open holds nothing
        assert [b.name for b in s.buffers(prefix="pin/")] == ["pin/np"]  # nor did the create stay
        # The same session opens it plainly afterwards.
        r = rmmd.SharedBuffer.open(other, "pin/np")
        assert not r.pinned
        r.close()
        a.close()


def test_pinned_true_without_a_gpu_is_a_named_cuda_error_and_opens_nothing(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    if gpu_count() > 0:
        pytest.skip("this process sees a GPU: the case is one without any")
    d = _pinnable(fresh_daemon)
    with rmmd.Session(runtime_dir=str(d.runtime_dir)) as s, rmmd.Session(runtime_dir=str(d.runtime_dir)) as other:
        a = rmmd.SharedBuffer.create(s, "pin/nogpu", MiB, pool=s.host_pool)
        a.publish()
        assert not a.pinned  # automatic, and there is no context to do it in
        with pytest.raises(rmmd.InternalError, match=r"page-lock host buffer 'pin/nogpu': this process sees no GPU.*pinned=None or False\)"):
            rmmd.SharedBuffer.open(other, "pin/nogpu", pinned=True)
        assert s.describe_buffer("pin/nogpu")[0].holders == 1
        a.close()


# What each child starts with: the driver, and the devices whose primary
# context is active (contexts()) and whether the calling thread has a
# current one (current()), asked of it.
_PRELUDE = textwrap.dedent(
    """
    import ctypes, json, sys, threading
    import rmmd
    from rmmd import _cuda

    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0

    def contexts():
        n = ctypes.c_int()
        assert cuda.cuDeviceGetCount(ctypes.byref(n)) == 0
        active = []
        for i in range(n.value):
            dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            assert cuda.cuDeviceGet(ctypes.byref(dev), i) == 0
            assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
            if on.value:
                active.append(i)
        return active

    def current():
        ctx = ctypes.c_void_p()
        assert cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
        return ctx.value is not None
    """
)

# The child: each step's pinned answers and the devices whose primary
# context is active, as JSON.
_STEPS = _PRELUDE + textwrap.dedent(
    """
    device = int(sys.argv[1])
    if device >= 0:
        _cuda.set_device(device)  # the process's own context, as torch.cuda.set_device makes
    seen = {"start": contexts()}
    with rmmd.Session() as s:
        a = rmmd.SharedBuffer.create(s, "pin/a", 1 << 20, pool=s.host_pool)
        a.publish()
        seen["create"] = [a.pinned, contexts()]
        r = rmmd.SharedBuffer.open(s, "pin/a")
        seen["open"] = [r.pinned, contexts()]
        off = rmmd.SharedBuffer.open(s, "pin/a", pinned=False)
        seen["off"] = [off.pinned, contexts()]
        req = rmmd.SharedBuffer.open(s, "pin/a", pinned=True)
        seen["required"] = [req.pinned, r.pinned, contexts()]
        b = rmmd.SharedBuffer.create(s, "pin/b", 1 << 20, pool=s.host_pool)
        seen["after"] = [b.pinned, a.pinned, contexts()]
        for x in (req, off, r, b, a):
            x.close()
        seen["closed"] = contexts()
    print(json.dumps(seen))
    """
)


def _steps(d: Daemon, device: int) -> dict[str, list[object]]:
    env = dict(os.environ, RMMD_RUNTIME_DIR=str(d.runtime_dir))
    out = run_python(["-c", _STEPS, str(device)], env)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_an_open_makes_no_cuda_context_unless_pinned_is_asked_for(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    need_gpu()
    seen = _steps(_pinnable(fresh_daemon), device=-1)
    # A CPU-side reader: plain mappings, and no GPU's memory spent on it.
    assert seen["start"] == []
    assert seen["create"] == [False, []]
    assert seen["open"] == [False, []]
    assert seen["off"] == [False, []]
    # Asked for: the current device's (GPU 0's) context is made, and the
    # shared read-only mapping is page-locked for every open of it.
    assert seen["required"] == [True, True, [0]]
    # Now the process has a context: automatic page-locks a new buffer; the
    # creator's mapping made before stays as it was.
    assert seen["after"] == [True, False, [0]]
    assert seen["closed"] == [0]


def test_a_process_with_a_context_page_locks_in_it_and_makes_no_other(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    need_gpu()
    device = 1 if gpu_count() >= 2 else 0  # on two GPUs: not GPU 0, the runtime's default
    seen = _steps(_pinnable(fresh_daemon), device=device)
    assert seen["start"] == [device]
    assert seen["create"] == [True, [device]]
    assert seen["open"] == [True, [device]]
    assert seen["off"] == [True, [device]]  # the read-only mapping is the open's before it
    assert seen["required"] == [True, True, [device]]
    assert seen["after"] == [True, True, [device]]


# The child: a main thread with a context, and an open on another thread.
_ANOTHER_THREAD = _PRELUDE + textwrap.dedent(
    """
    _cuda.set_device(int(sys.argv[1]))  # the main thread's context
    seen = {"start": contexts()}
    with rmmd.Session() as s:
        a = rmmd.SharedBuffer.create(s, "pin/t", 1 << 20, pool=s.host_pool, pinned=False)
        a.publish()

        def reader():
            # A new thread has no current context: the open finds the
            # process's primary context, page-locks in it, and leaves the
            # thread as it found it.
            seen["thread_current_before"] = current()
            r = rmmd.SharedBuffer.open(s, "pin/t")
            seen["thread"] = [r.pinned, contexts(), current()]
            r.close()
            seen["thread_closed"] = [contexts(), current()]

        t = threading.Thread(target=reader)
        t.start()
        t.join()
        a.close()
    print(json.dumps(seen))
    """
)


def test_an_open_on_a_thread_without_a_current_context_page_locks_in_the_processs_own(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    need_gpu()
    device = 1 if gpu_count() >= 2 else 0  # on two GPUs: not GPU 0, the runtime's default
    d = _pinnable(fresh_daemon)
    env = dict(os.environ, RMMD_RUNTIME_DIR=str(d.runtime_dir))
    out = run_python(["-c", _ANOTHER_THREAD, str(device)], env)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["start"] == [device]
    assert seen["thread_current_before"] is False
    assert seen["thread"] == [True, [device], False]
    assert seen["thread_closed"] == [[device], False]
