"""Lower each `dl.fused` region to a kernel through the template its pattern names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..dialects import ConstantOp, FusedOp, YieldOp
from ..passes.patterns import PATTERNS
from . import attention, gemm, row
from .kernel import Kernel

TEMPLATES: dict[str, tuple[Callable, Callable]] = {
    "row": (row.analyze, row.build),
    "gemm": (gemm.analyze, gemm.build),
    "attention": (attention.analyze, attention.build),
}


@dataclass
class CallableLowering:
    """A user pattern lowered to a Python callable: fn(*inputs, **attrs) -> output(s)."""

    name: str
    fn: Callable
    attrs: dict


class LoweringError(Exception):
    pass


def region_ops(fused: FusedOp) -> list:
    return [o for o in fused.block.ops if not isinstance(o, YieldOp)]


def lower_region(fused: FusedOp) -> Kernel | CallableLowering:
    """The kernel (or user callable) implementing a region; LoweringError says why not."""
    name = fused.kernel.data if fused.kernel else fused.pattern.data
    pattern = PATTERNS.get(fused.pattern.data)
    lowering = pattern.lowering if pattern else fused.pattern.data
    if callable(lowering):
        attrs = {}
        for o in region_ops(fused):
            if isinstance(o, ConstantOp):
                continue
            short = o.name.removeprefix("dl.")
            for k, v in o.properties.items():
                attrs[f"{short}_{k}"] = _py(v)
        return CallableLowering(name, lowering, attrs)
    if lowering not in TEMPLATES:
        raise LoweringError(f"region {name}: no template named {lowering!r} (have {sorted(TEMPLATES)})")
    analyze, build = TEMPLATES[lowering]
    plan = analyze(region_ops(fused), list(fused.block.args))
    if isinstance(plan, str):
        raise LoweringError(f"region {name}: the {lowering} template cannot lower it: {plan}")
    return build(fused, plan, name)


def _py(attr):
    for get in (lambda a: a.value.data, lambda a: a.data, lambda a: a.get_values()):
        try:
            return get(attr)
        except AttributeError:
            continue
    return attr
