"""Manifests on shared buffers in the host pool: typed tensors and labels
set by the creator, returned with every open, listed and described; the
fingerprint guard; read-only opens; NumPy views of the tensors."""

from __future__ import annotations

import gc
import json
import sys

import numpy as np
import pytest
from conftest import Daemon, run_python

import rmmd
from rmmd import TensorEntry


def entries() -> list[TensorEntry]:
    return [
        TensorEntry("embed.weight", "float32", (16, 8), 0, aliases=("lm_head.weight",)),
        TensorEntry("norm.bias", "float16", (8,), 512),
        TensorEntry("proj.weight.T", "float32", (8, 4), 1024, strides=(1, 8)),
        TensorEntry("step", "int64", (), 1280),
        TensorEntry("mask", "bool", (3, 0), 1536),
    ]


def make(session: rmmd.Session, name: str, labels: dict[str, str] | None = None, **kw: object) -> rmmd.SharedBuffer:
    buf = rmmd.SharedBuffer.create(session, name, 4096, pool=session.host_pool, **kw)
    buf.set_manifest(entries(), labels if labels is not None else {"model": "tiny", "revision": "r1"})
    return buf


@pytest.fixture
def other(daemon: Daemon):  # a second session: another holder, as another process would be
    with rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="other") as s:
        yield s


def test_a_manifest_comes_back_from_every_open_and_describe(session: rmmd.Session, other: rmmd.Session) -> None:
    with make(session, "m/roundtrip") as buf:
        want = rmmd.Manifest(tuple(entries()), {"model": "tiny", "revision": "r1"})
        assert buf.manifest == want  # the creator's, before publishing
        buf.publish()
        with rmmd.SharedBuffer.open(other, "m/roundtrip") as seen:
            assert seen.manifest == want
            assert seen.labels == {"model": "tiny", "revision": "r1"}
            m = seen.manifest
            assert m["lm_head.weight"] is m["embed.weight"] and "lm_head.weight" in m
            assert list(m) == [e.name for e in entries()] and len(m) == 5
            assert m["proj.weight.T"].strides == (1, 8) and m["step"].shape == ()
        info, described = other.describe_buffer("m/roundtrip")
        assert described == want
        assert info.name == "m/roundtrip" and info.tensor_count == 5 and info.published
        assert info.labels == {"model": "tiny", "revision": "r1"} and not info.allow_writers
        assert info.nbytes == 4096 and info.pool == session.host_pool.name and info.id == buf.id


def test_a_buffer_without_a_manifest_has_an_empty_one(session: rmmd.Session, other: rmmd.Session) -> None:
    with rmmd.SharedBuffer.create(session, "m/bare", 4096, pool=session.host_pool) as buf:
        buf.publish()
        with rmmd.SharedBuffer.open(other, "m/bare") as seen:
            assert seen.manifest == rmmd.Manifest() and not seen.manifest
            assert seen.tensors() == {}


def test_a_later_manifest_replaces_the_earlier(session: rmmd.Session, other: rmmd.Session) -> None:
    with make(session, "m/replaced") as buf:
        buf.set_manifest([TensorEntry("only", "uint8", (10,), 0)], {"revision": "r2"})
        buf.publish()
        _, m = other.describe_buffer("m/replaced")
        assert [t.name for t in m.tensors] == ["only"] and m.labels == {"revision": "r2"}


def test_the_daemon_refuses_a_bad_table_naming_what_is_wrong(session: rmmd.Session) -> None:
    with rmmd.SharedBuffer.create(session, "m/bad", 4096, pool=session.host_pool) as buf:
        with pytest.raises(rmmd.InvalidArgumentError, match="'b'"):
            buf.set_manifest([TensorEntry("a", "float32", (64,), 0), TensorEntry("b", "float32", (4,), 128)])
        with pytest.raises(rmmd.InvalidArgumentError, match="'big'"):
            buf.set_manifest([TensorEntry("big", "float32", (2048,), 0)])  # 8 KiB in 4 KiB
        with pytest.raises(rmmd.InvalidArgumentError, match="'odd'"):
            buf.set_manifest([TensorEntry("odd", "float32", (4,), 2)])  # offset not a multiple of 4
        with pytest.raises(rmmd.InvalidArgumentError, match="rmmd.mine"):
            buf.set_manifest([], {"rmmd.mine": "x"})
        assert buf.manifest == rmmd.Manifest()  # nothing was set
        with pytest.raises(rmmd.InvalidArgumentError, match="unknown dtype"):
            TensorEntry("x", "float31", (1,), 0)


