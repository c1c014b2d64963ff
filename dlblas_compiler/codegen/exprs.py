"""Triton expressions for the ops a kernel computes in registers, shared by the row and GEMM templates.

Values are fp32 tensors in registers. `Emitter.value(op)` writes the statements for one op and returns
the name of its result; every op's arithmetic lives in one place: elementwise ops carry their own
Triton expression in the dialect (`op.triton(...)`); the composite row ops (norms, softmax) are here.
Every op's result is rounded to its dtype (x.to(bf16).to(fp32)), as eager rounds each op's result: a bf16 or fp16
chain overflows, underflows and rounds where eager's does (`(exp(x) / 1000)` in fp16 is inf where exp(x) is).
Inside one op the arithmetic is fp32, as in eager's kernels; a converter that spells one torch op as several
`dl` ops computes them in fp32 (`frontend.converters._one_op_in_f32`).
"""

from __future__ import annotations

import torch
from xdsl.ir import SSAValue

from ..dialects import (
    GELU_EXPR,
    BinaryOp,
    CompareOp,
    ConstantOp,
    ConvertOp,
    GluOp,
    LogicalOp,
    NotOp,
    SiluOp,
    UnaryOp,
    WhereOp,
)
from ..dialects.types import dtype_of
from .source import TL_DTYPE, Writer

GLU_EXPR = {  # dl.glu's activations, as the dialect's own ops compute them
    "silu": SiluOp.TRITON,
    "gelu": GELU_EXPR["none"],
    "gelu_tanh": GELU_EXPR["tanh"],
}


def round_to(expr: str, v: SSAValue | torch.dtype) -> str:
    """Round an fp32 expression to v's dtype (no-op for fp32 and for booleans, held as 0.0 / 1.0). The whole
    expression: `a + b` is rounded as `(a + b)`, not as `a + b.to(..)` (fuzz seed 2304: an add+RMSNorm's sum left
    unrounded, its residual rounded twice, so `-x + x` was not 0 and the norm of a one-wide row read its rounding
    error as ±1)."""
    dt = v if isinstance(v, torch.dtype) else dtype_of(v)
    if dt == torch.bool or TL_DTYPE[dt] == "tl.float32":
        return expr
    return f"{expr if expr.isidentifier() else f'({expr})'}.to({TL_DTYPE[dt]}).to(tl.float32)"


# the ops `emit_pointwise` writes: a template computes them in registers over its tile
POINTWISE = (UnaryOp, BinaryOp, ConvertOp, ConstantOp, GluOp, WhereOp, CompareOp, LogicalOp, NotOp)


class Names:
    """SSA value -> register name, with fresh temporaries."""

    def __init__(self):
        self.names: dict[SSAValue, str] = {}
        self.count = 0

    def fresh(self, hint: str = "t") -> str:
        self.count += 1
        return f"{hint}{self.count}"

    def __getitem__(self, v: SSAValue) -> str:
        return self.names[v]

    def __setitem__(self, v: SSAValue, name: str) -> None:
        self.names[v] = name

    def __contains__(self, v: SSAValue) -> bool:
        return v in self.names


def compared(names: Names, v: SSAValue, dt: torch.dtype) -> str:
    """Operand v of a comparison made in dtype dt: rounded to its own dtype, as eager holds it, then to dt, as eager
    compares it (a constant's literal rounded here: a Python float in Triton has no `.to`)."""
    if isinstance(v.owner, ConstantOp):
        return ConstantOp.literal(torch.tensor(v.owner.scalar, dtype=torch.float64).to(dt).item())
    return round_to(round_to(names[v], v), dt)


def emit_pointwise(w: Writer, names: Names, op) -> bool:
    """Write one elementwise op (unary, binary, convert, constant, glu, where, compare, logical). False if `op` is
    not one. Booleans are held as 0.0 and 1.0."""
    if isinstance(op, ConstantOp):
        names[op.result] = op.triton()
        return True
    if isinstance(op, (UnaryOp, NotOp)):
        expr = op.triton(names[op.input])
    elif isinstance(op, CompareOp):
        expr = op.triton(compared(names, op.lhs, op.dtype), compared(names, op.rhs, op.dtype))
    elif isinstance(op, (BinaryOp, LogicalOp)):
        expr = op.triton(names[op.lhs], names[op.rhs])
    elif isinstance(op, ConvertOp):  # (the operand as its own dtype holds it, then the cast's)
        expr = round_to(names[op.input], op.input)
    elif isinstance(op, WhereOp):  # (a constant branch may be finer than the dtype)
        expr = op.triton(names[op.cond], names[op.lhs], names[op.rhs])
    elif isinstance(op, GluOp):
        g = names[op.gate]
        expr = f"{GLU_EXPR[op.act.data].format(x=g)} * {names[op.up]}"
    else:
        return False
    t = names.fresh("v")
    w(f"{t} = {round_to(expr, op.results[0])}")
    names[op.results[0]] = t
    return True


def rotate_in_registers(w: Writer, out: str, values: tuple[str, str, str], parts: list[tuple[str, str]],
                        interleaved: bool, groups: str, half: str, shared_table: bool = False) -> None:
    """out = rotary of x by cos and sin (`values`), all [BLOCK_M, BLOCK_N] in registers: each tile is reshaped to
    [BLOCK_M, groups, 2, half] (pairs (j, j + half) of each group, HF's halves) or [BLOCK_M, groups, half, 2]
    (interleaved pairs (2j, 2j + 1)) so each rotation pair lands on one axis of size 2, split (into the names
    `parts`: x's, cos's and sin's two halves), rotated, joined and reshaped back. For a value whose partner columns
    are not in memory to load: the GEMM's accumulator, a row kernel's computed value. `shared_table`: cos and sin
    are [BLOCK_M, 2 * half], one group's columns, the same for every group (a table broadcast over the heads)."""
    def shape(g: str) -> str:
        return f"[BLOCK_M, {g}, {half}, 2]" if interleaved else f"[BLOCK_M, {g}, 2, {half}]"

    perm = "[0, 1, 2, 3]" if interleaved else "[0, 1, 3, 2]"
    for i, (v, (a, b)) in enumerate(zip(values, parts, strict=True)):
        tile = v if shared_table and i else f"tl.broadcast_to({v}, [BLOCK_M, BLOCK_N])"
        w(f"{a}, {b} = tl.split(tl.permute(tl.reshape({tile}, {shape('1' if shared_table and i else groups)}), {perm}))")
    (x1, x2), (c1, c2), (s1, s2) = parts
    w(f"{out} = tl.reshape(tl.permute(tl.join({x1} * {c1} - {x2} * {s1}, {x2} * {c2} + {x1} * {s2}), {perm}), [BLOCK_M, BLOCK_N])")
