"""The norm prologue's hooks in the kernel, where x does not arrive normalized (NORMED: a row pass, `row_norm` or
`row_layer_norm`, wrote it):
  RMSNorm    a norm weight not folded into W scales each A tile in the K loop (`a_tile`), and the rows' statistics
             scale the accumulator after it (`row_scale`): read from the `row_rms` pass, or for a few rows
             (RS_INLINE, which saves that launch) gathered by a one-row tile's K loop from the x slices it loads, or
             computed by a tensor-core tile's last program after its loop;
  LayerNorm  for a few rows (at most launch.RS_INLINE_ROWS, pointer tiles: the space's rule), each program computes
             its rows' mean and rstd before the K loop (`statistics`, as `row_layer_norm` does) and normalizes each
             A tile as it loads it (`a_tile`), rounded to x's dtype as eager's LayerNorm output is: the launch of
             the row pass is saved (a decode step of a LayerNorm model: one kernel fewer per norm)."""

from __future__ import annotations

from collections.abc import Callable

from ..source import Writer, wrapped


def pointers(plan) -> list[str]:
    """The kernel's arguments the K loop's prologue reads: an RMSNorm weight not folded into W (`nw_ptr`), or a
    LayerNorm's weight and bias (`lw_ptr`, `lb_ptr`)."""
    if plan.rms is not None and plan.rms.weight is not None:
        return ["nw_ptr"]
    return ["lw_ptr", "lb_ptr"] if plan.ln is not None else []


def consts(plan) -> list[str]:
    """The constexprs the K loop's prologue reads: NORMED, and for a LayerNorm the width its statistics read x in."""
    if plan.ln is not None:
        return ["NORMED", "RS_BLOCK"]
    return ["NORMED"] if pointers(plan) else []


def statistics(em, w: Writer, rows: str) -> None:
    """A LayerNorm's `mean` and `rstd` of this program's `rows` rows of x, before the K loop: the mean with one
    correction step (the mean of the deviations from it: a constant row's deviations are exactly 0) and the variance
    of the deviations, in fp32, as `row_layer_norm` computes them."""
    if em.plan.ln is None:
        return
    w("if not NORMED:  # the LayerNorm's statistics of these rows (x is read here, not normalized by a pass)")
    w.indent()
    w("rs_k = tl.arange(0, RS_BLOCK)")
    w("x_rows = x_ptr + (rm % M).to(tl.int64)[:, None] * K")
    w(f"sx = tl.zeros(({rows}, RS_BLOCK), dtype=tl.float32)")
    w("for k1 in range(0, K, RS_BLOCK):")
    w("    sx += tl.load(x_rows + (k1 + rs_k)[None, :], mask=((k1 + rs_k) < K)[None, :], other=0.0).to(tl.float32)")
    w("mean = tl.sum(sx, axis=1) / K")
    w(f"sd = tl.zeros(({rows}, RS_BLOCK), dtype=tl.float32)")
    w(f"sd2 = tl.zeros(({rows}, RS_BLOCK), dtype=tl.float32)")
    w("for k1 in range(0, K, RS_BLOCK):")
    w("    inside = ((k1 + rs_k) < K)[None, :]")
    w("    v = tl.load(x_rows + (k1 + rs_k)[None, :], mask=inside, other=0.0).to(tl.float32)")
    w("    d = tl.where(inside, v - mean[:, None], 0.0)")
    w("    sd += d")
    w("    sd2 += d * d")
    w("shift = tl.sum(sd, axis=1) / K")
    w("mean += shift")
    w(f"rstd = tl.rsqrt(tl.maximum(tl.sum(sd2, axis=1) / K - shift * shift, 0.0) + {em.plan.ln.eps.value.data!r})")
    w.dedent()


