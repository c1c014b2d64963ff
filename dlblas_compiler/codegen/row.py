"""The generic row template: elementwise chains, broadcasts, row reductions, the row composites
(rms_norm, add_rms_norm, layer_norm, softmax, rotary, glu) and concatenation along the last dim over an
iteration space [*rows, N].

One program handles BLOCK_M rows with the whole last dim N in registers (BLOCK_N = next power of two,
masked), accumulating in fp32. Region inputs may be read through view chains (reshape, permute,
slice, broadcast) that the planner fused as index maps: each becomes an offset and per-dim strides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
from xdsl.ir import Operation, SSAValue

from ..dialects import (
    AddRMSNormOp,
    CatOp,
    ConstantOp,
    FusedOp,
    IndexCopyOp,
    LayerNormOp,
    ReduceMaxOp,
    ReduceMeanOp,
    ReduceOp,
    ReduceSumOp,
    RMSNormOp,
    RotaryOp,
    SoftmaxOp,
)
from ..dialects.types import dtype_of, numel, shape_of
from ..fusion.templates import PlannedTemplate, register_template
from ..tuning.space import SearchSpace, pow2
from .exprs import POINTWISE, Names, emit_pointwise, rotate_in_registers, round_to
from .kernel import Kernel
from .source import PDL_ARG, Writer, cdiv, chained_start, row_indices, stored, wide_indices
from .views import VIEW_OPS, Layout, column_offsets, row_view_chain, view_source

MAX_N = 32768
ROW_OPS = (RMSNormOp, AddRMSNormOp, LayerNormOp, SoftmaxOp, RotaryOp)


@dataclass
class Leaf:
    """A region input as a compute op reads it: through a view chain, broadcast to a target shape."""

    arg: int  # index of the region input
    chain: list[Operation]
    value: SSAValue  # the SSA value the compute op reads (end of the chain)
    layout: Layout  # where the chain's elements live in the (contiguous) region input
    factors: tuple[tuple[int, int], ...] = ()  # a last dim merged from dims no stride expresses (`row_view_chain`)
    per_row: bool = False  # read by ops on a reduction's per-row values: aligned with the rows, one value each


@dataclass
class RowPlan:
    iter_shape: tuple[int, ...]
    ops: list[Operation]  # compute ops in order
    leaves: dict[SSAValue, Leaf] = field(default_factory=dict)
    outputs: list[SSAValue] = field(default_factory=list)
    # values of shape rows (iter_shape[:-1]) with one value per row: a reduction's result without keepdim and
    # what is computed from it (other values of that rank broadcast against iter_shape, right-aligned)
    per_row: set[SSAValue] = field(default_factory=set)
    # a dl.cat along the last dim -> its parts in order, each read from memory at its own column range
    parts: dict[Operation, list[Leaf]] = field(default_factory=dict)
    # an output that is an index_copy's result -> the index_copy: its source's rows are stored into the destination
    # (a region input, passed as that output) at the positions its index holds along a row dim (a KV-cache update)
    scatters: dict[SSAValue, IndexCopyOp] = field(default_factory=dict)

    @property
    def rows(self) -> tuple[int, ...]:
        return self.iter_shape[:-1]

    @property
    def n(self) -> int:
        return self.iter_shape[-1]


def _full(shape: tuple[int, ...], it: tuple[int, ...]) -> bool:
    return shape == it


def _rowwise(shape: tuple[int, ...], it: tuple[int, ...]) -> bool:
    return shape == (*it[:-1], 1) or shape == it[:-1]


def _stores_full(shape: tuple[int, ...], it: tuple[int, ...], per_row: bool) -> bool:
    """An output with a value per column (else one value per row: a reduction's per-row values, or a value
    broadcast along the columns)."""
    return not per_row and bool(shape) and shape[-1] == it[-1]


def _broadcast(shape: tuple[int, ...], it: tuple[int, ...]) -> bool:
    """A value computed once per row space element after broadcasting (recomputed where replicated)."""
    if len(shape) > len(it) or (shape and shape[-1] not in (1, it[-1])):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], it[::-1]))


def analyze(ops: list[Operation], inputs: list[SSAValue]) -> RowPlan | str:
    """A RowPlan if the row template can compute these ops (given the region's inputs), else why not."""
    inside = set(ops)
    produced = {r: o for o in ops for r in o.results}
    compute = [o for o in ops if not isinstance(o, VIEW_OPS)]
    if not compute:
        return "a region of views only: nothing to compute"
    for o in compute:
        if not isinstance(o, POINTWISE + ROW_OPS + (ReduceOp, CatOp, IndexCopyOp)):
            return f"{o.name} is not a row op"
    candidates = [r for o in compute for r in o.results if not isinstance(o, (ConstantOp, IndexCopyOp))]
    if not candidates:
        return "a region of views and cache writes only: nothing to compute"
    # (a reduction's input counts: its rows are the row space even where every result is reduced, with keepdim)
    spaces = [shape_of(r) for r in candidates] + [shape_of(o.input) for o in compute if isinstance(o, ReduceOp)]
    it = max(spaces, key=lambda s: (numel(s), len(s)))
    if not it or it[-1] > MAX_N or it[-1] < 1:
        return f"the row length {it[-1] if it else 0} is outside 1..{MAX_N}"
    plan = RowPlan(it, compute)
    # values of shape it[:-1] made by a reduction without keepdim, and everything computed from them: one value
    # per row, whose other operands broadcast against the rows (right-aligned to it[:-1]), not against `it`
    per_row = plan.per_row
    for o in ops:
        if isinstance(o, VIEW_OPS):
            src = o.operands[0]
            if src in produced and not isinstance(produced[src], VIEW_OPS):
                return f"{o.name} of a computed value (only region inputs may be read through views)"
    for o in compute:
        if isinstance(o, IndexCopyOp):
            why = _scatter(plan, o, produced, inside, inputs)
            if why:
                return why
            continue
        if any(v in plan.scatters or any(v is c.dest for c in plan.scatters.values()) for v in o.operands):
            return f"{o.name} reads a tensor the kernel writes at indexed positions"
        rowwise = isinstance(o, ReduceOp) and len(shape_of(o.result)) == len(it) - 1
        if any(v in per_row for v in o.operands):
            if not isinstance(o, POINTWISE) or any(len(shape_of(r)) != len(it) - 1 for r in o.results):
                return (f"{o.name} broadcasts a reduction's per-row values (reduced without keepdim) along other "
                        "dims of the row space")  # fmt: skip
            computed = [v for v in o.operands if v in produced and not isinstance(produced[v], VIEW_OPS)]
            if any(v not in per_row and not isinstance(v.owner, ConstantOp) for v in computed):
                return f"{o.name} mixes a reduction's per-row values with values of the row space"
            rowwise = True
        if rowwise:
            per_row.update(o.results)
        for r in o.results:
            s = shape_of(r)
            if isinstance(o, ConstantOp):
                continue
            # (first: a why-not that names no size, so that the lengths of a shape family give the same notes)
            if isinstance(o, ReduceOp) and (o.axes != (len(shape_of(o.input)) - 1,) or shape_of(o.input) != it):
                return f"{o.name} reduces dims {list(o.axes)}, not the last dim of the row space"
            if not (_full(s, it) or _rowwise(s, it) or _broadcast(s, it)):
                return f"{o.name} produces {s}, which does not broadcast to the row space {it}"
            if isinstance(o, SoftmaxOp) and o.axis != len(it) - 1:
                return "dl.softmax not along the last dim"
        if isinstance(o, ROW_OPS) and shape_of(o.operands[0]) != it:
            return f"{o.name} input {shape_of(o.operands[0])} is not the row space {it}"
        if isinstance(o, RotaryOp) and o.input in produced and not isinstance(produced[o.input], VIEW_OPS):
            rd = o.dim
            if it[-1] & (it[-1] - 1) or it[-1] % rd:  # (rotated in registers: see `_rotate_in_registers`)
                return (f"dl.rotary of a computed value needs whole rotary groups in a row of a power of two columns "
                        f"(rotary dim {rd}, row {it[-1]})")  # fmt: skip
        if isinstance(o, CatOp):
            why = _cat_parts(plan, o, produced, inputs)
            if why:
                return why
            continue
        for v in o.operands:
            if v in produced and not isinstance(produced[v], VIEW_OPS):
                continue
            if isinstance(v.owner, ConstantOp):
                continue
            found = view_source(v, set(produced.values()), inputs)
            if found is None:
                return f"operand of {o.name} comes from outside the region without being an input"
            base, chain = found
            vs = shape_of(v)
            on_rows = o.results[0] in per_row and not isinstance(o, ReduceOp)
            if on_rows:  # broadcast against the op's own shape, the rows
                ok = len(vs) < len(it) and all(a in (1, b) for a, b in zip(vs[::-1], it[-2::-1]))
            else:
                lead_ok = all(a in (1, b) for a, b in zip(vs[-2::-1], it[-2::-1])) if len(vs) > 1 else True
                last_ok = not vs or vs[-1] in (1, it[-1]) or (isinstance(o, RotaryOp) and v in (o.cos, o.sin))
                ok = len(vs) <= len(it) and lead_ok and last_ok
            if not ok:
                return f"{o.name} operand {vs} does not broadcast to the row space {it}"
            if v in plan.leaves and plan.leaves[v].per_row != on_rows:
                return f"an input of {o.name} is read both per row (after a reduction) and per element"
            leaf = _leaf(base, chain, v, inputs)
            if leaf is None or (leaf.factors and (on_rows or isinstance(o, RotaryOp))):
                return "a fused reshape would need a copy"
            leaf.per_row = on_rows
            plan.leaves[v] = leaf
    ext = [r for o in ops for r in o.results if any(u.operation not in inside for u in r.uses)]
    for r in ext:
        if isinstance(r.owner, VIEW_OPS):
            return "a view is a region output"
    plan.outputs = ext
    return plan


def _scatter(plan: RowPlan, o: IndexCopyOp, produced: dict, inside: set, inputs: list[SSAValue]) -> str | None:
    """`dest.index_copy(dim, index, source)` of a value the kernel computes over the whole row space, along a row dim
    (a KV-cache update of k after its per-head norm and rotary, the token dim): each row is stored into dest at the
    position `index` holds. dest and index are region inputs; the result is the whole dest, so it can only leave
    the region (the runtime passes dest's own tensor where eager's writes allow it, else a copy)."""
    it = plan.iter_shape
    src, dest, ix = o.source, o.dest, o.index
    if src not in produced or isinstance(produced[src], VIEW_OPS) or shape_of(src) != it:
        return "an index_copy in a row kernel stores a value it computes over the whole row space"
    if dest not in inputs or ix not in inputs:
        return "an index_copy's destination and index must be region inputs"
    if any(u.operation in inside for u in o.result.uses) or any(u.operation in inside and u.operation is not o
                                                                for u in dest.uses):  # fmt: skip
        return "the kernel reads the tensor an index_copy writes"
    ds, axis = shape_of(dest), o.axis
    if len(shape_of(ix)) != 1 or axis >= len(it) - 1 or shape_of(ix)[0] != it[axis]:
        return "an index_copy in a row kernel takes a 1-D index along a row dim"
    if dtype_of(ix) != torch.int64:  # (torch's index_copy_ refuses any other: the torch step then raises as eager)
        return f"an index_copy's index is {dtype_of(ix)}, not int64"
    if len(ds) != len(it) or any(a != b for d, (a, b) in enumerate(zip(ds, it)) if d != axis):
        return f"an index_copy's destination {ds} differs from the rows {it} beyond the indexed dim"
    plan.scatters[o.result] = o
    return None


def _cat_parts(plan: RowPlan, o: CatOp, produced: dict, inputs: list[SSAValue]) -> str | None:
    """Record a dl.cat's parts as leaves read at their own column ranges, or say why the row template cannot:
    it concatenates along the last dim of the row space, parts read from memory (region inputs through views)."""
    it = plan.iter_shape
    if o.axis != len(it) - 1 or shape_of(o.result) != it:
        return f"dl.cat along dim {o.axis}, not the last dim of the row space"  # (no sizes: a family's notes agree)
    if dtype_of(o.result) not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dl.cat of {dtype_of(o.result)} (the row template moves values through float32)"
    parts = []
    for v in o.inputs:
        found = view_source(v, set(produced.values()), inputs)
        if found is None:
            return "dl.cat of a computed value (its parts must be read from memory)"
        leaf = _leaf(*found, v, inputs)
        if leaf is None:
            return "a fused reshape would need a copy"
        parts.append(leaf)
    plan.parts[o] = parts
    return None


def _leaf(base: SSAValue, chain: list[Operation], v: SSAValue, inputs: list[SSAValue]) -> Leaf | None:
    """Region input `base` read through `chain` as `v`, or None where the chain needs a copy."""
    found = row_view_chain(Layout.contiguous(shape_of(base)), chain)
    return None if found is None else Leaf(inputs.index(base), chain, v, *found)


# -- emission --------------------------------------------------------------------------------------


def _reduce(w: Writer, names: Names, kind: str, x: str, n: int) -> str:
    t = names.fresh("r")
    if kind == "sum":
        w(f"{t} = tl.sum(tl.where(mask, {x}, 0.0), axis=1)[:, None]")
    elif kind == "mean":
        w(f"{t} = tl.sum(tl.where(mask, {x}, 0.0), axis=1)[:, None] / {n}")
    else:
        w(f"{t} = tl.max(tl.where(mask, {x}, float('-inf')), axis=1)[:, None]")
        w(f"{t} = tl.where(tl.sum(tl.where(mask & ({x} != {x}), 1, 0), axis=1)[:, None] > 0, float('nan'), {t})")
    return t


def _rms(w: Writer, names: Names, x: str, eps: float, n: int) -> str:
    ms = _reduce(w, names, "mean", f"{x} * {x}", n)
    t = names.fresh("nrm")
    w(f"{t} = {x} * tl.rsqrt({ms} + {eps!r})")
    return t


def _scale(w: Writer, names: Names, op, normed: str, x: SSAValue, weight: str | None, result: SSAValue) -> str:
    eps, offset, in_f32 = op.attrs
    t = names.fresh("y")
    if weight is None:
        w(f"{t} = {normed}")
    elif in_f32:
        w(f"{t} = {normed} * ({weight} + {offset!r})")
    else:
        wexpr = f"({weight} + {offset!r})" if offset else weight
        w(f"{t} = {round_to(normed, x)} * {wexpr}")
    return t


class RowEmitter:
    def __init__(self, plan: RowPlan, inputs: list[SSAValue], name: str, wide: bool = False):
        self.plan, self.inputs, self.name, self.wide = plan, inputs, name, wide
        self.names = Names()

    def source(self) -> str:
        p = self.plan
        w = Writer()
        nrow = len(p.rows)
        ins = [f"in{i}" for i in range(len(self.inputs))]
        outs = [f"out{i}" for i in range(len(p.outputs))]
        leaf_args = []
        for j, leaf in enumerate(p.leaves.values()):
            leaf_args += [f"off{j}"] + [f"s{j}_{d}" for d in range(nrow + 1)] + self.factor_args(f"f{j}", leaf)
        for q, part in enumerate(part for parts in p.parts.values() for part in parts):  # (columns [pa, pb) of a cat)
            leaf_args += [f"poff{q}"] + [f"p{q}_{d}" for d in range(nrow + 1)] + [f"pa{q}", f"pb{q}"]
            leaf_args += self.factor_args(f"pf{q}", part)
        out_args = [f"o{k}_{d}" for k in range(len(outs)) for d in range(nrow + 1)]
        out_args += [f"ix{k}_n" for k, r in enumerate(p.outputs) if r in p.scatters]  # (the destination's size there)
        row_sizes = [f"R{d}" for d in range(nrow)]
        args = ins + outs + ["n_rows"] + row_sizes + leaf_args + out_args
        w("@triton.jit")
        w(f"def {self.name}(")
        w.indent()
        w(", ".join(args) + ",")
        w("N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr, " + PDL_ARG)
        w.dedent()
        w("):")
        w.indent()
        chained_start(w)
        w("rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)")
        w("cols = tl.arange(0, BLOCK_N)" + (".to(tl.int64)" if self.wide else ""))  # rows are always int64
        w("rmask = rows < n_rows")
        w("cmask = cols < N")
        w("mask = rmask[:, None] & cmask[None, :]")
        row_indices(w, "rows", nrow)
        n = p.n
        for j, (v, leaf) in enumerate(p.leaves.items()):
            base = " + ".join([f"off{j}", "rows * 0"] + [f"i{d} * s{j}_{d}" for d in range(nrow)])
            w(f"b{j} = tl.multiple_of({base}, ALIGN)")
            last = shape_of(v)[-1] if len(shape_of(v)) == len(p.iter_shape) else (shape_of(v)[-1:] or (1,))[0]
            last = 1 if leaf.per_row else last
            if last == 1:
                w(f"x{j} = tl.load(in{leaf.arg} + b{j}[:, None], mask=rmask[:, None], other=0.0).to(tl.float32)")
            else:
                m = "mask" if last == n else f"rmask[:, None] & (cols < {last})[None, :]"
                at = self.columns("cols", f"s{j}_{nrow}", f"f{j}", leaf)
                w(f"x{j} = tl.load(in{leaf.arg} + b{j}[:, None] + {at}, mask={m}, other=0.0).to(tl.float32)")
            self.names[v] = f"x{j}"
        leaf_index = {v: j for j, v in enumerate(p.leaves)}
        self.first_part, q = {}, 0  # a cat -> the number of its first part among all parts' arguments
        for op, parts in p.parts.items():
            self.first_part[op], q = q, q + len(parts)
        for op in p.ops:
            if not isinstance(op, IndexCopyOp):  # (stored with the outputs)
                self._op(w, op, n, nrow, leaf_index)
        for k, r in enumerate(p.outputs):
            if r in p.scatters:  # row i goes to the destination's position index[i] along that dim
                o = p.scatters[r]
                pos = self.names.fresh("pos")
                w(f"{pos} = tl.load(in{self.inputs.index(o.index)} + i{o.axis}, mask=rmask, other=0)")
                base = " + ".join(f"{pos if d == o.axis else f'i{d}'} * o{k}_{d}" for d in range(nrow))
                # (a position outside the destination, where torch's index_copy_ fails, writes nothing)
                keep = f"(rmask & ({pos} >= 0) & ({pos} < ix{k}_n))[:, None] & cmask[None, :]"
                tile = stored(f"tl.broadcast_to({self.names[o.source]}, [BLOCK_M, BLOCK_N])", dtype_of(r))
                w(f"tl.store(out{k} + ({base})[:, None] + cols[None, :] * o{k}_{nrow}, {tile}, mask={keep})")
                continue
            base = " + ".join([f"i{d} * o{k}_{d}" for d in range(nrow)]) or "rows * 0"
            base = f"tl.multiple_of({base}, ALIGN)"
            val = self.names[r]
            if _stores_full(shape_of(r), p.iter_shape, r in p.per_row):
                tile = stored(f"tl.broadcast_to({val}, [BLOCK_M, BLOCK_N])", dtype_of(r))
                w(f"tl.store(out{k} + ({base})[:, None] + cols[None, :] * o{k}_{nrow}, {tile}, mask=mask)")
            else:
                one = stored(f"tl.broadcast_to({val}, [BLOCK_M, 1])", dtype_of(r))
                w(f"tl.store(out{k} + ({base})[:, None], {one}, mask=rmask[:, None])")
        w.dedent()
        return w.text()

    @staticmethod
    def factor_args(prefix: str, leaf: Leaf) -> list[str]:
        return [f"{prefix}_{k}" for k in range(len(leaf.factors))]

    def columns(self, cols: str, stride: str, prefix: str, leaf: Leaf) -> str:
        """The offsets of columns `cols` in a leaf's row, as a [1, BLOCK_N] row: a stride, or its merged last
        dim's factors."""
        if leaf.factors:
            return f"{column_offsets(cols, leaf.factors, self.factor_args(prefix, leaf))}[None, :]"
        return f"{cols}[None, :] * {stride}"

    def _op(self, w: Writer, op: Operation, n: int, nrow: int, leaf_index: dict) -> None:
        """Write one op; each result a later op reads is rounded to its dtype, as eager's op rounds it (a bf16
        `x - x.mean(-1, keepdim=True)` subtracts the rounded mean)."""
        if emit_pointwise(w, self.names, op):
            return
        self._composite(w, op, n, nrow, leaf_index)
        for r in op.results:
            if r in self.names and round_to("x", r) != "x":
                t = self.names.fresh("rd")
                w(f"{t} = {round_to(self.names[r], r)}")
                self.names[r] = t

    def _composite(self, w: Writer, op: Operation, n: int, nrow: int, leaf_index: dict) -> None:
        names = self.names
        if isinstance(op, ReduceOp):
            kind = {ReduceSumOp: "sum", ReduceMeanOp: "mean", ReduceMaxOp: "max"}[type(op)]
            names[op.result] = _reduce(w, names, kind, names[op.input], n)
        elif isinstance(op, RMSNormOp):
            x = names[op.input]
            normed = _rms(w, names, x, op.attrs[0], n)
            names[op.result] = _scale(w, names, op, normed, op.input, names[op.weight] if op.weight else None, op.result)
        elif isinstance(op, AddRMSNormOp):
            s = names.fresh("s")
            w(f"{s} = {round_to(f'{names[op.input]} + {names[op.residual]}', op.sum)}")
            names[op.sum] = s
            normed = _rms(w, names, s, op.attrs[0], n)
            names[op.normed] = _scale(w, names, op, normed, op.sum, names[op.weight] if op.weight else None, op.normed)
        elif isinstance(op, LayerNormOp):
            x = names[op.input]
            # the mean, then one correction step (the mean of the deviations from it): a constant row's deviations
            # are then exactly 0, as eager's are on an expanded input (sum / n alone can leave an ulp, which the
            # rsqrt of a zero variance turns into ~1e-5)
            first = _reduce(w, names, "mean", x, n)
            mu = names.fresh("mu")
            w(f"{mu} = {first} + {_reduce(w, names, 'mean', f'{x} - {first}', n)}")
            xc = names.fresh("xc")
            w(f"{xc} = tl.where(mask, {x} - {mu}, 0.0)")
            var = _reduce(w, names, "mean", f"{xc} * {xc}", n)
            t = names.fresh("ln")
            w(f"{t} = {xc} * tl.rsqrt({var} + {op.eps.value.data!r}) * {names[op.weight]} + {names[op.bias]}")
            names[op.result] = t
        elif isinstance(op, SoftmaxOp):
            x = names[op.input]
            m = _reduce(w, names, "max", x, n)
            e = names.fresh("e")
            w(f"{e} = tl.where(mask, tl.exp({x} - {m}), 0.0)")
            s = _reduce(w, names, "sum", e, n)
            t = names.fresh("sm")
            w(f"{t} = {e} / tl.where(rmask[:, None], {s}, 1.0)")
            names[op.result] = t
        elif isinstance(op, CatOp):  # each part loaded at its own columns, the others masked off
            t = names.fresh("cat")
            w(f"{t} = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
            for q, part in enumerate(self.plan.parts[op], self.first_part[op]):
                pm = names.fresh("pm")
                w(f"{pm} = (cols >= pa{q}) & (cols < pb{q})")
                base = " + ".join([f"poff{q}"] + [f"i{d} * p{q}_{d}" for d in range(nrow)])
                base = f"tl.multiple_of({base}, ALIGN)"
                at = self.columns(f"(cols - pa{q})", f"p{q}_{nrow}", f"pf{q}", part)
                w(f"{t} = tl.where({pm}[None, :], tl.load(in{part.arg} + ({base})[:, None] + {at}, "
                  f"mask=rmask[:, None] & {pm}[None, :], other=0.0).to(tl.float32), {t})")
            names[op.result] = t
        elif isinstance(op, RotaryOp) and op.input not in leaf_index:
            names[op.result] = _rotate_in_registers(w, names, op, n)
        elif isinstance(op, RotaryOp):
            j = leaf_index[op.input]
            rd = op.dim
            x = names[op.input]
            pc, sg, t = names.fresh("pc"), names.fresh("sg"), names.fresh("rot")
            if op.layout.data == "half":
                h = rd // 2
                w(f"{pc} = tl.where(cols < {h}, cols + {h}, cols - {h})")
                w(f"{sg} = tl.where(cols < {h}, -1.0, 1.0)")
            else:
                w(f"{pc} = cols ^ 1")
                w(f"{sg} = tl.where(cols % 2 == 0, -1.0, 1.0)")
            w(f"{pc} = tl.where(cols < {rd}, {pc}, cols)")
            xp = names.fresh("xp")
            arg = self.plan.leaves[op.input].arg
            w(f"{xp} = tl.load(in{arg} + b{j}[:, None] + {pc}[None, :] * s{j}_{nrow}, mask=mask, other=0.0).to(tl.float32)")
            c, s = names[op.cos], names[op.sin]
            w(f"{t} = tl.where((cols < {rd})[None, :], {x} * {c} + {sg}[None, :] * {xp} * {s}, {x})")
            names[op.result] = t
        else:
            raise AssertionError(f"row template cannot emit {op.name}")


def _rotate_in_registers(w: Writer, names: Names, op: RotaryOp, n: int) -> str:
    """dl.rotary of a value computed in the kernel (an RMSNorm's output: Qwen3's per-head q/k norms), whose
    partner columns are not in memory to load: rotated in registers (`exprs.rotate_in_registers`) over groups of
    rotary-dim columns of the row (n = BLOCK_N, a power of two); with partial rotary those past the first group
    are put back."""
    rd, x = op.dim, names[op.input]
    parts = [(names.fresh(tag), names.fresh(tag)) for tag in ("rx", "rc", "rs")]  # (not "x": x<j> names the leaves)
    t = names.fresh("rot")
    rotate_in_registers(w, t, (x, names[op.cos], names[op.sin]), parts, op.layout.data != "half", str(n // rd),
                        str(rd // 2))
    if rd < n:
        w(f"{t} = tl.where((cols < {rd})[None, :], {t}, {x})")
    return t


def build(fused: FusedOp, plan: RowPlan, name: str) -> Kernel:
    inputs = list(fused.block.args)
    plan.outputs = list(fused.yielded.values)
    src = RowEmitter(plan, inputs, name, wide_indices([*inputs, *plan.outputs])).source()
    it, n = plan.iter_shape, plan.n
    block_n = triton.next_power_of_2(n)
    leaf_args: list[int] = []
    row_starts: list[int] = []  # every row's first element is at a sum of these (in elements): ALIGN divides them
    for leaf in plan.leaves.values():
        lay, vs = leaf.layout, shape_of(leaf.value)
        if leaf.per_row:  # aligned with the rows: a trailing column dim of one
            lay, vs = Layout((*lay.shape, 1), (*lay.strides, 0), lay.offset), (*vs, 1)
        lay = lay.broadcast_to((*it[:-1], vs[-1] if vs else 1))
        leaf_args += [lay.offset, *lay.strides, *(st for _, st in leaf.factors)]
        row_starts += [lay.offset, *lay.strides[:-1]]
    for parts in plan.parts.values():  # the widths are arguments: the source is the same whatever they are
        start = 0
        for part in parts:
            width = shape_of(part.value)[-1]
            lay = part.layout.broadcast_to((*it[:-1], width))
            leaf_args += [lay.offset, *lay.strides, start, start + width, *(st for _, st in part.factors)]
            row_starts += [lay.offset, *lay.strides[:-1]]
            start += width
    out_shapes = [shape_of(r) for r in plan.outputs]
    out_dtypes = [dtype_of(r) for r in plan.outputs]
    out_args: list[int] = []
    for r, shp in zip(plan.outputs, out_shapes, strict=True):
        if r in plan.scatters:  # the destination's own (contiguous) strides
            out_args += list(Layout.contiguous(shp).strides)
        elif r in plan.per_row:  # a reduction without keepdim: aligned with the rows
            out_args += [*Layout.contiguous(shp).strides, 0]
        else:  # broadcast strides: replicated rows write the same (identical) values
            out_args += list(Layout.contiguous(shp).broadcast_to((*it[:-1], shp[-1] if shp else 1)).strides)
    per_out = len(plan.rows) + 1  # (each output's strides: its rows', then its columns')
    row_starts += [st for k, r in enumerate(plan.outputs) if r not in plan.scatters
                   for st in out_args[k * per_out:(k + 1) * per_out - 1]]  # fmt: skip
    align = row_alignment(row_starts)
    out_args += [shape_of(r)[o.axis] for r in plan.outputs if (o := plan.scatters.get(r))]
    dest_of = {k: inputs.index(o.dest) for k, r in enumerate(plan.outputs) if (o := plan.scatters.get(r))}
    n_rows = numel(plan.rows)
    row_sizes = list(plan.rows)

    def launch(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        dev = tensors[0].device if tensors else torch.device("cpu")
        outs = [tensors[dest_of[k]] if k in dest_of else torch.empty(s, dtype=dt, device=dev)
                for k, (s, dt) in enumerate(zip(out_shapes, out_dtypes))]  # (a destination: the tensor itself)
        bm = config["BLOCK_M"]
        kernel[(cdiv(n_rows, bm),)](
            *tensors, *outs, n_rows, *row_sizes, *leaf_args, *out_args,
            N=n, BLOCK_M=bm, BLOCK_N=block_n, ALIGN=align, num_warps=config["num_warps"],
        )  # fmt: skip
        return outs

    dests = {o.dest for o in plan.scatters.values()}  # (of a destination only the rows stored move)
    nbytes = sum(numel(shape_of(a)) * dtype_of(a).itemsize for a in inputs if a not in dests) + sum(
        numel(shape_of(plan.scatters[r].source) if r in plan.scatters else s) * dt.itemsize
        for r, s, dt in zip(plan.outputs, out_shapes, out_dtypes)
    )
    return Kernel(name, src, launch, fused, {"rows": n_rows, "N": n}, bytes=nbytes)


def row_alignment(row_starts: list[int], most: int = 16) -> int:
    """The largest power of two, up to `most`, dividing every offset and row stride in `row_starts` (elements): the
    kernel tells Triton its row bases are multiples of it (`tl.multiple_of(.., ALIGN)`). Triton itself only knows an
    integer argument's divisibility by 16, so without the hint rows of 8 bf16 elements (a router's softmax over 8
    experts) loaded and stored one element at a time, 1.8x the copy time (bench/NOTES.md 189)."""
    align = most
    for v in row_starts:
        while v % align:
            align //= 2
    return align


PARAMS = {"BLOCK_M": pow2(1, 16), "num_warps": [1, 2, 4, 8, 16]}


def space(plan: RowPlan) -> SearchSpace:
    """Rows per program and warps, within the registers a row block of the padded width needs. A program holds
    about 2048 elements by default: up to 16 rows of 128 or wider, more rows where they are narrower (a last dim
    of one over a million rows had been 65536 programs of 16 elements; bench/NOTES.md 185), never more rows than
    there are."""
    block_n = triton.next_power_of_2(plan.n)
    rows = triton.next_power_of_2(max(1, numel(plan.rows)))
    most = max(16, min(2048 // block_n, rows))
    params = {**PARAMS, "BLOCK_M": pow2(1, most)}
    return SearchSpace(
        params,
        {
            "registers": lambda c: c["BLOCK_M"] * block_n <= 16384,
            "warps fit the block": lambda c: c["num_warps"] * 32 <= max(32, c["BLOCK_M"] * block_n // 2),
        },
        default={"BLOCK_M": max(1, min(most, 2048 // block_n)), "num_warps": 4 if block_n <= 2048 else 8},
    )


# elementwise chains, row reductions, norms, softmax and rotary over the last dim: one program per block of rows,
# the whole row in registers
register_template(PlannedTemplate("row", PARAMS, analyze, build, space))
