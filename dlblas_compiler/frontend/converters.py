"""The FX → `dl` converter table, keyed by function object, method name or module class.

A converter receives the `Emitter` (which knows the FX node and its example output `e.value`) and the
node's arguments, with tensors as SSA values and everything else as Python values. It returns SSA
value(s) shaped like the node's output, or raises `Unsupported` to leave the node to `dl.torch_call`.
Elementwise ops come from the dialect's own `TORCH_FNS`; everything else is listed here.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable, Sequence
from numbers import Number
from typing import Any

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from xdsl.ir import SSAValue

from ..dialects import (
    BINARY_OPS,
    UNARY_OPS,
    AbsOp,
    AddOp,
    BroadcastOp,
    CatOp,
    CompareOp,
    ConvertOp,
    DivOp,
    EmbeddingOp,
    Expm1Op,
    ExpOp,
    GeluOp,
    IndexCopyOp,
    LayerNormOp,
    LinearOp,
    Log1pOp,
    LogicalOp,
    LogOp,
    MatmulOp,
    MaximumOp,
    MinimumOp,
    MoEOp,
    MulOp,
    NegOp,
    NotOp,
    PermuteOp,
    PowOp,
    ReduceMaxOp,
    ReduceMeanOp,
    ReduceSumOp,
    ReshapeOp,
    RMSNormOp,
    SDPAOp,
    SigmoidOp,
    SliceOp,
    SoftmaxOp,
    SqrtOp,
    SubOp,
    TanhOp,
    WhereOp,
)
from ..dialects.types import COMPUTE_DTYPES, broadcast_shapes, dtype_of, normalize_dim, shape_of, xdsl_dtype
from .moe import moe


class Unsupported(Exception):
    """This call is outside what the converter handles; the node becomes a `dl.torch_call`."""


CONVERTERS: dict[Any, Callable] = {}


def converts(*keys: Any):
    def deco(fn: Callable) -> Callable:
        for k in keys:
            CONVERTERS[k] = fn
        return fn

    return deco


def converter_key(n: torch.fx.Node, gm: torch.fx.GraphModule) -> Any:
    if n.op == "call_module":
        return type(gm.get_submodule(n.target))
    return n.target


def _tensor(v: Any, what: str = "operand") -> SSAValue:
    if not isinstance(v, SSAValue):
        raise Unsupported(f"{what} is {type(v).__name__}, not a tensor")
    return v


def _out_shape(e) -> tuple[int, ...]:
    return tuple(e.value.shape)


def _emit(e, op) -> SSAValue:
    return e.emit(op).results[0]


# -- elementwise, from the dialect's TORCH_FNS ----------------------------------------------------
def _unary_converter(op_cls):
    def conv(e, x, *rest, inplace=False, out=None, **kw):
        if rest or inplace or out is not None or kw:
            raise Unsupported(f"extra arguments {rest or kw}")
        return _emit(e, op_cls(_tensor(x)))

    return conv


def _bool_as_float(e, v: Any) -> Any:
    """A boolean operand of float arithmetic (`x * mask`, `(x > 0) * 2.0`), cast to the result's dtype as torch
    promotes it (exactly: to 0 and 1)."""
    if isinstance(v, SSAValue) and dtype_of(v) == torch.bool and getattr(e.value, "dtype", None) in COMPUTE_DTYPES:
        return _emit(e, ConvertOp(v, xdsl_dtype(e.value.dtype)))
    return v


def _binary_converter(op_cls):
    def conv(e, a, b, *rest, alpha=1, out=None, rounding_mode=None):
        if rest or alpha != 1 or out is not None or rounding_mode is not None:
            raise Unsupported("alpha, out= or rounding_mode")
        if not isinstance(a, SSAValue) and not isinstance(b, SSAValue):
            raise Unsupported("no tensor operand")
        a, b = _bool_as_float(e, a), _bool_as_float(e, b)
        if isinstance(a, Number):
            a = e.const(a, b)
        if isinstance(b, Number):
            b = e.const(b, a)
        return _emit(e, op_cls(_tensor(a), _tensor(b)))

    return conv


for _cls in UNARY_OPS:
    if _cls not in (GeluOp, PowOp):
        converts(*_cls.TORCH_FNS)(_unary_converter(_cls))
for _cls in BINARY_OPS:
    converts(*_cls.TORCH_FNS)(_binary_converter(_cls))


converts(torch.special.expit)(CONVERTERS[torch.sigmoid])  # the logistic function under its scipy name


@converts(torch.square, "square")
def _square(e, x):
    x = _tensor(x)
    return _emit(e, MulOp(x, x))


@converts(*GeluOp.TORCH_FNS, "gelu")
def _gelu(e, x, approximate="none"):
    return _emit(e, GeluOp(_tensor(x), approximate))


@converts(*PowOp.TORCH_FNS)
def _pow(e, x, exponent):
    if not isinstance(exponent, Number) or isinstance(exponent, bool):
        raise Unsupported("only scalar exponents")
    return _emit(e, PowOp(_tensor(x), float(exponent)))


@converts(nn.SiLU, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU)
def _activation_module(e, mod, x):
    fn = {nn.SiLU: F.silu, nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid}.get(type(mod))
    if fn is None:
        return _gelu(e, x, mod.approximate)
    return CONVERTERS[fn](e, x)


# -- casts and identities -------------------------------------------------------------------------
def _convert_to(e, x) -> SSAValue:
    x = _tensor(x)
    want = xdsl_dtype(e.value.dtype)
    if x.type.element_type == want:
        return x
    if e.value.dtype == torch.bool:  # (x != 0: NaN is True, as in eager)
        return _compare("ne", e, x, 0.0)
    return _emit(e, ConvertOp(x, want))


@converts("to", "type", "type_as", "float", "half", "bfloat16", "double", "bool")
def _to(e, x, *args, **kwargs):
    src = e.arg_value(0)
    if isinstance(src, torch.Tensor) and src.device != e.value.device:
        raise Unsupported(f"moves a tensor from {src.device} to {e.value.device}")
    return _convert_to(e, x)


@converts("contiguous", "clone", "detach", torch.clone, torch.detach, nn.Identity)
def _identity(e, x, *args, **kwargs):
    if isinstance(x, nn.Module):  # nn.Identity
        x = args[0]
    return _tensor(x)


@converts(nn.Dropout)
def _dropout_module(e, mod, x):
    if mod.training and mod.p > 0:
        raise Unsupported("dropout in training mode")
    return _tensor(x)


@converts(F.dropout, "dropout")
def _dropout(e, x, p=0.5, training=True, inplace=False):
    if training and p > 0:
        raise Unsupported("dropout in training mode")
    return _tensor(x)


# -- reorganize / shuffle / broadcast -------------------------------------------------------------
@converts(
    "view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "view_as", "reshape_as",
    torch.reshape, torch.flatten, torch.unflatten, torch.unsqueeze, torch.squeeze,
)  # fmt: skip
def _reshape(e, x, *args, **kwargs):
    if len(args) == 1 and isinstance(args[0], torch.dtype) or "dtype" in kwargs:
        raise Unsupported("view(dtype) reinterprets bits")
    x = _tensor(x)
    shape = _out_shape(e)
    return x if shape_of(x) == shape else _emit(e, ReshapeOp(x, shape))


@converts("expand", "expand_as", "broadcast_to", torch.broadcast_to)
def _expand(e, x, *args, **kwargs):
    x = _tensor(x)
    shape = _out_shape(e)
    return x if shape_of(x) == shape else _emit(e, BroadcastOp(x, shape))


def _permute(e, x: SSAValue, perm: Sequence[int]) -> SSAValue:
    perm = [normalize_dim(p, len(perm)) for p in perm]
    return x if perm == sorted(perm) else _emit(e, PermuteOp(x, perm))


@converts("transpose", "swapaxes", "swapdims", torch.transpose, torch.swapaxes)
def _transpose(e, x, d0, d1):
    x = _tensor(x)
    r = len(shape_of(x))
    perm = list(range(r))
    a, b = normalize_dim(d0, r), normalize_dim(d1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(e, x, perm)


@converts("t", torch.t)
def _t(e, x):
    x = _tensor(x)
    return _permute(e, x, list(range(len(shape_of(x))))[::-1])


@converts("permute", torch.permute)
def _permute_conv(e, x, *dims, **kwargs):
    dims = kwargs.get("dims", dims)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    return _permute(e, _tensor(x), list(dims))


@converts(builtins.getattr)
def _getattr(e, x, name):
    x = _tensor(x)
    r = len(shape_of(x))
    if name == "T":
        return _permute(e, x, list(range(r))[::-1])
    if name == "mT":
        return _permute(e, x, [*range(r - 2), r - 1, r - 2])
    raise Unsupported(f"attribute {name}")


def _slice(e, x, dim, start, end, step=1) -> SSAValue:
    n = shape_of(x)[dim]
    s, t, _ = slice(start, end, step).indices(n)
    if s == 0 and t >= n and step == 1:
        return x
    return _emit(e, SliceOp(x, dim, start if start is not None else 0, end if end is not None else n, step or 1))


@converts(operator.getitem)
def _getitem(e, x, idx):
    if isinstance(x, (tuple, list)):
        return x[idx]
    x = _tensor(x)
    idx = idx if isinstance(idx, tuple) else (idx,)
    if any(isinstance(i, (SSAValue, torch.Tensor)) or isinstance(i, bool) for i in idx):
        raise Unsupported("advanced (tensor / bool) indexing")
    lists = [i for i in idx if isinstance(i, list)]
    if lists and (len(lists) > 1 or any(isinstance(i, int) for i in idx)):
        raise Unsupported("advanced indexing by several lists or a list and an int (the result's dims move)")
    rank = len(shape_of(x))
    used = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if used > rank:
        raise Unsupported("too many indices")
    e.importer.size_decisions.extend(slice_decisions(e.node, shape_of(x), idx))
    expanded: list[Any] = []
    for i in idx:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (rank - used))
        else:
            expanded.append(i)
    dim = 0
    for i in expanded:
        if i is None:
            continue
        if isinstance(i, slice):
            if i.step is not None and i.step < 1:
                raise Unsupported("negative or zero step")
            x = _slice(e, x, dim, i.start, i.stop, i.step or 1)
        elif isinstance(i, list):  # one list alone: its dim stays in place, a slice when evenly spaced
            x = _slice(e, x, dim, *_list_as_slice(i, shape_of(x)[dim]))
        elif isinstance(i, int):
            n = shape_of(x)[dim]
            k = i % n if -n <= i < n else None
            if k is None:
                raise Unsupported(f"index {i} out of range")
            x = _slice(e, x, dim, k, k + 1)
        else:
            raise Unsupported(f"index {i!r}")
        dim += 1
    shape = _out_shape(e)
    return x if shape_of(x) == shape else _emit(e, ReshapeOp(x, shape))


def slice_decisions(node: torch.fx.Node, shape: tuple[int, ...], idx: Any) -> list[str]:
    """The bounds of `x[idx]` (node: the getitem; idx: its index, sizes resolved) that are not affine in the sizes:
    a bound eager clips to its dim's size (`h[:, :6]` of 5 rows, `h[:, -6:]` of 5), and a negative bound or index the
    graph computed (`h[:, n - 12:]`, which wraps while n < 12). Recorded as `size_decisions`, so that two compiles at
    other sizes form no shape family: before, `h[:, :6]` compiled at 5 and 6 rows was taken to 7 rows at 7."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    raw = node.args[1] if len(node.args) > 1 else idx  # (as written: which numbers the graph computed)
    raw = raw if isinstance(raw, tuple) and len(raw) == len(idx) else idx
    used = sum(1 for i in idx if i is not None and i is not Ellipsis)
    out, dim = [], 0
    for i, r in zip(idx, raw, strict=True):
        if i is Ellipsis:
            dim += len(shape) - used
            continue
        if i is None or dim >= len(shape):
            continue
        n = shape[dim]
        if isinstance(i, slice):
            for b, w in ((i.start, getattr(r, "start", None)), (i.stop, getattr(r, "stop", None))):
                if isinstance(b, int) and (b > n or b < -n or (b < 0 and isinstance(w, torch.fx.Node))):
                    out.append(f"{node.name}: slice bound {b} of {n} rows")
        elif isinstance(i, int) and i < 0 and isinstance(r, torch.fx.Node):
            out.append(f"{node.name}: index {i} of {n} rows")
        dim += 1
    return out


