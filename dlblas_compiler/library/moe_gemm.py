"""Fused mixture-of-experts with SwiGLU experts: a grouped GEMM over the tokens routed to each expert.

    out = fused_moe(x, w_gate_up, w_down, topk_ids, topk_weights)

x [T, H]; w_gate_up [E, 2I, H] (rows [0, I) the gate projection, [I, 2I) the up projection; or, with w_up
[E, I, H] given, w_gate_up is the gate [E, I, H]); w_down [E, H, I]; topk_ids [T, k] int (experts in [0, E), -1
(or any id outside [0, E)) for a dropped slot, as topk_gating returns); topk_weights [T, k]. Weights are
nn.Linear-style (out, in); any strides. Returns out [T, H] in x's dtype:

    out[t] = sum_j topk_weights[t, j] * w_down[e] @ (silu(w_gate[e] @ x[t]) * (w_up[e] @ x[t])),  e = ids[t, j]

Two implementations, chosen by the config's IMPL (`default_config` picks by the rows per expert); neither waits
for the device.

"triton": the (token, slot) pairs are sorted by expert and each expert's group padded to a multiple of BLOCK_M
(`moe_align_block_size`, torch ops). Kernel 1 computes h = silu(x W_gate^T) * (x W_up^T) for each block of pairs
(two accumulators, fused epilogue); kernel 2 computes y = topk_weight * (h W_down^T) per pair; kernel 3 sums each
token's k rows of y. Accumulation is float32; h and y are stored in x's dtype.

"grouped": the kept pairs are sorted by expert (dropped ones last) and the rows of x gathered into that order;
torch._grouped_mm (CUTLASS grouped GEMMs, given each expert's end row on the device) computes [gate | up] =
xs W_gate_up^T, a small kernel h = silu(gate) * up (float32 math), a second grouped GEMM y = h W_down^T, and
kernel 3 sums each token's k rows of y, found by position, times their routing weights (float32). The gate/up
output makes a round trip through memory that the triton path's epilogue saves; it pays where the CUTLASS GEMMs
outrun the Triton ones. It runs where torch._grouped_mm needs no host sync (`grouped_unsupported`), and falls
back to "triton" elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, dot_precision, launch, next_pow2
from .registry import Optional, Scalar, Sig, Tensor, register_op, same_dtype, where


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, b2_ptr, c_ptr, weight_ptr, sorted_pairs_ptr, block_expert_ptr,
    num_pairs, N, K, num_blocks_m,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    A_ROW_DIV: tl.constexpr, SWIGLU: tl.constexpr, MUL_WEIGHT: tl.constexpr, EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """For the pairs p of one block (all routed to expert e): C[p, n] = sum_k A[p // A_ROW_DIV, k] * B[e, n, k],
    with SWIGLU: silu(that) * (the same with B2); with MUL_WEIGHT: times weight[p]."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    group_width = GROUP_M * num_n
    first_m = (pid // group_width) * GROUP_M
    group_m = tl.minimum(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_width) % group_m
    pid_n = (pid % group_width) // group_m

    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_ok = pairs < num_pairs
    a_rows = tl.where(pair_ok, pairs // A_ROW_DIV, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_offs = expert * stride_be + (offs_n % N)[None, :] * stride_bn + offs_k[:, None] * stride_bk
    b_ptrs = b_ptr + b_offs
    b2_ptrs = b2_ptr + b_offs
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if SWIGLU:
            if EVEN_K:
                b2 = tl.load(b2_ptrs)
            else:
                b2 = tl.load(b2_ptrs, mask=k_ok[:, None], other=0.0)
            acc2 = tl.dot(a, b2, acc2, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        b2_ptrs += BLOCK_K * stride_bk
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc2
    if MUL_WEIGHT:
        acc = acc * tl.load(weight_ptr + pairs, mask=pair_ok, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=pair_ok[:, None] & (offs_n < N)[None, :])


@triton.jit
def _moe_sum_kernel(
    y_ptr, ids_ptr, rows_ptr, weight_ptr, out_ptr, H, stride_ym, stride_om, stride_oh,
    TOPK: tl.constexpr, GATHER: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """out[t, h] = sum_j y[p, h] over the slots j with ids[p] >= 0, p = t * TOPK + j; with GATHER, pair p's row of y
    is rows[p] and its term is scaled by weight[p]."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs < H
    acc = tl.zeros((BLOCK_H,), tl.float32)
    for j in tl.static_range(TOPK):
        pair = t * TOPK + j
        routed = tl.load(ids_ptr + pair) >= 0
        if GATHER:
            row = tl.load(rows_ptr + pair).to(tl.int64)
        else:
            row = pair
        y = tl.load(y_ptr + row * stride_ym + offs, mask=h_ok & routed, other=0.0).to(tl.float32)
        if GATHER:
            y *= tl.load(weight_ptr + pair, mask=routed, other=0.0).to(tl.float32)
        acc += y
    tl.store(out_ptr + t * stride_om + offs * stride_oh, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, h_ptr, num_rows_ptr, N, stride_g, stride_u, stride_h, BLOCK_N: tl.constexpr):
    """h[m, n] = silu(g[m, n]) * u[m, n] for the rows m < num_rows (rows past it are left unwritten; one program
    a row, so that those exit at once)."""
    m = tl.program_id(0)
    if m >= tl.load(num_rows_ptr):
        return
    m = m.to(tl.int64)
    for start in range(0, N, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        ok = offs < N
        g = tl.load(g_ptr + m * stride_g + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + m * stride_u + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(h_ptr + m * stride_h + offs, (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gather_rows_kernel(src_ptr, index_ptr, out_ptr, num_rows_ptr, H, stride_src, stride_col, stride_out,
                        BLOCK_H: tl.constexpr):
    """out[m] = src[index[m]] for the rows m < num_rows (rows past it are left unwritten; one program a row)."""
    m = tl.program_id(0)
    if m >= tl.load(num_rows_ptr):
        return
    row = tl.load(index_ptr + m).to(tl.int64)
    for start in range(0, H, BLOCK_H):
        offs = start + tl.arange(0, BLOCK_H)
        ok = offs < H
        tl.store(out_ptr + m.to(tl.int64) * stride_out + offs,
                 tl.load(src_ptr + row * stride_src + offs * stride_col, mask=ok), mask=ok)


def _sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flat pair indices t * k + j sorted by expert, in token order within an expert, dropped slots (id -1)
    last: (sorted expert ids, with E for dropped slots; the pair indices; starts [E + 1], where expert e's group
    begins, starts[E] its end). searchsorted, as bincount would wait for the device."""
    flat = topk_ids.reshape(-1).long()
    sorted_key, order = torch.sort(flat.masked_fill(flat < 0, num_experts), stable=True)
    starts = torch.searchsorted(sorted_key, torch.arange(num_experts + 1, device=flat.device))
    return sorted_key, order, starts


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the (token, slot) pairs by expert, each group padded to a multiple of block_m.

    Returns sorted_pairs [num_blocks * block_m] int32 (the flat pair index t * k + j, in token order within an
    expert; T * k marks padding) and block_expert [num_blocks] int32 (each block's expert; -1 past the last
    group). num_blocks = cdiv(T * k + E * (block_m - 1), block_m) bounds the padded size, so nothing waits for
    the device. Slots with id -1 are left out.
    """
    sorted_key, order, start = _sort_by_expert(topk_ids, num_experts)
    n, dev = order.numel(), order.device
    padded = (start[1:] - start[:-1] + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    num_blocks = triton.cdiv(n + num_experts * (block_m - 1), block_m)
    size = num_blocks * block_m
    expert = sorted_key.clamp(max=num_experts - 1)
    dst = (padded_end - padded)[expert] + torch.arange(n, device=dev) - start[expert]
    dst = dst.masked_fill(sorted_key == num_experts, size)  # dropped slots go to a dump entry
    sorted_pairs = torch.full((size + 1,), n, dtype=torch.int32, device=dev)
    sorted_pairs[dst] = order.to(torch.int32)
    block_start = torch.arange(num_blocks, device=dev) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = block_expert.masked_fill(block_expert >= num_experts, -1).to(torch.int32)
    return sorted_pairs[:size], block_expert


GEMM_PARAMS = ("BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
IMPLS = ("triton", "grouped")
# The default is "grouped" from this many pairs per expert. Measured on one H100 (bench/moe_gemm.py, torch 2.11): the
# Mixtral-like layer crosses over between 128 (triton 1.13x faster) and 256 (grouped 1.08x); the DeepSeek-like one ran
# faster grouped at every count tried (1.03-1.6x at 0.4-384 pairs per expert): there the rule is conservative.
GROUPED_MIN_ROWS = 256


def grouped_mm_fast(dtype: torch.dtype, device: torch.device | str | None) -> bool:
    """Whether torch._grouped_mm runs its CUTLASS kernels for `dtype` on `device`: CUDA, bf16, compute capability
    9.x or 10.x. Elsewhere on CUDA it copies the offsets to the host and loops over the groups."""
    if not hasattr(torch, "_grouped_mm") or device is None or torch.device(device).type != "cuda":
        return False
    return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] in (9, 10)


def _grouped_mm_operand_ok(w: torch.Tensor, align: int) -> bool:
    """Whether torch._grouped_mm takes w^T for a weight w [E, N, K]: a unit stride along N or K, the other stride
    (at least the size of that dim) and the batch stride multiples of `align` elements, on CUDA a 16-byte address."""
    _, stride_n, stride_k = w.stride()
    if stride_k == 1:
        lead, lead_min = stride_n, w.shape[2]
    elif stride_n == 1:
        lead, lead_min = stride_k, w.shape[1]
    else:
        return False
    return lead >= lead_min and lead % align == 0 and w.stride(0) % align == 0 and not (w.is_cuda and w.data_ptr() % 16)


def grouped_unsupported(x: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> str | None:
    """Why the "grouped" path cannot run on these operands, or None if it can. `weights` are the [E, N, K] weights
    multiplied as w^T (w_gate_up, or gate and up; w_down last). torch._grouped_mm must exist, run without a host
    sync on CUDA (`grouped_mm_fast`; on CPU it takes bf16, f16, f32) and accept the operands: fewer than 1024
    groups, rows of H and of I elements whole multiples of 16 bytes, 16-byte aligned weights."""
    if not hasattr(torch, "_grouped_mm"):
        return "this torch has no _grouped_mm"
    if x.is_cuda and not grouped_mm_fast(x.dtype, x.device):
        return "on CUDA, torch._grouped_mm runs without a host sync only for bf16 on compute capability 9.x or 10.x"
    if not x.is_cuda and (x.device.type != "cpu" or x.dtype not in (torch.bfloat16, torch.float16, torch.float32)):
        return f"torch._grouped_mm does not take {x.dtype} on {x.device.type}"
    align = 16 // x.element_size()
    E, H, inter = weights[-1].shape
    if E >= 1024:
        return f"torch._grouped_mm takes fewer than 1024 groups, not {E}"
    if H % align or inter % align:
        return f"H={H} and I={inter} must be multiples of {align} elements (16 bytes)"
    bad = [list(w.stride()) for w in weights if not _grouped_mm_operand_ok(w, align)]
    if bad:
        return f"weight strides {bad}: need a unit stride in the last two dims, the others multiples of 16 bytes"
    return None


def default_config(
    num_pairs: int, num_experts: int, dtype: torch.dtype, device: torch.device | str | None = None
) -> dict[str, Any]:
    """IMPL, and tile configs by the average number of pairs per expert: BLOCK_M (shared by both GEMMs), the gate/up
    GEMM's GEMM_PARAMS, and the down GEMM's as DOWN_<param>. Chosen from sweeps on H100/H200 at Mixtral and DeepSeek
    shapes in bf16; fp32 halves BLOCK_K (its tiles take twice the shared memory). IMPL is "grouped" from
    GROUPED_MIN_ROWS pairs per expert where torch._grouped_mm runs its CUTLASS kernels (`grouped_mm_fast`), else
    "triton"."""
    per_expert = num_pairs / num_experts
    if per_expert <= 16:  # decode: one block per expert, streaming its weights (~90% of HBM bandwidth)
        block_m, gate_up, down = 16, (128, 128, 1, 4, 3), (128, 128, 1, 4, 3)
    else:
        block_m, gate_up, down = 64 if per_expert <= 64 else 128, (128, 64, 16, 8, 4), (256, 64, 8, 8, 4)
    grouped = per_expert >= GROUPED_MIN_ROWS and grouped_mm_fast(dtype, device)
    cfg: dict[str, Any] = {"IMPL": "grouped" if grouped else "triton", "BLOCK_M": block_m}
    cfg.update(zip(GEMM_PARAMS, gate_up, strict=True))
    cfg.update({f"DOWN_{name}": v for name, v in zip(GEMM_PARAMS, down, strict=True)})
    if dtype == torch.float32:
        cfg["BLOCK_K"] //= 2
        cfg["DOWN_BLOCK_K"] //= 2
    return cfg


_GEMM_SPACE = {
    "BLOCK_N": [32, 64, 128, 256],
    "BLOCK_K": [32, 64, 128],
    "GROUP_M": [1, 8, 16],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
}
SPACE: dict[str, list[Any]] = {
    "IMPL": list(IMPLS),
    "BLOCK_M": [16, 32, 64, 128],
    **_GEMM_SPACE,
    **{f"DOWN_{name}": choices for name, choices in _GEMM_SPACE.items()},
}


def _split_gate_up(w_gate_up: torch.Tensor, w_up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if w_up is not None:
        return w_gate_up, w_up
    inter = w_gate_up.shape[1] // 2
    return w_gate_up[:, :inter], w_gate_up[:, inter:]


def _check_shapes(
    x: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
) -> None:
    T, H = x.shape
    E, inter, _ = gate.shape
    shapes = {"gate": gate.shape, "up": up.shape, "w_down": w_down.shape, "topk_weights": topk_weights.shape}
    want = {"gate": (E, inter, H), "up": (E, inter, H), "w_down": (E, H, inter), "topk_weights": topk_ids.shape}
    bad = [f"{n} is {list(shapes[n])}, expected {list(want[n])}" for n in shapes if tuple(shapes[n]) != want[n]]
    if topk_ids.shape[0] != T:
        bad.append(f"topk_ids has {topk_ids.shape[0]} rows, x has {T}")
    if bad:
        raise ValueError(f"fused_moe: x [T={T}, H={H}], gate [E={E}, I={inter}, H]: " + "; ".join(bad))


def fused_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_up: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """SwiGLU mixture of experts over routed tokens (see the module docstring); writes `out` [T, H] if given.
    `config` overrides entries of the config (`default_config`; keys of `SPACE`); IMPL "grouped" falls back to
    "triton" where `grouped_unsupported` says why. Arguments its registered signature refuses (float64, mixed
    dtypes, float ids) raise OpMatchError, as get_op's match would."""
    gate, up = _split_gate_up(w_gate_up, w_up)
    _check_shapes(x, gate, up, w_down, topk_ids, topk_weights)
    _TRITON_SIG.check("fused_moe", (x, w_gate_up, w_down, topk_ids, topk_weights, w_up, out, config))
    T, H = x.shape
    E, inter, _ = gate.shape
    k = topk_ids.shape[1]
    num_pairs = T * k
    cfg = {**default_config(num_pairs, E, x.dtype, x.device), **(config or {})}
    if config and "IMPL" not in config and any(name in config for name in SPACE if name != "IMPL"):
        cfg["IMPL"] = "triton"  # tiles given: they are the triton path's
    if cfg["IMPL"] not in IMPLS:
        raise ValueError(f"fused_moe: IMPL={cfg['IMPL']!r}, expected one of {IMPLS}")
    if out is None:  # (row-major whatever x's strides: empty_like would copy a transposed x's)
        out = torch.empty(T, H, device=x.device, dtype=x.dtype)
    # (an id outside [0, E) is a dropped slot, as -1 is and as the reference skips it: the kernels would read past
    # the weights; telling the caller would wait for the device)
    topk_ids = topk_ids.masked_fill((topk_ids < 0) | (topk_ids >= E), -1)
    ids, weights = topk_ids.contiguous(), topk_weights.contiguous().view(-1)  # (the kernels index them flat)
    gate_up = (w_gate_up,) if w_up is None else (gate, up)
    if cfg["IMPL"] == "grouped" and grouped_unsupported(x, (*gate_up, w_down)) is None:
        _fused_moe_grouped(x, gate_up, w_down, ids, weights, out)
        return out

    if gate.stride() != up.stride():  # the kernel indexes both with one set of strides
        gate, up = gate.contiguous(), up.contiguous()
    gate_up_cfg = {name: cfg[name] for name in GEMM_PARAMS}
    down_cfg = {name: cfg[f"DOWN_{name}"] for name in GEMM_PARAMS}
    sorted_pairs, block_expert = moe_align_block_size(topk_ids, E, cfg["BLOCK_M"])
    num_blocks = block_expert.numel()
    precision = dot_precision(x.dtype)

    h = torch.empty(num_pairs, inter, device=x.device, dtype=x.dtype)
    launch(
        _moe_gemm_kernel, (num_blocks * triton.cdiv(inter, gate_up_cfg["BLOCK_N"]),), x.device,
        x, gate, up, h, weights, sorted_pairs, block_expert, num_pairs, inter, H, num_blocks,
        x.stride(0), x.stride(1), gate.stride(0), gate.stride(1), gate.stride(2), h.stride(0), h.stride(1),
        A_ROW_DIV=k, SWIGLU=True, MUL_WEIGHT=False, EVEN_K=H % gate_up_cfg["BLOCK_K"] == 0, PRECISION=precision,
        BLOCK_M=cfg["BLOCK_M"], **gate_up_cfg,
    )
    y = torch.empty(num_pairs, H, device=x.device, dtype=x.dtype)
    launch(
        _moe_gemm_kernel, (num_blocks * triton.cdiv(H, down_cfg["BLOCK_N"]),), x.device,
        h, w_down, w_down, y, weights, sorted_pairs, block_expert, num_pairs, H, inter, num_blocks,
        h.stride(0), h.stride(1), w_down.stride(0), w_down.stride(1), w_down.stride(2), y.stride(0), y.stride(1),
        A_ROW_DIV=1, SWIGLU=False, MUL_WEIGHT=True, EVEN_K=inter % down_cfg["BLOCK_K"] == 0, PRECISION=precision,
        BLOCK_M=cfg["BLOCK_M"], **down_cfg,
    )
    _sum_pairs(y, ids, ids, weights, out, gather=False)
    return out


def _fused_moe_grouped(
    x: torch.Tensor,
    gate_up: tuple[torch.Tensor, ...],
    w_down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """The "grouped" implementation (module docstring), writing out; gate_up is (w_gate_up,) or (gate, up)."""
    _, order, starts = _sort_by_expert(ids, w_down.shape[0])
    offs = starts[1:].to(torch.int32)  # each expert's end row; the kept pairs end at offs[-1], the dropped follow
    n, H = order.numel(), x.shape[1]
    rows = torch.empty_like(order).scatter_(0, order, torch.arange(n, device=x.device))  # each pair's row
    xs = torch.empty(n, H, device=x.device, dtype=x.dtype)  # the kept pairs' rows; the dropped are not gathered
    block_h = min(next_pow2(H), 1024)
    launch(_gather_rows_kernel, (n,), x.device,
           x, order // ids.shape[1], xs, offs[-1:], H, x.stride(0), x.stride(1), xs.stride(0), BLOCK_H=block_h,
           num_warps=4)
    y = grouped_experts(xs, gate_up, w_down, offs)
    _sum_pairs(y, ids, rows, weights, out, gather=True)


def grouped_experts(
    rows: torch.Tensor, gate_up: tuple[torch.Tensor, ...], w_down: torch.Tensor, ends: torch.Tensor
) -> torch.Tensor:
    """SwiGLU experts over rows [n, H] already grouped by expert: expert e's rows end at ends[e] (int32 [E], on the
    device). Returns [n, H]; rows past ends[-1] are neither computed nor written. gate_up: (w_gate_up,) or (gate,
    up). The "grouped" path's GEMMs, after its sort and gather, before its sum. Only where `grouped_unsupported`
    is None."""
    n, inter = rows.shape[0], w_down.shape[2]
    h2 = [torch._grouped_mm(rows, w.transpose(-2, -1), offs=ends) for w in gate_up]
    gate, up = (h2[0][:, :inter], h2[0][:, inter:]) if len(h2) == 1 else h2
    h = torch.empty(n, inter, device=rows.device, dtype=rows.dtype)
    block_n = min(next_pow2(inter), 1024)
    launch(
        _swiglu_kernel, (n,), rows.device,
        gate, up, h, ends[-1:], inter, gate.stride(0), up.stride(0), h.stride(0), BLOCK_N=block_n, num_warps=4,
    )
    return torch._grouped_mm(h, w_down.transpose(-2, -1), offs=ends)


def _sum_pairs(
    y: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, gather: bool
) -> None:
    """out[t] = the sum of token t's routed rows of y (`_moe_sum_kernel`)."""
    T, H = out.shape
    block_h = min(next_pow2(H), 1024)
    launch(
        _moe_sum_kernel, (T, triton.cdiv(H, block_h)), out.device,
        y, ids, rows, weights, out, H, y.stride(0), out.stride(0), out.stride(1),
        TOPK=ids.shape[1], GATHER=gather, BLOCK_H=block_h, num_warps=4,
    )


def fused_moe_reference(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """fused_moe as a loop over experts in torch, computed in x's dtype (pass float64 tensors for a float64
    reference)."""
    gate, up = _split_gate_up(w_gate_up, w_up)
    _check_shapes(x, gate, up, w_down, topk_ids, topk_weights)
    out = torch.zeros_like(x)
    for e in range(gate.shape[0]):
        tok, slot = torch.where(topk_ids == e)
        if tok.numel() == 0:
            continue
        xs = x[tok]
        h = torch.nn.functional.silu(xs @ gate[e].T) * (xs @ up[e].T)
        out.index_add_(0, tok, (h @ w_down[e].T) * topk_weights[tok, slot, None].to(x.dtype))
    return out


def _signature(dtypes: tuple[str, ...], with_out: bool) -> Sig:
    def gate_rows_ok(sizes: dict[str, Any], args: Any) -> bool:
        separate_up = len(args) > 5 and args[5] is not None
        return sizes["N2"] == (1 if separate_up else 2) * sizes["I"]

    extra = (Optional(Tensor("T", "H", name="out")), Optional(Scalar(dict, name="config"))) if with_out else ()
    return Sig(
        Tensor("T", "H", dtypes=dtypes, name="x"),
        Tensor("E", "N2", "H", dtypes=dtypes, name="w_gate_up"),
        Tensor("E", "H", "I", dtypes=dtypes, name="w_down"),
        Tensor("T", "k", dtypes=("i32", "i64"), name="topk_ids"),
        Tensor("T", "k", name="topk_weights"),
        Optional(Tensor("E", "I", "H", dtypes=dtypes, name="w_up")),
        *extra,
        constraints=[same_dtype(0, 1, 2, 5, 6), where(gate_rows_ok, "w_gate_up rows == 2*I (== I with w_up)")],
        token=("T",),
    )


_TRITON_SIG = _signature(FLOAT_DTYPES, with_out=True)  # (fused_moe checks direct calls against it too)
register_op(
    "fused_moe",
    fused_moe,
    _TRITON_SIG,
    space=SPACE,
    description="SwiGLU MoE: expert-sorted grouped GEMMs (gate/up + SiLU*up, down + routing weight) + sum",
    impl_name="triton",
)
register_op(
    "fused_moe",
    fused_moe_reference,
    _signature((*FLOAT_DTYPES, "f64"), with_out=False),
    description="loop over experts in torch",
    impl_name="torch",
)
