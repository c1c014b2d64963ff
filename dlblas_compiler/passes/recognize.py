"""`recognize`: raise decomposed subgraphs to the dialect's composite ops.

Patterns (each robust to the spellings real model code uses):
  rms_norm      x * rsqrt(mean(x^2) + eps) * w, with or without the fp32 upcast / downcast, x.pow(2) or
                x*x, rsqrt / 1/sqrt / x/sqrt, the weight before or after the cast, Gemma's (1 + w)
  add_rms_norm  a residual add feeding an rms_norm (both outputs stay live)
  layer_norm    (x - mean(x)) / sqrt(var + eps) * w + b, var the mean square of the centred x (its RMSNorm)
  rotary        x*cos + rotate(x)*sin: half-split (rotate_half) and interleaved (GPT-J) layouts, and
                partial rotary cat(rotary(x[..., :rd]), x[..., rd:])
  glu           act(gate) * up with act = silu / gelu / gelu-tanh (SwiGLU, GeGLU)
  softmax       exp(x - max(x)) / sum(exp(x - max(x))) (and without the max)
  linear        x @ W with W weight-only and 2-D (a parameter or an expression of parameters: nn.Linear's
                W.T / W.t() / W.transpose(0, 1), GPT-2 Conv1D's [in, out] W) -> linear(x, W^T), the transpose a
                weight the runtime computes once; linear(x, W) + b with b weight-only [N] -> linear(x, W, b)
  sdpa          softmax(q k^T * scale + mask) v; softmax(where(mask, q k^T * scale, -inf)) v and its
                masked_fill(mask, -inf) form (a boolean mask whose dropped keys leave no trace)
  grouped sdpa  sdpa over k/v whose heads are repeated (repeat_kv's expand + reshape, before or after the
                heads/sequence transpose; repeat_interleave imports as that) -> sdpa over the unrepeated k/v
                with enable_gqa; a rotary of repeated heads (cos/sin alike for every head) is moved before the
                repeat
  causal mask   sdpa with a mask the frontend found causal (made from constants, keeping keys j <= i) -> torch's
                causal sdpa over the first S keys
SiLU, GELU, a mean and rotary spelled out another way (x * sigmoid(x), x / (1 + exp(-x)), GELU's erf and tanh
formulas, sum / n, rotary as a cat of halves or stacked pairs with per-half cos/sin) are first rewritten to one form
(`spellings.py`).
Every rewrite keeps the replaced value's type, so IR around it is untouched; the intermediate ops of a
match must have no other users, else the match is refused (nothing is computed twice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from ..dialects import (
    AddOp,
    AddRMSNormOp,
    BroadcastOp,
    CatOp,
    ConvertOp,
    DivOp,
    ExpOp,
    GeluOp,
    GluOp,
    LayerNormOp,
    LinearOp,
    LogicalOp,
    MatmulOp,
    MulOp,
    NegOp,
    ParamOp,
    PermuteOp,
    PowOp,
    ReciprocalOp,
    ReduceMaxOp,
    ReduceMeanOp,
    ReduceSumOp,
    ReshapeOp,
    RMSNormOp,
    RotaryOp,
    RsqrtOp,
    SDPAOp,
    SiluOp,
    SliceOp,
    SoftmaxOp,
    SqrtOp,
    SubOp,
    WhereOp,
)
from ..dialects.types import dtype_of
from .match import (
    discard,
    install,
    is_constant,
    last_dim,
    only_user,
    operand_pairs,
    producer,
    scalar,
    set_name,
    shape,
    single_use,
    strip_convert,
)
from .registry import register_pass
from .spellings import rewrite_spellings

def spelled_in_f32(v: SSAValue) -> bool:
    """v is float32 (or float64): a chain spelled out in it may be raised to a composite op, which computes in float32
    and rounds once. A chain spelled in bf16 or fp16 is left as it is: eager rounds every step there, and an fp16
    x.pow(2) overflows past 256, where the composite op's does not."""
    return dtype_of(v) in (torch.float32, torch.float64)


# -- rms_norm -------------------------------------------------------------------------------------


