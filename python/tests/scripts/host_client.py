"""A client process for the host-pool tests (RMMD_RUNTIME_DIR names the
daemon). Prints one line of JSON when it has done its part; some commands
then wait for a line on stdin before they finish.

  produce NAME BYTES [--persistent] [--manifest]
                                      create in the host pool, write the
                                      pattern (with --manifest: described as
                                      the uint32 tensor "pattern", labels
                                      model=pattern and revision=r1),
                                      publish; wait; close
  consume NAME [--wait S]             open, check the pattern, close
  hold BYTES                          allocate and write; wait; exit
  leave BYTES                         allocate, create a buffer, exit without
                                      freeing or closing anything
  raise BYTES                         the same, then raise
  lease NAME [--wait S]               open NAME exclusively (its write
                                      lease), write the generation into its
                                      first 8 bytes, print it; wait; close
  standby NAME [--write-early]        open NAME as a standby (mapped at
                                      once, in line), print its generation
                                      (0: in line) and address; with
                                      --write-early write before the grant
                                      (a read-only mapping: SIGSEGV); wait
                                      for the lease, print what the last
                                      holder stamped and whether the address
                                      stayed, stamp it; wait; close
"""

from __future__ import annotations

import json
import sys

import numpy as np

import rmmd


def pattern(nbytes: int) -> np.ndarray:
    return (np.arange(nbytes // 4, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def main(argv: list[str]) -> int:
    cmd = argv[0]
    session = rmmd.Session(client_name=f"py-{cmd}")
    if cmd == "produce":
        name, nbytes = argv[1], int(argv[2])
        buf = rmmd.SharedBuffer.create(
            session, name, nbytes, pool=session.host_pool, persistent="--persistent" in argv
        )
        np.frombuffer(buf.memoryview(), dtype=np.uint32)[:] = pattern(nbytes)
        if "--manifest" in argv:
            buf.set_manifest(
                [rmmd.TensorEntry("pattern", "uint32", (nbytes // 4,), 0)],
                {"model": "pattern", "revision": "r1"},
            )
        buf.publish()
        say(id=buf.id, session=session.id, nbytes=buf.nbytes)
        sys.stdin.readline()
        buf.close()
        say(closed=True)
    elif cmd == "consume":
        name = argv[1]
        wait = float(argv[argv.index("--wait") + 1]) if "--wait" in argv else 0.0
        with rmmd.SharedBuffer.open(session, name, wait=wait) as buf:
            seen = np.asarray(buf).view(np.uint32)
            ok = bool(np.array_equal(seen, pattern(buf.nbytes)))
            say(ok=ok, id=buf.id, nbytes=buf.nbytes, session=session.id)
    elif cmd == "hold":
        a = session.host_resource().allocation(int(argv[1]))
        np.asarray(a)[:] = 1
        say(session=session.id, ptr=a.ptr)
        sys.stdin.readline()
    elif cmd in ("leave", "raise"):
        r = session.host_resource()
        a = r.allocation(int(argv[1]))
        np.asarray(a)[:] = 1
        b = rmmd.SharedBuffer.create(session, f"leave/{cmd}", 4096, pool=session.host_pool)
        b.publish()
        # Module-level references, freed while the interpreter exits: the
        # objects, and views of them (numpy arrays over DLPack among them).
        kept = (session, r, a, b, np.from_dlpack(a), np.from_dlpack(b), np.asarray(b))
        globals()["kept"] = kept
        if cmd == "raise":
            raise RuntimeError("boom")
    elif cmd == "lease":
        name = argv[1]
        wait = float(argv[argv.index("--wait") + 1]) if "--wait" in argv else 0.0
        buf = rmmd.SharedBuffer.open(session, name, wait=wait, writable=True, exclusive=True)
        seen = int(np.asarray(buf).view(np.uint64)[0])
        np.asarray(buf).view(np.uint64)[0] = buf.lease_generation
        say(generation=buf.lease_generation, seen=seen, session=session.id)
        sys.stdin.readline()
        buf.close()
    elif cmd == "standby":
        name = argv[1]
        buf = rmmd.SharedBuffer.open(session, name, writable=True, exclusive=True, standby=True)
        before = buf.ptr
        say(standby=buf.lease_generation, holds=buf.holds_lease, ptr=before)
        if "--write-early" in argv:
            np.asarray(buf).view(np.uint64)[0] = 0xBAD  # SIGSEGV: PROT_READ until the grant
            say(wrote_early=True)
        generation = buf.wait_lease(60)
        seen = int(np.asarray(buf).view(np.uint64)[0])
        np.asarray(buf).view(np.uint64)[0] = generation
        say(generation=generation, seen=seen, same=buf.ptr == before, holds=buf.holds_lease)
        sys.stdin.readline()
        buf.close()
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
