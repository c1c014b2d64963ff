"""`fuse`: the fusion planner. Groups ops into `dl.fused` regions, each of which becomes one kernel.

Patterns are tried by priority (built-ins: attention, norm → GEMM → epilogue, then generic row regions);
each proposes a set of unclaimed ops around an anchor, the region's template is asked whether it can lower
them (`can_lower`, through the template registry only), and a region that is convex (no path leaves it and
comes back) is claimed. The generic pattern is DNNFusion's: seeded at one-to-one ops and grown along
producer/consumer edges that the legality table below allows and the row template can implement. Views between
regions then move into the regions that read them (`sink_views`), and a region's output made by a permutation
leaves it in eager's order where its readers take the permutation as a view (`yield_in_eager_order`). Last, each
region's inputs whose memory nothing reads after it are marked on it (`overwritable`, `dialects.aliasing`): its
kernel may write over them (a GEMM's residual, into which cuBLAS adds the product).

Legality (producer kind, consumer kind) → rule; "template" means only a template that supports the
combination may fuse it (norm statistics in a GEMM prologue, rotary in a GEMM epilogue, ...).
Profitability is explicit: fusing saves writing and re-reading every intermediate; the only
recomputation a template does is the norm statistics per GEMM column tile (K reads of A already made
by the tile, 1/(2*BLOCK_N) of the GEMM's flops), so legal fusions are always taken, except a lone GEMM,
which gains nothing from fusion and is marked `profile` so the runtime measures it against cuBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, ModuleOp, StringAttr, UnitAttr, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from ..dialects import (
    VIEW_OPS,
    AddOp,
    AddRMSNormOp,
    ConstantOp,
    FusedOp,
    LinearOp,
    ParamOp,
    PermuteOp,
    RMSNormOp,
    RotaryOp,
    SDPAOp,
    TorchCallOp,
    YieldOp,
    inverse_permutation,
)
from ..dialects.aliasing import overwritable
from ..dialects.traits import MappingKind, kind_of
from ..dialects.types import shape_of
from ..passes.algebraic import is_constant
from ..passes.match import producer, set_name
from ..passes.registry import register_pass
from .patterns import FusionPattern, patterns_by_priority
from .templates import TEMPLATES, ReferenceLowering, WhyNot, can_lower

K = MappingKind
LEGALITY: dict[tuple[MappingKind, MappingKind], str] = {
    (K.ONE_TO_ONE, K.ONE_TO_ONE): "fuse",
    (K.ONE_TO_ONE, K.MANY_TO_MANY): "fuse: row template (row reductions, norms, softmax)",
    (K.MANY_TO_MANY, K.ONE_TO_ONE): "fuse: row template, or a GEMM / attention epilogue",
    (K.MANY_TO_MANY, K.MANY_TO_MANY): "template only (norm statistics in a GEMM prologue)",
    (K.ONE_TO_MANY, K.ONE_TO_ONE): "fuse as an index map (broadcast recomputed per use)",
    (K.REORGANIZE, K.ONE_TO_ONE): "fuse as an index map on the region's input",
    (K.SHUFFLE, K.ONE_TO_ONE): "fuse as an index map on the region's input",
    (K.ONE_TO_ONE, K.REORGANIZE): "fuse as an index map on a GEMM / attention output",
    (K.ONE_TO_ONE, K.SHUFFLE): "fuse as an index map on a GEMM / attention output",
    (K.OPAQUE, K.ONE_TO_ONE): "never: opaque ops run in PyTorch",
    (K.ONE_TO_ONE, K.OPAQUE): "never: opaque ops run in PyTorch",
}


def rule(producer_kind: MappingKind | None, consumer_kind: MappingKind | None) -> str:
    if K.OPAQUE in (producer_kind, consumer_kind):
        return "never: opaque ops run in PyTorch"
    return LEGALITY.get((producer_kind, consumer_kind), "template only")


def external_inputs(ops: list[Operation]) -> list[SSAValue]:
    """The values a set of ops reads from outside it (scalar constants aside), in first-use order."""
    inside = set(ops)
    seen: list[SSAValue] = []
    for o in ops:
        for v in o.operands:
            if v.owner not in inside and not isinstance(v.owner, ConstantOp) and v not in seen:
                seen.append(v)
    return seen


def ask(template: str, ops: list[Operation]) -> object | WhyNot:
    """The named template's plan for these ops, or why it cannot lower them. A template that raises is taken to
    accept the ops: its bug then surfaces when the region is lowered, as a fallback with a warning (strict: an
    error), instead of breaking the compile here."""
    try:
        return can_lower(template, ops, external_inputs(ops))
    except Exception:  # noqa: BLE001
        return None


@dataclass
class RegionPlan:
    pattern: FusionPattern
    ops: list[Operation]
    profile: bool = False


@dataclass
class Plan:
    """What the planner knows while it runs; patterns read it to decide what is still free."""

    block: Block
    order: dict[Operation, int]
    claimed: dict[Operation, int] = field(default_factory=dict)
    regions: list[RegionPlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _next_effect: dict[Operation, Operation] | None = field(default=None, repr=False)
    _spans: dict[int, tuple] = field(default_factory=dict, repr=False)  # region id -> (its size, its span)

    def _effects(self) -> dict[Operation, Operation]:
        """Each side-effecting op of the block (`_is_effect`) -> the next one."""
        if self._next_effect is None:
            chain = [o for o in self.block.ops if _is_effect(o)]
            self._next_effect = dict(zip(chain, chain[1:]))
        return self._next_effect

    def free(self, op: Operation) -> bool:
        return op.parent is self.block and op not in self.claimed and not _never_fused(op)

    def sorted(self, ops) -> list[Operation]:
        return sorted(set(ops), key=self.order.__getitem__)

    def claim(self, pattern: FusionPattern, ops: list[Operation], profile: bool = False) -> bool:
        ops = self.sorted(ops)
        if not ops or not all(self.free(o) for o in ops) or not self.convex(ops):
            return False
        rid = len(self.regions)
        self.regions.append(RegionPlan(pattern, ops, profile))
        for o in ops:
            self.claimed[o] = rid
        return True

    def convex(self, ops: list[Operation]) -> bool:
        """No path from the ops through an outside op back into them (so they can run as one kernel). Paths also
        step from a side-effecting op to the next one (torch calls keep their order, `topo_sort`): a region read
        by one torch call must not also read a later one's result. And a path that enters a region already
        claimed leaves it from any of its ops: the region runs as one kernel, all its outputs after all its
        inputs, so `ops` must not read a region that reads them (the GEMM region {linear h, h * exp(w)} and a row
        region {exp(w), mean(exp(w)) * mean(h)} read each other though no op of one reads back into the other)."""
        inside = set(ops)
        effects = self._effects()
        own = {self.claimed[o] for o in ops if o in self.claimed}  # (a region being extended by `ops`)
        # uses come later in the block, so past `last` nothing leads back, except through a region claimed
        # with ops on both sides of it: stretch `last` over those (regions by first op; one pass suffices)
        last = max(self.order[o] for o in ops)
        for lo, hi in sorted(self._span(r) for rid, r in enumerate(self.regions) if rid not in own and r.ops):
            if lo > last:
                break
            last = max(last, hi)
        frontier = [u.operation for o in ops for r in o.results for u in r.uses if u.operation not in inside]
        seen: set[Operation] = set()
        entered = set(own)
        while frontier:
            op = frontier.pop()
            if op in seen or op.parent is not self.block:
                continue
            seen.add(op)
            if self.order[op] > last:
                continue
            rid = self.claimed.get(op)
            if rid is not None and rid not in entered:  # into a region: out of every op of it
                entered.add(rid)
                frontier.extend(self.regions[rid].ops)
            if op in effects:
                frontier.append(effects[op])
            for r in op.results:
                for u in r.uses:
                    if u.operation in inside:
                        return False
                    frontier.append(u.operation)
        return True

    def _span(self, region: RegionPlan) -> tuple[float, float]:
        """The block positions of a region's first and last op (kept per region until it grows: `convex` asks for
        every region's on every call)."""
        known = self._spans.get(id(region))
        if known is None or known[0] != len(region.ops):
            pos = [self.order[o] for o in region.ops]
            known = self._spans[id(region)] = (len(region.ops), (min(pos), max(pos)))
        return known[1]


