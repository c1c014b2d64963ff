"""FP8 (e4m3) GEMM with per-tensor or per-row scales, float32 accumulation.

    q_a, s_a = quantize_fp8(a, per_row=True);  q_b, s_b = quantize_fp8(w, per_row=True)
    out = fp8_gemm(q_a, q_b, s_a, s_b, out_dtype=torch.bfloat16)       # ~= a @ w.T

a [M, K] and b [N, K] (nn.Linear weight layout) are torch.float8_e4m3fn, any strides (K-contiguous is fastest);
a_scale is float32 with 1 element (per tensor) or M (per row of a), b_scale 1 or N (per row of b = per output
column). out [M, N] = (a_scale[m] * b_scale[n]) * sum_k a[m, k] * b[n, k], accumulated in float32, stored in
out_dtype (bf16, f16 or f32). Needs e4m3 tensor cores: a CUDA GPU of compute capability >= 8.9 (Ada, Hopper,
Blackwell); elsewhere, including the Triton interpreter on CPU, fp8_gemm raises KernelUnsupported.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .registry import KernelUnsupported, Optional, Scalar, Sig, Tensor, min_capability, register_op, where

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    A_PER_ROW: tl.constexpr, B_PER_ROW: tl.constexpr, EVEN_K: tl.constexpr, MAX_IMPRECISE_ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_width = GROUP_M * num_n
    first_m = (pid // group_width) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_width) % group_m
    pid_n = (pid % group_width) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_a, rows_b = offs_m % M, offs_n % N  # wrapped: loads stay in bounds, stores are masked
    a_ptrs = a_ptr + rows_a[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + rows_b[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=MAX_IMPRECISE_ACC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if A_PER_ROW:
        acc = acc * tl.load(a_scale_ptr + rows_a)[:, None]
    else:
        acc = acc * tl.load(a_scale_ptr)
    if B_PER_ROW:
        acc = acc * tl.load(b_scale_ptr + rows_b)[None, :]
    else:
        acc = acc * tl.load(b_scale_ptr)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def quantize_fp8(x: torch.Tensor, per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q = x / scale in float8_e4m3fn and scale = amax / 448 in float32: one scale ([] tensor), or
    one per row ([rows] for x [rows, cols]) with per_row."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1) if per_row else xf.abs().amax()
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    q = (xf / (scale[..., None] if per_row else scale)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _scale_column(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return scale.to(dtype).reshape(-1, 1)


def fp8_gemm_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Dequantize and multiply in torch: (a_scale * a) @ (b_scale * b)^T, in float64 for out_dtype=float64, else
    float32; runs on any device."""
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    a_deq = a.to(acc) * _scale_column(a_scale, acc)
    b_deq = b.to(acc) * _scale_column(b_scale, acc)
    return (a_deq @ b_deq.T).to(out_dtype)


