"""Reorganize, shuffle and one-to-many ops: reshape, permute, slice, cat, broadcast, index_copy.

They move or replicate elements without arithmetic; the codegen absorbs them into index maps
(strides) of the kernels that read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, IntegerType, TensorType, i64
from xdsl.ir import SSAValue
from xdsl.irdl import (
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from .traits import ONE_TO_MANY, REORGANIZE, SHUFFLE
from .types import DLFloatTensor, broadcast_shapes, dims_match, elem_of, normalize_dim, numel, shape_of


def _ints(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


def inverse_permutation(perm: Sequence[int]) -> list[int]:
    """The permutation that undoes `perm` (a dl.permute by it, then by this, is the identity)."""
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


@irdl_op_definition
class ReshapeOp(IRDLOperation):
    """`dl.reshape`: same elements in row-major order, new shape (view, reshape, flatten, (un)squeeze)."""

    name = "dl.reshape"
    input = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), REORGANIZE)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, x: SSAValue, shape: Sequence[int]):
        super().__init__(operands=[x], result_types=[TensorType(elem_of(x), list(shape))])

    def verify_(self):
        a, b = shape_of(self.input), shape_of(self.result)
        if elem_of(self.input) != elem_of(self.result):
            raise VerifyException("dl.reshape must not change the element type")
        if all(d >= 0 for d in a + b) and numel(a) != numel(b):
            raise VerifyException(f"dl.reshape: {a} has {numel(a)} elements, {b} has {numel(b)}")

    def reference(self, x):
        return x.reshape(shape_of(self.result))


@irdl_op_definition
class PermuteOp(IRDLOperation):
    """`dl.permute`: result dim i is input dim perm[i] (transpose, permute, .T)."""

    name = "dl.permute"
    input = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    perm = prop_def(DenseArrayBase)
    traits = traits_def(Pure(), SHUFFLE)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, x: SSAValue, perm: Sequence[int]):
        shape = shape_of(x)
        super().__init__(
            operands=[x],
            result_types=[TensorType(elem_of(x), [shape[p] for p in perm])],
            properties={"perm": _ints(perm)},
        )

    @property
    def permutation(self) -> tuple[int, ...]:
        return tuple(self.perm.get_values())

    def verify_(self):
        p, a = self.permutation, shape_of(self.input)
        if sorted(p) != list(range(len(a))):
            raise VerifyException(f"dl.permute: {list(p)} is not a permutation of {len(a)} dims")
        if tuple(a[i] for i in p) != shape_of(self.result):
            raise VerifyException(f"dl.permute: {a} permuted by {list(p)} is not {shape_of(self.result)}")

    def reference(self, x):
        return x.permute(self.permutation)


@irdl_op_definition
class SliceOp(IRDLOperation):
    """`dl.slice`: x[..., start:end:step, ...] along `dim` (getitem with slices, narrow, split, chunk)."""

    name = "dl.slice"
    input = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    dim = prop_def(IntegerAttr)
    start = prop_def(IntegerAttr)
    end = prop_def(IntegerAttr)
    step = prop_def(IntegerAttr, IntegerAttr(1, i64))
    traits = traits_def(Pure(), SHUFFLE)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, x: SSAValue, dim: int, start: int, end: int, step: int = 1):
        shape = list(shape_of(x))
        dim = normalize_dim(dim, len(shape))
        start, end, _ = slice(start, end, step).indices(shape[dim])
        shape[dim] = len(range(start, end, step))
        props = {k: IntegerAttr(v, i64) for k, v in dict(dim=dim, start=start, end=end, step=step).items()}
        super().__init__(operands=[x], result_types=[TensorType(elem_of(x), shape)], properties=props)

    def bounds(self) -> tuple[int, int, int, int]:
        return self.dim.value.data, self.start.value.data, self.end.value.data, self.step.value.data

    def verify_(self):
        dim, start, end, step = self.bounds()
        a = list(shape_of(self.input))
        if not 0 <= dim < len(a) or step < 1 or start < 0 or (a[dim] >= 0 and end > a[dim]):
            raise VerifyException(f"dl.slice: bad bounds dim={dim} [{start}:{end}:{step}] for shape {tuple(a)}")
        a[dim] = len(range(start, end, step))
        if not all(dims_match(x, y) for x, y in zip(a, shape_of(self.result))):
            raise VerifyException(f"dl.slice: result should be {tuple(a)}, got {shape_of(self.result)}")

    def reference(self, x):
        dim, start, end, step = self.bounds()
        return x[(slice(None),) * dim + (slice(start, end, step),)]


@irdl_op_definition
class CatOp(IRDLOperation):
    """`dl.cat`: concatenation along `dim` (torch.cat)."""

    name = "dl.cat"
    inputs = var_operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    dim = prop_def(IntegerAttr)
    traits = traits_def(Pure(), SHUFFLE)
    assembly_format = "$inputs attr-dict `:` `(` type($inputs) `)` `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, xs: Sequence[SSAValue], dim: int):
        shape = list(shape_of(xs[0]))
        dim = normalize_dim(dim, len(shape))
        shape[dim] = sum(shape_of(x)[dim] for x in xs)
        super().__init__(
            operands=[list(xs)], result_types=[TensorType(elem_of(xs[0]), shape)], properties={"dim": IntegerAttr(dim, i64)}
        )

    @property
    def axis(self) -> int:
        return self.dim.value.data

    def verify_(self):
        shapes = [shape_of(x) for x in self.inputs]
        d = self.axis
        if not shapes or any(len(s) != len(shapes[0]) for s in shapes) or not 0 <= d < len(shapes[0]):
            raise VerifyException(f"dl.cat: inputs {shapes} cannot be concatenated along dim {d}")
        for s in shapes:
            if any(not dims_match(a, b) for i, (a, b) in enumerate(zip(s, shapes[0])) if i != d):
                raise VerifyException(f"dl.cat: shapes {shapes} differ outside dim {d}")
        if len({elem_of(x) for x in self.inputs} | {elem_of(self.result)}) != 1:
            raise VerifyException("dl.cat: all inputs and the result must share one element type")
        out = list(shapes[0])
        out[d] = sum(s[d] for s in shapes)
        if tuple(out) != shape_of(self.result):
            raise VerifyException(f"dl.cat: result should be {tuple(out)}, got {shape_of(self.result)}")

    def reference(self, *xs):
        return torch.cat(xs, dim=self.axis)


@irdl_op_definition
class BroadcastOp(IRDLOperation):
    """`dl.broadcast`: replicate size-1 / missing leading dims to the result shape (expand)."""

    name = "dl.broadcast"
    input = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), ONE_TO_MANY)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, x: SSAValue, shape: Sequence[int]):
        super().__init__(operands=[x], result_types=[TensorType(elem_of(x), list(shape))])

    def verify_(self):
        a, b = shape_of(self.input), shape_of(self.result)
        if len(a) > len(b) or broadcast_shapes(a, b) != b or elem_of(self.input) != elem_of(self.result):
            raise VerifyException(f"dl.broadcast: {self.input.type} does not broadcast to {self.result.type}")

    def reference(self, x):
        return x.expand(shape_of(self.result))


@irdl_op_definition
class IndexCopyOp(IRDLOperation):
    """`dl.index_copy`: `dest` with the slices `index` along `dim` replaced by `source`'s (torch.index_copy: the
    value of `dest.index_copy_(dim, index, source)`, a KV-cache update). Value semantics like every dl op; the
    runtime writes `dest` in place where nothing reads the old value afterwards (see runtime.inplace). Of a GEMM's
    tile along a row dim (k and v of a QKV projection), it joins the GEMM's epilogue: the tile's rows are stored at
    the positions `index` holds."""

    name = "dl.index_copy"
    UNFUSED: ClassVar[str] = ("a cache update whose source no GEMM epilogue stores: it writes its destination in "
                              "place where nothing reads the old value after it")
    dest = operand_def(DLFloatTensor)
    index = operand_def(TensorType.constr(BaseAttr(IntegerType)))
    source = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    dim = prop_def(IntegerAttr)
    traits = traits_def(Pure(), SHUFFLE)
    assembly_format = (
        "$dest `[` $index `]` `=` $source attr-dict `:` type($dest) `,` type($index) `,` type($source) `->` type($result)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, dest: SSAValue, dim: int, index: SSAValue, source: SSAValue):
        d = normalize_dim(dim, len(shape_of(dest)))
        super().__init__(operands=[dest, index, source], result_types=[dest.type], properties={"dim": IntegerAttr(d, i64)})

    @property
    def axis(self) -> int:
        return self.dim.value.data

    def verify_(self):
        d, ds, ss, ix = self.axis, shape_of(self.dest), shape_of(self.source), shape_of(self.index)
        if not 0 <= d < len(ds) or len(ix) > 1 or len(ss) != len(ds):
            raise VerifyException(f"dl.index_copy: dim {d}, index {ix} and source {ss} do not fit dest {ds}")
        if any(not dims_match(a, b) for i, (a, b) in enumerate(zip(ss, ds)) if i != d) or (ix and ss[d] != ix[0]):
            raise VerifyException(f"dl.index_copy: source {ss} does not match dest {ds} along dim {d}")
        if elem_of(self.source) != elem_of(self.dest) or self.result.type != self.dest.type:
            raise VerifyException("dl.index_copy: dest, source and result must share one type")

    def reference(self, dest, index, source):
        return torch.index_copy(dest, self.axis, index, source)


LAYOUT_OPS = [ReshapeOp, PermuteOp, SliceOp, CatOp, BroadcastOp, IndexCopyOp]

# Ops whose result is a view of their operand in PyTorch: they move no data, and templates read through them
VIEW_OPS = (ReshapeOp, PermuteOp, SliceOp, BroadcastOp)
