"""Lowering: each `dl.fused` region becomes a typed `Lowered` record, through the template it names.

    KernelLowering     a generated Triton kernel (source, launch) and its search space
    CallLowering       a Python callable (a user pattern's lowering) run on the region's input tensors
    ReferenceLowering  no kernel: the region runs its ops' torch references, and the record says why
                       (`failure`: the template could not lower it, which warns; or empty tensors, which is silent)

`lower_module` lowers every region of a module (and with `dump_dir` writes each kernel's source there);
`TritonTarget` is `dl-opt -t triton`: every region's kernel printed as the readable file `dump_ir` writes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from . import codegen  # noqa: F401  (registers the built-in templates)
from .dialects import FusedOp
from .dialects.types import shape_of
from .fusion.templates import TEMPLATES, CallLowering, KernelLowering, Lowered, ReferenceLowering, WhyNot


def lower_region(fused: FusedOp) -> Lowered:
    """The implementation of one region; any failure is a ReferenceLowering naming the region and the cause."""
    name = fused.label
    if any(0 in shape_of(v) for v in [*fused.inputs, *fused.outputs]):
        return ReferenceLowering(name, "empty tensors: nothing to compute", failure=False)
    template = TEMPLATES.get(fused.template_name)
    if template is None:
        return ReferenceLowering(name, f"region {name}: no template named {fused.template_name!r} (have {sorted(TEMPLATES)})")
    try:
        plan = template.can_lower(fused.body_ops, list(fused.block.args))
        if isinstance(plan, WhyNot):
            return ReferenceLowering(name, f"region {name}: the {template.name} template cannot lower it: {plan}")
        return template.lower(fused, plan, name)
    except Exception as e:  # noqa: BLE001 - a template bug must not break the model
        return ReferenceLowering(name, f"region {name}: lowering failed ({type(e).__name__}: {_first_line(e)})")


def lower_module(module: ModuleOp, dump_dir: str | None = None) -> dict[FusedOp, Lowered]:
    """Every region of the module, lowered (kernel sources written to `dump_dir` when given)."""
    lowered = lower_regions([op for op in module.walk() if isinstance(op, FusedOp)])
    if dump_dir:
        dump_kernels(lowered, dump_dir)
    return lowered


def lower_regions(regions: list[FusedOp]) -> dict[FusedOp, Lowered]:
    """Each region lowered; regions that are the same up to their kernel's name (each layer's copy of one
    region) are lowered once and the others get that lowering under their own name."""
    done: dict[tuple, Lowered] = {}
    lowered: dict[FusedOp, Lowered] = {}
    for fused in regions:
        key = _structure(fused)
        first = done.get(key)
        if first is None:
            lowered[fused] = done[key] = lower_region(fused)
        elif isinstance(first, KernelLowering):
            k, name = first.kernel, fused.label
            source = re.sub(rf"\b{re.escape(k.name)}\b", name, k.source)
            lowered[fused] = KernelLowering(dataclasses.replace(k, name=name, source=source, region=fused), first.space)
        elif isinstance(first, ReferenceLowering):
            lowered[fused] = dataclasses.replace(first, name=fused.label, reason=first.reason.replace(first.name, fused.label))
        else:
            lowered[fused] = lower_region(fused)
    return lowered


def _structure(fused: FusedOp) -> tuple:
    """The region up to its kernel's name: template, types, and each op with its operands' positions."""
    values = {a: i for i, a in enumerate(fused.block.args)}
    parts: list = [fused.template_name, tuple(v.type for v in fused.inputs), tuple(r.type for r in fused.outputs),
                   tuple((k, v) for k, v in fused.properties.items() if k != "kernel"), tuple(fused.attributes.items())]
    for op in fused.block.ops:
        parts.append((op.name, tuple(values.get(v, -1) for v in op.operands), tuple(r.type for r in op.results),
                      tuple(op.properties.items()), tuple(op.attributes.items())))  # fmt: skip
        for r in op.results:
            values[r] = len(values)
    return tuple(parts)


def dump_kernels(lowered: dict[FusedOp, Lowered], dump_dir: str) -> None:
    """Each lowered kernel's source, as the readable file `<kernel>.py` in `dump_dir`."""
    os.makedirs(dump_dir, exist_ok=True)
    for low in lowered.values():
        if isinstance(low, KernelLowering):
            with open(os.path.join(dump_dir, f"{low.name}.py"), "w") as f:
                f.write(low.kernel.file_text())


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__


@dataclass(frozen=True)
class TritonTarget(Target):
    """`dl-opt -t triton`: for every `dl.fused` region (in program order) the generated kernel as the readable
    Python file that `dump_ir` writes; a region that no template can lower (or that lowers to a user callable)
    gets a comment saying so instead."""

    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        regions = [op for op in module.walk() if isinstance(op, FusedOp)]
        if not regions:
            print("# no dl.fused regions: run the `fuse` pass first (dl-opt -p fuse -t triton)", file=output)
        for i, fused in enumerate(regions):
            label = f"region {i}: {fused.pattern.data}" + (f" ({fused.kernel.data})" if fused.kernel else "")
            print(f"# ---- {label}", file=output)
            low = lower_region(fused)
            if isinstance(low, ReferenceLowering):
                print(f"# not lowered: {low.reason}\n", file=output)
            elif isinstance(low, CallLowering):
                fn = getattr(low.fn, "__qualname__", repr(low.fn))
                print(f"# not a generated kernel: the pattern lowers to the Python callable {fn}\n", file=output)
            else:
                print(low.kernel.file_text(), file=output)
