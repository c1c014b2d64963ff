"""`algebraic`: rewrites by mathematical properties that cut work or expose fusion.

- hoist parameters and scalar constants to the top of the function (they have no operands), so later
  rewrites may read any weight anywhere;
- columns regrouped: a linear whose output is viewed as [.., A, B, D] and read through slices of B gets its weight
  rows ordered by slice, so each slice is a column range (Falcon's q/k/v interleaved per group);
- horizontal fusion: linears that share their input (q/k/v, gate/up) become one linear over the
  concatenated weight, followed by slices of its output (one pass over the activations, one GEMM);
- FlashNorm (opt-in, `algebraic{fold_norm_weight=true}`): when a normalized value feeds only linears,
  (x*r*g) @ W^T = (x*r) @ (W*g)^T, so the norm weight folds into the weight and the norm left is a pure per-row
  scale. Off by default: W*g is a second copy of the weight in memory (the lm_head's is 1 GB for Llama-3-8B),
  while the GEMM template applies g to the A tile it loads (one multiply per loaded element);
- scalar chains, where the folded form gives the same result for every x (NaN, infinities and overflow included):
  (x*a)*b = x*(a*b) for powers of two a, b of magnitude >= 1 (each product exact until it overflows, and x*a
  overflows only if x*a*b does), x*1 = x, x+(-0.0) = x (not x+0.0: -0.0+0.0 is +0.0); (x+a)+b is left as it is
  ((x+1e8)-1e8 is 0 in float32, not x);
- layout: reshape(reshape(x)) = reshape(x), permute(permute(x)) = permute(x), no-op reshapes/permutes, a
  permute after an RMSNorm that keeps the last dim goes before it (the norm's consumer then reads it directly), a
  linear between reshapes that only regroup its rows is a linear of the unreshaped input, slice(slice(x)) along
  one dim is one slice, and a slice of heads split from the last dim is a slice of columns, viewed.
Weight-only subexpressions (dl.cat / dl.mul / dl.permute of parameters: `is_constant`) are evaluated once at load
time by the runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.rewriter import InsertPoint, Rewriter

from ..dialects import (
    AddOp,
    AddRMSNormOp,
    CatOp,
    ConstantOp,
    LinearOp,
    MulOp,
    ParamOp,
    PermuteOp,
    ReshapeOp,
    RMSNormOp,
    SliceOp,
)
from ..dialects.types import dtype_of
from .match import is_constant, operand_pairs, producer, scalar, set_name, shape
from .registry import register_pass


def hoist_constants(fn: func.FuncOp) -> None:
    block = fn.body.block
    first = block.first_op
    for op in list(block.ops):
        if isinstance(op, (ParamOp, ConstantOp)) and op is not first:
            op.detach()
            block.insert_op_before(op, first)


def horizontal_linears(fn: func.FuncOp) -> None:
    """Merge linears sharing one input and constant weights into one linear + slices."""
    groups: dict[tuple, list[LinearOp]] = {}
    for op in fn.body.block.ops:
        if isinstance(op, LinearOp) and is_constant(op.weight) and (op.bias is None or is_constant(op.bias)):
            key = (op.input, op.bias is None, op.weight.type.element_type)
            groups.setdefault(key, []).append(op)
    for ops in groups.values():
        if len(ops) < 2:
            continue
        first = ops[0]
        b = Rewriter()
        ip = InsertPoint.before(first)
        w = CatOp([o.weight for o in ops], 0)
        b.insert_op(w, ip)
        bias = None
        if first.bias is not None:
            bias = CatOp([o.bias for o in ops], 0)
            b.insert_op(bias, ip)
        fused = LinearOp(first.input, w.result, bias.result if bias else None)
        fused.result.name_hint = "_".join(filter(None, (o.result.name_hint for o in ops)))[:60] or None
        b.insert_op(fused, ip)
        start = 0
        last = len(shape(fused.result)) - 1
        for o in ops:
            n = shape(o.result)[-1]
            part = SliceOp(fused.result, last, start, start + n)
            set_name(part.result, o.result)
            b.insert_op(part, ip)
            o.result.replace_all_uses_with(part.result)
            start += n
        for o in ops:
            o.detach()
            o.erase()


def regroup_split_columns(fn: func.FuncOp) -> None:
    """A linear whose output columns are viewed as [.., A, B, D] and read only through slices of B (Falcon's new
    decoder: q, k and v interleaved per k/v group, `fused.view(.., groups, heads_per_group + 2, D)[:, :, :, :-2]`,
    `[..., [-2], :]`, `[..., [-1], :]`) computes each slice from a strided set of rows of its weight. Ordering the
    weight's rows by slice (each slice's rows of every A in turn: a weight-only cat of row slices, computed once;
    held beside the parameter, which the model's own forward still reads) makes each slice a contiguous column
    range of the linear, viewed: [.., A*(e-s)*D] as [.., A, e-s, D], what a q/k/v split of a GEMM looks like."""
    for r in [o for o in fn.body.block.ops if isinstance(o, ReshapeOp)]:
        lin = producer(r.input, LinearOp)
        if lin is None or not r.input.has_one_use() or not is_constant(lin.weight):
            continue
        if lin.bias is not None and not is_constant(lin.bias):
            continue
        xs, rs = tuple(shape(r.input)), tuple(shape(r.result))
        lead, split = len(xs) - 1, rs[len(xs) - 1 :]
        if rs[:lead] != xs[:-1] or len(split) < 3 or math.prod(split) != xs[-1]:
            continue
        slices = [u.operation for u in r.result.uses]
        if not slices or not all(isinstance(s, SliceOp) and s.bounds()[3] == 1 for s in slices):
            continue
        dims = {s.bounds()[0] for s in slices}
        if len(dims) != 1 or not lead < (dim := dims.pop()) < len(rs) - 1:
            continue  # slices of the first split dim are column ranges already (`_fold_slice`), of D not regrouped
        a, b, d = math.prod(rs[lead:dim]), rs[dim], math.prod(rs[dim + 1 :])
        ranges = sorted({s.bounds()[1:3] for s in slices})
        rows = [(g * b * d + s * d, g * b * d + e * d) for s, e in ranges for g in range(a)]
        rw = Rewriter()
        ip = InsertPoint.before(lin)

        def regrouped(w: SSAValue) -> SSAValue:
            parts = [SliceOp(w, 0, s, e) for s, e in rows]
            cat = CatOp([p.result for p in parts], 0)
            rw.insert_op([*parts, cat], ip)
            return cat.result

        new = LinearOp(lin.input, regrouped(lin.weight), None if lin.bias is None else regrouped(lin.bias))
        set_name(new.result, lin.result)
        rw.insert_op(new, ip)
        offsets, start = {}, 0
        for s, e in ranges:
            offsets[s, e] = start
            start += a * (e - s) * d
        for op in slices:
            s, e = op.bounds()[1:3]
            cols = SliceOp(new.result, lead, offsets[s, e], offsets[s, e] + a * (e - s) * d)
            view = ReshapeOp(cols.result, list(shape(op.result)))
            set_name(view.result, op.result)
            rw.insert_op([cols, view], InsertPoint.before(op))
            op.result.replace_all_uses_with(view.result)
            op.detach()
            op.erase()
        for old in (r, lin):
            old.detach()
            old.erase()


def fold_norm_weights(fn: func.FuncOp) -> None:
    """FlashNorm: move a norm's weight into the constant weights of the linears it feeds."""
    for op in list(fn.body.block.ops):
        if not isinstance(op, (RMSNormOp, AddRMSNormOp)) or op.weight is None:
            continue
        normed = op.result if isinstance(op, RMSNormOp) else op.normed
        users = [u.operation for u in normed.uses]
        if not users or not all(
            isinstance(u, LinearOp) and u.input == normed and is_constant(u.weight) for u in users
        ):
            continue
        x = op.input
        if op.weight.type.element_type != x.type.element_type:
            continue  # dropping the weight would change the linear's input dtype
        eps, offset, in_f32 = op.attrs
        b = Rewriter()
        g = op.weight
        if offset:
            one = ConstantOp(offset, g.type.element_type)
            g_eff = AddOp(g, one.result)
            b.insert_op([one, g_eff], InsertPoint.before(op))
            g = g_eff.result
        if isinstance(op, RMSNormOp):
            new = RMSNormOp(x, None, eps)
            new_normed = new.result
        else:
            new = AddRMSNormOp(x, op.residual, None, eps)
            new_normed = new.normed
            set_name(new.sum, op.sum)
            op.sum.replace_all_uses_with(new.sum)
        set_name(new_normed, normed)
        b.insert_op(new, InsertPoint.before(op))
        for u in users:
            scaled = MulOp(u.weight, g)
            b.insert_op(scaled, InsertPoint.before(u))
            u.operands = [u.operands[0], scaled.result, *u.operands[2:]]
        normed.replace_all_uses_with(new_normed)
        op.detach()
        op.erase()