def _mean_square_plus_eps(a: SSAValue, xf: SSAValue) -> float | None:
    """eps if a = mean(xf^2, -1, keepdim) + eps (single-use chain)."""
    add = producer(a, AddOp)
    if add is None:
        return None
    for m, c in operand_pairs(add):
        eps = scalar(c)
        mean = producer(m, ReduceMeanOp)
        if eps is None or mean is None or mean.axes != (last_dim(xf),) or not mean.keep:
            continue
        sq = producer(mean.input, (PowOp, MulOp))
        if isinstance(sq, PowOp) and (sq.input != xf or sq.value != 2.0):
            continue
        if isinstance(sq, MulOp) and not (sq.lhs == xf and sq.rhs == xf):
            continue
        if sq is None or not single_use(mean.input, m):
            continue
        return eps
    return None


def _inv_rms(r: SSAValue, xf: SSAValue) -> float | None:
    """eps if r = 1 / sqrt(mean(xf^2) + eps), spelled rsqrt(.), reciprocal(sqrt(.)), 1/sqrt(.), (.)**-0.5."""
    if not r.has_one_use():
        return None
    op = producer(r, (RsqrtOp, ReciprocalOp, DivOp, PowOp))
    if isinstance(op, RsqrtOp):
        return _mean_square_plus_eps(op.input, xf)
    if isinstance(op, PowOp) and op.value == -0.5:
        return _mean_square_plus_eps(op.input, xf)
    root = None
    if isinstance(op, ReciprocalOp):
        root = op.input
    elif isinstance(op, DivOp) and scalar(op.lhs) == 1.0:
        root = op.rhs
    sq = producer(root, SqrtOp)
    if sq is None or not root.has_one_use():
        return None
    return _mean_square_plus_eps(sq.input, xf)


def _normalized(op: MulOp | DivOp) -> tuple[SSAValue, float] | None:
    """(xf, eps) if `op` computes xf * inv_rms(xf) or xf / sqrt(mean(xf^2) + eps)."""
    if isinstance(op, MulOp):
        for xf, r in operand_pairs(op):
            eps = _inv_rms(r, xf)
            if eps is not None:
                return xf, eps
        return None
    sq = producer(op.rhs, SqrtOp)
    if sq is None or not op.rhs.has_one_use():
        return None
    eps = _mean_square_plus_eps(sq.input, op.lhs)
    return (op.lhs, eps) if eps is not None else None


def _weight(v: SSAValue, n: int) -> tuple[SSAValue, float] | None:
    """(w, offset) for a weight of shape [n] spelled w, w.float() or (1 + w) (a gain of another shape, [1]
    say, stays a multiplication after the norm)."""
    add = producer(v, AddOp)
    if add is not None:
        for c, w in operand_pairs(add):
            if scalar(c) == 1.0 and shape(w) == (n,):
                return w, 1.0
        return None
    return (v, 0.0) if shape(v) == (n,) else None


class RecognizeRMSNorm(RewritePattern):
    def match_and_rewrite(self, op, rewriter: PatternRewriter):
        if not isinstance(op, (MulOp, DivOp)):
            return
        found = _normalized(op)
        if found is None or not spelled_in_f32(found[0]):
            return
        xf, eps = found
        n = op.result
        x0 = strip_convert(xf)
        down = only_user(n, ConvertOp)
        v = down.result if down is not None else n
        wmul = only_user(v, MulOp)
        weight = None
        if wmul is not None:
            other = wmul.rhs if wmul.lhs == v else wmul.lhs
            weight = _weight(other, shape(n)[-1])
            if weight is not None and not (other == weight[0] or other.has_one_use()):
                weight = None
        if weight is None:
            final, x_in, w, offset, in_f32 = v, (x0 if down is not None else xf), None, 0.0, False
        else:
            final = wmul.result
            up_cast = only_user(final, ConvertOp) if down is None else None
            if down is not None:  # Llama: scale after the cast
                x_in, w, offset, in_f32 = x0, weight[0], weight[1], False
            elif up_cast is not None:  # Gemma: scale in fp32, then cast
                final, x_in, w, offset, in_f32 = up_cast.result, x0, strip_convert(weight[0]), weight[1], True
            else:
                x_in, w, offset, in_f32 = xf, weight[0], weight[1], False
        if down is not None and down.result.type.element_type != x0.type.element_type:
            return
        install(rewriter, RMSNormOp(x_in, w, eps, offset, in_f32), final)


