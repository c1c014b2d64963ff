"""The built-in fusion patterns, registered through the same public API users have.

  gemm       (100)  [rms_norm | layer_norm →] linear → epilogue (bias, residual, glu of two column halves, rotary on
                    head columns, slices, head reshapes/permutes, casts, k/v stored into a cache at
                    their positions), as far as the gemm template takes it           → gemm template
  attention   (50)  sdpa with the views that produce q/k/v and consume its output   → attention template
  row         (10)  elementwise chains, row reductions, norms, softmax, rotary, grown along the legal
                    producer/consumer edges (DNNFusion)                               → row template
Each asks its template (`ask`) whether a candidate region can be lowered; none imports a template.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from ..dialects import VIEW_OPS, ConstantOp, LayerNormOp, LinearOp, RMSNormOp, SDPAOp
from ..dialects.traits import kind_of
from .patterns import Match, register_fusion_pattern
from .planner import Plan, ask, rule
from .templates import WhyNot


def _in_block(plan: Plan, v: SSAValue) -> Operation | None:
    o = v.owner
    return o if isinstance(o, Operation) and o.parent is plan.block else None


def _takes(template: str, ops: list[Operation]) -> bool:
    return not isinstance(ask(template, ops), WhyNot)


def row_pattern(op: Operation, plan: Plan):
    """Grow a row region from a one-to-one / row op along producer and consumer edges."""
    if not plan.free(op) or isinstance(op, (*VIEW_OPS, ConstantOp)) or not _takes("row", [op]):
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
            added = [cand]
            grown = _grown(plan, region, added)
            if grown is None and (branch := _other_branch(plan, region, cand)):
                added = branch + [cand]
                grown = _grown(plan, region, added)
            if grown is not None:  # (a branch's ops are grown from too: they may have other consumers)
                region, frontier = grown, frontier + added
    if all(isinstance(o, VIEW_OPS) for o in region):
        return None
    return region


def _grown(plan: Plan, region: list[Operation], ops: list[Operation]) -> list[Operation] | None:
    trial = plan.sorted(region + ops)
    return trial if _takes("row", trial) and plan.convex(trial) else None


def _other_branch(plan: Plan, region: list[Operation], cand: Operation, limit: int = 8) -> list[Operation]:
    """The free ops outside `region` that feed `cand`, up to `limit` of them (else none): the other branch of a
    diamond that joins at cand (`log(sum(exp(x - max_keepdim(x)))) + max(x)`), which growing one op at a time may
    not take: the region can read the join's operand from outside, and then the branch's ops, one by one, do not
    fit the row space without the ops before them."""
    branch: list[Operation] = []
    todo = [cand]
    while todo:
        for v in todo.pop().operands:
            p = _in_block(plan, v)
            if p is None or p in region or p in branch or not plan.free(p):
                continue
            branch.append(p)
            todo.append(p)
            if len(branch) > limit:
                return []
    return branch


def gemm_pattern(op: Operation, plan: Plan):
    """[rms_norm | layer_norm →] linear → epilogue ops, as far as the GEMM template can take them (the norm when
    the linear is its only reader)."""
    if not isinstance(op, LinearOp) or not plan.free(op):
        return None
    region = [op]
    norm = op.input.owner
    only_reader = isinstance(norm, Operation) and all(u.operation is op for u in norm.results[0].uses)
    if isinstance(norm, (RMSNormOp, LayerNormOp)) and plan.free(norm) and only_reader:
        if _takes("gemm", [norm, op]):
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
                    trial = plan.sorted(region + [cand])
                    if _takes("gemm", trial) and plan.convex(trial):
                        region, grown = trial, True
    return Match(region, profile=len(region) == 1)


def attention_pattern(op: Operation, plan: Plan):
    """sdpa, plus the permute/reshape views producing q, k, v and the ones consuming the output."""
    if not isinstance(op, SDPAOp) or not plan.free(op):
        return None
    region = [op]
    for v in (op.query, op.key, op.value):  # views producing the operands
        p = _in_block(plan, v)
        while p is not None and isinstance(p, VIEW_OPS) and plan.free(p) and all(u.operation in region for u in p.results[0].uses):
            trial = plan.sorted(region + [p])
            if not _takes("attention", trial):
                break
            region = trial
            p = _in_block(plan, p.operands[0])
    cur = op
    while cur.results[0].has_one_use():  # views consuming the output
        nxt = cur.results[0].get_unique_use().operation
        if not isinstance(nxt, VIEW_OPS) or not plan.free(nxt):
            break
        trial = plan.sorted(region + [nxt])
        if not _takes("attention", trial):
            break
        region, cur = trial, nxt
    return region if _takes("attention", region) else None


register_fusion_pattern("attention", attention_pattern, "attention", priority=50, builtin=True)
register_fusion_pattern("gemm", gemm_pattern, "gemm", priority=100, builtin=True)
register_fusion_pattern("row", row_pattern, "row", priority=10, builtin=True)