def _check(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor, out_dtype: Any) -> None:
    if a.device.type != "cuda":
        raise KernelUnsupported(
            f"fp8_gemm: tensors are on {a.device.type}; the e4m3 dot needs a CUDA GPU of compute capability >= 8.9 "
            "(the Triton interpreter has no float8 arithmetic); use fp8_gemm_reference there"
        )
    cap = torch.cuda.get_device_capability(a.device)
    if cap < (8, 9):
        raise KernelUnsupported(
            f"fp8_gemm: {torch.cuda.get_device_name(a.device)} has compute capability {cap[0]}.{cap[1]}; e4m3 "
            "tensor cores need >= 8.9 (Ada, Hopper, Blackwell)"
        )
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8_gemm: a and b must be torch.float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_gemm: need a [M, K] and b [N, K], got {list(a.shape)} and {list(b.shape)}")
    for name, scale, rows in (("a_scale", a_scale, a.shape[0]), ("b_scale", b_scale, b.shape[0])):
        if scale.numel() not in (1, rows):
            raise ValueError(f"fp8_gemm: {name} has {scale.numel()} elements, expected 1 or {rows}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"fp8_gemm: out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")


_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
_CONFIGS = {  # (M <= 64, fast_accum) -> values of _CONFIG_KEYS
    (True, False): (64, 32, 128, 1, 4, 5),
    (True, True): (64, 32, 256, 1, 4, 4),
    (False, False): (256, 128, 128, 8, 8, 3),
    (False, True): (128, 128, 128, 8, 8, 3),
}


def default_config(m: int, fast_accum: bool) -> dict[str, int]:
    """Tile config, from sweeps on H100/H200 at N = K = 4096: narrow N tiles for decode-sized M (more programs over
    the weight), large tiles otherwise (256 x 128 where the accumulator's per-BLOCK_K promotion is paid)."""
    return dict(zip(_CONFIG_KEYS, _CONFIGS[(m <= 64, fast_accum)], strict=True))


SPACE: dict[str, list[int]] = {
    "BLOCK_M": [64, 128],
    "BLOCK_N": [32, 64, 128, 256],
    "BLOCK_K": [64, 128, 256],
    "GROUP_M": [1, 8],
    "num_warps": [4, 8],
    "num_stages": [3, 4, 5],
}


def fp8_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    fast_accum: bool = False,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """out [M, N] = (a_scale * a) @ (b_scale * b)^T from e4m3 a [M, K], b [N, K] (see the module docstring).
    Hopper's fp8 MMA accumulates with reduced precision: by default each BLOCK_K slice is promoted into the float32
    accumulator; fast_accum=True skips that (faster, less accurate; torch._scaled_mm's use_fast_accum).
    `config` overrides the tile config (keys of `SPACE`). Raises KernelUnsupported without e4m3 tensor cores."""
    _check(a, b, a_scale, b_scale, out_dtype)
    M, K = a.shape
    N = b.shape[0]
    cfg = {**default_config(M, fast_accum), **(config or {})}
    a_scale, b_scale = a_scale.float().reshape(-1).contiguous(), b_scale.float().reshape(-1).contiguous()
    out = torch.empty(M, N, device=a.device, dtype=out_dtype)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    _fp8_gemm_kernel[grid](  # CUDA only (checked above): no interpreter path
        a, b, out, a_scale, b_scale, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        A_PER_ROW=a_scale.numel() > 1, B_PER_ROW=b_scale.numel() > 1, EVEN_K=K % cfg["BLOCK_K"] == 0,
        MAX_IMPRECISE_ACC=None if fast_accum else cfg["BLOCK_K"],
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def _signature(triton_kernel: bool) -> Sig:
    f8 = ("f8e4m3",)
    device = ("cuda",) if triton_kernel else None
    constraints = [
        where(lambda s, a: a[2].numel() in (1, s["M"]), "a_scale with 1 or M elements"),
        where(lambda s, a: a[3].numel() in (1, s["N"]), "b_scale with 1 or N elements"),
    ]
    if triton_kernel:
        constraints.append(min_capability(8, 9, "the e4m3 tensor-core dot"))
    kernel_only = (Scalar(bool, default=False, name="fast_accum"), Optional(Scalar(dict, name="config")))
    return Sig(
        Tensor("M", "K", dtypes=f8, device=device, name="a"),
        Tensor("N", "K", dtypes=f8, device=device, name="b"),
        Tensor(..., dtypes=("f32",), name="a_scale"),
        Tensor(..., dtypes=("f32",), name="b_scale"),
        Scalar(torch.dtype, default=torch.bfloat16, name="out_dtype"),
        *(kernel_only if triton_kernel else ()),
        constraints=constraints,
        token=("M",),
    )


register_op(
    "fp8_gemm",
    fp8_gemm,
    _signature(triton_kernel=True),
    space=SPACE,
    description="e4m3 GEMM, per-tensor or per-row scales, fp32 accumulation (compute capability >= 8.9)",
    impl_name="triton",
)
register_op(
    "fp8_gemm",
    fp8_gemm_reference,
    _signature(triton_kernel=False),
    description="dequantize + matmul in torch (any device)",
    impl_name="torch",
)