class RecognizeAddRMSNorm(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RMSNormOp, rewriter: PatternRewriter):
        add = producer(op.input, AddOp)
        if add is None or op.weight is None or shape(add.lhs) != shape(add.rhs):
            return
        if add.lhs.type != add.rhs.type:
            return
        eps, offset, in_f32 = op.attrs
        new = AddRMSNormOp(add.lhs, add.rhs, op.weight, eps, offset, in_f32)
        if new.normed.type != op.result.type or new.sum.type != add.result.type:
            return discard(new)
        w_def = producer(op.weight, ParamOp)
        if not _dominates(op.weight, add) and w_def is None:
            return discard(new)
        set_name(new.normed, op.result)
        set_name(new.sum, add.result)
        if not _dominates(op.weight, add):  # a parameter read after the add: read it before instead
            w_def.detach()
            rewriter.insert(w_def, InsertPoint.before(add))
        rewriter.insert(new, InsertPoint.before(add))
        rewriter.replace_all_uses_with(add.result, new.sum)
        rewriter.replace(op, [], [new.normed])
        rewriter.erase(add)


class RecognizeLayerNorm(RewritePattern):
    """rms_norm(x - mean(x, -1, keepdim), w) + b -> layer_norm(x, w, b, eps): LayerNorm spelled out (centre, then
    divide by the root of the mean square plus eps, an RMSNorm of the centred x), so that it runs as the one op,
    its mean corrected as the LayerNorm template's is (a constant row's deviations exactly 0)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RMSNormOp, rewriter: PatternRewriter):
        eps, offset, _ = op.attrs
        sub = producer(op.input, SubOp)
        if op.weight is None or offset != 0.0 or sub is None or not op.input.has_one_use():
            return
        mean = producer(sub.rhs, ReduceMeanOp)
        x = sub.lhs
        if mean is None or mean.input != x or mean.axes != (last_dim(x),) or not mean.keep or not sub.rhs.has_one_use():
            return
        add = only_user(op.result, AddOp)
        if add is None:
            return
        bias = add.rhs if add.lhs == op.result else add.lhs
        if shape(bias) != shape(x)[-1:]:
            return
        if install(rewriter, LayerNormOp(x, op.weight, bias, eps), add.result):
            for dead in (op, sub, mean):
                rewriter.erase(dead)


def _dominates(v: SSAValue, op) -> bool:
    """v is defined before `op` in the same block (or is a block argument of it)."""
    owner = v.owner
    if not isinstance(owner, Operation):
        return True
    return owner.parent is op.parent and owner.parent.get_operation_index(owner) < op.parent.get_operation_index(op)


# -- rotary ----------------------------------------------------------------------------------------


def _slice_of(v: SSAValue, x: SSAValue, start: int, end: int, step: int = 1) -> bool:
    s = producer(v, SliceOp)
    return s is not None and s.input == x and s.bounds() == (last_dim(x), start, end, step)


def _rotated(rot: SSAValue, x: SSAValue) -> str | None:
    """The layout if rot = rotate_half(x) or rotate_every_two(x) along the last dim."""
    if not shape(x):  # a scalar (a constant, a full reduction) has no dim to rotate
        return None
    d = shape(x)[-1]
    cat = producer(rot, CatOp)
    if cat is not None and len(cat.inputs) == 2 and cat.axis == last_dim(x):
        neg = producer(cat.inputs[0], NegOp)
        if neg is not None and _slice_of(neg.input, x, d // 2, d) and _slice_of(cat.inputs[1], x, 0, d // 2):
            return "half"
    flat = producer(rot, ReshapeOp)  # stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    if flat is not None and shape(rot) == shape(x):
        cat = producer(flat.input, CatOp)
        if cat is not None and len(cat.inputs) == 2 and cat.axis == len(shape(flat.input)) - 1:
            a, b = (producer(i, ReshapeOp) for i in cat.inputs)
            neg = producer(a.input, NegOp) if a is not None else None
            if neg is not None and b is not None and _slice_of(neg.input, x, 1, d, 2):
                if _slice_of(b.input, x, 0, d, 2):
                    return "interleaved"
    return None


class RecognizeRotary(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AddOp, rewriter: PatternRewriter):
        for m1, m2 in operand_pairs(op):
            a, b = producer(m1, MulOp), producer(m2, MulOp)
            if a is None or b is None or not single_use(m1, m2):
                continue
            for x, cos in operand_pairs(a):
                for rot, sin in operand_pairs(b):
                    layout = _rotated(rot, x)
                    if layout is None or not rot.has_one_use():
                        continue
                    if install(rewriter, RotaryOp(x, cos, sin, layout), op.result):
                        return


class RecognizePartialRotary(RewritePattern):
    """cat(rotary(x[..., :rd]), x[..., rd:]) -> rotary(x, rotary_dim=rd)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CatOp, rewriter: PatternRewriter):
        if len(op.inputs) != 2 or op.axis != len(shape(op.result)) - 1:
            return
        rot = producer(op.inputs[0], RotaryOp)
        if rot is None or not op.inputs[0].has_one_use() or rot.dim != shape(rot.input)[-1]:
            return
        head = producer(rot.input, SliceOp)
        if head is None:
            return
        x = head.input
        rd, d = shape(rot.input)[-1], shape(x)[-1]
        if not (_slice_of(rot.input, x, 0, rd) and _slice_of(op.inputs[1], x, rd, d)):
            return
        install(rewriter, RotaryOp(x, rot.cos, rot.sin, rot.layout.data, rd), op.result)


