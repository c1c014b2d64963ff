"""The tiled variant: [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] products on the tensor cores (tl.dot), the tiles
loaded by pointer or, with TMA (sm90+), through tensor descriptors (bounds handled by the copy engine, W tiles
[BLOCK_N, BLOCK_K] K-major), one accumulator per stream (two for the dual GEMM, sharing the A tile)."""

from __future__ import annotations

from ..source import Writer
from .prologue import a_tile


def k_loop(em, w: Writer, norm_w: bool) -> None:
    """acc<s> += A tile @ W tile^T over this program's K range."""
    p, ns = em.plan, len(em.plan.streams)
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
