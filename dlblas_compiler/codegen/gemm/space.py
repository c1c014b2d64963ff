"""The GEMM's search space: tiles, split-K, grouping, warps, stages, TMA and the variant (MM: cuBLAS's product
with the kernel as its epilogue; NORM_PASS: a row pass for the norm), constrained by the shape, the device and
the epilogue; its default config and seeds."""

from __future__ import annotations

import os

import torch
import triton

from ...dialects import LayerNormOp
from ...dialects.types import dtype_of, numel
from ...tuning.space import SearchSpace
from .. import device
from ..source import cdiv
from . import warp_specialized
from .launch import RS_INLINE_ROWS
from .plan import GEMV_ROWS, GemmPlan, whole_tiles

PARAMS = {
    "BLOCK_M": [1, 16, 32, 64, 128],
    "BLOCK_N": [16, 32, 64, 128, 256],
    "BLOCK_K": [32, 64, 128, 256, 512],
    "SPLIT_K": [1, 2, 4, 8, 16],
    "GROUP_M": [1, 8],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
    "TMA": [0, 1],
    # 1: cuBLAS computes x @ W^T, the kernel is the prologue's scaling and the epilogue; 2: cuBLAS adds x @ W^T into
    # a residual nothing reads after the region (no kernel: cublas.py)
    "MM": [0, 1, 2],
    "NORM_PASS": [0, 1],  # 1: a row pass writes the normalized x (the K loop reads it unscaled, no row statistics)
    "PERSISTENT": [0, 1],  # 1: one program per SM looping over the tiles (TMA tiles only)
    # 1: the warp-specialized Gluon kernel (a TMA loader warp feeding the MMA warps; sm90); 2: the same with the TMA
    # epilogue (the residual prefetched into shared memory by the loader, the output stored from there by TMA)
    "WS": [0, 1, 2],
}


# DLBLAS_GEMM_TMA=0: no TMA configs in any GEMM space, to measure what they bring (bench/NOTES.md item 99: suspected of
# slower kernels in the model's graph, not reproduced in an A/B on one host); a narrowed space has its own cache key
TMA_ENV = "DLBLAS_GEMM_TMA"
WGMMA_ROWS = 64  # from this many rows of a tile (4 warps or more) Triton 3.6 makes tl.dot a wgmma on sm90, below an mma
SEEDED_ON = 9  # the sweeps' seeds were measured on H200 and H100 (sm90): elsewhere only the variants' starts
# MM=2's one config (it runs no kernel: the tile parameters act on nothing)
IN_PLACE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4, "num_stages": 2,
            "TMA": 0, "MM": 2, "NORM_PASS": 0, "PERSISTENT": 0, "WS": 0}  # fmt: skip


