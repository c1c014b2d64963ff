"""The norm prologue's hooks in the kernel: a norm weight not folded into W scales each A tile in the K loop
(`a_tile`), and the rows' RMSNorm statistics scale the accumulator after it (`row_scale`): read from the
`row_rms` pass, computed by the tile's last program for a few rows (RS_INLINE, which saves that launch), or
none where x arrives normalized (NORMED: `row_norm` wrote it)."""

from __future__ import annotations

from ..source import Writer


def a_tile(em, w: Writer, norm_w: bool, tma: bool) -> None:
    """`a`: this K step's slice of x (through its descriptor with TMA), times a norm weight not folded into W."""
    if tma:
        w("if TMA:")
        w("    a = a_desc.load([pid_m * BLOCK_M, k0])")
    w("elif EVEN_K:" if tma else "if EVEN_K:")
    w("    a = tl.load(a_ptrs)")
    w("else:")
    w("    a = tl.load(a_ptrs, mask=((k0 + rk) < K)[None, :], other=0.0)")
    if norm_w:
        _, offset, _ = em.plan.rms.attrs
        w("if not NORMED:")
        w(f"    nw = tl.load(nw_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32) + {offset!r}")
        w("    a = (a.to(tl.float32) * nw[None, :]).to(a.dtype)")


def row_scale(em, w: Writer) -> None:
    """rs: each row's rsqrt(mean(x^2) + eps), which scales the accumulator (an RMSNorm prologue only)."""
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
    w(f"rs = tl.rsqrt(tl.sum(ss, axis=1) / K + {em.plan.rms.attrs[0]!r})")
    w.dedent()
    w("else:")
    w("    rs = tl.load(rs_ptr + rm, mask=mmask, other=0.0)")