def test_only_the_creator_sets_a_manifest_and_only_before_publishing(
    session: rmmd.Session, other: rmmd.Session
) -> None:
    with make(session, "m/late") as buf:
        buf.publish()
        with pytest.raises(rmmd.PreconditionError):
            buf.set_manifest(entries())
        with rmmd.SharedBuffer.open(other, "m/late") as seen:
            with pytest.raises(rmmd.PreconditionError, match="only its creator"):
                seen.set_manifest(entries())


def test_buffers_are_listed_by_prefix_and_by_labels(session: rmmd.Session) -> None:
    made = [
        make(session, "list/a/0", {"model": "a", "rank": "0"}),
        make(session, "list/a/1", {"model": "a", "rank": "1"}),
        make(session, "list/b/0", {"model": "b", "rank": "0"}),
    ]
    for b in made:
        b.publish()
    try:
        names = lambda infos: sorted(i.name for i in infos)  # noqa: E731
        assert names(session.buffers(prefix="list/")) == ["list/a/0", "list/a/1", "list/b/0"]
        assert names(session.buffers(prefix="list/a/")) == ["list/a/0", "list/a/1"]
        assert names(session.buffers(labels={"rank": "0"})) == ["list/a/0", "list/b/0"]
        assert names(session.buffers(prefix="list/a/", labels={"rank": "0"})) == ["list/a/0"]
        assert names(session.buffers(labels={"model": "a", "rank": "1"})) == ["list/a/1"]
        assert session.buffers(labels={"model": "c"}) == []
        (info,) = session.buffers(prefix="list/b/")
        assert info.tensor_count == 5 and info.labels == {"model": "b", "rank": "0"} and info.holders == 1
    finally:
        for b in made:
            b.close()


def test_describing_a_missing_buffer_is_not_found(session: rmmd.Session) -> None:
    with pytest.raises(rmmd.NotFoundError):
        session.describe_buffer("m/none")


def test_the_fingerprint_guard_names_the_first_label_that_differs(
    session: rmmd.Session, other: rmmd.Session
) -> None:
    with make(session, "m/guard", {"model": "tiny", "revision": "r1", "rank": "0"}) as buf:
        buf.publish()
        with pytest.raises(rmmd.PreconditionError) as e:
            rmmd.SharedBuffer.open(other, "m/guard", expect={"revision": "r2", "rank": "1"})
        # key order: "rank" before "revision"
        assert "buffer 'm/guard': label 'rank' is '0', expected '1'" in str(e.value)
        with pytest.raises(rmmd.PreconditionError) as e:
            rmmd.SharedBuffer.open(other, "m/guard", expect={"quant": "fp8"})
        assert "buffer 'm/guard': has no label 'quant'" in str(e.value)
        (info,) = other.buffers(prefix="m/guard")
        assert info.holders == 1  # the refused opens hold nothing
        with rmmd.SharedBuffer.open(other, "m/guard", expect={"revision": "r1", "model": "tiny"}) as ok:
            assert ok.labels["revision"] == "r1"


def test_a_consumer_opens_read_only_unless_the_creator_allowed_writers(
    session: rmmd.Session, other: rmmd.Session
) -> None:
    with make(session, "m/ro") as ro, make(session, "m/rw", allow_writers=True) as rw:
        assert ro.writable and rw.writable  # the creator's hold
        ro.publish()
        rw.publish()
        with pytest.raises(rmmd.PermissionError, match="m/ro"):
            rmmd.SharedBuffer.open(other, "m/ro", writable=True)
        with rmmd.SharedBuffer.open(other, "m/ro") as seen:
            assert not seen.writable
            assert not np.asarray(seen).flags.writeable
            assert seen.memoryview().readonly
        with rmmd.SharedBuffer.open(other, "m/rw", writable=True) as seen:
            assert seen.writable
            seen.tensors("numpy")["norm.bias"][:] = 2.5
        assert (rw.tensors("numpy")["norm.bias"] == 2.5).all()
        info, _ = other.describe_buffer("m/rw")
        assert info.allow_writers