def space(plan: GemmPlan) -> SearchSpace:
    """Tiles, split-K, grouping, warps, stages and TMA, constrained by the shape, the device's shared memory,
    SM count and TMA support, and the epilogue (rotary heads within a tile)."""
    m, gn, k, ns = numel(plan.rows), plan.grid_n, plan.k, len(plan.streams)
    elem = dtype_of(plan.linear.input).itemsize
    rot = max(plan.rotary_dims) if plan.rotary_dims else 16
    narrow = plan.narrow_rotary is not None
    smem_limit, sms, tma_ok = device.smem_limit(), device.sm_count(), device.has_tma()
    has_norm, ln = plan.norm is not None, isinstance(plan.norm, LayerNormOp)
    norm_w = plan.rms is not None and plan.rms.weight is not None  # (a norm weight not folded into W)
    ws_ok = warp_specialized.offered(plan) and torch.cuda.is_available() and device.capability()[0] == 9
    wgmma = device.capability()[0] >= 9  # (Triton's tensor-core products on sm90+ are asynchronous)

    def tiles(c: dict) -> int:
        return cdiv(m, c["BLOCK_M"]) * cdiv(gn, c["BLOCK_N"])

    constraints = {
        "heads (rotary, per-head norm) fit the tile (MM reads rotary partners back: any width, but a tile of part"
        " of a head divides it)": lambda c: c["BLOCK_N"] % rot == 0
        or (narrow and rot % c["BLOCK_N"] == 0 and not c["TMA"])
        or (c["MM"] and plan.rotary_from_product and (not narrow or c["BLOCK_N"] >= rot or rot % c["BLOCK_N"] == 0)),
        "one-row (CUDA-core) tiles only for a few rows": lambda c: c["BLOCK_M"] > 1
        or (m <= GEMV_ROWS and not c["TMA"]),
        "one-row tiles with one num_stages: their K loop's loads feed no tl.dot, the only loads Triton's pipeliner"
        " stages (2, 3 and 4 stages compiled to the same code for sm90, bench/NOTES.md 152), so other values would"
        " only repeat configs the search then times again": lambda c: c["BLOCK_M"] > 1 or c["num_stages"] == 2,
        "K blocks over 128 only for one-row tiles": lambda c: c["BLOCK_K"] <= 128 or c["BLOCK_M"] == 1,
        "no block much larger than M": lambda c: c["BLOCK_M"] <= max(16, triton.next_power_of_2(m)),
        "TMA needs sm90+ and 16-byte row strides": lambda c: not c["TMA"] or (tma_ok and k * elem % 16 == 0),
        "no block much larger than N": lambda c: c["BLOCK_N"] <= max(16, rot, triton.next_power_of_2(gn)),
        "no block much larger than K": lambda c: c["BLOCK_K"] <= max(32, triton.next_power_of_2(k)),
        "split K only for long K, and of every tile only for under two waves of tiles; a persistent kernel splits"
        " its last wave's tiles, only where they leave most SMs idle": lambda c: c["SPLIT_K"] == 1
        or (k // c["SPLIT_K"] >= 4 * c["BLOCK_K"] and (tiles(c) < 2 * sms if not c["PERSISTENT"]
                                                         else whole_tiles(tiles(c), sms, c["SPLIT_K"]) < tiles(c))),
        "shared memory (a warp-specialized kernel's epilogue also takes the tile's layout change, or its output"
        " tile)": lambda c:
        c["BLOCK_M"] == 1 or (c["BLOCK_M"] + ns * c["BLOCK_N"]) * c["BLOCK_K"] * elem * c["num_stages"]
        + (c["WS"] > 0) * 2 * c["BLOCK_M"] * c["BLOCK_N"] <= smem_limit,
        "registers": lambda c: ns * c["BLOCK_M"] * c["BLOCK_N"] <= 128 * c["num_warps"] * 32
        and (c["BLOCK_M"] > 1 or ns * c["BLOCK_N"] * c["BLOCK_K"] <= 64 * c["num_warps"] * 32),
        "group only with several row blocks": lambda c: c["GROUP_M"] == 1 or m > c["BLOCK_M"],
        "a cuBLAS product (MM) has tensor-core-sized tiles and no K-loop parameters": lambda c: not c["MM"]
        or (c["BLOCK_M"] > 1 and c["SPLIT_K"] == 1 and not c["TMA"] and c["BLOCK_K"] == 32 and c["num_stages"] == 2),
        "a norm pass only with a norm prologue, always under a cuBLAS product, and for a LayerNorm unless a few rows"
        " are loaded by pointer (each program normalizes its A tiles: prologue.py)": lambda c:
        c["NORM_PASS"] == (has_norm and (c["MM"] or c["NORM_PASS"] or (ln and (m > RS_INLINE_ROWS or c["TMA"])))),
        "persistent programs only for tensor-core tiles, more of them than SMs": lambda c:
        not c["PERSISTENT"] or (c["BLOCK_M"] > 1 and tiles(c) > sms),
        "no A tile scaled in registers (a norm weight not folded into W, a LayerNorm) in the K loop of a tile whose"
        " product is an asynchronous wgmma (sm90+, 64 rows or more): Triton 3.6 feeds wgmma that tile from registers"
        " and the next K step overwrites them while the last step's wgmmas still read them, wrong rows that vary"
        " between runs (triton-lang/triton#9433; bench/NOTES.md 167)": lambda c: not (
            (norm_w or ln) and not c["NORM_PASS"] and not c["MM"] and c["BLOCK_M"] >= WGMMA_ROWS and wgmma),
        "warp specialization (a Gluon kernel for sm90 GPUs, regions whose epilogue it takes) runs persistent TMA"
        " tiles over the whole K range, a warpgroup per 64 rows at most, with the norm's statistics from a pass, in"
        " tiles of whole rotary heads (its epilogue has no column remapping for tiles of part of a head)":
        lambda c: not c["WS"] or (ws_ok and c["PERSISTENT"] and c["TMA"] and c["SPLIT_K"] == 1 and not c["MM"]
                                  and c["BLOCK_M"] >= 16 * c["num_warps"] and c["BLOCK_N"] >= 32
                                  and not (norm_w and not c["NORM_PASS"]) and m > RS_INLINE_ROWS
                                  and all(c["BLOCK_N"] % d == 0 for d in plan.rotary_dims)),
        "the TMA epilogue (WS=2) where the region's one output is a plain [M, N] block (warp_specialized.staging)":
        lambda c: c["WS"] != 2 or plan.tma_epilogue,
        "cuBLAS's product added into the residual (MM=2) where nothing reads that residual after the region, in one"
        " config (no kernel runs: cublas.residual_in_place)": lambda c: c["MM"] != 2
        or (plan.residual_in_place is not None and c == IN_PLACE),
    }
    default = _default_config(m, gn, k, rot, narrow, ns, sms, tma_ok and k * elem % 16 == 0, smem_limit // elem,
                              has_norm, plan.rotary_from_product)
    starts = ((_seed_configs(m, ns, has_norm) if device.capability()[0] == SEEDED_ON else [])
              + _variant_starts(m, ns, has_norm, default))  # fmt: skip
    starts = [{**c, "WS": 0} for c in [default, *starts]]
    if plan.residual_in_place is not None:  # (timed right after the default)
        starts.insert(1, IN_PLACE)

    def valid(c: dict) -> bool:
        return all(rule(c) for rule in constraints.values())

    space = SearchSpace(PARAMS, constraints, default=starts[0], seeds=_split_tails(_ws_twins(starts[1:], valid), valid))
    return space.narrow(TMA=0) if os.environ.get(TMA_ENV) == "0" else space


