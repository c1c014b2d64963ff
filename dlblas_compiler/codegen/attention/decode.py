"""The decode kernel (S <= DECODE_ROWS query rows): split-KV flash decoding (see the package docstring) and its
search space."""

from __future__ import annotations

import torch
import triton

from ...dialects.types import dtype_of, shape_of
from ...tuning.space import SearchSpace
from .. import device
from ..source import PDL_ARG, TL_DTYPE, Writer, cdiv, chained_start
from .dims import dim_ranges, drop_scores, keep_test, scores
from .plan import AttentionPlan

DECODE_PARAMS = {"BLOCK_N": [16, 32, 64, 128], "SPLITS": [1, 2, 4, 8, 16, 32], "num_warps": [4, 8], "num_stages": [1, 2, 3, 4]}


def decode_source(
    name: str, has_mask: bool, mask_bool: bool, causal: bool, out_dtype: torch.dtype, nan_rows: bool,
    in_dtype: torch.dtype, dims: tuple[int, int], wide: bool = False, mask_mode: str = "sdpa", fill: str | None = None,
) -> str:
    """The split-KV decode kernel (see the module docstring). Rows r = g * S + s of a program are query head
    hk * GROUPS + g at query position s; partial results go to `ws` as (max, sum, acc) per row, in the same
    score units as the prefill kernel's. `dims`: the head dims of q/k and of v, read in power-of-two pieces."""
    float_mask = has_mask and not mask_bool
    to_log2 = " * 1.4426950408889634" if float_mask else ""
    dot = device.dot_args(in_dtype)
    w = Writer()
    w("@triton.jit")
    w(f"def {name}(")
    w.indent()
    w("q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, ws_ptr, cnt_ptr,")
    w("sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,")
    w("sm_b, sm_h, sm_s, sm_l, so_b, so_h, so_s, so_d,")
    w("HK, S, L, GROUPS, CHUNK, qk_scale,")
    w("D: tl.constexpr, DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, " + PDL_ARG)
    w.dedent()
    w("):")
    w.indent()
    chained_start(w)
    w("bh = tl.program_id(0)")
    w("split = tl.program_id(1)")
    w("b = bh // HK")
    w("hk = bh % HK")
    w("r = tl.arange(0, BLOCK_R)")
    w("si = r % S  # query position")
    w("h = hk * GROUPS + r // S  # query head")
    w("rmask = r < GROUPS * S")
    if wide:
        w("b, h, hk, si = b.to(tl.int64), h.to(tl.int64), hk.to(tl.int64), si.to(tl.int64)")
    qk = dim_ranges(w, "rd", dims[0], "D")
    vp = qk if dims[1] == dims[0] else dim_ranges(w, "rv", dims[1], "DV")
    rv = "rd" if dims[1] == dims[0] else "rv"
    for sfx, _ in qk:
        w(f"q{sfx} = tl.load(q_ptr + b * sq_b + h[:, None] * sq_h + si[:, None] * sq_s + rd{sfx}[None, :] * sq_d, mask=rmask[:, None], other=0.0)")
        w(f"q{sfx} = (q{sfx}.to(tl.float32) * qk_scale).to(q{sfx}.dtype)")
    w("m_i = tl.full((BLOCK_R,), float('-inf'), tl.float32)")
    w("l_i = tl.zeros((BLOCK_R,), tl.float32)")
    zeros = [(sfx, "DV" if len(vp) == 1 else width) for sfx, width in vp]
    for sfx, width in zeros:
        w(f"acc{sfx} = tl.zeros((BLOCK_R, {width}), tl.float32)")
    w("k_base = k_ptr + b * sk_b + hk * sk_h")
    w("v_base = v_ptr + b * sv_b + hk * sv_h")
    w("lo = split * CHUNK")
    w("hi = tl.minimum(lo + CHUNK, L)")
    w("for start in range(lo, hi, BLOCK_N):")
    w.indent()
    w("rn = start + tl.arange(0, BLOCK_N)" + (".to(tl.int64)" if wide else ""))
    w("nmask = rn < hi")
    w("keep = nmask[None, :] & rmask[:, None]")
    if causal:
        w("keep = keep & (rn[None, :] <= si[:, None])")
    if has_mask:
        w("mv = tl.load(m_ptr + b * sm_b + h[:, None] * sm_h + si[:, None] * sm_s + rn[None, :] * sm_l, mask=keep, other=0)")
        w("seen = keep  # (in range and, causal, not in the future: where the mask's drops count)")
        w(keep_test(mask_bool, mask_mode))
    w("# a tile no row keeps (a cache's unused tail) reads no K/V: its loads are masked off, not branched")
    w("# around, so the K and V loads of a tile issue together and the loop can be pipelined")
    w("live = nmask" if fill is not None else "live = nmask & (tl.max(keep.to(tl.int32)) > 0)")
    for sfx, _ in qk:
        w(f"k{sfx} = tl.load(k_base + rn[:, None] * sk_s + rd{sfx}[None, :] * sk_d, mask=live[:, None], other=0.0)")
    for sfx, _ in vp:
        w(f"v{sfx} = tl.load(v_base + rn[:, None] * sv_s + {rv}{sfx}[None, :] * sv_d, mask=live[:, None], other=0.0)")
    scores(w, "q", "k", qk, dot)
    if float_mask:
        w("s = s + mv.to(tl.float32)")
    drop_scores(w, has_mask and mask_mode == "sdpa", fill)
    w("m_new = tl.maximum(m_i, tl.max(s, axis=1))")
    w("m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)")
    w(f"p = tl.exp2((s - m_safe[:, None]){to_log2})")
    w(f"alpha = tl.exp2((m_i - m_safe){to_log2})")
    w("l_i = l_i * alpha + tl.sum(p, axis=1)")
    for sfx, _ in vp:
        w(f"acc{sfx} = acc{sfx} * alpha[:, None] + tl.dot(p.to(v{sfx}.dtype), v{sfx}{dot})")
    w("m_i = m_new")
    w.dedent()
    w("if SPLITS > 1:  # partial results of this split; the last split of (b, hk) to finish combines them")
    w.indent()
    w("part = ws_ptr + (bh * SPLITS + split) * BLOCK_R * (DV + 2)")
    w("tl.store(part + r, m_i)")
    w("tl.store(part + BLOCK_R + r, l_i)")
    for sfx, _ in vp:
        w(f"tl.store(part + 2 * BLOCK_R + r[:, None] * DV + {rv}{sfx}[None, :], acc{sfx})")
    w('last = tl.atomic_add(cnt_ptr + bh, 1, sem="acq_rel") == SPLITS - 1')
    w("if last:")
    w.indent()
    w("mx = tl.full((BLOCK_R,), float('-inf'), tl.float32)")
    w("for j in range(SPLITS):")
    w('    mx = tl.maximum(mx, tl.load(ws_ptr + (bh * SPLITS + j) * BLOCK_R * (DV + 2) + r, cache_modifier=".cg"))')
    w("mx = tl.where(mx == float('-inf'), 0.0, mx)")
    w("l_i = tl.zeros((BLOCK_R,), tl.float32)")
    for sfx, width in zeros:
        w(f"acc{sfx} = tl.zeros((BLOCK_R, {width}), tl.float32)")
    w("for j in range(SPLITS):")
    w.indent()
    w("part = ws_ptr + (bh * SPLITS + j) * BLOCK_R * (DV + 2)")
    w(f'sc = tl.exp2((tl.load(part + r, cache_modifier=".cg") - mx){to_log2})')
    w('l_i += tl.load(part + BLOCK_R + r, cache_modifier=".cg") * sc')
    for sfx, _ in vp:
        w(f'acc{sfx} += tl.load(part + 2 * BLOCK_R + r[:, None] * DV + {rv}{sfx}[None, :], cache_modifier=".cg") * sc[:, None]')
    w.dedent()
    w("tl.atomic_xchg(cnt_ptr + bh, 0)")
    w.dedent()
    w.dedent()
    w("else:")
    w("    last = True")
    w("if last:")
    w.indent()
    if nan_rows:
        w("l_i = tl.where(rmask, l_i, 1.0)  # a fully masked row: 0 / 0 = NaN, as softmax gives")
    else:
        w("l_i = tl.where(l_i > 0.0, l_i, 1.0)  # a fully masked row: 0, as SDPA gives")
    for sfx, _ in vp:
        w(f"out{sfx} = acc{sfx} / l_i[:, None]")
        w(f"tl.store(o_ptr + b * so_b + h[:, None] * so_h + si[:, None] * so_s + {rv}{sfx}[None, :] * so_d, out{sfx}.to({TL_DTYPE[out_dtype]}), mask=rmask[:, None])")
    w.dedent()
    w.dedent()
    return w.text()


