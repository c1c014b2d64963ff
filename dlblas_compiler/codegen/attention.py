"""The attention template: flash attention (online softmax, exp2) for a `dl.sdpa` region.

q [B, Hq, S, D], k/v [B, Hk, L, D], GQA (Hq a multiple of Hk), causal (top-left aligned, as torch's
is_causal) and/or an additive float or boolean mask broadcast to [B, Hq, S, L]. The views that
produce q/k/v (head reshapes and transposes) and those that consume the output (transpose back and
merge heads) are fused as strides, so the kernel reads projections and writes [B, S, H*D] directly.

Two kernels, chosen by the query length:
  prefill (S > DECODE_ROWS)  one program per block of BLOCK_M query rows of one head, looping over all keys; a
                             key tile the mask keeps nothing of (a materialized causal mask's upper triangle) is
                             skipped after reading the mask tile.
  decode  (S <= DECODE_ROWS) split-KV flash decoding: one program per (batch, KV head, split of the keys) takes
                             the S query rows of every query head sharing that KV head (GQA: each K/V tile is
                             read once for the group), and the last program of a (batch, KV head) to finish (an
                             acq_rel counter) combines the splits' partial softmaxes. A key tile whose mask keeps
                             nothing (a static cache's unused tail) reads no K/V: the traffic follows the valid
                             length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from xdsl.ir import Operation, SSAValue

from ..dialects import FusedOp, PermuteOp, ReshapeOp, SDPAOp
from ..dialects.types import dtype_of, shape_of
from ..fusion.templates import KernelTemplate, WhyNot, register_template
from ..tuning.space import SearchSpace
from . import device
from .kernel import Kernel
from .source import PDL_ARG, TL_DTYPE, Writer, cdiv, chained_start, wide_indices
from .views import VIEW_OPS, Layout, view_chain, view_source


DECODE_ROWS = 16  # query rows up to which the split-KV decode kernel runs


@dataclass
class AttentionPlan:
    sdpa: SDPAOp
    chains: dict[str, tuple[SSAValue, list[Operation]]]  # q/k/v/mask -> (region input, view chain)
    out_chain: list[Operation]  # views from the sdpa result to the region output

    @property
    def decode(self) -> bool:
        return shape_of(self.sdpa.query)[2] <= DECODE_ROWS

    @property
    def output(self) -> SSAValue:
        return self.out_chain[-1].results[0] if self.out_chain else self.sdpa.result


def out_layout(chain: list[Operation], final_shape: tuple[int, ...]) -> Layout | None:
    """Where the sdpa result's elements land in a contiguous buffer of the final view's shape."""
    lay = Layout.contiguous(final_shape)
    for op in reversed(chain):
        src = tuple(op.operands[0].type.get_shape())
        if isinstance(op, ReshapeOp):
            try:
                t = lay.meta().view(src)
            except RuntimeError:
                return None
            lay = Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
        elif isinstance(op, PermuteOp):
            inv = [0] * len(op.permutation)
            for i, p in enumerate(op.permutation):
                inv[p] = i
            t = lay.meta().permute(inv)
            lay = Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
        else:
            return None
    return lay


def analyze(ops: list[Operation], inputs: list[SSAValue]) -> AttentionPlan | str:
    sdpas = [o for o in ops if isinstance(o, SDPAOp)]
    if len(sdpas) != 1 or not all(isinstance(o, VIEW_OPS) for o in ops if o is not sdpas[0]):
        return "an attention region is one sdpa plus views"
    op = sdpas[0]
    inside = set(ops)
    q, k, v = (shape_of(x) for x in (op.query, op.key, op.value))
    if len(q) != 4:
        return f"attention needs [B, H, S, D] operands, got {q}"
    d = q[-1]
    if d not in (16, 32, 64, 128, 256) or v[-1] != d:
        return f"head dim {d} (value dim {v[-1]}): the template takes 16..256, powers of two, equal dims"
    if min(q[2], k[2]) < 1:
        return "empty sequence"
    chains = {}
    for name, val in (("q", op.query), ("k", op.key), ("v", op.value), ("mask", op.mask)):
        if val is None:
            continue
        found = view_source(val, inside, inputs)
        if found is None:
            return f"{name} is not a region input read through views"
        base, chain = found
        if view_chain(Layout.contiguous(shape_of(base)), chain) is None:
            return f"the views producing {name} need a copy"
        chains[name] = found
    out_chain, cur = [], op.result
    while True:
        users = [u.operation for u in cur.uses if u.operation in inside]
        if not users:
            break
        if len(users) != 1 or not cur.has_one_use():
            return "the attention output is used twice inside the region"
        out_chain.append(users[0])
        cur = users[0].results[0]
    if out_layout(out_chain, shape_of(cur)) is None:
        return "the views of the output need a copy"
    return AttentionPlan(op, chains, out_chain)


def source(
    name: str, has_mask: bool, mask_bool: bool, causal: bool, out_dtype: torch.dtype, wide: bool = False,
    nan_rows: bool = False, in_dtype: torch.dtype = torch.float16,
) -> str:
    """The kernel text. Scores are kept in log2 units (q pre-scaled by scale * log2(e), exp2), except with an
    additive float mask: mask values as large as the dtype's minimum would overflow once multiplied by log2(e),
    so scores stay in natural units and exp2 takes (s - max) * log2(e). A row whose keys are all masked out
    gives 0 (SDPA's), or NaN with `nan_rows` (an explicit softmax's)."""
    float_mask = has_mask and not mask_bool
    w = Writer()
    w("@triton.jit")
    w(f"def {name}(")
    w.indent()
    w("q_ptr, k_ptr, v_ptr, m_ptr, o_ptr,")
    w("sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,")
    w("sm_b, sm_h, sm_s, sm_l, so_b, so_h, so_s, so_d,")
    w("H, S, L, GROUPS, qk_scale,")
    w("D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, " + PDL_ARG)
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
    w("rd = tl.arange(0, D)")
    w("mmask = rm < S")
    w("q = tl.load(q_ptr + b * sq_b + h * sq_h + rm[:, None] * sq_s + rd[None, :] * sq_d, mask=mmask[:, None], other=0.0)")
    if float_mask:
        w("q = (q.to(tl.float32) * qk_scale).to(q.dtype)  # scores in natural units (the mask is added as it is)")
    else:
        w("q = (q.to(tl.float32) * qk_scale).to(q.dtype)  # scores come out in log2 units")
    w("m_i = tl.full((BLOCK_M,), float('-inf'), tl.float32)")
    w("l_i = tl.zeros((BLOCK_M,), tl.float32)")
    w("acc = tl.zeros((BLOCK_M, D), tl.float32)")
    w("k_base = k_ptr + b * sk_b + hk * sk_h")
    w("v_base = v_ptr + b * sv_b + hk * sv_h")
    # blocks entirely below the diagonal (or before L's ragged tail) need no mask
    if has_mask:
        w("full = 0")
    elif causal:
        w("full = tl.minimum(pid_m * BLOCK_M, L) // BLOCK_N * BLOCK_N")
    else:
        w("full = L // BLOCK_N * BLOCK_N")
    w("hi = (pid_m + 1) * BLOCK_M" if causal else "hi = L")
    for masked in (False, True):
        w("for start in range(0, full, BLOCK_N):" if not masked else "for start in range(full, hi, BLOCK_N):")
        w.indent()
        w("rn = start + tl.arange(0, BLOCK_N)" + (".to(tl.int64)" if wide else ""))
        if masked:
            w("nmask = rn < L")
            w("keep = nmask[None, :] & mmask[:, None]")
            if causal:
                w("keep = keep & (rn[None, :] <= rm[:, None])")
        if masked and has_mask:  # the mask tile first: a tile it keeps nothing of (the causal upper triangle that
            # a materialized mask spells, a cache's unused tail) costs no K/V reads and no dots
            w("mv = tl.load(m_ptr + b * sm_b + h * sm_h + rm[:, None] * sm_s + rn[None, :] * sm_l, mask=keep, other=0)")
            w("keep = keep & (mv != 0)" if mask_bool else "keep = keep & (mv.to(tl.float32) != float('-inf'))")
            w("if tl.max(keep.to(tl.int32)) > 0:")
            w.indent()
        if masked:
            w("k = tl.load(k_base + rn[:, None] * sk_s + rd[None, :] * sk_d, mask=nmask[:, None], other=0.0)")
        else:
            w("k = tl.load(k_base + rn[:, None] * sk_s + rd[None, :] * sk_d)")
        w(f"s = tl.dot(q, tl.trans(k){device.dot_args(in_dtype)})")
        if masked:
            if has_mask and not mask_bool:
                w("s = s + mv.to(tl.float32)")
            w("s = tl.where(keep, s, float('-inf'))")
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
        if masked:
            w("v = tl.load(v_base + rn[:, None] * sv_s + rd[None, :] * sv_d, mask=nmask[:, None], other=0.0)")
        else:
            w("v = tl.load(v_base + rn[:, None] * sv_s + rd[None, :] * sv_d)")
        w(f"acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v{device.dot_args(in_dtype)})")
        w("m_i = m_new")
        if masked and has_mask:
            w.dedent()
        w.dedent()
    if nan_rows:
        w("out = acc / tl.where(mmask, l_i, 1.0)[:, None]  # a fully masked row: 0 / 0 = NaN, as softmax gives")
    else:
        w("out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a fully masked row: 0, as SDPA gives")
    w(f"tl.store(o_ptr + b * so_b + h * so_h + rm[:, None] * so_s + rd[None, :] * so_d, out.to({TL_DTYPE[out_dtype]}), mask=mmask[:, None])")
    w.dedent()
    return w.text()


def decode_source(
    name: str, has_mask: bool, mask_bool: bool, causal: bool, out_dtype: torch.dtype, nan_rows: bool,
    in_dtype: torch.dtype, wide: bool = False,
) -> str:
    """The split-KV decode kernel (see the module docstring). Rows r = g * S + s of a program are query head
    hk * GROUPS + g at query position s; partial results go to `ws` as (max, sum, acc) per row, in the same
    score units as the prefill kernel's."""
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
    w("D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, " + PDL_ARG)
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
    w("rd = tl.arange(0, D)")
    w("q = tl.load(q_ptr + b * sq_b + h[:, None] * sq_h + si[:, None] * sq_s + rd[None, :] * sq_d, mask=rmask[:, None], other=0.0)")
    w("q = (q.to(tl.float32) * qk_scale).to(q.dtype)")
    w("m_i = tl.full((BLOCK_R,), float('-inf'), tl.float32)")
    w("l_i = tl.zeros((BLOCK_R,), tl.float32)")
    w("acc = tl.zeros((BLOCK_R, D), tl.float32)")
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
        if mask_bool:
            w("keep = keep & (mv != 0)")
        else:
            w("keep = keep & (mv.to(tl.float32) != float('-inf'))")
    w("# a tile no row keeps (a cache's unused tail) reads no K/V: its loads are masked off, not branched")
    w("# around, so the K and V loads of a tile issue together and the loop can be pipelined")
    w("live = nmask & (tl.max(keep.to(tl.int32)) > 0)")
    w("k = tl.load(k_base + rn[:, None] * sk_s + rd[None, :] * sk_d, mask=live[:, None], other=0.0)")
    w("v = tl.load(v_base + rn[:, None] * sv_s + rd[None, :] * sv_d, mask=live[:, None], other=0.0)")
    w(f"s = tl.dot(q, tl.trans(k){dot})")
    if float_mask:
        w("s = s + mv.to(tl.float32)")
    w("s = tl.where(keep, s, float('-inf'))")
    w("m_new = tl.maximum(m_i, tl.max(s, axis=1))")
    w("m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)")
    w(f"p = tl.exp2((s - m_safe[:, None]){to_log2})")
    w(f"alpha = tl.exp2((m_i - m_safe){to_log2})")
    w("l_i = l_i * alpha + tl.sum(p, axis=1)")
    w(f"acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v{dot})")
    w("m_i = m_new")
    w.dedent()
    w("if SPLITS > 1:  # partial results of this split; the last split of (b, hk) to finish combines them")
    w.indent()
    w("part = ws_ptr + (bh * SPLITS + split) * BLOCK_R * (D + 2)")
    w("tl.store(part + r, m_i)")
    w("tl.store(part + BLOCK_R + r, l_i)")
    w("tl.store(part + 2 * BLOCK_R + r[:, None] * D + rd[None, :], acc)")
    w('last = tl.atomic_add(cnt_ptr + bh, 1, sem="acq_rel") == SPLITS - 1')
    w("if last:")
    w.indent()
    w("mx = tl.full((BLOCK_R,), float('-inf'), tl.float32)")
    w("for j in range(SPLITS):")
    w('    mx = tl.maximum(mx, tl.load(ws_ptr + (bh * SPLITS + j) * BLOCK_R * (D + 2) + r, cache_modifier=".cg"))')
    w("mx = tl.where(mx == float('-inf'), 0.0, mx)")
    w("l_i = tl.zeros((BLOCK_R,), tl.float32)")
    w("acc = tl.zeros((BLOCK_R, D), tl.float32)")
    w("for j in range(SPLITS):")
    w.indent()
    w("part = ws_ptr + (bh * SPLITS + j) * BLOCK_R * (D + 2)")
    w(f'sc = tl.exp2((tl.load(part + r, cache_modifier=".cg") - mx){to_log2})')
    w('l_i += tl.load(part + BLOCK_R + r, cache_modifier=".cg") * sc')
    w('acc += tl.load(part + 2 * BLOCK_R + r[:, None] * D + rd[None, :], cache_modifier=".cg") * sc[:, None]')
    w.dedent()
    w("tl.atomic_xchg(cnt_ptr + bh, 0)")
    w.dedent()
    w.dedent()
    w("else:")
    w("    last = True")
    w("if last:")
    w.indent()
    if nan_rows:
        w("out = acc / tl.where(rmask, l_i, 1.0)[:, None]  # a fully masked row: 0 / 0 = NaN, as softmax gives")
    else:
        w("out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a fully masked row: 0, as SDPA gives")
    w(f"tl.store(o_ptr + b * so_b + h[:, None] * so_h + si[:, None] * so_s + rd[None, :] * so_d, out.to({TL_DTYPE[out_dtype]}), mask=rmask[:, None])")
    w.dedent()
    w.dedent()
    return w.text()


