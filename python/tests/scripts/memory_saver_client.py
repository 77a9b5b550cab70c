"""A process using rmmd.memory_saver, for test_memory_saver.py's GPU tests
(RMMD_RUNTIME_DIR names the daemon). Prints one line of JSON per step;
where it says so, waits for a line on stdin before the next step.

  cycles N           weights (CPU backup) and kv regions, N pauses and resumes;
                     addresses, bytes restored, get_cpu_backup while paused
  graph              a graph captured with cuda_graph, replayed before a pause and after the resume
  every_tag          three tags, pause() with no tag; waits; resume()
  free_memory MIB    the device's free memory before, during and after a pause (gpu_exclusive)
  resume_short MIB   a MIB region, paused; waits; resume(deadline=0.5) (expected to fail);
                     waits; resume() again
  hold MIB           MIB of the pool in a plain rmmd allocation (no torch); waits; frees
  sleep_named NAME MIB   a MIB region with a CPU backup, filled, paused under NAME; waits (to be killed)
  restore NAME MIB   restore(NAME) in this new process; the bytes checked
"""

from __future__ import annotations

import json
import sys

import torch

import rmmd
from rmmd.memory_saver import torch_memory_saver

MiB = 1 << 20


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def wait() -> None:
    sys.stdin.readline()


def pattern(n_words: int, seed: int) -> torch.Tensor:
    """n_words int64 words that differ per seed and per word (on the GPU)."""
    i = torch.arange(n_words, dtype=torch.int64, device="cuda")
    return i * 0x9E3779B1 + seed * 0x7F4A7C15


def cycles(n: int, retain: bool = False) -> None:
    # retain: the CPU backups' room stays past resume, and the weights change
    # every cycle, so each pause must copy this cycle's bytes into it.
    torch_memory_saver.retain_cpu_backup = retain
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.empty(16 * MiB // 8, dtype=torch.int64, device="cuda")
    weights.copy_(pattern(weights.numel(), 36))  # outside: the region's pool holds one segment
    with torch_memory_saver.region(tag="kv"):
        kv = torch.empty(32 * MiB // 8, dtype=torch.int64, device="cuda")
    expected = weights.clone()  # PyTorch's own memory: never paused
    addresses = (weights.data_ptr(), kv.data_ptr())
    moved = bad = 0
    backup_ok = backup_none_for_kv = None
    for cycle in range(n):
        kv.fill_(cycle)
        if retain and cycle > 0:
            weights.add_(1)
            expected.add_(1)
        torch_memory_saver.pause()
        if cycle == 0:
            backup = torch_memory_saver.get_cpu_backup(weights)
            backup_ok = backup is not None and torch.equal(backup, expected.cpu())
            backup_none_for_kv = torch_memory_saver.get_cpu_backup(kv) is None
        torch_memory_saver.resume()
        moved += (weights.data_ptr(), kv.data_ptr()) != addresses
        bad += not torch.equal(weights, expected)
        kv.fill_(cycle + 1)  # writable again where it was
        bad += int(kv.min().item()) != cycle + 1
    say(
        cycles=n,
        moved=moved,
        bad=bad,
        backup_ok=backup_ok,
        backup_none_for_kv=backup_none_for_kv,
        backup_none_awake=torch_memory_saver.get_cpu_backup(weights) is None,
    )


def graph() -> None:
    torch.manual_seed(0)
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        w = torch.randn(1024, 1024, device="cuda")
        static_in = torch.randn(64, 1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (static_in @ w).relu()  # warm up cuBLAS outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with torch_memory_saver.cuda_graph(cuda_graph=g, tag="graph"):
        static_out = (static_in @ w).relu() + 1
    g.replay()
    torch.cuda.synchronize()
    before = static_out.clone()
    address = static_out.data_ptr()
    torch_memory_saver.pause()
    torch_memory_saver.resume()
    static_out.zero_()
    g.replay()
    torch.cuda.synchronize()
    say(same_address=static_out.data_ptr() == address, bitwise_equal=torch.equal(static_out, before))


def every_tag() -> None:
    tensors = []
    for tag, backup in (("a", False), ("b", True), ("c", False)):
        with torch_memory_saver.region(tag=tag, enable_cpu_backup=backup):
            tensors.append(torch.empty(8 * MiB // 8, dtype=torch.int64, device="cuda"))
        tensors[-1].copy_(pattern(tensors[-1].numel(), len(tensors)))
    kept = tensors[1].clone()
    torch_memory_saver.pause()
    say(paused=True)
    wait()
    torch_memory_saver.resume()
    say(resumed=True, b_restored=torch.equal(tensors[1], kept))


def free_memory(mib: int) -> None:
    with torch_memory_saver.region(tag="kv"):
        kv = torch.ones(mib * MiB // 4, device="cuda")
    torch.cuda.synchronize()
    before, _ = torch.cuda.mem_get_info()
    torch_memory_saver.pause()
    paused, _ = torch.cuda.mem_get_info()
    torch_memory_saver.resume()
    resumed, _ = torch.cuda.mem_get_info()
    kv.fill_(2)
    say(before=before, paused=paused, resumed=resumed, written=bool((kv == 2).all().item()))


def resume_short(mib: int) -> None:
    with torch_memory_saver.region(tag="kv"):
        kv = torch.ones(mib * MiB // 4, device="cuda")
    address = kv.data_ptr()
    torch_memory_saver.pause()
    say(paused=True)
    wait()
    try:
        torch_memory_saver.resume(deadline=0.5)
        say(raised=None)
    except torch.OutOfMemoryError as e:
        say(raised=type(e).__name__, message=str(e))
    wait()
    torch_memory_saver.resume()
    kv.fill_(3)
    say(resumed=True, same_address=kv.data_ptr() == address, written=bool((kv == 3).all().item()))


def hold(mib: int) -> None:
    with rmmd.Session(client_name="holder") as session:
        resource = session.device_resource(device=0, mode="direct")
        p = resource.allocate(mib * MiB)
        say(held=mib * MiB)
        wait()
        resource.deallocate(p, mib * MiB)
    say(freed=True)


def sleep_named(name: str, mib: int) -> None:
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.empty(mib * MiB // 8, dtype=torch.int64, device="cuda")
    weights.copy_(pattern(weights.numel(), 4242))  # the region's pool holds this one segment
    torch.cuda.synchronize()
    torch_memory_saver.pause(backup_name=name)
    say(asleep=True, ptr=weights.data_ptr())
    wait()


def restore(name: str, mib: int) -> None:
    restored = torch_memory_saver.restore(name)
    out = []
    intact = False
    for a in restored:
        t = torch.as_tensor(a, device="cuda")  # uint8 over the allocation
        words = t[: mib * MiB].view(torch.int64)
        intact = bool(torch.equal(words, pattern(mib * MiB // 8, 4242)))
        out.append({"tag": a.tag, "nbytes": a.nbytes})
        del t, words
    for a in restored:
        a.free()
    say(restored=out, intact=intact)


def main() -> None:
    what, args = sys.argv[1], sys.argv[2:]
    if what == "cycles":
        cycles(int(args[0]), retain=args[1:] == ["retain"])
    elif what == "graph":
        graph()
    elif what == "every_tag":
        every_tag()
    elif what == "free_memory":
        free_memory(int(args[0]))
    elif what == "resume_short":
        resume_short(int(args[0]))
    elif what == "hold":
        hold(int(args[0]))
    elif what == "sleep_named":
        sleep_named(args[0], int(args[1]))
    elif what == "restore":
        restore(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown step {what}")


if __name__ == "__main__":
    main()
