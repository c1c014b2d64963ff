"""Many-to-many ops (reductions, matmul, linear, softmax, norms, attention, embedding) and the
composite ops the `recognize` pass raises decomposed code to (rms_norm, add_rms_norm, rotary, glu).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from xdsl.dialects.builtin import (
    AnyTensorType,
    BoolAttr,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from .traits import MANY_TO_MANY, ONE_TO_ONE, SHUFFLE
from .types import DLFloatTensor, broadcast_shapes, dims_match, dtype_of, elem_of, normalize_dim, promote, shape_of


def _bool(v: bool) -> BoolAttr:
    return IntegerAttr.from_bool(bool(v))


def _float(v: float) -> FloatAttr:
    return FloatAttr(float(v), f64)


class ReduceOp(IRDLOperation):
    """Reduction over `dims` (kept as size 1 when `keepdim`)."""

    input = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    dims = prop_def(DenseArrayBase)
    keepdim = prop_def(BoolAttr, _bool(False))
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)
    TRITON_COMBINE: ClassVar[str] = ""

    def __init__(self, x: SSAValue, dims: Sequence[int], keepdim: bool = False):
        shape = shape_of(x)
        nd = sorted({normalize_dim(d, len(shape)) for d in dims})
        out = [1 if i in nd else s for i, s in enumerate(shape) if keepdim or i not in nd]
        super().__init__(
            operands=[x],
            result_types=[TensorType(elem_of(x), out)],
            properties={"dims": DenseArrayBase.from_list(i64, nd), "keepdim": _bool(keepdim)},
        )

    @property
    def axes(self) -> tuple[int, ...]:
        return tuple(self.dims.get_values())

    @property
    def keep(self) -> bool:
        return bool(self.keepdim.value.data)

    def verify_(self):
        shape = shape_of(self.input)
        if not self.axes or any(not 0 <= d < len(shape) for d in self.axes) or len(set(self.axes)) != len(self.axes):
            raise VerifyException(f"{self.name}: dims {list(self.axes)} are not distinct dims of {shape}")
        out = tuple(1 if i in self.axes else s for i, s in enumerate(shape) if self.keep or i not in self.axes)
        if out != shape_of(self.result) or elem_of(self.input) != elem_of(self.result):
            raise VerifyException(f"{self.name}: result should be {out} of {elem_of(self.input)}, got {self.result.type}")


@irdl_op_definition
class ReduceSumOp(ReduceOp):
    """`dl.reduce_sum`: torch.sum(x, dims, keepdim)."""

    name = "dl.reduce_sum"
    TRITON_COMBINE: ClassVar[str] = "sum"

    def reference(self, x):
        return torch.sum(x, self.axes, keepdim=self.keep)


@irdl_op_definition
class ReduceMeanOp(ReduceOp):
    """`dl.reduce_mean`: torch.mean(x, dims, keepdim)."""

    name = "dl.reduce_mean"
    TRITON_COMBINE: ClassVar[str] = "mean"

    def reference(self, x):
        return torch.mean(x, self.axes, keepdim=self.keep)


@irdl_op_definition
class ReduceMaxOp(ReduceOp):
    """`dl.reduce_max`: torch.amax(x, dims, keepdim)."""

    name = "dl.reduce_max"
    TRITON_COMBINE: ClassVar[str] = "max"

    def reference(self, x):
        return torch.amax(x, self.axes, keepdim=self.keep)


@irdl_op_definition
class MatmulOp(IRDLOperation):
    """`dl.matmul`: torch.matmul for rank >= 2 operands, batch dims broadcast."""

    name = "dl.matmul"
    lhs = operand_def(DLFloatTensor)
    rhs = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = "$lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"

    def __init__(self, a: SSAValue, b: SSAValue):
        super().__init__(operands=[a, b], result_types=[self.infer(a.type, b.type)])

    @staticmethod
    def infer(a: TensorType, b: TensorType) -> TensorType:
        sa, sb = a.get_shape(), b.get_shape()
        if len(sa) < 2 or len(sb) < 2:
            raise VerifyException(f"dl.matmul needs rank >= 2 operands, got {a} and {b}")
        if not dims_match(sa[-1], sb[-2]):
            raise VerifyException(f"dl.matmul: contraction dims differ: {a} @ {b}")
        if a.element_type != b.element_type:
            raise VerifyException(f"dl.matmul: element types differ: {a} @ {b}")
        batch = broadcast_shapes(sa[:-2], sb[:-2])
        return TensorType(a.element_type, [*batch, sa[-2], sb[-1]])

    def verify_(self):
        want = self.infer(self.lhs.type, self.rhs.type)
        if want != self.result.type:
            raise VerifyException(f"dl.matmul: {self.lhs.type} @ {self.rhs.type} gives {want}, not {self.result.type}")

    def reference(self, a, b):
        return torch.matmul(a, b)


@irdl_op_definition
class LinearOp(IRDLOperation):
    """`dl.linear`: x @ weight.T (+ bias), as nn.Linear / F.linear: x [..., K], weight [N, K], bias [N]."""

    name = "dl.linear"
    input = operand_def(DLFloatTensor)
    weight = operand_def(DLFloatTensor)
    bias = opt_operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), MANY_TO_MANY)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = (
        "$input `,` $weight (`bias` $bias^)? attr-dict `:` type($input) `,` type($weight) (`,` type($bias)^)? `->` type($result)"
    )

    def __init__(self, x: SSAValue, w: SSAValue, b: SSAValue | None = None):
        out = [*shape_of(x)[:-1], shape_of(w)[0]]
        super().__init__(operands=[x, w, b], result_types=[TensorType(elem_of(x), out)])

    def verify_(self):
        sx, sw = shape_of(self.input), shape_of(self.weight)
        if len(sw) != 2 or not sx or not dims_match(sx[-1], sw[1]):
            raise VerifyException(f"dl.linear: input {self.input.type} does not match weight {self.weight.type} ([N, K])")
        if elem_of(self.input) != elem_of(self.weight):
            raise VerifyException(f"dl.linear: input and weight element types differ ({self.input.type}, {self.weight.type})")
        if self.bias is not None and (shape_of(self.bias) != (sw[0],) or elem_of(self.bias) != elem_of(self.weight)):
            raise VerifyException(f"dl.linear: bias {self.bias.type} should be tensor<{sw[0]}x{elem_of(self.weight)}>")
        if shape_of(self.result) != (*sx[:-1], sw[0]) or elem_of(self.result) != elem_of(self.input):
            raise VerifyException(f"dl.linear: result should be {(*sx[:-1], sw[0])}, got {self.result.type}")

    def reference(self, x, w, b=None):
        return F.linear(x, w, b)


@irdl_op_definition
class SoftmaxOp(IRDLOperation):
    """`dl.softmax`: softmax along `dim`, computed in fp32, result in the input dtype."""

    name = "dl.softmax"
    T: ClassVar = VarConstraint("T", DLFloatTensor)
    input = operand_def(T)
    result = result_def(T)
    dim = prop_def(IntegerAttr)
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = "$input attr-dict `:` type($input)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, x: SSAValue, dim: int):
        d = normalize_dim(dim, len(shape_of(x)))
        super().__init__(operands=[x], result_types=[x.type], properties={"dim": IntegerAttr(d, i64)})

    @property
    def axis(self) -> int:
        return self.dim.value.data

    def verify_(self):
        if not 0 <= self.axis < len(shape_of(self.input)) or self.input.type != self.result.type:
            raise VerifyException(f"dl.softmax: bad dim {self.axis} or result type for {self.input.type}")

    def reference(self, x):
        return torch.softmax(x, self.axis)


def _check_row_param(op: IRDLOperation, x: SSAValue, p: SSAValue | None, what: str):
    if p is not None and shape_of(p) != shape_of(x)[-1:]:
        raise VerifyException(f"{op.name}: {what} {p.type} must be rank-1 of size {shape_of(x)[-1]} (the last dim of {x.type})")


@irdl_op_definition
class RMSNormOp(IRDLOperation):
    """`dl.rms_norm`: y = x * rsqrt(mean(x^2, -1) + eps) * (weight + offset), statistics in fp32.

    Default (Llama): the normalized value is cast to x's dtype, then scaled by the weight, so the result
    dtype is promote(x, weight). With `scale_in_f32` (Gemma): scaled in fp32, then cast to x's dtype.
    Without a weight (after the weight was folded into a following matmul) y = normalized, in x's dtype.
    """

    name = "dl.rms_norm"
    input = operand_def(DLFloatTensor)
    weight = opt_operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    eps = prop_def(FloatAttr)
    offset = prop_def(FloatAttr, _float(0.0))
    scale_in_f32 = prop_def(BoolAttr, _bool(False))
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = (
        "$input (`weight` $weight^)? attr-dict `:` type($input) (`,` type($weight)^)? `->` type($result)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(
        self, x: SSAValue, w: SSAValue | None, eps: float, offset: float = 0.0, scale_in_f32: bool = False
    ):
        super().__init__(
            operands=[x, w],
            result_types=[TensorType(self.result_elem(x, w, scale_in_f32), shape_of(x))],
            properties={"eps": _float(eps), "offset": _float(offset), "scale_in_f32": _bool(scale_in_f32)},
        )

    @staticmethod
    def result_elem(x: SSAValue, w: SSAValue | None, scale_in_f32: bool) -> Attribute:
        return elem_of(x) if scale_in_f32 or w is None else promote([elem_of(x), elem_of(w)], [1, 1])

    @property
    def attrs(self) -> tuple[float, float, bool]:
        return self.eps.value.data, self.offset.value.data, bool(self.scale_in_f32.value.data)

    def verify_(self):
        _check_row_param(self, self.input, self.weight, "weight")
        want = TensorType(self.result_elem(self.input, self.weight, self.attrs[2]), shape_of(self.input))
        if self.result.type != want:
            raise VerifyException(f"dl.rms_norm: result should be {want}, got {self.result.type}")

    def reference(self, x, w=None):
        return rms_norm_reference(x, w, *self.attrs)


def rms_norm_reference(x, w, eps: float, offset: float = 0.0, scale_in_f32: bool = False):
    """RMSNorm in torch: statistics in float32 (float64 stays float64), see dl.rms_norm."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is None:
        return normed.to(x.dtype)
    if scale_in_f32:
        return (normed * (w.float() + offset)).to(x.dtype)
    return (w + offset if offset else w) * normed.to(x.dtype)


