"""The warp-specialized variant (WS, sm90): the tiled GEMM's main loop written in Gluon, Triton's lower-level
dialect, where Triton 3.6 does not specialize our `tl.range` loops at 8 warps (bench/NOTES.md 135, 143).

One program per SM loops over the output tiles, grouped along M as `_tile` orders them. Two partitions share a ring
of STAGES shared-memory buffers for the A and W tiles, each stage with a "ready" and an "empty" mbarrier:
  `_ws_loads`  one warp: for every K step of every tile of the program, waits until the stage is free and copies
               the A tile and the W tile into it by TMA (the copies signal "ready"), running ahead across tiles, so
               the next tile's loads overlap this tile's epilogue;
  `_ws_tiles`  the kernel's warps (warpgroups of 64 rows): each K step's product issued asynchronously on the
               tensor cores (wgmma), one step in flight, the stage before freed; then the tile's epilogue, one of:
     WS=1      the accumulator moved to rows of 8 values a thread (`_epilogue_layout`: coalesced loads and stores)
               and the shared epilogue (epilogue.py), loading its operands and storing by pointer;
     WS=2      (EPI_TMA, `staging`: where the region's one output, without a rotary, is a plain [M, N] block with
               16-byte rows) the shared epilogue on the accumulator's two column halves in turn, in its own layout
               (the halves split without moving data; half the registers live), reading the residual from and
               writing the output into one shared-memory tile `c_smem`, which a TMA store then writes out. The MMA
               warps wait for that store only at the next tile's first K step, by when it has long finished; the
               loader then copies that tile's residual into `c_smem` by TMA (after the tile's first STAGES loads, so
               the ring is full when it waits). The residual's load and the output's per-element addresses leave
               the MMA warps' path (a bias, norm statistics or other operands are still loaded by pointer;
               bench/NOTES.md 168, 170).
The dual GEMM (gate and up) loads both streams' rows in turn into one [BLOCK_N, 2, BLOCK_K] stage through the 3-D
descriptor the Triton variant uses (tiled.py), so each K step is one product as wide as both, and splits the
accumulator after the loop (adjacent columns: no data moves). Two products of half the width, as until the
fifty-fifth session, read the A tile twice and ran 5-8% behind the Triton variant; one is 1-4% behind it alone
and 0.5-1.2% in the layer (bench/NOTES.md 160).
The epilogue's text is the Triton variant's, its `tl.` names taken from Gluon (`gluon_text`): its index vectors
have no stated layout and Gluon resolves them to the accumulators'. Where Gluon cannot resolve a layout or would
need a conversion Triton inserts by itself, the epilogue is written so that it needs none (`EpilogueEmitter.gluon`):
the QKV kernel tests which of q, k and v a tile holds on scalars from pid_n (not on reductions of `rn`), loads cos and
sin per column (not one [BLOCK_M, rotary_dim] table reshaped for every head), and its layout (`pair_span`) repeats
every half rotary width along the columns, so that each thread holds both columns of its rotation pairs, which the
split of `rotate_in_registers` needs.

Offered for 16-bit operands, one tile's K range a program (no split-K), the norm prologue as a row pass, where the
epilogue needs nothing Gluon lacks: not for a per-head RMSNorm (Qwen3's q/k norms, whose statistics reshape the tile
into heads). Measured on an H200 (bench/NOTES.md 144, 160, 170, 172): WS=1 as fast as the Triton variant's
persistent loop at the same tiles on o-proj and down (-2% to +2%), not faster; on the QKV GEMMs (rotary, heads in
eager's [B, S, H, D]) 1.8-4.7% faster at the same config in 16 of 16 pairs of five layers (the Triton loop's per-output
branches keep it from pipelining the next tile's loads into the epilogue; the loader warp does); WS=2 0.1-7.5%
faster than WS=1 at the same config on every dual gate/up GEMM of five layers (up to 1.017x cuBLAS's bare product on
Llama-3-8B's), 0-6.6% on o-proj, with no consistent sign on down (-4% to +3%); quick tuning picks WS=2 for most
gate/up regions, and WS=1 for the QKV regions of Llama-3-8B and Mistral-NeMo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import torch

from ...dialects import RMSNormOp, RotaryOp
from ...dialects.types import dtype_of
from ..exprs import Names
from ..source import Writer, wrapped
from .plan import flat_row_stride
from .tiled import tile_position

HEADER = ("from triton.experimental import gluon\n"
          "from triton.experimental.gluon import language as gl\n"
          "from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,\n"
          "                                                              warpgroup_mma, warpgroup_mma_wait)\n")
LOADER_REGS = 40  # the loader warp's registers (it holds addresses and counters only)
MAXNREG = 168  # with 8 MMA warps: 12 warps (the loader's warpgroup padded) x 32 x 168 <= 64K registers


@cache
def available() -> bool:
    """Whether this Triton has Gluon's Hopper pieces."""
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


