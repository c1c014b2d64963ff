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
    """A user pattern lowered to a Python callable: fn(*inputs, **attrs), or fn(**named, **attrs)."""

    name: str
    fn: Callable
    attrs: dict
    arg_names: list[str] | None = None  # for DAG patterns: the placeholder each region input binds

    def __call__(self, *tensors):
        if self.arg_names is None:
            return self.fn(*tensors, **self.attrs)
        return self.fn(**dict(zip(self.arg_names, tensors)), **self.attrs)


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
                if k != "operandSegmentSizes":
                    attrs[f"{short}_{k}"] = _py(v)
        names = None
        if pattern is not None and pattern.dag is not None:
            root = fused.yielded.values[0].owner
            binding = pattern.dag.bind(root) or {}
            by_value = {v: k for k, v in binding.items()}
            names = [by_value.get(a, f"arg{i}") for i, a in enumerate(fused.block.args)]
        return CallableLowering(name, lowering, attrs, names)
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
