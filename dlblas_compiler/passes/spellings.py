"""Spellings: reduce the algebraically equivalent spellings of SiLU, GELU, a mean and rotary to one form, the
dialect's op.

  silu     x * sigmoid(x) (either order), x / (1 + exp(-x))                -> dl.silu(x)
  sigmoid  1 / (1 + exp(-x)), (1 + exp(-x)).reciprocal()                   -> dl.sigmoid(x)
  gelu     0.5 * x * (1 + erf(x / sqrt(2)))                                 -> dl.gelu(x)
           0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))          -> dl.gelu(x, approximate="tanh")
           (the factors of each product in any order and grouping; x^3 as x**3 or x*x*x)
  mean     sum(v, dims, keepdim) / n, n the number of entries summed         -> dl.reduce_mean(v, dims, keepdim)
  rotary   cat(x1*c1 - x2*s1, x2*c2 + x1*s2) over the halves x1, x2 of x    -> dl.rotary(x, cat(c1, c2), cat(s1, s2))
           stack(xe*c1 - xo*s1, xo*c2 + xe*s2, -1).flatten(-2) over the even/odd entries xe, xo of x
                                                                           -> dl.rotary(x, ..., "interleaved")
           (cos/sin given per half or per pair: c1, c2 slices of one full-width tensor give it back; equal ones
           are repeated to full width, a weight-free view or cat on the small cos/sin tensors)
A constant matches when it equals the one in the formula to fp32 precision (fp32 code computes with that value).
RMSNorm's spellings (rsqrt / 1/sqrt / x/sqrt, pow(2) / x*x, mean or sum/n, F.rms_norm, weight first or last) need no
rewrite beyond `mean`: the `recognize` pass matches each of them. `recognize` runs these patterns first
(`rewrite_spellings`), so every later pattern (RMSNorm, GLU, partial rotary, rotary moved before a head repeat) sees
the one form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from ..dialects import (
    AddOp,
    CatOp,
    DivOp,
    ErfOp,
    ExpOp,
    GeluOp,
    MulOp,
    NegOp,
    PermuteOp,
    PowOp,
    ReciprocalOp,
    ReduceMeanOp,
    ReduceSumOp,
    ReshapeOp,
    RotaryOp,
    SigmoidOp,
    SiluOp,
    SliceOp,
    SubOp,
    TanhOp,
)
from ..dialects.types import dtype_of
from .match import install, last_dim, operand_pairs, producer, scalar, shape


def _is(c: float | None, value: float) -> bool:
    """c is the constant `value` to fp32 precision."""
    return c is not None and math.isclose(c, value, rel_tol=2**-24)


def _sum_with(v: SSAValue | None, first) -> SSAValue | None:
    """b if v = a + b (either order, used once) with `first(a)`."""
    add = producer(v, AddOp)
    if add is None or not v.has_one_use():
        return None
    return next((b for a, b in operand_pairs(add) if first(a)), None)


def _addend(v: SSAValue | None, a: SSAValue) -> SSAValue | None:
    """b if v = a + b (either order), used once."""
    return _sum_with(v, lambda u: u == a)


def _one_plus(v: SSAValue | None) -> SSAValue | None:
    """t if v = 1 + t (either order), used once."""
    return _sum_with(v, lambda one: _is(scalar(one), 1.0))


def _logistic_denominator(v: SSAValue) -> SSAValue | None:
    """x if v = 1 + exp(-x) (either order, single-use chain)."""
    e = _one_plus(v)
    exp = producer(e, ExpOp) if e is not None and e.has_one_use() else None
    neg = producer(exp.input, NegOp) if exp is not None and exp.input.has_one_use() else None
    return neg.input if neg is not None else None


class SiluOfSigmoid(RewritePattern):
    """x * sigmoid(x) -> silu(x)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MulOp, rewriter: PatternRewriter):
        for x, s in operand_pairs(op):
            sig = producer(s, SigmoidOp)
            if sig is not None and sig.input == x and s.has_one_use() and install(rewriter, SiluOp(x), op.result):
                return


