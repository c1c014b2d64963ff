"""Outputs with eager's aliasing and layout.

The IR has value semantics, so the passes may hand back an input as an output (`x.clone()`, `x * 1.0`), one
value for two outputs (`(x * 2, x * 2)` after CSE), a parameter (`self.w.clone()`) or a weight the runtime
keeps between calls (a concatenated weight). Eager returns fresh tensors there, and a caller that writes into
such an output must not change the model, its inputs or another output. `OutputGuard` finds, on the final
IR, which outputs may share storage with what (following views, torch calls and region references, whose
outputs may be views of their inputs), and after each call copies an output that does share storage where
eager's does not. An output eager returns contiguous is made contiguous (`.view` on it must work).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue

from ..codegen.views import VIEW_OPS
from ..dialects import ConstantOp, ConvertOp, FusedOp, IndexCopyOp, ParamOp, TorchCallOp
from ..passes.algebraic import is_constant

# Ops whose result may be (a view of) an operand at run time: views, casts to the same dtype, opaque calls, and
# cache writes (an index_copy the runtime runs in place: its result is the destination's tensor, fuzz 3d0096599421).
MAY_ALIAS = (*VIEW_OPS, ConvertOp, TorchCallOp, IndexCopyOp)

Root = tuple  # ("input", arg index) | ("param", name) | ("const",) | ("fresh", SSAValue)


def _roots(v: SSAValue, memo: dict[SSAValue, frozenset]) -> frozenset:
    """The storages `v` may share at run time."""
    if v in memo:
        return memo[v]
    op = v.owner
    if isinstance(v, BlockArgument):
        out = frozenset({("input", v.index)})
    elif isinstance(op, ParamOp):
        out = frozenset({("param", op.pname)})
    elif isinstance(op, ConstantOp):
        out = frozenset()
    elif is_constant(v):  # a weight-only value the runtime computes once and keeps
        out = frozenset({("const",)}).union(*(_roots(o, memo) for o in op.operands))
    elif isinstance(op, MAY_ALIAS):
        out = frozenset({("fresh", v)}).union(*(_roots(o, memo) for o in op.operands))
    elif isinstance(op, FusedOp):  # a region's reference may return a view of an input or of another result
        out = frozenset().union(*(_roots(i, memo) if i.owner is not op else {("fresh", i)} for i in _region_sources(op, v)))
    else:
        out = frozenset({("fresh", v)})
    memo[v] = out
    return out


def _region_sources(fused: FusedOp, result: SSAValue) -> list[SSAValue]:
    """What a result of `fused` may be a view of: region inputs (as the outer values), and the values computed
    inside the region it is read through views from (as themselves: two results that are views of one inner
    value share it)."""
    y = fused.yielded.values[list(fused.results).index(result)]
    found: list[SSAValue] = []
    stack = [y]
    while stack:
        x = stack.pop()
        if isinstance(x, BlockArgument) and x.block is fused.block:
            found.append(fused.inputs[x.index])
        elif isinstance(x.owner, Operation) and isinstance(x.owner, MAY_ALIAS):
            stack.extend(x.owner.operands)
        else:
            found.append(x)
    return found


@dataclass
class OutputGuard:
    """After a call: copy outputs sharing storage where eager's do not; make contiguous what eager had so."""

    checks: list[tuple[int, list[tuple]]] = field(default_factory=list)  # output -> what it must not share
    copies: list[int] = field(default_factory=list)  # outputs that are kept weights: always copied
    contiguous: list[int] = field(default_factory=list)
    dense: list[int] = field(default_factory=list)  # made in eager's forward, maybe a view here: no overlaps
    # outputs eager returns as (a view of) an earlier output or an input: (output, `Imported.eager_views` entry with
    # an input's key as its function argument), made so again after the rest
    views: list[tuple[int, tuple]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.checks or self.copies or self.contiguous or self.dense or self.views)

    def __call__(self, inputs: list, params: dict[str, torch.Tensor], outs: tuple) -> tuple:
        outs = list(outs)
        for i in self.copies:  # (contiguous at once where eager's output is: one copy, not two)
            outs[i] = outs[i].clone(memory_format=torch.contiguous_format if i in self.contiguous else
                                    torch.preserve_format)
        for i, against in self.checks:
            o = outs[i]
            for kind, key in against:
                other = inputs[key] if kind == "input" else params[key] if kind == "param" else outs[key]
                if _shares(o, other):
                    outs[i] = o.clone()
                    break
        for i in self.dense:  # e.g. a broadcast of an input (or of its contiguous copy): eager's is writable
            if not _dense(outs[i]):
                outs[i] = outs[i].contiguous()
        for i in self.contiguous:
            if not outs[i].is_contiguous():
                outs[i] = outs[i].contiguous()
        for i, (how, kind, key, *layout) in self.views:
            base = outs[key] if kind == "output" else inputs[key]
            if how == "same":
                if base.shape == outs[i].shape and base.dtype == outs[i].dtype:
                    outs[i] = base
            elif tuple(base.shape) == layout[3] and tuple(base.stride()) == layout[4] and base.dtype == outs[i].dtype:
                outs[i] = base.as_strided(layout[0], layout[1], base.storage_offset() + layout[2])
        return tuple(outs)


def _dense(t: torch.Tensor) -> bool:
    """Every element at its own address with no gaps (a permutation of a contiguous layout): writable as eager's."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _shares(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.numel() or not b.numel():
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def output_guard(module: ModuleOp, imported) -> OutputGuard:
    """The guard for a lowered module's outputs, given eager's aliasing (`imported.eager_aliases`)."""
    fn = next(o for o in module.walk() if isinstance(o, func.FuncOp))
    ret = fn.body.block.last_op
    n_out = sum(1 for kind, _ in imported.out_leaves if kind == "value")
    values = list(ret.operands)[:n_out]
    memo: dict[SSAValue, frozenset] = {}
    roots = [_roots(v, memo) for v in values]
    guard = OutputGuard()
    positions = imported.arg_positions  # block argument -> placeholder index
    for i, (v, r) in enumerate(zip(values, roots)):
        eager = imported.eager_aliases[i] if i < len(imported.eager_aliases) else None
        eager = eager or frozenset()
        if i < len(imported.contiguous) and imported.contiguous[i]:
            guard.contiguous.append(i)  # (after a kept weight's copy too: a clone keeps a view's strides)
        if ("const",) in r:
            guard.copies.append(i)
            continue
        against = []
        for root in sorted((x for x in r if x[0] in ("input", "param")), key=str):
            allowed = ("input", positions[root[1]]) if root[0] == "input" else root
            if allowed not in eager:
                against.append(root)
        against += [("output", j) for j in range(i) if roots[j] & r and ("output", j) not in eager]
        if against:
            guard.checks.append((i, against))
        if not any(kind in ("input", "param") for kind, _ in eager) and r - {("fresh", v)}:
            guard.dense.append(i)  # (eager's made in forward, if maybe returned twice: `t.copy_(b)` returns t)
        view = imported.eager_views[i] if i < len(imported.eager_views) else None
        if view is not None and i not in imported.returns_written:
            if view[1] == "input" and view[2] in positions:
                guard.views.append((i, (view[0], "input", positions.index(view[2]), *view[3:])))
            elif view[1] == "output":
                guard.views.append((i, view))
    return guard


__all__ = ["OutputGuard", "output_guard"]
