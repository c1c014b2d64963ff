"""A GEMM region's launch: the strides of its operands and outputs in canonical order, the row passes before the
kernel (a norm pass, the RMSNorm statistics), cuBLAS's product for MM configs, split-K's workspace and counters,
and the kernel's grid and arguments."""

from __future__ import annotations

import torch
import triton

from ...dialects import FusedOp, LayerNormOp
from ...dialects.types import dtype_of, numel, shape_of
from .. import device
from ..interpreter import launch as launch_lib
from ..kernel import Kernel, warming_up
from ..source import cdiv
from . import cublas, warp_specialized
from .emitter import GemmEmitter
from .norms import row_layer_norm, row_norm, row_rms
from .plan import GemmPlan, whole_tiles

RS_INLINE_ROWS = 16  # up to this many rows the GEMM computes the norm statistics itself (prologue.row_scale)


def build(fused: FusedOp, plan: GemmPlan, name: str) -> Kernel:
    em = GemmEmitter(plan, fused, name)
    src = em.source()
    st = em.staging
    plan.tma_epilogue = st is not None  # (the space offers WS=2 configs)
    staged_ext = em.ext_operand(st.ext)[0] if st is not None and st.ext is not None else None
    m = numel(plan.rows)
    args = list(fused.block.args)
    ext_strides: list[int] = []
    ext_args: list[int] = []
    for j in range(len(em.ext)):
        arg, strides = em.ext_operand(j)
        ext_strides += strides
        ext_args.append(arg)
    out_shapes = [shape_of(r) for r in em.outputs]
    out_dtypes = [dtype_of(r) for r in em.outputs]
    # outputs written into an input at indexed positions (k and v into a KV cache): (output, destination, index)
    scatters = [(k, args.index(o.dest), args.index(o.index))
                for k, r in enumerate(em.outputs) if (o := plan.scatters.get(r))]  # fmt: skip
    ix_args = [i for _, _, i in scatters]
    ix_sizes = [shape_of(plan.scatters[r].dest)[plan.scatters[r].axis] for r in em.outputs if r in plan.scatters]
    out_strides = [s for k in range(len(em.outputs)) for s in em.out_strides(k)]
    lin = plan.linear
    x_arg = args.index(plan.norm.input if plan.norm else lin.input)
    w_arg = args.index(lin.weight)
    pre = [x_arg, w_arg]
    if lin.bias is not None:
        pre.append(args.index(lin.bias))
    if plan.rms is not None and plan.rms.weight is not None:
        pre.append(args.index(plan.rms.weight))
    if plan.ln is not None:  # (read by the K loop where it normalizes a few rows itself: prologue.py)
        pre += [args.index(plan.ln.weight), args.index(plan.ln.bias)]
    row_sizes = list(plan.rows[1:])
    ns = len(plan.streams)
    gn, k = plan.grid_n, plan.k
    elem = dtype_of(lin.input).itemsize
    counters: dict[torch.device, torch.Tensor] = {}
    has_norm, ln = plan.norm is not None, isinstance(plan.norm, LayerNormOp)
    eps, offset, scale_f32 = plan.rms.attrs if plan.rms else (plan.norm.eps.value.data, 0.0, False) if ln else (0.0, 0.0, False)
    nw_arg = args.index(plan.norm.weight) if has_norm and plan.norm.weight is not None else None
    nb_arg = args.index(plan.norm.bias) if ln else None

    k_pow2 = triton.next_power_of_2(k)  # (a jitted helper in Triton: ~5 µs a call)
    # the row passes (the normalized rows, or an RMSNorm's statistics alone) read whole rows of up to 8192 columns
    # at once, 8192 // kb rows a program, 8 warps: the statistics in 4-row, 1024-column steps with 4 warps took
    # 1.1-2.4x as long on an H200 (M = 32-2048, K = 3072-16384; bench/NOTES.md 178)
    kb = min(8192, k_pow2)
    rows = max(1, 8192 // kb)

    def launch(kernel, tensors: list[torch.Tensor], config: dict) -> list[torch.Tensor]:
        if config["MM"] == 2:  # cuBLAS adds the product into the residual, which nothing reads afterwards (no kernel:
            # nothing to compile for a warm-up, which runs on the caller's tensors)
            if warming_up(kernel):
                return []
            return [cublas.add_into_residual(tensors[x_arg], tensors[w_arg], tensors[plan.residual_in_place], m,
                                              out_shapes[0])]  # fmt: skip
        dev = tensors[x_arg].device
        outs = [torch.empty(s, dtype=dt, device=dev) for s, dt in zip(out_shapes, out_dtypes)]
        for o, dest, _ in scatters:  # the destination itself (the caller passes its own tensor, or a copy of it)
            outs[o] = tensors[dest]
        bm, bn, bk, sk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
        tiles = cdiv(m, bm) * cdiv(gn, bn)
        k_split = cdiv(cdiv(k, sk), bk) * bk
        persistent = config["PERSISTENT"]
        programs = min(tiles, device.sm_count())
        # SPLIT_K > 1 splits every tile over K, or a persistent kernel's last wave (the tiles past `dp_tiles`)
        dp_tiles = whole_tiles(tiles, programs, sk) if persistent and sk > 1 else 0
        if sk > 1:  # (a workspace slot per split tile and part; after them a one-row tile's sums of squares)
            ws = torch.empty(max(1, sk * (tiles - dp_tiles) * (ns * bm * bn + bm)), dtype=torch.float32, device=dev)
            cnt = counters.get(dev)
            if cnt is None or cnt.numel() < tiles:  # zeroed once; the last program of each tile resets its counter
                cnt = counters[dev] = torch.zeros(max(tiles, cdiv(m, 16) * cdiv(gn, 16)), dtype=torch.int32, device=dev)
        else:  # (no tile splits: unused)
            ws = cnt = outs[0]
        mm, normed = config["MM"] == 1, has_norm and config["NORM_PASS"]
        ins = [tensors[i] for i in pre]
        if normed:  # the normalized rows (as eager computes them) written once: the K loop reads them as they are
            xn = torch.empty(m, k, dtype=ins[1].dtype, device=dev)
            grid = (cdiv(m, rows),)
            if ln:
                launch_lib(row_layer_norm, grid, dev, ins[0], tensors[nw_arg], tensors[nb_arg], xn, m, k, eps,
                           K_BLOCK=kb, ROWS=rows, ONE_PASS=kb >= k, num_warps=8)  # fmt: skip
            else:
                launch_lib(row_norm, grid, dev, ins[0], tensors[nw_arg] if nw_arg is not None else xn, xn, m, k, eps,
                           offset, HAS_W=nw_arg is not None, SCALE_F32=scale_f32, K_BLOCK=kb, ROWS=rows,
                           ONE_PASS=kb >= k, num_warps=8)  # fmt: skip
            ins[0] = xn
        # MM: cuBLAS computes the product and the kernel is the epilogue
        prod = torch.matmul(ins[0].reshape(m, k), ins[1].t()) if mm else outs[0]
        rs_inline = has_norm and m <= RS_INLINE_ROWS and not normed
        if has_norm and not rs_inline and not normed:  # an RMSNorm's row statistics: one pass over x, read by the
            # GEMM's epilogue (a LayerNorm without a pass has few rows, whose statistics the K loop computes)
            rs = torch.empty(m, dtype=torch.float32, device=dev)
            launch_lib(row_rms, (cdiv(m, rows),), dev, tensors[x_arg], rs, m, k, eps, K_BLOCK=kb, ROWS=rows,
                       num_warps=8)
        else:
            rs = outs[0]
        tma = config["TMA"] and all(t.data_ptr() % 16 == 0 for t in ins[:2])
        if tma:
            device.descriptor_scratch()
        args = (*ins, *[tensors[i] for i in ext_args], *outs, *[tensors[i] for i in ix_args], *ix_sizes, prod, ws, cnt,
                rs, m, *row_sizes, *ext_strides, *out_strides, dp_tiles)  # fmt: skip
        consts = dict(K=k, GRID_N=gn, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"], SPLIT_K=sk,
                      K_SPLIT=k_split, EVEN_K=k % (bk * sk) == 0, TMA=bool(tma), RS_INLINE=rs_inline,
                      RS_BLOCK=max(64, min(2048 // bm, k_pow2)), MM=int(mm), NORMED=bool(normed))  # fmt: skip
        warps = config["num_warps"]
        if config.get("WS"):  # the warp-specialized Gluon kernel (warp_specialized.py): persistent, TMA tiles
            if not tma or not hasattr(kernel, "variant"):
                raise ValueError(f"{name}: a warp-specialized (WS) config needs TMA-aligned operands on an sm90 GPU")
            regs = {"maxnreg": warp_specialized.MAXNREG} if warps == 8 else {}
            # WS=2: the TMA epilogue, unless the residual it would copy by TMA is not 16-byte aligned (a view at an
            # odd offset): then the same kernel stores by pointer (WS=1)
            epi_tma = config["WS"] == 2 and (staged_ext is None or tensors[staged_ext].data_ptr() % 16 == 0)
            kernel.variant("ws")[(programs,)](*args, **consts, STAGES=config["num_stages"], EPI_TMA=epi_tma,
                                              num_warps=warps, **regs)  # fmt: skip
            return outs
        grid = (programs, 1) if persistent else (tiles, sk)
        kernel[grid](*args, **consts, PERSISTENT=bool(persistent), num_warps=warps, num_stages=config["num_stages"])
        return outs

    flops = 2.0 * m * k * gn * ns
    stored = [shape_of(plan.scatters[r].source) if r in plan.scatters else shape_of(r) for r in em.outputs]
    nbytes = (m * k + plan.n * k) * elem + sum(numel(s) * dt.itemsize for s, dt in zip(stored, out_dtypes))
    nbytes += sum(numel(shape_of(v)) * dtype_of(v).itemsize for v, _, _ in em.ext)
    over = () if plan.residual_in_place is None else (plan.residual_in_place,)  # (MM=2 writes the residual)
    return Kernel(name, src, launch, fused, {"M": m, "N": gn, "K": k, "streams": ns}, flops, nbytes, overwrites=over)
