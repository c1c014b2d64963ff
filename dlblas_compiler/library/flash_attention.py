"""Flash attention (the compiler's attention template) and flash attention with rotary fused in (a Triton kernel).

    o = flash_attention_v2(q, k, v, causal=False, sm_scale=None)
    o = fused_rotary_and_fa(q, k, v, cos, sin, causal=True, interleaved=False, sm_scale=None, out=None)

q [B, Hq, S, D], k and v [B, Hk, L, D] (SDPA's layout; Hq a multiple of Hk: GQA / MQA, query head h reads kv head
h // (Hq / Hk)); any strides; one dtype. Returns o [B, Hq, S, D] in q's dtype:

    o = softmax(q k^T * sm_scale [+ causal mask]) v,   sm_scale default 1/sqrt(D)

causal masks key j > query i (top-left aligned, as torch's is_causal). fused_rotary_and_fa takes *un-rotated* q
and k (self-attention: S == L) plus cos, sin [S, D] per position, and attends with rotary(q), rotary(k) (half-split
or interleaved layout, see kernels/rotary.py), never writing the rotated q and k to memory.

Implementations:
  flash_attention_v2   compiled: the attention template (FA2-style online softmax in exp2, q pre-scaled, causal
                       blocks skipped), 1 kernel. torch: F.scaled_dot_product_attention.
  fused_rotary_and_fa  triton (`_rotary_flash_kernel` below): the same FA2 loop, with q rotated once per program
                       when loaded and each K tile rotated when loaded (the partner dims are a second, permuted
                       load of the same tile; cos/sin rows by position), fp32 rotation rounded once to the input
                       dtype. A plain kernel because the attention template has no prologue slot: compiled, rotary
                       + sdpa are 3 kernels (two row-template rotary kernels writing rotated q and k, then the
                       attention template), registered as the `compiled` candidate. torch: rotary + SDPA.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

from ..codegen.attention.dims import MAX_HEAD_DIM, head_parts
from .common import FLOAT_DTYPES, dot_precision, launch
from .registry import Optional, Scalar, Sig, Tensor, register_op, same_dtype, where
from .rotary import RotaryModule, apply_rotary_pos_emb_reference
from .templated import ATTENTION_SPACE, run

HEAD_DIMS = (16, 32, 64, 128, 256)  # what the fused rotary kernel takes (the template: codegen/attention/dims.py)


# --------------------------------------------------------------------------------------------- torch references


def flash_attention_v2_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """F.scaled_dot_product_attention (enable_gqa when Hq != Hk), in the inputs' dtype."""
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale, enable_gqa=gqa)


def fused_rotary_and_fa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    causal: bool = True,
    interleaved: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Rotary on q and k ([B, H, S, D] here, cos/sin [S, D]) then SDPA, in torch."""
    qt, kt = (t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (q, k))  # [B*S, H, D]
    c, s = cos.repeat(q.shape[0], 1), sin.repeat(q.shape[0], 1)
    qr, kr = apply_rotary_pos_emb_reference(qt, kt, c, s, interleaved)
    b, sq = q.shape[0], q.shape[2]
    qr = qr.reshape(b, sq, q.shape[1], -1).transpose(1, 2)
    kr = kr.reshape(b, sq, k.shape[1], -1).transpose(1, 2)
    return flash_attention_v2_reference(qr, kr, v, causal, sm_scale)


# ------------------------------------------------------------------ the modules the compiler compiles (its spelling)


class SDPAModule(nn.Module):
    def __init__(self, causal: bool, scale: float | None, gqa: bool) -> None:
        super().__init__()
        self.causal, self.scale, self.gqa = causal, scale, gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale, enable_gqa=self.gqa)


class RotarySDPAModule(SDPAModule):
    def __init__(self, causal: bool, scale: float | None, gqa: bool, interleaved: bool, head_dim: int) -> None:
        super().__init__(causal, scale, gqa)
        self.rope = RotaryModule(head_dim, head_dim, interleaved)

    def forward(  # type: ignore[override]
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        c, s = cos[None, None], sin[None, None]
        return super().forward(self.rope._one(q, c, s), self.rope._one(k, c, s), v)


def _scale(sm_scale: float | None) -> float | None:
    return None if sm_scale is None else float(sm_scale)


def flash_attention_v2(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """Flash attention by the compiler's attention template (see the module docstring): 1 kernel."""
    static = (bool(causal), _scale(sm_scale), q.shape[1] != k.shape[1])
    return run("flash_attention_v2", lambda: SDPAModule(*static), static, q, k, v)


