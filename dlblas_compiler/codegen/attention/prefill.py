"""The prefill kernel (S > DECODE_ROWS query rows): one program per block of BLOCK_M query rows of one head,
looping over all keys with an online softmax; a key tile the mask keeps nothing of (a materialized causal
mask's upper triangle, a sliding window's far past, a padded batch's padding) is skipped: the kernel runs over
lists two first kernels (`blocks_source`) write of the tiles each block of rows keeps whole (run as without a
mask) and in part (run under it). Its search space."""

from __future__ import annotations

import torch
import triton

from ...dialects.types import dtype_of, shape_of
from ...tuning.space import SearchSpace
from .. import device
from ..source import PDL_ARG, TL_DTYPE, Writer, chained_start
from .dims import dim_ranges, drop_scores, head_parts, keep_test, padded_range, padded_width, scores
from .plan import AttentionPlan

# num_stages 1 is left out: unpipelined, 128-key tiles of heads read in pieces of 32 columns (Phi-3's 96 = 64 + 32)
# fault with an illegal memory access on an H100 under Triton 3.6 (NOTES 85), and no tuned prefill kept it
PARAMS = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [4, 8], "num_stages": [2, 3, 4]}


def padded(dims: tuple[int, int], has_mask: bool) -> bool:
    """Whether the kernel reads its heads as one padded piece (`dims.padded_range`) instead of power-of-two pieces:
    with a mask. When the masked loop's body was a branch taken for the tiles the mask keeps something of (before
    the seventy-fifth session's lists, NOTES 198), heads of 64 + 32 columns (Phi-3's 96) in that branch ran wrong
    (relative errors of 0.5-0.7) or faulted in 12 of 90 configs on an H200 under Triton 3.6: compute-sanitizer put
    an out-of-bounds shared-memory read in the branch's row sum (`tl.sum`); one 128-column piece ran right in every
    config (NOTES 112). Kept without the branch (pieces under a mask not measured since)."""
    return has_mask and any(len(head_parts(d) or ()) > 1 for d in dims)


def skips_tiles(has_mask: bool, fill: str | None) -> bool:
    """A mask whose fully dropped key tiles can be skipped (with a finite fill a dropped key still counts): the
    kernel runs over the lists of the tiles it keeps (`blocks_source`)."""
    return has_mask and fill is None


