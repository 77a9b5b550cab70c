"""A small GPT-style model in plain PyTorch (tied embedding and output
weights, a deterministic seed): what serve_weights.py publishes and each
worker.py attaches. Its labels name the model and a revision that changes
with the configuration, so a worker built from another configuration is
refused the weights instead of running on them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

NAME = "examples/tiny-gpt"  # the shared buffer's name
PROMPT = [1, 17, 42, 7, 99]  # token ids
NEW_TOKENS = 20


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    context: int = 128
    width: int = 256
    heads: int = 4
    layers: int = 4
    seed: int = 0

    def labels(self) -> dict[str, str]:
        """The buffer's labels, which a worker expects (the fingerprint guard)."""
        text = json.dumps(asdict(self), sort_keys=True).encode()
        return {"model": "tiny-gpt", "revision": hashlib.sha256(text).hexdigest()[:12]}


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads = c.heads
        self.attn_norm = nn.LayerNorm(c.width)
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)
        self.mlp_norm = nn.LayerNorm(c.width)
        self.up = nn.Linear(c.width, 4 * c.width)
        self.down = nn.Linear(4 * c.width, c.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class GPT(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.width)
        self.position = nn.Embedding(c.context, c.width)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.width)
        self.head = nn.Linear(c.width, c.vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor, two names

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.position(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, prompt: list[int], new_tokens: int) -> list[int]:
        """Greedy decoding: the most likely next token, `new_tokens` times."""
        idx = torch.tensor([prompt], device=self.embed.weight.device)
        for _ in range(new_tokens):
            logits = self(idx[:, -self.config.context:])[0, -1]
            idx = torch.cat([idx, logits.argmax().view(1, 1)], dim=1)
        return idx[0].tolist()


def build(c: Config, device: str) -> GPT:
    """The model on `device` ("meta": shapes and dtypes only, no memory)."""
    torch.manual_seed(c.seed)
    with torch.device(device):
        return GPT(c).eval()
