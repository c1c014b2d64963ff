"""What a GEMM region computes, read off its ops: the linear, its norm prologue, and for every epilogue value its
view of Y's tile (`Cols`). `analyze` accepts a region or says why not.

Index model: every epilogue value is a view of Y's tile: a column range [lo, hi) of one accumulator
("stream"), the split of those columns into static dims, and a permutation from its logical dims to the
canonical order (row dims..., column dims...). Addresses of outputs and operands are strides in that
canonical order, so one formula serves every layout.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import torch
from xdsl.ir import Operation, SSAValue

from ...dialects import (
    ConstantOp,
    IndexCopyOp,
    LayerNormOp,
    LinearOp,
    PermuteOp,
    ReshapeOp,
    RMSNormOp,
    RotaryOp,
    SliceOp,
)
from ...dialects.types import dtype_of, numel, shape_of
from ..exprs import POINTWISE
from ..views import VIEW_OPS, Layout, view_chain, view_source

GEMV_ROWS = 4  # up to this many rows one-row tiles (CUDA cores, the weight read once per row) are tried


@dataclass(frozen=True)
class Cols:
    """A value's view of the tile: stream, column range, column split and logical→canonical permutation."""

    stream_lo: int  # absolute column of Y where this value's columns start (which accumulator)
    lo: int  # first grid column of the value (relative to its stream)
    hi: int
    split: tuple[int, ...]
    perm: tuple[int, ...]  # logical dim i is canonical dim perm[i]
    # (start, size): the value holds only these positions of the innermost split dim (GPT-NeoX's q, k and v,
    # sliced from each head's [q | k | v] columns); its logical innermost index is the position minus start
    window: tuple[int, int] | None = None

    @property
    def head(self) -> int:
        """The width of the value's innermost dim (a head's columns)."""
        return self.window[1] if self.window else self.split[-1]

    def space(self) -> tuple:
        return (self.lo, self.hi, self.split) if self.window is None else (self.lo, self.hi, self.split, self.window)


@dataclass
class GemmPlan:
    linear: LinearOp
    norm: RMSNormOp | LayerNormOp | None  # a LayerNorm runs as a row pass (NORM_PASS) above a few rows
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
    # outputs stored into an input at positions read from an index (a KV-cache update: k and v written straight
    # into the cache): the index_copy whose result the output is
    scatters: dict[SSAValue, IndexCopyOp] = field(default_factory=dict)
    # set when the kernel is built (`launch.build`): its warp-specialized kernel can end each tile in a TMA store
    # (its one output a plain [M, GRID_N] block: warp_specialized.Staging), so the space offers WS=2
    tma_epilogue: bool = False
    # set with the source (`cublas.residual_in_place`): the region input cuBLAS may add the product into, so the space
    # offers MM=2
    residual_in_place: int | None = None

    @property
    def rms(self) -> RMSNormOp | None:
        """The RMSNorm prologue, which the K loop and epilogue can also apply themselves (NORM_PASS=0)."""
        return self.norm if isinstance(self.norm, RMSNormOp) else None

    @property
    def ln(self) -> LayerNormOp | None:
        """The LayerNorm prologue, which the K loop can also apply itself for a few rows (NORM_PASS=0)."""
        return self.norm if isinstance(self.norm, LayerNormOp) else None


def input_view(v: SSAValue, inside: set, inputs: list[SSAValue]) -> tuple[SSAValue, list[Operation]] | None:
    """(region input, view chain) that `v` is read through, if its layout is a view (no copy) from offset 0."""
    found = view_source(v, inside, inputs)
    if found is None:
        return None
    lay = view_chain(Layout.contiguous(shape_of(found[0])), found[1])
    return None if lay is None or lay.offset else found


