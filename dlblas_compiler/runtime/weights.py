"""Weights the compiler derives from parameters (q/k/v or gate/up concatenated into one GEMM weight, a norm's
weight folded into the next weights): computed once from the live parameters, and again whenever a source
parameter is modified in place (its version counter moves) or gets new storage (`p.data = t`). Writes through
`p.data` bypass the version counter and are not seen; nor are in-place writes to inference tensors (made under
torch.inference_mode), which keep no version counter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class DerivedWeight:
    slot: int  # where the program's value table holds it
    compute: Callable[[], torch.Tensor]
    sources: list[torch.Tensor]  # the parameters it is computed from

    def __repr__(self) -> str:
        return f"DerivedWeight(slot {self.slot} from {len(self.sources)} parameters)"


@dataclass
class DerivedWeights:
    weights: list[DerivedWeight] = field(default_factory=list)
    _versions: list[tuple] | None = None
    _values: list[torch.Tensor] | None = None

    def values(self) -> tuple[list[torch.Tensor], bool]:
        """The current values, and whether they were (re)computed by this call."""
        versions = [tuple((_version(t), t.data_ptr()) for t in w.sources) for w in self.weights]
        if self._values is not None and versions == self._versions:
            return self._values, False
        with torch.no_grad():
            self._values = [w.compute() for w in self.weights]
        self._versions = versions
        return self._values, True

    def fill(self, env: list) -> bool:
        """Put the current values into a value table; True when they were recomputed."""
        values, changed = self.values()
        for w, v in zip(self.weights, values):
            env[w.slot] = v
        return changed


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version