# -- glu, softmax ----------------------------------------------------------------------------------


class RecognizeGlu(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MulOp, rewriter: PatternRewriter):
        for a, up in operand_pairs(op):
            act = producer(a, (SiluOp, GeluOp))
            if act is None or not a.has_one_use() or shape(act.input) != shape(up) or shape(up) != shape(op.result):
                continue
            kind = "silu" if isinstance(act, SiluOp) else ("gelu_tanh" if act.approximate.data == "tanh" else "gelu")
            if install(rewriter, GluOp(act.input, up, kind), op.result):
                return


class RecognizeSoftmax(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DivOp, rewriter: PatternRewriter):
        e, s = op.lhs, op.rhs
        exp, total = producer(e, ExpOp), producer(s, ReduceSumOp)
        if exp is None or total is None or total.input != e or not total.keep or len(total.axes) != 1:
            return
        dim = total.axes[0]
        if e.uses.get_length() != 2 or not s.has_one_use():
            return
        x = exp.input
        sub = producer(x, SubOp)
        mx = producer(sub.rhs, ReduceMaxOp) if sub is not None else None
        if mx is None or mx.input != sub.lhs or mx.axes != (dim,) or not mx.keep or not single_use(x, sub.rhs):
            return  # (without the max, eager's exp overflows where dl.softmax's does not: inf / inf is NaN there)
        if not spelled_in_f32(op.result):
            return
        install(rewriter, SoftmaxOp(sub.lhs, dim), op.result)


# -- linear ---------------------------------------------------------------------------------------


