"""The tiled variant: [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] products on the tensor cores (tl.dot), the tiles
loaded by pointer or, with TMA (sm90+), through tensor descriptors (bounds handled by the copy engine, W tiles
[BLOCK_N, BLOCK_K] K-major), one accumulator. The dual GEMM (two streams: gate and up) takes both
streams' weight rows in turn into one [2 * BLOCK_N, BLOCK_K] tile (row 2j gate row j, row 2j + 1 up row j) and one
accumulator, split after the loop into the streams' (adjacent columns: the split moves no data): one product per
K step as wide as both, where two products of half the width read the A tile twice from shared memory (H100,
five layers' gate/up: 1-8% faster at M = 2048, 2-3% at 128, bench/NOTES.md 77). The weight stays as it is: a 3-D
descriptor [GRID_N, 2, K] with the streams' distance as the middle stride makes the interleaved boxes."""

from __future__ import annotations

from ..source import Writer
from . import prologue
from .prologue import a_tile


TILE = ["pid_m", "pid_n", "pid_k"]  # the tile's indices `_product_tiled` takes


def consts(plan) -> list[str]:
    """The compile-time parameters `_product_tiled` takes (the prologue's: `prologue.consts`)."""
    return ["K", "GRID_N", "BLOCK_M", "BLOCK_N", "BLOCK_K", "K_SPLIT", "EVEN_K", "TMA", *prologue.consts(plan)]


def tile_position(w: Writer) -> None:
    """pid_m and pid_n of output tile `pid` (of num_m x num_n), taken GROUP_M rows of tiles at a time so that
    consecutive tiles reuse W's tiles from L2; every variant's kernel (Triton's `_tile`, the warp-specialized
    partitions) orders its tiles this way."""
    w("group = GROUP_M * num_n")
    w("first_m = (pid // group) * GROUP_M")
    w("size_m = min(num_m - first_m, GROUP_M)")
    w("pid_m = first_m + (pid % group) % size_m")
    w("pid_n = (pid % group) // size_m")


def product(em, w: Writer) -> None:
    """`_product_tiled`: the jitted function returning the tile's accumulators (`k_loop`; with TMA the tiles come
    through tensor descriptors, bounds handled by the copy engine, W tiles [BLOCK_N, BLOCK_K] K-major)."""
    prologue.product_function(em, w, "_product_tiled", TILE, consts(em.plan), "on the tensor cores", "BLOCK_M", k_loop)


def k_loop(em, w: Writer) -> None:
    """acc0 (and acc1 for the dual GEMM) += A tile @ W tile^T over this program's K range: one product per K step
    into one accumulator, from a [BLOCK_N, BLOCK_K] weight tile, or for the dual GEMM a [2 * BLOCK_N, BLOCK_K] one
    of both streams' rows in turn, its accumulator split after the loop (see the module docstring)."""
    p = em.plan
    off = p.streams[0]
    w("if TMA:")
    w("    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])")
    if len(p.streams) == 1:
        acc, b, width = "acc0", "b0", "BLOCK_N"
        w(f"b0_ptrs = w_ptr + ((rn % GRID_N).to(tl.int64) + {off})[None, :] * K + (k_lo + rk)[:, None]")
        w("if TMA:")
        w(f"    b0_desc = tl.make_tensor_descriptor(w_ptr + {off} * K, shape=[GRID_N, K], strides=[K, 1],")
        w("                                         block_shape=[BLOCK_N, BLOCK_K])")
        tma_tile = ["b0_desc.load([pid_n * BLOCK_N, k0])"]
    else:
        acc, b, width, dist = "acc", "b", "2 * BLOCK_N", p.streams[1] - off
        w("ri = tl.arange(0, 2 * BLOCK_N)  # the tile's weight rows: stream ri % 2's row pid_n * BLOCK_N + ri // 2")
        w(f"b_rows = {off} + (ri % 2) * {dist} + (pid_n * BLOCK_N + ri // 2) % GRID_N")
        w("b_ptrs = w_ptr + b_rows.to(tl.int64)[None, :] * K + (k_lo + rk)[:, None]")
        w("if TMA:")
        w(f"    b_desc = tl.make_tensor_descriptor(w_ptr + {off} * K, shape=[GRID_N, 2, K], "
          f"strides=[K, {dist} * K, 1],")
        w("                                       block_shape=[BLOCK_N, 2, BLOCK_K])")
        tma_tile = ["b = tl.reshape(b_desc.load([pid_n * BLOCK_N, 0, k0]), [2 * BLOCK_N, BLOCK_K])", "b"]
    w(f"{acc} = tl.zeros((BLOCK_M, {width}), dtype=tl.float32)")
    w("for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):")
    w.indent()
    a_tile(em, w, tma=True)
    w("if TMA:")
    for line in tma_tile[:-1]:  # (the dual GEMM's box reshaped into its tile first)
        w("    " + line)
    w(f"    {acc} = tl.dot(a, {tma_tile[-1]}.T, {acc}{em.dot})")
    w("else:")
    w.indent()
    w("if EVEN_K:")
    w(f"    {b} = tl.load({b}_ptrs)")
    w("else:")
    w(f"    {b} = tl.load({b}_ptrs, mask=((k0 + rk) < K)[:, None], other=0.0)")
    w(f"{acc} = tl.dot(a, {b}, {acc}{em.dot})")
    w.dedent()
    w(f"{b}_ptrs += BLOCK_K")
    w("a_ptrs += BLOCK_K")
    w.dedent()
    if len(p.streams) == 2:
        w("acc0, acc1 = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))")