def _list_as_slice(idx: list, n: int) -> tuple[int, int, int]:
    """(start, end, step) of the slice picking the same rows as the index list `idx` (x[..., [-2], :] say)."""
    if not idx or not all(isinstance(i, int) and not isinstance(i, bool) and -n <= i < n for i in idx):
        raise Unsupported(f"index list {idx}")
    rows = [i % n for i in idx]
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    if step < 1 or rows != list(range(rows[0], rows[-1] + 1, step)):
        raise Unsupported(f"index list {idx} is not an evenly spaced increasing range")
    return rows[0], rows[-1] + 1, step


@converts("narrow", torch.narrow)
def _narrow(e, x, dim, start, length):
    x = _tensor(x)
    d = normalize_dim(dim, len(shape_of(x)))
    return _slice(e, x, d, start, start + length)


@converts("select", torch.select)
def _select(e, x, dim, index):
    x = _tensor(x)
    d = normalize_dim(dim, len(shape_of(x)))
    n = shape_of(x)[d]
    x = _slice(e, x, d, index % n, index % n + 1)
    return _emit(e, ReshapeOp(x, _out_shape(e)))


@converts(torch.cat, torch.concat, torch.concatenate, "cat")
def _cat(e, tensors, dim=0, *, axis=None):
    dim = axis if axis is not None else dim
    xs = [_tensor(t) for t in tensors if not (isinstance(t, SSAValue) and 0 in shape_of(t))]
    if not xs:
        raise Unsupported("all inputs are empty")
    if len(xs) == 1:
        return xs[0]
    return _emit(e, CatOp(xs, normalize_dim(dim, len(shape_of(xs[0])))))