@irdl_op_definition
class AddRMSNormOp(IRDLOperation):
    """`dl.add_rms_norm`: s = x + residual; returns (rms_norm(s, weight), s). Both results may be live."""

    name = "dl.add_rms_norm"
    input = operand_def(DLFloatTensor)
    residual = operand_def(DLFloatTensor)
    weight = opt_operand_def(DLFloatTensor)
    normed = result_def(DLFloatTensor)
    sum = result_def(DLFloatTensor)
    eps = prop_def(FloatAttr)
    offset = prop_def(FloatAttr, _float(0.0))
    scale_in_f32 = prop_def(BoolAttr, _bool(False))
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = (
        "$input `,` $residual (`weight` $weight^)? attr-dict `:` type($input) `,` type($residual) (`,` type($weight)^)?"
        " `->` `(` type($normed) `,` type($sum) `)`"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(
        self, x: SSAValue, r: SSAValue, w: SSAValue | None, eps: float, offset: float = 0.0, scale_in_f32: bool = False
    ):
        s = TensorType(promote([elem_of(x), elem_of(r)], [1, 1]), broadcast_shapes(shape_of(x), shape_of(r)))
        if w is None or scale_in_f32:
            normed = TensorType(s.element_type, s.get_shape())
        else:
            normed = TensorType(promote([s.element_type, elem_of(w)], [1, 1]), s.get_shape())
        super().__init__(
            operands=[x, r, w],
            result_types=[normed, s],
            properties={"eps": _float(eps), "offset": _float(offset), "scale_in_f32": _bool(scale_in_f32)},
        )

    @property
    def attrs(self) -> tuple[float, float, bool]:
        return self.eps.value.data, self.offset.value.data, bool(self.scale_in_f32.value.data)

    def verify_(self):
        if shape_of(self.input) != shape_of(self.residual) or shape_of(self.sum) != shape_of(self.input):
            raise VerifyException(f"dl.add_rms_norm: input {self.input.type} and residual {self.residual.type} must match")
        _check_row_param(self, self.input, self.weight, "weight")

    def reference(self, x, r, w=None):
        s = x + r
        return rms_norm_reference(s, w, *self.attrs), s


@irdl_op_definition
class LayerNormOp(IRDLOperation):
    """`dl.layer_norm`: F.layer_norm over the last dim with weight and bias."""

    name = "dl.layer_norm"
    input = operand_def(DLFloatTensor)
    weight = operand_def(DLFloatTensor)
    bias = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    eps = prop_def(FloatAttr)
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = (
        "$input `,` $weight `,` $bias attr-dict `:` `(` type($input) `,` type($weight) `,` type($bias) `)` `->` type($result)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, x: SSAValue, w: SSAValue, b: SSAValue, eps: float):
        super().__init__(operands=[x, w, b], result_types=[x.type], properties={"eps": _float(eps)})

    def verify_(self):
        _check_row_param(self, self.input, self.weight, "weight")
        _check_row_param(self, self.input, self.bias, "bias")
        if self.result.type != self.input.type:
            raise VerifyException(f"dl.layer_norm: result must be {self.input.type}")

    def reference(self, x, w, b):
        return F.layer_norm(x, x.shape[-1:], w, b, self.eps.value.data)


ROTARY_LAYOUTS = ("half", "interleaved")


@irdl_op_definition
class RotaryOp(IRDLOperation):
    """`dl.rotary`: rotary position embedding on the first `rotary_dim` entries of the last dim.

    cos and sin broadcast to x[..., :rotary_dim]. `layout = "half"` rotates (x1, x2) = halves
    (HF/NeoX `rotate_half`); `"interleaved"` rotates even/odd pairs (GPT-J). Entries past
    `rotary_dim` pass through (partial rotary).
    """

    name = "dl.rotary"
    input = operand_def(DLFloatTensor)
    cos = operand_def(DLFloatTensor)
    sin = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    layout = prop_def(StringAttr, StringAttr("half"))
    rotary_dim = prop_def(IntegerAttr)
    traits = traits_def(Pure(), SHUFFLE)
    assembly_format = "$input `,` $cos `,` $sin attr-dict `:` `(` type($input) `,` type($cos) `,` type($sin) `)` `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, x: SSAValue, cos: SSAValue, sin: SSAValue, layout: str = "half", rotary_dim: int | None = None):
        rd = shape_of(x)[-1] if rotary_dim is None else rotary_dim
        elem = promote([elem_of(x), elem_of(cos), elem_of(sin)], [1, 1, 1])
        super().__init__(
            operands=[x, cos, sin],
            result_types=[TensorType(elem, shape_of(x))],
            properties={"layout": StringAttr(layout), "rotary_dim": IntegerAttr(rd, i64)},
        )

    @property
    def dim(self) -> int:
        return self.rotary_dim.value.data

    def verify_(self):
        x = shape_of(self.input)
        rd = self.dim
        if self.layout.data not in ROTARY_LAYOUTS:
            raise VerifyException(f"dl.rotary: layout must be one of {ROTARY_LAYOUTS}, got {self.layout.data!r}")
        if rd <= 0 or rd % 2 or rd > x[-1]:
            raise VerifyException(f"dl.rotary: rotary_dim {rd} must be even and at most {x[-1]}")
        for t in (self.cos, self.sin):
            if shape_of(t)[-1] != rd or broadcast_shapes((*x[:-1], rd), shape_of(t)) != (*x[:-1], rd):
                raise VerifyException(f"dl.rotary: {t.type} does not broadcast to {(*x[:-1], rd)}")

    def reference(self, x, cos, sin):
        return rotary_reference(x, cos, sin, self.layout.data, self.dim)


def rotary_reference(x, cos, sin, layout: str, rotary_dim: int):
    xr, xp = x[..., :rotary_dim], x[..., rotary_dim:]
    if layout == "half":
        h = rotary_dim // 2
        rot = torch.cat((-xr[..., h:], xr[..., :h]), dim=-1)
    else:
        rot = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    out = xr * cos + rot * sin
    return torch.cat((out, xp.to(out.dtype)), dim=-1) if xp.shape[-1] else out


GLU_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}


@irdl_op_definition
class GluOp(IRDLOperation):
    """`dl.glu`: act(gate) * up, the gated activation of SwiGLU (`silu`) and GeGLU (`gelu`, `gelu_tanh`) MLPs."""

    name = "dl.glu"
    gate = operand_def(DLFloatTensor)
    up = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    act = prop_def(StringAttr, StringAttr("silu"))
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = "$gate `,` $up attr-dict `:` `(` type($gate) `,` type($up) `)` `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, gate: SSAValue, up: SSAValue, act: str = "silu"):
        shape = broadcast_shapes(shape_of(gate), shape_of(up))
        elem = promote([elem_of(gate), elem_of(up)], [1, 1])
        super().__init__(operands=[gate, up], result_types=[TensorType(elem, shape)], properties={"act": StringAttr(act)})

    def verify_(self):
        if self.act.data not in GLU_ACTIVATIONS:
            raise VerifyException(f"dl.glu: act must be one of {sorted(GLU_ACTIVATIONS)}, got {self.act.data!r}")
        if shape_of(self.gate) != shape_of(self.up):
            raise VerifyException(f"dl.glu: gate {self.gate.type} and up {self.up.type} must have one shape")

    def reference(self, gate, up):
        return GLU_ACTIVATIONS[self.act.data](gate) * up


MASKED_ROWS = ("zero", "nan")
# how a boolean mask drops keys: "sdpa" (True keeps; -inf is added to a dropped key's score, so a NaN or +inf
# score there still makes its row NaN, as torch's SDPA gives), "keep" (True keeps; a dropped key's score is
# replaced by -inf and leaves no trace: softmax(where(mask, s, -inf))), "drop" (True drops, replaced by -inf:
# softmax(s.masked_fill(mask, -inf)))
MASK_MODES = ("sdpa", "keep", "drop")


def _aligned(t):
    """t itself when its data is 16-byte aligned, else an aligned copy."""
    return t if t is None or t.device.type == "meta" or t.data_ptr() % 16 == 0 else t.clone()


@irdl_op_definition
class SDPAOp(IRDLOperation):
    """`dl.sdpa`: softmax(q k^T * scale + mask) v (F.scaled_dot_product_attention, no dropout).

    q [..., Hq, S, D], k [..., Hk, L, D], v [..., Hk, L, Dv]; Hq a multiple of Hk with `enable_gqa`.
    The mask (optional) is additive (float) or boolean (True = keep) and broadcasts to [..., Hq, S, L].

    A row whose keys are all masked out (every mask entry False or -inf) has no softmax. `masked_rows`
    says what it gives: "zero" (F.scaled_dot_product_attention, torch >= 2.5) or "nan" (the explicit
    `softmax(q @ k^T * scale + mask) @ v` that `recognize` raises: softmax of an all -inf row is NaN). The
    explicit form's other non-finite rows follow from its math too (a NaN score makes its row NaN), where torch's
    fused SDPA kernels may give 0 (the CPU's flash kernel for a row whose scores are all NaN: fuzz finding
    8297d26b99c1): its reference runs torch's math kernel.

    `mask_mode` (MASK_MODES) says how a boolean mask drops keys: as SDPA does, or as an explicit form that
    selects -inf for the dropped scores (`where`, `masked_fill`), where a dropped key's NaN score leaves no trace.
    """

    name = "dl.sdpa"
    query = operand_def(DLFloatTensor)
    key = operand_def(DLFloatTensor)
    value = operand_def(DLFloatTensor)
    mask = opt_operand_def(AnyTensorType)
    result = result_def(DLFloatTensor)
    is_causal = prop_def(BoolAttr, _bool(False))
    scale = opt_prop_def(FloatAttr)
    enable_gqa = prop_def(BoolAttr, _bool(False))
    masked_rows = prop_def(StringAttr, StringAttr("zero"))
    mask_mode = prop_def(StringAttr, StringAttr("sdpa"))
    mask_fill = opt_prop_def(FloatAttr)  # what mask_mode "keep" / "drop" puts in a dropped score (default -inf)
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = (
        "$query `,` $key `,` $value (`mask` $mask^)? attr-dict `:` type($query) `,` type($key) `,` type($value)"
        " (`,` type($mask)^)? `->` type($result)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(
        self, q, k, v, mask=None, is_causal=False, scale: float | None = None, enable_gqa=False, masked_rows="zero",
        mask_mode="sdpa", mask_fill: float | None = None,
    ):
        out = [*shape_of(q)[:-1], shape_of(v)[-1]]
        props: dict[str, Attribute] = {
            "is_causal": _bool(is_causal), "enable_gqa": _bool(enable_gqa), "masked_rows": StringAttr(masked_rows),
            "mask_mode": StringAttr(mask_mode),
        }
        if scale is not None:
            props["scale"] = _float(scale)
        if mask_fill is not None:
            props["mask_fill"] = _float(mask_fill)
        super().__init__(operands=[q, k, v, mask], result_types=[TensorType(elem_of(q), out)], properties=props)

    @staticmethod
    def multi_query(q: SSAValue, k: SSAValue, v: SSAValue) -> bool:
        """k and v have one head that torch broadcasts over q's heads (multi-query attention, spelled without
        enable_gqa): the same as enable_gqa with one group."""
        heads = [shape_of(t)[-3] if len(shape_of(t)) >= 3 else None for t in (q, k, v)]
        return heads[1] == heads[2] == 1 and heads[0] != 1

    @property
    def softmax_scale(self) -> float:
        return self.scale.value.data if self.scale is not None else 1.0 / math.sqrt(shape_of(self.query)[-1])

    @property
    def causal(self) -> bool:
        return bool(self.is_causal.value.data)

    @property
    def gqa(self) -> bool:
        return bool(self.enable_gqa.value.data)

    @property
    def mode(self) -> str:
        return self.mask_mode.data

    @property
    def fill(self) -> float:
        """The score of a key mask_mode "keep" / "drop" drops: -inf, or a finite value (the Annotated Transformer's
        -1e9): then every key still counts, and a row that keeps none averages every value."""
        return self.mask_fill.value.data if self.mask_fill is not None else -math.inf

    @property
    def mask_semantics(self) -> dict:
        """The constructor's arguments saying what the mask does (`masked_rows`, `mask_mode`, `mask_fill`): for a
        rewrite that makes this op again over other operands."""
        fill = self.fill if self.mask_fill is not None else None
        return {"masked_rows": self.masked_rows.data, "mask_mode": self.mode, "mask_fill": fill}

    @property
    def nan_rows(self) -> bool:
        """Fully masked rows give NaN (the explicit softmax form), not 0 (SDPA's)."""
        return self.masked_rows.data == "nan"

    def verify_(self):
        q, k, v = shape_of(self.query), shape_of(self.key), shape_of(self.value)
        if not (len(q) == len(k) == len(v) >= 3):
            raise VerifyException(f"dl.sdpa: q, k, v must share a rank >= 3, got {q}, {k}, {v}")
        if q[-1] != k[-1] or k[-2] != v[-2] or k[:-3] != v[:-3] or q[:-3] != k[:-3]:
            raise VerifyException(f"dl.sdpa: shapes q {q}, k {k}, v {v} do not match")
        hq, hk = q[-3], k[-3]
        if hq != hk and not (self.gqa and hk and hq % hk == 0):
            raise VerifyException(f"dl.sdpa: {hq} query heads vs {hk} key heads needs enable_gqa and divisibility")
        if len({elem_of(self.query), elem_of(self.key), elem_of(self.value)}) != 1:
            raise VerifyException("dl.sdpa: q, k and v must share an element type")
        if self.masked_rows.data not in MASKED_ROWS:
            raise VerifyException(f"dl.sdpa: masked_rows must be one of {MASKED_ROWS}, got {self.masked_rows.data!r}")
        if self.mask is not None:
            m = shape_of(self.mask)
            if broadcast_shapes(m, (*q[:-1], k[-2])) != (*q[:-1], k[-2]):
                raise VerifyException(f"dl.sdpa: mask {m} does not broadcast to {(*q[:-1], k[-2])}")
            et = elem_of(self.mask)
            if isinstance(et, IntegerType) and et.width.data != 1:
                raise VerifyException(f"dl.sdpa: mask must be boolean or float, got {self.mask.type}")
        if self.mode not in MASK_MODES:
            raise VerifyException(f"dl.sdpa: mask_mode must be one of {MASK_MODES}, got {self.mode!r}")
        if self.mode != "sdpa" and (self.mask is None or dtype_of(self.mask) != torch.bool):
            raise VerifyException(f"dl.sdpa: mask_mode {self.mode!r} needs a boolean mask")
        if self.mask_fill is not None and (self.mode == "sdpa" or math.isnan(self.fill) or self.fill == math.inf):
            raise VerifyException(f"dl.sdpa: mask_fill {self.fill} needs mask_mode keep or drop and a value below inf")

    def reference(self, q, k, v, mask=None):
        # torch's fused CUDA kernels read misaligned operands wrongly (a view with a storage offset: garbage or
        # "misaligned address"); an explicit softmax form raised to dl.sdpa must not meet that where eager didn't
        q, k, v, mask = (_aligned(t) for t in (q, k, v, mask))
        if self.mode != "sdpa":
            return self._selected(q, k, v, mask if self.mode == "keep" else ~mask)
        causal = self.causal
        if causal and mask is not None:  # torch takes one or the other: fold the causal mask (top-left aligned) in
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            mask = mask & keep if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))
            causal = False
        with sdpa_kernel([SDPBackend.MATH]) if self.nan_rows else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale, enable_gqa=self.gqa
            )
        if mask is not None and (self.nan_rows or mask.dtype == torch.bool):
            # a row with every key masked: NaN for the explicit softmax form; for a boolean mask what eager's math
            # (torch's CPU kernel) gives, where torch 2.11's cuDNN kernel on an H200 gave other values (fuzz
            # finding d27da18bbe2d): set here, the result does not depend on which implementation ran. (An
            # additive mask of -inf's row stays as torch gives it: NaN, eager's value.)
            masked = ~mask if mask.dtype == torch.bool else mask == float("-inf")
            empty = masked.expand(*out.shape[:-1], k.shape[-2]).all(-1, keepdim=True)
            fill = float("nan") if self.nan_rows else self._masked_rows(q, k, v)
            out = torch.where(empty, fill, out)
        return out

    def _selected(self, q, k, v, keep):
        """The explicit form `mask_mode` names, as eager computes it: softmax(where(keep, q k^T * scale, fill)) v
        (with a fill of -inf, a row that keeps no key is NaN)."""
        if self.gqa:
            groups = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
        s = (q @ k.transpose(-1, -2)) * self.softmax_scale
        s = s.masked_fill(~keep, self.fill)
        if self.causal:
            future = ~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(future, -math.inf)
        return s.softmax(-1) @ v

    def _masked_rows(self, q, k, v):
        """What eager's math gives a row whose keys a boolean mask all drops: softmax(s + mask) @ v with every
        mask entry -inf is 0 @ v, unless a score is NaN or +inf (then NaN + -inf or inf - inf: the row is NaN),
        and 0 @ v is NaN in a column of v holding NaN or inf (0 * inf). A score is taken to be NaN or +inf where
        the row's query or any key holds NaN or inf (exact for NaN; an inf gives +inf scores for keys of one sign
        of product only, almost surely some; a score overflowing from finite operands is not seen): reductions
        over q, k and v, no scores computed, so a reference chosen for its speed stays fast. Broadcasts over the
        rows."""
        groups = q.shape[-3] // k.shape[-3]
        bad_k = (~torch.isfinite(k)).flatten(-2).any(-1)[..., None, None]  # [..., Hk, 1, 1]
        zero_v = (v * 0).sum(-2, keepdim=True)  # [..., Hk, 1, Dv]: NaN where a column holds NaN or inf
        if groups > 1:
            bad_k, zero_v = (t.repeat_interleave(groups, dim=-3) for t in (bad_k, zero_v))
        bad = (~torch.isfinite(q)).any(-1, keepdim=True) | bad_k  # [..., Hq, S, 1]
        return torch.where(bad, float("nan"), zero_v)


