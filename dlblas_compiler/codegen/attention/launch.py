"""An attention region's launch: the strides of q, k, v and the mask through their views, the output's layout,
the grid; the decode kernel's workspace for the splits' partial results and its counters; under a mask, the
lists of kept key tiles its first two kernels write (prefill.blocks_source)."""

from __future__ import annotations

import torch

from ...dialects import FusedOp
from ...dialects.types import dtype_of, shape_of
from ..kernel import Kernel
from ..source import cdiv, wide_indices
from ..views import Layout, view_chain
from .decode import decode_rows, decode_source
from .dims import fill_score
from .plan import AttentionPlan, out_layout
from .prefill import blocks_source, skips_tiles, source


def build(fused: FusedOp, plan: AttentionPlan, name: str) -> Kernel:
    op = plan.sdpa
    args = list(fused.block.args)
    b, hq, s, _ = shape_of(op.query)
    d, dv = plan.dims
    hk, l_ = shape_of(op.key)[1], shape_of(op.key)[2]
    groups = hq // hk
    has_mask = op.mask is not None
    mask_bool = has_mask and dtype_of(op.mask) == torch.bool
    wide = wide_indices([*args, *fused.yielded.values])
    nan_rows = op.nan_rows and has_mask
    fill = fill_score(op.mode, op.fill)
    if plan.decode:
        src = decode_source(name, has_mask, mask_bool, op.causal, dtype_of(op.result), nan_rows, dtype_of(op.query),
                            (d, dv), wide, op.mode, fill)  # fmt: skip
    else:
        src = source(name, has_mask, mask_bool, op.causal, dtype_of(op.result), (d, dv), wide, nan_rows,
                     dtype_of(op.query), op.mode, fill)  # fmt: skip
    listed = not plan.decode and skips_tiles(has_mask, fill)
    if listed:
        src += "\n\n" + blocks_source(name, mask_bool, op.mode, op.causal, wide)
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
    rows = decode_rows(plan)

    def launch_decode(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        q = ptr(tensors, "q")
        out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
        m = ptr(tensors, "mask") if has_mask else q
        splits, bn = config["SPLITS"], config["BLOCK_N"]
        chunk = cdiv(cdiv(l_, splits), bn) * bn
        if splits > 1:
            ws = torch.empty(b * hk * splits * rows * (dv + 2), dtype=torch.float32, device=q.device)
            cnt = counters.get(q.device)
            if cnt is None or cnt.numel() < b * hk:  # zeroed once; the last program of each (b, hk) resets it
                cnt = counters[q.device] = torch.zeros(b * hk, dtype=torch.int32, device=q.device)
        else:
            ws = cnt = out
        kernel[(b * hk, splits)](
            q, ptr(tensors, "k"), ptr(tensors, "v"), m, out, ws, cnt, *strides, *olay.strides, hk, s, l_, groups, chunk,
            qk_scale, D=d, DV=dv, BLOCK_R=rows, BLOCK_N=bn, SPLITS=splits, num_warps=config["num_warps"],
            num_stages=config["num_stages"],
        )  # fmt: skip
        return [out]

    # the mask's own batches and heads (one list per block of rows of each; a broadcast dimension has one)
    mask_b, mask_h = (1, 1) if not listed else (b if strides[12] and b > 1 else 1, hq if strides[13] and hq > 1 else 1)

    def blocks(kernel, m: torch.Tensor, config: dict) -> tuple:
        """The lists of kept key tiles (prefill.blocks_source), as the kernel's arguments."""
        if not listed:
            return ()
        bm, bn = config["BLOCK_M"], config["BLOCK_N"]
        rows, nb = mask_b * mask_h * cdiv(s, bm), cdiv(l_, bn)
        classes = torch.empty(rows * nb, dtype=torch.int8, device=m.device)
        lists = torch.empty(rows * 2 * nb, dtype=torch.int32, device=m.device)
        counts = torch.empty(rows * 2, dtype=torch.int32, device=m.device)
        classify, compact = (kernel.variant(v) if hasattr(kernel, "variant") else kernel.variants[v]
                             for v in ("blocks", "lists"))  # (on the interpreter: the jitted functions themselves)
        classify[(nb, cdiv(s, bm), mask_b * mask_h)](m, classes, *strides[12:], mask_h, s, l_, nb, BLOCK_M=bm,
                                                    BLOCK_N=bn, num_warps=4)  # fmt: skip
        compact[(rows,)](classes, lists, counts, nb, CHUNK=128, num_warps=4)
        return lists, counts, mask_h * cdiv(s, bm) if mask_b > 1 else 0, cdiv(s, bm) if mask_h > 1 else 0, nb

    def launch(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        q = ptr(tensors, "q")
        out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
        m = ptr(tensors, "mask") if has_mask else q
        grid = (cdiv(s, config["BLOCK_M"]), b * hq)
        kernel[grid](
            q, ptr(tensors, "k"), ptr(tensors, "v"), m, out, *strides, *olay.strides, hq, s, l_, groups, qk_scale,
            *blocks(kernel, m, config), D=d, DV=dv, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
            num_warps=config["num_warps"], num_stages=config["num_stages"],
        )  # fmt: skip
        return [out]

    causal_frac = 0.5 if op.causal else 1.0
    flops = 2.0 * b * hq * s * l_ * (d + dv) * causal_frac
    nbytes = (b * hq * s * (d + dv) + b * hk * l_ * (d + dv)) * elem
    run = launch_decode if plan.decode else launch
    return Kernel(name, src, run, fused, {"S": s, "L": l_, "D": d, "DV": dv, "H": hq}, flops, nbytes)
