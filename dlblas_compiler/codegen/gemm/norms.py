"""Row passes a GEMM launch runs before its kernel: the RMSNorm statistics its epilogue applies (`row_rms`), or
the normalized rows its K loop reads (`row_norm`, `row_layer_norm`: NORM_PASS)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_rms(x_ptr, rs_ptr, M, K, eps, K_BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """rs[m] = rsqrt(mean(x[m, :]^2) + eps) in fp32, for the GEMM epilogue that applies the RMSNorm.

    The statistics were first accumulated in the GEMM's K loop from the A tiles it loads; on H200 with
    Triton 3.6 that gave config-dependent wrong rows (0.4-68% of outputs with 8-warp or 256-wide tiles,
    bench/check_configs.py), so they come from this pass over x (M*K reads, no normalized copy written).
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K_BLOCK)
    acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
    for k0 in range(0, K, K_BLOCK):
        mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
        v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += v * v
    tl.store(rs_ptr + rows, tl.rsqrt(tl.sum(acc, axis=1) / K + eps), mask=rows < M)


@triton.jit
def row_norm(x_ptr, w_ptr, y_ptr, M, K, eps, offset, HAS_W: tl.constexpr, SCALE_F32: tl.constexpr,
             K_BLOCK: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr):
    """y = RMSNorm(x) with `dl.rms_norm`'s rounding (see there), in y's dtype: the A operand of the K loop or of a
    cuBLAS product (NORM_PASS, MM configs), as eager computes it. ONE_PASS (K <= K_BLOCK): x is read once."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K_BLOCK)
    if ONE_PASS:  # the whole row, kept in registers for the second loop
        whole = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
                        mask=(rows < M)[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)
        acc = whole * whole
    else:
        whole = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        for k0 in range(0, K, K_BLOCK):
            mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
            v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0)
            acc += v.to(tl.float32) * v.to(tl.float32)
    rs = tl.rsqrt(tl.sum(acc, axis=1) / K + eps)
    for k0 in range(0, K, K_BLOCK):
        mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
        offs = rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :]
        if ONE_PASS:
            n = whole * rs[:, None]
        else:
            n = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) * rs[:, None]
        if HAS_W:
            wv = tl.load(w_ptr + k0 + cols, mask=k0 + cols < K, other=0.0)
            if SCALE_F32:
                n = n * (wv.to(tl.float32) + offset)[None, :]
            else:  # normalized value rounded to x's dtype, times (weight + offset) in the weight's dtype
                wo = (wv.to(tl.float32) + offset).to(wv.dtype).to(tl.float32)
                n = n.to(x_ptr.dtype.element_ty).to(tl.float32) * wo[None, :]
        tl.store(y_ptr + offs, n.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, M, K, eps, K_BLOCK: tl.constexpr, ROWS: tl.constexpr,
                   ONE_PASS: tl.constexpr):
    """y = F.layer_norm(x, weight, bias) (statistics, scaling and shift in fp32, one rounding to y's dtype): the A
    operand of a GEMM with a LayerNorm prologue. ONE_PASS (K <= K_BLOCK): x is read once. The mean gets one
    correction step (the mean of the deviations from it), so that a constant row's deviations are exactly 0, as
    eager's are on an expanded input."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K_BLOCK)
    if ONE_PASS:
        whole = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
                        mask=(rows < M)[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)
        mean = tl.sum(whole, axis=1) / K
        mean += tl.sum(tl.where((cols < K)[None, :], whole - mean[:, None], 0.0), axis=1) / K
        dev = tl.where((cols < K)[None, :], whole - mean[:, None], 0.0)
        var = tl.sum(dev * dev, axis=1) / K
    else:
        whole = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        for k0 in range(0, K, K_BLOCK):
            mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
            acc += tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=1) / K
        acc = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        acc2 = tl.zeros((ROWS, K_BLOCK), dtype=tl.float32)
        for k0 in range(0, K, K_BLOCK):  # the deviations: the mean's correction and the variance (no cancellation)
            mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
            v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, v - mean[:, None], 0.0)
            acc += d
            acc2 += d * d
        shift = tl.sum(acc, axis=1) / K
        mean += shift
        var = tl.maximum(tl.sum(acc2, axis=1) / K - shift * shift, 0.0)
    rstd = tl.rsqrt(var + eps)
    for k0 in range(0, K, K_BLOCK):
        mask = (rows < M)[:, None] & (k0 + cols < K)[None, :]
        offs = rows.to(tl.int64)[:, None] * K + (k0 + cols)[None, :]
        if ONE_PASS:
            v = whole
        else:
            v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        bv = tl.load(b_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        y = (v - mean[:, None]) * rstd[:, None] * wv[None, :] + bv[None, :]
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
