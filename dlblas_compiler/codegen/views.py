"""Index maps: how reorganize/shuffle/broadcast ops become strides, offsets and index arithmetic.

A `Layout` says where element i of a logical tensor lives: offset + sum(i_k * strides_k). View chains
(reshape, permute, slice, broadcast) are applied with torch's own view rules on meta tensors, so what
is a view here is exactly what is a view in PyTorch; a reshape that would need a copy is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from xdsl.ir import Operation, SSAValue

from ..dialects import VIEW_OPS, BroadcastOp, PermuteOp, ReshapeOp, SliceOp


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(shape: Sequence[int]) -> Layout:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= max(s, 1)
        return Layout(tuple(shape), tuple(reversed(strides)), 0)

    @staticmethod
    def of(t: torch.Tensor) -> Layout:
        return Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())

    def meta(self) -> torch.Tensor:
        base = torch.empty(self.offset + _span(self), device="meta")
        return base.as_strided(self.shape, self.strides, self.offset)

    def apply(self, op: Operation) -> Layout | None:
        """The layout of `op`'s result when its input has this layout, or None if it needs a copy."""
        t = self.meta()
        try:
            if isinstance(op, ReshapeOp):
                v = t.view(tuple(op.result.type.get_shape()))
            elif isinstance(op, PermuteOp):
                v = t.permute(op.permutation)
            elif isinstance(op, SliceOp):
                dim, start, end, step = op.bounds()
                v = t[(slice(None),) * dim + (slice(start, end, step),)]
            elif isinstance(op, BroadcastOp):
                v = t.expand(tuple(op.result.type.get_shape()))
            else:
                return None
        except RuntimeError:
            return None
        return Layout(tuple(v.shape), tuple(v.stride()), v.storage_offset())

    def broadcast_to(self, shape: Sequence[int]) -> Layout:
        """Right-aligned broadcast: new leading dims and size-1 dims get stride 0."""
        pad = len(shape) - len(self.shape)
        strides = [0] * pad + [0 if s == 1 and t != 1 else st for s, st, t in zip(self.shape, self.strides, shape[pad:])]
        return Layout(tuple(shape), tuple(strides), self.offset)


def _span(layout: Layout) -> int:
    return 1 + sum((s - 1) * abs(st) for s, st in zip(layout.shape, layout.strides) if s > 0)


def view_chain(layout: Layout, ops: Sequence[Operation]) -> Layout | None:
    for op in ops:
        layout = layout.apply(op)
        if layout is None:
            return None
    return layout


def row_view_chain(layout: Layout, ops: Sequence[Operation]) -> tuple[Layout, tuple[tuple[int, int], ...]] | None:
    """For a template that indexes the last dim itself (the row template): the chain's layout, where a final
    reshape may merge trailing dims that no stride expresses (pairs taken apart: [.., 8, 2] permuted to [.., 2, 8]
    and merged). Returns (layout, factors): `factors` is () for a plain view, else the merged last dim's (size,
    stride) factors, outer to inner (column j reads sum_k ((j // inner_k) % size_k) * stride_k), and the layout's
    last stride is meaningless. None when the chain needs a copy otherwise."""
    plain = view_chain(layout, ops)
    if plain is not None:
        return plain, ()
    if not ops or not isinstance(ops[-1], ReshapeOp):
        return None
    before = view_chain(layout, ops[:-1])
    if before is None:
        return None
    new = tuple(ops[-1].result.type.get_shape())
    for k in range(2, len(before.shape) + 1):
        if new == (*before.shape[:-k], math.prod(before.shape[-k:])):
            factors = tuple((s, st) for s, st in zip(before.shape[-k:], before.strides[-k:]) if s != 1)
            return Layout(new, (*before.strides[:-k], 1), before.offset), factors
    return None


def column_offsets(cols: str, factors: tuple[tuple[int, int], ...], stride_args: Sequence[str]) -> str:
    """The expression of `row_view_chain`'s merged last dim: the offset of column `cols` (stride k an argument)."""
    terms, inner = [], 1
    for (size, _), arg in reversed(list(zip(factors, stride_args, strict=True))):
        idx = f"{cols}" if inner == 1 else f"({cols} // {inner})"
        terms.append(f"({idx} % {size}) * {arg}")
        inner *= size
    return "(" + " + ".join(reversed(terms)) + ")"


@dataclass(frozen=True)
class Unflatten:
    """Recover a value's multi-index from a flat position p in the space it was viewed from.

    For a view (offset, strides, shape) of a contiguous space whose non-broadcast dims nest (each
    stride is a multiple of the next smaller stride times that dim's size), position p holds element
    i with i_k = ((p - offset) // strides_k) % shape_k, and p belongs to the view exactly when
    p - offset == sum(i_k * strides_k) and p >= offset.
    """

    layout: Layout

    @staticmethod
    def build(layout: Layout) -> Unflatten | None:
        dims = sorted((st, s) for s, st in zip(layout.shape, layout.strides) if s > 1)
        for (st1, s1), (st2, _) in zip(dims, dims[1:]):
            if st1 <= 0 or st2 % st1 or st2 < st1 * s1:
                return None
        if dims and dims[0][0] <= 0:
            return None
        return Unflatten(layout)

    def index_exprs(self, p: str) -> list[str]:
        rel = f"({p} - {self.layout.offset})" if self.layout.offset else p
        out = []
        for s, st in zip(self.layout.shape, self.layout.strides):
            if s == 1:
                out.append("0")
            elif st == 1:
                out.append(f"({rel} % {s})")
            else:
                out.append(f"(({rel} // {st}) % {s})")
        return out

    def member_expr(self, p: str, idx: list[str]) -> str:
        rel = f"({p} - {self.layout.offset})" if self.layout.offset else p
        terms = [f"{i} * {st}" for i, st, s in zip(idx, self.layout.strides, self.layout.shape) if s > 1]
        recon = " + ".join(terms) if terms else "0"
        cond = f"({rel} == {recon})"
        return f"({cond} & ({p} >= {self.layout.offset}))" if self.layout.offset else cond


def view_source(v: SSAValue, inside: set, inputs: list[SSAValue]) -> tuple[SSAValue, list[Operation]] | None:
    """(region input, the view ops from it to `v`, in order) when `v` is a region input read through views
    inside the region; None when a non-view op computes it or the chain starts outside the inputs."""
    chain: list[Operation] = []
    while v.owner in inside:
        if not isinstance(v.owner, VIEW_OPS):
            return None
        chain.append(v.owner)
        v = v.owner.operands[0]
    return (v, chain[::-1]) if v in inputs else None

