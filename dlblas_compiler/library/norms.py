"""RMSNorm, add + RMSNorm, SiLU-and-mul and the SwiGLU FFN, through the compiler's templates.

    y = rms_norm(x, weight, eps=1e-6)                        # x [..., H], weight [H]          -> [..., H]
    normed, s = add_rms_norm(x, residual, weight, eps=1e-6)  # s = x + residual; normed = rms_norm(s, weight)
    y = silu_and_mul(x)                                      # x [..., 2N] -> silu(x[..., :N]) * x[..., N:]
    y = ffn(x, norm_weight, w_gate_up, eps=1e-6)             # w_gate_up [2I, H] -> [..., I]
    y = ffn(x, norm_weight, w_gate_up, w_down, eps=1e-6)     # w_down [H, I]     -> [..., H]

Semantics (Llama / HF): rms_norm(x, w) = w * (x_f32 * rsqrt(mean(x_f32^2, -1) + eps)).to(x.dtype), with the
statistics in float32 (float64 inputs stay float64); all tensors of one call share a dtype; any strides.
ffn is the Llama MLP with the gate and up projections merged into one nn.Linear-style weight (rows [0, I) the
gate projection, [I, 2I) the up projection, as vLLM's MergedColumnParallelLinear; `torch.cat([w_gate, w_up])`
once at load time): h = rms_norm(x, norm_weight); a = silu(h @ w_gate^T) * (h @ w_up^T); with w_down, a @ w_down^T.

Implementation: each op is compiled by the compiler (kernels/templated.py); what it becomes:
  rms_norm      1 kernel: row template (dl.rms_norm)
  add_rms_norm  1 kernel: row template (dl.add_rms_norm; both outputs stored by the one kernel)
  silu_and_mul  1 kernel: row template (dl.glu over two column slices of x)
  ffn           1 region: GEMM template with the RMSNorm prologue and the glu-of-halves epilogue (two
                accumulators sharing the A tile); launched as 2 kernels: the `row_rms` statistics pass, then the
                GEMM (1 kernel up to 16 rows: the GEMM's last programs read the statistics). With w_down: + 1 GEMM-template kernel for the down projection.
With gate and up as two separate weights the compiler would not build the dual GEMM (it concatenates *parameter*
weights at load time, not per-call inputs): 3 kernels plus an extra [.., I] round trip; hence the merged weight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..dialects.compute import rms_norm_reference as dl_rms_norm_reference
from .common import FLOAT_DTYPES
from .registry import Optional, Scalar, Sig, Tensor, in_range, register_op, same_dtype, where
from .templated import GEMM_SPACE, ROW_SPACE, run



# --------------------------------------------------------------------------------------------- torch references


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """rms_norm in torch (statistics in float32 for 16-bit inputs; pass float64 tensors for a float64 reference):
    the `dl.rms_norm` op's own reference."""
    return dl_rms_norm_reference(x, weight, eps)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual, weight), x + residual) in torch."""
    s = x + residual
    return dl_rms_norm_reference(s, weight, eps), s


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :N]) * x[..., N:] in torch."""
    n = x.shape[-1] // 2
    return F.silu(x[..., :n]) * x[..., n:]


