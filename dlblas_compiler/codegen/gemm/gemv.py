"""The one-row variant (BLOCK_M = 1, decode): each program streams [BLOCK_N, BLOCK_K] weight tiles along K on CUDA
cores, keeping the products per column and K position and summing over K once after the loop (no tensor cores,
no padding rows: at decode every loaded weight byte is used once)."""

from __future__ import annotations

from ..source import Writer
from . import prologue
from .prologue import a_tile


TILE = ["pid_k"]  # the tile's indices `_product_one_row` takes (its part of K)


def consts(plan) -> list[str]:
    """The compile-time parameters `_product_one_row` takes (the prologue's: `prologue.consts`; RS_INLINE with an
    RMSNorm prologue, whose statistics its K loop gathers)."""
    rs = ["RS_INLINE"] if plan.rms is not None else []
    return ["K", "GRID_N", "BLOCK_N", "BLOCK_K", "K_SPLIT", "EVEN_K", *prologue.consts(plan), *rs]


def results(plan) -> list[str]:
    """What `_product_one_row` returns after the products: with an RMSNorm prologue, `ssq`, the sum of x's squares
    over its K slice (only meaningful with RS_INLINE: the statistics for `prologue.row_scale`)."""
    return ["ssq"] if plan.rms is not None else []


def product(em, w: Writer) -> None:
    """`_product_one_row`: the jitted function returning the row's products (`k_loop`), each [1, BLOCK_N]."""
    prologue.product_function(em, w, "_product_one_row", TILE, consts(em.plan), "for one row on CUDA cores", "1",
                              k_loop, tuple(results(em.plan)))


def k_loop(em, w: Writer) -> None:
    """The K loop for one row: a [1, BLOCK_K] slice of x times [BLOCK_N, BLOCK_K] weight tiles,
    accumulated elementwise in fp32 and reduced over K after the loop (no tensor cores, no padding rows:
    at decode every loaded weight byte is used once). An RMSNorm's sum of squares (RS_INLINE) is gathered from the
    same x slices: read again after the loop, as tensor-core tiles do, x cost the tile's last program one or two
    dependent loads at the kernel's end (bench/NOTES.md 153)."""
    p = em.plan
    squares = "ssq" if p.rms is not None else None
    if squares:
        w("ssq = tl.zeros((1, BLOCK_K), dtype=tl.float32)")
    for s, off in enumerate(p.streams):
        w(f"b{s}_ptrs = w_ptr + ((rn % GRID_N).to(tl.int64) + {off})[:, None] * K + (k_lo + rk)[None, :]")
        w(f"acc{s} = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)")
    w("for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):")
    w.indent()
    a_tile(em, w, tma=False, squares=squares)
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
    if squares:
        w("ssq = tl.sum(ssq, axis=1)")