def _ws_twins(starts: list[dict], valid) -> list[dict]:
    """`starts`, each persistent TMA one followed by its warp-specialized twin (WS) where the space has it: the
    same tiles and stages, the main loop in Gluon (warp_specialized.py), with the TMA epilogue (WS=2) where the
    region's output allows it, otherwise WS=1. The tuner times the twin against its start. On an H200 WS=1 was within
    2% of it either way (bench/NOTES.md 144); WS=2 was 0.1-7.5% faster than WS=1 at the same config on every dual
    gate/up GEMM of five layers, 0-6.6% on o-proj and without a consistent sign on down (NOTES 170), so it replaces
    it."""
    out = []
    for c in starts:
        out.append(c)
        if c["PERSISTENT"] and not c["WS"]:  # (with the TMA epilogue where the region has it)
            out += [t for t in ({**c, "WS": 2}, {**c, "WS": 1}) if valid(t)][:1]
    return out


def _split_tails(starts: list[dict], valid) -> list[dict]:
    """`starts`, each persistent one followed by its twin with the last wave split over K as finely as the space
    allows (`valid`: where the split parts still make one wave and each has 4 K steps), where that wave is partly
    empty: a last wave of few tiles otherwise leaves most SMs idle for a whole tile's time (bench/NOTES.md 135). The
    tuner times the twin against its start: on H200 it was up to 13% faster on plain GEMMs with a residual add
    (Llama-3.2-3B's down), and 0-7% slower on every QKV kernel, whose split copy spills (NOTES 138's outcome)."""
    out = []
    for c in starts:
        out.append(c)
        if c["PERSISTENT"] and c["SPLIT_K"] == 1 and not c["WS"]:
            twins = [{**c, "SPLIT_K": s} for s in reversed(PARAMS["SPLIT_K"]) if s > 1]
            out += [t for t in twins if valid(t)][:1]
    return out