class LogisticDivision(RewritePattern):
    """x / (1 + exp(-x)) -> silu(x); 1 / (1 + exp(-x)) -> sigmoid(x)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DivOp, rewriter: PatternRewriter):
        x = _logistic_denominator(op.rhs)
        if x is None:
            return
        if op.lhs == x:
            install(rewriter, SiluOp(x), op.result)
        elif scalar(op.lhs) == 1.0:
            install(rewriter, SigmoidOp(x), op.result)


class LogisticReciprocal(RewritePattern):
    """reciprocal(1 + exp(-x)) -> sigmoid(x) (x times it is then silu(x))."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ReciprocalOp, rewriter: PatternRewriter):
        x = _logistic_denominator(op.input)
        if x is not None:
            install(rewriter, SigmoidOp(x), op.result)


# -- gelu -----------------------------------------------------------------------------------------


def _factors(v: SSAValue, root: bool = False, depth: int = 4) -> tuple[float, list[SSAValue]]:
    """v as a product c * f1 * f2 * ... of scalar constants (multiplied into c) and other factors, read through
    up to `depth` nested dl.mul's whose results are used once (the root's may have other uses)."""
    m = producer(v, MulOp)
    if m is None or not (root or v.has_one_use()) or depth == 0:
        c = scalar(v)
        return (c, []) if c is not None else (1.0, [v])
    (ca, fa), (cb, fb) = _factors(m.lhs, depth=depth - 1), _factors(m.rhs, depth=depth - 1)
    return ca * cb, [*fa, *fb]


def _scaled(v: SSAValue, x: SSAValue) -> float | None:
    """c if v = c * x (or x / (1/c)), used once."""
    if not v.has_one_use():
        return None
    div = producer(v, DivOp)
    if div is not None:
        d = scalar(div.rhs)
        return 1.0 / d if div.lhs == x and d else None
    c, rest = _factors(v)
    return c if rest == [x] else None


def _input_of(v: SSAValue | None, cls: type[ErfOp] | type[TanhOp]) -> SSAValue | None:
    """t if v = f(t) with f a `cls` op, used once."""
    op = producer(v, cls)
    return op.input if op is not None and v.has_one_use() else None


def _is_term(v: SSAValue | None, x: SSAValue, k: float, n: int) -> bool:
    """v = k * x^n, x^n spelled x*...*x or pow(x, n) (single-use chain)."""
    if v is None or not v.has_one_use():
        return False
    c, xs = _factors(v)
    if not _is(c, k) or not xs:
        return False
    power = producer(xs[0], PowOp) if len(xs) == 1 and xs[0].has_one_use() else None
    return xs == [x] * n or (power is not None and power.input == x and power.value == n)


def _is_tanh_gelu_argument(t: SSAValue, x: SSAValue) -> bool:
    """t = sqrt(2/pi) * (x + 0.044715 * x^3), or sqrt(2/pi) * x * (1 + 0.044715 * x^2) (Megatron, BLOOM)."""
    c, rest = _factors(t) if t.has_one_use() else (0.0, [])
    if not _is(c, math.sqrt(2 / math.pi)):
        return False
    if len(rest) == 1:
        return _is_term(_addend(rest[0], x), x, 0.044715, 3)
    return len(rest) == 2 and any(a == x and _is_term(_one_plus(u), x, 0.044715, 2) for a, u in (rest, rest[::-1]))


class GeluOfFormula(RewritePattern):
    """0.5 * x * (1 + erf(x / sqrt(2))) -> gelu(x): x * Phi(x), Phi the standard normal CDF, GELU's definition
    (torch's exact gelu); 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> gelu(x, approximate="tanh"):
    the formula torch's approximate gelu computes (GPT-2's NewGELU, BLOOM's and Megatron's bias-gelu)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MulOp, rewriter: PatternRewriter):
        c, rest = _factors(op.result, root=True)
        if not _is(c, 0.5) or len(rest) != 2:
            return
        for x, s in (rest, rest[::-1]):
            if (t := _input_of(_one_plus(s), ErfOp)) is not None and _is(_scaled(t, x), 1 / math.sqrt(2)):
                gelu = GeluOp(x)
            elif (t := _input_of(_one_plus(s), TanhOp)) is not None and _is_tanh_gelu_argument(t, x):
                gelu = GeluOp(x, "tanh")
            else:
                continue
            if install(rewriter, gelu, op.result):
                return


# -- mean -----------------------------------------------------------------------------------------


class MeanOfSum(RewritePattern):
    """sum(v, dims, keepdim) / n -> mean(v, dims, keepdim) when n is the number of entries summed (the definition
    of the mean), so RMSNorm written with sum(x^2) / D is matched like the mean spelling."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DivOp, rewriter: PatternRewriter):
        total = producer(op.lhs, ReduceSumOp)
        if total is None or not op.lhs.has_one_use() or dtype_of(op.result) not in (torch.float32, torch.float64):
            return  # (in bf16 or fp16 eager rounds the sum before dividing, and an fp16 sum overflows past 65504)
        sizes = [shape(total.input)[d] for d in total.axes]
        if all(s > 0 for s in sizes) and scalar(op.rhs) == math.prod(sizes):  # static sizes (a dynamic one is < 0)
            install(rewriter, ReduceMeanOp(total.input, total.axes, total.keep), op.result)


