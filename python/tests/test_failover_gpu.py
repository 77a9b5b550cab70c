"""Failover of a transformers engine's KV cache on the GPU host
(examples/python/transformers_failover/run.py): the active engine decodes
into an rmmd KV buffer and is SIGKILLed at a decode step drawn from the
seed; the standby, waiting with the model built and the buffer mapped,
takes the lease, goes on from the KV cache where the dead engine stopped
(no prefill again) and ends with the uninterrupted run's tokens. Skipped,
saying why, without a GPU, PyTorch or transformers."""

from __future__ import annotations

import json
import os
import random
from typing import Any, Iterator

import pytest
from conftest import REPO, Daemon, need_gpu, need_module, run_python, wait_until
from test_failover import take_over

import rmmd

EXAMPLE = REPO / "examples" / "python" / "transformers_failover" / "run.py"


@pytest.fixture(scope="module")
def failover_daemon() -> Iterator[Daemon]:
    need_gpu()
    need_module("torch")
    need_module("transformers")
    d = Daemon("--backend", "cuda", "--cuda-pool-bytes", "2GiB", "--host-pool-bytes", "256MiB", "--fabric", "off")
    yield d
    d.stop()


def cuda_in_use(d: Daemon) -> int:
    return sum(int(p["in_use_bytes"]) for p in d.stats()["pools"] if p["pool"]["backend"] == "BACKEND_CUDA")


def run_example(d: Daemon, *args: str) -> dict[str, Any]:
    out = run_python([str(EXAMPLE), "--device", "0", *args], d.env(), timeout=600, check=False)
    shown = f"{out.stdout[-6000:]}\n{out.stderr[-6000:]}\n{d.log()[-3000:]}"
    assert out.stdout.strip(), shown
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, shown
    got["_shown"] = shown
    return got


# Kill moments drawn from a seeded generator: the same every run, a new one per case.
CASES = [(seed, graph) for seed, graph in zip(random.Random(37).sample(range(1000), 4), [True, True, True, False])]


@pytest.mark.gpu
@pytest.mark.parametrize("seed,graph", CASES)
def test_the_standby_goes_on_from_the_dead_engines_kv_to_the_same_tokens(
    failover_daemon: Daemon, seed: int, graph: bool
) -> None:
    got = run_example(failover_daemon, "--seed", str(seed), "--name", f"fo-gpu/kv/{seed}",
                      *([] if graph else ["--no-graph"]))  # fmt: skip
    shown = got.pop("_shown")
    assert got["equal"] and not got["prefix_recomputed"], shown
    assert got["active_status"] == -9, got  # SIGKILLed
    # It went on from past the prompt, with one forward per token left.
    assert got["resumed_at"] > 32 and got["standby_forwards"] == 32 + 48 - got["resumed_at"], got
    assert got["resumed_at"] <= got["killed_at_length"], got
    assert got["generation"] == got["previous_generation"] + 1 == 2, got
    assert 0 < got["grant_s"] < 10 and got["grant_s"] <= got["first_token_s"], got
    assert got["graph_before_grant"] == graph, got  # captured before the grant, replayed after it
    wait_until(lambda: cuda_in_use(failover_daemon) == 0, timeout=30, what="the memory to go back")


@pytest.mark.gpu
def test_a_standby_takes_over_a_device_kv_buffer_from_a_sigkilled_writer(failover_daemon: Daemon) -> None:
    with rmmd.Session(runtime_dir=str(failover_daemon.runtime_dir), client_name="pytest") as session:
        take_over(failover_daemon, session, "fo-gpu/kv-direct", device=0)
    wait_until(lambda: cuda_in_use(failover_daemon) == 0, timeout=30, what="the memory to go back")


def test_the_example_has_help_without_a_gpu() -> None:
    out = run_python([str(EXAMPLE), "--help"], dict(os.environ))
    assert "--kill-at" in out.stdout and "rmmd.failover" in out.stdout


def test_the_example_refuses_a_kill_step_past_the_end() -> None:
    out = run_python([str(EXAMPLE), "--new-tokens", "8", "--kill-at", "7"], dict(os.environ), check=False)
    assert out.returncode == 2 and "--kill-at" in out.stderr, out.stderr
