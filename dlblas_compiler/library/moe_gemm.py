"""Fused mixture-of-experts with SwiGLU experts: a grouped GEMM over the tokens routed to each expert.

    out = fused_moe(x, w_gate_up, w_down, topk_ids, topk_weights)

x [T, H]; w_gate_up [E, 2I, H] (rows [0, I) the gate projection, [I, 2I) the up projection; or, with w_up
[E, I, H] given, w_gate_up is the gate [E, I, H]); w_down [E, H, I]; topk_ids [T, k] int (experts in [0, E), -1
for a dropped slot, as topk_gating returns); topk_weights [T, k]. Weights are nn.Linear-style (out, in); any
strides. Returns out [T, H] in x's dtype:

    out[t] = sum_j topk_weights[t, j] * w_down[e] @ (silu(w_gate[e] @ x[t]) * (w_up[e] @ x[t])),  e = ids[t, j]

The (token, slot) pairs are sorted by expert and each expert's group padded to a multiple of BLOCK_M
(`moe_align_block_size`, torch ops, no host sync). Kernel 1 computes h = silu(x W_gate^T) * (x W_up^T) for each
block of pairs (two accumulators, fused epilogue); kernel 2 computes y = topk_weight * (h W_down^T) per pair;
kernel 3 sums each token's k rows of y. Accumulation is float32; h and y are stored in x's dtype.
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
def _moe_sum_kernel(y_ptr, ids_ptr, out_ptr, H, stride_ym, stride_om, TOPK: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t, h] = sum_j y[t * TOPK + j, h] over the slots j with ids[t, j] >= 0."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs < H
    acc = tl.zeros((BLOCK_H,), tl.float32)
    for j in tl.static_range(TOPK):
        routed = tl.load(ids_ptr + t * TOPK + j) >= 0
        acc += tl.load(y_ptr + (t * TOPK + j) * stride_ym + offs, mask=h_ok & routed, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the (token, slot) pairs by expert, each group padded to a multiple of block_m.

    Returns sorted_pairs [num_blocks * block_m] int32 (the flat pair index t * k + j, in token order within an
    expert; T * k marks padding) and block_expert [num_blocks] int32 (each block's expert; -1 past the last
    group). num_blocks = cdiv(T * k + E * (block_m - 1), block_m) bounds the padded size, so nothing waits for
    the device. Slots with id -1 are left out.
    """
    flat = topk_ids.reshape(-1).long()
    n, dev = flat.numel(), flat.device
    sorted_key, order = torch.sort(flat.masked_fill(flat < 0, num_experts), stable=True)  # dropped: key E, last
    start = torch.searchsorted(sorted_key, torch.arange(num_experts + 1, device=dev))  # (bincount would sync)
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


def default_config(num_pairs: int, num_experts: int, dtype: torch.dtype) -> dict[str, int]:
    """Tile configs by the average number of pairs per expert: BLOCK_M (shared by both GEMMs), the gate/up GEMM's
    GEMM_PARAMS, and the down GEMM's as DOWN_<param>. Chosen from sweeps on H100/H200 at Mixtral and DeepSeek
    shapes in bf16; fp32 halves BLOCK_K (its tiles take twice the shared memory)."""
    per_expert = num_pairs / num_experts
    if per_expert <= 16:  # decode: one block per expert, streaming its weights (~90% of HBM bandwidth)
        block_m, gate_up, down = 16, (128, 128, 1, 4, 3), (128, 128, 1, 4, 3)
    else:
        block_m, gate_up, down = 64 if per_expert <= 64 else 128, (128, 64, 16, 8, 4), (256, 64, 8, 8, 4)
    cfg = {"BLOCK_M": block_m, **dict(zip(GEMM_PARAMS, gate_up, strict=True))}
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
SPACE: dict[str, list[int]] = {
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
    `config` overrides entries of the tile config (`default_config`; keys of `SPACE`)."""
    gate, up = _split_gate_up(w_gate_up, w_up)
    _check_shapes(x, gate, up, w_down, topk_ids, topk_weights)
    if gate.stride() != up.stride():  # the kernel indexes both with one set of strides
        gate, up = gate.contiguous(), up.contiguous()
    T, H = x.shape
    E, inter, _ = gate.shape
    k = topk_ids.shape[1]
    num_pairs = T * k
    cfg = {**default_config(num_pairs, E, x.dtype), **(config or {})}
    gate_up_cfg = {name: cfg[name] for name in GEMM_PARAMS}
    down_cfg = {name: cfg[f"DOWN_{name}"] for name in GEMM_PARAMS}
    sorted_pairs, block_expert = moe_align_block_size(topk_ids, E, cfg["BLOCK_M"])
    num_blocks = block_expert.numel()
    precision = dot_precision(x.dtype)
    weights = topk_weights.reshape(-1)

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
    if out is None:
        out = torch.empty_like(x)
    block_h = min(next_pow2(H), 1024)
    launch(
        _moe_sum_kernel, (T, triton.cdiv(H, block_h)), x.device,
        y, topk_ids.contiguous(), out, H, y.stride(0), out.stride(0), TOPK=k, BLOCK_H=block_h, num_warps=4,
    )
    return out


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


register_op(
    "fused_moe",
    fused_moe,
    _signature(FLOAT_DTYPES, with_out=True),
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
