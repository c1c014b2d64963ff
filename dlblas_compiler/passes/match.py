"""Small helpers for matching `dl` subgraphs: producers, uses, scalar constants, weight-only values, commutative
operands; and `install`, which puts a raised op in the place of the value it computes (or leaves the code alone)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint

from ..dialects import ELEMENTWISE_OPS, BinaryOp, CatOp, ConstantOp, ConvertOp, ParamOp, PermuteOp, ReshapeOp, SliceOp

OpT = TypeVar("OpT", bound=Operation)


def producer(v: SSAValue | None, cls: type[OpT] | tuple[type[OpT], ...] = Operation) -> OpT | None:
    """The op that defines `v`, if it is an instance of `cls`."""
    if v is None:
        return None
    op = v.owner
    return op if isinstance(op, Operation) and isinstance(op, cls) else None


def scalar(v: SSAValue | None) -> float | None:
    """The value of a scalar `dl.constant`, else None."""
    op = producer(v, ConstantOp)
    return op.scalar if op is not None else None


def is_constant(v: SSAValue) -> bool:
    """v depends only on parameters and constants through elementwise ops and layout ops (a weight-only
    expression, which the runtime computes once and again when a parameter changes: `DerivedWeight`), such as a
    norm's `1 + weight` or a causal buffer's `bias == 0`."""
    op = v.owner
    if not isinstance(op, Operation):
        return False
    if isinstance(op, (ParamOp, ConstantOp)):
        return True
    return isinstance(op, _WEIGHT_OPS) and all(is_constant(o) for o in op.operands)


_WEIGHT_OPS = (*ELEMENTWISE_OPS, CatOp, SliceOp, PermuteOp, ReshapeOp)


def users(v: SSAValue) -> list[Operation]:
    return [u.operation for u in v.uses]


def only_user(v: SSAValue, cls: type[OpT] | tuple[type[OpT], ...] = Operation) -> OpT | None:
    """The single op using `v` (once), if it is an instance of `cls`."""
    if not v.has_one_use():
        return None
    op = v.get_unique_use().operation
    return op if isinstance(op, cls) else None


def single_use(*values: SSAValue) -> bool:
    return all(v.has_one_use() for v in values)


def operand_pairs(op: BinaryOp) -> Iterator[tuple[SSAValue, SSAValue]]:
    """(a, b) and, for commutative ops, (b, a)."""
    yield op.lhs, op.rhs
    if op.COMMUTATIVE:
        yield op.rhs, op.lhs


def strip_convert(v: SSAValue) -> SSAValue:
    """The value before a `dl.convert` (if any)."""
    c = producer(v, ConvertOp)
    return c.input if c is not None else v


def strip_reshape(v: SSAValue) -> SSAValue:
    r = producer(v, ReshapeOp)
    return r.input if r is not None else v


def shape(v: SSAValue) -> tuple[int, ...]:
    assert isinstance(v.type, TensorType)
    return tuple(v.type.get_shape())


def last_dim(v: SSAValue) -> int:
    return len(shape(v)) - 1


def set_name(new: SSAValue, like: SSAValue) -> SSAValue:
    """Keep the user-facing SSA name of the value being replaced."""
    if like.name_hint:
        new.name_hint = like.name_hint
    return new


def discard(op: Operation) -> None:
    """Drop a candidate op that will not be inserted: its operand uses would otherwise stay behind
    (breaking single-use checks, and handing the rewriter an op without a block)."""
    op.erase()


def install(rewriter: PatternRewriter, new: Operation, old: SSAValue, before: Sequence[Operation] = ()) -> bool:
    """Replace the op defining `old` by the candidate `new` when `new` verifies and has `old`'s type, keeping
    the user-facing name; otherwise discard `new` and leave the code as it was (a recognizer that cannot
    raise an op leaves it alone). `before`: new ops computing some of `new`'s operands, inserted ahead of it
    (or discarded with it). True when installed."""
    try:
        new.verify()
        fits = new.results[0].type == old.type
    except Exception:  # noqa: BLE001 - the candidate's operands do not fit (a gain of shape [1], cos/sin shapes)
        fits = False
    if not fits:
        for op in (new, *reversed(before)):
            discard(op)
        return False
    set_name(new.results[0], old)
    if before:
        rewriter.insert(list(before), InsertPoint.before(old.owner))
    rewriter.replace(old.owner, new)
    return True
