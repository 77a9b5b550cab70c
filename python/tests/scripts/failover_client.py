"""A KV writer for test_failover.py, in a process of its own:

  failover_client.py NAME MODEL LAYOUT_JSON [--wait S] [--steps N]

takes the write lease of the KV buffer NAME (rmmd.failover.active; NumPy
views for a host buffer, torch tensors for a device buffer),
writes N steps (step s: every key and value of position s is s + generation,
the lengths s + 1, the seed word 7, then the stamp), prints one line of
JSON (generation, the state it found), and waits for a line on stdin (or
its SIGKILL)."""

from __future__ import annotations

import json
import sys

import rmmd
from rmmd import failover


def main(argv: list[str]) -> int:
    name, model, layout = argv[0], argv[1], failover.KVLayout.from_json(argv[2])
    wait = float(argv[argv.index("--wait") + 1]) if "--wait" in argv else 0.0
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 3
    session = rmmd.Session(client_name="failover-client")
    kv = failover.active(session, name, layout, model=model, wait=wait)
    found = kv.state()
    start = max(found.lengths) if found.lengths else 0
    for s in range(start, start + steps):
        for t in kv.keys + kv.values:
            t[:, :, s, :] = s + kv.generation
        kv.lengths[:] = s + 1
        kv.header[failover.W_SEED] = 7
        kv.stamp()
    print(json.dumps({"generation": kv.generation, "found": found.__dict__, "now": kv.state().__dict__}), flush=True)
    sys.stdin.readline()
    kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
