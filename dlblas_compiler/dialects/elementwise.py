"""One-to-one ops: unary and binary elementwise math, casts and scalar constants.

Each op holds, in one place: its verifier (via its operand constraints and `verify_`), its torch
reference (`reference`), its Triton expression over fp32 operands (`triton`) and the torch callables
the frontend maps to it (`TORCH_FNS`). Binary ops broadcast their operands like torch; a 0-d operand
(a scalar constant) is weakly typed, as in torch.
"""

from __future__ import annotations

import abc
import math
import operator
from typing import ClassVar

import torch
import torch.nn.functional as F
from xdsl.dialects.builtin import FloatAttr, StringAttr, TensorType, f64, i1
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import ConstantLike, Pure
from xdsl.utils.exceptions import VerifyException

from .traits import ONE_TO_ONE
from .types import DLBoolTensor, DLFloatTensor, broadcast_shapes, dtype_of, promote, shape_of, torch_dtype


class UnaryOp(IRDLOperation, abc.ABC):
    """out = f(x), same shape and dtype."""

    T: ClassVar = VarConstraint("T", DLFloatTensor)
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = "$input attr-dict `:` type($input)"
    irdl_options = (ParsePropInAttrDict(),)
    TORCH_FNS: ClassVar[tuple] = ()

    def __init__(self, x: SSAValue, **props: Attribute):
        super().__init__(operands=[x], result_types=[x.type], properties=props)

    @abc.abstractmethod
    def reference(self, x: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def triton(self, x: str) -> str: ...


def _unary(op_name: str, ref, expr: str, fns: tuple = (), doc: str = "") -> type[UnaryOp]:
    """Define a parameterless unary op from its torch reference and Triton expression."""

    class _Op(UnaryOp):
        name = op_name
        TORCH_FNS: ClassVar[tuple] = fns
        TRITON: ClassVar[str] = expr  # the Triton expression of {x}

        def reference(self, x):
            return ref(x)

        def triton(self, x: str) -> str:
            return expr.format(x=x)

    _Op.__name__ = _Op.__qualname__ = "".join(p.title() for p in op_name[3:].split("_")) + "Op"
    _Op.__doc__ = doc or f"`{op_name}`: elementwise, computed in fp32 by generated kernels."
    return irdl_op_definition(_Op)


# (Triton's unary minus is 0 - x, which gives +0.0 for +0.0: `1 / -x` came out +inf at 0 where eager gives -inf)
NegOp = _unary("dl.neg", torch.neg, "({x} * -1.0)", (torch.neg, operator.neg, "neg", "__neg__"))
ExpOp = _unary("dl.exp", torch.exp, "tl.exp({x})", (torch.exp, "exp"))
LogOp = _unary("dl.log", torch.log, "tl.log({x})", (torch.log, "log"))
SqrtOp = _unary("dl.sqrt", torch.sqrt, "tl.sqrt({x})", (torch.sqrt, "sqrt"))
RsqrtOp = _unary("dl.rsqrt", torch.rsqrt, "tl.rsqrt({x})", (torch.rsqrt, "rsqrt"))
ReciprocalOp = _unary("dl.reciprocal", torch.reciprocal, "(1.0 / {x})", (torch.reciprocal, "reciprocal"))
AbsOp = _unary("dl.abs", torch.abs, "tl.abs({x})", (torch.abs, operator.abs, "abs"))
SinOp = _unary("dl.sin", torch.sin, "tl.sin({x})", (torch.sin, "sin"))
CosOp = _unary("dl.cos", torch.cos, "tl.cos({x})", (torch.cos, "cos"))
SigmoidOp = _unary("dl.sigmoid", torch.sigmoid, "tl.sigmoid({x})", (torch.sigmoid, F.sigmoid, "sigmoid"))
SiluOp = _unary("dl.silu", F.silu, "({x} * tl.sigmoid({x}))", (F.silu,))
ErfOp = _unary("dl.erf", torch.erf, "tl.erf({x})", (torch.erf, torch.special.erf, "erf"))
# tanh without libdevice (the interpreter has none): near 0, x (1 + x^2 P(x^2)) with the Cephes single-precision
# coefficients for |x| < 0.625 (1 - 2 / (e^2x + 1), or 2 sigmoid(2x) - 1, cancels there: tanh(1e-4) came out 1e-3
# off, relatively); above, 1 - 2 / (e^2|x| + 1) with x's sign. -0.0, NaN and infinities as torch.tanh.
_TANH_SMALL = ("({x} * (1.0 + {x} * {x} * ((((-5.70498872745e-3 * {x} * {x} + 2.06390887954e-2) * {x} * {x}"
               " - 5.37397155531e-2) * {x} * {x} + 1.33314422036e-1) * {x} * {x} - 3.33332819422e-1)))")
TANH_EXPR = (f"tl.where(tl.abs({{x}}) < 0.625, {_TANH_SMALL}, "
             "tl.where({x} < 0.0, -1.0, 1.0) * (1.0 - 2.0 / (tl.exp(2.0 * tl.abs({x})) + 1.0)))")
TanhOp = _unary("dl.tanh", torch.tanh, TANH_EXPR, (torch.tanh, F.tanh, "tanh"))
ReluOp = _unary("dl.relu", torch.relu, "tl.where({x} < 0.0, 0.0, {x})", (torch.relu, F.relu, "relu"))


def _horner(var: str, coefficients: list[float]) -> str:
    """c0 + var (c1 + var (c2 + ...)) as a Triton expression."""
    out = repr(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = f"({c!r} + {var} * {out})"
    return out


# expm1 and log1p without libdevice (the interpreter has none), accurate where exp(x) - 1 and log(1 + x) cancel.
# expm1: below |x| = 0.5 its Taylor polynomial to x^8 (the first term left out, x^9 / 9!, is under 1e-8 of the value
# there), above exp(x) - 1 (which loses at most a factor 2.5 of exp's relative error there).
EXPM1_EXPR = (f"tl.where(tl.abs({{x}}) < 0.5, {{x}} * {_horner('{x}', [1 / math.factorial(k) for k in range(1, 9)])}, "
              "tl.exp({x}) - 1.0)")
# log1p: below |x| = 0.5, 2 atanh(s) with s = x / (2 + x) (|s| <= 1/3) as its odd series to s^13 (the first term left
# out is under 2e-8 of the value): the log's own cancellation near 1 is not taken (the GPU's fast log has an
# absolute error there, not a relative one); above, log(1 + x).
_S = "({x} / (2.0 + {x}))"
_ATANH_SERIES = _horner(f"{_S} * {_S}", [1 / (2 * k + 1) for k in range(7)])  # (atanh(s) / s in powers of s^2)
LOG1P_EXPR = (f"tl.where(tl.abs({{x}}) < 0.5, 2.0 * {_S} * {_ATANH_SERIES}, "
              "tl.log(1.0 + {x}))")
Expm1Op = _unary("dl.expm1", torch.expm1, EXPM1_EXPR, (torch.expm1, torch.special.expm1, "expm1"))
Log1pOp = _unary("dl.log1p", torch.log1p, LOG1P_EXPR, (torch.log1p, torch.special.log1p, "log1p"))
Log1pOp.__name__ = Log1pOp.__qualname__ = "Log1pOp"  # (not the title-cased "Log1POp")

# GELU's Triton expressions by `approximate` (also the gated activations of dl.glu). The tanh form as
# x sigmoid(2u), the same function as 0.5 x (1 + tanh(u)) (u = sqrt(2/pi) (x + 0.044715 x^3)): 1 + tanh(u) cancels
# for x below about -3, where x sigmoid(2u) keeps every digit.
GELU_EXPR = {
    "none": "(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))",
    "tanh": "({x} * tl.sigmoid(1.5957691216057308 * ({x} + 0.044715 * {x} * {x} * {x})))",
}


@irdl_op_definition
class GeluOp(UnaryOp):
    """`dl.gelu`: GELU, exact (erf) or the tanh approximation (`approximate = "tanh"`)."""

    name = "dl.gelu"
    approximate = prop_def(StringAttr, StringAttr("none"))
    TORCH_FNS: ClassVar[tuple] = (F.gelu,)

    def __init__(self, x: SSAValue, approximate: str = "none"):
        super().__init__(x, approximate=StringAttr(approximate))

    def verify_(self):
        if self.approximate.data not in ("none", "tanh"):
            raise VerifyException(f"dl.gelu: approximate must be 'none' or 'tanh', got {self.approximate.data!r}")

    def reference(self, x):
        return F.gelu(x, approximate=self.approximate.data)

    def triton(self, x: str) -> str:
        return GELU_EXPR[self.approximate.data].format(x=x)


@irdl_op_definition
class PowOp(UnaryOp):
    """`dl.pow`: x ** exponent for a scalar exponent (tensor exponents go through `dl.torch_call`)."""

    name = "dl.pow"
    exponent = prop_def(FloatAttr)
    TORCH_FNS: ClassVar[tuple] = (torch.pow, operator.pow, "pow", "__pow__")

    def __init__(self, x: SSAValue, exponent: float):
        super().__init__(x, exponent=FloatAttr(float(exponent), f64))

    @property
    def value(self) -> float:
        return self.exponent.value.data

    def reference(self, x):
        e = self.value
        return torch.pow(x, int(e) if e.is_integer() else e)

    def triton(self, x: str) -> str:
        """As torch computes a scalar power: square roots and products up to the cube as they are; other exponents
        as e^(e log|x|) in float64 (in float32 that loses |e log x| epsilons: 7^10 came out 1.1e-6 off), with
        pow's signs: an odd integer power keeps x's sign (-0.0 and -inf too), a fractional power of a finite
        negative x is NaN, and of -inf or -0.0 what it is of +inf or +0.0. (Taken as e^(e log x) before, every
        power above 8 of a negative x, x^10 of -2 or x^9 of -3, was NaN.)"""
        e, dt = self.value, dtype_of(self.input)
        if dt in (torch.bfloat16, torch.float16):  # (eager rounds a scalar exponent to a bf16 or fp16 tensor's dtype:
            e = torch.tensor(e, dtype=dt).item()  # x ** 2.3 in bf16 is x ** 2.296875; a float32 one it takes whole)
        if e == 0.5:
            return f"tl.sqrt({x})"
        if e == -0.5:
            return f"tl.rsqrt({x})"
        if e.is_integer() and abs(e) <= 3:
            n = int(abs(e))
            prod = "(" + " * ".join([x] * n) + ")" if n else "1.0"
            return prod if e >= 0 else f"(1.0 / {prod})"
        mag = f"tl.exp({e!r} * tl.log(tl.abs({x}).to(tl.float64))).to(tl.float32)"
        if e.is_integer():
            return mag if int(e) % 2 == 0 else f"tl.where({x}.to(tl.int32, bitcast=True) < 0, {mag} * -1.0, {mag})"
        return f"tl.where(({x} < 0.0) & ({x} > float('-inf')), float('nan'), {mag})"


@irdl_op_definition
class ConvertOp(IRDLOperation):
    """`dl.convert`: cast to another float dtype (x.to(dtype), x.float(), x.type_as(y)); a boolean tensor casts
    to 0.0 and 1.0."""

    name = "dl.convert"
    input = operand_def(TensorType)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, x: SSAValue, elem: Attribute):
        super().__init__(operands=[x], result_types=[TensorType(elem, shape_of(x))])

    def verify_(self):
        if dtype_of(self.input) not in (torch.bool, torch.float16, torch.bfloat16, torch.float32):
            raise VerifyException(f"dl.convert: expected a tensor of f16, bf16, f32 or i1, got {self.input.type}")
        if shape_of(self.input) != shape_of(self.result):
            raise VerifyException(f"dl.convert: shape changes from {shape_of(self.input)} to {shape_of(self.result)}")

    def reference(self, x):
        return x.to(dtype_of(self.result))

    def triton(self, x: str) -> str:
        return x  # generated kernels compute in fp32; the cast happens at load/store


class BinaryOp(IRDLOperation, abc.ABC):
    """out = f(lhs, rhs) with torch broadcasting and dtype promotion."""

    lhs = operand_def(DLFloatTensor)
    rhs = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = "$lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"
    TORCH_FNS: ClassVar[tuple] = ()
    COMMUTATIVE: ClassVar[bool] = False

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[self.infer(lhs.type, rhs.type)])

    @staticmethod
    def infer(a: TensorType, b: TensorType) -> TensorType:
        shape = broadcast_shapes(a.get_shape(), b.get_shape())
        elem = promote([a.element_type, b.element_type], [a.get_num_dims(), b.get_num_dims()])
        return TensorType(elem, shape)

    def verify_(self):
        try:
            want = self.infer(self.lhs.type, self.rhs.type)
        except VerifyException as e:
            raise VerifyException(f"{self.name}: {e}") from None
        if self.result.type != want:
            raise VerifyException(
                f"{self.name}: operands {self.lhs.type} and {self.rhs.type} give {want}, but the result is {self.result.type}"
            )

    @abc.abstractmethod
    def reference(self, a, b): ...

    @abc.abstractmethod
    def triton(self, a: str, b: str) -> str: ...


