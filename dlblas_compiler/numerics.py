"""Numerics policy: how outputs are compared with references, and the tolerance per dtype.

Generated kernels compute in fp32 and round each op's result to its dtype, as eager rounds each op's (a GEMM's
and a reduction's accumulation stays fp32 until its result); the tolerances below bound ‖out − ref‖ / ‖ref‖
against a reference computed in float64 from the same inputs.
"""

from __future__ import annotations

import torch

REL_TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}


# An element is an outlier when it is off by more than OUTLIER x the reference's RMS plus LOCAL x its own
# magnitude (a reference computed in the same low precision carries rounding proportional to each value);
# a result may have at most MAX_OUTLIERS of them. Rounding spreads error over all elements; a wrong
# kernel (a race, a bad index) concentrates it, which a norm-wise tolerance alone can let through.
OUTLIER: dict[torch.dtype, float] = {torch.float64: 1e-8, torch.float32: 1e-3, torch.float16: 0.02, torch.bfloat16: 0.05}
LOCAL: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 0.01, torch.bfloat16: 0.03}
MAX_OUTLIERS = 1e-3


def tolerance(dtype: torch.dtype) -> float:
    return REL_TOL.get(dtype, 0.0)


def outlier_fraction(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of finite elements off by more than OUTLIER x RMS(ref) + LOCAL x |ref| (per dtype)."""
    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    ok = torch.isfinite(r) & torch.isfinite(o)
    if not ok.any():
        return 0.0
    o, r = o[ok], r[ok]
    rms = r.pow(2).mean().sqrt().item() or 1.0
    bound = OUTLIER.get(ref.dtype, 0.0) * rms + LOCAL.get(ref.dtype, 0.0) * r.abs()
    return ((o - r).abs() > bound).double().mean().item()


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when NaN/Inf appear in one but not at the same places in the other."""
    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    if o.shape != r.shape:
        return float("inf")
    bad_o, bad_r = ~torch.isfinite(o), ~torch.isfinite(r)
    if not torch.equal(bad_o, bad_r) or not torch.equal(o[bad_o].nan_to_num(0.0), r[bad_r].nan_to_num(0.0)):
        return float("inf")
    o, r = o[~bad_o], r[~bad_r]
    if o.numel() == 0:
        return 0.0
    den = r.norm().item()
    num = (o - r).norm().item()
    return num / den if den > 0 else num


def compare(outs, refs) -> str | None:
    """None when every output is within its dtype's tolerance of the reference, else a message."""
    outs, refs = list(outs), list(refs)
    if len(outs) != len(refs):
        return f"{len(outs)} outputs vs {len(refs)} expected"
    worst = None
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(r, torch.Tensor):
            if o != r:
                return f"output {i}: {o!r} vs {r!r}"
            continue
        if o.dtype != r.dtype or o.shape != r.shape:
            return f"output {i}: {o.dtype}{tuple(o.shape)} vs expected {r.dtype}{tuple(r.shape)}"
        err, tol = rel_error(o, r), tolerance(r.dtype)
        if not r.is_floating_point():
            if not torch.equal(o, r):
                return f"output {i}: integer tensors differ"
            continue
        if err > tol and (worst is None or err > worst[1]):
            worst = (i, err, tol)
        bad = outlier_fraction(o, r)
        if bad > MAX_OUTLIERS:
            return f"output {i}: {bad:.2%} of elements off by more than {OUTLIER[r.dtype]:g} x RMS + {LOCAL[r.dtype]:g} x |value| (relative error {err:.3g})"
    if worst:
        return f"output {worst[0]}: relative error {worst[1]:.3g} > tolerance {worst[2]:.1g}"
    return None