def build(fused: FusedOp, plan: AttentionPlan, name: str) -> Kernel:
    op = plan.sdpa
    args = list(fused.block.args)
    b, hq, s, d = shape_of(op.query)
    hk, l_ = shape_of(op.key)[1], shape_of(op.key)[2]
    groups = hq // hk
    has_mask = op.mask is not None
    mask_bool = has_mask and dtype_of(op.mask) == torch.bool
    wide = wide_indices([*args, *fused.yielded.values])
    nan_rows = op.nan_rows and has_mask
    if plan.decode:
        src = decode_source(name, has_mask, mask_bool, op.causal, dtype_of(op.result), nan_rows, dtype_of(op.query), wide)
    else:
        src = source(name, has_mask, mask_bool, op.causal, dtype_of(op.result), wide, nan_rows, dtype_of(op.query))
    strides, idx = [], {}
    for key in ("q", "k", "v", "mask"):
        if key not in plan.chains:
            strides += [0, 0, 0, 0]
            continue
        base, chain = plan.chains[key]
        idx[key] = args.index(base)
        lay = view_chain(Layout.contiguous(shape_of(base)), chain)
        target = (b, hq, s, l_) if key == "mask" else None
        if target is not None:
            lay = lay.broadcast_to(target)
        strides += [*lay.strides]
        if lay.offset:
            idx[key] = (idx[key], lay.offset)
    out_val = plan.output
    out_shape, out_dtype = shape_of(out_val), dtype_of(out_val)
    olay = out_layout(plan.out_chain, out_shape)
    offsets = {k: v[1] for k, v in idx.items() if isinstance(v, tuple)}
    idx = {k: (v[0] if isinstance(v, tuple) else v) for k, v in idx.items()}
    qk_scale = op.softmax_scale * (1.0 if has_mask and not mask_bool else 1.4426950408889634)
    elem = dtype_of(op.query).itemsize

    def ptr(tensors, key):
        t = tensors[idx[key]]
        return t.view(-1)[offsets[key]:] if key in offsets else t

    counters: dict[torch.device, torch.Tensor] = {}
    rows = _decode_rows(plan)

    def launch_decode(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        q = ptr(tensors, "q")
        out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
        m = ptr(tensors, "mask") if has_mask else q
        splits, bn = config["SPLITS"], config["BLOCK_N"]
        chunk = cdiv(cdiv(l_, splits), bn) * bn
        if splits > 1:
            ws = torch.empty(b * hk * splits * rows * (d + 2), dtype=torch.float32, device=q.device)
            cnt = counters.get(q.device)
            if cnt is None or cnt.numel() < b * hk:  # zeroed once; the last program of each (b, hk) resets it
                cnt = counters[q.device] = torch.zeros(b * hk, dtype=torch.int32, device=q.device)
        else:
            ws = cnt = out
        kernel[(b * hk, splits)](
            q, ptr(tensors, "k"), ptr(tensors, "v"), m, out, ws, cnt, *strides, *olay.strides, hk, s, l_, groups, chunk,
            qk_scale, D=d, BLOCK_R=rows, BLOCK_N=bn, SPLITS=splits, num_warps=config["num_warps"],
            num_stages=config["num_stages"],
        )  # fmt: skip
        return [out]

    def launch(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        q = ptr(tensors, "q")
        out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
        m = ptr(tensors, "mask") if has_mask else q
        grid = (cdiv(s, config["BLOCK_M"]), b * hq)
        kernel[grid](
            q, ptr(tensors, "k"), ptr(tensors, "v"), m, out, *strides, *olay.strides, hq, s, l_, groups, qk_scale,
            D=d, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
            num_warps=config["num_warps"], num_stages=config["num_stages"],
        )  # fmt: skip
        return [out]

    causal_frac = 0.5 if op.causal else 1.0
    flops = 4.0 * b * hq * s * l_ * d * causal_frac
    nbytes = (b * hq * s * d * 2 + 2 * b * hk * l_ * d) * elem
    run = launch_decode if plan.decode else launch
    return Kernel(name, src, run, fused, {"S": s, "L": l_, "D": d, "H": hq}, flops, nbytes)


PARAMS = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [4, 8], "num_stages": [1, 2, 3, 4]}


DECODE_PARAMS = {"BLOCK_N": [16, 32, 64, 128], "SPLITS": [1, 2, 4, 8, 16, 32], "num_warps": [4, 8], "num_stages": [1, 2, 3, 4]}


def _decode_rows(plan: AttentionPlan) -> int:
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
    b, _, _, d = shape_of(op.query)
    hk, l_ = shape_of(op.key)[1], shape_of(op.key)[2]
    rows, elem, smem, sms = _decode_rows(plan), dtype_of(op.query).itemsize, device.smem_limit(), device.sm_count()
    splits = 1
    while splits < 16 and b * hk * splits * 2 <= sms and l_ // (splits * 2) >= 96:
        splits *= 2
    block_n = 64 if l_ // splits >= 64 else max(16, min(32, triton.next_power_of_2(l_)))
    stages = 3
    while stages > 1 and (rows + 2 * block_n) * d * elem * stages > smem:
        stages -= 1
    return SearchSpace(
        DECODE_PARAMS,
        {
            "no block much larger than L": lambda c: c["BLOCK_N"] <= max(16, triton.next_power_of_2(l_)),
            "every split holds a tile": lambda c: c["SPLITS"] == 1 or cdiv(l_, c["SPLITS"]) >= c["BLOCK_N"],
            "shared memory": lambda c: (rows + 2 * c["BLOCK_N"]) * d * elem * c["num_stages"] <= smem,
            "registers": lambda c: rows * (d + c["BLOCK_N"]) <= 96 * 32 * c["num_warps"],
        },
        default={"BLOCK_N": block_n, "SPLITS": splits, "num_warps": 4, "num_stages": stages},
    )


def space(plan: AttentionPlan) -> SearchSpace:
    """Query and key blocks within the lengths, shared memory for the q, k and v tiles, and registers."""
    if plan.decode:
        return decode_space(plan)
    op = plan.sdpa
    _, _, s, d = shape_of(op.query)
    l_ = shape_of(op.key)[2]
    elem, smem = dtype_of(op.query).itemsize, device.smem_limit()
    return SearchSpace(
        PARAMS,
        {
            "no block much larger than S": lambda c: c["BLOCK_M"] <= max(16, triton.next_power_of_2(s)),
            "no block much larger than L": lambda c: c["BLOCK_N"] <= max(16, triton.next_power_of_2(l_)),
            "shared memory": lambda c: (c["BLOCK_M"] + 2 * c["BLOCK_N"]) * d * elem * c["num_stages"] <= smem,
            "registers": lambda c: c["BLOCK_M"] * (d + c["BLOCK_N"]) <= 96 * 32 * c["num_warps"],
        },
        default={"BLOCK_M": 16 if s <= 16 else 64 if s <= 64 else 128, "BLOCK_N": 64 if l_ >= 64 else 16 if l_ <= 16 else 32,
                 "num_warps": 4 if d <= 64 or s <= 16 else 8, "num_stages": 2},  # fmt: skip
    )


class AttentionTemplate(KernelTemplate):
    """Flash attention for one dl.sdpa, reading q/k/v through the views that produce them and writing through
    the views of its output."""

    name = "attention"
    params = PARAMS

    def can_lower(self, ops: list[Operation], inputs: list[SSAValue]) -> AttentionPlan | WhyNot:
        plan = analyze(ops, inputs)
        return WhyNot(plan) if isinstance(plan, str) else plan

    def emit(self, fused: FusedOp, plan: AttentionPlan, name: str) -> Kernel:
        return build(fused, plan, name)

    def space(self, plan: AttentionPlan) -> SearchSpace:
        return space(plan)


register_template(AttentionTemplate())