def test_numpy_tensors_are_read_only_views_of_the_buffer(session: rmmd.Session, other: rmmd.Session) -> None:
    with make(session, "m/views") as buf:
        mine = buf.tensors("numpy")
        embed = np.arange(128, dtype=np.float32).reshape(16, 8)
        mine["embed.weight"][:] = embed
        mine["norm.bias"][:] = np.linspace(0, 1, 8, dtype=np.float16)
        proj = np.arange(32, dtype=np.float32).reshape(4, 8).T  # stored transposed
        mine["proj.weight.T"][:] = proj
        mine["step"][()] = 7
        assert mine["lm_head.weight"] is mine["embed.weight"]
        buf.publish()
        seen = rmmd.SharedBuffer.open(other, "m/views")
        t = seen.tensors("numpy")
        if "torch" not in sys.modules:  # the default for a host buffer without torch
            assert type(seen.tensors()["step"]) is np.ndarray
        assert set(t) == {"embed.weight", "lm_head.weight", "norm.bias", "proj.weight.T", "step", "mask"}
        assert t["lm_head.weight"] is t["embed.weight"]
        assert np.array_equal(t["embed.weight"], embed) and t["embed.weight"].dtype == np.float32
        assert np.array_equal(t["norm.bias"], np.linspace(0, 1, 8, dtype=np.float16))
        assert np.array_equal(t["proj.weight.T"], proj) and t["proj.weight.T"].strides == (4, 32)
        assert t["step"].shape == () and int(t["step"]) == 7 and t["step"].dtype == np.int64
        assert t["mask"].shape == (3, 0) and t["mask"].dtype == np.bool_
        for name, entry in seen.manifest.items():
            if entry.nbytes:
                assert t[name].ctypes.data == seen.ptr + entry.offset  # no copy
            assert not t[name].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            t["norm.bias"][0] = 1
        # The views keep the buffer open after the hold is let go.
        seen.close()
        assert not seen.closed
        assert float(t["embed.weight"][15, 7]) == 127.0
        (info,) = other.buffers(prefix="m/views")
        assert info.holders == 2
        del t
        gc.collect()
        assert seen.closed
        assert other.buffers(prefix="m/views")[0].holders == 1


def test_tensors_picks_some_by_name_or_alias(session: rmmd.Session) -> None:
    with make(session, "m/some") as buf:
        t = buf.tensors("numpy", names=["lm_head.weight", "step"])
        assert set(t) == {"embed.weight", "lm_head.weight", "step"}
        with pytest.raises(rmmd.NotFoundError, match="'nope'"):
            buf.tensors("numpy", names=["nope"])


def test_numpy_has_no_bfloat16_without_ml_dtypes(session: rmmd.Session) -> None:
    pytest.importorskip("numpy")
    try:
        import ml_dtypes  # noqa: F401

        pytest.skip("ml_dtypes is installed: NumPy gets bfloat16 from it")
    except ImportError:
        pass
    with rmmd.SharedBuffer.create(session, "m/bf16", 4096, pool=session.host_pool) as buf:
        buf.set_manifest([TensorEntry("w", "bfloat16", (4,), 0)])
        with pytest.raises(rmmd.InvalidArgumentError, match="ml_dtypes"):
            buf.tensors("numpy")


def test_numpy_gets_bfloat16_and_float8_from_ml_dtypes(session: rmmd.Session) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with rmmd.SharedBuffer.create(session, "m/ml", 4096, pool=session.host_pool) as buf:
        buf.set_manifest([TensorEntry("w", "bfloat16", (4,), 0), TensorEntry("f8", "float8_e4m3fn", (3,), 256)])
        t = buf.tensors("numpy")
        t["w"][:] = np.array([1, 2, 3, 4], dtype=ml_dtypes.bfloat16)
        assert t["w"].dtype == ml_dtypes.bfloat16 and t["f8"].dtype == ml_dtypes.float8_e4m3fn
        assert np.frombuffer(buf.memoryview()[:8], dtype=np.uint16)[0] == 0x3F80  # 1.0 in bfloat16


def test_device_frameworks_refuse_a_host_buffer(session: rmmd.Session) -> None:
    with make(session, "m/host") as buf:
        with pytest.raises(rmmd.InvalidArgumentError, match="host memory"):
            buf.tensors("cupy")
        with pytest.raises(rmmd.InvalidArgumentError, match="framework"):
            buf.tensors("jax")


def test_a_consumer_process_sees_the_manifest(daemon: Daemon, session: rmmd.Session) -> None:
    with make(session, "m/proc") as buf:
        buf.tensors("numpy")["embed.weight"][:] = 1.5
        buf.publish()
        code = (
            "import json, rmmd; s = rmmd.Session();"
            "b = rmmd.SharedBuffer.open(s, 'm/proc', expect={'model': 'tiny'});"
            "t = b.tensors('numpy');"
            "print(json.dumps({'labels': b.labels, 'sum': float(t['lm_head.weight'].sum()),"
            " 'writable': b.writable, 'names': sorted(t)}))"
        )
        got = json.loads(run_python(["-c", code], daemon.env()).stdout)
        assert got == {
            "labels": {"model": "tiny", "revision": "r1"},
            "sum": 1.5 * 128,
            "writable": False,
            "names": ["embed.weight", "lm_head.weight", "mask", "norm.bias", "proj.weight.T", "step"],
        }
