"""Warp-specialized GEMM forms on sm90, stand-alone: where the epilogue runs (bench/NOTES.md 168).

    python bench/ws_forms.py --build            # CPU: each form built for sm90, its stack (spills) and shared memory
    python bench/ws_forms.py --out OUT          # GPU: each form timed on eight GEMM shapes of five layers

C = A @ W^T + R in bf16 at M = 2048 (A [M, K], W [N, K], R the residual, as the o-proj and down regions add it), a
persistent program per SM, tiles grouped along M, a one-warp TMA loader feeding a ring of shared-memory stages:
  coop   the template's WS=1 (codegen/gemm/warp_specialized.py): one partition of 8 warps (two warpgroups of 64 rows)
         on each tile; while it runs the epilogue the tensor cores wait;
  pp     ping-pong: two 4-warp consumer partitions take the program's tiles in turn (one warpgroup's accumulator a
         tile), so one's epilogue runs beside the other's products; a consumer starts a tile's K loop only once the
         other has taken all the stages of the tile before (an mbarrier each: a stage's "ready" phase parity names
         the right copy only while its reader is at most one round of the ring ahead);
  epi    epilogue warps: the 8 MMA warps write each tile's bf16 product into shared memory and go on with the next
         tile; a 2-warp partition beside the loader (which fills its warpgroup: 8 MMA warps need 154 registers
         a thread for the m64n256 product, and 16 warps would leave 128) adds the residual and stores, 32-row by
         CH-column blocks;
  tma    coop with TMA at both ends of the epilogue: the loader warp prefetches each tile's residual into shared
         memory during the tile's K loop, the MMA warps add it there (the accumulator's column halves split without
         moving data) and store the tile by TMA, waiting for that store only after the next tile's first K step, when
         the loader may refill the buffer. No epilogue warps, no per-element addresses; no spills. On an H200 the
         fastest 128x256 form on all eight shapes, 0.4-4.1% ahead of coop (NOTES 170); the template's WS=2 since.
`rows8` epilogues move the accumulator to rows of 8 values a thread first (coalesced 16-byte loads and stores, as
the template does); `mma` ones compute in the accumulator's own layout; `halves` ones move and store the tile's two
64-row halves in turn (the accumulator's register rows split without moving data: half the registers of the move
live at once; no spills where the whole-tile move spills 88 bytes; within ±1.5% of rows8 on an H200, NOTES 170).
Each form runs in its own process (a hung or faulting kernel costs only its row); do_bench medians with the L2
cleared; cuBLAS's bare product (`torch.matmul`, no residual) of the same operands is timed beside each. Errors are
against float64 of the bf16 product plus R.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# (name, form, BLOCK_M, BLOCK_N, stages, num_warps, epilogue: rows8, mma or halves, CH, the epilogue warps' registers)
FORMS = [
    ("coop 128x256 s3", "coop", 128, 256, 3, 8, "rows8", 0, 0),
    ("coop 128x128 s4", "coop", 128, 128, 4, 8, "rows8", 0, 0),
    ("pp 128x128 s6", "pp", 128, 128, 6, 4, "rows8", 0, 0),
    ("pp 128x128 s6 mma", "pp", 128, 128, 6, 4, "mma", 0, 0),
    ("pp 128x128 s6 halves", "pp", 128, 128, 6, 4, "halves", 0, 0),
    ("epi 128x256 s3", "epi", 128, 256, 3, 8, "rows8", 64, 184),
    ("tma 128x256 s3", "tma", 128, 256, 3, 8, "mma", 0, 0),
]
SHAPES = [("Llama-3-8B o-proj", 2048, 4096, 4096), ("Llama-3-8B down", 2048, 4096, 14336),
          ("Llama-3-8B QKV", 2048, 6144, 4096), ("Llama-3-8B gate/up", 2048, 28672, 4096),
          ("Qwen2.5-7B QKV", 2048, 4608, 3584), ("Qwen2.5-7B down", 2048, 3584, 18944),
          ("Gemma-7B o-proj", 2048, 3072, 4096), ("Mistral-NeMo gate/up", 2048, 28672, 5120)]  # fmt: skip
MAXNREG = 168  # 12 warps (8 MMA + the loader's warpgroup, or 4 + 4 + 4) x 32 x 168 <= 64K registers
CONSUMER_REGS, LOADER_REGS = gl.constexpr(232), gl.constexpr(40)  # (ping-pong: 3 x 168 = 232 + 232 + 40)


@gluon.constexpr_function
def _rows8(block_n, warps):
    across = min(32, block_n // 8)
    return gl.BlockedLayout([1, 8], [32 // across, across], [warps, 1], [1, 0])


@gluon.jit
def _position(pid, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr):
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@gluon.jit
def _ring(x_ptr, w_ptr, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """Every form's TMA descriptors of A [M, K] and W [N, K], its ring of STAGES shared-memory stages for their
    tiles, and each stage's "ready" (copied) and "empty" (read) mbarriers, initialized."""
    dt: gl.constexpr = x_ptr.dtype.element_ty
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], dt)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], dt)
    a_desc = tma.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK], layout=a_layout)
    w_desc = tma.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK], layout=w_layout)
    a_bufs = gl.allocate_shared_memory(dt, [STAGES, BM, BK], a_layout)
    w_bufs = gl.allocate_shared_memory(dt, [STAGES, BN, BK], w_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return a_desc, w_desc, a_bufs, w_bufs, ready, empty


@gluon.jit
def _loads(a_desc, w_desc, a_bufs, w_bufs, ready, empty, M, N, K, BM: gl.constexpr, BN: gl.constexpr,
           BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """The loader warp: every K step of the program's tiles into the next free stage."""
    it = 0
    for pid in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
        pid_m, pid_n = _position(pid, M, N, BM, BN, GROUP_M)
        for k0 in range(0, K, BK):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k0], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [pid_n * BN, k0], ready.index(s), w_bufs.index(s))
            it += 1


