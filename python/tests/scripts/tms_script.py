"""A torch_memory_saver program as its users write them, unchanged but for
the import, which $TMS_IMPL (or the first argument) chooses: "rmmd" for
rmmd.memory_saver, "torch_memory_saver" for SGLang's package (run it with
LD_PRELOAD set by torch_memory_saver's configure_subprocess: its default
hook mode). test_memory_saver.py runs it both ways and compares what it
prints."""

import os
import sys

import torch

if (os.environ.get("TMS_IMPL") or (sys.argv[1] if len(sys.argv) > 1 else "rmmd")) == "rmmd":
    from rmmd.memory_saver import torch_memory_saver
else:
    from torch_memory_saver import torch_memory_saver


def main():
    torch.manual_seed(0)
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        w = torch.randn(1024, 1024, device="cuda")
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.zeros(4096, 1024, device="cuda")
    static_in = torch.randn(16, 1024, device="cuda")
    w_ref = w.clone()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static_in @ w  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch_memory_saver.cuda_graph(cuda_graph=g, tag="cuda_graph"):
        static_out = (static_in @ w).tanh()
    g.replay()
    torch.cuda.synchronize()
    out_ref = static_out.clone()
    addresses = (w.data_ptr(), kv.data_ptr(), static_out.data_ptr())

    for _ in range(3):
        torch_memory_saver.pause("kv_cache")
        torch_memory_saver.resume("kv_cache")
        torch_memory_saver.pause()
        torch_memory_saver.resume()
    torch.cuda.synchronize()
    print("addresses kept:", addresses == (w.data_ptr(), kv.data_ptr(), static_out.data_ptr()))
    print("weights restored:", torch.equal(w, w_ref))
    kv.fill_(1)
    print("kv usable:", kv.sum().item())
    static_out.zero_()
    g.replay()
    torch.cuda.synchronize()
    print("graph replays the same:", torch.equal(static_out, out_ref))
    print("weights checksum:", f"{w.double().sum().item():.6f}")

    torch_memory_saver.pause("weights")
    backup = torch_memory_saver.get_cpu_backup(w)
    print("cpu backup while paused:", backup is not None and torch.equal(backup, w_ref.cpu()))
    torch_memory_saver.resume("weights")
    print("cpu backup once resumed:", torch_memory_saver.get_cpu_backup(w))
    print("weights restored again:", torch.equal(w, w_ref))


if __name__ == "__main__":
    main()