@converts(torch.index_copy, "index_copy")
def _index_copy(e, x, dim, index, source):
    return _emit(e, IndexCopyOp(_tensor(x), dim, _tensor(index, "index"), _tensor(source, "source")))


@converts(torch.stack, "stack")
def _stack(e, tensors, dim=0):
    xs = [_tensor(t) for t in tensors]
    shape = _out_shape(e)
    d = normalize_dim(dim, len(shape))
    parts = [_emit(e, ReshapeOp(x, [*shape[:d], 1, *shape[d + 1 :]])) for x in xs]
    return parts[0] if len(parts) == 1 else _emit(e, CatOp(parts, d))


@converts("repeat_interleave", torch.repeat_interleave)
def _repeat_interleave(e, x, repeats, dim=None, *, output_size=None):
    """Each slice along `dim` repeated `repeats` times in a row, spelled as GQA's repeat_kv spells it (a new
    size-1 dim after `dim`, expanded, merged back): the form `recognize` reads as grouped attention."""
    x = _tensor(x)
    if not isinstance(repeats, int) or dim is None:
        raise Unsupported("repeats given as a tensor, or no dim (a flattened result)")
    s = shape_of(x)
    d = normalize_dim(dim, len(s))
    one = _emit(e, ReshapeOp(x, [*s[: d + 1], 1, *s[d + 1 :]]))
    wide = _emit(e, BroadcastOp(one, [*s[: d + 1], repeats, *s[d + 1 :]]))
    return _emit(e, ReshapeOp(wide, _out_shape(e)))


@converts("split", torch.split, "chunk", torch.chunk, "tensor_split", torch.tensor_split)
def _split(e, x, *args, dim=0, **kwargs):
    if args and len(args) > 1:  # split(sizes, dim), chunk(n, dim), tensor_split(sections, dim)
        dim = args[1]
    x, dim = _tensor(x), kwargs.get("dim", dim)
    parts = args[0] if args else next((kwargs[k] for k in ("split_size_or_sections", "split_size", "chunks", "sections",
                                                           "indices_or_sections") if k in kwargs), None)  # fmt: skip
    n = shape_of(x)[normalize_dim(dim, len(shape_of(x)))]
    name = getattr(e.node.target, "__name__", e.node.target)
    if isinstance(parts, int):  # chunk's and tensor_split's ceil(n / parts) rows, split's ceil(n / parts) pieces:
        e.importer.size_decisions.append(f"{e.node.name} = {name}({parts}) of {n} rows")  # not affine in n
    elif name == "tensor_split" and isinstance(parts, (list, tuple)) and any(not 0 <= i <= n for i in parts):
        e.importer.size_decisions.append(f"{e.node.name} = {name}({list(parts)}) of {n} rows")  # (clipped or wrapped)
    return _pieces(e, x, dim)


@converts("unbind", torch.unbind)
def _unbind(e, x, dim=0):
    return _pieces(e, _tensor(x), dim)


def _pieces(e, x: SSAValue, dim: int) -> tuple:
    """The pieces eager returned (e.value), taken from x along dim in order: slices, reshaped where the piece
    drops the dim (unbind)."""
    d = normalize_dim(dim, len(shape_of(x)))
    outs, start = [], 0
    for v in e.value:
        n = v.shape[d] if v.dim() == len(shape_of(x)) else 1
        part = _slice(e, x, d, start, start + n)
        if tuple(v.shape) != shape_of(part):
            part = _emit(e, ReshapeOp(part, tuple(v.shape)))
        outs.append(part)
        start += n
    return tuple(outs)


# -- reductions -----------------------------------------------------------------------------------
def _reduce(op_cls):
    def conv(e, x, dim=None, keepdim=False, *, dtype=None, axis=None, out=None):
        x = _tensor(x)
        if out is not None or isinstance(dim, (str,)):
            raise Unsupported("out= or named dims")
        dim = axis if axis is not None else dim
        if dtype is not None:
            x = _emit(e, ConvertOp(x, xdsl_dtype(dtype))) if x.type.element_type != xdsl_dtype(dtype) else x
        rank = len(shape_of(x))
        dims = list(range(rank)) if dim is None or dim == [] or dim == () else ([dim] if isinstance(dim, int) else list(dim))
        return _emit(e, op_cls(x, dims, bool(keepdim)))

    return conv


converts(torch.sum, "sum")(_reduce(ReduceSumOp))
converts(torch.mean, "mean")(_reduce(ReduceMeanOp))
converts(torch.amax, "amax")(_reduce(ReduceMaxOp))


@converts(torch.max, "max")
def _max(e, x, *args, **kwargs):
    if not isinstance(x, SSAValue):
        raise Unsupported("max of a non-tensor")
    if isinstance(e.value, torch.Tensor) and not args and not kwargs:  # full reduction
        return _emit(e, ReduceMaxOp(x, list(range(len(shape_of(x)))), False))
    if len(args) == 1 and isinstance(args[0], SSAValue):
        return CONVERTERS[torch.maximum](e, x, args[0])
    raise Unsupported("max along a dim returns indices")