def _exact_product(a: float, b: float, v: SSAValue) -> bool:
    """(x*a)*b equals x*(a*b) in v's dtype for every x: a and b powers of two of magnitude >= 1 whose product the
    dtype holds (then both products are exact until they overflow, and x*a overflows only where x*(a*b) does)."""
    big = torch.finfo(dtype_of(v)).max
    powers = all(math.isfinite(k) and abs(k) >= 1 and math.frexp(k)[0] in (0.5, -0.5) for k in (a, b))
    return powers and abs(a * b) <= big


class FoldScalarChains(RewritePattern):
    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter):
        if not isinstance(op, (MulOp, AddOp)):
            return
        for x, c in operand_pairs(op):
            k = scalar(c)
            if k is None:
                continue
            # x * 1 = x exactly; x + 0 is not (-0.0 + 0.0 = +0.0), x + (-0.0) is
            unit = k == 1.0 if isinstance(op, MulOp) else (k == 0.0 and math.copysign(1.0, k) < 0)
            if unit and x.type == op.result.type:
                rewriter.replace(op, [], [x])
                return
            inner = producer(x, MulOp) if isinstance(op, MulOp) else None
            if inner is None or not x.has_one_use():
                continue
            for y, c2 in operand_pairs(inner):
                k2 = scalar(c2)
                if k2 is None or len(shape(c2)) or y.type != op.result.type or not _exact_product(k, k2, op.result):
                    continue
                merged = ConstantOp(k * k2, c.type.element_type)
                new = type(op)(y, merged.result)
                set_name(new.result, op.result)
                rewriter.replace(op, [merged, new])
                return