def _binary(op_name: str, ref, expr: str, fns: tuple, is_commutative: bool) -> type[BinaryOp]:
    class _Op(BinaryOp):
        name = op_name
        TORCH_FNS: ClassVar[tuple] = fns
        COMMUTATIVE: ClassVar[bool] = is_commutative

        def reference(self, a, b):
            return ref(a, b)

        def triton(self, a: str, b: str) -> str:
            return expr.format(a=a, b=b)

    _Op.__name__ = _Op.__qualname__ = op_name[3:].title() + "Op"
    _Op.__doc__ = f"`{op_name}`: elementwise with broadcasting; a 0-d operand is a weakly typed scalar."
    return irdl_op_definition(_Op)


def _maximum(a, b):
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    return torch.clamp_min(a, b) if not isinstance(b, torch.Tensor) else torch.maximum(a, b)


def _minimum(a, b):
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    return torch.clamp_max(a, b) if not isinstance(b, torch.Tensor) else torch.minimum(a, b)


AddOp = _binary("dl.add", operator.add, "({a} + {b})", (operator.add, torch.add, "add", "__add__", "__radd__"), True)
SubOp = _binary("dl.sub", operator.sub, "({a} - {b})", (operator.sub, torch.sub, torch.subtract, "sub", "__sub__"), False)
MulOp = _binary("dl.mul", operator.mul, "({a} * {b})", (operator.mul, torch.mul, torch.multiply, "mul", "__mul__", "__rmul__"), True)
DivOp = _binary("dl.div", operator.truediv, "({a} / {b})", (operator.truediv, torch.div, torch.divide, torch.true_divide, "div", "__truediv__"), False)
MaximumOp = _binary("dl.maximum", _maximum, "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", (torch.maximum, "maximum"), True)
MinimumOp = _binary("dl.minimum", _minimum, "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", (torch.minimum, "minimum"), True)


