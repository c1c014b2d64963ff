"""The MM variant: cuBLAS computes x @ W^T (`mm_ptr`, [M, N of W]) and the kernel is the prologue's scaling and
the epilogue over it: its accumulators are loaded from the product instead of computed by a K loop."""

from __future__ import annotations

from ..source import Writer


def accumulators(em, w: Writer) -> None:
    """acc<s>: this tile's columns of the product, per stream."""
    p = em.plan
    for s, off in enumerate(p.streams):
        w(f"acc{s} = tl.load(mm_ptr + (rm % M).to(tl.int64)[:, None] * {p.n} + ((rn % GRID_N) + {off})[None, :]).to(tl.float32)")