class RecognizeLinear(RewritePattern):
    """x @ W with W weight-only and 2-D -> linear(x, W^T). A transpose spelled in the code (x @ W.T, W.t(),
    W.transpose(0, 1)) is read through; any other W gets a `dl.permute`, a weight computed once."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MatmulOp, rewriter: PatternRewriter):
        w = op.rhs
        if len(shape(w)) != 2 or not is_constant(w):
            return
        t = producer(w, PermuteOp)
        if t is not None and t.permutation == (1, 0):
            install(rewriter, LinearOp(op.lhs, t.input), op.result)
        else:
            wt = PermuteOp(w, [1, 0])
            install(rewriter, LinearOp(op.lhs, wt.result), op.result, [wt])


class RecognizeLinearBias(RewritePattern):
    """linear(x, W) + b with b weight-only [N] -> linear(x, W, b) (GPT-2's addmm, `x @ W.T + b`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AddOp, rewriter: PatternRewriter):
        for y, b in operand_pairs(op):
            lin = producer(y, LinearOp)
            if lin is None or lin.bias is not None or not y.has_one_use() or not is_constant(b):
                continue
            if install(rewriter, LinearOp(lin.input, lin.weight, b), op.result):
                rewriter.erase(lin)
                return


# -- attention --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepeatedHeads:
    """v [..., Hk*g, L, D] = each head of kv [..., Hk, L, D] repeated g times in a row (head h reads kv head h // g,
    as SDPA's enable_gqa): `expanded`, the tensor with a size-1 dim right after the heads, broadcast to g and
    merged into the heads (then `perm`, the heads/sequence transpose, if it comes after)."""

    expanded: SSAValue
    kv_shape: tuple[int, ...]  # kv's shape before `perm`
    perm: tuple[int, ...] | None
    groups: int

    def unrepeated(self) -> tuple[SSAValue, list[Operation]]:
        """kv, and the new view ops computing it (none when it is an existing value)."""
        new: list[Operation] = []
        inner = producer(self.expanded, ReshapeOp)
        if inner is not None and shape(inner.input) == self.kv_shape:  # repeat_kv's x[:, :, None]
            kv = inner.input
        else:
            new.append(ReshapeOp(self.expanded, self.kv_shape))
            kv = new[-1].results[0]
        if self.perm is not None:
            new.append(PermuteOp(kv, self.perm))
            kv = new[-1].results[0]
        return kv, new


def repeated_heads(v: SSAValue) -> RepeatedHeads | None:
    """How v repeats its heads, if it does: reshape(broadcast(t)) merging an expanded size-1 dim into the heads
    dim before it, the heads/sequence transpose before or after (HF's repeat_kv, repeat_interleave, Falcon's
    broadcast_to + flatten)."""
    rank = len(shape(v))
    if rank < 3:
        return None
    perm = producer(v, PermuteOp)
    merged = perm.input if perm is not None else v
    h = perm.permutation[rank - 3] if perm is not None else rank - 3  # the heads dim of `merged`
    flat = producer(merged, ReshapeOp)
    bc = producer(flat.input, BroadcastOp) if flat is not None else None
    if bc is None:
        return None
    out, wide, src = shape(merged), shape(bc.result), shape(bc.input)
    if len(wide) != rank + 1 or len(src) != rank + 1 or wide[:h] + wide[h + 2 :] != out[:h] + out[h + 1 :]:
        return None
    hk, g = wide[h], wide[h + 1]
    kv_shape = (*wide[:h], hk, *wide[h + 2 :])
    if g == 1 or hk * g != out[h] or src[h + 1] != 1 or (*src[: h + 1], *src[h + 2 :]) != kv_shape:
        return None
    return RepeatedHeads(bc.input, kv_shape, perm.permutation if perm is not None else None, g)


def repeat_heads(x: SSAValue, groups: int) -> list[Operation]:
    """The ops repeating each head of x [..., Hk, L, D] `groups` times in a row (repeat_kv's spelling); the last
    one's result is [..., Hk*groups, L, D]."""
    *lead, hk, n, d = shape(x)
    one = ReshapeOp(x, [*lead, hk, 1, n, d])
    wide = BroadcastOp(one.result, [*lead, hk, groups, n, d])
    return [one, wide, ReshapeOp(wide.result, [*lead, hk * groups, n, d])]


class RecognizeRotaryOfRepeatedHeads(RewritePattern):
    """rotary(repeated heads) -> repeated heads of rotary(k) when cos/sin are the same for every head (Falcon's
    new decoder architecture repeats k before its rotary): rotary then runs once per k head, and the repeat
    meets the sdpa, where `RecognizeGroupedAttention` sees it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RotaryOp, rewriter: PatternRewriter):
        rep = repeated_heads(op.input)
        if rep is None or not op.input.has_one_use():
            return
        if any(len(shape(t)) >= 3 and shape(t)[-3] != 1 for t in (op.cos, op.sin)):
            return
        kv, new = rep.unrepeated()
        rot = RotaryOp(kv, op.cos, op.sin, op.layout.data, op.dim)
        *repeat, out = repeat_heads(rot.result, rep.groups)
        install(rewriter, out, op.result, [*new, rot, *repeat])


class RecognizeGroupedAttention(RewritePattern):
    """sdpa over k and v whose heads are repeated the same way -> sdpa over the unrepeated k/v with enable_gqa:
    the attention kernel then reads each k/v head once per group, not a materialized copy per query head."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: SDPAOp, rewriter: PatternRewriter):
        rk, rv = repeated_heads(op.key), repeated_heads(op.value)
        if rk is None or rv is None or rk.groups != rv.groups:
            return
        (k, new_k), (v, new_v) = rk.unrepeated(), rv.unrepeated()
        scale = op.scale.value.data if op.scale is not None else None
        new = SDPAOp(op.query, k, v, op.mask, op.causal, scale, True, **op.mask_semantics)
        install(rewriter, new, op.result, [*new_k, *new_v])


class RecognizeCausalMask(RewritePattern):
    """sdpa whose mask the frontend found to keep exactly the keys j <= i of each query row i (a mask made from
    constants alone, frontend/masks.py) -> torch's causal sdpa over the first S keys, the only ones a row can see:
    no mask read (flash attention, and our kernel's causal loop bound) and a static cache's unused tail not read.
    (A mask keeping j <= i + d with d > 0 stays as it is.)"""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: SDPAOp, rewriter: PatternRewriter):
        owner = op.mask.owner if op.mask is not None else None
        offset = owner.attributes.get("causal_offset") if isinstance(owner, Operation) else None
        if offset is None or offset.value.data != 0 or op.causal or op.mode == "drop" or op.mask_fill is not None:
            return
        q, k, m = shape(op.query), shape(op.key), shape(op.mask)
        s, l_ = q[-2], k[-2]
        if m[-2:] != (s, l_) or s > l_:
            return
        dim = len(k) - 2
        cut = [SliceOp(t, dim, 0, s) for t in (op.key, op.value)] if s < l_ else []
        key, value = (cut[0].result, cut[1].result) if cut else (op.key, op.value)
        scale = op.scale.value.data if op.scale is not None else None
        install(rewriter, SDPAOp(op.query, key, value, None, True, scale, op.gqa, op.masked_rows.data), op.result, cut)