def a_tile(em, w: Writer, tma: bool, squares: str | None = None) -> None:
    """`a`: this K step's slice of x (through its descriptor with TMA), times a norm weight not folded into W, or
    normalized by a LayerNorm (`statistics`). With `squares` (an RMSNorm's RS_INLINE), the slice's squares, before
    the norm weight, are added to that [rows, BLOCK_K] sum (`row_scale`'s statistics gathered in the K loop)."""
    if tma:
        w("if TMA:")
        w("    a = a_desc.load([pid_m * BLOCK_M, k0])")
    w("elif EVEN_K:" if tma else "if EVEN_K:")
    w("    a = tl.load(a_ptrs)")
    w("else:")
    w("    a = tl.load(a_ptrs, mask=((k0 + rk) < K)[None, :], other=0.0)")
    if squares is not None and em.plan.rms is not None:
        w("if RS_INLINE:  # the norm's statistics from the x slices the loop loads anyway")
        w(f"    {squares} += a.to(tl.float32) * a.to(tl.float32)")
    if em.plan.ln is not None:
        w("if not NORMED:")
        w("    lw = tl.load(lw_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32)")
        w("    lb = tl.load(lb_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32)")
        w("    a = ((a.to(tl.float32) - mean[:, None]) * rstd[:, None] * lw[None, :] + lb[None, :]).to(a.dtype)")
    elif pointers(em.plan):
        _, offset, _ = em.plan.rms.attrs
        w("if not NORMED:")
        w(f"    nw = tl.load(nw_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32) + {offset!r}")
        w("    a = (a.to(tl.float32) * nw[None, :]).to(a.dtype)")


# where a one-row product returned its K slice's sum of squares (`gemv.k_loop`): RS_INLINE one-row tiles, no cuBLAS
ONE_ROW_SQUARES = "RS_INLINE and (BLOCK_M == 1 and not MM)"


def row_scale(em, w: Writer) -> None:
    """rs: each row's rsqrt(mean(x^2) + eps), which scales the accumulator (an RMSNorm prologue only). With
    RS_INLINE a one-row tile's K loop summed the squares (`ssq`; split-K parts add theirs through the workspace,
    `EpilogueEmitter._split_k`); other tiles read x again here, after their K loop."""
    eps = em.plan.rms.attrs[0]
    w("if NORMED:")
    w("    rs = tl.full((BLOCK_M,), 1.0, tl.float32)")
    w(f"elif {ONE_ROW_SQUARES}:  # (the one-row product's sums: `gemv.k_loop`)")
    w(f"    rs = tl.rsqrt(ssq / K + {eps!r})")
    w("elif RS_INLINE:")
    w.indent()
    w("rk2 = tl.arange(0, RS_BLOCK)")
    w("ss = tl.zeros((BLOCK_M, RS_BLOCK), dtype=tl.float32)")
    w("for k1 in range(0, K, RS_BLOCK):")
    w("    v = tl.load(x_ptr + (rm % M).to(tl.int64)[:, None] * K + (k1 + rk2)[None, :],")
    w("                mask=((k1 + rk2) < K)[None, :], other=0.0).to(tl.float32)")
    w("    ss += v * v")
    w(f"rs = tl.rsqrt(tl.sum(ss, axis=1) / K + {eps!r})")
    w.dedent()
    w("else:")
    w("    rs = tl.load(rs_ptr + rm, mask=mmask, other=0.0)")


def product_params(plan, tile: list[str]) -> list[str]:
    """A product function's runtime parameters (its constexprs follow them), as `_tile` passes them: the operands,
    the prologue's (`pointers`), the rows and the tile's indices `tile` (its variant's `TILE`)."""
    return ["x_ptr", "w_ptr", *pointers(plan), "M", "rm", "rn", *tile]


def product_function(em, w: Writer, name: str, tile: list[str], constexprs: list[str], doc: str, rows: str,
                     k_loop: Callable, results: tuple[str, ...] = ()) -> None:
    """A variant's product as a jitted function `name` returning acc0 (acc1): its K slice's indices and A pointers
    (rows and columns past the end wrap, modulo, instead of being masked: they are never stored; with EVEN_K the
    loop's loads carry no mask), the LayerNorm's statistics of its `rows` rows (`statistics`), then `k_loop`."""
    accs = ", ".join([*(f"acc{s}" for s in range(len(em.plan.streams))), *results])
    w("@triton.jit")
    wrapped(w, f"def {name}(", [*product_params(em.plan, tile), *(f"{c}: tl.constexpr" for c in constexprs)], "):")
    w.indent()
    w(f'"""x[rm, K slice] @ W[rn, K slice]^T {doc}, in fp32: {accs} (the K slice: part pid_k of K)."""')
    w("rk = tl.arange(0, BLOCK_K)")
    w("k_lo = pid_k * K_SPLIT")
    w("a_ptrs = x_ptr + (rm % M).to(tl.int64)[:, None] * K + (k_lo + rk)[None, :]")
    statistics(em, w, rows)
    k_loop(em, w)
    w(f"return {accs}")
    w.dedent()
    w("")
    w("")