@irdl_op_definition
class WhereOp(IRDLOperation):
    """`dl.where`: `cond ? lhs : rhs` elementwise (torch.where; `x.masked_fill(m, v)` is `where(m, v, x)`). `cond`
    is a boolean tensor; the three broadcast like torch's operands and the result's dtype is promoted from lhs and
    rhs alone. Selecting is exact: a NaN or inf of the branch not taken leaves no trace."""

    name = "dl.where"
    cond = operand_def(DLBoolTensor)
    lhs = operand_def(DLFloatTensor)
    rhs = operand_def(DLFloatTensor)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = (
        "$cond `,` $lhs `,` $rhs attr-dict `:` `(` type($cond) `,` type($lhs) `,` type($rhs) `)` `->` type($result)"
    )

    def __init__(self, cond: SSAValue, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[cond, lhs, rhs], result_types=[self.infer(cond.type, lhs.type, rhs.type)])

    @staticmethod
    def infer(c: TensorType, a: TensorType, b: TensorType) -> TensorType:
        shape = broadcast_shapes(c.get_shape(), a.get_shape(), b.get_shape())
        return TensorType(promote([a.element_type, b.element_type], [a.get_num_dims(), b.get_num_dims()]), shape)

    def verify_(self):
        try:
            want = self.infer(self.cond.type, self.lhs.type, self.rhs.type)
        except VerifyException as e:
            raise VerifyException(f"dl.where: {e}") from None
        if self.result.type != want:
            raise VerifyException(f"dl.where: operands give {want}, but the result is {self.result.type}")

    def reference(self, c, a, b):
        return torch.where(c, a, b)  # (a constant arrives as a Python float: weakly typed, as in eager)

    def triton(self, c: str, a: str, b: str) -> str:
        return f"tl.where({c} != 0.0, {a}, {b})"  # (kernels hold a boolean as 0.0 / 1.0)


COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _verify_boolean(op: IRDLOperation, choice: str, table: dict) -> None:
    """A boolean-valued binary op: its `choice` property names an entry of `table`, its result is the operands'
    broadcast shape."""
    name = getattr(op, choice).data
    if name not in table:
        raise VerifyException(f"{op.name}: {choice} {name!r} is not one of {sorted(table)}")
    try:
        shape = broadcast_shapes(shape_of(op.lhs), shape_of(op.rhs))
    except VerifyException as e:
        raise VerifyException(f"{op.name}: {e}") from None
    if shape_of(op.result) != shape:
        raise VerifyException(f"{op.name}: operands give shape {shape}, but the result is {op.result.type}")


@irdl_op_definition
class CompareOp(IRDLOperation):
    """`dl.compare`: `lhs <predicate> rhs` elementwise, a boolean tensor (torch.eq, ne, lt, le, gt, ge and their
    operators; `predicate` is one of COMPARISONS). The operands broadcast like torch's and are compared in the dtype
    torch promotes them to (`dtype`): a number or a 0-d tensor is rounded to it first, as in eager (bf16 `x > 0.1`
    compares x with 0.10009765625). NaN is unequal to everything, itself included."""

    name = "dl.compare"
    predicate = prop_def(StringAttr)
    lhs = operand_def(DLFloatTensor)
    rhs = operand_def(DLFloatTensor)
    result = result_def(DLBoolTensor)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = (
        "$predicate $lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"
    )

    def __init__(self, predicate: str, lhs: SSAValue, rhs: SSAValue):
        shape = broadcast_shapes(shape_of(lhs), shape_of(rhs))
        super().__init__(operands=[lhs, rhs], result_types=[TensorType(i1, shape)],
                         properties={"predicate": StringAttr(predicate)})  # fmt: skip

    @property
    def dtype(self) -> torch.dtype:
        a, b = self.lhs.type, self.rhs.type
        return torch_dtype(promote([a.element_type, b.element_type], [a.get_num_dims(), b.get_num_dims()]))

    def verify_(self):
        _verify_boolean(self, "predicate", COMPARISONS)

    def reference(self, a, b):
        return getattr(operator, self.predicate.data)(a, b)  # (a constant arrives as a Python float, as in eager)

    def triton(self, a: str, b: str) -> str:
        """Over a and b already rounded to `dtype`."""
        return f"({a} {COMPARISONS[self.predicate.data]} {b}).to(tl.float32)"