# -- rotary ----------------------------------------------------------------------------------------


def _is_slice(v: SSAValue, x: SSAValue, start: int, step: int) -> bool:
    """v = x[..., start::step] along x's last dim."""
    s = producer(v, SliceOp)
    return s is not None and s.input == x and s.bounds() == (last_dim(x), start, shape(x)[-1], step)


def _part_source(v: SSAValue, start: int, step: int) -> SSAValue | None:
    """x if v = x[..., start:(half or end):step] is the first half (step 1) or the even entries (step 2) of x."""
    s = producer(v, SliceOp)
    if s is None:
        return None
    x = s.input
    d = shape(x)[-1] if shape(x) else 0
    dim, lo, hi, st = s.bounds()
    want_hi = d // 2 if step == 1 else d
    return x if (dim, lo, hi, st) == (last_dim(x), start, want_hi, step) and d % 2 == 0 and d > 0 else None


def _coefficient(v: SSAValue, part: SSAValue) -> SSAValue | None:
    """c if v = part * c (either order) and v is used once."""
    m = producer(v, MulOp)
    if m is None or not v.has_one_use():
        return None
    return next((c for a, c in operand_pairs(m) if a == part), None)


@dataclass(frozen=True)
class RotaryTerms:
    """out_a = a * c1 - b * s1 and out_b = b * c2 + a * s2, where (a, b) are x's halves or its even/odd entries."""

    x: SSAValue
    c1: SSAValue
    s1: SSAValue
    c2: SSAValue
    s2: SSAValue


def _rotary_terms(out_a: SSAValue, out_b: SSAValue, step: int) -> RotaryTerms | None:
    sub, add = producer(out_a, SubOp), producer(out_b, AddOp)
    if sub is None or add is None or not (out_a.has_one_use() and out_b.has_one_use()):
        return None
    ma = producer(sub.lhs, MulOp)
    for a in ma.operands if ma is not None else ():
        x = _part_source(a, 0, step)
        if x is None:
            continue
        d = shape(x)[-1]
        b = next((v for v in getattr(producer(sub.rhs, MulOp), "operands", ()) if _is_second_part(v, x, d, step)), None)
        c1, s1 = _coefficient(sub.lhs, a), _coefficient(sub.rhs, b) if b is not None else None
        if c1 is None or s1 is None:
            continue
        for t1, t2 in operand_pairs(add):
            c2, s2 = _coefficient(t1, b), _coefficient(t2, a)
            if c2 is not None and s2 is not None:
                return RotaryTerms(x, c1, s1, c2, s2)
    return None


