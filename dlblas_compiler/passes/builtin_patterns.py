"""The built-in fusion patterns, registered through the same public API users have.

  attention   (50)  sdpa with the views that produce q/k/v and consume its output  → attention template
  gemm       (100)  [rms_norm →] linear → epilogue (bias, residual, glu of two column halves, rotary on
                    head columns, slices, head reshapes/permutes, casts)            → gemm template
  row         (10)  elementwise chains, row reductions, norms, softmax, rotary     → row template
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from ..codegen import attention as attention_template
from ..codegen import gemm as gemm_template
from ..codegen import row as row_template
from ..dialects import ConstantOp, LinearOp, RMSNormOp, SDPAOp
from ..dialects.traits import MappingKind, kind_of
from ..codegen.views import VIEW_OPS
from .fuse import Plan, rule
from .patterns import register_fusion_pattern


def external_inputs(ops: list[Operation]) -> list[SSAValue]:
    inside = set(ops)
    seen: list[SSAValue] = []
    for o in ops:
        for v in o.operands:
            if v.owner not in inside and not isinstance(v.owner, ConstantOp) and v not in seen:
                seen.append(v)
    return seen


def _sorted(plan: Plan, ops) -> list[Operation]:
    return sorted(set(ops), key=plan.order.__getitem__)


def _in_block(plan: Plan, v: SSAValue) -> Operation | None:
    o = v.owner
    return o if isinstance(o, Operation) and o.parent is plan.block else None


# -- row -------------------------------------------------------------------------------------------


def _row_seed(op: Operation) -> bool:
    return not isinstance(op, VIEW_OPS + (ConstantOp,)) and isinstance(
        row_template.analyze([op], external_inputs([op])), row_template.RowPlan
    )


def row_pattern(op: Operation, plan: Plan):
    """Grow a row region from a one-to-one / row op along producer and consumer edges."""
    if not plan.free(op) or not _row_seed(op):
        return None
    region = [op]
    frontier = [op]
    while frontier:
        cur = frontier.pop()
        neighbors = [p for v in cur.operands if (p := _in_block(plan, v)) is not None]
        neighbors += [u.operation for r in cur.results for u in r.uses]
        for cand in neighbors:
            if cand in region or not plan.free(cand):
                continue
            is_producer = any(r in cur.operands for r in cand.results)
            if isinstance(cand, VIEW_OPS) and not is_producer:
                continue
            why = rule(kind_of(cand) if is_producer else kind_of(cur), kind_of(cur) if is_producer else kind_of(cand))
            if why.startswith("never"):
                continue
            trial = _sorted(plan, region + [cand])
            res = row_template.analyze(trial, external_inputs(trial))
            if isinstance(res, row_template.RowPlan) and plan._convex(trial):
                region = trial
                frontier.append(cand)
    if all(isinstance(o, VIEW_OPS) for o in region):
        return None
    return region


# -- gemm ------------------------------------------------------------------------------------------


def gemm_pattern(op: Operation, plan: Plan):
    """[rms_norm →] linear → epilogue ops, as far as the GEMM template can take them."""
    if not isinstance(op, LinearOp) or not plan.free(op):
        return None
    region = [op]
    norm = op.input.owner
    if isinstance(norm, RMSNormOp) and plan.free(norm) and all(u.operation is op for u in norm.result.uses):
        if isinstance(gemm_template.analyze([norm, op], external_inputs([norm, op])), gemm_template.GemmPlan):
            region = [norm, op]
    grown = True
    while grown:
        grown = False
        for o in list(region):
            for r in o.results:
                for u in r.uses:
                    cand = u.operation
                    if cand in region or not plan.free(cand):
                        continue
                    trial = _sorted(plan, region + [cand])
                    if isinstance(gemm_template.analyze(trial, external_inputs(trial)), gemm_template.GemmPlan) and plan._convex(trial):
                        region, grown = trial, True
    lone = len(region) == 1
    return region, lone


# -- attention -------------------------------------------------------------------------------------


def attention_pattern(op: Operation, plan: Plan):
    """sdpa, plus the permute/reshape views producing q, k, v and the ones consuming the output."""
    if not isinstance(op, SDPAOp) or not plan.free(op):
        return None
    region = [op]
    for v in (op.query, op.key, op.value):  # views producing the operands
        p = _in_block(plan, v)
        while p is not None and isinstance(p, VIEW_OPS) and plan.free(p) and all(u.operation in region for u in p.results[0].uses):
            trial = _sorted(plan, region + [p])
            if not isinstance(attention_template.analyze(trial, external_inputs(trial)), attention_template.AttentionPlan):
                break
            region = trial
            p = _in_block(plan, p.operands[0])
    cur = op
    while cur.results[0].has_one_use():  # views consuming the output
        nxt = cur.results[0].get_unique_use().operation
        if not isinstance(nxt, VIEW_OPS) or not plan.free(nxt):
            break
        trial = _sorted(plan, region + [nxt])
        if not isinstance(attention_template.analyze(trial, external_inputs(trial)), attention_template.AttentionPlan):
            break
        region, cur = trial, nxt
    if not isinstance(attention_template.analyze(region, external_inputs(region)), attention_template.AttentionPlan):
        return None
    return region


register_fusion_pattern("attention", attention_pattern, "attention", priority=50)
register_fusion_pattern("gemm", gemm_pattern, "gemm", priority=100)
register_fusion_pattern("row", row_pattern, "row", priority=10)

__all__ = ["external_inputs", "row_pattern", "gemm_pattern", "attention_pattern", "MappingKind"]
