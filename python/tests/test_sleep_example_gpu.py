"""The sleep-and-wake example on the GPU host
(examples/python/transformers_sleep/run.py): a transformers Llama under
rmmd.memory_saver generates with a CUDA graph, pauses, a trainer (another
uid where this runs as root) trains on the freed memory, and the engine
resumes and generates the same tokens; rmmctl shows the memory move.
Skipped, saying why, without a GPU, PyTorch or transformers."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Iterator

import pytest
from conftest import REPO, RMMCTL, Daemon, need_gpu, need_module, run_python, wait_until

EXAMPLE = REPO / "examples" / "python" / "transformers_sleep" / "run.py"
OTHER_USER = "rmmd-client-b"


def other_uid() -> int | None:
    """As root: the uid of OTHER_USER, made if missing (a system user
    without home or shell); None elsewhere, or where it cannot be made."""
    if os.geteuid() != 0:
        return None
    for attempt in range(2):
        found = subprocess.run(["id", "-u", OTHER_USER], capture_output=True, text=True)
        if found.returncode == 0:
            return int(found.stdout.strip())
        if attempt == 0:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                           capture_output=True)
    return None


@pytest.fixture(scope="module")
def sleep_daemon() -> Iterator[Daemon]:
    """A daemon whose CUDA pool (3 GiB) the engine (about 1.5 GiB: weights,
    a 1 GiB KV cache, the graph) half fills, and the trainer, while the
    engine sleeps, more than the half left; as root it admits OTHER_USER
    too, its sockets open to every uid."""
    need_gpu()
    need_module("torch")
    need_module("transformers")
    uid = other_uid()
    allow = [] if uid is None else ["--allow-uid", "0", "--allow-uid", str(os.getuid()), "--allow-uid", str(uid)]
    d = Daemon("--backend", "cuda", "--cuda-pool-bytes", "3GiB", "--host-pool-bytes", "2GiB", "--fabric", "off",
               *allow)
    if uid is not None:
        d.runtime_dir.chmod(0o755)
        for socket_name in ("rmmd-session.sock", "rmmd.sock"):
            (d.runtime_dir / socket_name).chmod(0o666)
    yield d
    d.stop()


def cuda_in_use(d: Daemon) -> int:
    return sum(int(p["in_use_bytes"]) for p in d.stats()["pools"] if p["pool"]["backend"] == "BACKEND_CUDA")


@pytest.mark.gpu
def test_the_engine_sleeps_another_process_trains_and_it_wakes_to_the_same_tokens(sleep_daemon: Daemon) -> None:
    out = run_python([str(EXAMPLE), "--device", "0", "--rmmctl", str(RMMCTL),
                      "--other-user", OTHER_USER if os.geteuid() == 0 else "none"],
                     sleep_daemon.env(), timeout=600, check=False)  # fmt: skip
    assert out.stdout.strip(), out.stderr
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    shown = f"{out.stdout[-6000:]}\n{out.stderr[-4000:]}"
    assert out.returncode == 0, shown
    assert got["equal"] and got["weights_restored"] and got["addresses_kept"] and got["graph"], shown
    assert got["tokens"] == 16 * 32, got
    trainer = got["trainer"]
    assert trainer["trained_steps"] == 50 and trainer["exit_status"] == 0, trainer
    if os.geteuid() == 0:
        # Another uid where it could be; where not, the example says why.
        assert trainer["other_uid"] or "the same uid" in trainer["runs_as"], trainer
    # The pause gave the device memory back and kept the weights on host.
    assert got["given_back_bytes"] > 1 << 30 and got["backup_bytes"] > 256 << 20, got
    moments = {m["moment"].split(" (")[0]: m for m in got["moments"]}
    assert moments["asleep"]["cuda_in_use_bytes"] < moments["loaded"]["cuda_in_use_bytes"], moments
    assert moments["asleep"]["host_in_use_bytes"] >= got["backup_bytes"], moments
    assert moments["the trainer holds the freed memory"]["cuda_in_use_bytes"] >= trainer["holding_bytes"], moments
    assert got["pool"]["trainer_needed_the_sleep"], got["pool"]
    for heading in ("asleep (weights on host, KV and graph given back): rmmctl sleepers",
                    "the trainer holds the freed memory: rmmctl pools", "awake again"):
        assert heading in out.stdout, out.stdout[-4000:]
    wait_until(lambda: cuda_in_use(sleep_daemon) == 0, what="the memory to go back")


def test_the_example_has_help_without_a_gpu() -> None:
    out = run_python([str(EXAMPLE), "--help"], dict(os.environ))
    assert "--other-user" in out.stdout and "rmmctl" in out.stdout


def test_the_example_refuses_a_prompt_longer_than_its_cache() -> None:
    out = run_python([str(EXAMPLE), "--prompt-len", "100", "--new-tokens", "100", "--max-cache-len", "128"],
                     dict(os.environ), check=False)
    assert out.returncode == 2 and "--max-cache-len" in out.stderr, out.stderr
