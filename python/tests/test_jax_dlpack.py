"""rmmd.jax's DLPack tensors (one per manifest entry: dtype, shape,
strides, address), read here by NumPy from a host buffer, since NumPy
takes DLPack as JAX does; JAX itself on a GPU is test_checkpoint_gpu.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_checkpoint import model_tensors
from test_safetensors import write_safetensors

import rmmd
import rmmd.jax
import rmmd.safetensors


def test_each_tensor_is_its_own_dlpack_tensor_of_the_buffer(tmp_path: Path, session: rmmd.Session) -> None:
    tensors = model_tensors()
    write_safetensors(tmp_path / "model.safetensors", tensors)
    with rmmd.safetensors.publish_file(tmp_path / "model.safetensors", "jax/host", session=session,
                                       pool=session.host_pool) as buf:
        for entry in buf.manifest.tensors:
            got = np.from_dlpack(rmmd.jax._Tensor(buf, entry))
            want = tensors[entry.name]
            assert got.dtype == want.dtype and got.shape == want.shape, entry.name
            assert np.array_equal(got, want), entry.name
            if entry.nbytes:
                assert got.ctypes.data == buf.ptr + entry.offset  # the buffer's bytes: no copy
        transposed = rmmd.TensorEntry("t", "float32", (6, 8), buf.manifest["model.layers.0.self_attn.q_proj.weight"].offset,
                                      strides=(1, 6))
        got = np.from_dlpack(rmmd.jax._Tensor(buf, transposed))
        assert np.array_equal(got, tensors["model.layers.0.self_attn.q_proj.weight"].T)
        del got