@converts(torch.clamp, torch.clip, "clamp", "clip")
def _clamp(e, x, min=None, max=None, *, out=None):
    """min(max(x, lo), hi) (NaN in x or a bound gives NaN, and lo > hi gives hi, as eager's), a bound a number or
    a tensor."""
    x = _tensor(x)
    if out is not None or (min is None and max is None):
        raise Unsupported("clamp with out= or without bounds")
    for bound, op_cls in ((min, MaximumOp), (max, MinimumOp)):
        if bound is not None:
            x = _emit(e, op_cls(x, e.const(bound, x) if isinstance(bound, Number) else _tensor(bound, "bound")))
    return x


@converts(torch.clamp_min, "clamp_min")
def _clamp_min(e, x, min):
    return _clamp(e, x, min=min)


@converts(torch.clamp_max, "clamp_max")
def _clamp_max(e, x, max):
    return _clamp(e, x, max=max)


# -- where, masked_fill ------------------------------------------------------------------------------------------
def _condition(c: Any) -> SSAValue:
    if not isinstance(c, SSAValue) or dtype_of(c) != torch.bool:
        raise Unsupported("a condition that is not a boolean tensor")
    return c


def _branch(e, v: Any, other: Any) -> SSAValue:
    """A branch of where: a float tensor, or a number (weakly typed: the other branch's dtype)."""
    if isinstance(v, Number) and not isinstance(v, bool):
        return e.const(v, other)
    if not isinstance(v, SSAValue) or dtype_of(v) not in COMPUTE_DTYPES:
        raise Unsupported("a branch that is not a float tensor or a number")
    return v


@converts(torch.where)
def _where(e, cond, a=None, b=None, *, out=None):
    if a is None or b is None or out is not None:
        raise Unsupported("where(cond) (the indices of nonzeros) or out=")
    if not isinstance(a, SSAValue) and not isinstance(b, SSAValue):
        raise Unsupported("two numbers: the result's dtype is the default one")
    a, b = _branch(e, a, b), _branch(e, b, a)
    return _emit(e, WhereOp(_condition(cond), a, b))


@converts("where")
def _where_method(e, x, cond, other):
    return _where(e, cond, x, other)


@converts(torch.masked_fill, "masked_fill")
def _masked_fill(e, x, mask, value):
    """where(mask, value, x): the value cast to x's dtype, the result x's shape (a mask broadcasting past it is
    eager's error)."""
    x, mask = _tensor(x), _condition(mask)
    if dtype_of(x) not in COMPUTE_DTYPES:
        raise Unsupported(f"masked_fill of a {dtype_of(x)} tensor")
    if isinstance(value, SSAValue):
        if shape_of(value) != ():
            raise Unsupported("a value tensor that is not 0-d")
        if dtype_of(value) != dtype_of(x):
            value = _emit(e, ConvertOp(_branch(e, value, x), xdsl_dtype(dtype_of(x))))
    elif not isinstance(value, Number) or isinstance(value, bool):
        raise Unsupported(f"masked_fill with a {type(value).__name__} value")
    if broadcast_shapes(shape_of(mask), shape_of(x)) != shape_of(x):
        raise Unsupported("a mask that broadcasts past the tensor")
    return _emit(e, WhereOp(mask, _branch(e, value, x), x))


# -- comparisons and logic --------------------------------------------------------------------------------------
def _not_of_constants(e) -> None:
    """Comparisons and logic of constants alone stay torch calls: frontend/masks.py finds the causal masks among
    such calls from their values."""
    if e.importer.input_free(e.node):
        raise Unsupported("a mask made from constants alone stays a torch call, its values known to the compiler")


def _compare(pred: str, e, a: Any, b: Any) -> SSAValue:
    _not_of_constants(e)
    if not isinstance(a, SSAValue) and not isinstance(b, SSAValue):
        raise Unsupported("no tensor operand")
    for v in (a, b):
        if not isinstance(v, SSAValue) and (not isinstance(v, Number) or isinstance(v, bool)):
            raise Unsupported(f"a comparison with a {type(v).__name__}")
    a = e.const(_number_in(a, b), b) if isinstance(a, Number) else a
    b = e.const(_number_in(b, a), a) if isinstance(b, Number) else b
    return _emit(e, CompareOp(pred, a, b))


def _number_in(v: Number, t: SSAValue) -> float:
    """A number compared with float tensor t, converted to t's dtype once as eager converts it (an int above 2**53
    through float64 first would round twice)."""
    if isinstance(v, int) and not -(2**63) <= v < 2**63:
        raise Unsupported(f"the integer {v} (eager's comparison refuses it)")
    return torch.tensor(v, dtype=torch.int64 if isinstance(v, int) else torch.float64).to(dtype_of(t)).item()


def _compare_converter(pred: str):
    def conv(e, a, b, *, out=None):
        if out is not None:
            raise Unsupported("out=")
        return _compare(pred, e, a, b)

    return conv


for _pred, _keys in {
    "eq": (torch.eq, operator.eq, "eq", "__eq__"),
    "ne": (torch.ne, torch.not_equal, operator.ne, "ne", "not_equal", "__ne__"),
    "lt": (torch.lt, torch.less, operator.lt, "lt", "less", "__lt__"),
    "le": (torch.le, torch.less_equal, operator.le, "le", "less_equal", "__le__"),
    "gt": (torch.gt, torch.greater, operator.gt, "gt", "greater", "__gt__"),
    "ge": (torch.ge, torch.greater_equal, operator.ge, "ge", "greater_equal", "__ge__"),
}.items():
    converts(*_keys)(_compare_converter(_pred))


@converts(torch.isnan, "isnan")
def _isnan(e, x):
    return _compare("ne", e, x, x)


@converts(torch.isinf, "isinf", torch.isfinite, "isfinite")
def _isinf(e, x):
    """|x| == inf, or |x| < inf for isfinite (NaN is neither)."""
    finite = e.node.target in (torch.isfinite, "isfinite")
    return _compare("lt" if finite else "eq", e, _emit(e, AbsOp(_tensor(x))), math.inf)


@converts(torch.isposinf, "isposinf", torch.isneginf, "isneginf")
def _isposinf(e, x):
    return _compare("eq", e, x, -math.inf if e.node.target in (torch.isneginf, "isneginf") else math.inf)


def _logical_converter(kind: str):
    def conv(e, a, b, *, out=None):
        if out is not None or not isinstance(a, SSAValue) or not isinstance(b, SSAValue):
            raise Unsupported("out=, or an operand that is not a tensor")
        _not_of_constants(e)
        return _emit(e, LogicalOp(kind, a, b))  # (dl.logical takes booleans: an integer & is a torch call)

    return conv