def fused_rotary_and_fa_compiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    causal: bool = True,
    interleaved: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Rotary + SDPA compiled by the compiler: 2 row-template rotary kernels + the attention template."""
    static = (bool(causal), _scale(sm_scale), q.shape[1] != k.shape[1], bool(interleaved), q.shape[-1])
    return run("fused_rotary_and_fa", lambda: RotarySDPAModule(*static), static, q, k, v, cos, sin)


# ---------------------------------------------------------------------------------- the fused rotary + FA kernel


@triton.jit
def _rotary_flash_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, o_ptr,
    S, HQ, GROUPS, qk_scale,
    sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd, scs, scd, sns, snd, sob, soh, sos, sod,
    D: tl.constexpr, INTERLEAVED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: BLOCK_M query rows of one (batch, query head); loops over the key blocks it needs."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    hk = (h // GROUPS).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    if INTERLEAVED:  # rotate(x)[2i] = -x[2i+1], rotate(x)[2i+1] = x[2i]
        partner = offs_d ^ 1
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
    else:  # rotate(x)[i] = -x[i + D/2] (i < D/2), x[i - D/2] (i >= D/2)
        partner = (offs_d + D // 2) % D
        sign = tl.where(offs_d < D // 2, -1.0, 1.0)
    m_ok = (offs_m < S)[:, None]
    rows = offs_m.to(tl.int64)[:, None]

    q_base = q_ptr + b * sqb + h * sqh + rows * sqs
    q = tl.load(q_base + offs_d[None, :] * sqd, mask=m_ok, other=0.0).to(tl.float32)
    q_partner = tl.load(q_base + partner[None, :] * sqd, mask=m_ok, other=0.0).to(tl.float32)
    cq = tl.load(cos_ptr + rows * scs + offs_d[None, :] * scd, mask=m_ok, other=0.0).to(tl.float32)
    sq = tl.load(sin_ptr + rows * sns + offs_d[None, :] * snd, mask=m_ok, other=0.0).to(tl.float32)
    q = ((q * cq + sign[None, :] * q_partner * sq) * qk_scale).to(q_ptr.dtype.element_ty)  # log2 domain

    k_base = k_ptr + b * skb + hk * skh
    v_base = v_ptr + b * svb + hk * svh
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S
        cols = offs_n.to(tl.int64)[:, None]
        k = tl.load(k_base + cols * sks + offs_d[None, :] * skd, mask=n_ok[:, None], other=0.0).to(tl.float32)
        k_partner = tl.load(k_base + cols * sks + partner[None, :] * skd, mask=n_ok[:, None], other=0.0)
        ck = tl.load(cos_ptr + cols * scs + offs_d[None, :] * scd, mask=n_ok[:, None], other=0.0).to(tl.float32)
        sk = tl.load(sin_ptr + cols * sns + offs_d[None, :] * snd, mask=n_ok[:, None], other=0.0).to(tl.float32)
        k = (k * ck + sign[None, :] * k_partner.to(tl.float32) * sk).to(k_ptr.dtype.element_ty)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        valid = n_ok[None, :]
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols * svs + offs_d[None, :] * svd, mask=n_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    o_ptrs = o_ptr + b * sob + h * soh + rows * sos + offs_d[None, :] * sod
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=m_ok)


SPACE: dict[str, list[int]] = {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64, 128], "num_warps": [4, 8],
                               "num_stages": [2, 3, 4]}  # fmt: skip


def default_config(head_dim: int, device: torch.device) -> dict[str, int]:
    """FA2 tile config (Triton's fused-attention tutorial): 128 x 64 tiles, 4 warps for D <= 64, else 8; 16 x 16
    under the CPU interpreter."""
    if device.type != "cuda":
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4 if head_dim <= 64 else 8, "num_stages": 3}


def fused_rotary_and_fa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    causal: bool = True,
    interleaved: bool = False,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention over rotary(q), rotary(k) in one kernel (see the module docstring); writes `out` if given.
    `config` overrides entries of the tile config (keys of `SPACE`). Arguments its registered signature refuses
    (float64, mixed dtypes, D not in HEAD_DIMS) raise OpMatchError, as get_op's match would."""
    B, HQ, S, D = q.shape
    HK = k.shape[1]
    if k.shape != (B, HK, S, D) or v.shape != k.shape or HQ % HK or cos.shape != (S, D) or sin.shape != (S, D):
        raise ValueError(
            f"fused_rotary_and_fa: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, cos {list(cos.shape)}, "
            f"sin {list(sin.shape)}: expected q [B, Hq, S, D], k and v [B, Hk, S, D] with Hq % Hk == 0, cos/sin [S, D]"
        )
    _TRITON_SIG.check(
        "fused_rotary_and_fa", (q, k, v, cos, sin, bool(causal), bool(interleaved), sm_scale, out, config)
    )  # (dtypes and head dims the kernel takes)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    cfg = {**default_config(D, q.device), **(config or {})}
    scale = (1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)) * 1.4426950408889634  # log2(e)
    grid = (triton.cdiv(S, cfg["BLOCK_M"]), B * HQ)
    launch(
        _rotary_flash_kernel, grid, q.device,
        q, k, v, cos, sin, out, S, HQ, HQ // HK, scale,
        *q.stride(), *k.stride(), *v.stride(), *cos.stride(), *sin.stride(), *out.stride(),
        D=D, INTERLEAVED=bool(interleaved), CAUSAL=bool(causal), PRECISION=dot_precision(q.dtype), **cfg,
    )  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------- registration


