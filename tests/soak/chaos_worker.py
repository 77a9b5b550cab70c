"""One client process of the chaos soak (rmmd_chaos.py starts many, as
several uids, and SIGKILLs some at random moments).

    python chaos_worker.py MARKER_HEX [--pinned]

Opens a session with reconnect (30 s) at $RMMD_RUNTIME_DIR through the rmmd
package (the C ABI, as every Python program reaches rmmd), prints one JSON
line {"ready": true, "session": ID}, then answers one JSON line per JSON
command read on stdin, until stdin closes (then it frees what it holds,
checking it, and exits 0). Every allocation and every buffer it writes
starts with MARKER_HEX (16 bytes: its uid's marker, which no process of
another uid may ever read) followed by a seeded pattern, so a check is word
by word. Commands (`op`), each answered {"ok": true, ...} or
{"ok": false, "error": CLASS, "message": ...}:

  alloc n seed          a host allocation (pinned with --pinned) of n bytes
                        -> {"id", "bytes": the ledger's rounding}
  free id               checks then frees it
  create name n seed persistent gid labels allow_writers
                        creates, writes, sets labels, publishes, keeps it open
  create_fabric name n seed gid labels
                        the same in the first CUDA pool this process sees
                        that exports fabric handles (written on its GPU), not
                        persistent; error NoFabricPool where there is none
  open name seed writable exclusive wait
                        opens and checks the pattern (seed < 0: no check);
                        exclusive: the write lease, whose generation it
                        writes into the first word after the marker
                        -> {"generation", "seen": the word it found there}
  open_labels labels seed
                        opens the one buffer with these labels, checks it
  close name            closes its open of that buffer
  list labels peer      -> {"names": names of the buffers with those labels}
                        (of node `peer`, through this node's daemon, if given)
  delete name           SharedBuffer.delete
  verify                checks every allocation and open buffer it holds
  ping                  one allocation and free, then the session's
                        reconnect count -> {"reconnects", "held": bytes}
  held                  -> {"held": bytes of its live allocations}

A mismatch is {"ok": false, "error": "corrupted", ...}; the driver counts it
as an invariant failure. Device memory (a fabric buffer, or another node's
opened as nodeA:NAME) is written and read through a copy on its GPU.
"""

from __future__ import annotations

import ctypes
import json
import sys
from array import array
from typing import Any

import rmmd

ALIGN = 256
MARK = bytes(16)  # set from the command line
PINNED = False


def pattern(nwords: int, seed: int) -> bytes:
    """The seeded words after the marker, little-endian (the same formula in
    chaos_events.py)."""
    base = (seed & 0xFFFFFFFF) * 0x9E3779B1
    k, m = 0x9E3779B97F4A7C15, (1 << 64) - 1
    return array("Q", [((i + base) * k) & m for i in range(nwords)]).tobytes()


def body(view: memoryview) -> tuple[memoryview, int]:
    n = (len(view) - 16) // 8
    return view[16 : 16 + n * 8], n


def fill(view: memoryview, seed: int) -> None:
    view[:16] = MARK
    b, n = body(view)
    b[:] = pattern(n, seed)


def first_difference(got: bytes, want: bytes, skip_words: int) -> str | None:
    """None when the words from `skip_words` on are equal; else which differs."""
    at = skip_words * 8
    if got[at:] == want[at:]:
        return None
    g, w = array("Q", got), array("Q", want)
    bad = [i for i in range(skip_words, len(w)) if g[i] != w[i]]
    return f"word {bad[0]} is {g[bad[0]]:#x}, want {w[bad[0]]:#x} ({len(bad)} words differ)"


def check(view: memoryview, seed: int, what: str, skip_words: int = 0) -> None:
    b, n = body(view)
    why = first_difference(bytes(b), pattern(n, seed), skip_words)
    if why is not None:
        raise Corrupted(f"{what}: {why}")


class Corrupted(Exception):
    pass


class NoFabricPool(Exception):
    pass


def device_copy(dst: int, src: int, nbytes: int, device: int) -> None:
    """A synchronous copy to or from device memory (cudaMemcpyDefault), with
    the libcudart rmmd's library loaded."""
    from rmmd import _cuda  # noqa: PLC0415

    lib = _cuda._find()
    with _cuda.on_device(device):
        _cuda._check(lib, lib.cudaMemcpyAsync(dst, src, nbytes, 4, None), "cudaMemcpyAsync")
        _cuda._check(lib, lib.cudaStreamSynchronize(None), "cudaStreamSynchronize")


def address(data: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))


