"""matmul: C = A @ B, three registered implementations.

    c = matmul(a, b)          # a [M, K], b [K, N] (any strides) -> c [M, N] in a's dtype, fp32 accumulation

  persistent  `matmul_persistent` (this module): a persistent Triton kernel. The grid is one program per SM (on
              the CPU interpreter a small fake SM count, `CPU_SMS`); each program walks the output tiles
              tile_id = pid, pid + num_SMs, ... in grouped order (GROUP_M row-tiles per group, so the programs
              running at once share A row-panels and B column-panels in L2), running the K loop per tile.
              Tile config: `default_config`, or `config=`, or `tune="quick"|"full"` on CUDA (the compiler's tuner
              and persistent cache, over `SPACE`).
  tiled       `matmul_tiled`: the compiler's GEMM template (one program per output tile,
              split-K when the grid is small), reached by compiling F.linear(a, w) with w = b.t(). The template
              reads its weight as a contiguous [N, K] tensor, so this candidate takes only a `b` whose transpose
              is contiguous (b = w.t() of an nn.Linear-style weight w: the usual `x @ w.t()`), never copying b.
  cublas      `matmul_reference`: torch.matmul (cuBLAS on CUDA).

`get_op("matmul", (a, b))` times the candidates that accept the arguments on CUDA and remembers the fastest.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, dot_precision, launch
from .registry import Optional, Scalar, Sig, Tensor, register_op, same_dtype, where
from .templated import GEMM_SPACE, run

CPU_SMS = 4  # the "SM count" of the CPU interpreter: programs loop over several tiles there too


@triton.jit
def _matmul_persistent_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_MN: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Program pid computes the tiles pid, pid + NUM_SMS, ... of C (grouped order), K loop per tile. EVEN_MN: M and N
    are multiples of the tile (no edge clamping: the compiler sees contiguous offsets and vectorizes); INDEX_64:
    offsets in int64 (an operand has >= 2^31 elements)."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_pid_in_group = GROUP_M * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in range(start_pid, num_tiles, NUM_SMS):
        group_size_m = tl.minimum(num_pid_m - (tile_id // num_pid_in_group) * GROUP_M, GROUP_M)
        pid_m = (tile_id // num_pid_in_group) * GROUP_M + tile_id % group_size_m
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if EVEN_MN:
            offs_am = offs_m
            offs_bn = offs_n
        else:  # rows/columns past the edge read row/column 0 (in bounds, never stored): loads need no M/N mask
            offs_am = tl.where(offs_m < M, offs_m, 0)
            offs_bn = tl.where(offs_n < N, offs_n, 0)
        if INDEX_64:
            offs_am = offs_am.to(tl.int64)
            offs_bn = offs_bn.to(tl.int64)
        a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                k_ok = offs_k < K - ki * BLOCK_K
                a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn
        if EVEN_MN:
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))
        else:
            c_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@cache
def num_sms(device: torch.device) -> int:
    """The number of programs of the persistent grid: the GPU's SM count (CPU_SMS off CUDA)."""
    if device.type != "cuda":
        return CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
SPACE: dict[str, list[int]] = {
    "BLOCK_M": [64, 128],
    "BLOCK_N": [64, 128, 256],
    "BLOCK_K": [32, 64, 128],
    "GROUP_M": [1, 8, 16],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
}


def _smem_ok(cfg: dict[str, Any], itemsize: int = 2) -> bool:
    """The pipelined A and B tiles (num_stages buffers of each) fit in an H100's 227 KB of shared memory."""
    stage = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * itemsize
    return stage * cfg["num_stages"] <= 220 * 1024


def search_space(dtype: torch.dtype, default: dict[str, int] | None = None) -> Any:
    """SPACE as a tuning.SearchSpace for `dtype`, with the shared-memory constraint; `default` (a config of SPACE,
    else the CUDA default config of a large GEMM) is the config the tuner reports its gain against."""
    from ..tuning import SearchSpace

    itemsize = torch.empty((), dtype=dtype).element_size()
    default = default or default_config(4096, 4096, 4096, dtype, torch.device("cuda"))
    return SearchSpace(SPACE, {"fits shared memory": lambda c: _smem_ok(c, itemsize)}, default=default)


def default_config(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device) -> dict[str, int]:
    """Tile config: Triton's persistent-matmul tutorial config for 16-bit inputs (128x256x64, 8 warps, 3 stages),
    half of BLOCK_K for fp32, 64-row tiles for short A; small tiles under the CPU interpreter."""
    if device.type != "cuda":
        small = lambda n: 16 if n <= 16 else 32  # noqa: E731
        return {"BLOCK_M": small(M), "BLOCK_N": small(N), "BLOCK_K": small(K), "GROUP_M": 2,
                "num_warps": 4, "num_stages": 2}  # fmt: skip
    cfg = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    if M <= 64:
        cfg.update(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=4)
    if dtype == torch.float32:
        cfg.update(BLOCK_N=128, BLOCK_K=32)
    return cfg


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a {list(a.shape)} @ b {list(b.shape)}: expected a [M, K] and b [K, N]")


