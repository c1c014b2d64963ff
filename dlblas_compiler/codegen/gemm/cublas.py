"""The MM variants. MM=1: cuBLAS computes x @ W^T (`mm_ptr`, [M, N of W]) and the kernel is the prologue's scaling
and the epilogue over it: its accumulators are loaded from the product instead of computed by a K loop.

MM=2, where the region is a GEMM plus a residual and nothing reads the residual after the region (the fuse pass's
`overwritable`): cuBLAS adds the product into the residual itself, `torch.addmm(r, x, W^T, out=r)` (beta = 1: its
epilogue reads r), and no kernel runs. Into a new tensor instead, torch's addmm first copies the residual there:
on an H200 (o-proj and down of five layers, M = 16-2048) it took 1.02-1.20x the bare product's time, as the product
followed by an add did (1.00-1.18x); written in place, 0.97-1.04x (bench/NOTES.md 179)."""

from __future__ import annotations

import os

import torch

from ...dialects import AddOp
from ...dialects.types import dtype_of, numel, shape_of
from ..source import Writer
from ..views import VIEW_OPS
from .plan import flat_row_stride


def product(em, w: Writer) -> None:
    """`_product_cublas`: the jitted function returning acc<s>, this tile's columns of the product, per stream."""
    p = em.plan
    accs = ", ".join(f"acc{s}" for s in range(len(p.streams)))
    w("@triton.jit")
    w("def _product_cublas(mm_ptr, M, rm, rn, GRID_N: tl.constexpr):")
    w.indent()
    w(f'"""The tile of x @ W^T that cuBLAS computed ([M, {p.n}] at mm_ptr), in fp32: {accs}.')
    if p.residual_in_place is not None:  # (a region whose space has MM=2 has its own source, so its own tuning)
        w(f"(MM=2 runs no kernel: cuBLAS adds x @ W^T into the residual, region input {p.residual_in_place}.)")
    w('"""')
    for s, off in enumerate(p.streams):
        w(f"acc{s} = tl.load(mm_ptr + (rm % M).to(tl.int64)[:, None] * {p.n} + ((rn % GRID_N) + {off})[None, :]).to(tl.float32)")
    w(f"return {accs}")
    w.dedent()
    w("")
    w("")


# DLBLAS_GEMM_IN_PLACE=0: no MM=2 (the regions keep the source and space they had before it), to measure what it brings
IN_PLACE_ENV = "DLBLAS_GEMM_IN_PLACE"


def residual_in_place(em) -> int | None:
    """The position of the region input cuBLAS may add the product into (MM=2), or None: the region is one GEMM with
    neither norm, bias nor second stream, whose one epilogue op adds a residual, both that residual and the output
    plain [M, N] blocks of the product's dtype (element (m, n) of the tile at m * N + n in each), and the fuse pass
    found that nothing reads the residual after the region (`FusedOp.overwritable_inputs`)."""
    p = em.plan
    lin = p.linear
    if os.environ.get(IN_PLACE_ENV) == "0" or not em.fused.overwritable_inputs:
        return None
    if p.norm is not None or lin.bias is not None or len(p.streams) != 1 or p.scatters or p.rotary_dims:
        return None
    ops = [o for o in p.epilogue if not isinstance(o, VIEW_OPS)]
    if len(em.outputs) != 1 or len(em.ext) != 1 or len(ops) != 1 or not isinstance(ops[0], AddOp):
        return None
    v, c, reader = em.ext[0]
    dt = dtype_of(lin.result)
    if reader is not ops[0].result or {dtype_of(v), dtype_of(em.outputs[0]), dtype_of(lin.input)} != {dt}:
        return None
    arg, strides = em.ext_operand(0)
    if em.args[arg] in (lin.input, lin.weight):  # (cuBLAS would read x or W while it writes them)
        return None
    rows, gn = p.rows, p.grid_n
    if numel(shape_of(em.args[arg])) != numel(rows) * gn or not _plain(strides, c, rows, gn):
        return None
    if not _plain(em.out_strides(0), p.info[em.outputs[0]], rows, gn):
        return None
    return arg if arg in em.fused.overwritable_inputs else None


def _plain(strides: list[int], c, rows: tuple[int, ...], gn: int) -> bool:
    """Whether element (m, n) of the tile is at m * GRID_N + n (`flat_row_stride`; one row: its columns in order)."""
    if numel(rows) == 1:  # (a single row has no row stride: its columns alone, as one of two rows GRID_N apart)
        return flat_row_stride([gn, *strides[len(rows):]], c, (2,), gn) == gn
    return flat_row_stride(strides, c, rows, gn) == gn


def add_into_residual(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, m: int, out_shape) -> torch.Tensor:
    """MM=2: r += x @ W^T by cuBLAS (beta = 1), r being contiguous; the output is r's memory in its shape."""
    flat = r.view(m, -1)
    torch.addmm(flat, x.reshape(m, -1), w.t(), out=flat)
    return flat.view(out_shape)

