"""The one-row variant (BLOCK_M = 1, decode): each program streams [BLOCK_N, BLOCK_K] weight tiles along K on CUDA
cores, keeping the products per column and K position and summing over K once after the loop (no tensor cores,
no padding rows: at decode every loaded weight byte is used once).

EARLY (a chained launch whose weight no kernel it may overlap writes: `launch.early_weights`): the program loads its
first weight tile before it waits for the kernel before it, so a decode GEMM's programs scheduled during that
kernel's tail (a GEMM releases the next kernel after its K loop) stream their weight while it drains, instead of
starting cold when it ends."""

from __future__ import annotations

from ..source import Writer
from . import prologue
from .prologue import a_tile


TILE = ["pid_k"]  # the tile's indices `_product_one_row` takes (its part of K)


def consts(plan) -> list[str]:
    """The compile-time parameters `_product_one_row` takes (the prologue's: `prologue.consts`)."""
    return ["K", "GRID_N", "BLOCK_N", "BLOCK_K", "K_SPLIT", "EVEN_K", *prologue.consts(plan), "EARLY", "PDL"]


def product(em, w: Writer) -> None:
    """`_product_one_row`: the jitted function returning the row's products (`k_loop`), each [1, BLOCK_N]."""
    prologue.product_function(em, w, "_product_one_row", TILE, consts(em.plan), "for one row on CUDA cores", "1",
                              k_loop, early)


def _load_b(w: Writer, s: int, name: str) -> None:
    w("if EVEN_K:")
    w(f"    {name} = tl.load(b{s}_ptrs)")
    w("else:")
    w(f"    {name} = tl.load(b{s}_ptrs, mask=((k0 + rk) < K)[None, :], other=0.0)")


def early(em, w: Writer) -> None:
    """The weight tiles' pointers; with EARLY the first tile of each loaded, then (under PDL) the wait for the
    kernel before, which nothing read before it may have written (the kernel's start waits otherwise)."""
    for s, off in enumerate(em.plan.streams):
        w(f"b{s}_ptrs = w_ptr + ((rn % GRID_N).to(tl.int64) + {off})[:, None] * K + (k_lo + rk)[None, :]")
    w("if EARLY:  # this program's first weight tile, read before waiting for the kernel before (which never writes it)")
    w.indent()
    w("k0 = k_lo")
    for s in range(len(em.plan.streams)):
        _load_b(w, s, f"b{s}_first")
    w("if PDL:")
    w("    tl.extra.cuda.gdc_wait()")
    w.dedent()


def k_loop(em, w: Writer) -> None:
    """The K loop for one row: a [1, BLOCK_K] slice of x times [BLOCK_N, BLOCK_K] weight tiles,
    accumulated elementwise in fp32 and reduced over K after the loop (no tensor cores, no padding rows:
    at decode every loaded weight byte is used once). With EARLY its first step takes the tiles `early` loaded."""
    p = em.plan
    for s in range(len(p.streams)):
        w(f"acc{s} = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)")
    w("k_next = k_lo")
    w("if EARLY:  # the first K step, its weight tiles loaded before the wait")
    w.indent()
    w("k0 = k_lo")
    a_tile(em, w, tma=False)
    for s in range(len(p.streams)):
        w(f"acc{s} += b{s}_first.to(tl.float32) * a.to(tl.float32)")
        w(f"b{s}_ptrs += BLOCK_K")
    w("a_ptrs += BLOCK_K")
    w("k_next = k_lo + BLOCK_K")
    w.dedent()
    w("for k0 in range(k_next, k_lo + K_SPLIT, BLOCK_K):")
    w.indent()
    a_tile(em, w, tma=False)
    for s in range(len(p.streams)):
        _load_b(w, s, f"b{s}")
        w(f"acc{s} += b{s}.to(tl.float32) * a.to(tl.float32)")
        w(f"b{s}_ptrs += BLOCK_K")
    w("a_ptrs += BLOCK_K")
    w.dedent()
    for s in range(len(p.streams)):
        w(f"acc{s} = tl.sum(acc{s}, axis=1)[None, :]")