@irdl_op_definition
class EmbeddingOp(IRDLOperation):
    """`dl.embedding`: weight[indices] (nn.Embedding / F.embedding); indices are i32 or i64."""

    name = "dl.embedding"
    weight = operand_def(DLFloatTensor)
    indices = operand_def(TensorType.constr(BaseAttr(IntegerType)))
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = "$weight `,` $indices attr-dict `:` `(` type($weight) `,` type($indices) `)` `->` type($result)"

    def __init__(self, w: SSAValue, idx: SSAValue):
        super().__init__(operands=[w, idx], result_types=[TensorType(elem_of(w), [*shape_of(idx), shape_of(w)[1]])])

    def verify_(self):
        w = shape_of(self.weight)
        if len(w) != 2 or shape_of(self.result) != (*shape_of(self.indices), w[1]):
            raise VerifyException(f"dl.embedding: weight {self.weight.type} and indices {self.indices.type} give the wrong result")
        if elem_of(self.indices).width.data not in (32, 64):
            raise VerifyException(f"dl.embedding: indices must be i32 or i64, got {self.indices.type}")

    def reference(self, w, idx):
        return F.embedding(idx, w)


@irdl_op_definition
class MoEOp(IRDLOperation):
    """`dl.moe`: a sparse mixture of SwiGLU experts with a softmax top-k router (Mixtral / Qwen2-MoE).

    x [T, H], router_weight [E, H], w_gate_up [E, 2I, H] (gate rows first), w_down [E, H, I] -> [T, H]:
    probs = softmax(x @ router_weight^T in float32), top_k experts per token (weights renormalized to sum 1
    when `renormalize`), out[t] = sum_j w_j * w_down[e_j] @ (silu(gate[e_j] @ x[t]) * (up[e_j] @ x[t])).
    Never fused: it runs as the library's topk_gating + fused_moe kernels, or as EPMoE over a process group.
    """

    name = "dl.moe"
    UNFUSED: ClassVar[str] = "runs as the MoE library kernels (topk_gating + fused_moe, or EPMoE over a process group)"
    x = operand_def(DLFloatTensor)
    router_weight = operand_def(DLFloatTensor)
    w_gate_up = operand_def(DLFloatTensor)
    w_down = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    top_k = prop_def(IntegerAttr)
    renormalize = prop_def(BoolAttr)
    traits = traits_def(Pure(), MANY_TO_MANY)
    assembly_format = (
        "$x `,` $router_weight `,` $w_gate_up `,` $w_down attr-dict `:` "
        "`(` type($x) `,` type($router_weight) `,` type($w_gate_up) `,` type($w_down) `)` `->` type($result)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, x: SSAValue, router_w: SSAValue, w_gate_up: SSAValue, w_down: SSAValue, top_k: int, renormalize: bool):
        props = {"top_k": IntegerAttr(int(top_k), i64), "renormalize": _bool(renormalize)}
        super().__init__(operands=[x, router_w, w_gate_up, w_down], result_types=[x.type], properties=props)

    @property
    def attrs(self) -> tuple[int, bool]:
        return self.top_k.value.data, bool(self.renormalize.value.data)

    def verify_(self):
        x, r, gu, d = (shape_of(v) for v in (self.x, self.router_weight, self.w_gate_up, self.w_down))
        k, _ = self.attrs
        ok = len(x) == 2 and len(r) == 2 and len(gu) == 3 and len(d) == 3
        if not ok or not (r[1] == gu[2] == d[1] == x[1] and r[0] == gu[0] == d[0] and gu[1] == 2 * d[2]):
            raise VerifyException(
                f"dl.moe: need x [T, H], router_weight [E, H], w_gate_up [E, 2I, H], w_down [E, H, I]; got "
                f"{self.x.type}, {self.router_weight.type}, {self.w_gate_up.type}, {self.w_down.type}"
            )
        if not 1 <= k <= r[0]:
            raise VerifyException(f"dl.moe: top_k {k} must be in [1, {r[0]}] (the number of experts)")
        if self.result.type != self.x.type:
            raise VerifyException(f"dl.moe: result {self.result.type} must have x's type {self.x.type}")

    def reference(self, x, router_w, w_gate_up, w_down):
        k, renormalize = self.attrs
        return moe_reference(x, router_w, w_gate_up, w_down, k, renormalize)


def moe_reference(x, router_w, w_gate_up, w_down, top_k: int, renormalize: bool = True):
    """dl.moe in torch: the router in float32 (float64 for float64 x), the experts as a loop in x's dtype."""
    t = x.reshape(-1, x.shape[-1])
    dtype = torch.promote_types(x.dtype, torch.float32)
    probs = torch.softmax(t.to(dtype) @ router_w.to(dtype).T, dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    gate, up = w_gate_up.chunk(2, dim=1)
    out = torch.zeros_like(t)
    for e in range(gate.shape[0]):
        tok, slot = torch.where(ids == e)
        if tok.numel():
            h = F.silu(t[tok] @ gate[e].T) * (t[tok] @ up[e].T)
            out.index_add_(0, tok, (h @ w_down[e].T) * weights[tok, slot, None].to(x.dtype))
    return out.view(x.shape)


COMPUTE_OPS = [
    ReduceSumOp,
    ReduceMeanOp,
    ReduceMaxOp,
    MatmulOp,
    LinearOp,
    SoftmaxOp,
    RMSNormOp,
    AddRMSNormOp,
    LayerNormOp,
    RotaryOp,
    GluOp,
    SDPAOp,
    EmbeddingOp,
    MoEOp,
]
__all__ = [c.__name__ for c in COMPUTE_OPS] + [
    "COMPUTE_OPS", "rms_norm_reference", "rotary_reference", "moe_reference", "dtype_of"
]