LOGICAL = {"and": (torch.logical_and, "({a} * {b})"), "or": (torch.logical_or, "tl.maximum({a}, {b})"),
           "xor": (torch.logical_xor, "tl.abs({a} - {b})")}  # fmt: skip


@irdl_op_definition
class LogicalOp(IRDLOperation):
    """`dl.logical`: `lhs <kind> rhs` of boolean tensors (`kind` "and", "or" or "xor": torch.logical_and, `&` of
    booleans, ...), broadcasting like torch's."""

    name = "dl.logical"
    kind = prop_def(StringAttr)
    lhs = operand_def(DLBoolTensor)
    rhs = operand_def(DLBoolTensor)
    result = result_def(DLBoolTensor)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = "$kind $lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"

    def __init__(self, kind: str, lhs: SSAValue, rhs: SSAValue):
        shape = broadcast_shapes(shape_of(lhs), shape_of(rhs))
        super().__init__(operands=[lhs, rhs], result_types=[TensorType(i1, shape)],
                         properties={"kind": StringAttr(kind)})  # fmt: skip

    def verify_(self):
        _verify_boolean(self, "kind", LOGICAL)

    def reference(self, a, b):
        return LOGICAL[self.kind.data][0](a, b)

    def triton(self, a: str, b: str) -> str:
        return LOGICAL[self.kind.data][1].format(a=a, b=b)