def ffn_reference(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The (RMSNorm +) SwiGLU MLP in torch."""
    a = silu_and_mul_reference(F.linear(rms_norm_reference(x, norm_weight, eps), w_gate_up))
    return a if w_down is None else F.linear(a, w_down)


# ------------------------------------------------------------------ the modules the compiler compiles (its spelling)


class RMSNormModule(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.to(torch.float32)
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


class AddRMSNormModule(RMSNormModule):
    def forward(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = x + residual
        return super().forward(s, weight), s


class SiluAndMulModule(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x[..., : self.n]) * x[..., self.n :]


class FFNModule(RMSNormModule):
    def __init__(self, eps: float, inter: int) -> None:
        super().__init__(eps)
        self.inter = inter

    def forward(self, x: torch.Tensor, norm_weight: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
        gu = F.linear(super().forward(x, norm_weight), w_gate_up)
        return F.silu(gu[..., : self.inter]) * gu[..., self.inter :]


class MLPModule(FFNModule):
    def forward(  # type: ignore[override]
        self, x: torch.Tensor, norm_weight: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor
    ) -> torch.Tensor:
        return F.linear(super().forward(x, norm_weight, w_gate_up), w_down)


# ------------------------------------------------------------------------------------------------------ the ops


def _f(eps: Any) -> float:
    return float(eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of x [..., H] with weight [H] (see the module docstring): one row-template kernel."""
    eps = _f(eps)
    return run("rms_norm", lambda: RMSNormModule(eps), (eps,), x, weight)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual, weight), x + residual): one row-template kernel writing both."""
    eps = _f(eps)
    return run("add_rms_norm", lambda: AddRMSNormModule(eps), (eps,), x, residual, weight)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :N]) * x[..., N:] for x [..., 2N]: one row-template kernel."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: the last dim of x {list(x.shape)} must be even (gate and up halves)")
    n = x.shape[-1] // 2
    return run("silu_and_mul", lambda: SiluAndMulModule(n), (n,), x)


def ffn(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """RMSNorm + merged gate/up GEMM + SiLU*up [+ down projection] (see the module docstring)."""
    if w_down is not None and not isinstance(w_down, torch.Tensor):
        raise TypeError(f"ffn: w_down is {type(w_down).__name__}; pass eps by name: ffn(x, w, w_gate_up, eps=...)")
    eps, inter = _f(eps), w_gate_up.shape[0] // 2
    if w_down is None:
        return run("ffn", lambda: FFNModule(eps, inter), (eps, inter), x, norm_weight, w_gate_up)
    return run("ffn_mlp", lambda: MLPModule(eps, inter), (eps, inter), x, norm_weight, w_gate_up, w_down)


# ------------------------------------------------------------------------------------------------- registration

_REF_DTYPES = (*FLOAT_DTYPES, "f64")
_EPS = Scalar(float, default=1e-6, name="eps")


def _norm_sig(dtypes: tuple[str, ...]) -> Sig:
    return Sig(
        Tensor(..., "H", dtypes=dtypes, name="x"),
        Tensor("H", name="weight"),
        _EPS,
        constraints=[same_dtype(0, 1), in_range("H", 1, 65536)],
    )


def _add_norm_sig(dtypes: tuple[str, ...]) -> Sig:
    return Sig(
        Tensor(..., "H", dtypes=dtypes, name="x"),
        Tensor(..., "H", name="residual"),
        Tensor("H", name="weight"),
        _EPS,
        constraints=[
            same_dtype(0, 1, 2),
            in_range("H", 1, 65536),
            where(lambda s, a: a[0].shape == a[1].shape, "residual has x's shape"),
        ],
    )


def _glu_sig(dtypes: tuple[str, ...]) -> Sig:
    return Sig(
        Tensor(..., "N2", dtypes=dtypes, name="x"),
        constraints=[where(lambda s, a: s["N2"] % 2 == 0, "the last dim of x is even (2N: gate, up)")],
    )


def _gate_up_rows_ok(sizes: dict[str, Any], args: Any) -> bool:
    return sizes["I2"] % 2 == 0 and sizes.get("I", sizes["I2"] // 2) == sizes["I2"] // 2


def _ffn_sig(dtypes: tuple[str, ...]) -> Sig:
    return Sig(
        Tensor(..., "H", dtypes=dtypes, name="x"),
        Tensor("H", name="norm_weight"),
        Tensor("I2", "H", name="w_gate_up"),
        Optional(Tensor("H", "I", name="w_down")),
        _EPS,
        constraints=[same_dtype(0, 1, 2, 3), where(_gate_up_rows_ok, "w_gate_up rows == 2*I (I = w_down columns)")],
    )


for _name, _fn, _ref, _sig, _space, _what in (
    ("rms_norm", rms_norm, rms_norm_reference, _norm_sig, ROW_SPACE, "row template: 1 kernel"),
    ("add_rms_norm", add_rms_norm, add_rms_norm_reference, _add_norm_sig, ROW_SPACE, "row template: 1 kernel"),
    ("silu_and_mul", silu_and_mul, silu_and_mul_reference, _glu_sig, ROW_SPACE, "row template: 1 kernel"),
    ("ffn", ffn, ffn_reference, _ffn_sig, GEMM_SPACE,
     "GEMM template: RMSNorm prologue + dual gate/up GEMM + SiLU*up (1 region); + 1 GEMM with w_down"),
):  # fmt: skip
    register_op(_name, _fn, _sig(FLOAT_DTYPES), space=_space, description=_what, impl_name="compiled")
    register_op(_name, _ref, _sig(_REF_DTYPES), description="torch eager", impl_name="torch")