def _copy_view_into_regions(plan: Plan, view: Operation) -> bool:
    """Give each region but one that reads `view` its own copy of it, where the region's template takes it; the
    last region's uses stay on `view` (sunk by the one-region rule). Whether any copy was taken."""
    uses = list(view.results[0].uses)
    rids = sorted({plan.claimed[u.operation] for u in uses})
    taken = False
    for rid in rids[:-1]:
        region = plan.regions[rid]
        mine = [(u.operation, u.index) for u in uses if plan.claimed[u.operation] == rid]
        copy = view.clone()
        plan.block.insert_op_before(copy, view)
        plan.order[copy] = plan.order[view]
        _redirect(mine, copy.results[0])
        trial = plan.sorted([*region.ops, copy])
        if not isinstance(ask(region.pattern.template, trial), WhyNot) and plan.convex(trial):
            region.ops = trial
            plan.claimed[copy] = rid
            taken = True
        else:
            _redirect(mine, view.results[0])
            del plan.order[copy]
            copy.detach()
            copy.erase()
    return taken


def _redirect(uses: list[tuple[Operation, int]], value: SSAValue) -> None:
    for user, index in uses:
        user.operands = tuple(value if i == index else v for i, v in enumerate(user.operands))


def _is_effect(op: Operation) -> bool:
    """Ops that keep their order among themselves: torch calls (opaque: they may write or draw random numbers) and
    the return."""
    return isinstance(op, (TorchCallOp, func.ReturnOp))


