"""Tensor-parallel rank plans: which tensors of a checkpoint each of N ranks
holds a slice of, and along which dimension.

A plan is an ordered list of rules, each a name pattern (``fnmatch``: ``*``
matches any run of characters, dots included) and the dimension a matching
tensor is split along; the first rule that matches decides, and a tensor no
rule matches is replicated (every rank holds all of it). Rank r of N holds
elements ``[r * n / N, (r + 1) * n / N)`` of the split dimension (n must be
a multiple of N), as Megatron-LM and vLLM lay out their parallel layers:

- column-parallel (``nn.Linear`` weights are ``[out, in]``): dim 0 of the
  weight and of its bias (q/k/v, gate and up projections; the vocabulary of
  the embedding and of the LM head);
- row-parallel: dim 1 of the weight, the bias replicated (o and down
  projections).

    plan = rmmd.tp.Plan.llama()                      # Llama, Mistral, Qwen2/3 names
    plan = rmmd.tp.Plan([("*.q_proj.weight", 0), ("*.o_proj.weight", 1)], name="mine")

A published rank records its plan in its labels (``tp.plan``: the plan's
JSON where it fits a label, ``tp.plan.sha256``, ``tp.size``, ``tp.rank``),
so a consumer that expects another plan is refused by the labels guard
(:func:`rmmd.safetensors.rank_expect`) instead of computing with the wrong
slices.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from ._errors import InvalidArgumentError

__all__ = ["Plan", "Slice", "PLANS"]


@dataclass(frozen=True)
class Slice:
    """What one rank holds of one tensor: elements [start, stop) of `dim`
    (``dim is None``: all of it, replicated)."""

    dim: int | None
    start: int
    stop: int
    shape: tuple[int, ...]
    """The rank's shape of the tensor."""


class Plan:
    """An ordered list of (pattern, dim) rules; see the module's text."""

    def __init__(self, rules: Iterable[tuple[str, int]], name: str = "custom") -> None:
        checked: list[tuple[str, int]] = []
        for rule in rules:
            try:
                pattern, dim = rule
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"rmmd: a rank plan's rule is (pattern, dim), not {rule!r}") from None
            if not isinstance(pattern, str) or not pattern:
                raise InvalidArgumentError(f"rmmd: a rank plan's pattern is a non-empty str, not {pattern!r}")
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
                raise InvalidArgumentError(f"rmmd: rank plan rule {pattern!r}: dim is an int >= 0, not {dim!r}")
            checked.append((pattern, dim))
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"rmmd: a rank plan's name is a non-empty str, not {name!r}")
        self.rules: tuple[tuple[str, int], ...] = tuple(checked)
        self.name = name

    # -- the plans that ship ------------------------------------------------

    @classmethod
    def llama(cls) -> "Plan":
        """Hugging Face names of Llama, Mistral, Qwen2/Qwen3 and alike
        (``model.layers.N.self_attn.q_proj.weight``, ...), split as vLLM
        splits them: q/k/v, gate and up by column, o and down by row, the
        embedding and the LM head by vocabulary; norms replicated."""
        column = ["*.q_proj.weight", "*.k_proj.weight", "*.v_proj.weight", "*.q_proj.bias", "*.k_proj.bias",
                  "*.v_proj.bias", "*.gate_proj.weight", "*.up_proj.weight", "*embed_tokens.weight",
                  "lm_head.weight"]
        row = ["*.o_proj.weight", "*.down_proj.weight"]
        return cls([(p, 0) for p in column] + [(p, 1) for p in row], name="llama")

    @classmethod
    def load(cls, spec: str) -> "Plan":
        """A plan by name (a key of :data:`PLANS`) or from a JSON file
        (``{"name": ..., "rules": [[pattern, dim], ...]}``, as :meth:`to_json`
        writes)."""
        if spec in PLANS:
            return PLANS[spec]()
        if not os.path.exists(spec):
            raise InvalidArgumentError(
                f"rmmd: rank plan {spec!r} is neither a plan's name ({', '.join(sorted(PLANS))}) nor a file"
            )
        with open(spec, encoding="utf-8") as f:
            return cls.from_json(f.read())

    # -- as text --------------------------------------------------------------

    def to_json(self) -> str:
        """The plan as canonical JSON (what its sha256 is taken of)."""
        return json.dumps({"name": self.name, "rules": [list(r) for r in self.rules]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            d = json.loads(text)
            return cls([tuple(r) for r in d["rules"]], name=d.get("name", "custom"))  # type: ignore[misc]
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(f"rmmd: not a rank plan's JSON ({e})") from None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"rmmd.tp.Plan({list(self.rules)!r}, name={self.name!r})"

    # -- what a rank holds ----------------------------------------------------

    def dim_of(self, name: str) -> int | None:
        """The dimension tensor `name` is split along; ``None``: replicated."""
        for pattern, dim in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return dim
        return None

    def slice_of(self, name: str, shape: Sequence[int], rank: int, size: int) -> Slice:
        """What rank `rank` of `size` holds of tensor `name` of `shape`.

        Raises:
            InvalidArgumentError: the plan splits it along a dimension it does
                not have, or one that `size` does not divide.
        """
        shape = tuple(int(n) for n in shape)
        dim = self.dim_of(name) if size > 1 else None
        if dim is None:
            return Slice(None, 0, shape[0] if shape else 1, shape)
        if dim >= len(shape):
            raise InvalidArgumentError(
                f"rmmd: rank plan '{self.name}' splits tensor '{name}' (shape {list(shape)}) along dim {dim}, "
                "which it does not have"
            )
        if shape[dim] % size != 0:
            raise InvalidArgumentError(
                f"rmmd: rank plan '{self.name}' splits tensor '{name}' (shape {list(shape)}) along dim {dim} "
                f"into {size} ranks, but {shape[dim]} is not a multiple of {size}"
            )
        n = shape[dim] // size
        local = shape[:dim] + (n,) + shape[dim + 1 :]
        return Slice(dim, rank * n, (rank + 1) * n, local)


PLANS = {"llama": Plan.llama}
