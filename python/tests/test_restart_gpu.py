"""Training and a consumer of shared weights ride through rmmd's crash, on
the GPU host: a PyTorch training loop on rmmd's MemPool and a CuPy consumer
of a persistent weights buffer (published by a third process that then
exits) keep running while rmmd is SIGKILLed and started again three times
under this process as its service manager with an fd store
(Daemon(keep_buffers=True)). At the end the losses are bit for bit those of
the same loop run without a restart, the consumer saw the same bytes every
time, the buffer is still served by name, and with everything closed the
daemon lends nothing. The clients are processes of their own
(scripts/restart_client.py). Skipped, saying why, without a GPU, PyTorch or
CuPy; test_restart_host.py checks the buffer's side on host memory here."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any, Iterator

import pytest
from conftest import SCRIPTS, Daemon, need_gpu, need_module, read_line, run_python, start_python, wait_until

pytestmark = pytest.mark.gpu

CLIENT = str(SCRIPTS / "restart_client.py")
NAME = "weights/restart-mlp"
LABELS = {"model": "restart-mlp", "revision": "r27"}  # restart_client.LABELS
STEPS = 400
GAP = 50  # steps the trainer goes on after a kill before it waits for the restart
CHECKPOINTS = (80, 190, 300)  # the steps at which rmmd is killed


def cuda_in_use(d: Daemon) -> int:
    return sum(int(p.get("in_use_bytes", 0)) for p in d.stats()["pools"] if p["pool"]["backend"] == "BACKEND_CUDA")


def tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def tick(consumer: subprocess.Popen[str]) -> dict[str, Any]:
    tell(consumer, "tick")
    return json.loads(read_line(consumer))


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Client processes, killed at the end if the test left them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)


def test_training_and_a_cupy_consumer_ride_through_three_sigkills(fresh_daemon, children) -> None:  # type: ignore[no-untyped-def]
    need_gpu()
    need_module("torch")
    need_module("cupy")
    d: Daemon = fresh_daemon("--backend", "cuda", "--cuda-pool-bytes", "4GiB", "--host-pool-bytes", "64MiB",
                             keep_buffers=True)
    env = d.env(CUBLAS_WORKSPACE_CONFIG=":4096:8")
    # The trainer imports PyTorch and runs its reference while the weights
    # are published.
    trainer = start_python([CLIENT, "train", str(STEPS), str(GAP), *map(str, CHECKPOINTS)], env)
    children.append(trainer)
    published = json.loads(run_python([CLIENT, "publish", NAME], env).stdout.splitlines()[-1])
    d.wait_until_kept([NAME])
    consumer = start_python([CLIENT, "consume", NAME], env)
    children.append(consumer)
    opened = json.loads(read_line(consumer))
    assert opened["digest"] == published["digest"], (opened, published)
    assert json.loads(read_line(trainer))["ready"]
    tell(trainer, "go")  # both run now

    for r, step in enumerate(CHECKPOINTS, 1):
        assert json.loads(read_line(trainer)) == {"step": step}
        before = tick(consumer)
        d.restart(signal.SIGKILL)  # while the trainer runs its next steps
        tell(trainer, "restarted")
        said = json.loads(read_line(trainer))
        # A tensor larger than PyTorch's cache holds: from the new daemon.
        assert said == {"round": r, "fresh_ok": True, "fresh_bytes": r * (96 << 20)}, said
        # The consumer goes on: reconnected, computing, the same bytes.
        now = wait_until(
            lambda: (t := tick(consumer))["reconnects"] == r and t["iterations"] > before["iterations"] and t,
            timeout=60,
            what=f"the consumer to reconnect ({r}) and compute again",
        )
        assert now["differing"] == 0 and now["told"] == r, now
        figures = d.restart_stats()
        assert figures["restarts"] == r and figures["readopted_buffers"] == 1, figures
        assert figures["dropped_at_start"] == 0 and figures["keeping_buffers"], figures
        assert d.wait_for_stored([NAME]), d.stored_buffers()

    trained = json.loads(read_line(trainer))
    assert len(trained["losses"]) == STEPS
    first_difference = next((i for i, (a, b) in enumerate(zip(trained["losses"], trained["reference"])) if a != b),
                            None)
    assert first_difference is None, f"step {first_difference}: losses differ from the uninterrupted run's"
    tell(trainer, "exit")
    done = json.loads(read_line(trainer))
    # PyTorch keeps what cuBLAS took from the pool for its workspace (about
    # 32 MiB) until the process ends, MemPool or not: the daemon's ledger,
    # checked once every client is gone, is the judge of what is given back.
    assert done["done"], done
    _, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 0, err
    assert err.count("reconnected to the daemon at") == 3, err

    tell(consumer, "stop")
    last = json.loads(read_line(consumer))
    assert last["differing"] == 0 and last["same_at_end"], last
    assert last["reconnects"] == 3 and last["told"] == 3, last
    assert last["iterations"] > now["iterations"], last
    _, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert err.count("reconnected to the daemon at") == 3, err
    assert err.count("1 open shared buffer(s) held again") == 3, err

    # Still served by name, to a process that started after the restarts.
    checked = json.loads(run_python([CLIENT, "check", NAME], d.env()).stdout.splitlines()[-1])
    # The bytes, exactly; a product computed in another process may round
    # differently (cuBLAS picks its algorithm per process), so only `w`.
    assert checked["digest"]["w"] == published["digest"]["w"], (checked, published)
    assert checked["labels"] == LABELS, checked
    figures = d.restart_stats()
    assert figures["restarts"] == 3 and figures["readopted_buffers"] == 1, figures
    assert d.manager is not None and d.manager.log() == [], d.manager.log()

    # Everything closed and the buffer deleted: the daemon lends nothing.
    d.rmmctl("buffers", "delete", NAME)
    assert d.wait_for_stored([]), d.stored_buffers()
    wait_until(lambda: cuda_in_use(d) == 0, timeout=30, what="the CUDA pools to be empty")