def _never_fused(op: Operation) -> bool:
    if isinstance(op, (ParamOp, ConstantOp, TorchCallOp, FusedOp, func.ReturnOp)):
        return True
    return all(is_constant(r) for r in op.results) if op.results else False


class SplitAddRMSNorm(RewritePattern):
    """add_rms_norm(x, r) whose sum comes from a linear and whose normed value feeds only linears:
        add_rms_norm(linear(..), r) → s = linear(..) + r (the GEMM's epilogue); rms_norm(s) (the next GEMM's
        prologue)
    zero extra kernels instead of one."""

    def __init__(self, notes: list[str]):
        self.notes = notes

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AddRMSNormOp, rewriter: PatternRewriter):
        gemm_in = any(producer(v, LinearOp) is not None and v.has_one_use() for v in (op.input, op.residual))
        users = [u.operation for u in op.normed.uses]
        if not gemm_in or not users or not all(isinstance(u, LinearOp) and u.input == op.normed for u in users):
            return
        eps, offset, in_f32 = op.attrs
        add = AddOp(op.input, op.residual)
        norm = RMSNormOp(add.result, op.weight, eps, offset, in_f32)
        if norm.result.type != op.normed.type or add.result.type != op.sum.type:
            norm.erase()
            add.erase()
            return
        set_name(add.result, op.sum)
        set_name(norm.result, op.normed)
        rewriter.replace(op, [add, norm], [norm.result, add.result])
        self.notes.append(f"split add_rms_norm %{add.result.name_hint}: the add joins the GEMM epilogue, the norm the next prologue")


