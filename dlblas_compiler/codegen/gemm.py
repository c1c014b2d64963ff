"""The GEMM template: Y = x @ W^T over [*rows, K] x [N, K], with slots.

K loop: tl.dot on tiles loaded by pointer or, with TMA (sm90+), through tensor descriptors; for a few
rows (decode) also one-row tiles on CUDA cores (BLOCK_M = 1: weight tiles read along K, products summed
over K after the loop). Split-K programs store partial sums and the last one of a tile runs the epilogue.
Prologue: RMSNorm or LayerNorm. A norm pass (NORM_PASS, always for a LayerNorm) writes the normalized rows
first, as eager does. Otherwise, for an RMSNorm: the rows' rsqrt(mean(x^2) + eps) comes from the `row_rms` pass, or for a few rows
from the tile's last program, and scales the accumulator after the K loop; a norm weight that was not
folded into W scales the A tile. Epilogue: everything the planner attached to Y, computed on the fp32
tile before one store per output: bias, elementwise ops with other tensors (residual add, ...),
column slices (one GEMM for q/k/v), reshapes splitting the columns into heads and permutes (written
straight into [B, H, S, D]), an RMSNorm over each head's columns (Qwen3's q/k norms: the tile holds whole
heads, reshaped [BLOCK_M, heads, D] for the statistics), rotary on head columns (partner column gathered
within the tile; a tile narrower than a head takes the matching slices of its two halves), and a
gated activation of two column halves computed as two accumulators sharing the A tile (dual GEMM).

Index model: every epilogue value is a view of Y's tile: a column range [lo, hi) of one accumulator
("stream"), the split of those columns into static dims, and a permutation from its logical dims to the
canonical order (row dims..., column dims...). Addresses of outputs and operands are strides in that
canonical order, so one formula serves every layout.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from xdsl.ir import Operation, SSAValue

from ..dialects import (
    BinaryOp,
    ConstantOp,
    ConvertOp,
    FusedOp,
    GluOp,
    LayerNormOp,
    LinearOp,
    PermuteOp,
    ReshapeOp,
    RMSNormOp,
    RotaryOp,
    SliceOp,
    UnaryOp,
)
from ..dialects.types import dtype_of, numel, shape_of
from ..fusion.templates import KernelTemplate, WhyNot, register_template
from ..tuning.space import SearchSpace
from . import device
from .exprs import Names, emit_pointwise, round_to
from .interpreter import launch as launch_lib
from .kernel import Kernel
from .source import PDL_ARG, TL_DTYPE, Writer, cdiv, chained_start, row_indices, wide_indices
from .views import VIEW_OPS, Layout, view_chain, view_source

POINTWISE = (UnaryOp, BinaryOp, ConvertOp, GluOp, ConstantOp)


@dataclass(frozen=True)
class Cols:
    """A value's view of the tile: stream, column range, column split and logical→canonical permutation."""

    stream_lo: int  # absolute column of Y where this value's columns start (which accumulator)
    lo: int  # first grid column of the value (relative to its stream)
    hi: int
    split: tuple[int, ...]
    perm: tuple[int, ...]  # logical dim i is canonical dim perm[i]

    def space(self) -> tuple:
        return (self.lo, self.hi, self.split)


@dataclass
class GemmPlan:
    linear: LinearOp
    norm: RMSNormOp | LayerNormOp | None  # a LayerNorm always runs as a row pass (NORM_PASS)
    rows: tuple[int, ...]
    k: int
    n: int  # columns of W
    info: dict[SSAValue, Cols] = field(default_factory=dict)
    epilogue: list[Operation] = field(default_factory=list)
    streams: list[int] = field(default_factory=lambda: [0])  # absolute Y column offsets of the accumulators
    grid_n: int = 0
    rotary_dims: set[int] = field(default_factory=set)
    narrow_rotary: str | None = None  # layout of a rotary that tiles narrower than a head (see _rotary)
    input_views: list[Operation] = field(default_factory=list)  # views of operands, fused as strides
    rotary_from_product: bool = False  # every rotary rotates a view of Y: MM configs read each partner column back
    head_norm: bool = False  # an RMSNorm over head columns: tiles hold whole heads (their widths join rotary_dims)

    @property
    def rms(self) -> RMSNormOp | None:
        """The RMSNorm prologue, which the K loop and epilogue can also apply themselves (NORM_PASS=0)."""
        return self.norm if isinstance(self.norm, RMSNormOp) else None


def input_view(v: SSAValue, inside: set, inputs: list[SSAValue]) -> tuple[SSAValue, list[Operation]] | None:
    """(region input, view chain) that `v` is read through, if its layout is a view (no copy) from offset 0."""
    found = view_source(v, inside, inputs)
    if found is None:
        return None
    lay = view_chain(Layout.contiguous(shape_of(found[0])), found[1])
    return None if lay is None or lay.offset else found


def _split_cols(c: Cols, old: tuple[int, ...], new: tuple[int, ...], nrow: int) -> Cols | None:
    """A reshape that keeps the row dims and regroups the (canonically ordered) column dims."""
    if c.perm != tuple(range(len(c.perm))) or tuple(old[:nrow]) != tuple(new[:nrow]) or len(new) <= nrow:
        return None
    if numel(new[nrow:]) != numel(old[nrow:]):
        return None
    split = tuple(new[nrow:])
    return Cols(c.stream_lo, c.lo, c.hi, split, tuple(range(len(new))))