def _head_dim_ok(sizes: dict[str, Any], args: Any) -> bool:
    return sizes["D"] in HEAD_DIMS


def _gqa_ok(sizes: dict[str, Any], args: Any) -> bool:
    return sizes["Hq"] % sizes["Hk"] == 0


def _template_head_dim_ok(sizes: dict[str, Any], args: Any) -> bool:
    return head_parts(sizes["D"]) is not None


_HEAD_DIM = where(_head_dim_ok, f"D in {HEAD_DIMS}")
_TEMPLATE_HEAD_DIM = where(_template_head_dim_ok, f"D a multiple of 16 up to {MAX_HEAD_DIM}")
_GQA = where(_gqa_ok, "Hq % Hk == 0")
_CAUSAL, _SCALE = Scalar(bool, default=False, name="causal"), Optional(Scalar(float, name="sm_scale"))


def _fa_sig(dtypes: tuple[str, ...], head_dims: bool = True) -> Sig:
    return Sig(
        Tensor("B", "Hq", "S", "D", dtypes=dtypes, name="q"),
        Tensor("B", "Hk", "L", "D", name="k"),
        Tensor("B", "Hk", "L", "D", name="v"),
        _CAUSAL,
        _SCALE,
        constraints=[same_dtype(0, 1, 2), *([_TEMPLATE_HEAD_DIM] if head_dims else []), _GQA],
        token=("S", "L"),
    )


def _rope_fa_sig(dtypes: tuple[str, ...], head_dims: bool = True, out: bool = False) -> Sig:
    extra = (Optional(Tensor("B", "Hq", "S", "D", name="out")), Optional(Scalar(dict, name="config"))) if out else ()
    return Sig(
        Tensor("B", "Hq", "S", "D", dtypes=dtypes, name="q"),
        Tensor("B", "Hk", "S", "D", name="k"),
        Tensor("B", "Hk", "S", "D", name="v"),
        Tensor("S", "D", name="cos"),
        Tensor("S", "D", name="sin"),
        Scalar(bool, default=True, name="causal"),
        Scalar(bool, default=False, name="interleaved"),
        _SCALE,
        *extra,
        constraints=[same_dtype(0, 1, 2, 3, 4, 8), *([_HEAD_DIM] if head_dims else []), _GQA],
        token=("S",),
    )


_REF = (*FLOAT_DTYPES, "f64")
register_op("flash_attention_v2", flash_attention_v2, _fa_sig(FLOAT_DTYPES), impl_name="compiled",
            space=ATTENTION_SPACE,
            description="attention template (FA2 online softmax): 1 kernel")  # fmt: skip
register_op("flash_attention_v2", flash_attention_v2_reference, _fa_sig(_REF, head_dims=False),
            description="F.scaled_dot_product_attention", impl_name="torch")  # fmt: skip
_TRITON_SIG = _rope_fa_sig(FLOAT_DTYPES, out=True)  # (fused_rotary_and_fa checks direct calls against it too)
register_op("fused_rotary_and_fa", fused_rotary_and_fa, _TRITON_SIG, space=SPACE,
            description="Triton FA2 kernel rotating q and each K tile on load: 1 kernel",
            impl_name="triton")  # fmt: skip
register_op("fused_rotary_and_fa", fused_rotary_and_fa_compiled, _rope_fa_sig(FLOAT_DTYPES), impl_name="compiled",
            description="compiled rotary + sdpa: 2 row-template rotary kernels + the attention template")  # fmt: skip
register_op("fused_rotary_and_fa", fused_rotary_and_fa_reference, _rope_fa_sig(_REF, head_dims=False),
            description="rotary + F.scaled_dot_product_attention in torch", impl_name="torch")  # fmt: skip
