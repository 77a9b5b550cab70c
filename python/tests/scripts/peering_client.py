"""A process of the peering tests (test_peering_gpu.py): RMMD_RUNTIME_DIR names
the daemon of its node, CUDA_VISIBLE_DEVICES its GPU. Prints one line of
JSON when it has done its part; `produce` and `consume` then hold the
buffer until a line on stdin, check it again, and print a second line.

  produce NAME NBYTES SEED   a PyTorch producer: a buffer of NBYTES in pool
                             "gpu", filled with SEED's pattern on the GPU, a
                             manifest (one uint8 tensor "pattern", label
                             seed=SEED), published on its stream; speaks
                             once the daemon lists it published
  consume ADDRESS NBYTES SEED
                             opens ADDRESS (NODE:NAME) through this node's
                             daemon, compares it on its GPU with SEED's
                             pattern through DLPack (torch.from_dlpack), the
                             manifest's view (buf.tensors("torch")) and, where
                             CuPy is installed, __cuda_array_interface__;
                             says what Session.peers() shows while it holds it
  write ADDRESS              opens ADDRESS read-only and writes through a
                             PyTorch view: says whether the write went through
  try-open ADDRESS           opens ADDRESS; says what it raised
  peers [NAME]               Session.node_name, Session.peers() and the
                             holders of NAME this node's daemon counts
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from typing import Any

import rmmd


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def pattern(nbytes: int, seed: int) -> Any:
    """Byte i is (i * 131 + seed) mod 251, made on the current GPU."""
    import torch

    i = torch.arange(nbytes, dtype=torch.int64, device="cuda")
    return ((i * 131 + seed) % 251).to(torch.uint8)


def digest(t: Any) -> str:
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


def gpu_uuid(device: int | None = None) -> str:
    import torch

    device = torch.cuda.current_device() if device is None else device
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return "" if uuid is None else str(uuid)


def peers(session: rmmd.Session) -> list[dict[str, Any]]:
    return [dataclasses.asdict(p) for p in session.peers()]


def holders(session: rmmd.Session, name: str) -> int:
    """Holders of `name` as this node's daemon counts them (0: no such buffer)."""
    return next((b.holders for b in session.buffers(prefix=name) if b.name == name), 0)


def produce(session: rmmd.Session, name: str, nbytes: int, seed: int) -> int:
    import torch

    buf = rmmd.SharedBuffer.create(session, name, nbytes, pool="gpu")
    view = torch.from_dlpack(buf)
    stream = torch.cuda.current_stream()
    view.copy_(pattern(nbytes, seed))
    buf.set_manifest([rmmd.TensorEntry("pattern", "uint8", (nbytes,), 0)], labels={"seed": str(seed)})
    buf.publish(stream)
    # The publish reaches the daemon from a host function on the stream; a
    # remote open does not wait for it, so say "created" once it is published.
    deadline = time.monotonic() + 30
    while not any(b.name == name and b.published for b in session.buffers(prefix=name)):
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: not published 30 s after publish()")
        time.sleep(0.01)
    say(created=buf.name, nbytes=buf.nbytes, digest=digest(view), gpu=gpu_uuid())
    sys.stdin.readline()
    intact = bool(torch.equal(view, pattern(nbytes, seed)))
    del view
    buf.close()
    say(intact=intact)
    return 0


def consume(session: rmmd.Session, address: str, nbytes: int, seed: int, device: int | None = None) -> int:
    import torch

    buf = rmmd.SharedBuffer.open(session, address, expect={"seed": str(seed)}, device=device)
    whole = torch.from_dlpack(buf)  # a uint8 tensor of every byte, on the buffer's GPU
    want = pattern(nbytes, seed).to(whole.device)
    tensors = buf.tensors("torch")
    cai_same = None
    try:
        import cupy

        with cupy.cuda.Device(buf.device):
            cai_same = bool(cupy.array_equal(cupy.asarray(buf), cupy.asarray(want)))
    except ImportError:
        pass
    say(
        verified=bool(torch.equal(whole, want)),
        nbytes=buf.nbytes,
        peer=buf.peer,
        name=buf.name,
        writable=buf.writable,
        device=buf.device,
        tensor_device=str(whole.device),
        manifest_same=bool(torch.equal(tensors["pattern"], want)),
        manifest_zero_copy=tensors["pattern"].data_ptr() == buf.ptr,
        cai_same=cai_same,
        digest=digest(whole),
        gpu=gpu_uuid(buf.device),
        current_device=torch.cuda.current_device(),
        repr=repr(buf),
        peers=peers(session),
    )
    sys.stdin.readline()
    intact = bool(torch.equal(whole, want))
    del whole, tensors
    buf.close()
    say(intact=intact, closed=buf.closed)
    return 0


def consume_labelled(session: rmmd.Session, node: str, nbytes: int, seed: int) -> int:
    """Finds node's buffer labelled seed=SEED by listing, opens it by that
    label, and checks the pattern on this process's GPU."""
    import torch

    listed = session.buffers(peer=node, labels={"seed": str(seed)})
    buf = rmmd.SharedBuffer.open_by_labels(session, {"seed": str(seed)}, peer=node)
    whole = torch.from_dlpack(buf)
    say(
        listed=[dataclasses.asdict(b) for b in listed],
        verified=bool(torch.equal(whole, pattern(nbytes, seed))),
        name=buf.name,
        peer=buf.peer,
        nbytes=buf.nbytes,
        writable=buf.writable,
        labels=dict(buf.labels),
    )
    del whole
    buf.close()
    return 0


def write(session: rmmd.Session, address: str) -> int:
    import torch

    buf = rmmd.SharedBuffer.open(session, address)
    view = torch.from_dlpack(buf)
    try:
        view.fill_(9)
        torch.cuda.synchronize()
        say(wrote=True, writable=buf.writable)
    except RuntimeError as e:  # the GPU faulted: this process's CUDA context is gone
        say(wrote=False, writable=buf.writable, error=str(e).splitlines()[0])
    return 0


def try_open(session: rmmd.Session, address: str, device: int | None = None) -> int:
    try:
        buf = rmmd.SharedBuffer.open(session, address, device=device)
    except rmmd.Error as e:
        say(
            opened=False,
            error=type(e).__name__,
            builtin_permission_error=isinstance(e, PermissionError),
            status=None if e.status is None else e.status.name,
            message=str(e),
        )
        return 0
    say(opened=True, peer=buf.peer)
    buf.close()
    return 0


def main(argv: list[str]) -> int:
    cmd = argv[0]
    session = rmmd.Session(client_name=f"peering-{cmd}")
    if cmd == "produce":
        return produce(session, argv[1], int(argv[2]), int(argv[3]))
    if cmd == "consume":
        return consume(session, argv[1], int(argv[2]), int(argv[3]), int(argv[4]) if len(argv) > 4 else None)
    if cmd == "consume-labelled":
        return consume_labelled(session, argv[1], int(argv[2]), int(argv[3]))
    if cmd == "write":
        return write(session, argv[1])
    if cmd == "try-open":
        return try_open(session, argv[1], int(argv[2]) if len(argv) > 2 else None)
    if cmd == "peers":
        say(
            node_name=session.node_name,
            peers=peers(session),
            holders=holders(session, argv[1]) if len(argv) > 1 else None,
        )
        return 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