def analyze(ops: list[Operation], inputs: list[SSAValue]) -> GemmPlan | str:
    linears = [o for o in ops if isinstance(o, LinearOp)]
    if len(linears) != 1:
        return "a GEMM region has exactly one linear"
    lin = linears[0]
    inside = set(ops)
    norm = lin.input.owner if isinstance(lin.input.owner, (RMSNormOp, LayerNormOp)) and lin.input.owner in inside else None
    x = norm.input if norm else lin.input
    if x.owner in inside or x not in inputs:
        return "the GEMM's A operand must be a region input (or the input of its RMSNorm / LayerNorm)"
    if norm is not None and any(v is not None and v not in inputs for v in (norm.weight, getattr(norm, "bias", None))):
        return "the norm's weight and bias must be region inputs"
    xs = shape_of(x)
    if len(xs) < 2 or any(d < 1 for d in xs):
        return f"linear input {xs}: need rank >= 2 and non-empty dims"
    if lin.weight not in inputs:
        return "the GEMM's weight must be a region input (a view of it is not read through strides)"
    if dtype_of(x) != dtype_of(lin.weight):
        return f"the A operand is {dtype_of(x)} and the weight {dtype_of(lin.weight)}: tl.dot takes one dtype"
    if lin.bias is not None and lin.bias.owner in inside:
        return "bias must be a region input"
    rows, k = tuple(xs[:-1]), xs[-1]
    n = shape_of(lin.weight)[0]
    nrow = len(rows)
    plan = GemmPlan(lin, norm, rows, k, n)
    plan.info[lin.result] = Cols(0, 0, n, (n,), tuple(range(nrow + 1)))
    for o in ops:
        if o is lin or o is norm or isinstance(o, ConstantOp):
            continue
        if isinstance(o, VIEW_OPS) and o.operands[0] not in plan.info:
            if input_view(o.results[0], inside, inputs) is None:
                return "a view of an operand must read a region input"
            plan.input_views.append(o)
            continue
        why = _epilogue_op(plan, o, inside, nrow)
        if why:
            return why
        plan.epilogue.append(o)
    # streams: a pointwise op combining values from different column ranges of Y
    pairs = set()
    for o in plan.epilogue:
        tile = [v for v in o.operands if v in plan.info]
        if isinstance(o, (BinaryOp, GluOp)) and len(tile) == 2:
            a, b = (plan.info[v].lo + plan.info[v].stream_lo for v in tile)
            if a != b:
                pairs.add((a, b))
    if pairs:
        offsets = sorted({p for pair in pairs for p in pair})
        widths = {plan.info[v].hi - plan.info[v].lo for v in plan.info if v is not lin.result}
        if len(offsets) != 2 or len(widths) != 1:
            return "only two column halves of equal width can be combined (dual GEMM)"
        w = widths.pop()
        if offsets[1] - offsets[0] < w:
            return "combined column ranges overlap"
        if any(u.operation not in inside or not isinstance(u.operation, SliceOp) for u in lin.result.uses):
            return "a dual GEMM's output is used whole"
        plan.streams, plan.grid_n = offsets, w
        for v, c in list(plan.info.items()):
            if v is lin.result:
                continue
            start = c.lo + c.stream_lo
            base = max(o for o in offsets if o <= start)
            if start - base + (c.hi - c.lo) > w:
                return "a column range crosses the two halves"
            plan.info[v] = Cols(base, start - base, start - base + (c.hi - c.lo), c.split, c.perm)
    else:
        plan.grid_n = n
    for o in plan.epilogue:
        if isinstance(o, RotaryOp):
            c = plan.info[o.input]
            d, rd = c.split[-1], o.dim
            if c.lo % d or d & (d - 1) or d > 256 or rd & (rd - 1) or d % rd:
                return f"rotary on head dim {d} (rotary dim {rd}, column offset {c.lo}) does not tile: powers of two <= 256"
            plan.rotary_dims.add(d)
    rotaries = [o for o in plan.epilogue if isinstance(o, RotaryOp)]
    plan.rotary_from_product = bool(rotaries) and all(_view_of(o.input, lin.result) for o in rotaries)
    rots = {(plan.info[o.input].split[-1], o.dim, o.layout.data) for o in rotaries}
    if len(rots) == 1 and (r := rots.pop())[0] == r[1] and plan.grid_n % r[0] == 0 and not plan.head_norm:
        plan.narrow_rotary = r[2]  # one full-head rotary over whole heads: tiles may hold part of a head
    return plan


def _view_of(v: SSAValue, y: SSAValue) -> bool:
    """v is y seen through slices, reshapes and permutes only (its values are Y's, unchanged)."""
    while v is not y:
        if not isinstance(v.owner, (SliceOp, ReshapeOp, PermuteOp)):
            return False
        v = v.owner.operands[0]
    return True


def _epilogue_op(plan: GemmPlan, o: Operation, inside: set, nrow: int) -> str | None:
    ins = [v for v in o.operands if v in plan.info]
    outside = [v for v in o.operands if v not in plan.info and not isinstance(v.owner, ConstantOp)]
    if not ins:
        return f"{o.name} does not read the GEMM's tile"
    if any(v.owner in inside and not isinstance(v.owner, VIEW_OPS) for v in outside):
        return f"{o.name} reads a value the epilogue cannot compute"
    c = plan.info[ins[0]]
    shp = shape_of(ins[0])
    if isinstance(o, SliceOp):
        dim, start, end, step = o.bounds()
        if step != 1 or dim != len(shp) - 1 or len(c.split) != 1 or c.perm[-1] != nrow:
            return "only a slice of undivided columns (last dim) fuses"
        plan.info[o.result] = Cols(c.stream_lo, c.lo + start, c.lo + end, (end - start,), c.perm)
        return None
    if isinstance(o, ReshapeOp):
        nc = _split_cols(c, shp, shape_of(o.result), nrow)
        if nc is None:
            return "a reshape that mixes row and column dims"
        plan.info[o.result] = nc
        return None
    if isinstance(o, PermuteOp):
        plan.info[o.result] = Cols(c.stream_lo, c.lo, c.hi, c.split, tuple(c.perm[p] for p in o.permutation))
        return None
    if isinstance(o, RotaryOp):
        if o.input not in plan.info or o.cos in plan.info or o.sin in plan.info:
            return "rotary must rotate the tile with external cos/sin"
        if c.perm[-1] != nrow + len(c.split) - 1:
            return "rotary must act on the innermost column dim"
        plan.info[o.result] = c
        return None
    if isinstance(o, RMSNormOp):  # over each head's columns (the innermost column dim)
        d = c.split[-1]
        if o.input is not ins[0] or len(c.split) < 2 or c.perm[-1] != nrow + len(c.split) - 1:
            return "an RMSNorm in the epilogue normalizes the innermost column dim of heads split from the tile"
        if c.lo % d or d & (d - 1) or d > 256:
            return f"a per-head RMSNorm over {d} columns (offset {c.lo}) does not tile: powers of two <= 256"
        if numel(plan.rows) <= GEMV_ROWS:  # (H100, Qwen3-8B's QKV at M=1: 55 µs fused, 30 µs + 4 row kernels apart)
            return (f"a per-head RMSNorm needs tiles of whole heads; for {numel(plan.rows)} rows the GEMM streams the "
                    "weight in narrower tiles, and the norm runs after it")
        plan.info[o.result] = c
        plan.rotary_dims.add(d)  # (whole heads in a tile, as a rotary needs)
        plan.head_norm = True
        return None
    if isinstance(o, POINTWISE):
        for v in ins[1:]:
            c2 = plan.info[v]
            if (c2.hi - c2.lo, c2.split, c2.perm) != (c.hi - c.lo, c.split, c.perm):
                return f"{o.name} combines differently shaped views of the tile"
        for v in outside:
            vs, rs = shape_of(v), shape_of(o.results[0])
            if len(vs) > len(rs) or any(a not in (1, b) for a, b in zip(vs[::-1], rs[::-1])):
                return f"{o.name} operand {vs} does not broadcast to {rs}"
        if shape_of(o.results[0]) != shp:
            return f"{o.name} changes the tile's shape"
        plan.info[o.results[0]] = c
        return None
    return f"{o.name} cannot run in a GEMM epilogue"


# -- emission --------------------------------------------------------------------------------------


def _canonical_strides(lay: Layout | tuple[int, ...], c: Cols, logical: tuple[int, ...]) -> list[int]:
    """Strides, in canonical dim order, of a layout (or a contiguous shape) broadcast to `logical`."""
    lay = (lay if isinstance(lay, Layout) else Layout.contiguous(lay)).broadcast_to(logical)
    canon = [0] * len(logical)
    for i, p in enumerate(c.perm):
        canon[p] = lay.strides[i]
    return canon