def canonical_strides(lay: Layout | tuple[int, ...], c: Cols, logical: tuple[int, ...]) -> list[int]:
    """Strides, in canonical dim order, of a layout (or a contiguous shape) broadcast to `logical`."""
    lay = (lay if isinstance(lay, Layout) else Layout.contiguous(lay)).broadcast_to(logical)
    canon = [0] * len(logical)
    for i, p in enumerate(c.perm):
        canon[p] = lay.strides[i]
    return canon


def flat_row_stride(strides: list[int], c: Cols, rows: tuple[int, ...], grid_n: int) -> int | None:
    """Where a value's tile is a plain block of an [M, GRID_N] matrix in memory (what a TMA descriptor of that
    shape reads or writes: its rows one stride apart, its columns the tile's, contiguous), that row stride (canonical
    `strides`); None otherwise."""
    nrow = len(rows)
    if c.window is not None or c.lo != 0 or c.hi != grid_n or numel(c.split) != grid_n:
        return None
    inner = 1
    for d in reversed(range(len(c.split))):
        if c.split[d] > 1 and strides[nrow + d] != inner:
            return None
        inner *= c.split[d]
    rs, inner = None, 1  # (row m = (i0 * R1 + i1) * R2 + ...: dim d must step rs times the rows after it)
    for d in reversed(range(nrow)):
        if rows[d] > 1:  # (a dim of size 1 has any stride)
            if rs is None:
                rs = strides[d] // inner
            if strides[d] != rs * inner:
                return None
        inner *= rows[d]
    return rs if rs is not None and rs >= grid_n else None


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
        starts = sorted({plan.info[v].lo + plan.info[v].stream_lo for v in o.operands if v in plan.info})
        pairs.update(itertools.combinations(starts, 2))
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
            below = [o for o in offsets if o <= start]
            if not below:  # (a range of Y before the first half, read by another op of the region)
                return "a column range lies outside the two halves"
            base = below[-1]
            if start - base + (c.hi - c.lo) > w:
                return "a column range crosses the two halves"
            plan.info[v] = replace(c, stream_lo=base, lo=start - base, hi=start - base + (c.hi - c.lo))
    else:
        plan.grid_n = n
    for o in plan.epilogue:
        if isinstance(o, RotaryOp):
            c = plan.info[o.input]
            d, rd = c.head, o.dim
            if c.window is not None and (c.window[0] % d or c.split[-1] % d):
                return f"rotary on a {d}-column slice at {c.window[0]} of {c.split[-1]}-column heads: not at multiples of {d}"
            if c.lo % d or d > 256 or d % rd or rd % 2 or (not d & (d - 1) and rd & (rd - 1)):
                return f"rotary on head dim {d} (rotary dim {rd}, column offset {c.lo}) does not tile: heads of at most 256 columns at multiples of their width, an even rotary dim dividing it (a power of two in a head of one)"
            plan.rotary_dims.add(d)
    rotaries = [o for o in plan.epilogue if isinstance(o, RotaryOp)]
    plan.rotary_from_product = bool(rotaries) and all(_view_of(o.input, lin.result) for o in rotaries)
    rots = {(plan.info[o.input].head, o.dim, o.layout.data) for o in rotaries}
    windowed = any(plan.info[o.input].window is not None for o in rotaries)
    if (len(rots) == 1 and (r := rots.pop())[0] == r[1] and plan.grid_n % r[0] == 0 and r[0] % 16 == 0
            and not plan.head_norm and not windowed):  # fmt: skip
        plan.narrow_rotary = r[2]  # one full-head rotary over whole heads: tiles (16 columns or more) may hold part of a head
    odd = sorted(d for d in plan.rotary_dims if d & (d - 1))
    if odd and not plan.rotary_from_product and not plan.narrow_rotary:
        # (a head of D columns that is not a power of two never fills whole tiles: its rotary runs in tiles of a
        # part of each head, BLOCK_N dividing D (narrow), or over cuBLAS's product reading partners back (MM))
        return (f"rotary on {odd[0]}-column heads (not a power of two) needs tiles of part of a head (one full-head "
                "rotary, D a multiple of 16) or partner columns read back from the product (a rotary of Y's view)")
    return plan