def _launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg: dict[str, int]) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    sms = num_sms(a.device)
    tiles = triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
    launch(
        _matmul_persistent_kernel, (min(sms, tiles),), a.device,
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        PRECISION=dot_precision(a.dtype), NUM_SMS=sms, EVEN_K=K % cfg["BLOCK_K"] == 0,
        EVEN_MN=M % cfg["BLOCK_M"] == 0 and N % cfg["BLOCK_N"] == 0,
        INDEX_64=max(a.numel(), b.numel(), c.numel(), M * K, K * N, M * N) >= 2**31, **cfg,
    )
    return c


def _tuned_config(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, mode: str) -> dict[str, int]:
    from .. import tuning

    M, K = a.shape
    N = b.shape[1]
    space = search_space(a.dtype, default_config(M, N, K, a.dtype, a.device))
    job = tuning.TuneJob(
        "lib:matmul_persistent", "v1", space, lambda cfg: (lambda: _launch(a, b, c, cfg)),
        {"M": M, "N": N, "K": K, "a": tuple(a.stride()), "b": tuple(b.stride())}, (a.dtype,), a.device,
        lambda: torch.matmul(a, b), token_dims=("M",),
    )  # fmt: skip
    out = tuning.tune(job, mode, progress=False)
    return out.config


def matmul_persistent(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
    tune: str = "none",
) -> torch.Tensor:
    """C = a @ b by the persistent kernel (see the module docstring); writes `out` [M, N] if given. `config`
    overrides entries of the tile config (keys of `SPACE`); `tune` ("quick", "full"; CUDA only) searches SPACE
    once per shape bucket and remembers the result in the tuning cache. Arguments its registered signature refuses
    (float64, mixed dtypes) raise OpMatchError, as get_op's match would."""
    _check(a, b)
    _PERSISTENT_SIG.check("matmul_persistent", (a, b, out, config, tune))
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty(M, N, device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    cfg = default_config(M, N, K, a.dtype, a.device)
    if tune != "none" and a.device.type == "cuda" and config is None:
        cfg = _tuned_config(a, b, out, tune)
    cfg.update(config or {})
    return _launch(a, b, out, cfg)


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul (cuBLAS on CUDA), in the inputs' dtype."""
    _check(a, b)
    return torch.matmul(a, b)


class LinearModule(torch.nn.Module):
    """F.linear(a, w) with the weight a forward input: the compiler's GEMM template, as a lone GEMM region."""

    def forward(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(a, w)


def matmul_tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = a @ b by the compiler's GEMM template: F.linear(a, b.t()); b.t() must be contiguous (b = w.t())."""
    _check(a, b)
    w = b.t()
    if not w.is_contiguous():
        raise ValueError(f"matmul_tiled: b {list(b.shape)} with strides {b.stride()} is not the transpose of a "
                         "contiguous [N, K] tensor (pass w.t(), or use matmul_persistent)")  # fmt: skip
    return run("matmul_tiled", LinearModule, (), a, w)


def _b_transposed(sizes: dict[str, Any], args: Any) -> bool:
    return args[1].t().is_contiguous()


def _signature(dtypes: tuple[str, ...], extra: tuple = (), constraints: tuple = ()) -> Sig:
    return Sig(
        Tensor("M", "K", dtypes=dtypes, name="a"),
        Tensor("K", "N", dtypes=dtypes, name="b"),
        *extra,
        constraints=[same_dtype(0, 1, 2), *constraints],
        token=("M",),
    )


register_op(
    "matmul",
    matmul_tiled,
    _signature(FLOAT_DTYPES, constraints=(where(_b_transposed, "b.t() contiguous (b = w.t() of a [N, K] weight)"),)),
    space=GEMM_SPACE,
    description="the compiler's GEMM template (tiled, split-K), via F.linear(a, b.t())",
    impl_name="tiled",
)
_PERSISTENT_SIG = _signature(
    FLOAT_DTYPES,
    extra=(Optional(Tensor("M", "N", name="out")), Optional(Scalar(dict, name="config")),
           Scalar(str, default="none", name="tune")),  # fmt: skip
)  # (matmul_persistent checks direct calls against it too)
register_op(
    "matmul",
    matmul_persistent,
    _PERSISTENT_SIG,
    space=SPACE,
    description="persistent Triton kernel: one program per SM looping over grouped output tiles",
    impl_name="persistent",
)
register_op(
    "matmul",
    matmul_reference,
    _signature((*FLOAT_DTYPES, "f64")),
    description="torch.matmul (cuBLAS)",
    impl_name="cublas",
)