class GemmEmitter:
    def __init__(self, plan: GemmPlan, fused: FusedOp, name: str):
        self.plan, self.fused, self.name = plan, fused, name
        self.args = list(fused.block.args)
        self.outputs = list(fused.yielded.values)
        self.names = Names()
        self.wide = wide_indices([*self.args, *self.outputs])
        self.ext: list[tuple[SSAValue, Cols, SSAValue]] = []  # (region input, view it is read as, reader's value)
        self.spaces: dict[tuple, str] = {}
        self.dot = device.dot_args(dtype_of(plan.linear.weight))  # IEEE fp32 unless torch allows TF32

    def source(self) -> str:
        p, w = self.plan, Writer()
        nrow = len(p.rows)
        ns = len(p.streams)
        lin = p.linear
        has_bias = lin.bias is not None
        norm_w = p.rms is not None and p.rms.weight is not None
        for o in p.epilogue:  # external operands, each read through the view of its reader's result
            for v in o.operands:
                if v not in p.info and not isinstance(v.owner, ConstantOp):
                    self.ext.append((v, p.info[o.results[0]], o.results[0]))
        args = ["x_ptr", "w_ptr"] + (["bias_ptr"] if has_bias else []) + (["nw_ptr"] if norm_w else [])
        args += [f"e{j}_ptr" for j in range(len(self.ext))] + [f"out{k}_ptr" for k in range(len(self.outputs))]
        args += ["mm_ptr", "ws_ptr", "cnt_ptr", "rs_ptr", "M"] + [f"R{d}" for d in range(1, nrow)]
        for j in range(len(self.ext)):
            args += [f"e{j}_s{d}" for d in range(len(self.ext[j][1].perm))]
        for k, r in enumerate(self.outputs):
            args += [f"o{k}_s{d}" for d in range(len(p.info[r].perm))]
        w("@triton.jit")
        w(f"def {self.name}(")
        w.indent()
        w(", ".join(args) + ",")
        w("K: tl.constexpr, GRID_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,")
        w("BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr,")
        w("EVEN_K: tl.constexpr, TMA: tl.constexpr, RS_INLINE: tl.constexpr, RS_BLOCK: tl.constexpr, MM: tl.constexpr,")
        w("NORMED: tl.constexpr, " + PDL_ARG)
        w.dedent()
        w("):")
        w.indent()
        chained_start(w)
        w("pid = tl.program_id(0)")
        w("pid_k = tl.program_id(1)")
        w("num_m = tl.cdiv(M, BLOCK_M)")
        w("num_n = tl.cdiv(GRID_N, BLOCK_N)")
        w("group = GROUP_M * num_n")
        w("first_m = (pid // group) * GROUP_M")
        w("size_m = min(num_m - first_m, GROUP_M)")
        w("pid_m = first_m + (pid % group) % size_m")
        w("pid_n = (pid % group) // size_m")
        w("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        if p.narrow_rotary == "half":  # a tile narrower than a head takes matching parts of its two halves,
            d = max(p.rotary_dims)  # so each rotation pair (j, j + D/2) stays inside the tile
            w(f"if BLOCK_N < {d}:")
            w("    ri = tl.arange(0, BLOCK_N)")
            w(f"    rn = (pid_n * BLOCK_N) // {d} * {d} + (pid_n % ({d} // BLOCK_N)) * (BLOCK_N // 2) + ri % (BLOCK_N // 2) + ri // (BLOCK_N // 2) * {d // 2}")
            w("else:")
            w("    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        else:
            w("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        w("rk = tl.arange(0, BLOCK_K)")
        w("mmask = rm < M")
        w("nmask = rn < GRID_N")
        w("k_lo = pid_k * K_SPLIT")
        # Loads wrap rows and columns past the end (modulo) instead of masking them: the extra rows and
        # columns are never stored, and with EVEN_K (K splits into whole BLOCK_K steps) the K loop's
        # loads carry no mask at all.
        # With TMA the tiles come through tensor descriptors (bounds handled by the copy engine, W tiles
        # [BLOCK_N, BLOCK_K] K-major); otherwise through pointer loads.
        w("a_ptrs = x_ptr + (rm % M).to(tl.int64)[:, None] * K + (k_lo + rk)[None, :]")
        w("if MM:")  # the product x @ W^T came from cuBLAS (mm_ptr, [M, N of W]): this kernel is the epilogue
        w.indent()
        for s, off in enumerate(p.streams):
            w(f"acc{s} = tl.load(mm_ptr + (rm % M).to(tl.int64)[:, None] * {p.n} + ((rn % GRID_N) + {off})[None, :]).to(tl.float32)")
        w.dedent()
        w("elif BLOCK_M == 1:")  # one row per program, CUDA cores: W tiles [BLOCK_N, BLOCK_K] read along K,
        w.indent()  # products kept per column and K position, summed over K once after the loop
        self._gemv_loop(w, norm_w)
        w.dedent()
        w("else:")
        w.indent()
        w("if TMA:")
        w("    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])")
        for s, off in enumerate(p.streams):
            w(f"b{s}_ptrs = w_ptr + ((rn % GRID_N).to(tl.int64) + {off})[None, :] * K + (k_lo + rk)[:, None]")
            w("if TMA:")
            w(f"    b{s}_desc = tl.make_tensor_descriptor(w_ptr + {off} * K, shape=[GRID_N, K], strides=[K, 1],")
            w("                                         block_shape=[BLOCK_N, BLOCK_K])")
            w(f"acc{s} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        w("for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):")
        w.indent()
        self._a_tile(w, norm_w, tma=True)
        for s in range(ns):
            w("if TMA:")
            w(f"    acc{s} = tl.dot(a, b{s}_desc.load([pid_n * BLOCK_N, k0]).T, acc{s}{self.dot})")
            w("else:")
            w.indent()
            w("if EVEN_K:")
            w(f"    b{s} = tl.load(b{s}_ptrs)")
            w("else:")
            w(f"    b{s} = tl.load(b{s}_ptrs, mask=((k0 + rk) < K)[:, None], other=0.0)")
            w(f"acc{s} = tl.dot(a, b{s}, acc{s}{self.dot})")
            w.dedent()
            w(f"b{s}_ptrs += BLOCK_K")
        w("a_ptrs += BLOCK_K")
        w.dedent()
        w.dedent()
        # Epilogue layout changes go through shared memory; make every warp leave the K loop first.
        w("tl.debug_barrier()")
        self._split_k(w)
        w("if last:")
        w.indent()
        w("if SPLIT_K > 1:")
        w.indent()
        self._reduce_partials(w)
        w.dedent()
        if p.rms is not None:  # the rows' rsqrt(mean(x^2) + eps): from `row_rms` (see build), or for a
            # few rows (RS_INLINE) read here from x by the tile's last program, which saves that launch;
            # none where x arrives normalized (NORMED: `row_norm` wrote it)
            w("if NORMED:")
            w("    rs = tl.full((BLOCK_M,), 1.0, tl.float32)")
            w("elif RS_INLINE:")
            w.indent()
            w("rk2 = tl.arange(0, RS_BLOCK)")
            w("ss = tl.zeros((BLOCK_M, RS_BLOCK), dtype=tl.float32)")
            w("for k1 in range(0, K, RS_BLOCK):")
            w("    v = tl.load(x_ptr + (rm % M).to(tl.int64)[:, None] * K + (k1 + rk2)[None, :],")
            w("                mask=((k1 + rk2) < K)[None, :], other=0.0).to(tl.float32)")
            w("    ss += v * v")
            w(f"rs = tl.rsqrt(tl.sum(ss, axis=1) / K + {p.rms.attrs[0]!r})")
            w.dedent()
            w("else:")
            w("    rs = tl.load(rs_ptr + rm, mask=mmask, other=0.0)")
        for s, off in enumerate(p.streams):
            if p.rms is not None:
                w("if not NORMED:")
                w(f"    acc{s} = acc{s} * rs[:, None]")
            if has_bias:
                w(f"acc{s} += tl.load(bias_ptr + rn + {off}, mask=nmask, other=0.0).to(tl.float32)[None, :]")
            w(f"y{s} = {round_to(f'acc{s}', lin.result)}")
        if self.wide:  # epilogue addresses (row * stride, head * stride) pass 2^31
            w("rm = rm.to(tl.int64)")
            w("rn = rn.to(tl.int64)")
        row_indices(w, "rm", nrow)  # canonical row dims
        names = self.names
        for o in self.fused.block.ops:
            if isinstance(o, ConstantOp):
                names[o.result] = o.triton()
        if len(p.streams) == 1:
            names[lin.result] = "y0"
        for u in lin.result.uses:
            if isinstance(u.operation, SliceOp) and u.operation.result in p.info:
                names[u.operation.result] = f"y{p.streams.index(p.info[u.operation.result].stream_lo)}"
        cones = self._cones()
        if cones is None:
            for o in p.epilogue:
                self._epilogue(w, o)
            for k in range(len(self.outputs)):
                self._store(w, k)
        else:  # each output's own ops and store only in tiles holding some of its columns (q, k, v of one GEMM)
            for c in dict.fromkeys(p.info.values()):
                self._space(w, c)  # (index spaces defined once, outside the branches)
            uses = Counter(o for cone in cones for o in cone)
            for o in p.epilogue:
                if uses[o] > 1:
                    self._epilogue(w, o)
            for k, (r, cone) in enumerate(zip(self.outputs, cones)):
                c = p.info[r]
                w(f"if (tl.max(rn, 0) >= {c.lo}) & (tl.min(rn, 0) < {c.hi}):  # this tile holds columns of output {k}")
                w.indent()
                for o in p.epilogue:
                    if o in cone and uses[o] == 1:
                        self._epilogue(w, o)
                self._store(w, k)
                w.dedent()
        w.dedent()
        w.dedent()
        return w.text()

    def _cones(self) -> list[set[Operation]] | None:
        """Per output, the epilogue ops it depends on; None where the epilogue is emitted whole (one output, or
        two accumulators whose column ranges are relative to different streams)."""
        p = self.plan
        if len(self.outputs) < 2 or len(p.streams) > 1:
            return None
        producer = {o.results[0]: o for o in p.epilogue}
        cones = []
        for r in self.outputs:
            cone: set[Operation] = set()
            todo = [r]
            while todo:
                o = producer.get(todo.pop())
                if o is not None and o not in cone:
                    cone.add(o)
                    todo.extend(o.operands)
            cones.append(cone)
        return cones

    def _epilogue(self, w: Writer, o: Operation) -> None:
        """Emit one epilogue op (views only rename; external operands are loaded through their reader's view)."""
        names, res = self.names, o.results[0]
        if isinstance(o, (SliceOp, ReshapeOp, PermuteOp)):
            if res not in names:
                names[res] = names[o.operands[0]]
            return
        ext_index = {(e[0], e[2]): j for j, e in enumerate(self.ext)}
        loaded = {v: self._load_ext(w, ext_index[(v, res)]) for v in o.operands if (v, res) in ext_index}
        for v, t in loaded.items():
            names[v] = t
        if isinstance(o, RotaryOp):
            self._rotary(w, o)
        elif isinstance(o, RMSNormOp):
            self._head_norm(w, o)
        else:
            emit_pointwise(w, names, o)
        for v in loaded:
            names.names.pop(v)

    def _store(self, w: Writer, k: int) -> None:
        r = self.outputs[k]
        idx, member = self._space(w, self.plan.info[r])
        addr = " + ".join(f"({e}) * o{k}_s{d}" for d, e in enumerate(idx))
        w(f"tl.store(out{k}_ptr + {addr}, {self.names[r]}.to({TL_DTYPE[dtype_of(r)]}), mask=mmask[:, None] & {member})")

    def _gemv_loop(self, w: Writer, norm_w: bool) -> None:
        """The K loop for one row: a [1, BLOCK_K] slice of x times [BLOCK_N, BLOCK_K] weight tiles,
        accumulated elementwise in fp32 and reduced over K after the loop (no tensor cores, no padding rows:
        at decode every loaded weight byte is used once)."""
        p = self.plan
        for s, off in enumerate(p.streams):
            w(f"b{s}_ptrs = w_ptr + ((rn % GRID_N).to(tl.int64) + {off})[:, None] * K + (k_lo + rk)[None, :]")
            w(f"acc{s} = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)")
        w("for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):")
        w.indent()
        self._a_tile(w, norm_w, tma=False)
        for s in range(len(p.streams)):
            w("if EVEN_K:")
            w(f"    b{s} = tl.load(b{s}_ptrs)")
            w("else:")
            w(f"    b{s} = tl.load(b{s}_ptrs, mask=((k0 + rk) < K)[None, :], other=0.0)")
            w(f"acc{s} += b{s}.to(tl.float32) * a.to(tl.float32)")
            w(f"b{s}_ptrs += BLOCK_K")
        w("a_ptrs += BLOCK_K")
        w.dedent()
        for s in range(len(p.streams)):
            w(f"acc{s} = tl.sum(acc{s}, axis=1)[None, :]")

    def _a_tile(self, w: Writer, norm_w: bool, tma: bool) -> None:
        """`a`: this K step's slice of x (through its descriptor with TMA), times a norm weight not folded into W."""
        if tma:
            w("if TMA:")
            w("    a = a_desc.load([pid_m * BLOCK_M, k0])")
        w("elif EVEN_K:" if tma else "if EVEN_K:")
        w("    a = tl.load(a_ptrs)")
        w("else:")
        w("    a = tl.load(a_ptrs, mask=((k0 + rk) < K)[None, :], other=0.0)")
        if norm_w:
            _, offset, _ = self.plan.rms.attrs
            w("if not NORMED:")
            w(f"    nw = tl.load(nw_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32) + {offset!r}")
            w("    a = (a.to(tl.float32) * nw[None, :]).to(a.dtype)")

    def _split_k(self, w: Writer) -> None:
        """Split-K: each of SPLIT_K programs of a tile stores its partial sums; the last to finish
        (an acq_rel counter per tile) reduces them, resets the counter and runs the epilogue."""
        p = self.plan
        ns = len(p.streams)
        w("if SPLIT_K > 1:")
        w.indent()
        w("tiles = num_m * num_n")
        w("offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
        for s in range(ns):
            w(f"tl.store(ws_ptr + ((pid_k * tiles + pid) * {ns} + {s}) * BLOCK_M * BLOCK_N + offs, acc{s})")
        w('last = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel") == SPLIT_K - 1')
        w.dedent()
        w("else:")
        w.indent()
        w("last = True")
        w.dedent()

    def _reduce_partials(self, w: Writer) -> None:
        p = self.plan
        ns = len(p.streams)
        for s in range(ns):
            w(f"acc{s} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        w("for j in range(SPLIT_K):")
        w.indent()
        for s in range(ns):
            w(f'acc{s} += tl.load(ws_ptr + ((j * tiles + pid) * {ns} + {s}) * BLOCK_M * BLOCK_N + offs, cache_modifier=".cg")')
        w.dedent()
        w("tl.atomic_xchg(cnt_ptr + pid, 0)")

    def _space(self, w: Writer, c: Cols) -> tuple[list[str], str]:
        """Canonical index expressions ([BLOCK_M,1] rows, [1,BLOCK_N] columns) and the column membership."""
        key = c.space()
        nrow = len(self.plan.rows)
        rows = [f"i{d}[:, None]" for d in range(nrow)]
        if key not in self.spaces:
            j = len(self.spaces)
            self.spaces[key] = f"c{j}"
            w(f"c{j} = rn - {c.lo}")
            w(f"m{j} = ((rn >= {c.lo}) & (rn < {c.hi}) & nmask)[None, :]")
            inner = 1
            for d in reversed(range(len(c.split))):
                size = c.split[d]
                w(f"c{j}_{d} = (c{j} // {inner}) % {size}" if inner > 1 else f"c{j}_{d} = c{j} % {size}")
                inner *= size
        j = self.spaces[key][1:]
        cols = [f"c{j}_{d}[None, :]" for d in range(len(c.split))]
        return rows + cols, f"m{j}"

    def _load_ext(self, w: Writer, j: int) -> str:
        v, c, res = self.ext[j]
        idx, member = self._space(w, c)
        addr = " + ".join(f"({e}) * e{j}_s{d}" for d, e in enumerate(idx))
        mask = f"mmask[:, None] & {member}"
        logical, own = shape_of(res), shape_of(v)
        own = (1,) * (len(logical) - len(own)) + own
        for i, (a, b) in enumerate(zip(own, logical)):
            if a not in (1, b):  # a narrower operand (partial rotary's cos/sin): no reads past its end
                mask += f" & ({idx[c.perm[i]]} < {a})"
        t = self.names.fresh("e")
        w(f"{t} = tl.load(e{j}_ptr + {addr}, mask={mask}, other=0.0).to(tl.float32)")
        return t

    def _head_norm(self, w: Writer, o: RMSNormOp) -> None:
        """RMSNorm over each head's D columns, with dl.rms_norm's rounding: the tile (whole heads, BLOCK_N % D
        == 0) is reshaped [BLOCK_M, BLOCK_N // D, D] for each head's mean square."""
        d = self.plan.info[o.input].split[-1]
        eps, offset, in_f32 = o.attrs
        names, x = self.names, self.names[o.input]
        heads, ms, normed, y = names.fresh("hd"), names.fresh("ms"), names.fresh("nrm"), names.fresh("y")
        w(f"{heads} = tl.reshape(tl.broadcast_to({x}, [BLOCK_M, BLOCK_N]), [BLOCK_M, BLOCK_N // {d}, {d}])")
        w(f"{ms} = tl.sum({heads} * {heads}, axis=2) / {d}")
        w(f"{normed} = tl.reshape({heads} * tl.rsqrt({ms} + {eps!r})[:, :, None], [BLOCK_M, BLOCK_N])")
        if o.weight is None:
            expr = normed
        else:
            weight = f"({names[o.weight]} + {offset!r})" if offset else names[o.weight]
            expr = f"{normed} * {weight}" if in_f32 else f"{round_to(normed, o.input)} * {weight}"
        w(f"{y} = {round_to(expr, o.result)}")
        names[o.result] = y

    def _rotary(self, w: Writer, o: RotaryOp) -> None:
        """Rotate head columns. With MM (the product in memory) each column's partner is read back from the
        product: out = x * cos + sign * partner * sin, elementwise, for any tile width. Otherwise in registers:
        the tile is reshaped so each rotation pair lands in one axis of size 2 (split), rotated, and joined
        back. Heads of D columns start at tile boundaries (BLOCK_N % D == 0); with partial rotary only the
        first rotary_dim columns of a head change. A tile narrower than a head (plan.narrow_rotary) is one
        rotation group: for the half layout its columns are the matching parts of the head's two halves (see
        `rn`), for the interleaved one a run of pairs."""
        c = self.plan.info[o.input]
        d, rd = c.split[-1], o.dim
        dcol = self._space(w, c)[0][-1]  # the column within the head
        x, cos, sin = self.names[o.input], self.names[o.cos], self.names[o.sin]
        names = self.names
        # (not "c": c<j> names the index spaces)
        parts = {tag: (names.fresh(tag), names.fresh(tag)) for tag in ("x", "cos", "sin")}
        t = names.fresh("rot")
        if self.plan.rotary_from_product:
            lin, h = self.plan.linear, rd // 2
            if o.layout.data == "half":  # partner j + h of the first half, j - h of the second
                delta, sign = f"tl.where({dcol} < {h}, {h}, -{h})", f"tl.where({dcol} < {h}, -1.0, 1.0)"
            else:  # pairs (2j, 2j + 1)
                delta, sign = f"tl.where({dcol} % 2 == 0, 1, -1)", f"tl.where({dcol} % 2 == 0, -1.0, 1.0)"
            pc, xp = names.fresh("pc"), names.fresh("xp")
            w("if MM:")
            w.indent()
            w(f"{pc} = ((rn % GRID_N) + {c.stream_lo})[None, :] + {delta}")
            w(f"{xp} = tl.load(mm_ptr + (rm % M).to(tl.int64)[:, None] * {self.plan.n} + {pc}).to(tl.float32)")
            if lin.bias is not None:
                w(f"{xp} += tl.load(bias_ptr + {pc}).to(tl.float32)")
            w(f"{xp} = {round_to(xp, lin.result)}")
            w(f"{t} = {x} * {cos} + {sign} * {xp} * {sin}")
            w.dedent()
            w("else:")
            w.indent()

        def rotate(groups: str, half: str) -> None:
            if o.layout.data == "half":  # pairs (j, j + half) of each group
                shape, perm = f"[BLOCK_M, {groups}, 2, {half}]", "[0, 1, 3, 2]"
            else:  # pairs (2j, 2j + 1)
                shape, perm = f"[BLOCK_M, {groups}, {half}, 2]", "[0, 1, 2, 3]"
            for v, tag in ((x, "x"), (cos, "cos"), (sin, "sin")):
                a, b = parts[tag]
                w(f"{a}, {b} = tl.split(tl.permute(tl.reshape(tl.broadcast_to({v}, [BLOCK_M, BLOCK_N]), {shape}), {perm}))")
            (x1, x2), (c1, c2), (s1, s2) = parts["x"], parts["cos"], parts["sin"]
            w(f"{t} = tl.reshape(tl.permute(tl.join({x1} * {c1} - {x2} * {s1}, {x2} * {c2} + {x1} * {s2}), {perm}), [BLOCK_M, BLOCK_N])")

        if self.plan.narrow_rotary:
            w(f"if BLOCK_N < {rd}:")
            w.indent()
            rotate("1", "BLOCK_N // 2")
            w.dedent()
            w("else:")
            w.indent()
            rotate(f"BLOCK_N // {rd}", str(rd // 2))
            w.dedent()
        else:
            rotate(f"BLOCK_N // {rd}", str(rd // 2))
        if self.plan.rotary_from_product:
            w.dedent()
        if rd < d:  # partial rotary: the columns past rotary_dim in each head pass through
            w(f"{t} = tl.where({dcol} < {rd}, {t}, {x})")
        names[o.result] = t


def build(fused: FusedOp, plan: GemmPlan, name: str) -> Kernel:
    em = GemmEmitter(plan, fused, name)
    src = em.source()
    m = numel(plan.rows)
    args = list(fused.block.args)
    inside = set(fused.body_ops)
    ext_strides: list[int] = []
    ext_args: list[int] = []
    for v, c, res in em.ext:
        base, chain = input_view(v, inside, args)
        lay = view_chain(Layout.contiguous(shape_of(base)), chain)
        ext_strides += _canonical_strides(lay, c, shape_of(res))
        ext_args.append(args.index(base))
    out_shapes = [shape_of(r) for r in em.outputs]
    out_dtypes = [dtype_of(r) for r in em.outputs]
    out_strides: list[int] = []
    for r in em.outputs:
        out_strides += _canonical_strides(shape_of(r), plan.info[r], shape_of(r))
    lin = plan.linear
    x_arg = args.index(plan.norm.input if plan.norm else lin.input)
    w_arg = args.index(lin.weight)
    pre = [x_arg, w_arg]
    if lin.bias is not None:
        pre.append(args.index(lin.bias))
    if plan.rms is not None and plan.rms.weight is not None:
        pre.append(args.index(plan.rms.weight))
    row_sizes = list(plan.rows[1:])
    ns = len(plan.streams)
    gn, k = plan.grid_n, plan.k
    elem = dtype_of(lin.input).itemsize
    counters: dict[torch.device, torch.Tensor] = {}
    has_norm, ln = plan.norm is not None, isinstance(plan.norm, LayerNormOp)
    eps, offset, scale_f32 = plan.rms.attrs if plan.rms else (plan.norm.eps.value.data, 0.0, False) if ln else (0.0, 0.0, False)
    nw_arg = args.index(plan.norm.weight) if has_norm and plan.norm.weight is not None else None
    nb_arg = args.index(plan.norm.bias) if ln else None

    def launch(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        dev = tensors[x_arg].device
        outs = [torch.empty(s, dtype=dt, device=dev) for s, dt in zip(out_shapes, out_dtypes)]
        bm, bn, bk, sk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
        tiles = cdiv(m, bm) * cdiv(gn, bn)
        k_split = cdiv(cdiv(k, sk), bk) * bk
        if sk > 1:
            ws = torch.empty(sk * tiles * (ns * bm * bn + bm), dtype=torch.float32, device=dev)
            cnt = counters.get(dev)
            if cnt is None or cnt.numel() < tiles:  # zeroed once; the last program of each tile resets its counter
                cnt = counters[dev] = torch.zeros(max(tiles, cdiv(m, 16) * cdiv(gn, 16)), dtype=torch.int32, device=dev)
        else:
            ws = cnt = outs[0]
        mm, normed = config["MM"], has_norm and config["NORM_PASS"]
        ins = [tensors[i] for i in pre]
        if normed:  # the normalized rows (as eager computes them) written once: the K loop reads them as they are
            xn = torch.empty(m, k, dtype=ins[1].dtype, device=dev)
            kb = min(8192, triton.next_power_of_2(k))  # whole rows up to 8192 columns: x read once
            grid, rows = (cdiv(m, max(1, 8192 // kb)),), max(1, 8192 // kb)
            if ln:
                launch_lib(row_layer_norm, grid, dev, ins[0], tensors[nw_arg], tensors[nb_arg], xn, m, k, eps,
                           K_BLOCK=kb, ROWS=rows, ONE_PASS=kb >= k, num_warps=8)  # fmt: skip
            else:
                launch_lib(row_norm, grid, dev, ins[0], tensors[nw_arg] if nw_arg is not None else xn, xn, m, k, eps,
                           offset, HAS_W=nw_arg is not None, SCALE_F32=scale_f32, K_BLOCK=kb, ROWS=rows,
                           ONE_PASS=kb >= k, num_warps=8)  # fmt: skip
            ins[0] = xn
        # MM: cuBLAS computes the product and the kernel is the epilogue
        prod = torch.matmul(ins[0].reshape(m, k), ins[1].t()) if mm else outs[0]
        rs_inline = has_norm and m <= RS_INLINE_ROWS and not normed
        if has_norm and not rs_inline and not normed:  # (an RMSNorm: a LayerNorm is always a pass)  # the norm's row statistics: one pass over x, read by the GEMM's epilogue
            rs = torch.empty(m, dtype=torch.float32, device=dev)
            launch_lib(row_rms, (cdiv(m, RMS_ROWS),), dev, tensors[x_arg], rs, m, k, eps, K_BLOCK=min(1024, triton.next_power_of_2(k)), ROWS=RMS_ROWS)
        else:
            rs = outs[0]
        tma = config["TMA"] and all(t.data_ptr() % 16 == 0 for t in ins[:2])
        if tma:
            device.descriptor_scratch()
        kernel[(tiles, sk)](
            *ins, *[tensors[i] for i in ext_args], *outs, prod, ws, cnt, rs, m, *row_sizes, *ext_strides,
            *out_strides, K=k, GRID_N=gn, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"], SPLIT_K=sk,
            K_SPLIT=k_split, EVEN_K=k % (bk * sk) == 0, TMA=bool(tma), RS_INLINE=rs_inline,
            RS_BLOCK=max(64, min(2048 // bm, triton.next_power_of_2(k))), MM=mm, NORMED=bool(normed), num_warps=config["num_warps"], num_stages=config["num_stages"],
        )  # fmt: skip
        return outs

    flops = 2.0 * m * k * gn * ns
    nbytes = (m * k + plan.n * k) * elem + sum(numel(s) * dt.itemsize for s, dt in zip(out_shapes, out_dtypes))
    nbytes += sum(numel(shape_of(v)) * dtype_of(v).itemsize for v, _, _ in em.ext)
    return Kernel(name, src, launch, fused, {"M": m, "N": gn, "K": k, "streams": ns}, flops, nbytes)


PARAMS = {
    "BLOCK_M": [1, 16, 32, 64, 128],
    "BLOCK_N": [16, 32, 64, 128, 256],
    "BLOCK_K": [32, 64, 128, 256, 512],
    "SPLIT_K": [1, 2, 4, 8, 16],
    "GROUP_M": [1, 8],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
    "TMA": [0, 1],
    "MM": [0, 1],  # 1: cuBLAS computes x @ W^T, the kernel is the prologue's scaling and the epilogue
    "NORM_PASS": [0, 1],  # 1: a row pass writes the normalized x (the K loop reads it unscaled, no row statistics)
}


def space(plan: GemmPlan) -> SearchSpace:
    """Tiles, split-K, grouping, warps, stages and TMA, constrained by the shape, the device's shared memory,
    SM count and TMA support, and the epilogue (rotary heads within a tile)."""
    m, gn, k, ns = numel(plan.rows), plan.grid_n, plan.k, len(plan.streams)
    elem = dtype_of(plan.linear.input).itemsize
    rot = max(plan.rotary_dims) if plan.rotary_dims else 16
    narrow = plan.narrow_rotary is not None
    smem_limit, sms, tma_ok = device.smem_limit(), device.sm_count(), device.has_tma()
    has_norm, ln = plan.norm is not None, isinstance(plan.norm, LayerNormOp)
    return SearchSpace(
        PARAMS,
        {
            "heads (rotary, per-head norm) fit the tile (MM reads rotary partners back: any width)": lambda c:
            c["BLOCK_N"] % rot == 0
            or (narrow and rot % c["BLOCK_N"] == 0 and not c["TMA"]) or (c["MM"] and plan.rotary_from_product),
            "one-row (CUDA-core) tiles only for a few rows": lambda c: c["BLOCK_M"] > 1
            or (m <= GEMV_ROWS and not c["TMA"]),
            "K blocks over 128 only for one-row tiles": lambda c: c["BLOCK_K"] <= 128 or c["BLOCK_M"] == 1,
            "no block much larger than M": lambda c: c["BLOCK_M"] <= max(16, triton.next_power_of_2(m)),
            "TMA needs sm90+ and 16-byte row strides": lambda c: not c["TMA"] or (tma_ok and k * elem % 16 == 0),
            "no block much larger than N": lambda c: c["BLOCK_N"] <= max(16, rot, triton.next_power_of_2(gn)),
            "no block much larger than K": lambda c: c["BLOCK_K"] <= max(32, triton.next_power_of_2(k)),
            "split K only for under two waves of tiles and long K": lambda c: c["SPLIT_K"] == 1
            or (cdiv(m, c["BLOCK_M"]) * cdiv(gn, c["BLOCK_N"]) < 2 * sms and k // c["SPLIT_K"] >= 4 * c["BLOCK_K"]),
            "shared memory": lambda c: c["BLOCK_M"] == 1
            or (c["BLOCK_M"] + ns * c["BLOCK_N"]) * c["BLOCK_K"] * elem * c["num_stages"] <= smem_limit,
            "registers": lambda c: ns * c["BLOCK_M"] * c["BLOCK_N"] <= 128 * c["num_warps"] * 32
            and (c["BLOCK_M"] > 1 or ns * c["BLOCK_N"] * c["BLOCK_K"] <= 64 * c["num_warps"] * 32),
            "group only with several row blocks": lambda c: c["GROUP_M"] == 1 or m > c["BLOCK_M"],
            "a cuBLAS product (MM) has tensor-core-sized tiles and no K-loop parameters": lambda c: not c["MM"]
            or (c["BLOCK_M"] > 1 and c["SPLIT_K"] == 1 and not c["TMA"] and c["BLOCK_K"] == 32 and c["num_stages"] == 2),
            "a norm pass only with a norm prologue, always under a cuBLAS product and for a LayerNorm": lambda c:
            c["NORM_PASS"] == (has_norm and (c["MM"] or c["NORM_PASS"] or ln)),
        },
        default=_default_config(m, gn, k, rot, narrow, ns, sms, tma_ok and k * elem % 16 == 0, smem_limit // elem,
                                has_norm, ln),
        seeds=_seed_configs(m, ns, has_norm, ln),
    )


class GemmTemplate(KernelTemplate):
    """Y = x @ W^T with an RMSNorm prologue and an epilogue of everything the planner attached to Y (see the
    module docstring)."""

    name = "gemm"
    params = PARAMS

    def can_lower(self, ops: list[Operation], inputs: list[SSAValue]) -> GemmPlan | WhyNot:
        plan = analyze(ops, inputs)
        return WhyNot(plan) if isinstance(plan, str) else plan

    def emit(self, fused: FusedOp, plan: GemmPlan, name: str) -> Kernel:
        return build(fused, plan, name)

    def space(self, plan: GemmPlan) -> SearchSpace:
        return space(plan)


RMS_ROWS = 4
RS_INLINE_ROWS = 16  # up to this many rows the GEMM's last programs compute the norm statistics themselves
GEMV_ROWS = 4  # up to this many rows one-row tiles (CUDA cores, the weight read once per row) are tried


@triton.jit
def row_rms(x_ptr, rs_ptr, M, K, eps, K_BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """rs[m] = rsqrt(mean(x[m, :]^2) + eps) in fp32, for the GEMM epilogue that applies the RMSNorm.

    The statistics were first accumulated in the GEMM's K loop from the A tiles it loads; on H200 with
    Triton 3.6 that gave config-dependent wrong rows (0.4-68% of outputs with 8-warp or 256-wide tiles,
    bench/check_configs.py), so they come from this pass over x (M*K reads, no normalized copy written).
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K_BLOCK)
    acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
    for k0 in range(0, K, K_BLOCK):
        mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
        v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += v * v
    tl.store(rs_ptr + rows, tl.rsqrt(tl.sum(acc, axis=1) / K + eps), mask=rows < M)


@triton.jit
def row_norm(x_ptr, w_ptr, y_ptr, M, K, eps, offset, HAS_W: tl.constexpr, SCALE_F32: tl.constexpr,
             K_BLOCK: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr):
    """y = RMSNorm(x) with `dl.rms_norm`'s rounding (see there), in y's dtype: the A operand of the K loop or of a
    cuBLAS product (NORM_PASS, MM configs), as eager computes it. ONE_PASS (K <= K_BLOCK): x is read once."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K_BLOCK)
    if ONE_PASS:  # the whole row, kept in registers for the second loop
        whole = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
                        mask=(rows < M)[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)
        acc = whole * whole
    else:
        whole = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        for k0 in range(0, K, K_BLOCK):
            mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
            v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0)
            acc += v.to(tl.float32) * v.to(tl.float32)
    rs = tl.rsqrt(tl.sum(acc, axis=1) / K + eps)
    for k0 in range(0, K, K_BLOCK):
        mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
        offs = rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :]
        if ONE_PASS:
            n = whole * rs[:, None]
        else:
            n = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) * rs[:, None]
        if HAS_W:
            wv = tl.load(w_ptr + k0 + cols, mask=k0 + cols < K, other=0.0)
            if SCALE_F32:
                n = n * (wv.to(tl.float32) + offset)[None, :]
            else:  # normalized value rounded to x's dtype, times (weight + offset) in the weight's dtype
                wo = (wv.to(tl.float32) + offset).to(wv.dtype).to(tl.float32)
                n = n.to(x_ptr.dtype.element_ty).to(tl.float32) * wo[None, :]
        tl.store(y_ptr + offs, n.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, M, K, eps, K_BLOCK: tl.constexpr, ROWS: tl.constexpr,
                   ONE_PASS: tl.constexpr):
    """y = F.layer_norm(x, weight, bias) (statistics, scaling and shift in fp32, one rounding to y's dtype): the A
    operand of a GEMM with a LayerNorm prologue. ONE_PASS (K <= K_BLOCK): x is read once."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K_BLOCK)
    if ONE_PASS:
        whole = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
                        mask=(rows < M)[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)
        mean = tl.sum(whole, axis=1) / K
        dev = tl.where((cols < K)[None, :], whole - mean[:, None], 0.0)
        var = tl.sum(dev * dev, axis=1) / K
    else:
        whole = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        for k0 in range(0, K, K_BLOCK):
            mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
            acc += tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=1) / K
        acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        for k0 in range(0, K, K_BLOCK):  # the variance from the deviations (no cancellation)
            mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
            v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, v - mean[:, None], 0.0)
            acc += d * d
        var = tl.sum(acc, axis=1) / K
    rstd = tl.rsqrt(var + eps)
    for k0 in range(0, K, K_BLOCK):
        mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
        offs = rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :]
        if ONE_PASS:
            v = whole
        else:
            v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        bv = tl.load(b_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        y = (v - mean[:, None]) * rstd[:, None] * wv[None, :] + bv[None, :]
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _default_config(m: int, n: int, k: int, rot: int, narrow: bool, ns: int, sms: int, tma: bool, smem_elems: int,
                    has_norm: bool, ln: bool = False) -> dict:
    """A reasonable untuned config, after the exhaustive sweeps on H200 (bench/NOTES.md): one row streams
    the weight through CUDA cores in narrow tiles; other decode shapes stream it with more programs
    (split-K) up to about 3/4 of a wave; above 256 rows, 128x128 tiles (also for the dual GEMM) loaded
    through TMA (at 128 rows TMA made the default slower: 81 vs 55 µs). Above 16 rows a norm prologue is a row
    pass: scaling the A tile by the norm weight inside the K loop takes it out of the tensor cores' pipeline (H100,
    M=2048: 171 vs 148 µs for the QKV GEMM, NOTES 36)."""
    if m == 1:  # about 8 programs per SM, each streaming 16 weight rows 128 wide (M=1 sweeps, NOTES 19)
        bn = 16 if narrow or rot <= 16 else rot
        bk = max(32, min(128, 8192 // (ns * bn), triton.next_power_of_2(k)))
        tiles, split = -(-n // bn), 1
        while tiles * split * 2 <= 8 * sms and k // (split * 2) >= 4 * bk and split < 16:
            split *= 2
        return {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "GROUP_M": 1, "num_warps": 4,
                "num_stages": 2, "TMA": 0, "MM": 0, "NORM_PASS": int(ln)}  # fmt: skip
    bm = 16 if m <= 16 else 64 if m <= 256 else 128
    bn = min(max(rot, 128), max(16, rot, triton.next_power_of_2(n)))  # no wider than N
    bk = 128 if m <= 16 and k >= 512 else 64 if k >= 64 else 32
    tiles = -(-m // bm) * -(-n // bn)
    split = 1
    while m <= 64 and tiles * split * 4 < 3 * sms and k // (split * 2) >= 4 * bk and split < 8:
        split *= 2
    stages = 3 if m > 16 else 4
    while stages > 2 and (bm + ns * bn) * bk * stages > smem_elems:  # e.g. fp32 operands
        stages -= 1
    return {"BLOCK_M": bm, "BLOCK_N": min(bn, 256), "BLOCK_K": bk, "SPLIT_K": split,
            "GROUP_M": 8 if m > bm else 1,
            "num_warps": 4 if bm * bn * ns <= 8192 else 8, "num_stages": stages,
            "TMA": int(tma and bm == 128), "MM": 0, "NORM_PASS": int(ln or (has_norm and m > 16))}  # fmt: skip


def _seed_configs(m: int, ns: int, has_norm: bool, ln: bool = False) -> list[dict]:
    """The best configs of the exhaustive sweeps on H200 and H100 (bench/NOTES.md) for this row count's class,
    then (above 16 rows) the cuBLAS product with this kernel as its epilogue: the quick search tries them after
    the default (those the shape's constraints reject are skipped). Above 16 rows a norm is a row pass."""
    if m == 1:  # QKV, down, gate/up at M=1
        tiles = [(1, 32, 256, 2, 8, 3, 0), (1, 16, 128, 8, 4, 2, 0), (1, 32, 128, 1, 4, 2, 0)]
    elif m <= 16:  # QKV (narrow rotary tiles), o-proj, gate/up
        tiles = [(16, 64, 128, 4, 8, 2, 0), (16, 128, 128, 2, 4, 4, 0), (16, 128, 128, 1, 4, 3, 0)]
    elif m <= 256:  # QKV, gate/up at 128
        tiles = [(64, 128, 128, 1, 4, 4, 0), (64, 256, 64, 1, 8, 3, 1)]
    else:  # QKV, gate/up at 2048 (H200); every plain GEMM of five layers at 2048 (H100, NOTES 36)
        tiles = [(128, 128, 64, 1, 8, 4, 1), (128, 256, 64, 1, 8, 4, 1), (128, 256, 64, 1, 8, 3, 1)]
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages", "TMA")
    pas = int(ln or (has_norm and m > 16))
    seeds = [{**dict(zip(keys, t)), "GROUP_M": 8 if m > t[0] else 1, "MM": 0, "NORM_PASS": pas} for t in tiles]
    if m > 16:  # an epilogue pass over the product: wide tiles, one per 8 warps
        bm = 64 if m <= 64 else 128
        seeds.append({"BLOCK_M": bm, "BLOCK_N": 128 if ns == 1 else 64, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 8,
                      "num_stages": 2, "TMA": 0, "GROUP_M": 8 if m > bm else 1, "MM": 1, "NORM_PASS": pas})  # fmt: skip
    return seeds


register_template(GemmTemplate())