def _rows_regrouped(op: ReshapeOp, rewriter: PatternRewriter) -> bool:
    """reshape(linear(reshape(x))) where the outer reshape only regroups the rows (x.view(-1, K) @ W, then
    .view(*x.shape[:-1], N), as GPT-2's Conv1D): a linear maps rows to rows, so that is linear(reshape(x)) with
    the two reshapes merged (none left when x already has the output's rows)."""
    lin = producer(op.input, LinearOp)
    flat = producer(lin.input, ReshapeOp) if lin is not None and op.input.has_one_use() else None
    if flat is None or shape(op.result)[-1:] != shape(op.input)[-1:]:
        return False
    rows = [*shape(op.result)[:-1], shape(flat.result)[-1]]
    new: list[Operation] = []
    x = flat.input
    if list(shape(x)) != rows:
        new.append(ReshapeOp(x, rows))
        x = new[-1].results[0]
    new.append(LinearOp(x, lin.weight, lin.bias))
    set_name(new[-1].results[0], op.result)
    rewriter.replace(op, new)
    rewriter.erase(lin)
    return True


def _fold_slice(op: SliceOp, rewriter: PatternRewriter) -> None:
    """A slice of a slice along one dim is one slice. A slice of the dim that a reshape split the last dim into
    (x [.., N] viewed as [.., A, D], then rows [s, e) of A: Falcon's q, k and v heads taken from one fused
    projection) is the view of a slice of x's columns [s*D, e*D): the GEMM epilogue takes slices of undivided
    columns, so the q/k rotary can follow into it."""
    dim, start, end, step = op.bounds()
    if step != 1:
        return
    if (inner := producer(op.input, SliceOp)) is not None:
        d2, s2, _e2, step2 = inner.bounds()
        if d2 == dim and step2 == 1:
            new = SliceOp(inner.input, dim, s2 + start, s2 + end)
            set_name(new.result, op.result)
            rewriter.replace(op, new)
        return
    r = producer(op.input, ReshapeOp)
    if r is None:
        return
    xs, rs = tuple(shape(r.input)), tuple(shape(r.result))
    if len(rs) != len(xs) + 1 or rs[:-2] != xs[:-1] or dim != len(rs) - 2 or rs[-2] * rs[-1] != xs[-1]:
        return
    part = SliceOp(r.input, len(xs) - 1, start * rs[-1], end * rs[-1])
    new = ReshapeOp(part.result, list(shape(op.result)))
    set_name(new.result, op.result)
    rewriter.replace(op, [part, new])