def _scaled_scores(s: SSAValue) -> tuple[SSAValue, float] | None:
    """(q @ k^T value, scale) for s = qk * c, qk / c or qk."""
    op = producer(s, (MulOp, DivOp))
    if isinstance(op, MulOp):
        for qk, c in operand_pairs(op):
            if scalar(c) is not None and producer(qk, MatmulOp) and qk.has_one_use():
                return qk, scalar(c)
    if isinstance(op, DivOp) and scalar(op.rhs) and producer(op.lhs, MatmulOp) and op.lhs.has_one_use():
        return op.lhs, 1.0 / scalar(op.rhs)
    if producer(s, MatmulOp):
        return s, 1.0
    return None


def _joined(masks: list[SSAValue], mode: str) -> list[LogicalOp]:
    """The ops joining masks filled in turn into one: a key is dropped by any of them (or), or kept by all (and, for
    where's keep masks)."""
    ops, mask = [], masks[0] if masks else None
    for m in masks[1:]:
        both = LogicalOp("and" if mode == "keep" else "or", mask, m)
        ops.append(both)
        mask = both.result
    return ops


def _filled_scores(s: SSAValue) -> tuple[SSAValue, list[SSAValue], str, float] | None:
    """(scaled scores, masks, mask_mode, fill) for s = where(mask, scores, fill) ("keep") or where(mask, fill,
    scores) (masked_fill's, "drop"), the fill a number below inf; masks filled in turn with one fill and polarity
    (a causal mask, then a padding mask) are peeled too, outermost first."""
    masks, mode, value = [], None, None
    while (sel := producer(s, WhereOp)) is not None and s.has_one_use():
        for sc, f, how in ((sel.lhs, sel.rhs, "keep"), (sel.rhs, sel.lhs, "drop")):
            v = scalar(f)
            if v is None or math.isnan(v) or v == math.inf or shape(sc) != shape(s) or mode not in (None, how):
                continue
            if value is not None and v != value:
                continue
            masks.append(sel.cond)
            s, mode, value = sc, how, v
            break
        else:
            break
    if not masks or _scaled_scores(s) is None:
        return None
    return s, masks, mode, value