def _is_second_part(v: SSAValue, x: SSAValue, d: int, step: int) -> bool:
    """v = x[..., d/2:] (step 1) or x[..., 1::2] (step 2)."""
    return _is_slice(v, x, d // 2, 1) if step == 1 else _is_slice(v, x, 1, 2)


def _full_width(c1: SSAValue, c2: SSAValue, step: int) -> tuple[SSAValue, list[Operation]] | None:
    """The full-width cos (or sin) whose halves (step 1) or even/odd entries (step 2) are c1 and c2, and the new ops
    computing it (none when c1, c2 are the parts of one tensor)."""
    s1, s2 = producer(c1, SliceOp), producer(c2, SliceOp)
    if s1 is not None and s2 is not None and s1.input == s2.input:
        whole = s1.input
        if _part_source(c1, 0, step) == whole and _is_second_part(c2, whole, shape(whole)[-1], step):
            return whole, []
    if not shape(c1) or shape(c1) != shape(c2):
        return None
    if step == 1:
        cat = CatOp([c1, c2], -1)
        return cat.result, [cat]
    column = (*shape(c1), 1)  # stack((c1, c2), -1).flatten(-2)
    r1, r2 = ReshapeOp(c1, column), ReshapeOp(c2, column)
    pairs = CatOp([r1.results[0], r2.results[0]], -1)
    flat = ReshapeOp(pairs.result, (*shape(c1)[:-1], 2 * shape(c1)[-1]))
    return flat.results[0], [r1, r2, pairs, flat]


def _install_rotary(
    rewriter: PatternRewriter, t: RotaryTerms, step: int, old: SSAValue, halves_out: bool = False
) -> bool:
    """`halves_out`: pairs rotated (step 2) but their results laid out as halves (first entries, then second ones):
    the interleaved rotary, its result's pairs then taken apart (viewed [..., d/2, 2], transposed, flattened: a view
    the GEMM epilogue stores through)."""
    cos, sin = _full_width(t.c1, t.c2, step), _full_width(t.s1, t.s2, step)
    if cos is None or sin is None:
        for op in reversed([*(cos[1] if cos else []), *(sin[1] if sin else [])]):
            op.erase()
        return False
    rotary = RotaryOp(t.x, cos[0], sin[0], "half" if step == 1 else "interleaved")
    if not halves_out:
        return install(rewriter, rotary, old, [*cos[1], *sin[1]])
    *lead, d = shape(t.x)
    pairs = ReshapeOp(rotary.result, (*lead, d // 2, 2))
    turned = PermuteOp(pairs.results[0], [*range(len(lead)), len(lead) + 1, len(lead)])
    return install(rewriter, ReshapeOp(turned.result, (*lead, d)), old, [*cos[1], *sin[1], rotary, pairs, turned])


class RotaryOfHalves(RewritePattern):
    """cat(x1*c1 - x2*s1, x2*c2 + x1*s2, -1) over x's halves -> rotary(x, cat(c1, c2), cat(s1, s2))."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CatOp, rewriter: PatternRewriter):
        if len(op.inputs) != 2 or op.axis != last_dim(op.result):
            return
        terms = _rotary_terms(op.inputs[0], op.inputs[1], 1)
        if terms is not None:
            _install_rotary(rewriter, terms, 1, op.result)


class RotaryOfPairsIntoHalves(RewritePattern):
    """cat(xe*c1 - xo*s1, xo*c2 + xe*s2, -1) over x's even/odd entries (DeepSeek-V3's interleaved rotary, written
    into halves order) -> the interleaved rotary of x, its result's pairs taken apart by a view."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CatOp, rewriter: PatternRewriter):
        if len(op.inputs) != 2 or op.axis != last_dim(op.result):
            return
        terms = _rotary_terms(op.inputs[0], op.inputs[1], 2)
        if terms is not None and shape(op.result) == shape(terms.x):
            _install_rotary(rewriter, terms, 2, op.result, halves_out=True)


class RotaryOfPairs(RewritePattern):
    """stack(xe*c1 - xo*s1, xo*c2 + xe*s2, -1).flatten(-2) over x's even/odd entries -> interleaved rotary."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ReshapeOp, rewriter: PatternRewriter):
        cat = producer(op.input, CatOp)
        if cat is None or len(cat.inputs) != 2 or cat.axis != last_dim(cat.result) or not op.input.has_one_use():
            return
        cols = [producer(v, ReshapeOp) for v in cat.inputs]
        for c, v in zip(cols, cat.inputs, strict=True):
            if c is None or not v.has_one_use() or shape(v) != (*shape(c.input), 1):
                return
        terms = _rotary_terms(cols[0].input, cols[1].input, 2)
        if terms is not None and shape(op.results[0]) == shape(terms.x):
            _install_rotary(rewriter, terms, 2, op.results[0])


SPELLINGS: list[type[RewritePattern]] = [
    SiluOfSigmoid,
    LogisticDivision,
    LogisticReciprocal,
    GeluOfFormula,
    MeanOfSum,
    RotaryOfHalves,
    RotaryOfPairsIntoHalves,
    RotaryOfPairs,
]


def rewrite_spellings(module: ModuleOp) -> None:
    PatternRewriteWalker(GreedyRewritePatternApplier([p() for p in SPELLINGS])).rewrite_module(module)