def offered(plan) -> bool:
    """Whether the region gets the Gluon kernel: 16-bit operands, and an epilogue needing nothing Gluon lacks (see
    the module docstring)."""
    if not available() or dtype_of(plan.linear.input) not in (torch.float16, torch.bfloat16):
        return False
    return not plan.head_norm and not any(isinstance(o, RMSNormOp) for o in plan.epilogue)


@dataclass(frozen=True)
class Staging:
    """The TMA epilogue's operands (EPI_TMA): the region's one output and, if any, its external operand `ext` (the
    residual, prefetched by the loader) are plain [M, GRID_N] blocks in memory, `out_rs` and `ext_rs` elements a row
    apart."""

    out_rs: int
    ext: int | None = None
    ext_rs: int = 0

    def args(self) -> tuple[list[str], list[str]]:
        """The shared-memory tile, its descriptors and barriers the MMA warps and the loader take."""
        if self.ext is None:  # (the loader takes no part: the MMA warps only wait for their own store)
            return ["c_desc", "c_smem"], []
        return ["c_desc", "c_smem", "c_bars"], ["r_desc", "c_smem", "c_bars"]


def staging(em) -> Staging | None:
    """Where the region's WS kernel can end each tile in a TMA store: its one output (not scattered), 16-bit, a plain
    [M, GRID_N] block with 16-byte rows; an external operand of the output's dtype laid out so too (the residual) is
    then prefetched by the loader into the same shared-memory tile. None otherwise, and for a rotary: the epilogue
    runs on the accumulator's column halves, which would split its pairs apart."""
    p = em.plan
    if not offered(p) or len(em.outputs) != 1 or em.outputs[0] in p.scatters or p.rotary_dims:
        return None
    r = em.outputs[0]
    dt = dtype_of(r)
    rs = flat_row_stride(em.out_strides(0), p.info[r], p.rows, p.grid_n)
    if dt not in (torch.float16, torch.bfloat16) or rs is None or rs * dt.itemsize % 16:
        return None
    for j, (v, c, _) in enumerate(em.ext):
        ers = flat_row_stride(em.ext_operand(j)[1], c, p.rows, p.grid_n)
        if dtype_of(v) == dt and ers is not None and ers * dt.itemsize % 16 == 0:
            return Staging(rs, j, ers)
    return Staging(rs)


