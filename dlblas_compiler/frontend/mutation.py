"""In-place ops in FX graphs: which node a call writes, the out-of-place call computing the same value, and
writes through views.

The importer functionalizes them: the written tensor's new value becomes a fresh SSA value that later
readers see, and a write to a graph input or a module buffer/parameter is copied back after the call.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from xdsl.ir import SSAValue

from ..dialects import CatOp, PermuteOp, ReshapeOp, SliceOp, inverse_permutation
from ..dialects.types import shape_of

# `a op= b` as traced by dynamo, and the operator computing the same value out of place
INPLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ipow: operator.pow,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}
INPLACE_DUNDERS = {"__iadd__": "add", "__isub__": "sub", "__imul__": "mul", "__itruediv__": "div", "__ipow__": "pow",
                   "__ifloordiv__": "floor_divide", "__imod__": "remainder", "__iand__": "bitwise_and",
                   "__ior__": "bitwise_or", "__ixor__": "bitwise_xor", "__ilshift__": "bitwise_left_shift",
                   "__irshift__": "bitwise_right_shift"}  # fmt: skip
NOT_WRITES = {"requires_grad_", "share_memory_", "retain_grad", "record_stream"}  # end in "_" but change no values
# in-place ops that change a tensor's shape or strides, not (only) its values
RESHAPES_IN_PLACE = {"t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_", "squeeze_", "as_strided_", "resize_",
                     "resize_as_", "set_"}  # fmt: skip


def reshapes_in_place(n: torch.fx.Node) -> bool:
    """n changes its tensor's shape or strides in place (x.t_(), x.unsqueeze_(0))."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return n.op in ("call_method", "call_function") and name in RESHAPES_IN_PLACE


def _writes_by_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name not in NOT_WRITES