def _default_config(m: int, n: int, k: int, rot: int, narrow: bool, ns: int, sms: int, tma: bool, smem_elems: int,
                    has_norm: bool, from_product: bool = False) -> dict:
    """A reasonable untuned config, after the exhaustive sweeps on H200 (bench/NOTES.md): one row streams
    the weight through CUDA cores in narrow tiles; other decode shapes stream it with more programs
    (split-K) up to about 3/4 of a wave; above 256 rows, 128x128 tiles (also for the dual GEMM) loaded
    through TMA (at 128 rows TMA made the default slower: 81 vs 55 µs), 256 columns wide over all streams where
    that still makes a wave of tiles (one stream 128x256, the dual GEMM 128x128 each: the accumulators fill
    8 warps' registers; on an H100 at M=2048 128x256 beat 128x128 by 10-25% on every single-stream GEMM of five
    layers, bench/NOTES.md 71). Above 16 rows a norm prologue is a row
    pass: scaling the A tile by the norm weight inside the K loop takes it out of the tensor cores' pipeline (H100,
    M=2048: 171 vs 148 µs for the QKV GEMM, NOTES 36); up to 16 rows the K loop applies it (a LayerNorm too), which
    saves the pass's launch. Heads whose width is not a power of two never fill whole
    tiles: above 16 rows the rotary then runs over cuBLAS's product (MM, where it rotates a view of the product),
    otherwise in tiles of part of a head, the widest power of two dividing it (NOTES 105)."""
    if rot & (rot - 1):  # (one row and tiles of part of a head: the one-row default below, 16 columns wide)
        bm = 16 if m <= 16 else 64 if m <= 256 else 128
        if (m > 16 or not narrow) and from_product:
            return {"BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 8 if m > bm else 1,
                    "num_warps": 8 if bm * 128 * ns > 8192 else 4, "num_stages": 2, "TMA": 0, "MM": 1,
                    "NORM_PASS": int(has_norm), "PERSISTENT": 0}  # fmt: skip
        if narrow and m > 1:
            bn = min(128, rot & -rot)  # (the lowest set bit: the widest power of two dividing the head)
            bk = 128 if m <= 16 and k >= 512 else 64 if k >= 64 else 32
            return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "GROUP_M": 8 if m > bm else 1,
                    "num_warps": 4, "num_stages": 3 if m > 16 else 4, "TMA": 0, "MM": 0,
                    "NORM_PASS": int(has_norm and m > 16), "PERSISTENT": 0}  # fmt: skip
    if m == 1:  # about 8 programs per SM, each streaming 16 weight rows 128 wide (M=1 sweeps, NOTES 19)
        bn = 16 if narrow or rot <= 16 else rot
        bk = max(32, min(128, 8192 // (ns * bn), triton.next_power_of_2(k)))
        tiles, split = -(-n // bn), 1
        while tiles * split * 2 <= 8 * sms and k // (split * 2) >= 4 * bk and split < 16:
            split *= 2
        return {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "GROUP_M": 1, "num_warps": 4,
                "num_stages": 2, "TMA": 0, "MM": 0, "NORM_PASS": 0, "PERSISTENT": 0}  # fmt: skip
    bm = 16 if m <= 16 else 64 if m <= 256 else 128
    bn = min(max(rot, 128), max(16, rot, triton.next_power_of_2(n)))  # no wider than N
    wide = max(bn, 256 // ns)  # 128 x 256 accumulators over all streams: 8 warps' register budget
    if bm == 128 and wide % rot == 0 and wide <= triton.next_power_of_2(n) and -(-m // bm) * -(-n // wide) >= sms:
        bn = wide  # (where the wider tiles still fill a wave)
    bk = 128 if m <= 16 and k >= 512 else 64 if k >= 64 else 32
    tiles = -(-m // bm) * -(-n // bn)
    split = 1
    while m <= 64 and tiles * split * 4 < 3 * sms and k // (split * 2) >= 4 * bk and split < 8:
        split *= 2
    stages = 3 if m > 16 else 4
    while stages > 2 and (bm + ns * bn) * bk * stages > smem_elems:  # e.g. fp32 operands
        stages -= 1
    return {"BLOCK_M": bm, "BLOCK_N": min(bn, 256), "BLOCK_K": bk, "SPLIT_K": split,
            "GROUP_M": 8 if m > bm else 1,
            "num_warps": 4 if bm * bn * ns <= 8192 else 8, "num_stages": stages,
            "TMA": int(tma and bm == 128), "MM": 0, "NORM_PASS": int(has_norm and m > 16),
            "PERSISTENT": 0}  # fmt: skip


EPILOGUE_TILE = 8192  # elements (all streams) per program of an epilogue pass over a cuBLAS product


def _variant_starts(m: int, ns: int, has_norm: bool, default: dict | None = None) -> list[dict]:
    """Starts for the quick search on every device, from a variant's own rule rather than a sweep's table: above
    256 rows, the default's tile run persistent (one program per SM looping over the tiles; 0-4% faster than the
    same tile launched per tile on an H100 at M = 2048, bench/NOTES.md 59, and the whole space's best for
    Qwen2.5-7B's gate/up there, NOTES 68, where no climb from another family reaches it); above 16 rows, the
    cuBLAS product (MM) with epilogue tiles of `EPILOGUE_TILE` elements over all streams (a
    memory-bound pass over the product, as a row kernel is) in three aspect ratios, with 4 and 8 warps. MM is a
    few percent of the space and its tile parameters act only on the epilogue pass, so a joint search rarely
    reaches it, yet it was the fastest variant for Qwen2.5-7B's norm+QKV+RoPE and gate/up at M = 2048 on an H100
    (bench/NOTES.md 61; there the best gate/up tile was 128x64, twice this size, and a search from these starts
    stopped 8.6% above it). Tiles the shape's constraints reject are skipped (`SearchSpace.starts`): persistence
    needs more tiles than SMs."""
    if m <= 16:
        return []
    pas = int(has_norm)
    starts = [{**default, "PERSISTENT": 1}] if default is not None and m > 256 and default["BLOCK_M"] > 1 else []
    for warps in (4, 8):
        for bn in (64, 128, 256):
            bm = min(128, max(16, EPILOGUE_TILE // (ns * bn)))
            starts.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 8 if m > bm else 1,
                           "num_warps": warps, "num_stages": 2, "TMA": 0, "MM": 1, "NORM_PASS": pas,
                           "PERSISTENT": 0})  # fmt: skip
    return starts


def _seed_configs(m: int, ns: int, has_norm: bool) -> list[dict]:
    """The best configs of the exhaustive sweeps on H200 and H100 (bench/NOTES.md) for this row count's class
    (offered on sm90 cards only, `SEEDED_ON`),
    then (above 16 rows) the cuBLAS product with this kernel as its epilogue: the quick search tries them after
    the default (those the shape's constraints reject are skipped). Above 16 rows a norm is a row pass. Above
    256 rows the sweeps' tiles also come persistent (one program per SM; H100, M=2048: 1–8% faster on 128-row
    tiles, NOTES 59)."""
    if m == 1:  # QKV, down, gate/up at M=1
        tiles = [(1, 32, 256, 2, 8, 2, 0), (1, 16, 128, 8, 4, 2, 0), (1, 32, 128, 1, 4, 2, 0)]
    elif m <= 16:  # QKV (narrow rotary tiles), o-proj, gate/up
        tiles = [(16, 64, 128, 4, 8, 2, 0), (16, 128, 128, 2, 4, 4, 0), (16, 128, 128, 1, 4, 3, 0)]
    elif m <= 256:  # QKV, gate/up at 128
        tiles = [(64, 128, 128, 1, 4, 4, 0), (64, 256, 64, 1, 8, 3, 1)]
    else:  # QKV, gate/up at 2048 (H200); every plain GEMM of five layers at 2048 (H100, NOTES 36)
        tiles = [(128, 128, 64, 1, 8, 4, 1), (128, 256, 64, 1, 8, 4, 1), (128, 256, 64, 1, 8, 3, 1)]
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages", "TMA")
    pas = int(has_norm and m > 16)
    seeds = [{**dict(zip(keys, t)), "GROUP_M": 8 if m > t[0] else 1, "MM": 0, "NORM_PASS": pas, "PERSISTENT": p}
             for p in ((0,) if m <= 256 else (0, 1)) for t in tiles]  # fmt: skip
    if m > 16:  # an epilogue pass over the product: wide tiles, one per 8 warps
        bm = 64 if m <= 64 else 128
        seeds.append({"BLOCK_M": bm, "BLOCK_N": 128 if ns == 1 else 64, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 8,
                      "num_stages": 2, "TMA": 0, "GROUP_M": 8 if m > bm else 1, "MM": 1, "NORM_PASS": pas,
                      "PERSISTENT": 0})  # fmt: skip
    return seeds
