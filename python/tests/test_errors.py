"""Every status of the C ABI reaches Python as its exception, a subclass of
the built-in one, with rmmd's message; a refused request changes nothing."""

from __future__ import annotations

import builtins

import pytest
from conftest import Daemon, gpu_count

import rmmd


def test_the_exceptions_subclass_the_built_in_ones() -> None:
    assert issubclass(rmmd.OutOfMemoryError, MemoryError)
    assert issubclass(rmmd.PermissionError, builtins.PermissionError)
    assert issubclass(rmmd.NotFoundError, FileNotFoundError)
    assert issubclass(rmmd.AlreadyExistsError, FileExistsError)
    assert issubclass(rmmd.InvalidArgumentError, ValueError)
    assert issubclass(rmmd.SessionError, ConnectionError)
    assert issubclass(rmmd.InternalError, RuntimeError)
    assert issubclass(rmmd.PreconditionError, RuntimeError)
    for cls in (rmmd.OutOfMemoryError, rmmd.PermissionError, rmmd.NotFoundError,
                rmmd.AlreadyExistsError, rmmd.InvalidArgumentError, rmmd.SessionError,
                rmmd.InternalError, rmmd.PreconditionError):
        assert issubclass(cls, rmmd.Error)
        assert cls.__module__ == "rmmd"


def check(e: pytest.ExceptionInfo[rmmd.Error], status: rmmd.Status) -> None:
    assert e.value.status == status
    assert str(e.value) == e.value.message
    assert e.value.message.startswith("rmmd: ")
    assert "std::bad_alloc" not in e.value.message


def test_invalid_argument(session: rmmd.Session, daemon: Daemon) -> None:
    host = session.host_pool
    with pytest.raises(ValueError) as e:
        rmmd.SharedBuffer.create(session, "../escape", 4096, pool=host)
    check(e, rmmd.Status.INVALID_ARGUMENT)
    with pytest.raises(rmmd.InvalidArgumentError) as e:
        session.host_resource().allocate(4096, alignment=3)
    check(e, rmmd.Status.INVALID_ARGUMENT)
    with pytest.raises(rmmd.InvalidArgumentError) as e:
        session.host_resource(pool="no-such-pool")
    check(e, rmmd.Status.INVALID_ARGUMENT)
    with pytest.raises(rmmd.InvalidArgumentError, match="'slab'"):
        session.device_resource(mode="fast")
    for lanes in (0, 17, 2.0, True, "many", None):
        with pytest.raises(rmmd.InvalidArgumentError, match="give 'auto'.* or 1 to 16"):
            session.device_resource(lanes=lanes)
    assert daemon.pool_in_use("host") == 0


def test_lanes_are_auto_unless_given() -> None:
    import inspect

    from rmmd import _lib
    from rmmd._resource import lanes_value

    for f in (rmmd.Session.device_resource, rmmd.DeviceResource.__init__):
        assert inspect.signature(f).parameters["lanes"].default == "auto"
    assert lanes_value("auto") == _lib.CARVING_LANES_AUTO == 0  # the C ABI's auto
    assert [lanes_value(n) for n in (1, 8, 16)] == [1, 8, 16]


def test_not_found(session: rmmd.Session) -> None:
    with pytest.raises(FileNotFoundError) as e:
        rmmd.SharedBuffer.open(session, "errors/missing")
    check(e, rmmd.Status.NOT_FOUND)
    assert "errors/missing" in str(e.value)
    with pytest.raises(rmmd.NotFoundError):
        rmmd.SharedBuffer.delete(session, "errors/missing")


def test_already_exists(session: rmmd.Session, daemon: Daemon) -> None:
    with rmmd.SharedBuffer.create(session, "errors/taken", 4096, pool=session.host_pool):
        before = daemon.pool_in_use("host")
        with pytest.raises(FileExistsError) as e:
            rmmd.SharedBuffer.create(session, "errors/taken", 4096, pool=session.host_pool)
        check(e, rmmd.Status.ALREADY_EXISTS)
        assert daemon.pool_in_use("host") == before