def explain_unfused(plan: Plan) -> None:
    """Record, for every op left outside a region, the rule or template limit that kept it out."""
    for op in plan.block.ops:
        if op in plan.claimed or isinstance(op, (ParamOp, ConstantOp, func.ReturnOp)):
            continue
        if op.results and all(is_constant(r) for r in op.results):
            continue  # weight-only: evaluated once at load time
        name = f"{op.name} %{op.results[0].name_hint or ''}" if op.results else op.name
        if isinstance(op, TorchCallOp):
            why = rule(K.OPAQUE, K.ONE_TO_ONE)
        elif getattr(op, "UNFUSED", None):  # an op that says what runs it instead of a region
            why = op.UNFUSED
        elif isinstance(op, VIEW_OPS):
            why = "a view between regions: torch returns it without a copy"
        else:  # the template that would take it alone says why it did not
            res = ask("attention" if isinstance(op, SDPAOp) else "row", [op])
            why = str(res) if isinstance(res, WhyNot) else "no pattern claimed it"
        plan.notes.append(f"not fused: {name}: {why}")


def sink_views(plan: Plan) -> None:
    """Move a view (reshape, permute, slice, broadcast) whose users all sit in one region into that
    region, when its template can read the operand through the view's strides. A view read by several regions
    is copied into each that can take it (a view costs nothing where it is an index map; left between regions,
    a kernel reading it would copy it into a dense tensor first)."""
    changed = True
    while changed:
        changed = False
        for op in reversed(list(plan.block.ops)):
            if not isinstance(op, VIEW_OPS) or not plan.free(op):
                continue
            rids = {plan.claimed.get(u.operation) for u in op.results[0].uses}
            if len(rids) > 1 and None not in rids:
                changed |= _copy_view_into_regions(plan, op)
                continue
            if len(rids) != 1 or None in rids:
                continue
            rid = rids.pop()
            region = plan.regions[rid]
            trial = plan.sorted([*region.ops, op])
            if not isinstance(ask(region.pattern.template, trial), WhyNot) and plan.convex(trial):
                region.ops = trial
                plan.claimed[op] = rid
                changed = True


def _permuted_from(v: SSAValue, ops: set) -> tuple[int, ...] | None:
    """The permutation `v` was made by inside `ops`, where eager lays `v` out in the order before it: `v` is a
    dl.permute, or a rotary, elementwise or RMSNorm op of one (shaped as its first operand, whose layout eager's
    kernels give their result; an RMSNorm only over a last dim the permutation leaves in place: Qwen3's per-head
    norm), within `ops`; else None."""
    normed = False
    while True:
        op = v.owner
        if not isinstance(op, Operation) or op not in ops:
            return None
        if isinstance(op, PermuteOp):
            p = op.permutation
            return None if normed and p[-1] != len(p) - 1 else p
        if not op.operands or shape_of(op.operands[0]) != shape_of(v):
            return None
        if not (isinstance(op, (RotaryOp, RMSNormOp)) or kind_of(op) == MappingKind.ONE_TO_ONE):
            return None
        normed |= isinstance(op, RMSNormOp)
        v = op.operands[0]


def yield_in_eager_order(plan: Plan) -> None:
    """A region's output made by a permutation (q = rotary(transpose(view(x @ W^T)))) leaves the region in the
    order before it, as eager lays it out: the region yields the inverse permutation of it (a GEMM then stores
    whole rows of its tile) and each region reading it takes the permutation back as a view of its input, read
    through strides. Only where every reader is a region whose template takes that view (attention): an SDPA run
    by torch then returns its output in q's order, as eager's does, so the [B, S, H*D] reshape after it is a view
    instead of a copy (16 µs of a Llama-3.2-3B layer at 2048 tokens on an H200, bench/NOTES.md 154)."""
    for rid, region in enumerate(plan.regions):
        for op in list(region.ops):
            for y in op.results:
                outside = [(u.operation, u.index) for u in y.uses if plan.claimed.get(u.operation) != rid]
                perm = _permuted_from(y, set(region.ops)) if outside else None
                readers = {plan.claimed.get(user) for user, _ in outside}
                if perm is None or perm == tuple(range(len(perm))) or None in readers:
                    continue
                _yield_unpermuted(plan, rid, y, perm, outside, sorted(readers))