class Worker:
    def __init__(self) -> None:
        self.session = rmmd.Session(client_name="chaos-worker", reconnect=30.0)
        self.resource = self.session.host_resource(pinned=PINNED)
        self.allocs: dict[int, tuple[Any, int]] = {}
        self.buffers: dict[str, tuple[Any, int, int]] = {}  # name -> (buffer, seed, skip words)
        self.next_id = 1

    def view(self, mem: Any) -> memoryview:
        """Host memory itself; device memory's bytes as they are now (a copy:
        a write to it changes nothing)."""
        if mem.is_host:
            return mem.memoryview()
        data = bytearray(mem.nbytes)
        device_copy(address(data), mem.ptr, mem.nbytes, mem.device)
        return memoryview(data)

    def held(self) -> int:
        return sum((a.nbytes + ALIGN - 1) // ALIGN * ALIGN for a, _ in self.allocs.values())

    def op_alloc(self, n: int, seed: int) -> dict[str, Any]:
        a = self.resource.allocation(n)
        fill(self.view(a), seed)
        i = self.next_id
        self.next_id += 1
        self.allocs[i] = (a, seed)
        return {"id": i, "bytes": (n + ALIGN - 1) // ALIGN * ALIGN}

    def op_free(self, id: int) -> dict[str, Any]:
        a, seed = self.allocs.pop(id)
        check(self.view(a), seed, f"allocation {id}")
        a.free()
        return {}

    def op_create(self, name: str, n: int, seed: int, persistent: bool, gid: int | None,
                  labels: dict[str, str], allow_writers: bool) -> dict[str, Any]:
        b = rmmd.SharedBuffer.create(self.session, name, n, pool=self.session.host_pool,
                                     persistent=persistent, gid=gid, allow_writers=allow_writers)
        fill(self.view(b), seed)
        if labels:
            b.set_manifest([], labels=labels)
        b.publish()
        self.buffers[name] = (b, seed, 0)
        return {"id": b.id}

    def op_create_fabric(self, name: str, n: int, seed: int, gid: int | None,
                         labels: dict[str, str]) -> dict[str, Any]:
        pools = [p for p in self.session.pools if p.backend == "cuda" and p.has_fabric_handle and p.device >= 0]
        if not pools:
            raise NoFabricPool("no CUDA pool of this daemon that this process sees exports fabric handles: "
                               + ", ".join(f"{p.name} (fabric {p.has_fabric_handle}, device {p.device})"
                                           for p in self.session.pools))
        b = rmmd.SharedBuffer.create(self.session, name, n, pool=pools[0], gid=gid)
        data = bytearray(n)
        fill(memoryview(data), seed)
        device_copy(b.ptr, address(data), n, b.device)
        if labels:
            b.set_manifest([], labels=labels)
        b.publish()
        self.buffers[name] = (b, seed, 0)
        return {"id": b.id, "pool": pools[0].name}

    def op_open(self, name: str, seed: int, writable: bool = False, exclusive: bool = False,
                wait: float = 0.0) -> dict[str, Any]:
        b = rmmd.SharedBuffer.open(self.session, name, wait=wait, writable=writable, exclusive=exclusive)
        v = self.view(b)
        out: dict[str, Any] = {"bytes": b.nbytes}
        skip = 0
        if exclusive:
            out["seen"] = int.from_bytes(v[16:24], "little")
            out["generation"] = b.lease_generation
            v[16:24] = b.lease_generation.to_bytes(8, "little")
            skip = 1
        if seed >= 0:
            check(v, seed, f"buffer {name}", skip_words=max(skip, 1 if name.startswith("chaos/lease") else 0))
        self.buffers[name] = (b, seed, skip)
        return out

    def op_open_labels(self, labels: dict[str, str], seed: int) -> dict[str, Any]:
        b = rmmd.SharedBuffer.open_by_labels(self.session, labels)
        check(self.view(b), seed, f"buffer {b.name} (by labels {labels})")
        self.buffers[b.name] = (b, seed, 0)
        return {"name": b.name}

    def op_close(self, name: str) -> dict[str, Any]:
        b, _, _ = self.buffers.pop(name)
        b.close()
        return {}

    def op_list(self, labels: dict[str, str], peer: str | None = None) -> dict[str, Any]:
        return {"names": sorted(i.name for i in self.session.buffers(labels=labels, peer=peer))}

    def op_delete(self, name: str) -> dict[str, Any]:
        rmmd.SharedBuffer.delete(self.session, name)
        return {}

    def op_verify(self) -> dict[str, Any]:
        for i, (a, seed) in self.allocs.items():
            check(self.view(a), seed, f"allocation {i}")
        for name, (b, seed, skip) in self.buffers.items():
            if seed >= 0:
                check(self.view(b), seed, f"buffer {name}", skip_words=skip)
        return {"checked": len(self.allocs) + len(self.buffers)}

    def op_ping(self) -> dict[str, Any]:
        with self.resource.allocation(4096) as a:
            fill(self.view(a), 7)
            check(self.view(a), 7, "ping allocation")
        return {"reconnects": self.session.reconnects, "held": self.held()}

    def op_held(self) -> dict[str, Any]:
        return {"held": self.held(), "session": self.session.id}

    def run(self) -> int:
        print(json.dumps({"ready": True, "session": self.session.id}), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd.pop("op")
            try:
                out = {"ok": True, **getattr(self, "op_" + op)(**cmd)}
            except Corrupted as e:
                out = {"ok": False, "error": "corrupted", "message": str(e)}
            except Exception as e:  # every other error is an answer the driver judges
                out = {"ok": False, "error": type(e).__name__, "message": str(e)}
            print(json.dumps(out), flush=True)
        status = 0
        try:
            self.op_verify()
        except Corrupted as e:
            print(json.dumps({"ok": False, "error": "corrupted", "message": str(e)}), flush=True)
            status = 1
        for b, _, _ in self.buffers.values():
            b.close()
        for a, _ in self.allocs.values():
            a.free()
        self.resource.close()
        self.session.close()
        return status


if __name__ == "__main__":
    MARK = bytes.fromhex(sys.argv[1])
    assert len(MARK) == 16, "MARKER_HEX is 16 bytes"
    PINNED = "--pinned" in sys.argv[2:]
    sys.exit(Worker().run())
