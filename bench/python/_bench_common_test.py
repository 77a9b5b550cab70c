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
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # noqa: E402 (beside this file)

# Says READY=1 on $NOTIFY_SOCKET (unless told to exit first), then waits for SIGTERM.
FAKE_DAEMON = """\
import os, signal, socket, sys, time
print("fake rmmd", " ".join(sys.argv[1:]), flush=True)
if "--exit-early" in sys.argv:
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: (print("drained", flush=True), sys.exit(0)))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
while True:
    time.sleep(0.05)
"""


class DaemonTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.program = Path(self.tmp.name, "rmmd")
        self.program.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_DAEMON))
        self.program.chmod(0o755)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def test_ready_then_stopped_with_its_log(self) -> None:
        daemon = common.Daemon(self.program, ["--backend", "cuda"], "bench-common-test-")
        self.assertEqual(daemon.proc.args, [str(self.program), "--runtime-dir", daemon.runtime, "--backend", "cuda"])
        self.assertTrue(Path(daemon.runtime).name.startswith("bench-common-test-"))
        self.assertIsNone(daemon.proc.poll())
        log = daemon.stop()
        self.assertIn("fake rmmd --runtime-dir", log)
        self.assertIn("drained", log)  # SIGTERM, not SIGKILL
        self.assertEqual(daemon.proc.returncode, 0)
        self.assertFalse(daemon.dir.exists())
        self.assertEqual(daemon.stop(), "")

    def test_a_daemon_that_exits_is_an_error_with_its_log(self) -> None:
        with self.assertRaisesRegex(RuntimeError, r"did not report READY=1(.|\n)*fake rmmd"):
            common.Daemon(self.program, ["--exit-early"], "bench-common-test-")
        self.assertEqual([p for p in Path(tempfile.gettempdir()).glob("bench-common-test-*")], [])

    def test_a_missing_program_leaves_no_directory(self) -> None:
        with self.assertRaises(FileNotFoundError):
            common.Daemon(Path(self.tmp.name, "no-such-rmmd"), [], "bench-common-test-")
        self.assertEqual([p for p in Path(tempfile.gettempdir()).glob("bench-common-test-*")], [])

    def test_raised_open_file_limit_reaches_the_daemon(self) -> None:
        daemon = common.Daemon(self.program, [], "bench-common-test-", preexec_fn=common.raise_open_file_limit)
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
        os.environ["RMMD_RUNTIME_DIR"] = "/from/env"
        try:
            self.assertEqual(common.running_daemon_dir(self.parse("--runtime-dir", "/given")), "/given")
            self.assertEqual(common.running_daemon_dir(self.parse()), "/from/env")
            self.assertIsNone(common.running_daemon_dir(self.parse("--rmmd", "x")))
        finally:
            del os.environ["RMMD_RUNTIME_DIR"]
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
        self.assertEqual(common.target_line({"pass": False, "what": "cold"}, "0.50", ">= 0.9"), "MISS  cold: 0.50 (>= 0.9)")


if __name__ == "__main__":
    unittest.main()