@gluon.jit
def _k_loop(a_bufs, w_bufs, ready, empty, it, K, BK: gl.constexpr, STAGES: gl.constexpr, acc):
    """acc += the tile's products, stage by stage, one step's wgmma in flight; returns acc (not yet waited) and
    the next step's count."""
    for k0 in range(0, K, BK):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, use_acc=k0 > 0, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_bufs.index(s), w_bufs.index(s)))
        if k0 > 0:  # the step before has finished reading its stage
            mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
        it += 1
    return acc, it


@gluon.jit
def _consumer(c_ptr, r_ptr, a_bufs, w_bufs, ready, empty, order, M, N, K, WHICH, BM: gl.constexpr,
              BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
              CONSUMERS: gl.constexpr, EPILOGUE: gl.constexpr, WARPS: gl.constexpr):
    """coop (CONSUMERS 1) or one of pp's two consumers: tiles WHICH, WHICH + CONSUMERS, ... of the program."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16])
    steps = gl.cdiv(K, BK)
    t = WHICH
    for pid in range(gl.program_id(0) + WHICH * gl.num_programs(0), gl.cdiv(M, BM) * gl.cdiv(N, BN),
                     CONSUMERS * gl.num_programs(0)):
        pid_m, pid_n = _position(pid, M, N, BM, BN, GROUP_M)
        if CONSUMERS == 2:
            if t > 0:  # the other consumer has taken the stages of the tile before
                mbarrier.wait(order.index(WHICH), ((t - 1) // 2) & 1)
        acc, it = _k_loop(a_bufs, w_bufs, ready, empty, t * steps, K, BK, STAGES,
                          gl.zeros((BM, BN), dtype=gl.float32, layout=layout))
        if CONSUMERS == 2:  # (this tile's stages taken: the other consumer's turn)
            mbarrier.arrive(order.index(1 - WHICH), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
        if EPILOGUE == 2:  # halves: the two 64-row halves, each moved to rows of 8 and stored in turn
            halves = gl.split(gl.permute(gl.reshape(acc, [2, BM // 2, BN]), [1, 2, 0]))
            for h in gl.static_range(2):
                part = gl.convert_layout(halves[h], _rows8(BN, WARPS))
                rm = pid_m * BM + h * (BM // 2) + gl.arange(0, BM // 2, layout=gl.SliceLayout(1, _rows8(BN, WARPS)))
                rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, _rows8(BN, WARPS)))
                mask = (rm < M)[:, None] & (rn < N)[None, :]
                y = part.to(c_ptr.dtype.element_ty).to(gl.float32)
                y += gl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(gl.float32)
                gl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            if EPILOGUE == 1:  # rows8 (else mma: the accumulator's layout)
                acc = gl.convert_layout(acc, _rows8(BN, WARPS))
                rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, _rows8(BN, WARPS)))
                rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, _rows8(BN, WARPS)))
            else:
                rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
                rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
            mask = (rm < M)[:, None] & (rn < N)[None, :]
            y = acc.to(c_ptr.dtype.element_ty).to(gl.float32)
            y += gl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(gl.float32)
            gl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(c_ptr.dtype.element_ty), mask=mask)
        t += CONSUMERS


@gluon.jit
def gemm_ws(x_ptr, w_ptr, c_ptr, r_ptr, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
            GROUP_M: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, EPILOGUE: gl.constexpr,
            num_warps: gl.constexpr):
    """The coop (CONSUMERS 1) and pp (2) forms."""
    a_desc, w_desc, a_bufs, w_bufs, ready, empty = _ring(x_ptr, w_ptr, M, N, K, BM, BN, BK, STAGES)
    order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if CONSUMERS == 2:
        mbarrier.init(order.index(0), count=1)
        mbarrier.init(order.index(1), count=1)
        gl.warp_specialize([
            (_consumer, (c_ptr, r_ptr, a_bufs, w_bufs, ready, empty, order, M, N, K, 0, BM, BN, BK, GROUP_M, STAGES,
                         CONSUMERS, EPILOGUE, num_warps)),
            (_consumer, (c_ptr, r_ptr, a_bufs, w_bufs, ready, empty, order, M, N, K, 1, BM, BN, BK, GROUP_M, STAGES,
                         CONSUMERS, EPILOGUE, num_warps)),
            (_loads, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, M, N, K, BM, BN, BK, GROUP_M, STAGES)),
        ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (c_ptr, r_ptr, a_bufs, w_bufs, ready, empty, order, M, N, K, 0, BM, BN, BK, GROUP_M, STAGES,
                         CONSUMERS, EPILOGUE, num_warps)),
            (_loads, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, M, N, K, BM, BN, BK, GROUP_M, STAGES)),
        ], [1], [LOADER_REGS])


@gluon.jit
def _tma_loads(a_desc, w_desc, r_desc, a_bufs, w_bufs, r_smem, ready, empty, r_ready, r_empty, M, N, K,
               BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """tma's loader warp: the ring as `_loads` does, and each tile's residual into `r_smem` once the tile before has
    been stored from it, after the tile's first STAGES K steps (by then the MMA warps have begun this tile)."""
    it = 0
    t = 0
    steps = gl.cdiv(K, BK)
    for pid in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
        pid_m, pid_n = _position(pid, M, N, BM, BN, GROUP_M)
        for k in range(steps):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [pid_n * BN, k * BK], ready.index(s), w_bufs.index(s))
            it += 1
            if k == min(STAGES, steps) - 1:  # the residual, once the tile before has left r_smem
                mbarrier.wait(r_empty, (t & 1) ^ 1)
                mbarrier.expect(r_ready, r_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(r_desc, [pid_m * BM, pid_n * BN], r_ready, r_smem)
        t += 1


@gluon.jit
def _tma_mma(c_desc, a_bufs, w_bufs, r_smem, ready, empty, r_ready, r_empty, M, N, K, BM: gl.constexpr,
             BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr):
    """tma's MMA warps: each tile's products; then R from `r_smem` added in two column halves (the accumulator's
    halves split without moving data), the sum written back over R and stored by TMA, waited for only after the
    next tile's first K step."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16])
    it = 0
    t = 0
    for pid in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
        pid_m, pid_n = _position(pid, M, N, BM, BN, GROUP_M)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        for k0 in range(0, K, BK):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, use_acc=k0 > 0, is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_bufs.index(s), w_bufs.index(s)))
            if k0 > 0:
                mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
            else:
                if t > 0:  # the tile before's store has read r_smem: the loader may fill it
                    tma.store_wait(0)
                    mbarrier.arrive(r_empty, count=1)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
        mbarrier.wait(r_ready, t & 1)
        halves = gl.split(gl.permute(gl.reshape(acc, [BM, 2, BN // 2]), [0, 2, 1]))
        for h in gl.static_range(2):
            part = r_smem.slice(h * (BN // 2), BN // 2, dim=1)
            y = halves[h].to(c_desc.dtype).to(gl.float32) + part.load(halves[h].type.layout).to(gl.float32)
            part.store(y.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BN], r_smem)
        t += 1
    tma.store_wait(0)


@gluon.jit
def gemm_tma(x_ptr, w_ptr, c_ptr, r_ptr, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
             GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The tma form: coop with the residual prefetched by the loader and the output stored by TMA."""
    a_desc, w_desc, a_bufs, w_bufs, ready, empty = _ring(x_ptr, w_ptr, M, N, K, BM, BN, BK, STAGES)
    dt: gl.constexpr = x_ptr.dtype.element_ty
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], dt)
    r_desc = tma.make_tensor_descriptor(r_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN], layout=c_layout)
    c_desc = tma.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN], layout=c_layout)
    r_smem = gl.allocate_shared_memory(dt, [BM, BN], c_layout)
    r_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(r_bars.index(0), count=1)
    mbarrier.init(r_bars.index(1), count=1)
    gl.warp_specialize([
        (_tma_mma, (c_desc, a_bufs, w_bufs, r_smem, ready, empty, r_bars.index(0), r_bars.index(1), M, N, K, BM, BN,
                    BK, GROUP_M, STAGES, num_warps)),
        (_tma_loads, (a_desc, w_desc, r_desc, a_bufs, w_bufs, r_smem, ready, empty, r_bars.index(0), r_bars.index(1),
                      M, N, K, BM, BN, BK, GROUP_M, STAGES)),
    ], [1], [LOADER_REGS])