def test_failed_precondition(session: rmmd.Session, daemon: Daemon) -> None:
    other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="other")
    with rmmd.SharedBuffer.create(session, "errors/unpublished", 4096, pool=session.host_pool) as b:
        with pytest.raises(rmmd.PreconditionError) as e:
            rmmd.SharedBuffer.open(other, "errors/unpublished")
        check(e, rmmd.Status.FAILED_PRECONDITION)
        b.publish()
        with pytest.raises(rmmd.PreconditionError) as e:
            b.publish()  # twice
        check(e, rmmd.Status.FAILED_PRECONDITION)
        with rmmd.SharedBuffer.open(other, "errors/unpublished") as opened:
            with pytest.raises(rmmd.PreconditionError, match="only its creator"):
                opened.publish()
    other.close()


def test_out_of_memory(session: rmmd.Session, daemon: Daemon) -> None:
    r = session.host_resource()
    with pytest.raises(MemoryError) as e:
        r.allocate(128 << 20)  # the pool has 64 MiB
    check(e, rmmd.Status.OUT_OF_MEMORY)
    assert "capacity" in str(e.value)
    with pytest.raises(rmmd.OutOfMemoryError):
        rmmd.SharedBuffer.create(session, "errors/big", 128 << 20, pool=session.host_pool)
    assert r.stats().allocation_count == 0 and daemon.pool_in_use("host") == 0


def test_out_of_memory_by_quota(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    d = fresh_daemon("--backend", "host", "--host-pool-bytes", "64MiB", "--session-quota-bytes", "1MiB")
    with rmmd.Session(runtime_dir=str(d.runtime_dir)) as s:
        r = s.host_resource()
        a = r.allocation(768 << 10)
        with pytest.raises(rmmd.OutOfMemoryError, match="quota") as e:
            r.allocation(512 << 10)
        check(e, rmmd.Status.OUT_OF_MEMORY)
        a.free()
        r.allocation(512 << 10).free()  # room again


def test_a_cuda_error_is_internal_not_out_of_memory(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    # rmm::bad_alloc (a CUDA error, named) derives from std::bad_alloc: it
    # must not read as out of memory. Page-locking a pinnable pool fails in
    # a process without a usable GPU; with one it works, and there is
    # nothing to check.
    if gpu_count() > 0:
        pytest.skip("page-locking works here: no CUDA error to map")
    d = fresh_daemon("--backend", "host", "--host-pool-bytes", "16MiB", "--host-pool-pinned", "on")
    with rmmd.Session(runtime_dir=str(d.runtime_dir)) as s:
        with pytest.raises(rmmd.InternalError, match="page-locking") as e:
            s.host_resource(pinned=True)
        check(e, rmmd.Status.INTERNAL)
        assert not isinstance(e.value, MemoryError)
        assert "std::bad_alloc" not in str(e.value)


def test_permission_denied(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    import os

    other_uid = "4242" if os.getuid() != 4242 else "4243"
    d = fresh_daemon("--backend", "host", "--host-pool-bytes", "64MiB", "--allow-uid", other_uid)
    with pytest.raises(builtins.PermissionError) as e:
        rmmd.Session(runtime_dir=str(d.runtime_dir))
    check(e, rmmd.Status.PERMISSION_DENIED)
    assert f"uid {os.getuid()}" in str(e.value)


def test_session_error_without_a_daemon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConnectionError) as e:
        rmmd.Session(runtime_dir=str(tmp_path))
    check(e, rmmd.Status.SESSION)
    assert str(tmp_path) in str(e.value)


def test_every_status_has_its_exception() -> None:
    from rmmd._errors import error_for

    expected = {
        3: rmmd.InvalidArgumentError, 4: rmmd.DeadlineError, 5: rmmd.NotFoundError, 6: rmmd.AlreadyExistsError,
        7: rmmd.PermissionError, 8: rmmd.OutOfMemoryError, 9: rmmd.PreconditionError,
        13: rmmd.InternalError, 14: rmmd.SessionError,
    }
    lib = rmmd._lib.load()
    for status, cls in expected.items():
        e = error_for(status, "rmmd: why")
        assert type(e) is cls and e.status == status and str(e) == "rmmd: why"
        # The names are the C ABI's.
        assert lib.rmmd_status_name(status).decode() == f"RMMD_ERROR_{rmmd.Status(status).name}"
    unknown = error_for(42, "rmmd: why")
    assert type(unknown) is rmmd.InternalError and unknown.status is None
    assert "status 42" in str(unknown)
