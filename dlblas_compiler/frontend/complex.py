"""Complex tensors as pairs of real ones: rotary embeddings written with `torch.view_as_complex`.

Meta's Llama reference, Mistral's and many training codebases rotate q and k as complex numbers:

    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis).flatten(3)

The dialect holds real tensors only, so the importer carries each complex value as its real and imaginary parts
(`Complex`) through the few ops such code uses: `view_as_complex` (the even and odd entries of the last dim,
read as strided slices), complex buffers (their parts become two parameters), `torch.complex(re, im)` and
`torch.polar(abs, angle)` (re, im = abs*cos(angle), abs*sin(angle)), shape ops applied to both parts,
products with complex or real tensors and real scalars (DeepSeek-V2 scales its table), and `view_as_real` (the
parts interleaved again). The rotary above thus imports as `stack(xe*c - xo*s, xo*c + xe*s, -1).flatten(-2)`,
the interleaved rotary that `recognize` raises to `dl.rotary`. Any other op on a complex value is refused with a
clear error.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.ir import SSAValue

from ..dialects import AddOp, CatOp, CosOp, MulOp, ReshapeOp, SinOp, SliceOp, SubOp
from ..dialects.types import shape_of
from ..errors import FrontendError
from .converters import CONVERTERS, Unsupported


@dataclass(frozen=True)
class Complex:
    """A complex tensor as two real SSA values of its shape."""

    re: SSAValue
    im: SSAValue


# ops applied to each part alike (their other arguments are shapes, dims or indices)
SHAPE_OPS = {operator.getitem, torch.reshape, torch.unsqueeze, torch.squeeze, torch.flatten, torch.permute,
             torch.transpose, "view", "reshape", "unsqueeze", "squeeze", "flatten", "permute", "transpose",
             "expand", "contiguous", "clone", "to"}  # fmt: skip
MULTIPLY = {operator.mul, torch.mul, "mul", "__mul__", "__rmul__"}


def is_complex(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.is_complex()


def convert(importer: Any, n: Any, args: tuple, kwargs: dict, value: Any) -> Complex | SSAValue:
    """The Complex (or, for view_as_real, the real SSA value) of node n, whose value or an argument is complex."""
    e, target = importer.emitter, n.target
    emit = lambda op: e.emit(op).results[0]  # noqa: E731
    where = f"node '{n.name}' ({n.format_node()})"
    if target is torch.view_as_complex:
        (x,) = args
        return _from_pairs(importer, n.args[0], x, emit)
    if target in (torch.complex, torch.polar) and not kwargs and all(isinstance(a, SSAValue) for a in args):
        a, b = args  # (real, imag) or (abs, angle): a rotary table computed in forward
        if target is torch.polar:
            return Complex(emit(MulOp(a, emit(CosOp(b)))), emit(MulOp(a, emit(SinOp(b)))))
        if shape_of(a) == shape_of(b):
            return Complex(a, b)
    if target is torch.view_as_real:
        (c,) = args
        shape = shape_of(c.re)
        parts = [emit(ReshapeOp(p, [*shape, 1])) for p in (c.re, c.im)]
        return emit(CatOp(parts, len(shape)))
    if target in MULTIPLY and not kwargs:
        a, b = args
        if isinstance(a, Complex) and isinstance(b, Complex):
            re = emit(SubOp(emit(MulOp(a.re, b.re)), emit(MulOp(a.im, b.im))))
            im = emit(AddOp(emit(MulOp(a.re, b.im)), emit(MulOp(a.im, b.re))))
            return Complex(re, im)
        c, r = (a, b) if isinstance(a, Complex) else (b, a)
        if isinstance(r, (int, float)) and not isinstance(r, bool):  # a real scalar (a rotary table's scaling)
            r = e.const(r, c.re)
        if isinstance(r, SSAValue):
            return Complex(emit(MulOp(c.re, r)), emit(MulOp(c.im, r)))
    if target in SHAPE_OPS:
        c = args[0]
        if isinstance(c, Complex) and not any(isinstance(a, Complex) for a in (*args[1:], *kwargs.values())):
            if target == "to" and any(isinstance(a, torch.dtype) for a in (*args[1:], *kwargs.values())):
                raise FrontendError(f"{where}: a complex cast is not supported")
            conv = CONVERTERS.get(target)
            if conv is not None:
                real = torch.empty(value.shape, dtype=torch.float32, device="meta")
                e.node, e.value, e.inserted = n, real, []
                try:
                    return Complex(conv(e, c.re, *args[1:], **kwargs), conv(e, c.im, *args[1:], **kwargs))
                except Unsupported as why:
                    raise FrontendError(f"{where}: on a complex tensor: {why}") from why
                finally:
                    e.node = None
    raise FrontendError(
        f"{where} works on a complex tensor; dlblas_compiler carries complex values only through view_as_complex, "
        "view_as_real, torch.complex, torch.polar, products and shape ops (the rotary embedding written with complex "
        "numbers)"
    )


def _from_pairs(importer: Any, node: Any, x: SSAValue, emit) -> Complex:
    """view_as_complex(x), x [..., 2]: the parts x[..., 0] and x[..., 1]; when x is y.reshape(..., n, 2) (or a
    view of y that only splits its last dim) of a real y [..., 2n], the strided slices y[..., ::2] and y[..., 1::2]
    instead, the form of the interleaved rotary."""
    shape = shape_of(x)
    y = importer.env.get(node.args[0]) if node.op in ("call_method", "call_function") and node.args else None
    if isinstance(y, SSAValue) and node.target in ("reshape", "view", torch.reshape):
        ys = shape_of(y)
        if ys[:-1] == shape[:-2] and ys[-1] == 2 * shape[-2]:
            return Complex(*(emit(SliceOp(y, len(ys) - 1, s, ys[-1], 2)) for s in (0, 1)))
    parts = [emit(SliceOp(x, len(shape) - 1, s, s + 1)) for s in (0, 1)]
    return Complex(*(emit(ReshapeOp(p, list(shape[:-1]))) for p in parts))


def of_real_view(importer: Any, arg: SSAValue) -> Complex:
    """A complex input, passed as its real view [..., 2] (Imported.complex_inputs): its two parts."""
    shape = shape_of(arg)
    parts = [importer.emitter.emit(SliceOp(arg, len(shape) - 1, s, s + 1)).results[0] for s in (0, 1)]
    return Complex(*(importer.emitter.emit(ReshapeOp(p, list(shape[:-1]))).results[0] for p in parts))


def param_parts(importer: Any, target: str, t: torch.Tensor) -> Complex:
    """A complex module tensor (a rotary table): its real and imaginary parts as two parameters, copied at
    compile time (a later in-place change of the buffer is not seen)."""
    parts = []
    for tag, part in (("real", t.real), ("imag", t.imag)):
        part = part.detach().contiguous()
        parts.append(importer._emit_param(importer._param_name(f"{target}.{tag}", part), part))
    return Complex(*parts)