@gluon.jit
def _epi_mma(a_bufs, w_bufs, ready, empty, c_smem, acc_ready, acc_empty, M, N, K, BM: gl.constexpr,
             BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr):
    """epi's MMA warps: each tile's product, written in bf16 into `c_smem` once the epilogue has read the last."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16])
    it = 0
    t = 0
    for _tile in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
        acc, it = _k_loop(a_bufs, w_bufs, ready, empty, it, K, BK, STAGES,
                          gl.zeros((BM, BN), dtype=gl.float32, layout=layout))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
        mbarrier.wait(acc_empty, (t & 1) ^ 1)
        c_smem.store(acc.to(c_smem.dtype))
        mbarrier.arrive(acc_ready, count=1)
        t += 1


@gluon.jit
def _epi_store(c_ptr, r_ptr, c_smem, acc_ready, acc_empty, M, N, BM: gl.constexpr, BN: gl.constexpr,
               GROUP_M: gl.constexpr, CH: gl.constexpr, EPI_WARPS: gl.constexpr):
    """epi's epilogue warps: each tile from `c_smem` in 32-row, CH-column blocks, + R, stored."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (CH // 8), CH // 8], [EPI_WARPS, 1], [1, 0])
    t = 0
    for pid in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
        pid_m, pid_n = _position(pid, M, N, BM, BN, GROUP_M)
        mbarrier.wait(acc_ready, t & 1)
        for i in gl.static_range(BM // 32):
            rm = pid_m * BM + i * 32 + gl.arange(0, 32, layout=gl.SliceLayout(1, blocked))
            for j in gl.static_range(BN // CH):
                y = c_smem.slice(i * 32, 32, dim=0).slice(j * CH, CH, dim=1).load(blocked).to(gl.float32)
                rn = pid_n * BN + j * CH + gl.arange(0, CH, layout=gl.SliceLayout(0, blocked))
                mask = (rm < M)[:, None] & (rn < N)[None, :]
                y += gl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(gl.float32)
                gl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(c_ptr.dtype.element_ty), mask=mask)
        mbarrier.arrive(acc_empty, count=1)
        t += 1


@gluon.jit
def gemm_epi(x_ptr, w_ptr, c_ptr, r_ptr, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
             GROUP_M: gl.constexpr, STAGES: gl.constexpr, CH: gl.constexpr, EPI_REGS: gl.constexpr,
             num_warps: gl.constexpr):
    """The epi form."""
    a_desc, w_desc, a_bufs, w_bufs, ready, empty = _ring(x_ptr, w_ptr, M, N, K, BM, BN, BK, STAGES)
    c_smem = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [BM, BN],
                                       gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0]))
    acc_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(acc_bars.index(0), count=1)
    mbarrier.init(acc_bars.index(1), count=1)
    gl.warp_specialize([
        (_epi_mma, (a_bufs, w_bufs, ready, empty, c_smem, acc_bars.index(0), acc_bars.index(1), M, N, K, BM, BN, BK,
                    STAGES, num_warps)),
        (_loads, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, M, N, K, BM, BN, BK, GROUP_M, STAGES)),
        (_epi_store, (c_ptr, r_ptr, c_smem, acc_bars.index(0), acc_bars.index(1), M, N, BM, BN, GROUP_M, CH, 2)),
    ], [1, 2], [EPI_REGS, EPI_REGS])  # (the loader and the epilogue warps share a warpgroup, so its registers)