def _yield_unpermuted(plan: Plan, rid: int, y: SSAValue, perm: tuple[int, ...], outside: list, readers: list) -> None:
    """`yield_in_eager_order` for one output `y` of region `rid`, undone unless every template takes it."""
    stored = PermuteOp(y, inverse_permutation(perm))
    set_name(stored.result, y)
    plan.block.insert_op_after(stored, y.owner)
    plan.order[stored] = plan.order[y.owner] + 0.25  # (after y's op, before anything reading y)
    trials = {rid: plan.sorted([*plan.regions[rid].ops, stored])}
    views: list[PermuteOp] = []
    for r in readers:
        view = PermuteOp(stored.result, perm)
        set_name(view.result, y)
        plan.block.insert_op_after(view, stored)
        plan.order[view] = plan.order[stored] + 0.25
        _redirect([(user, i) for user, i in outside if plan.claimed[user] == r], view.result)
        views.append(view)
        trials[r] = plan.sorted([*plan.regions[r].ops, view])
    if all(not isinstance(ask(plan.regions[r].pattern.template, ops), WhyNot) for r, ops in trials.items()):
        for r, ops in trials.items():
            plan.regions[r].ops = ops
            for o in ops:
                plan.claimed[o] = r
        return
    _redirect(outside, y)
    for o in [*views, stored]:
        del plan.order[o]
        o.detach()
        o.erase()


def materialize(plan: Plan) -> list[FusedOp]:
    """Replace each planned region by a dl.fused op, then re-sort the block topologically."""
    fused_ops = [_build_region(region, rid) for rid, region in enumerate(plan.regions)]
    for region in plan.regions:
        for o in reversed(region.ops):
            o.detach()
            o.erase()
    topo_sort(plan.block)
    return fused_ops


def topo_sort(block: Block) -> None:
    """Order ops by dependencies (and keep side-effecting ops in their order), else as they were."""
    ops = list(block.ops)
    pos = {o: i for i, o in enumerate(ops)}
    graph = nx.DiGraph()
    graph.add_nodes_from(ops)
    for o in ops:
        for v in o.operands:
            if isinstance(v.owner, Operation) and v.owner in pos:
                graph.add_edge(v.owner, o)
    effects = [o for o in ops if _is_effect(o)]
    graph.add_edges_from(zip(effects, effects[1:]))
    order = list(nx.lexicographical_topological_sort(graph, key=pos.__getitem__))
    for o in ops:
        o.detach()
    for o in order:
        block.add_op(o)


def _build_region(region: RegionPlan, rid: int) -> FusedOp:
    fused, outputs = _region_op(region.pattern, region.ops, f"{region.pattern.name}_{rid}")
    if region.profile:
        fused.attributes["profile"] = UnitAttr()
    for old, new in zip(outputs, fused.outputs):
        if old.name_hint:
            new.name_hint = old.name_hint
        old.replace_all_uses_with(new)
    # the fused op takes the place of the region's first op; materialize() re-sorts the block
    region.ops[0].parent.insert_op_before(fused, region.ops[0])
    return fused