def mutated_arg(n: torch.fx.Node, gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The node whose tensor `n` writes in place (x.add_(y), x[i] = y, x += y, relu(x, inplace=True),
    out=x), or None."""
    target: Any = None
    if isinstance(n.kwargs.get("out"), torch.fx.Node):
        target = n.kwargs["out"]
    elif n.op == "call_method" and (_writes_by_name(n.target) or n.target in (*INPLACE_DUNDERS, "__setitem__")):
        target = n.args[0]
    elif n.op == "call_function":
        name = getattr(n.target, "__name__", "")
        torch_fn = (getattr(n.target, "__module__", None) or "").startswith("torch")
        if n.target in INPLACE_OPERATORS or n.target is operator.setitem or (torch_fn and _writes_by_name(name)):
            target = n.args[0]
        elif n.kwargs.get("inplace") is True or inplace_argument(n) is not None:
            target = n.args[0]
        elif written := schema_writes(n):  # (an operator whose schema marks a tensor it writes: `Tensor(a!) out`)
            target = written[0]
    elif n.op == "call_module" and getattr(gm.get_submodule(n.target), "inplace", False) is True:
        target = n.args[0]
    return target if isinstance(target, torch.fx.Node) else None


def inplace_argument(n: torch.fx.Node) -> inspect.BoundArguments | None:
    """A function call's arguments bound to its signature where they pass `inplace=True` by position (dynamo traces
    nn.LeakyReLU(0.1, inplace=True) as `leaky_relu(x, 0.1, True)`; symbolic_trace keeps the keyword), else None."""
    if n.op != "call_function" or not any(a is True for a in n.args[1:]):
        return None
    bound = _bind(n)
    return bound if bound is not None and bound.arguments.get("inplace") is True else None


def _bind(n: torch.fx.Node) -> inspect.BoundArguments | None:
    """A function call's arguments bound to the function's signature (None: a builtin without one, arguments that
    do not bind)."""
    try:
        return inspect.signature(n.target).bind(*n.args, **n.kwargs)
    except (TypeError, ValueError):
        return None


# functions that write some of their tensor arguments though neither their name nor their schema says so, each with
# the condition under which it does (its arguments bound to its signature) and the arguments it then writes
_WRITES_WHEN = {
    F.batch_norm: (lambda a: a.get("training", False), ("running_mean", "running_var")),
    F.instance_norm: (lambda a: a.get("use_input_stats", True), ("running_mean", "running_var")),
    F.embedding: (lambda a: a.get("max_norm") is not None, ("weight",)),
    F.embedding_bag: (lambda a: a.get("max_norm") is not None, ("weight",)),
}


def hidden_writes(n: torch.fx.Node) -> list[torch.fx.Node]:
    """The tensors a call writes as a side effect: the running statistics of a batch or instance norm in training,
    an embedding's weight renormalized to `max_norm`. Run as it is, such a call would write the module's buffer while
    the IR reads it as a value: a read before the call saw the new statistics, one after it the old ones."""
    rule = _WRITES_WHEN.get(n.target) if n.op == "call_function" else None
    bound = _bind(n) if rule is not None else None
    when, names = rule or (None, ())
    if bound is None or not when(bound.arguments):
        return []
    return [v for k in names if isinstance(v := bound.arguments.get(k), torch.fx.Node)]


def schema_writes(n: torch.fx.Node) -> list[torch.fx.Node]:
    """The arguments an operator's schema says it writes (`Tensor(a!)`: a custom op writing a cache and returning
    None, as vLLM's and flash-attn's cache writes do), for a call of an OpOverload (or of a packet of one overload)."""
    target = n.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        names = target.overloads()
        target = getattr(target, names[0]) if len(names) == 1 else None
    schema = getattr(target, "_schema", None)
    if n.op != "call_function" or schema is None:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
            if isinstance(v, torch.fx.Node):
                out.append(v)
    return out


def out_of_place(n: torch.fx.Node) -> tuple[Any, tuple, dict] | None:
    """(converter key, args, kwargs) of the out-of-place call computing what `n` writes, if there is one
    (copy_ and item assignment have none: the importer broadcasts and casts the source, or runs the call
    on a copy)."""
    kwargs = {k: v for k, v in n.kwargs.items() if k not in ("inplace", "out")}
    if n.op == "call_method":
        if n.target in INPLACE_DUNDERS:
            return INPLACE_DUNDERS[n.target], n.args, kwargs
        if _writes_by_name(n.target) and n.target != "copy_":
            return n.target[:-1], n.args, kwargs
        return None
    if n.op == "call_function":
        if n.target in INPLACE_OPERATORS:
            return INPLACE_OPERATORS[n.target], n.args, kwargs
        name = getattr(n.target, "__name__", "")
        if _writes_by_name(name) and (twin := getattr(torch, name[:-1], None)) is not None:
            return twin, n.args, kwargs
        if n.target is operator.setitem:
            return None
        if (bound := inplace_argument(n)) is not None:
            bound.arguments["inplace"] = False
            return n.target, bound.args, {k: v for k, v in bound.kwargs.items() if k != "out"}
        return n.target, n.args, kwargs
    return None


# -- writes through views -----------------------------------------------------------------------------------
# A node whose tensor is a view of its first argument's (eager shares the storage) imports as a chain of
# dl.slice (step 1), dl.reshape and dl.permute ops from that argument's value: getitem with ints, slices,
# Ellipsis and None, narrow, select, view, reshape, flatten, unsqueeze, squeeze, permute, transpose. A write
# through it (`x[..., :d].copy_(y)`, `h[:, :2].mul_(3)`) is then functionalized on the whole tensor: the view's new
# value is put back through the chain (`put`: a slice's neighbours concatenated around it, a reshape or a
# permutation undone), and every view of that tensor is taken again from its new value (`replay`). A view these
# steps do not take (a strided slice, a diagonal, a view of an integer tensor run by PyTorch) is PyTorch's to take
# again and to put back (`importer.TorchView`).
ViewStep = tuple  # ("slice", dim, start, end) | ("reshape", shape) | ("permute", perm)


def view_steps(out: SSAValue, src: SSAValue) -> tuple[ViewStep, ...] | None:
    """The steps from `src` to `out` if `out` is a chain of view ops on `src`, else None (a strided slice,
    another op: a write through such a view is not functionalized)."""
    steps: list[ViewStep] = []
    x = out
    while x is not src:
        op = x.owner
        if isinstance(op, SliceOp) and op.bounds()[3] == 1:
            steps.append(("slice", *op.bounds()[:3]))
        elif isinstance(op, ReshapeOp):
            steps.append(("reshape", tuple(shape_of(op.result))))
        elif isinstance(op, PermuteOp):
            steps.append(("permute", op.permutation))
        else:
            return None
        x = op.operands[0]
    return tuple(reversed(steps))


def replay(e, steps: tuple[ViewStep, ...], x: SSAValue) -> SSAValue:
    """The view the steps take of `x`."""
    for step in steps:
        x = _view_op(e, step, x)
    return x


def put(e, steps: tuple[ViewStep, ...], x: SSAValue, new: SSAValue) -> SSAValue:
    """`x` with its view (the steps taken of it) replaced by `new`, built out of place."""
    if not steps:
        return new
    first, rest = steps[0], steps[1:]
    if rest:  # (the view's source at this step: only its further steps need it)
        new = put(e, rest, _view_op(e, first, x), new)
    kind = first[0]
    if kind == "reshape":
        return e.emit(ReshapeOp(new, list(shape_of(x)))).results[0]
    if kind == "permute":
        return e.emit(PermuteOp(new, inverse_permutation(first[1]))).results[0]
    _, dim, start, end = first
    n = shape_of(x)[dim]
    before = [_part(e, x, dim, 0, start)] if start > 0 else []
    after = [_part(e, x, dim, end, n)] if end < n else []
    parts = [*before, new, *after]
    return parts[0] if len(parts) == 1 else e.emit(CatOp(parts, dim)).results[0]


def _view_op(e, step: ViewStep, x: SSAValue) -> SSAValue:
    kind = step[0]
    if kind == "slice":
        _, dim, start, end = step
        if start == 0 and end == shape_of(x)[dim]:
            return x
        return e.emit(SliceOp(x, dim, start, end)).results[0]
    if kind == "reshape":
        return x if tuple(shape_of(x)) == step[1] else e.emit(ReshapeOp(x, list(step[1]))).results[0]
    return e.emit(PermuteOp(x, list(step[1]))).results[0]


def _part(e, x: SSAValue, dim: int, start: int, end: int) -> SSAValue:
    """x[start:end] along dim; where x is a concatenation along dim and the range covers whole pieces, those
    pieces (so that filling a tensor piece by piece, `t = new_empty(...); t[..., :a].copy_(p); t[..., a:].copy_(q)`,
    imports as cat(p, q))."""
    op = x.owner
    if isinstance(op, CatOp) and op.axis == dim:
        pieces, at = [], 0
        for p in op.inputs:
            size = shape_of(p)[dim]
            if start <= at and at + size <= end:
                pieces.append(p)
            elif at < end and start < at + size:  # (a piece cut by the range)
                pieces = []
                break
            at += size
        if pieces and sum(shape_of(p)[dim] for p in pieces) == end - start:
            return pieces[0] if len(pieces) == 1 else e.emit(CatOp(pieces, dim)).results[0]
    return e.emit(SliceOp(x, dim, start, end)).results[0]