class RecognizeAttention(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MatmulOp, rewriter: PatternRewriter):
        p, v = op.lhs, op.rhs
        probs = strip_convert(p)
        sm = producer(probs, SoftmaxOp)
        if sm is None or sm.axis != len(shape(probs)) - 1 or not single_use(p, probs) or len(shape(v)) not in (3, 4):
            return
        s = strip_convert(sm.input)
        if s != sm.input and not single_use(sm.input):
            return
        mask, masks, mode, fill = None, [], "sdpa", None
        filled = _filled_scores(s)
        if filled is not None:
            s, masks, mode, value = filled
            # (a finite fill as the scores' dtype holds it, as eager's masked_fill writes it)
            fill = None if value == -math.inf else torch.tensor(value, dtype=dtype_of(s)).item()
        add = producer(s, AddOp) if mode == "sdpa" else None
        if add is not None and s.has_one_use():
            for sc, m in operand_pairs(add):
                if _scaled_scores(sc) is not None and sc.has_one_use():
                    s, mask = sc, m
                    break
        found = _scaled_scores(s)
        if found is None or not s.has_one_use():
            return
        qk, scale = found
        mm = producer(qk, MatmulOp)
        q, kt = mm.lhs, mm.rhs
        tr = producer(kt, PermuteOp)
        r = len(shape(q))
        if tr is None or tr.permutation != (*range(r - 2), r - 1, r - 2) or not kt.has_one_use() or r != len(shape(v)):
            return
        k = tr.input
        if q.type.element_type != k.type.element_type or op.result.type.element_type != q.type.element_type:
            return
        if math.isnan(scale) or scale <= 0:
            return
        # softmax of a row that the mask empties, or whose scores hold NaN (a non-finite q or k), is NaN; SDPA's
        # kernels may give 0 there: the op keeps the explicit form's NaN, with or without a mask
        unions = _joined(masks, mode)  # (made once the match holds)
        if masks:
            mask = unions[-1].result if unions else masks[0]
        if r == 4:
            sdpa = SDPAOp(q, k, v, mask, False, scale, SDPAOp.multi_query(q, k, v), "nan", mode, fill)
            install(rewriter, sdpa, op.result, unions)
            return
        # [B, S, D] operands, one head a module (Karpathy's GPT lecture): the sdpa of their [1, B, S, D] views (a
        # mask broadcasts alike against both: from the right)
        views = [ReshapeOp(t, (1, *shape(t))) for t in (q, k, v)]
        att = SDPAOp(*(o.result for o in views), mask, False, scale, False, "nan", mode, fill)
        try:
            att.verify()
        except Exception:  # noqa: BLE001 - batches that broadcast (k of batch 1 against q's B): left as they are
            for o in (att, *reversed(views), *reversed(unions)):
                discard(o)
            return
        install(rewriter, ReshapeOp(att.result, shape(op.result)), op.result, [*unions, *views, att])


RECOGNIZERS: list[type[RewritePattern]] = [
    RecognizeRMSNorm,
    RecognizeLayerNorm,
    RecognizeRotary,
    RecognizePartialRotary,
    RecognizeGlu,
    RecognizeSoftmax,
    RecognizeAttention,
    RecognizeGroupedAttention,
    RecognizeCausalMask,
    RecognizeRotaryOfRepeatedHeads,
    RecognizeLinear,
    RecognizeLinearBias,
]


@register_pass
@dataclass(frozen=True)
class RecognizePass(ModulePass):
    """Raise decomposed norms, rotary, gated activations, softmax, attention (grouped too) and linears to composite
    ops."""

    name = "recognize"
    add_rms_norm: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        rewrite_spellings(op)  # one form of SiLU, GELU, mean and rotary first (passes/spellings.py)
        patterns = [p() for p in RECOGNIZERS]
        PatternRewriteWalker(GreedyRewritePatternApplier(patterns)).rewrite_module(op)
        if self.add_rms_norm:
            PatternRewriteWalker(RecognizeAddRMSNorm()).rewrite_module(op)
