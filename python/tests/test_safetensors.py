"""rmmd.safetensors: a .safetensors file published into a shared buffer (the
host pool here; test_weights_gpu.py does device buffers), its header as the
manifest. Files are written by hand from the format's documentation, and
by the safetensors package where it is installed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import Daemon

import rmmd
import rmmd.safetensors

DTYPE = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
         np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "I32"}


def write_safetensors(
    path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> dict[str, tuple[int, int]]:
    """Writes `tensors` in the safetensors format, in their order: 8 bytes of
    header length, the JSON header, the data (each tensor after the other).
    Returns each tensor's data offsets."""
    header: dict[str, object] = {}
    data = bytearray()
    offsets = {}
    for name, a in tensors.items():
        begin = len(data)
        data += np.ascontiguousarray(a).tobytes()
        offsets[name] = (begin, len(data))
        header[name] = {"dtype": DTYPE[a.dtype], "shape": list(a.shape), "data_offsets": [begin, len(data)]}
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # as the package pads it
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))
    return offsets


def sample() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(26)
    return {
        "wte": rng.standard_normal((32, 16)).astype(np.float32),
        "ln.bias": rng.standard_normal(16).astype(np.float16),
        "pos": np.arange(7, dtype=np.int64),
        "scale": np.array(3.5, dtype=np.float32),
        "flags": np.array([True, False, True]),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def file_labels(buf: rmmd.SharedBuffer) -> dict[str, str]:
    """The labels but the checkpoint's own (checkpoint.*)."""
    return {k: v for k, v in buf.labels.items() if not k.startswith("checkpoint.")}


def check_tensors(buf: rmmd.SharedBuffer, want: dict[str, np.ndarray]) -> None:
    got = buf.tensors("numpy")
    assert set(got) == set(want)
    for name, a in want.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert np.array_equal(got[name], a), name


def test_a_file_becomes_a_buffer_with_its_header_as_the_manifest(
    tmp_path: Path, daemon: Daemon, session: rmmd.Session
) -> None:
    path = tmp_path / "model.safetensors"
    meta = {"format": "pt", "revision": "abc", "bad key!": "dropped", "rmmd.gpu_uuid": "dropped"}
    offsets = write_safetensors(path, sample(), meta)
    buf = rmmd.safetensors.publish_file(
        path, "st/model", session=session, pool=session.host_pool, labels={"revision": "mine"}
    )
    with buf:
        check_tensors(buf, sample())
        # The file's layout is kept: each tensor at its offset in the data.
        kept = {n: b for n, (b, e) in offsets.items() if e > b}
        assert {t.name: t.offset for t in buf.manifest.tensors if t.nbytes} == kept
        assert file_labels(buf) == {"format": "pt", "revision": "mine"}
        # What the checkpoint says of itself: one shard, its data's bytes,
        # the sha256 of its header (the same file gives the same one).
        assert buf.labels["checkpoint.shards"] == "1"
        assert buf.labels["checkpoint.bytes"] == str(max(e for _, e in offsets.values()))
        assert buf.labels["checkpoint.sha256"] == rmmd.safetensors.read_checkpoint(path).labels["checkpoint.sha256"]
        other = rmmd.Session(runtime_dir=str(daemon.runtime_dir), client_name="reader")
        with other, rmmd.SharedBuffer.open(other, "st/model", expect={"format": "pt"}) as seen:
            assert not seen.writable
            check_tensors(seen, sample())
            data = path.read_bytes()
            start = 8 + struct.unpack("<Q", data[:8])[0]
            end = max(e for _, e in offsets.values())
            assert bytes(seen.memoryview()[:end]) == data[start : start + end]


def test_offsets_that_do_not_suit_their_dtype_are_laid_out_again(tmp_path: Path, session: rmmd.Session) -> None:
    path = tmp_path / "odd.safetensors"
    odd = dict(sorted(sample().items(), key=lambda kv: kv[0] != "flags"))  # 3 bytes of bool first
    offsets = write_safetensors(path, odd)
    assert offsets["wte"][0] == 3  # as written: not a multiple of 4
    with rmmd.safetensors.publish_file(path, "st/odd", session=session, pool=session.host_pool) as buf:
        assert all(t.offset % 256 == 0 for t in buf.manifest.tensors)
        check_tensors(buf, sample())


def framed(header: str, data_bytes: int) -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes


F32_2 = '"dtype":"F32","shape":[2]'


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 1 << 40) + b"{}", "header is said to be"),
        (framed("{{{{", 0), "not JSON"),
        (framed("[]", 0), "not a JSON object"),
        (framed('{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', 1), "dtype 'F4'"),
        (framed('{"w":{' + F32_2 + ',"data_offsets":[0,4]}}', 8), "span 4"),
        (framed('{"w":{' + F32_2 + ',"data_offsets":[0,8]}}', 4), "ends at byte 8"),
        (framed('{"w":{' + F32_2 + ',"data_offsets":[4,12]}}', 12), "hole: bytes \\[0, 4\\)"),
        (framed('{"w":{' + F32_2 + ',"data_offsets":[0,8]}}', 12), "data is 12 bytes, but its tensors end at byte 8"),
        (framed('{"w":{' + F32_2 + ',"data_offsets":[8,0]}}', 8), "data_offsets"),
        (framed('{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', 8), "shape"),
        (framed('{"w":{' + F32_2 + ',"data_offsets":[0,8]},"__metadata__":{"a":1}}', 8), "__metadata__"),
        (
            framed('{"a":{' + F32_2 + ',"data_offsets":[0,8]},"b":{' + F32_2 + ',"data_offsets":[4,12]}}', 12),
            "'a' and 'b' overlap",
        ),
        (framed("{}", 0), "no tensors"),
    ],
)
def test_a_malformed_file_is_refused_and_nothing_is_created(
    tmp_path: Path, session: rmmd.Session, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(rmmd.InvalidArgumentError, match=message):
        rmmd.safetensors.publish_file(path, "st/bad", session=session, pool=session.host_pool)
    assert session.buffers(prefix="st/bad") == []


def test_a_file_the_safetensors_package_wrote(tmp_path: Path, session: rmmd.Session) -> None:
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "pkg.safetensors"
    tensors = {k: v for k, v in sample().items()}
    st.save_file(tensors, str(path), metadata={"model": "tiny"})
    with rmmd.safetensors.publish_file(path, "st/pkg", session=session, pool=session.host_pool) as buf:
        check_tensors(buf, tensors)
        assert file_labels(buf) == {"model": "tiny"}
        assert len(buf.manifest) == len(tensors)