def _view_of(v: SSAValue, y: SSAValue) -> bool:
    """v is y seen through slices, reshapes and permutes only (its values are Y's, unchanged)."""
    while v is not y:
        if not isinstance(v.owner, (SliceOp, ReshapeOp, PermuteOp)):
            return False
        v = v.owner.operands[0]
    return True


def _epilogue_op(plan: GemmPlan, o: Operation, inside: set, nrow: int) -> str | None:
    if any(v in plan.scatters for v in o.operands):
        return f"{o.name} reads a tensor the epilogue writes at indexed positions"
    if isinstance(o, IndexCopyOp):
        return _scatter(plan, o, inside, nrow)
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
        if step == 1 and dim == len(shp) - 1 and len(c.split) == 1 and c.perm[-1] == nrow and c.window is None:
            plan.info[o.result] = Cols(c.stream_lo, c.lo + start, c.lo + end, (end - start,), c.perm)
            return None
        if step == 1 and dim == len(shp) - 1 and len(c.split) > 1 and c.perm[-1] == nrow + len(c.split) - 1 and c.window is None:
            plan.info[o.result] = replace(c, window=(start, end - start))  # q, k or v of each head's columns
            return None
        return "only a slice of undivided columns, or of each head's columns (last dim), fuses"
    if isinstance(o, ReshapeOp):
        nc = _split_cols(c, shp, shape_of(o.result), nrow) if c.window is None else None
        if nc is None:
            return "a reshape that mixes row and column dims"
        plan.info[o.result] = nc
        return None
    if isinstance(o, PermuteOp):
        plan.info[o.result] = replace(c, perm=tuple(c.perm[p] for p in o.permutation))
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
        if o.input is not ins[0] or len(c.split) < 2 or c.perm[-1] != nrow + len(c.split) - 1 or c.window is not None:
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
            if (c2.hi - c2.lo, c2.split, c2.perm, c2.window) != (c.hi - c.lo, c.split, c.perm, c.window):
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


def _scatter(plan: GemmPlan, o: IndexCopyOp, inside: set, nrow: int) -> str | None:
    """`dest.index_copy(dim, index, source)` of a tile value along a row dim (a KV-cache update: the token dim of k
    or v): the tile is stored into dest's rows at the positions `index` holds. The result is the whole dest, so it
    can only leave the region (the runtime passes dest's own tensor where eager's writes allow it, else a copy)."""
    if o.source not in plan.info or o.dest in plan.info or o.index in plan.info:
        return "an index_copy in the epilogue stores the tile into an external tensor at external positions"
    if any(v.owner in inside for v in (o.dest, o.index)):
        return "an index_copy's destination and index must be region inputs"
    if any(u.operation in inside and u.operation is not o for u in o.dest.uses):
        return "the epilogue reads the tensor an index_copy writes"
    if len(shape_of(o.index)) != 1:
        return "an index_copy in the epilogue takes a 1-D index"
    if dtype_of(o.index) != torch.int64:  # (torch's index_copy_ refuses any other: the torch step then raises as eager)
        return f"an index_copy's index is {dtype_of(o.index)}, not int64"
    c = plan.info[o.source]
    if c.perm[o.axis] >= nrow:
        return "an index_copy in the epilogue writes along a row (token) dim of the tile"
    plan.info[o.result] = c
    plan.scatters[o.result] = o
    return None


def whole_tiles(tiles: int, programs: int, split: int) -> int:
    """The tiles a persistent kernel with SPLIT_K = `split` runs whole: those of its full waves, where the last
    wave's tiles split `split` ways still make one wave (each program then runs at most one part); at a length
    where they would not (a config tuned at another length of the family), or fill whole waves, all of them."""
    tail = tiles % programs
    return tiles - tail if tail * split <= programs else tiles