def pair_span(plan) -> int:
    """The columns a thread's run of the epilogue layout may span: where a rotary's pairs are (j, j + half) (HF's
    halves: `rotate_in_registers` splits them apart, which Gluon does only within a thread), the largest power of two
    dividing every such half (so the layout's repeat lands each partner in the thread of its column); else a whole
    256-column tile."""
    halves = [o.dim // 2 for o in plan.epilogue if isinstance(o, RotaryOp) and o.layout.data == "half"]
    return min((h & -h for h in halves), default=256)


def gluon_text(lines: list[str]) -> list[str]:
    """Triton lines as Gluon lines: `tl.` names from Gluon's language, `tl.sigmoid` from `_sigmoid` (Gluon has
    none), a tile's `tl.broadcast_to(x, [BLOCK_M, BLOCK_N])` as `gl.broadcast` against the accumulator `acc0` (Gluon
    has no broadcast to a shape: the rotary's, `exprs.rotate_in_registers`); `tl.PropagateNan` stays Triton's (a
    constant)."""
    out = []
    for line in lines:
        line = re.sub(r"\btl\.sigmoid\b", "_sigmoid", line)
        line = re.sub(r"\btl\.broadcast_to\((\w+), \[BLOCK_M, BLOCK_N\]\)", r"gl.broadcast(\1, acc0)[0]", line)
        out.append(re.sub(r"\btl\.(?!PropagateNan\b)", "gl.", line))
    return out


def emit(em, w: Writer, args: list[str], consts: tuple[str, ...]) -> None:
    """The Gluon kernel `<name>_ws` and its two partitions, after the Triton kernel in the same source."""
    p, name, st = em.plan, em.name, em.staging
    const_params = [f"{c}: gl.constexpr" for c in consts]
    tiles = Writer()
    _tiles(em, tiles, args, const_params, st)
    if any("_sigmoid(" in line for line in tiles.lines):  # (Gluon has no sigmoid: Triton's, in Gluon)
        w("@gluon.jit")
        w("def _sigmoid(x):")
        w("    return 1.0 / (1.0 + gl.exp(-x))")
        w("")
        w("")
    w("@gluon.constexpr_function")
    w("def _epilogue_layout(block_n, warps, span):")
    w('    """Rows of 8 consecutive values a thread, a warp\'s threads along the columns first, at most `span` columns')
    w('    wide (8 at least): from there the layout repeats, so a thread also holds the columns span, 2 * span, ...')
    w('    further on (the partners of a rotary\'s halves, which its split needs in one thread)."""')
    w("    across = min(32, block_n // 8, max(1, span // 8))")
    w("    return gl.BlockedLayout([1, 8], [32 // across, across], [warps, 1], [1, 0])")
    w("")
    w("")
    _loads(em, w, st)
    w.lines += tiles.lines
    w("@gluon.jit")
    wrapped(w, f"def {name}_ws(", [*args, "DP_TILES", *const_params, "STAGES: gl.constexpr", "EPI_TMA: gl.constexpr",
                                  "num_warps: gl.constexpr"], "):")  # fmt: skip
    w.indent()
    w('"""The shared-memory ring and its barriers, then the two partitions (see the module docstring)."""')
    w("dt: gl.constexpr = x_ptr.dtype.element_ty")
    off = p.streams[0]
    if len(p.streams) == 1:  # (W's GRID_N rows from row `off`)
        box, shape, strides, layout = "[BLOCK_N, BLOCK_K]", "[GRID_N, K]", "[K, 1]", "w_layout"
    else:  # (both streams' rows in turn: the middle stride is their distance, as in tiled.py)
        box, shape, strides, layout = ("[BLOCK_N, 2, BLOCK_K]", "[GRID_N, 2, K]", f"[K, {p.streams[1] - off} * K, 1]",
                                       "w_layout3")  # fmt: skip
    w("a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], dt)")
    w(f"{layout}: gl.constexpr = gl.NVMMASharedLayout.get_default_for({box}, dt)")
    w("a_desc = tma.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K],")
    w("                                    layout=a_layout)")
    w(f"w0_desc = tma.make_tensor_descriptor(w_ptr + {off} * K, shape={shape}, strides={strides},")
    w(f"                                     block_shape={box}, layout={layout})")
    w("a_bufs = gl.allocate_shared_memory(dt, [STAGES, BLOCK_M, BLOCK_K], a_layout)")
    w(f"w0_bufs = gl.allocate_shared_memory(dt, [STAGES, {box[1:-1]}], {layout})")
    w("ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())")
    w("empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())")
    w("for i in gl.static_range(STAGES):")
    w("    mbarrier.init(ready.index(i), count=1)")
    w("    mbarrier.init(empty.index(i), count=1)")
    shared = "a_bufs, w0_bufs, ready, empty"

    def partitions(staged: list[str], loaded: list[str]) -> None:
        w("gl.warp_specialize([")
        w.indent()
        wrapped(w, "(_ws_tiles, (", [*args, shared, *staged, *consts, "STAGES", "EPI_TMA", "num_warps"], ")),")
        wrapped(w, "(_ws_loads, (", ["a_desc", "w0_desc", shared, *loaded, "M", "K", "GRID_N", "BLOCK_M", "BLOCK_N",
                                     "BLOCK_K", "GROUP_M", "STAGES", "EPI_TMA"], ")),")  # fmt: skip
        w.dedent()
        w(f"], [1], [{LOADER_REGS}])  # (the loader: one warp)")

    if st is None:
        partitions([], [])
    else:
        w("if EPI_TMA:  # each tile's output written into a shared-memory tile and stored from there by TMA")
        w.indent()
        w("o_dt: gl.constexpr = out0_ptr.dtype.element_ty")
        w("c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], o_dt)")
        w("c_smem = gl.allocate_shared_memory(o_dt, [BLOCK_M, BLOCK_N], c_layout)")
        w(f"c_desc = tma.make_tensor_descriptor(out0_ptr, shape=[M, GRID_N], strides=[{st.out_rs}, 1],")
        w("                                    block_shape=[BLOCK_M, BLOCK_N], layout=c_layout)")
        if st.ext is not None:  # (the residual's tile, copied by the loader into c_smem: "full" and "free")
            w(f"r_desc = tma.make_tensor_descriptor(e{st.ext}_ptr, shape=[M, GRID_N], strides=[{st.ext_rs}, 1],")
            w("                                    block_shape=[BLOCK_M, BLOCK_N], layout=c_layout)")
            w("c_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())")
            w("mbarrier.init(c_bars.index(0), count=1)")
            w("mbarrier.init(c_bars.index(1), count=1)")
        partitions(*st.args())
        w.dedent()
        w("else:")
        w.indent()
        partitions(*(["0"] * len(a) for a in st.args()))  # (placeholders: WS=1 reads none of them)
        w.dedent()
    w.dedent()
    w("")
    w("")


def _loads(em, w: Writer, st: Staging | None) -> None:
    w("@gluon.jit")
    wrapped(w, "def _ws_loads(", ["a_desc", "w0_desc", "a_bufs", "w0_bufs", "ready", "empty",
                                 *(st.args()[1] if st else []), "M", "K: gl.constexpr",
                                 "GRID_N: gl.constexpr", "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr",
                                 "BLOCK_K: gl.constexpr", "GROUP_M: gl.constexpr", "STAGES: gl.constexpr",
                                 "EPI_TMA: gl.constexpr"], "):")  # fmt: skip
    w.indent()
    w('"""The loader warp: each K step of each tile copied into the next free stage (see the module docstring)."""')
    prefetch = st is not None and st.ext is not None
    if prefetch:
        w("t = 0")
    _tile_loop(w)
    w("for k0 in range(0, K, BLOCK_K):")
    w.indent()
    w("s = it % STAGES")
    w("mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # (a new barrier's phase 1 counts as complete)")
    w("mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + w0_desc.block_type.nbytes)")
    w("tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, k0], ready.index(s), a_bufs.index(s))")
    at = "pid_n * BLOCK_N, k0" if len(em.plan.streams) == 1 else "pid_n * BLOCK_N, 0, k0"
    w(f"tma.async_copy_global_to_shared(w0_desc, [{at}], ready.index(s), w0_bufs.index(s))")
    w("it += 1")
    if prefetch:  # after the tile's first STAGES copies, by when the MMA warps have begun it and freed c_smem
        w("if EPI_TMA:")
        w("    if k0 == (min(STAGES, (K + BLOCK_K - 1) // BLOCK_K) - 1) * BLOCK_K:  # the residual's tile")
        w("        mbarrier.wait(c_bars.index(1), (t & 1) ^ 1)  # (the tile before's store has read c_smem)")
        w("        mbarrier.expect(c_bars.index(0), r_desc.block_type.nbytes)")
        w("        tma.async_copy_global_to_shared(r_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_bars.index(0),")
        w("                                        c_smem)")
    w.dedent()
    if prefetch:
        w("t += 1")
    w.dedent()
    w.dedent()
    w("")
    w("")


def _tiles(em, w: Writer, args: list[str], const_params: list[str], st: Staging | None) -> None:
    dual = len(em.plan.streams) == 2
    width = "2 * BLOCK_N" if dual else "BLOCK_N"
    b = "w0_bufs.index(s).reshape([2 * BLOCK_N, BLOCK_K])" if dual else "w0_bufs.index(s)"
    acc = "acc" if dual else "acc0"  # (the epilogue reads acc0, and acc1 for the dual GEMM)
    staged = st is not None
    prefetch = staged and st.ext is not None
    w("@gluon.jit")
    wrapped(w, "def _ws_tiles(", [*args, "a_bufs", "w0_bufs", "ready", "empty", *(st.args()[0] if st else []),
                                  *const_params,
                                  "STAGES: gl.constexpr", "EPI_TMA: gl.constexpr", "num_warps: gl.constexpr"],
            "):")  # fmt: skip
    w.indent()
    w('"""The MMA warps: each tile\'s products as its stages arrive, then its epilogue (see the module docstring)."""')
    w("layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],")
    w(f"                                                 instr_shape=[16, {width}, 16])")
    if staged:
        w("t = 0")
    _tile_loop(w)
    w(f"{acc} = gl.zeros((BLOCK_M, {width}), dtype=gl.float32, layout=layout)")
    w("for k0 in range(0, K, BLOCK_K):")
    w.indent()
    w("s = it % STAGES")
    w("mbarrier.wait(ready.index(s), (it // STAGES) & 1)")
    w(f"{acc} = warpgroup_mma(a_bufs.index(s), {b}.permute((1, 0)), {acc}, use_acc=k0 > 0, is_async=True)")
    w(f"{acc}, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=({acc}, a_bufs.index(s), w0_bufs.index(s)))  "
      "# (this step's products in flight)")
    w("if k0 > 0:  # the step before has finished reading its stage")
    w("    mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)")
    if staged:  # (the wait for the tile before's store, out of the epilogue's way)
        w("elif EPI_TMA:")
        w("    if t > 0:  # the tile before's TMA store has read c_smem")
        w("        tma.store_wait(0)")
        if prefetch:  # (one thread waits for the store and arrives, as Triton 3.6 lowers both; the sm90 code also
            # has the partition's barrier between them)
            w("        mbarrier.arrive(c_bars.index(1), count=1)  # (the loader may copy this tile's residual there)")
    w("it += 1")
    w.dedent()
    w(f"{acc} = warpgroup_mma_wait(num_outstanding=0, deps=({acc},))")
    w("mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)")
    if staged:
        w("if EPI_TMA:")
        w.indent()
        _tma_epilogue(em, w, st, acc, dual)
        w.dedent()
        w("else:")
        w.indent()
    if dual:  # (each thread holds adjacent column pairs: the split moves no data)
        w("acc0, acc1 = gl.split(gl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))")
    for a in ("acc0", "acc1") if dual else ("acc0",):  # (the epilogue's loads and stores in rows of 16 bytes a thread)
        w(f"{a} = gl.convert_layout({a}, _epilogue_layout(BLOCK_N, num_warps, {pair_span(em.plan)}))")
    w("rm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M)")
    w("rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N)")
    w("mmask = rm < M")
    w("nmask = rn < GRID_N")
    _epilogue(em, w)
    if staged:
        w.dedent()
        w("t += 1")
    w.dedent()
    if staged:
        w("if EPI_TMA:")
        w("    tma.store_wait(0)")
    w.dedent()
    w("")
    w("")


def _tma_epilogue(em, w: Writer, st: Staging, acc: str, dual: bool) -> None:
    """The tile's epilogue in the accumulator's own layout, its two column halves in turn (half the registers live;
    the accumulator's halves split without moving data), the residual read from and the output written into c_smem,
    which one TMA store then writes out."""
    if st.ext is not None:
        w("mbarrier.wait(c_bars.index(0), t & 1)  # (the residual's tile has arrived in c_smem)")
    half = "BLOCK_N" if dual else "BLOCK_N // 2"  # (a half's columns of the accumulator: the dual GEMM's hold pairs)
    w(f"parts = gl.split(gl.permute(gl.reshape({acc}, [BLOCK_M, 2, {half}]), [0, 2, 1]))")
    w("for h in gl.static_range(2):")
    w.indent()
    if dual:
        w("acc0, acc1 = gl.split(gl.reshape(parts[h], [BLOCK_M, BLOCK_N // 2, 2]))")
    else:
        w("acc0 = parts[h]")
    w("rm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M)")
    w("rn = pid_n * BLOCK_N + h * (BLOCK_N // 2) + gl.arange(0, BLOCK_N // 2)")
    w("mmask = rm < M")
    w("nmask = rn < GRID_N")
    w("c_part = c_smem.slice(h * (BLOCK_N // 2), BLOCK_N // 2, dim=1)")
    em.smem_ext, em.smem_out = st.ext, 0  # (the one output)
    _epilogue(em, w)
    em.smem_ext = em.smem_out = None
    w.dedent()
    w("fence_async_shared()  # (the tile's values in c_smem visible to the TMA unit)")
    w("tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_smem)")


def _epilogue(em, w: Writer) -> None:
    """The shared epilogue's text (epilogue.py), in Gluon."""
    epi = Writer()
    epi.depth = w.depth
    em.names, em.spaces = Names(), {}  # (the epilogue emitted afresh: its index spaces defined again)
    em.gluon = True
    try:
        em.emit(epi, split_k=False)
    finally:
        em.gluon = False
    w.lines += gluon_text(epi.lines)


def _tile_loop(w: Writer) -> None:
    """The loop over this program's tiles (both partitions walk the same ones, counting K steps in `it`), opened,
    with pid_m and pid_n of tile `pid` (`tiled.tile_position`)."""
    w("num_m = gl.cdiv(M, BLOCK_M)")
    w("num_n = gl.cdiv(GRID_N, BLOCK_N)")
    w("it = 0")
    w("for pid in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):")
    w.indent()
    tile_position(w)
