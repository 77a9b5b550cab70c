#!/usr/bin/env python3
"""Tests of _bench_common.py, no GPU and no rmmd needed: a stand-in daemon
(a Python script speaking the notify protocol) is started and stopped as the
benches start rmmd; the daemon options, the worker environment and the
target verdicts.

  python bench/python/_bench_common_test.py   (or pytest on this file)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # noqa: E402 (beside this file)

# Says READY=1 on $NOTIFY_SOCKET, then waits for SIGTERM; --exit-early: exits
# first; --silent: never says it; --deaf: ignores SIGTERM.
FAKE_DAEMON = """\
import os, signal, socket, sys
print("fake rmmd", " ".join(sys.argv[1:]), flush=True)
if "--exit-early" in sys.argv:
    sys.exit(3)
if "--deaf" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (print("drained", flush=True), sys.exit(0)))
if "--silent" not in sys.argv:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
while True:
    signal.pause()
"""
# This run's own: a directory an earlier, killed run left behind fails no check.
PREFIX = f"bench-common-test-{os.getpid()}-"


def left_behind() -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(PREFIX + "*"))


class DaemonTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.program = Path(self.tmp.name, "rmmd")
        self.program.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_DAEMON))
        self.program.chmod(0o755)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def test_ready_then_stopped_with_its_log(self) -> None:
        daemon = common.Daemon(self.program, ["--backend", "cuda"], PREFIX)
        self.assertEqual(daemon.proc.args, [str(self.program), "--runtime-dir", daemon.runtime, "--backend", "cuda"])
        self.assertTrue(Path(daemon.runtime).name.startswith(PREFIX))
        self.assertIsNone(daemon.proc.poll())
        log = daemon.stop()
        self.assertIn("fake rmmd --runtime-dir", log)
        self.assertIn("drained", log)  # SIGTERM, not SIGKILL
        self.assertEqual(daemon.proc.returncode, 0)
        self.assertFalse(daemon.dir.exists())
        self.assertEqual(daemon.stop(), "")

    def test_a_daemon_that_exits_is_an_error_with_its_log(self) -> None:
        with self.assertRaisesRegex(RuntimeError, r"did not report READY=1(.|\n)*fake rmmd"):
            common.Daemon(self.program, ["--exit-early"], PREFIX)
        self.assertEqual(left_behind(), [])

    def test_a_missing_program_leaves_no_directory(self) -> None:
        with self.assertRaises(FileNotFoundError):
            common.Daemon(Path(self.tmp.name, "no-such-rmmd"), [], PREFIX)
        self.assertEqual(left_behind(), [])

    def test_a_silent_daemon_is_killed(self) -> None:
        started: list[subprocess.Popen[bytes]] = []

        class Recorded(subprocess.Popen):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                started.append(self)

        with mock.patch.object(common, "READY_TIMEOUT_S", 0.5), mock.patch.object(subprocess, "Popen", Recorded), \
                self.assertRaisesRegex(RuntimeError, "did not report READY=1"):
            common.Daemon(self.program, ["--silent"], PREFIX)
        self.assertEqual(started[0].returncode, -9)  # SIGKILL, and reaped
        self.assertEqual(left_behind(), [])

    def test_a_daemon_deaf_to_sigterm_is_killed(self) -> None:
        daemon = common.Daemon(self.program, ["--deaf"], PREFIX)
        with mock.patch.object(common, "STOP_TIMEOUT_S", 0.5):
            self.assertIn("fake rmmd --runtime-dir", daemon.stop())
        self.assertEqual(daemon.proc.returncode, -9)
        self.assertEqual(left_behind(), [])

    def test_stop_ends_a_daemon_whose_directory_is_gone(self) -> None:
        daemon = common.Daemon(self.program, [], PREFIX)
        shutil.rmtree(daemon.dir)
        self.assertEqual(daemon.stop(), "")
        self.assertEqual(daemon.proc.returncode, 0)

    def test_raised_open_file_limit_reaches_the_daemon(self) -> None:
        daemon = common.Daemon(self.program, [], PREFIX, preexec_fn=common.raise_open_file_limit)
        try:
            import resource

            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            limits = Path(f"/proc/{daemon.proc.pid}/limits").read_text()
            row = next(x for x in limits.splitlines() if x.startswith("Max open files"))
            self.assertEqual(row.split()[3], str(hard) if hard != resource.RLIM_INFINITY else "unlimited")
        finally:
            daemon.stop()


class OptionsTest(unittest.TestCase):
    def parse(self, *argv: str) -> argparse.Namespace:
        p = argparse.ArgumentParser()
        common.add_daemon_options(p, "start this rmmd")
        a = p.parse_args(argv)
        common.check_daemon_options(p, a)
        return a

    def test_both_options_are_a_bad_command_line(self) -> None:
        with self.assertRaises(SystemExit) as e:
            self.parse("--start-daemon", "x", "--runtime-dir", "y")
        self.assertEqual(e.exception.code, 2)

    def test_the_daemon_dir(self) -> None:
        with mock.patch.dict(os.environ, RMMD_RUNTIME_DIR="/from/env"):
            self.assertEqual(common.running_daemon_dir(self.parse("--runtime-dir", "/given")), "/given")
            self.assertEqual(common.running_daemon_dir(self.parse()), "/from/env")
            self.assertIsNone(common.running_daemon_dir(self.parse("--rmmd", "x")))
        with mock.patch.dict(os.environ):
            os.environ.pop("RMMD_RUNTIME_DIR", None)
            self.assertIsNone(common.running_daemon_dir(self.parse()))


class EnvAndVerdictTest(unittest.TestCase):
    def test_worker_env_puts_this_checkout_first(self) -> None:
        env = common.worker_env(RMMD_RUNTIME_DIR="/run/x")
        self.assertEqual(env["PYTHONPATH"].split(os.pathsep)[0], str(common.PACKAGE_DIR))
        self.assertEqual((env["PYTHONUNBUFFERED"], env["RMMD_RUNTIME_DIR"]), ("1", "/run/x"))
        self.assertEqual(common.with_checkout_package({"PYTHONPATH": "/a"})["PYTHONPATH"],
                         os.pathsep.join([str(common.PACKAGE_DIR), "/a"]))

    def test_verdicts(self) -> None:
        self.assertEqual([common.verdict(x) for x in (True, False, None)], ["pass", "MISS", "n/a"])
        self.assertEqual(common.target_line({"pass": False, "what": "cold"}, "0.50", ">= 0.9"),
                         "MISS  cold: 0.50 (>= 0.9)")


if __name__ == "__main__":
    unittest.main()