@irdl_op_definition
class NotOp(IRDLOperation):
    """`dl.not`: logical negation of a boolean tensor (torch.logical_not, `~` of booleans)."""

    name = "dl.not"
    T: ClassVar = VarConstraint("T", DLBoolTensor)
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure(), ONE_TO_ONE)
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, x: SSAValue):
        super().__init__(operands=[x], result_types=[x.type])

    def reference(self, x):
        return torch.logical_not(x)

    def triton(self, x: str) -> str:
        return f"(1.0 - {x})"


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """`dl.constant`: a scalar (0-d) constant. At run time its value is a Python float, so the
    torch references see exactly what eager code saw (a Python scalar)."""

    name = "dl.constant"
    value = prop_def(FloatAttr)
    result = result_def(DLFloatTensor)
    traits = traits_def(Pure(), ConstantLike(), ONE_TO_ONE)
    assembly_format = "$value attr-dict `:` type($result)"

    def __init__(self, value: float, elem: Attribute):
        super().__init__(properties={"value": FloatAttr(float(value), f64)}, result_types=[TensorType(elem, [])])

    @property
    def scalar(self) -> float:
        return self.value.value.data

    def verify_(self):
        if self.result.type.get_num_dims() != 0:
            raise VerifyException(f"dl.constant must be 0-d, got {self.result.type}")

    def reference(self) -> float:
        return self.scalar

    def triton(self) -> str:
        return self.literal(self.scalar)

    @staticmethod
    def literal(v: float) -> str:
        """v as a Triton scalar expression."""
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if v == 0.0 and math.copysign(1.0, v) < 0:  # (Triton makes every scalar equal to 0 a +0.0: its bits then)
            return "tl.full([], -2147483648, tl.int32).to(tl.float32, bitcast=True)"
        return repr(v)


UNARY_OPS = [NegOp, ExpOp, Expm1Op, LogOp, Log1pOp, SqrtOp, RsqrtOp, ReciprocalOp, AbsOp, SinOp, CosOp, SigmoidOp,
             SiluOp, ErfOp, TanhOp, ReluOp, GeluOp, PowOp]
BINARY_OPS = [AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp]
ELEMENTWISE_OPS = [*UNARY_OPS, *BINARY_OPS, ConvertOp, ConstantOp, WhereOp, CompareOp, LogicalOp, NotOp]
