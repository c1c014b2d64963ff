"""Which values of a function may share memory at run time, and who reads a value after a given op.

The IR has value semantics, but at run time a view (reshape, permute, slice, broadcast), a dtype conversion that
changes nothing and an opaque torch call may return their operand's memory. The stages that let a step write a
tensor in place ask here whether anything reads that memory afterwards: the runtime, for writes into the caller's
inputs (`runtime.inplace`), and the fuse pass, for region inputs a kernel may overwrite (`overwritable`).
"""

from __future__ import annotations

from collections.abc import Iterator

from xdsl.dialects import func
from xdsl.ir import BlockArgument, Operation, SSAValue

from .elementwise import ConvertOp
from .layout import VIEW_OPS, IndexCopyOp
from .structural import FusedOp, TorchCallOp

ALIASING = (*VIEW_OPS, ConvertOp, TorchCallOp)  # ops whose result may share its operand's memory at run time


def readers(values: list[SSAValue], skip: Operation | None = None,
            through_regions: bool = False) -> Iterator[Operation | None]:
    """The top-level ops (a dl.fused for an op inside it; None outside the function) that read `values` or a
    value that may be a view of one: through view-like ops and torch calls, except calls eager showed to make new
    tensors (`fresh`), and not past `skip`. An in-place call's result is the operand it writes (`writes`), never a
    view of its others: the index of `t[:, index] = v` does not reach the output through it. `through_regions`:
    also through a region's outputs that may share an input's memory (`_may_alias_input`). One op reading two such
    values is yielded once for each."""
    stack, seen = list(values), set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        for use in x.uses:
            user = top(use.operation)
            if user is skip:
                continue
            yield user
            if isinstance(user, ALIASING) and "fresh" not in user.attributes and not _other_than_written(user, use):
                stack.extend(user.results)
            elif through_regions and isinstance(user, FusedOp) and use.operation is user:
                stack.extend(r for o, r in enumerate(user.outputs) if _may_alias_input(user, o))


def read_after(v: SSAValue, write: Operation, order: dict[Operation, int]) -> bool:
    """Whether any op after `write` reads v, or a value that may be a view of it."""
    return any(user is None or order[user] > order[write] for user in readers([v], skip=write))


def reaches_output(values: list[SSAValue]) -> bool:
    """Whether a function output may be one of `values` or a view of one (through view-like ops)."""
    return any(isinstance(user, func.ReturnOp) for user in readers(values))


def input_root(v: SSAValue, args: list) -> int | None:
    """The block argument `v` may be a view of (through view-like ops), as its index."""
    while v not in args and isinstance(v.owner, ALIASING) and v.owner.operands:
        v = v.owner.operands[0]
    return args.index(v) if v in args else None


def top(op: Operation | None) -> Operation | None:
    """The top-level op of the function that contains `op` (itself, or the dl.fused around it)."""
    while op is not None and not isinstance(op.parent_op(), func.FuncOp):
        op = op.parent_op()
    return op


def _other_than_written(op: Operation, use) -> bool:
    """Whether `use` is an operand of the in-place torch call `op` other than the one it writes."""
    return (isinstance(op, TorchCallOp) and op.writes is not None and use.operation is op
            and use.index != op.writes.value.data)


def overwritable(fn: func.FuncOp) -> dict[FusedOp, tuple[int, ...]]:
    """The regions' inputs whose memory the region's kernel may overwrite -> their positions: the input is another
    region's output, or a view of one through view ops (not a function input, not a torch call's result, whose
    memory may be held elsewhere), that output is its region's own new tensor (it yields no view of an input and no
    index_copy's destination), and nothing that may share its memory (a view of it, a torch call's or a region's
    result that may be one) is read after this region, by another of its inputs, or as a function output. cuBLAS can
    then add a GEMM's product into a residual the program no longer needs (`torch.addmm(r, x, W^T, out=r)`: the GEMM
    template's MM=2)."""
    block = fn.body.block
    order = {op: i for i, op in enumerate(block.ops)}
    found: dict[FusedOp, tuple[int, ...]] = {}
    for op in block.ops:
        if not isinstance(op, FusedOp):
            continue
        ok = []
        for i, v in enumerate(op.inputs):
            root = _region_root(v)
            if root is None:
                continue
            users = list(readers([root], through_regions=True))
            if sum(user is op for user in users) == 1 and all(  # (op reads no other value sharing that memory)
                user is op or (user is not None and not isinstance(user, func.ReturnOp) and order[user] < order[op])
                for user in users
            ):  # fmt: skip
                ok.append(i)
        if ok:
            found[op] = tuple(ok)
    return found


def _region_root(v: SSAValue) -> SSAValue | None:
    """The region output `v` is, or is a view of through view ops, where that output is its region's own new
    tensor; None otherwise."""
    while isinstance(v.owner, VIEW_OPS):
        v = v.owner.operands[0]
    owner = v.owner
    if not isinstance(owner, FusedOp) or isinstance(v, BlockArgument):
        return None
    return None if _may_alias_input(owner, list(owner.outputs).index(v)) else v


def _may_alias_input(fused: FusedOp, out: int) -> bool:
    """Whether the region's output `out` may share an input's memory: it yields a view of an input (through
    view-like ops) or an index_copy's result (the destination, written in place)."""
    y = fused.yielded.values[out]
    args = list(fused.block.args)
    while y not in args and isinstance(y.owner, ALIASING) and y.owner.operands:
        y = y.owner.operands[0]
    return y in args or isinstance(y.owner, IndexCopyOp)

