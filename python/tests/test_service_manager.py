"""The tests' stand-in for systemd's service manager (service_manager.py)
against a small service of its own, so that what the rmmd tests rely on is
shown by itself: the fd store's rules, NotifyAccess=main, and the LISTEN_
variables with the fds at 3.. at the next start."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from service_manager import ServiceManager

# argv: OUT, then steps. It writes what it was passed (LISTEN_ variables and
# each fd's bytes) to OUT, takes the steps, sends READY=1 and waits.
SERVICE = r"""
import array, json, os, signal, socket, subprocess, sys
out, steps = sys.argv[1], sys.argv[2:]
count = int(os.environ.get("LISTEN_FDS", "0"))
names = os.environ["LISTEN_FDNAMES"].split(":") if count else []
seen = []
for i, name in enumerate(names):
    os.lseek(3 + i, 0, 0)
    seen.append([name, os.read(3 + i, 100).decode()])
with open(out, "w") as f:
    json.dump({"pid": os.getpid(), "listen_pid": os.environ.get("LISTEN_PID"),
               "listen_fds": os.environ.get("LISTEN_FDS"), "seen": seen}, f)
notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
addr = os.environ["NOTIFY_SOCKET"]
def send(text, fds=()):
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    notify.sendmsg([text.encode()], anc, 0, addr)
def memfd(text):
    fd = os.memfd_create("t")
    os.write(fd, text.encode())
    return fd
made = {}
for step in steps:
    what, _, arg = step.partition("=")
    if what == "store":
        name, _, text = arg.partition(",")
        made[name] = memfd(text)
        send(f"FDSTORE=1\nFDNAME={name}", [made[name]])
    elif what == "again":  # the same open file under another name
        old, _, name = arg.partition(",")
        send(f"FDSTORE=1\nFDNAME={name}", [made[old]])
    elif what == "passed":  # an fd it was passed, stored again under its name
        fd, _, name = arg.partition(",")
        send(f"FDSTORE=1\nFDNAME={name}", [int(fd)])
    elif what == "nostore":
        send("STATUS=an fd without FDSTORE", [memfd("x")])
    elif what == "remove":
        send(f"FDSTOREREMOVE=1\nFDNAME={arg}")
    elif what == "exit":  # gone at once, its messages maybe not yet read
        os._exit(0)
    elif what == "other-pid":  # a process that is not the main pid
        subprocess.run([sys.executable, "-c", "import array, os, socket; "
                        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
                        "fd = os.memfd_create('o'); "
                        "s.sendmsg([b'FDSTORE=1\\nFDNAME=intruder'], "
                        "[(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd]))], 0, "
                        "os.environ['NOTIFY_SOCKET'])"], check=True)
send("READY=1")
signal.pause()
"""


def start(m: ServiceManager, out: Path, *steps: str) -> dict:
    out.unlink(missing_ok=True)
    m.start([sys.executable, "-c", SERVICE, str(out), *steps], {"PATH": "/usr/bin:/bin"})
    assert m.wait_for("READY=1", 30) is not None, m.log()
    return json.loads(out.read_text())


def test_the_store_keeps_what_systemd_keeps_and_passes_it_to_the_next_start(tmp_path: Path) -> None:
    m = ServiceManager(tmp_path / "notify")
    out = tmp_path / "out.json"
    try:
        first = start(m, out, "store=a,alpha", "store=b,beta", "again=b,b-again", "store=bad:name,gamma",
                      "nostore", "remove=a", "other-pid")
        assert first["listen_fds"] is None and first["listen_pid"] is None and first["seen"] == []
        assert m.main_pid == first["pid"]
        assert m.stored_names() == ["b", "stored"]
        log = m.log()
        assert "passed FDNAME= name is invalid, ignoring" in log
        assert "got file descriptors via the notification socket without FDSTORE=1, closing" in log
        assert any(f"but reception only permitted for main PID {first['pid']}" in line for line in log), log
        # A crash: the store stays, and the next start gets it at 3, 4.
        m.kill(signal.SIGKILL)
        assert m.main_pid == -1 and m.stored_names() == ["b", "stored"]
        second = start(m, out, "store=c,gamma2", "remove=stored")
        assert second["listen_pid"] == str(second["pid"]) and second["listen_fds"] == "2"
        assert second["seen"] == [["b", "beta"], ["stored", "gamma"]]
        assert m.stored_names() == ["b", "c"]
        # Stored fds stay stored when passed: the same open file is not kept twice.
        m.kill(signal.SIGKILL)
        third = start(m, out, "passed=3,b")
        assert third["seen"] == [["b", "beta"], ["c", "gamma2"]]
        assert m.stored_names() == ["b", "c"]
        m.clear_store()
        m.kill(signal.SIGKILL)
        assert start(m, out)["seen"] == []
    finally:
        m.close()
    assert not (tmp_path / "notify").exists()


def test_what_a_service_sent_before_it_died_is_handled_as_its_own(tmp_path: Path) -> None:
    # systemd reads the notify socket before it handles SIGCHLD: a
    # FDSTOREREMOVE sent right before the service dies still removes the fd
    # (rmmd's delete of a buffer, then a SIGKILL at once).
    m = ServiceManager(tmp_path / "notify")
    out = tmp_path / "out.json"
    try:
        names = [f"f{i}" for i in range(100)]
        start(m, out, *(f"store={n},x" for n in names))
        assert m.stored_names() == names
        m.kill(signal.SIGKILL)
        for _ in range(10):
            service = m.start([sys.executable, "-c", SERVICE, str(out), *(f"remove={n}" for n in names[:10]),
                               "exit"], {"PATH": "/usr/bin:/bin"})
            service.wait(timeout=30)  # it exited by itself
            m.kill(signal.SIGKILL)  # reaps it, as systemd on SIGCHLD
            names = names[10:]
            assert m.stored_names() == names, m.log()
    finally:
        m.close()