def decode_rows(plan: AttentionPlan) -> int:
    """Query rows of a decode program: the S queries of each query head sharing a KV head, padded for tl.dot."""
    q, k = shape_of(plan.sdpa.query), shape_of(plan.sdpa.key)
    return max(16, triton.next_power_of_2(q[1] // k[1] * q[2]))


def decode_space(plan: AttentionPlan) -> SearchSpace:
    """Key tiles and splits of the keys: enough programs to fill the GPU (batch x KV heads x splits), each
    split at least one tile; shared memory for the q, k and v tiles; registers. The default splits the keys
    over up to one program per SM, at least 96 keys a split: a decode step's attention is latency-bound (one
    query row per head; H100, L = 384: 7.4 µs with 4 splits of 96 keys against 10.2 µs unsplit, and at L = 1024
    and 4096 the fastest configs split into 128- and 256-key parts; bench/decode_attention.py, NOTES 51)."""
    op = plan.sdpa
    b = shape_of(op.query)[0]
    d, dv = plan.dims
    hk, l_ = shape_of(op.key)[1], shape_of(op.key)[2]
    rows, elem, smem, sms = decode_rows(plan), dtype_of(op.query).itemsize, device.smem_limit(), device.sm_count()
    splits = 1
    while splits < 16 and b * hk * splits * 2 <= sms and l_ // (splits * 2) >= 96:
        splits *= 2
    block_n = 64 if l_ // splits >= 64 else max(16, min(32, triton.next_power_of_2(l_)))
    stages = 3
    def smem_ok(block_n: int, stages: int) -> bool:  # the q tile once, k and v tiles per stage
        return (rows * d + stages * block_n * (d + dv)) * elem <= smem

    while stages > 1 and not smem_ok(block_n, stages):
        stages -= 1
    return SearchSpace(
        DECODE_PARAMS,
        {
            "no block much larger than L": lambda c: c["BLOCK_N"] <= max(16, triton.next_power_of_2(l_)),
            "every split holds a tile": lambda c: c["SPLITS"] == 1 or cdiv(l_, c["SPLITS"]) >= c["BLOCK_N"],
            "shared memory": lambda c: smem_ok(c["BLOCK_N"], c["num_stages"]),
            "registers": lambda c: rows * (max(d, dv) + c["BLOCK_N"]) <= 96 * 32 * c["num_warps"],
        },
        default={"BLOCK_N": block_n, "SPLITS": splits, "num_warps": 4, "num_stages": stages},
    )