def _region_op(pattern: FusionPattern, ops: list[Operation], kernel: str) -> tuple[FusedOp, list[SSAValue]]:
    """A detached dl.fused op computing `ops` (cloned into its body), and the values of `ops` it yields (those used
    outside them)."""
    inside = set(ops)
    inputs = external_inputs(ops)
    body = Block(arg_types=[v.type for v in inputs])
    mapping: dict[SSAValue, SSAValue] = dict(zip(inputs, body.args))
    for v, a in zip(inputs, body.args):
        if v.name_hint:
            a.name_hint = v.name_hint
    for o in ops:
        for v in o.operands:
            c = v.owner
            if isinstance(c, ConstantOp) and v not in mapping:
                clone = c.clone()
                body.add_op(clone)
                mapping[v] = clone.result
        clone = o.clone(value_mapper=mapping)
        body.add_op(clone)
        for old, new in zip(o.results, clone.results):
            mapping[old] = new
            if old.name_hint:
                new.name_hint = old.name_hint
    outputs = [r for o in ops for r in o.results if any(u.operation not in inside for u in r.uses)]
    body.add_op(YieldOp(*[mapping[r] for r in outputs]))
    return FusedOp(pattern.name, inputs, body, kernel=kernel, template=pattern.template), outputs


def lowering_failure(pattern: FusionPattern, ops: list[Operation]) -> str | None:
    """Why the pattern's template fails to lower these ops (a user pattern's region is lowered once while planning,
    so a failing lowering leaves its ops to the other patterns instead of running them as a reference), or None."""
    trial, _ = _region_op(pattern, ops, f"{pattern.name}_trial")
    try:
        template = TEMPLATES[pattern.template]
        low = template.lower(trial, template.can_lower(trial.body_ops, list(trial.block.args)), trial.label)
        return low.reason if isinstance(low, ReferenceLowering) else None
    except Exception as e:  # noqa: BLE001 - a user template's or callable's error, reported as a note
        text = str(e).strip()
        return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
    finally:
        trial.erase()


def plan_regions(block: Block, notes: list[str]) -> Plan:
    """Run every pattern over the block (by priority) and claim the regions their templates can lower."""
    plan = Plan(block, {o: i for i, o in enumerate(block.ops)}, notes=notes)
    for pattern in patterns_by_priority():
        matched = False
        for o in list(block.ops):
            if not plan.free(o):
                continue
            m = pattern.match(o, plan)
            if m is None:
                continue
            matched = True
            where = f"{pattern.name} at {o.name} %{o.results[0].name_hint if o.results else ''}"
            why = ask(pattern.template, plan.sorted(m.ops))
            if isinstance(why, WhyNot):  # a template refuses at planning time what it cannot lower
                plan.notes.append(f"{where}: {why}")
            elif not pattern.builtin and (failed := lowering_failure(pattern, plan.sorted(m.ops))):
                plan.notes.append(f"{where}: lowering failed ({failed}); its ops are left to the other patterns")
            elif not plan.claim(pattern, m.ops, m.profile):
                plan.notes.append(f"{where}: region not convex or ops taken")
        if not matched and not pattern.builtin:
            plan.notes.append(f"pattern {pattern.name!r} matched nothing")
    sink_views(plan)
    yield_in_eager_order(plan)
    explain_unfused(plan)
    return plan


def fusion_notes(fn: func.FuncOp) -> list[str]:
    """What the fuse pass recorded on a function: ops it split, regions refused, ops left unfused and why."""
    attr = fn.attributes.get("fusion_notes")
    return [a.data for a in attr.data] if isinstance(attr, ArrayAttr) else []


@register_pass
@dataclass(frozen=True)
class FusePass(ModulePass):
    """Plan and build dl.fused regions (see the module docstring for the rules)."""

    name = "fuse"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for fn in [o for o in op.ops if isinstance(o, func.FuncOp)]:
            notes: list[str] = []
            PatternRewriteWalker(SplitAddRMSNorm(notes), apply_recursively=False).rewrite_region(fn.body)
            plan = plan_regions(fn.body.block, notes)
            materialize(plan)
            for fused, inputs in overwritable(fn).items():  # (inputs nothing reads after the region)
                fused.properties["overwritable"] = DenseArrayBase.from_list(i64, inputs)
            if plan.notes:
                fn.attributes["fusion_notes"] = ArrayAttr([StringAttr(n) for n in plan.notes])
