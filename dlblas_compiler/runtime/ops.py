"""Implementations of `dl` ops that the runtime does not own, registered by their providers.

`register_op_step(op_class, factory)`: `factory(op, ins, outs, options)` returns the step (a callable over the
program's value table) that runs `op` on the kernel backends. The operator library registers `dl.moe` this way
(topk_gating + fused_moe, or EPMoE over a process group); an op without a registered implementation runs its
torch reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OP_STEPS: dict[type, Callable[..., Callable[[list], None]]] = {}


def register_op_step(op_class: type, factory: Callable[..., Callable[[list], None]]) -> None:
    OP_STEPS[op_class] = factory


def op_step(op: Any, ins: list[int], outs: list[int], options: Any) -> Callable[[list], None] | None:
    factory = OP_STEPS.get(type(op))
    return None if factory is None else factory(op, ins, outs, options)
