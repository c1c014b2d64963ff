"""Rotary position embedding of q and k, through the compiler's row template.

    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, interleaved=False)
    q_out, k_out = partial_rotary_emb(q, k, cos, sin, interleaved=False)

q [T, Hq, D], k [T, Hk, D] (token-major, as vLLM lays out projections; Hq and Hk independent, so GQA / MQA);
cos, sin [T, D] per token (apply_rotary_pos_emb) or [T, R] with R <= D even (partial_rotary_emb: the rotation
covers the first R dims of each head, dims [R, D) pass through unchanged, as GPT-NeoX / Phi partial rotary).
All four share a dtype; any strides. Returns new tensors of q's and k's shapes:

    out = x * cos + rotate(x) * sin          (per head, cos/sin broadcast over heads, in float32, rounded once)
    rotate(x) = cat(-x[..., R/2:R], x[..., :R/2])               half-split layout (HF rotate_half, NeoX);
                cos/sin = cat(freqs, freqs)
    rotate(x) = stack(-x[..., 1:R:2], x[..., 0:R:2]).flatten()  interleaved layout (GPT-J, Meta's complex form);
                cos/sin = freqs.repeat_interleave(2)

Implementation: the compiler raises the torch spelling to dl.rotary (rotary_dim = R for the partial form) and
the row template generates it: 2 kernels per call, one for q and one for k (each reads cos/sin through a
broadcast over heads; no copies of cos/sin).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .common import FLOAT_DTYPES
from .registry import Scalar, Sig, Tensor, register_op, same_dtype, where
from .templated import ROW_SPACE, run


def rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """rotate_half (half-split) or rotate_every_two (interleaved) along the last dim, spelled as HF / GPT-J do."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    r = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    if r == x.shape[-1]:
        return x * c + rotate(x, interleaved) * s
    xr = x[..., :r]
    return torch.cat((xr * c + rotate(xr, interleaved) * s, x[..., r:]), dim=-1)


def apply_rotary_pos_emb_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding in torch, in the inputs' dtype (pass float64 tensors for a float64 reference)."""
    return _rope(q, cos, sin, interleaved), _rope(k, cos, sin, interleaved)


partial_rotary_emb_reference = apply_rotary_pos_emb_reference  # cos/sin of width R < D make it partial


class RotaryModule(nn.Module):
    """q, k [T, H, D], cos/sin [T, R]: the compiler's spelling with static R and D (no shape arithmetic in the
    traced code)."""

    def __init__(self, rotary_dim: int, head_dim: int, interleaved: bool) -> None:
        super().__init__()
        self.r, self.d, self.interleaved = rotary_dim, head_dim, interleaved

    def _rot(self, x: torch.Tensor) -> torch.Tensor:
        if self.interleaved:
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        h = self.r // 2
        return torch.cat((-x[..., h : self.r], x[..., :h]), dim=-1)

    def _one(self, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if self.r == self.d:
            return x * c + self._rot(x) * s
        xr = x[..., : self.r]
        return torch.cat((xr * c + self._rot(xr) * s, x[..., self.r :]), dim=-1)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return self._one(q, c, s), self._one(k, c, s)


def _run(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> Any:
    r, d, inter = cos.shape[-1], q.shape[-1], bool(interleaved)
    if r % 2 or r > d or k.shape[-1] != d:
        raise ValueError(f"rotary: cos/sin width {r} must be even and <= the head dim of q {list(q.shape)} and k "
                         f"{list(k.shape)}")  # fmt: skip
    return run("rotary", lambda: RotaryModule(r, d, inter), (r, d, inter), q, k, cos, sin)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q [T, Hq, D] and k [T, Hk, D] with cos/sin [T, D] (see the module docstring)."""
    return _run(q, k, cos, sin, interleaved)


def partial_rotary_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of the first R dims of each head, cos/sin [T, R] (see the module docstring)."""
    return _run(q, k, cos, sin, interleaved)


def _sig(dtypes: tuple[str, ...], rotary: str) -> Sig:
    constraints = [same_dtype(0, 1, 2, 3), where(lambda s, a: s["D"] % 2 == 0, "D even")]
    if rotary == "R":
        constraints.append(where(lambda s, a: s["R"] % 2 == 0 and s["R"] <= s["D"], "R even and R <= D"))
    return Sig(
        Tensor("T", "Hq", "D", dtypes=dtypes, name="q"),
        Tensor("T", "Hk", "D", name="k"),
        Tensor("T", rotary, name="cos"),
        Tensor("T", rotary, name="sin"),
        Scalar(bool, default=False, name="interleaved"),
        constraints=constraints,
        token=("T",),
    )


for _name, _fn, _ref, _rot in (
    ("apply_rotary_pos_emb", apply_rotary_pos_emb, apply_rotary_pos_emb_reference, "D"),
    ("partial_rotary_emb", partial_rotary_emb, partial_rotary_emb_reference, "R"),
):
    register_op(_name, _fn, _sig(FLOAT_DTYPES, _rot), space=ROW_SPACE, impl_name="compiled",
                description="row template (dl.rotary): 2 kernels, one for q and one for k")  # fmt: skip
    register_op(_name, _ref, _sig((*FLOAT_DTYPES, "f64"), _rot), description="torch eager", impl_name="torch")