for _kind, _keys in {
    "and": (torch.logical_and, torch.bitwise_and, operator.and_, "logical_and", "bitwise_and", "__and__"),
    "or": (torch.logical_or, torch.bitwise_or, operator.or_, "logical_or", "bitwise_or", "__or__"),
    "xor": (torch.logical_xor, torch.bitwise_xor, operator.xor, "logical_xor", "bitwise_xor", "__xor__"),
}.items():
    converts(*_keys)(_logical_converter(_kind))


@converts(torch.logical_not, torch.bitwise_not, operator.invert, "logical_not", "bitwise_not", "__invert__")
def _not(e, x, *, out=None):
    if out is not None:
        raise Unsupported("out=")
    _not_of_constants(e)
    return _emit(e, NotOp(_tensor(x)))


# -- 2-norms along dims and F.normalize --------------------------------------------------------------------------
def _two_norm(e, x, dim, keepdim: bool, what: str) -> SSAValue:
    """sqrt(sum(x^2)) over dims (all for None) in float32, rounded to x's type once, as eager's norm kernels (whose
    float32 accumulators on a GPU overflow past 1.8e19 as these do; on the CPU eager accumulates in float64)."""
    xf, out = _in_f32(e, x, None, what)
    rank = len(shape_of(xf))
    dims = range(rank) if dim is None else [dim] if isinstance(dim, int) else dim
    dims = [normalize_dim(d, rank) for d in dims]
    total = _emit(e, ReduceSumOp(_emit(e, MulOp(xf, xf)), dims, bool(keepdim)))
    return _cast(e, _emit(e, SqrtOp(total)), out)