def _launch_args(form: tuple) -> tuple:
    """(kernel, its constexprs) of a FORMS row."""
    _, kind, bm, bn, stages, warps, epi, ch, regs = form
    if kind == "tma":
        return gemm_tma, dict(BM=bm, BN=bn, BK=64, GROUP_M=8, STAGES=stages, num_warps=warps)
    if kind == "epi":
        return gemm_epi, dict(BM=bm, BN=bn, BK=64, GROUP_M=8, STAGES=stages, CH=ch, EPI_REGS=regs, num_warps=warps)
    return gemm_ws, dict(BM=bm, BN=bn, BK=64, GROUP_M=8, STAGES=stages, CONSUMERS=2 if kind == "pp" else 1,
                         EPILOGUE={"mma": 0, "rows8": 1, "halves": 2}[epi], num_warps=warps)


def build() -> list[dict]:
    """Each form built for sm90 here: bytes of stack a thread (spills) and of shared memory."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "c_ptr": "*bf16", "r_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
    rows = []
    for form in FORMS:
        kernel, consts = _launch_args(form)
        src = GluonASTSource(kernel, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 128), options=dict(num_warps=consts["num_warps"],
                                                                             maxnreg=MAXNREG))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            usage = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], capture_output=True,
                                   text=True, check=True).stdout  # fmt: skip
        rows.append({"form": form[0], "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
                     "shared": k.metadata.shared})
        print(rows[-1], flush=True)
    return rows


def time_form(index: int) -> list[dict]:
    """FORMS[index] on every shape (on the GPU), cuBLAS's bare product beside each."""
    from triton.testing import do_bench

    torch.manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel, consts = _launch_args(FORMS[index])
    rows = []
    for label, m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        grid = (min(sms, triton.cdiv(m, consts["BM"]) * triton.cdiv(n, consts["BN"])),)
        run = functools.partial(kernel[grid], x, w, c, r, m, n, k, **consts, maxnreg=MAXNREG)
        run()
        torch.cuda.synchronize()
        ref = (x.double() @ w.double().T).to(torch.bfloat16).double() + r.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        us = do_bench(run, warmup=50, rep=300) * 1e3
        cublas = do_bench(functools.partial(torch.matmul, x, w.T), warmup=50, rep=300) * 1e3
        rows.append({"shape": label, "M": m, "N": n, "K": k, "form": FORMS[index][0], "us": us, "cublas_us": cublas,
                     "rel_err": err})  # fmt: skip
        print(f"{label:22s} {FORMS[index][0]:20s} {us:8.1f} µs, cuBLAS {cublas:8.1f}: {cublas / us:.3f}x, "
              f"rel. err {err:.1e}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="store_true", help="build each form for sm90 here (no GPU needed)")
    ap.add_argument("--out", help="write OUT/ws_forms.json (GPU)")
    ap.add_argument("--form", type=int, help=argparse.SUPPRESS)  # (one form, in a child process)
    a = ap.parse_args()
    if a.build:
        print(json.dumps(build(), indent=1))
        return
    if a.form is not None:
        print("ROWS " + json.dumps(time_form(a.form)), flush=True)
        return
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "rows": [], "failed": []}  # fmt: skip
    for i, form in enumerate(FORMS):
        try:
            p = subprocess.run([sys.executable, __file__, "--form", str(i)], capture_output=True, text=True,
                               timeout=150)  # fmt: skip
            rows = [line for line in p.stdout.splitlines() if line.startswith("ROWS ")]
            print("\n".join(line for line in p.stdout.splitlines() if not line.startswith("ROWS ")), flush=True)
            if rows:
                res["rows"] += json.loads(rows[0][5:])
            else:
                res["failed"].append({"form": form[0], "stderr": p.stderr[-2000:]})
        except subprocess.TimeoutExpired:
            res["failed"].append({"form": form[0], "stderr": "timed out (150 s)"})
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "ws_forms.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
