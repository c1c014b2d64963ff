"""Weights the compiler derives from parameters (q/k/v or gate/up concatenated into one GEMM weight, a norm's
weight folded into the next weights): computed once from the live parameters, and again whenever a source
parameter is modified in place (its version counter moves) or gets new storage (`p.data = t`). Writes through
`p.data` bypass the version counter and are not seen; nor are in-place writes to inference tensors (made under
torch.inference_mode), which keep no version counter.

A `DerivedWeight` is shared by every specialization of a compiled module that computes the same expression of
the same parameters (`WeightCache`): a model compiled for twenty sequence lengths holds its concatenated weights
once, not twenty times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class DerivedWeight:
    compute: Callable[[], torch.Tensor]
    sources: list[torch.Tensor]  # the parameters it is computed from
    _versions: tuple | None = None
    _value: torch.Tensor | None = None

    def value(self) -> tuple[torch.Tensor, bool]:
        """The current value, and whether this call (re)computed it."""
        versions = tuple((_version(t), t.data_ptr()) for t in self.sources)
        if self._value is not None and versions == self._versions:
            return self._value, False
        with torch.no_grad():
            self._value = self.compute()
        self._versions = versions
        return self._value, True

    def __repr__(self) -> str:
        return f"DerivedWeight(from {len(self.sources)} parameters)"


WeightCache = dict  # structural key of the expression -> DerivedWeight (one per compiled module)


@dataclass
class DerivedWeights:
    """The derived weights one program reads, and the slots of its value table they go to."""

    weights: list[tuple[int, DerivedWeight]] = field(default_factory=list)
    _seen: list[int] | None = None  # ids of the values last put into a table

    def fill(self, env: list) -> bool:
        """Put the current values into a value table; True when any differs from the last call's."""
        values = [w.value()[0] for _, w in self.weights]
        for (slot, _), v in zip(self.weights, values):
            env[slot] = v
        ids = [id(v) for v in values]
        changed, self._seen = ids != self._seen, ids
        return changed

    def changed(self) -> bool:
        """Whether a value differs from the last `fill`'s (a graph captured with the old one is stale)."""
        return [id(w.value()[0]) for _, w in self.weights] != self._seen


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version
