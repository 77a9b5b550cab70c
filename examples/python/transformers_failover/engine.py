"""A greedy decoder over a transformers causal LM whose static KV cache is
an rmmd KV buffer (rmmd.failover), or ordinary memory for a reference run.

One sequence state for the whole batch (every prompt has the same length):
``length`` tokens are known (the prompt and what was generated), the cache
holds ``length - 1`` of them, and a step feeds token ``length - 1`` at
position ``length - 1`` and writes token ``length``. After each step's data
the engine writes the tokens and lengths into the buffer and stamps it
(rmmd.failover.KVStore.stamp), all on one stream, so a standby that takes
over reads where the dead engine stopped and goes on from there.

The decode step is one CUDA graph. Capturing it runs it twice first
(warm-up: cuBLAS, the allocator), and a warm-up writes the cache; a standby
maps the KV buffer read-only until the grant, so its warm-up runs on one
scratch pair of keys and values shared by every layer (one layer's worth of
memory) and the capture, which writes nothing, on the buffer's tensors.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from rmmd import failover


def llama_config(layers: int = 4, hidden: int = 256, heads: int = 8, kv_heads: int = 2, vocab: int = 4096,
                 intermediate: int | None = None, max_positions: int = 4096, dtype: str = "float32",
                 attn: str = "eager") -> Any:
    import transformers

    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or hidden * 11 // 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=False, attn_implementation=attn,
        **{dtype_kw: dtype})


def build_model(config: Any, seed: int, device: Any, dtype: Any) -> Any:
    """Random weights from `seed` (the same in every process), on `device`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval().requires_grad_(False)
    return model.to(device)


def prompt_ids(config: Any, batch: int, length: int, seed: int, device: Any) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, config.vocab_size, (batch, length), generator=gen).to(device)


class Decoder:
    """`model` decoding greedily into a StaticCache whose keys and values
    are `kv`'s (an rmmd.failover.KVStore), or its own where `kv` is None;
    the tokens go to ``kv.tokens`` (or a tensor of its own)."""

    def __init__(self, model: Any, batch: int, max_length: int, kv: failover.KVStore | None = None) -> None:
        import torch
        import transformers

        self.torch, self.model, self.kv = torch, model, kv
        config, p = model.config, next(model.parameters())
        self.device, self.dtype, self.batch, self.max_length = p.device, p.dtype, batch, max_length
        self.cache = transformers.StaticCache(config=config, max_cache_len=max_length)
        layout = failover.KVLayout.for_config(config, batch, max_length)
        if kv is None:
            self.cache.early_initialization(batch_size=batch, num_heads=layout.num_kv_heads,
                                            head_dim=layout.head_dim, dtype=self.dtype, device=self.device)
            self.tokens = torch.zeros(batch, max_length, dtype=torch.long, device=self.device)
        else:
            failover.bind_static_cache(self.cache, kv)
            self.tokens = kv.tokens
        # The decode step's static inputs.
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.masked = torch.finfo(self.dtype).min
        self.mask = torch.full((batch, 1, 1, max_length), self.masked, dtype=self.dtype, device=self.device)
        # transformers that take cache_position get it (else they count the cache's filled slots,
        # which reads the GPU and so cannot be captured).
        self.takes_cache_position = "cache_position" in inspect.signature(model.forward).parameters
        self.graph: Any = None
        self.next_token: Any = None
        self.forwards = 0
        self.length = 0

    def _forward(self, ids: Any, pos: Any, mask: Any, cache_position: Any) -> Any:
        """One forward at the positions `cache_position`, whose first one the
        caller has set the cache's write counter to (seek())."""
        kw = {"cache_position": cache_position} if self.takes_cache_position else {}
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1, **kw)
        return out.logits[:, -1].argmax(-1)

    def seek(self, held: int) -> None:
        """The cache holds `held` tokens: the next forward writes from slot `held`."""
        failover.set_static_cache_length(self.cache, held)

    def _decode_step(self) -> Any:
        return self._forward(self.ids, self.pos, self.mask, self.cache_position)

    def capture(self) -> None:
        """The decode step as a CUDA graph on the cache's tensors, warmed up
        on a scratch pair (the buffer may be read-only: a standby's)."""
        torch = self.torch
        keys = [x.keys for x in self.cache.layers]
        values = [x.values for x in self.cache.layers]
        scratch_k, scratch_v = torch.zeros_like(keys[0]), torch.zeros_like(values[0])
        for layer in self.cache.layers:
            layer.keys, layer.values = scratch_k, scratch_v
        self.seek(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                self._decode_step()
        torch.cuda.current_stream().wait_stream(side)
        for layer, k, v in zip(self.cache.layers, keys, values):
            layer.keys, layer.values = k, v
        del scratch_k, scratch_v
        self.seek(0)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.next_token = self._decode_step()
        torch.cuda.synchronize()

    def _commit(self, length: int) -> None:
        """After a step's data: the lengths and the stamp, on the same stream."""
        self.length = length
        if self.kv is not None:
            self.kv.lengths[: self.batch].fill_(length)
            self.kv.stamp()

    def prefill(self, prompt: Any, chunk: int = 2048) -> None:
        """The prompt into the cache, `chunk` tokens per forward (the mask of
        a chunk is chunk x max_length); its next token becomes token
        ``len(prompt)``."""
        torch, p, n, b = self.torch, prompt.shape[1], self.max_length, self.batch
        columns = torch.arange(n, device=self.device)
        with torch.no_grad():
            for start in range(0, p, chunk):
                end = min(p, start + chunk)
                rows = torch.arange(start, end, device=self.device)
                self.seek(start)
                mask = torch.where(columns[None, :] <= rows[:, None], 0.0, self.masked).to(self.dtype)
                first = self._forward(prompt[:, start:end], rows.expand(b, end - start),
                                      mask.expand(b, 1, end - start, n), rows)
                self.forwards += 1
        self.tokens[:, :p] = prompt
        self.tokens[:, p] = first
        self._commit(p + 1)

    def resume(self, length: int) -> None:
        """Goes on from `length` known tokens (what the buffer holds): the
        step's inputs set from the tokens; nothing recomputed."""
        self.length = length
        self.mask.fill_(self.masked)
        self.mask[..., : length - 1] = 0

    def step(self) -> None:
        """One token: feeds token ``length - 1``, writes token ``length``."""
        k = self.length - 1
        self.ids.copy_(self.tokens[:, k : k + 1])
        self.pos.fill_(k)
        self.cache_position.fill_(k)
        self.mask[..., k] = 0
        self.seek(k)  # outside the graph: a graph's own advance of the counter is undone here
        if self.graph is not None:
            self.graph.replay()
            token = self.next_token
        else:
            with self.torch.no_grad():
                token = self._decode_step()
        self.forwards += 1
        self.tokens[:, self.length] = token
        self._commit(self.length + 1)

    def generate(self, prompt: Any, new_tokens: int) -> Any:
        """Uninterrupted: the tokens after the prompt (batch x new_tokens), on the CPU."""
        self.resume(1)
        self.prefill(prompt)
        self.resume(self.length)
        end = prompt.shape[1] + new_tokens
        while self.length < end:
            self.step()
        return self.tokens[:, prompt.shape[1] : end].cpu()


def now() -> float:
    """CLOCK_MONOTONIC, which every process of the host shares."""
    return time.monotonic()
