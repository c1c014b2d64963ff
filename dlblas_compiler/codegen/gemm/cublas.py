"""The MM variant: cuBLAS computes x @ W^T (`mm_ptr`, [M, N of W]) and the kernel is the prologue's scaling and
the epilogue over it: its accumulators are loaded from the product instead of computed by a K loop."""

from __future__ import annotations

from ..source import Writer


def product(em, w: Writer) -> None:
    """`_product_cublas`: the jitted function returning acc<s>, this tile's columns of the product, per stream."""
    p = em.plan
    accs = ", ".join(f"acc{s}" for s in range(len(p.streams)))
    w("@triton.jit")
    w("def _product_cublas(mm_ptr, M, rm, rn, GRID_N: tl.constexpr):")
    w.indent()
    w(f'"""The tile of x @ W^T that cuBLAS computed ([M, {p.n}] at mm_ptr), in fp32: {accs}."""')
    for s, off in enumerate(p.streams):
        w(f"acc{s} = tl.load(mm_ptr + (rm % M).to(tl.int64)[:, None] * {p.n} + ((rn % GRID_N) + {off})[None, :]).to(tl.float32)")
    w(f"return {accs}")
    w.dedent()
    w("")
    w("")