def source(
    name: str, has_mask: bool, mask_bool: bool, causal: bool, out_dtype: torch.dtype, dims: tuple[int, int],
    wide: bool = False, nan_rows: bool = False, in_dtype: torch.dtype = torch.float16, mask_mode: str = "sdpa",
    fill: str | None = None,
) -> str:
    """The kernel text. Scores are kept in log2 units (q pre-scaled by scale * log2(e), exp2), except with an
    additive float mask: mask values as large as the dtype's minimum would overflow once multiplied by log2(e),
    so scores stay in natural units and exp2 takes (s - max) * log2(e). A row whose keys are all masked out
    gives 0 (SDPA's), or NaN with `nan_rows` (an explicit softmax's). `dims`: the head dims of q/k and of v,
    each read in power-of-two pieces (dims.py). `mask_mode`: how a boolean mask drops keys (dl.sdpa's); `fill`: the
    finite score it puts in their place (dims.fill_score), where every key tile is read."""
    float_mask = has_mask and not mask_bool
    dot = device.dot_args(in_dtype)
    w = Writer()
    w("@triton.jit")
    w(f"def {name}(")
    w.indent()
    w("q_ptr, k_ptr, v_ptr, m_ptr, o_ptr,")
    w("sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,")
    w("sm_b, sm_h, sm_s, sm_l, so_b, so_h, so_s, so_d,")
    w("H, S, L, GROUPS, qk_scale,")
    skips = skips_tiles(has_mask, fill)
    if skips:  # (the lists of kept key tiles: `blocks_source`)
        w("blk_ptr, cnt_ptr, sl_b, sl_h, NB,")
    w("D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, " + PDL_ARG)
    w.dedent()
    w("):")
    w.indent()
    chained_start(w)
    w("pid_m = tl.program_id(0)")
    w("bh = tl.program_id(1)")
    w("b = bh // H")
    w("h = bh % H")
    w("hk = h // GROUPS")
    w("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    if wide:  # batch * stride and row * stride pass 2^31
        w("b, h, hk, rm = b.to(tl.int64), h.to(tl.int64), hk.to(tl.int64), rm.to(tl.int64)")
    pad = padded(dims, has_mask)
    ranges = padded_range if pad else dim_ranges
    qk = ranges(w, "rd", dims[0], "D")
    vp = qk if dims[1] == dims[0] else ranges(w, "rv", dims[1], "DV")
    rv = "rd" if dims[1] == dims[0] else "rv"
    qcol, vcol = (" & rd_in[None, :]", f" & {rv}_in[None, :]") if pad else ("", "")  # (the padded columns)
    w("mmask = rm < S")
    units = "natural units (the mask is added as it is)" if float_mask else "log2 units"
    for sfx, _ in qk:
        w(f"q{sfx} = tl.load(q_ptr + b * sq_b + h * sq_h + rm[:, None] * sq_s + rd{sfx}[None, :] * sq_d, mask=mmask[:, None]{qcol}, other=0.0)")
        w(f"q{sfx} = (q{sfx}.to(tl.float32) * qk_scale).to(q{sfx}.dtype)  # scores come out in {units}")
    w("m_i = tl.full((BLOCK_M,), float('-inf'), tl.float32)")
    w("l_i = tl.zeros((BLOCK_M,), tl.float32)")
    for sfx, width in vp:
        w(f"acc{sfx} = tl.zeros((BLOCK_M, {'DV' if len(vp) == 1 and not pad else width}), tl.float32)")
    w("k_base = k_ptr + b * sk_b + hk * sk_h")
    w("v_base = v_ptr + b * sv_b + hk * sv_h")
    if skips:  # the tiles the mask keeps whole, as without a mask, then those it keeps in part, under it
        w("row = (b * sl_b + h * sl_h + pid_m) * 2  # (this block's lists: partly kept tiles, then whole ones)")
    else:  # blocks entirely below the diagonal (or before L's ragged tail) need no mask; a finite fill reads all
        if has_mask:
            w("full = 0")
        elif causal:
            w("full = tl.minimum(pid_m * BLOCK_M, L) // BLOCK_N * BLOCK_N")
        else:
            w("full = L // BLOCK_N * BLOCK_N")
        w("hi = (pid_m + 1) * BLOCK_M" if causal else "hi = L")
    for masked, at in ((False, "row + 1"), (True, "row")):
        _key_loop(w, qk, vp, rv, dot, pad, qcol, vcol, float_mask, masked, has_mask, mask_bool, mask_mode, fill,
                  causal, wide, listed=at if skips else None)  # fmt: skip
    if nan_rows:
        w("l_i = tl.where(mmask, l_i, 1.0)  # a fully masked row: 0 / 0 = NaN, as softmax gives")
    else:
        w("l_i = tl.where(l_i > 0.0, l_i, 1.0)  # a fully masked row: 0, as SDPA gives")
    for sfx, _ in vp:
        w(f"out{sfx} = acc{sfx} / l_i[:, None]")
        w(f"tl.store(o_ptr + b * so_b + h * so_h + rm[:, None] * so_s + {rv}{sfx}[None, :] * so_d, out{sfx}.to({TL_DTYPE[out_dtype]}), mask=mmask[:, None]{vcol})")
    w.dedent()
    return w.text()


def blocks_source(name: str, mask_bool: bool, mask_mode: str, causal: bool, wide: bool) -> str:
    """The two kernels listing, for each block of BLOCK_M query rows of each (batch, head) the mask has its own rows
    for, the key tiles it keeps. `<name>_blocks`, one program per mask tile, classes it: 2 kept whole
    (every row every key; an additive mask adding 0 throughout: the prefill runs it as without a mask), 1 kept in
    part, 0 dropped. `<name>_lists`, one program per block of rows, writes its whole tiles' indices at list
    `row * 2 + 1` and its partial ones' at `row * 2`, in key order, and their counts (`cnt_ptr`). One parallel pass
    over the mask, instead of the prefill reading every mask tile for every head to branch on it (NOTES 198)."""
    w = Writer()
    w("@triton.jit")
    w(f"def {name}_blocks(m_ptr, cls_ptr, sm_b, sm_h, sm_s, sm_l, HM, S, L, NB,")
    w("                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):")
    w.indent()
    w("tile = tl.program_id(0)")
    w("pid_m = tl.program_id(1)")
    w("bh = tl.program_id(2)")
    w("b = bh // HM")
    w("h = bh % HM")
    w("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    w("rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)")
    if wide:
        w("b, h, rm, rn = b.to(tl.int64), h.to(tl.int64), rm.to(tl.int64), rn.to(tl.int64)")
    w("mmask = rm < S")
    w("keep = (rn < L)[None, :] & mmask[:, None]")
    if causal:
        w("keep = keep & (rn[None, :] <= rm[:, None])")
    w("mv = tl.load(m_ptr + b * sm_b + h * sm_h + rm[:, None] * sm_s + rn[None, :] * sm_l, mask=keep, other=0)")
    w(keep_test(mask_bool, mask_mode))
    plain = "keep" if mask_bool else "keep & (mv.to(tl.float32) == 0.0)"  # (a NaN or a finite bias is added)
    w(f"whole = tl.sum(tl.where(mmask[:, None], ({plain}) == 0, 0).to(tl.int32)) == 0")
    w("kept = tl.sum(keep.to(tl.int32)) > 0")
    w("tl.store(cls_ptr + (bh * tl.num_programs(1) + pid_m) * NB + tile, kept.to(tl.int8) + whole.to(tl.int8))")
    w.dedent()
    w("")
    w("")
    w("@triton.jit")
    w(f"def {name}_lists(cls_ptr, blk_ptr, cnt_ptr, NB, CHUNK: tl.constexpr):")
    w.indent()
    w("row = tl.program_id(0)")
    w("n_part = tl.zeros((), tl.int32)")
    w("n_whole = tl.zeros((), tl.int32)")
    w("for start in range(0, NB, CHUNK):")
    w.indent()
    w("tiles = start + tl.arange(0, CHUNK)")
    w("cls = tl.load(cls_ptr + row * NB + tiles, mask=tiles < NB, other=0)")
    w("whole = (cls == 2).to(tl.int32)")
    w("part = (cls == 1).to(tl.int32)")
    w("tl.store(blk_ptr + (row * 2 + 1) * NB + n_whole + tl.cumsum(whole, 0) - whole, tiles, mask=whole > 0)")
    w("tl.store(blk_ptr + row * 2 * NB + n_part + tl.cumsum(part, 0) - part, tiles, mask=part > 0)")
    w("n_whole += tl.sum(whole, 0)")
    w("n_part += tl.sum(part, 0)")
    w.dedent()
    w("tl.store(cnt_ptr + row * 2, n_part)")
    w("tl.store(cnt_ptr + row * 2 + 1, n_whole)")
    w.dedent()
    return w.text()


def _key_loop(w: Writer, qk, vp, rv: str, dot: str, pad: bool, qcol: str, vcol: str, float_mask: bool, masked: bool,
              has_mask: bool, mask_bool: bool, mask_mode: str, fill: str | None, causal: bool, wide: bool,
              listed: str | None = None) -> None:
    """One loop over key tiles with the online softmax: below `full` unmasked, then (`masked`) up to `hi` with the
    bounds, the causal future and the mask applied. `listed`: over the tiles of the list at that row of `blk_ptr`
    instead (a mask's kept tiles: `blocks_source`)."""
    if listed is not None:
        w(f"for i in range(0, tl.load(cnt_ptr + {listed})):")
    elif not masked:
        w("for start in range(0, full, BLOCK_N):")
    else:
        w("for start in range(full, hi, BLOCK_N):")
    w.indent()
    if listed is not None:
        w(f"start = tl.load(blk_ptr + ({listed}) * NB + i) * BLOCK_N")
    w("rn = start + tl.arange(0, BLOCK_N)" + (".to(tl.int64)" if wide else ""))
    if masked:
        w("nmask = rn < L")
        w("keep = nmask[None, :] & mmask[:, None]")
        if causal:
            w("keep = keep & (rn[None, :] <= rm[:, None])")
    if masked and has_mask:
        w("mv = tl.load(m_ptr + b * sm_b + h * sm_h + rm[:, None] * sm_s + rn[None, :] * sm_l, mask=keep, other=0)")
        w("seen = keep  # (in range and, causal, not in the future: where the mask's drops count)")
        w(keep_test(mask_bool, mask_mode))
    for sfx, _ in qk:
        load = f"k{sfx} = tl.load(k_base + rn[:, None] * sk_s + rd{sfx}[None, :] * sk_d"
        w(load + (f", mask=nmask[:, None]{qcol}, other=0.0)" if masked else ", mask=rd_in[None, :], other=0.0)"
                  if pad else ")"))  # fmt: skip
    scores(w, "q", "k", qk, dot)
    if masked:
        if has_mask and not mask_bool:
            w("s = s + mv.to(tl.float32)")
        drop_scores(w, has_mask and mask_mode == "sdpa", fill)
    w("m_new = tl.maximum(m_i, tl.max(s, axis=1))")
    if masked:
        w("m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)")
    else:
        w("m_safe = m_new")
    if float_mask:
        w("p = tl.exp2((s - m_safe[:, None]) * 1.4426950408889634)")
        w("alpha = tl.exp2((m_i - m_safe) * 1.4426950408889634)")
    else:
        w("p = tl.exp2(s - m_safe[:, None])")
        w("alpha = tl.exp2(m_i - m_safe)")
    w("l_i = l_i * alpha + tl.sum(p, axis=1)")
    for sfx, _ in vp:
        load = f"v{sfx} = tl.load(v_base + rn[:, None] * sv_s + {rv}{sfx}[None, :] * sv_d"
        w(load + (f", mask=nmask[:, None]{vcol}, other=0.0)" if masked else f", mask={rv}_in[None, :], other=0.0)"
                  if pad else ")"))  # fmt: skip
        w(f"acc{sfx} = acc{sfx} * alpha[:, None] + tl.dot(p.to(v{sfx}.dtype), v{sfx}{dot})")
    w("m_i = m_new")
    w.dedent()


def prefill_space(plan: AttentionPlan) -> SearchSpace:
    """Query and key blocks within the lengths, shared memory for the q tile and num_stages k and v tiles (what
    Triton 3.6 allocates on an H100: q once, k and v per stage), and registers for the two float32 accumulators
    (the output's BLOCK_M x DV and the scores' BLOCK_M x BLOCK_N) at up to 128 a thread: in a sweep of 16 configs
    at 2048 tokens (bench/attention_dims.py --sweep, NOTES 85) configs beyond that spilled and ran 1.3-2x slower,
    those within it did not, and DeepSeek-V3's 192/128-dim heads ran fastest at 128 x 64 on 8 warps (491 µs
    against 812 for the fastest config of the earlier, tighter space)."""
    op = plan.sdpa
    s, l_ = shape_of(op.query)[2], shape_of(op.key)[2]
    d, dv = plan.dims
    if padded(plan.dims, op.mask is not None):  # (the widths the kernel reads)
        d, dv = padded_width(d), padded_width(dv)
    elem, smem = dtype_of(op.query).itemsize, device.smem_limit()
    melem = dtype_of(op.mask).itemsize if op.mask is not None else 0

    def smem_ok(c: dict) -> bool:  # (the masked loop's mask tiles are pipelined too: NOTES 197)
        mask_tiles = (c["num_stages"] - 1) * c["BLOCK_M"] * c["BLOCK_N"] * melem
        return (c["BLOCK_M"] * d + c["num_stages"] * c["BLOCK_N"] * (d + dv)) * elem + mask_tiles <= smem

    return SearchSpace(
        PARAMS,
        {
            "no block much larger than S": lambda c: c["BLOCK_M"] <= max(16, triton.next_power_of_2(s)),
            "no block much larger than L": lambda c: c["BLOCK_N"] <= max(16, triton.next_power_of_2(l_)),
            "shared memory": smem_ok,
            "registers": lambda c: c["BLOCK_M"] * (dv + c["BLOCK_N"]) <= 128 * 32 * c["num_warps"],
        },
        default={"BLOCK_M": 16 if s <= 16 else 64 if s <= 64 else 128, "BLOCK_N": 64 if l_ >= 64 else 16 if l_ <= 16 else 32,
                 "num_warps": 4 if d <= 64 or s <= 16 else 8, "num_stages": 2},  # fmt: skip
    )