class FoldLayout(RewritePattern):
    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter):
        if isinstance(op, SliceOp):
            _fold_slice(op, rewriter)
            return
        if isinstance(op, ReshapeOp):
            if op.input.type == op.result.type:
                rewriter.replace(op, [], [op.input])
            elif (inner := producer(op.input, ReshapeOp)) is not None:
                new = ReshapeOp(inner.input, shape(op.result))
                set_name(new.result, op.result)
                rewriter.replace(op, new)
            else:
                _rows_regrouped(op, rewriter)
        elif isinstance(op, PermuteOp):
            p = op.permutation
            if p == tuple(range(len(p))):
                rewriter.replace(op, [], [op.input])
            elif (inner := producer(op.input, PermuteOp)) is not None:
                q = inner.permutation
                composed = [q[i] for i in p]
                new = PermuteOp(inner.input, composed)
                set_name(new.result, op.result)
                rewriter.replace(op, new)
            else:
                _permute_before_norm(op, rewriter)


def _permute_before_norm(op: PermuteOp, rewriter: PatternRewriter) -> None:
    """permute(rms_norm(x)) = rms_norm(permute(x)) where the permutation keeps the last dim (the norm's) in place:
    Qwen3's per-head q/k norms before `.transpose(1, 2)`. The norm then reads x through the view, and what follows
    it (the rotary) meets it without a view between them, so a row kernel can hold both (one pass over q, one over
    k at decode, instead of a norm pass and a rotary pass each). Only where x is read from memory anyway (a function
    argument or a linear's output, through views): a norm of a value a row kernel computes (norm(x * y)) would
    otherwise read it through a view and so end that kernel (two kernels where there was one)."""
    norm = producer(op.input, RMSNormOp)
    p = op.permutation
    if norm is None or p[-1] != len(p) - 1 or not op.input.has_one_use():
        return
    root = norm.input
    while isinstance(root.owner, (ReshapeOp, PermuteOp, SliceOp)):
        root = root.owner.operands[0]
    if not (isinstance(root, BlockArgument) or isinstance(root.owner, LinearOp)):
        return
    moved = PermuteOp(norm.input, list(p))
    new = RMSNormOp(moved.result, norm.weight, *norm.attrs)
    set_name(new.result, op.result)
    rewriter.replace(op, [moved, new])
    rewriter.erase(norm)


@register_pass
@dataclass(frozen=True)
class AlgebraicPass(ModulePass):
    """Math-property rewrites: horizontal linear fusion, FlashNorm weight folding, scalar and layout folding."""

    name = "algebraic"
    horizontal: bool = True
    fold_norm_weight: bool = False  # FlashNorm: off by default, the folded weight would be a second copy of W

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for fn in [o for o in op.ops if isinstance(o, func.FuncOp)]:
            hoist_constants(fn)
            regroup_split_columns(fn)
            if self.horizontal:
                horizontal_linears(fn)
            if self.fold_norm_weight:
                fold_norm_weights(fn)
        PatternRewriteWalker(GreedyRewritePatternApplier([FoldScalarChains(), FoldLayout()])).rewrite_module(op)
