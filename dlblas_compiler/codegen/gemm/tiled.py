"""The tiled variant: [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] products on the tensor cores (tl.dot), the tiles
loaded by pointer or, with TMA (sm90+), through tensor descriptors (bounds handled by the copy engine, W tiles
[BLOCK_N, BLOCK_K] K-major), one accumulator per stream. The dual GEMM (two streams: gate and up) takes both
streams' weight rows in turn into one [2 * BLOCK_N, BLOCK_K] tile (row 2j gate row j, row 2j + 1 up row j) and one
accumulator, split after the loop into the streams' (adjacent columns: the split moves no data): one product per
K step as wide as both, where two products of half the width read the A tile twice from shared memory (H100,
five layers' gate/up: 1-8% faster at M = 2048, 2-3% at 128, bench/NOTES.md 77). The weight stays as it is: a 3-D
descriptor [GRID_N, 2, K] with the streams' distance as the middle stride makes the interleaved boxes."""

from __future__ import annotations

from ..source import Writer
from .prologue import a_tile


def k_loop(em, w: Writer, norm_w: bool) -> None:
    """acc<s> += A tile @ W tile^T over this program's K range."""
    p, ns = em.plan, len(em.plan.streams)
    if ns == 2:
        _dual_k_loop(em, w, norm_w)
        return
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
    a_tile(em, w, norm_w, tma=True)
    for s in range(ns):
        w("if TMA:")
        w(f"    acc{s} = tl.dot(a, b{s}_desc.load([pid_n * BLOCK_N, k0]).T, acc{s}{em.dot})")
        w("else:")
        w.indent()
        w("if EVEN_K:")
        w(f"    b{s} = tl.load(b{s}_ptrs)")
        w("else:")
        w(f"    b{s} = tl.load(b{s}_ptrs, mask=((k0 + rk) < K)[:, None], other=0.0)")
        w(f"acc{s} = tl.dot(a, b{s}, acc{s}{em.dot})")
        w.dedent()
        w(f"b{s}_ptrs += BLOCK_K")
    w("a_ptrs += BLOCK_K")
    w.dedent()


def _dual_k_loop(em, w: Writer, norm_w: bool) -> None:
    """acc0, acc1 of the two streams from one accumulator over interleaved weight rows (see the module docstring)."""
    off, dist = em.plan.streams[0], em.plan.streams[1] - em.plan.streams[0]
    w("ri = tl.arange(0, 2 * BLOCK_N)  # the tile's weight rows: stream ri % 2's row pid_n * BLOCK_N + ri // 2")
    w(f"b_rows = {off} + (ri % 2) * {dist} + (pid_n * BLOCK_N + ri // 2) % GRID_N")
    w("b_ptrs = w_ptr + b_rows.to(tl.int64)[None, :] * K + (k_lo + rk)[:, None]")
    w("if TMA:")
    w("    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])")
    w(f"    b_desc = tl.make_tensor_descriptor(w_ptr + {off} * K, shape=[GRID_N, 2, K], strides=[K, {dist} * K, 1],")
    w("                                       block_shape=[BLOCK_N, 2, BLOCK_K])")
    w("acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)")
    w("for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):")
    w.indent()
    a_tile(em, w, norm_w, tma=True)
    w("if TMA:")
    w("    b = tl.reshape(b_desc.load([pid_n * BLOCK_N, 0, k0]), [2 * BLOCK_N, BLOCK_K])")
    w(f"    acc = tl.dot(a, b.T, acc{em.dot})")
    w("else:")
    w.indent()
    w("if EVEN_K:")
    w("    b = tl.load(b_ptrs)")
    w("else:")
    w("    b = tl.load(b_ptrs, mask=((k0 + rk) < K)[:, None], other=0.0)")
    w(f"acc = tl.dot(a, b, acc{em.dot})")
    w.dedent()
    w("b_ptrs += BLOCK_K")
    w("a_ptrs += BLOCK_K")
    w.dedent()
    w("acc0, acc1 = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))")
