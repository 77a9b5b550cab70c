"""What the Python benches in this folder share, so each says it once:

- an rmmd of the bench's own (``Daemon``): a temp runtime directory, ready
  at READY=1 on a notify socket, stopped at the end with its log's tail;
- the options that pick the daemon (``--start-daemon PATH`` or
  ``--runtime-dir DIR``, else ``$RMMD_RUNTIME_DIR``);
- the environment of the worker processes (this checkout's package first);
- the JSON document's fixed parts (when it started, this checkout's commit)
  and how it is written and printed;
- the words of a target's verdict (pass / MISS / n/a).

What a bench measures, its sections and its table stay in the bench. No
GPU, framework or rmmd import here: --help and --dry-run run anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "python"  # this checkout's rmmd package
READY_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60


# ---- the worker processes' environment ----------------------------------------------


def with_checkout_package(env: dict[str, str]) -> dict[str, str]:
    """`env` with this checkout's python/ first on PYTHONPATH (changed in
    place and returned), so a worker imports the rmmd being measured."""
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment for a worker: unbuffered output (it speaks
    in lines the bench waits for), `extra` set, this checkout's package first."""
    return with_checkout_package(dict(os.environ, PYTHONUNBUFFERED="1", **extra))


def env_with_rmmd() -> dict[str, str]:
    """This process's environment, with this checkout's package on
    PYTHONPATH only where `import rmmd` fails here (an installed one is used
    as it is)."""
    env = dict(os.environ)
    try:
        import rmmd  # noqa: F401
    except ImportError:
        with_checkout_package(env)
    return env


# ---- the daemon ----------------------------------------------------------------------


def add_daemon_options(p: argparse.ArgumentParser, start_help: str) -> None:
    """--start-daemon PATH (or --rmmd PATH) and --runtime-dir DIR; check
    them with check_daemon_options once parsed."""
    p.add_argument("--start-daemon", "--rmmd", dest="start_daemon", metavar="PATH", help=start_help)
    p.add_argument("--runtime-dir", help="a running rmmd's runtime directory (default $RMMD_RUNTIME_DIR)")


def check_daemon_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """A bad command line (exit 2) where both options are given."""
    if a.start_daemon and a.runtime_dir:
        p.error("give --start-daemon or --runtime-dir, not both")


def running_daemon_dir(a: argparse.Namespace) -> str | None:
    """The runtime directory of a daemon the bench does not start:
    --runtime-dir, else $RMMD_RUNTIME_DIR; None with --start-daemon (the
    bench's own daemon wins over the environment) or where neither is set."""
    if a.start_daemon:
        return None
    return a.runtime_dir or os.environ.get("RMMD_RUNTIME_DIR")


def raise_open_file_limit() -> None:
    """The soft open-file limit up to the hard one (a preexec_fn): a daemon
    holds an fd per stable allocation and per backup (docs/sleep.md)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Daemon:
    """An rmmd started for one bench run: ``program --runtime-dir DIR *args``
    in a temp directory of its own (`prefix` names it), its output in
    DIR/rmmd.log. The constructor returns once the daemon sends READY=1 to
    the NOTIFY_SOCKET it is given (systemd's protocol, the way it says its
    sockets listen); where it exits or stays silent for READY_TIMEOUT_S, it
    is killed, the directory removed, and RuntimeError carries the log's
    tail. stop() ends it and removes the directory. Not thread-safe."""

    def __init__(self, program: str | Path, args: list[str], prefix: str,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.runtime = str(self.dir)
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            ready = self._start(program, args, preexec_fn)
        except BaseException:  # Popen's OSError, an interrupt: nothing left behind
            self._kill()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        if not ready:
            self._kill()
            tail = self.log_tail(3000)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"rmmd did not report READY=1; its log:\n{tail}")

    def _start(self, program: str | Path, args: list[str], preexec_fn: Callable[[], None] | None) -> bool:
        """Starts the daemon; whether READY=1 came within READY_TIMEOUT_S and
        while it ran."""
        notify_path = str(self.dir / "notify.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(notify_path)
            notify.settimeout(0.2)
            with open(self.dir / "rmmd.log", "wb") as log:  # the daemon keeps its own copy of the fd
                self.proc = subprocess.Popen([str(program), "--runtime-dir", self.runtime, *args],
                                             env=dict(os.environ, NOTIFY_SOCKET=notify_path),
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=preexec_fn)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if b"READY=1" in notify.recv(4096):
                        return True
                except socket.timeout:
                    pass
        return False

    def _kill(self) -> None:
        """SIGKILL, where it was started and still runs, and reaped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, chars: int) -> str:
        """The last `chars` characters of the daemon's log."""
        try:
            return (self.dir / "rmmd.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> str:
        """SIGTERM (its drain), SIGKILL past STOP_TIMEOUT_S; removes the
        runtime directory. Returns the log's last 2000 characters, for the
        JSON document. Calling it again returns ""."""
        if self.proc is None:
            return ""
        if self.proc.poll() is None:  # also where its directory was removed under it
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.dir.exists():
            return ""
        tail = self.log_tail(2000)
        shutil.rmtree(self.dir, ignore_errors=True)
        return tail


# ---- the JSON document ---------------------------------------------------------------


def parser_from_doc(doc: str | None) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help shows the bench's docstring as written:
    its first paragraph as the description, the rest as the epilog."""
    paragraphs = (doc or "").split("\n\n")
    return argparse.ArgumentParser(description=paragraphs[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n\n".join(paragraphs[1:]))


def utc_now() -> str:
    """The time now, ISO 8601 in UTC: a document's started_utc."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def rmmd_commit() -> str | None:
    """The commit this checkout is at (the rmmd measured); None where git is
    missing or this is no checkout."""
    try:
        git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return git.stdout.strip() or None


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    """The document, indented for people, to `path` (--json / --out FILE)."""
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def finish_document(doc: dict[str, Any], path: str | None, table: str) -> None:
    """Writes the document to `path` when given, then prints the table and
    the document on one line, the last line, which scripts read."""
    if path:
        write_json(path, doc)
    print(table)
    print(json.dumps(doc))


# ---- targets -------------------------------------------------------------------------


def verdict(passed: bool | None) -> str:
    """A target's word in a table: pass, MISS (a result, not a failure), or
    n/a where its figure was not measured."""
    if passed is None:
        return "n/a"
    return "pass" if passed else "MISS"


def target_line(t: dict[str, Any], value: str, limit: str) -> str:
    """``pass  what: value (limit)``: a target with a `what` and a `pass`."""
    return f"{verdict(t['pass'])}  {t['what']}: {value} ({limit})"
