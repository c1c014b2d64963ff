"""Equivalent spellings of RMSNorm, SiLU (plain and gated) and rotary are recognized as one op (the `spellings`
canonicalization, then `recognize`) and fuse to the same regions as the library spelling; outputs equal eager's on
the interpret backend (the generated kernels) within rtol = atol = 1e-4 (fp32, values of order 1)."""

import re
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.models import randomize_

D, HEADS, HD, EPS = 64, 4, 16, 1e-6


def _half(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = t.shape[-1] // 2
    return t[..., :h], t[..., h:]


RMS_NORMS = {
    "rsqrt_pow": lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w,
    "div_sqrt_square": lambda x, w: x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * w,
    "weight_first_pow_op": lambda x, w: w * (x * torch.rsqrt(torch.mean(x**2, dim=-1, keepdim=True) + EPS)),
    "reciprocal_sqrt": lambda x, w: x * (1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)) * w,
    "F.rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
}
SILUS = {
    "x*sigmoid(x)": lambda x: x * torch.sigmoid(x),
    "sigmoid(x)*x": lambda x: torch.sigmoid(x) * x,
    "x/(1+exp(-x))": lambda x: x / (1 + torch.exp(-x)),
    "x*(1/(1+exp(-x)))": lambda x: x * (1 / (1 + torch.exp(-x))),
    "F.silu": F.silu,
}
def _cat_of_halves(q, c, s, full_width: bool):
    (q1, q2), (c1, c2), (s1, s2) = _half(q), _half(c), _half(s)
    if not full_width:  # one half-width cos/sin for both halves
        c2, s2 = c1, s1
    return torch.cat((q1 * c1 - q2 * s1, q2 * c2 + q1 * s2), -1)


def _stacked_pairs(q, c, s, full_width: bool):
    qe, qo, ce, co, se, so = q[..., ::2], q[..., 1::2], c[..., ::2], c[..., 1::2], s[..., ::2], s[..., 1::2]
    if not full_width:
        co, so = ce, se
    return torch.stack((qe * ce - qo * se, qo * co + qe * so), -1).flatten(-2)


ROTARIES = {  # q [B, H, S, HD]; cos, sin [S, HD] as HF builds them (cat(freqs, freqs)), or one value per pair
    "rotate_half": lambda q, c, s: q * c + torch.cat((-_half(q)[1], _half(q)[0]), -1) * s,
    "cat_of_halves": lambda q, c, s: _cat_of_halves(q, c, s, True),
    "cat_of_halves_half_width": lambda q, c, s: _cat_of_halves(q, c, s, False),
    "stacked_pairs": lambda q, c, s: _stacked_pairs(q, c, s, True),
    "stacked_pairs_half_width": lambda q, c, s: _stacked_pairs(q, c, s, False),
}


class NormLinear(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm, self.w, self.proj = norm, nn.Parameter(torch.ones(D)), nn.Linear(D, 96, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x, self.w))


class Mlp(nn.Module):
    def __init__(self, act, gated: bool):
        super().__init__()
        self.act, self.gated = act, gated
        self.gate, self.up, self.down = nn.Linear(D, 96, bias=False), nn.Linear(D, 96, bias=False), nn.Linear(96, D)

    def forward(self, x):
        h = self.act(self.gate(x))
        return self.down(h * self.up(x) if self.gated else h)


class QRotary(nn.Module):
    def __init__(self, rotary):
        super().__init__()
        self.rotary, self.q = rotary, nn.Linear(D, HEADS * HD, bias=False)

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        return self.rotary(self.q(x).view(b, n, HEADS, HD).transpose(1, 2), cos, sin)


def _rope(n: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.outer(torch.arange(n).float(), 1.0 / 10000 ** (torch.arange(0, HD, 2).float() / HD))
    emb = torch.repeat_interleave(freqs, 2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


def _compile(model: nn.Module, *args: torch.Tensor) -> tuple[Counter, Counter]:
    """The recognized composite ops and the fused regions; outputs compared with eager (interpret backend)."""
    model = randomize_(model).eval()
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        torch.testing.assert_close(cm(*args), model(*args), rtol=1e-4, atol=1e-4)
    recognized = Counter(re.findall(r"= (dl\.(?:rms_norm|silu|sigmoid|glu|rotary))", cm.ir("after:recognize")))
    return recognized, Counter(cm.report().patterns)


@pytest.mark.parametrize("spelling", list(RMS_NORMS))
def test_rms_norm_spellings_are_one_op_in_the_gemm_prologue(spelling):
    ops, regions = _compile(NormLinear(RMS_NORMS[spelling]), torch.randn(2, 5, D))
    assert ops == {"dl.rms_norm": 1}
    assert regions == {"gemm": 1}


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("spelling", list(SILUS))
def test_silu_spellings_are_one_op(spelling, gated):
    """Plain: silu rides in the gate GEMM's epilogue. Gated: glu(gate, up), one dual GEMM, then the down GEMM."""
    ops, regions = _compile(Mlp(SILUS[spelling], gated), torch.randn(2, 5, D))
    assert ops == ({"dl.glu": 1} if gated else {"dl.silu": 1})
    assert regions == {"gemm": 2}


@pytest.mark.parametrize("spelling", list(ROTARIES))
def test_rotary_spellings_are_one_op_in_the_gemm_epilogue(spelling):
    cos, sin = _rope(5, interleaved=spelling.startswith("stacked"))
    ops, regions = _compile(QRotary(ROTARIES[spelling]), torch.randn(2, 5, D), cos, sin)
    assert ops == {"dl.rotary": 1}
    assert regions == {"gemm": 1}