@converts(torch.linalg.vector_norm)
def _vector_norm(e, x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    if ord not in (2, 2.0) or dtype is not None or out is not None:
        raise Unsupported(f"vector_norm of order {ord!r} (with dtype= or out=)")
    return _two_norm(e, x, dim, keepdim, "vector_norm")


@converts(torch.norm, "norm")
def _norm(e, x, p="fro", dim=None, keepdim=False, dtype=None, out=None):
    """The 2-norm along dims (p = 2, or "fro": over any dims the same root of the sum of squares); other orders,
    dtype= and out= stay torch calls."""
    if p not in (2, 2.0, "fro") or dtype is not None or out is not None:
        raise Unsupported(f"norm of order {p!r} (with dtype= or out=)")
    return _two_norm(e, x, dim, keepdim, "norm")


@converts(F.normalize)
def _normalize(e, x, p=2.0, dim=1, eps=1e-12, out=None):
    """x / max(||x||_2, eps) along dim, the norm and then the clamped norm rounded to x's type, as eager's ops round
    them: in float16 an eps of 1e-12 rounds to 0, so a row of zeros gives NaN, as eager's does."""
    if p != 2 or out is not None:
        raise Unsupported(f"normalize of order {p!r} (or with out=)")
    x = _tensor(x)
    f32 = xdsl_dtype(torch.float32)
    norm = _cast(e, _two_norm(e, x, dim, True, "normalize"), f32)
    denom = _cast(e, _emit(e, MaximumOp(norm, e.const(eps, norm))), x.type.element_type)
    return _emit(e, DivOp(x, denom))


def _cast(e, x: SSAValue, elem) -> SSAValue:
    return x if x.type.element_type == elem else _emit(e, ConvertOp(x, elem))


def _one_op_in_f32(e, x, build: Callable[[SSAValue], SSAValue], what: str) -> SSAValue:
    """One torch op spelled as several `dl` ops: `build` of x in float32 (`_in_f32`), rounded to x's type once, as
    eager's one kernel computes it (each `dl` op's result is rounded to its type: in bf16 a chain of them would round,
    overflow and underflow at every step, where eager's op does once)."""
    xf, out = _in_f32(e, x, None, what)
    return _cast(e, build(xf), out)


# -- piecewise-linear activations as max/min chains ---------------------------------------------------------------
def _not_inplace(inplace: bool, what: str) -> None:
    if inplace:
        raise Unsupported(f"{what} with inplace=True")


@converts(F.hardtanh)
def _hardtanh(e, x, min_val=-1.0, max_val=1.0, inplace=False):
    """clamp(x, min_val, max_val), NaN kept, as eager's."""
    _not_inplace(inplace, "hardtanh")
    return _clamp(e, x, min_val, max_val)


@converts(F.relu6)
def _relu6(e, x, inplace=False):
    return _hardtanh(e, x, 0.0, 6.0, inplace)


@converts(F.leaky_relu)
def _leaky_relu(e, x, negative_slope=0.01, inplace=False):
    """x where x > 0, else negative_slope * x: max(x, s x) for 0 < s <= 1, min(x, s x) for s > 1 (each picks the
    same value as eager's select, infinities and NaN included). A slope of 0 or below is left to torch: there
    eager's select gives NaN for -inf (-inf * 0), which no max or min of x and s x reproduces for every input."""
    _not_inplace(inplace, "leaky_relu")
    if not isinstance(negative_slope, Number) or negative_slope <= 0:
        raise Unsupported(f"leaky_relu with negative_slope={negative_slope}")
    x = _tensor(x)
    sx = _emit(e, MulOp(x, e.const(negative_slope, x)))
    return _emit(e, (MaximumOp if negative_slope <= 1 else MinimumOp)(x, sx))


def _hard_gate(e, x, inplace: bool, swish: bool) -> SSAValue:
    """hardsigmoid = min(max(x + 3, 0), 6) / 6 and hardswish = x min(max(x + 3, 0), 6) / 6, in float32 and rounded
    once, as eager's CPU kernels compute them (its CUDA kernels multiply by 1/6: within an ulp of float32)."""
    what = "hardswish" if swish else "hardsigmoid"
    _not_inplace(inplace, what)
    xf, out = _in_f32(e, x, None, what)
    gate = _clamp(e, _emit(e, AddOp(xf, e.const(3.0, xf))), 0.0, 6.0)
    return _cast(e, _emit(e, DivOp(_emit(e, MulOp(xf, gate)) if swish else gate, e.const(6.0, xf))), out)


@converts(F.hardsigmoid)
def _hardsigmoid(e, x, inplace=False):
    return _hard_gate(e, x, inplace, swish=False)


@converts(F.hardswish)
def _hardswish(e, x, inplace=False):
    return _hard_gate(e, x, inplace, swish=True)


@converts(nn.Hardtanh, nn.ReLU6, nn.LeakyReLU, nn.Hardsigmoid, nn.Hardswish)
def _piecewise_module(e, mod, x):
    _not_inplace(mod.inplace, type(mod).__name__)
    if isinstance(mod, nn.Hardtanh):  # (nn.ReLU6 is one, with 0 and 6)
        return _clamp(e, x, mod.min_val, mod.max_val)
    if isinstance(mod, nn.LeakyReLU):
        return _leaky_relu(e, x, mod.negative_slope)
    return _hard_gate(e, x, False, swish=isinstance(mod, nn.Hardswish))


@converts(F.glu)
def _glu(e, x, dim=-1):
    """a sigmoid(b) for the halves a, b of x along dim (eager's one kernel, rounded once)."""
    x = _tensor(x)
    d = normalize_dim(dim, len(shape_of(x)))
    n = shape_of(x)[d]
    if n % 2:
        raise Unsupported(f"glu over an odd size {n}")

    def halves(xf: SSAValue) -> SSAValue:
        a, b = (_emit(e, SliceOp(xf, d, lo, lo + n // 2)) for lo in (0, n // 2))
        return _emit(e, MulOp(a, _emit(e, SigmoidOp(b))))

    return _one_op_in_f32(e, x, halves, "glu")


@converts(nn.GLU)
def _glu_module(e, mod, x):
    return _glu(e, x, mod.dim)


# -- exponential activations: max/min of the two branches, expm1 and log1p ----------------------------------------
def _const_mul(e, x: SSAValue, c: float) -> SSAValue:
    return x if c == 1 else _emit(e, MulOp(x, e.const(c, x)))


def _elu_of(e, x, alpha: float, scale: float, input_scale: float) -> SSAValue:
    """scale x where x > 0, else expm1(input_scale x) alpha scale (eager's ELU, SELU and CELU), as the sum of
    max(x, 0) scale and min(0, expm1(..) alpha scale): where x > 0 the second is 0 (expm1 of a positive number is
    positive) and where x <= 0 the first is, so each sum is eager's one branch, rounded as eager rounds it; NaN
    stays NaN. A negative alpha or scale flips those signs: left to torch."""
    if not all(isinstance(v, Number) and v > 0 for v in (alpha, scale, input_scale)):
        raise Unsupported(f"elu with alpha={alpha}, scale={scale}, input_scale={input_scale}")

    def branches(x: SSAValue) -> SSAValue:
        zero = e.const(0.0, x)
        pos = _const_mul(e, _emit(e, MaximumOp(x, zero)), scale)
        neg = _const_mul(e, _const_mul(e, _emit(e, Expm1Op(_const_mul(e, x, input_scale))), alpha), scale)
        return _emit(e, AddOp(pos, _emit(e, MinimumOp(zero, neg))))

    return _one_op_in_f32(e, x, branches, "elu")


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@converts(F.elu)
def _elu(e, x, alpha=1.0, inplace=False):
    _not_inplace(inplace, "elu")
    return _elu_of(e, x, alpha, 1.0, 1.0)


@converts(F.selu, torch.selu)
def _selu(e, x, inplace=False):
    _not_inplace(inplace, "selu")
    return _elu_of(e, x, SELU_ALPHA, SELU_SCALE, 1.0)


@converts(F.celu, torch.celu)
def _celu(e, x, alpha=1.0, inplace=False):
    _not_inplace(inplace, "celu")
    return _elu_of(e, x, alpha, 1.0, 1.0 / alpha if isinstance(alpha, Number) and alpha else 0.0)


def _log1p_exp_minus_abs(e, x: SSAValue) -> SSAValue:
    return _emit(e, Log1pOp(_emit(e, ExpOp(_emit(e, NegOp(_emit(e, AbsOp(x))))))))


def _softplus_of(e, x: SSAValue) -> SSAValue:
    """log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): no overflow of exp for large x."""
    return _emit(e, AddOp(_emit(e, MaximumOp(x, e.const(0.0, x))), _log1p_exp_minus_abs(e, x)))


# above this threshold eager's softplus returns x itself: from here on, log1p(exp(-beta x)) / beta is under half an
# ulp of x in float32, so the smooth form gives the same value (a smaller threshold is left to torch)
SOFTPLUS_SMOOTH_FROM = 17.0


@converts(F.softplus)
def _softplus(e, x, beta=1.0, threshold=20.0):
    """log1p(exp(beta x)) / beta, and x itself where beta x > threshold, as eager's: the smooth form (see
    `SOFTPLUS_SMOOTH_FROM`)."""
    if not (isinstance(beta, Number) and beta > 0 and isinstance(threshold, Number)
            and threshold >= SOFTPLUS_SMOOTH_FROM):  # fmt: skip
        raise Unsupported(f"softplus with beta={beta}, threshold={threshold}")

    def smooth(x: SSAValue) -> SSAValue:
        sp = _softplus_of(e, _const_mul(e, x, beta))
        return sp if beta == 1 else _emit(e, DivOp(sp, e.const(beta, x)))

    return _one_op_in_f32(e, x, smooth, "softplus")


@converts(F.mish)
def _mish(e, x, inplace=False):
    """x tanh(softplus(x)) (eager's mish has no threshold; its log1p(exp(x)) and the smooth form agree in float32)."""
    _not_inplace(inplace, "mish")
    return _one_op_in_f32(e, x, lambda x: _emit(e, MulOp(x, _emit(e, TanhOp(_softplus_of(e, x))))), "mish")


@converts(F.logsigmoid)
def _logsigmoid(e, x):
    """min(x, 0) - log1p(exp(-|x|)), eager's formula."""
    return _one_op_in_f32(e, x, lambda x: _emit(e, SubOp(_emit(e, MinimumOp(x, e.const(0.0, x))),
                                                           _log1p_exp_minus_abs(e, x))), "logsigmoid")


@converts(nn.ELU, nn.SELU, nn.CELU, nn.Softplus, nn.Mish, nn.LogSigmoid)
def _exponential_module(e, mod, x):
    _not_inplace(getattr(mod, "inplace", False), type(mod).__name__)
    if isinstance(mod, nn.ELU):
        return _elu(e, x, mod.alpha)
    if isinstance(mod, nn.CELU):
        return _celu(e, x, mod.alpha)
    if isinstance(mod, nn.Softplus):
        return _softplus(e, x, mod.beta, mod.threshold)
    return {nn.SELU: _selu, nn.Mish: _mish, nn.LogSigmoid: _logsigmoid}[type(mod)](e, x)


# -- matmul, linear, softmax, norms, attention, embedding ----------------------------------------
@converts(torch.matmul, operator.matmul, "matmul", "__matmul__", torch.bmm, "bmm", torch.mm, "mm")
def _matmul(e, a, b):
    a, b = _tensor(a), _tensor(b)
    if len(shape_of(a)) < 2 or len(shape_of(b)) < 2:
        raise Unsupported("matmul with a 1-D operand")
    return _emit(e, MatmulOp(a, b))


@converts(torch.addmm, "addmm", torch.ops.aten.addmm.default)
def _addmm(e, bias, a, b, *, beta=1, alpha=1):
    """bias + a @ b (GPT-2's Conv1D: x @ W + b with W [in, out]); `recognize` raises it to a linear when b is a
    weight."""
    if beta != 1 or alpha != 1:
        raise Unsupported("addmm with beta or alpha")
    return _emit(e, AddOp(_matmul(e, a, b), _tensor(bias, "bias")))


def _by_2d(e, x, w, w_dim: int) -> SSAValue:
    """x [..., K] with its last dim contracted with dim `w_dim` of a 2-D w: linear(x, w) when w is [N, K],
    x @ w when w is [K, N] (which `recognize` raises to a linear when w is a weight)."""
    x, w = _tensor(x), _tensor(w)
    if len(shape_of(x)) < 2 or len(shape_of(w)) != 2:
        raise Unsupported("not a contraction of a tensor's last dim with a 2-D one")
    return _emit(e, LinearOp(x, w)) if w_dim == 1 else _matmul(e, x, w)


@converts(torch.einsum)
def _einsum(e, equation, *operands):
    """einsum("bsd,od->bso", x, W) and the like (any letters, '...', W [N, K] or [K, N], W first or second): a
    contraction of x's last dim with one dim of a 2-D W. Other equations stay torch calls."""
    if not isinstance(equation, str):
        raise Unsupported("einsum in sublist form (operand, dims, operand, dims, ...)")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ins, arrow, out = equation.replace(" ", "").partition("->")
    specs = ins.split(",")
    if len(specs) != 2 or len(operands) != 2:
        raise Unsupported(f"einsum {equation!r} of {len(operands)} operands")
    if not arrow:  # the implicit output: the letters used once, in alphabetical order
        letters = ins.replace("...", "").replace(",", "")
        out = "..." * ("..." in ins) + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for (xs, ws), (x, w) in ((specs, operands), (specs[::-1], operands[::-1])):
        letters = xs.replace("...", "")
        if len(ws) != 2 or ws[0] == ws[1] or not xs or xs[-1] not in ws or len(set(letters)) != len(letters):
            continue
        k = ws.index(xs[-1])
        if "." not in ws + letters and ws[1 - k] not in xs and out == xs[:-1] + ws[1 - k]:
            return _by_2d(e, x, w, k)
    raise Unsupported(f"einsum {equation!r} is not a contraction of a tensor's last dim with a 2-D one")


@converts(torch.tensordot)
def _tensordot(e, a, b, dims=2, out=None):
    """tensordot(x, W, dims=([-1], [1])) (or [0], or dims=1) with W 2-D: linear(x, W) or x @ W."""
    x = _tensor(a)
    r = len(shape_of(x))
    if isinstance(dims, int) and dims == 1:
        dims = ([r - 1], [0])
    if out is not None or not isinstance(dims, (list, tuple)) or len(dims) != 2:
        raise Unsupported(f"tensordot with dims={dims}")
    da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(da) != 1 or len(db) != 1 or normalize_dim(da[0], r) != r - 1:
        raise Unsupported(f"tensordot with dims={dims}")
    return _by_2d(e, x, b, normalize_dim(db[0], 2))


@converts(F.linear, torch._C._nn.linear)
def _linear(e, x, weight, bias=None):
    return _emit(e, LinearOp(_tensor(x), _tensor(weight, "weight"), _tensor(bias, "bias") if bias is not None else None))


@converts(nn.Linear)
def _linear_module(e, mod, x):
    w = e.param(f"{e.node.target}.weight", mod.weight)
    b = e.param(f"{e.node.target}.bias", mod.bias) if mod.bias is not None else None
    return _emit(e, LinearOp(_tensor(x), w, b))


@converts(torch.softmax, F.softmax, "softmax", torch._C._nn.softmax if hasattr(torch._C._nn, "softmax") else "softmax")
def _softmax(e, x, dim=None, *args, dtype=None, _stacklevel=3, **kwargs):
    x = _tensor(x)
    if dim is None:
        raise Unsupported("softmax without dim")
    if args and isinstance(args[0], torch.dtype):
        dtype = args[0]
    if dtype is not None and x.type.element_type != xdsl_dtype(dtype):
        x = _emit(e, ConvertOp(x, xdsl_dtype(dtype)))
    return _emit(e, SoftmaxOp(x, dim))


@converts(nn.Softmax)
def _softmax_module(e, mod, x):
    return _softmax(e, x, mod.dim)


@converts(F.softmin, "softmin")
def _softmin(e, x, dim=None, *args, dtype=None, _stacklevel=3, **kwargs):
    return _softmax(e, _emit(e, NegOp(_tensor(x))), dim, *args, dtype=dtype, **kwargs)


@converts(nn.Softmin)
def _softmin_module(e, mod, x):
    return _softmin(e, x, mod.dim)


def _in_f32(e, x, dtype, what: str) -> tuple[SSAValue, Any]:
    """x in float32 (where eager computes log-softmax and logsumexp) and the result's element type: `dtype`'s if
    given, else x's."""
    x = _tensor(x)
    out = xdsl_dtype(dtype) if isinstance(dtype, torch.dtype) else x.type.element_type
    if out != x.type.element_type and dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise Unsupported(f"{what} to {dtype}")
    f32 = xdsl_dtype(torch.float32)
    return (x if x.type.element_type == f32 else _emit(e, ConvertOp(x, f32))), out


@converts(F.log_softmax, torch.log_softmax, "log_softmax", torch.special.log_softmax)
def _log_softmax(e, x, dim=None, *args, dtype=None, _stacklevel=3, **kwargs):
    """x - (max + log(sum(exp(x - max)))) along dim, in float32 and rounded once, as eager's kernels (a row of
    -inf, or one holding +inf or NaN, gives NaN as there)."""
    if dim is None:
        raise Unsupported("log_softmax without dim")
    if args and isinstance(args[0], torch.dtype):
        dtype = args[0]
    xf, out = _in_f32(e, x, dtype, "log_softmax")
    d = normalize_dim(dim, len(shape_of(xf)))
    m = _emit(e, ReduceMaxOp(xf, [d], True))
    total = _emit(e, ReduceSumOp(_emit(e, ExpOp(_emit(e, SubOp(xf, m)))), [d], True))
    return _cast(e, _emit(e, SubOp(xf, _emit(e, AddOp(m, _emit(e, LogOp(total)))))), out)


@converts(nn.LogSoftmax)
def _log_softmax_module(e, mod, x):
    return _log_softmax(e, x, mod.dim)


@converts(torch.logsumexp, "logsumexp", torch.special.logsumexp)
def _logsumexp(e, x, dim, keepdim=False, *, out=None):
    """m + log(sum(exp(x - m))) along dim(s), in float32, with m the max clamped to float32's finite range: eager
    takes m = 0 where the max is infinite, which gives the same -inf (every entry -inf) or +inf (one is +inf)."""
    if out is not None:
        raise Unsupported("logsumexp with out=")
    xf, elem = _in_f32(e, x, None, "logsumexp")
    rank = len(shape_of(xf))
    dims = sorted({normalize_dim(d, rank) for d in ([dim] if isinstance(dim, int) else dim)})
    if not dims or not rank:
        raise Unsupported("logsumexp over no dims or of a 0-d tensor")
    big = torch.finfo(torch.float32).max

    def clamped_max(keep: bool) -> SSAValue:
        m = _emit(e, ReduceMaxOp(xf, dims, keep))
        return _emit(e, MinimumOp(_emit(e, MaximumOp(m, e.const(-big, m))), e.const(big, m)))

    # (without keepdim the max is taken twice, kept for the shift and reduced for the sum: one row kernel reads
    # both, where a reshape of a computed value would end it)
    m = clamped_max(True)
    total = _emit(e, ReduceSumOp(_emit(e, ExpOp(_emit(e, SubOp(xf, m)))), dims, bool(keepdim)))
    return _cast(e, _emit(e, AddOp(_emit(e, LogOp(total)), m if keepdim else clamped_max(False))), elem)


def _last_dim_only(x: SSAValue, normalized_shape) -> None:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if ns != shape_of(x)[-1:]:
        raise Unsupported(f"normalized_shape {ns} is not the last dim")


def _filled(e, like: SSAValue, n: int, value: float, what: str) -> SSAValue:
    """A parameter of n copies of `value` in like's dtype: a LayerNorm's missing weight (ones) or bias (zeros), which
    leave each value as eager computes it without them (times 1 and plus 0 in float32)."""
    return e.param(f"{e.node.name}.{what}", torch.full((n,), value, dtype=dtype_of(like), device=e.value.device))


@converts(F.layer_norm, torch.layer_norm)
def _layer_norm(e, x, normalized_shape, weight=None, bias=None, eps=1e-5, *rest):
    x = _tensor(x)
    _last_dim_only(x, normalized_shape)
    n = shape_of(x)[-1]
    w = _filled(e, x, n, 1.0, "weight") if weight is None else _tensor(weight)
    b = _filled(e, w, n, 0.0, "bias") if bias is None else _tensor(bias)
    return _emit(e, LayerNormOp(x, w, b, eps))


@converts(nn.LayerNorm)
def _layer_norm_module(e, mod, x):
    w = e.param(f"{e.node.target}.weight", mod.weight) if mod.weight is not None else None
    b = e.param(f"{e.node.target}.bias", mod.bias) if mod.bias is not None else None
    return _layer_norm(e, x, mod.normalized_shape, w, b, mod.eps)


def _default_eps(x: SSAValue) -> float:
    """torch's rms_norm eps when none is given: the machine epsilon of the type it computes in (float32 for
    float16 and bfloat16 inputs: not their own, 64 times larger for bfloat16, which on rows of small values changed
    the result by 30%)."""
    return torch.finfo(torch.promote_types(dtype_of(x), torch.float32)).eps


if hasattr(F, "rms_norm"):

    @converts(F.rms_norm, torch.rms_norm)  # (dynamo's graphs call the latter)
    def _rms_norm(e, x, normalized_shape, weight=None, eps=None):
        x = _tensor(x)
        _last_dim_only(x, normalized_shape)
        w = _tensor(weight) if weight is not None else None
        # (torch scales by the weight in float32 and rounds once, where HF's RMSNorm rounds before the weight)
        return _emit(e, RMSNormOp(x, w, _default_eps(x) if eps is None else eps, scale_in_f32=True))

    @converts(nn.RMSNorm)
    def _rms_norm_module(e, mod, x):
        w = e.param(f"{e.node.target}.weight", mod.weight) if mod.weight is not None else None
        return _rms_norm(e, x, mod.normalized_shape, w, mod.eps)


@converts(F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
def _sdpa(e, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise Unsupported("attention dropout")
    mask = _tensor(attn_mask, "attn_mask") if attn_mask is not None else None
    q, k, v = _tensor(q), _tensor(k), _tensor(v)
    gqa = bool(enable_gqa) or SDPAOp.multi_query(q, k, v)
    return _emit(e, SDPAOp(q, k, v, mask, bool(is_causal), scale, gqa))


@converts(F.embedding)
def _embedding(e, idx, weight, padding_idx=None, max_norm=None, *rest, **kwargs):
    if max_norm is not None:
        raise Unsupported("embedding with max_norm renormalizes the weight")
    return _emit(e, EmbeddingOp(_tensor(weight), _tensor(idx, "indices")))


@converts(nn.Embedding)
def _embedding_module(e, mod, idx):
    if mod.max_norm is not None:
        raise Unsupported("embedding with max_norm renormalizes the weight")
    return _emit(e, EmbeddingOp(e.param(f"{e.node.target}.weight", mod.weight), _tensor(idx, "indices")))


@converts(torch.ops.dlblas.moe, torch.ops.dlblas.moe.default, moe)
def _moe(e, x, router_weight, w_gate_up, w_down, top_k, renormalize):
    return _emit(e, MoEOp(_tensor(x), _tensor(router_weight), _tensor(w_gate_up), _tensor(w_down), top_k, renormalize))
