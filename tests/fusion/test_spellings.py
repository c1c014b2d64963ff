"""Equivalent spellings of RMSNorm, SiLU and GELU (plain and gated) and rotary are recognized as one op (the
`spellings` canonicalization, then `recognize`) and fuse to the same regions as the library spelling; outputs equal
eager's on the interpret backend (the generated kernels) within rtol = atol = 1e-4 (fp32, values of order 1)."""

import math
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
    "rsqrt_method": lambda x, w: x * (x.pow(2).mean(-1, keepdim=True) + EPS).rsqrt() * w,
    "sum_over_D": lambda x, w: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / D + EPS) * w,
    "square_method": lambda x, w: x * (x.square().mean(-1, keepdim=True) + EPS).rsqrt() * w,
}
def _centred(x):
    return x - x.mean(-1, keepdim=True)


LAYER_NORMS = {  # (x, w, b): LayerNorm spelled out as model code writes it
    "sqrt_of_var": lambda x, w, b: _centred(x) / torch.sqrt((_centred(x) ** 2).mean(-1, keepdim=True) + EPS) * w + b,
    "rsqrt_bias_first": lambda x, w, b: b + w * (_centred(x) * torch.rsqrt(_centred(x).pow(2).mean(-1, keepdim=True)
                                                                          + EPS)),  # fmt: skip
    "F.layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS),
}
SILUS = {
    "x*sigmoid(x)": lambda x: x * torch.sigmoid(x),
    "sigmoid(x)*x": lambda x: torch.sigmoid(x) * x,
    "x/(1+exp(-x))": lambda x: x / (1 + torch.exp(-x)),
    "x*(1/(1+exp(-x)))": lambda x: x * (1 / (1 + torch.exp(-x))),
    "x*(1+exp(-x)).reciprocal()": lambda x: x * (1 + torch.exp(-x)).reciprocal(),
    "F.silu": F.silu,
}
GELUS = {  # spelling: (activation, approximate)
    "erf_div_sqrt2": (lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), "none"),
    "erf_mul_rsqrt2": (lambda x: x * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476)), "none"),
    "x*phi(x)": (lambda x: x * (0.5 * (1.0 + torch.erf(x / 2**0.5))), "none"),
    "F.gelu": (F.gelu, "none"),
    "tanh_new_gelu": (lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))), "tanh"),
    "tanh_x*x*x": (lambda x: x * 0.5 * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x))), "tanh"),
    "tanh_bloom": (lambda x: x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))), "tanh"),
    "F.gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "tanh"),
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


def _pairs_into_halves(q, c, s):
    """DeepSeek-V3's interleaved rotary: even/odd pairs rotated, the results written as halves (HF's cos and sin)."""
    c, s = c[..., : c.shape[-1] // 2], s[..., : s.shape[-1] // 2]
    qe, qo = q[..., 0::2], q[..., 1::2]
    return torch.cat([qe * c - qo * s, qo * c + qe * s], -1)


ROTARIES = {  # q [B, H, S, HD]; cos, sin [S, HD] as HF builds them (cat(freqs, freqs)), or one value per pair
    "rotate_half": lambda q, c, s: q * c + torch.cat((-_half(q)[1], _half(q)[0]), -1) * s,
    "cat_of_halves": lambda q, c, s: _cat_of_halves(q, c, s, True),
    "cat_of_halves_half_width": lambda q, c, s: _cat_of_halves(q, c, s, False),
    "stacked_pairs": lambda q, c, s: _stacked_pairs(q, c, s, True),
    "stacked_pairs_half_width": lambda q, c, s: _stacked_pairs(q, c, s, False),
    "pairs_into_halves": _pairs_into_halves,
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


def _compiled(model: nn.Module, *args: torch.Tensor) -> dc.CompiledModule:
    """The model compiled (interpret backend), its outputs compared with eager's."""
    model = randomize_(model).eval()
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        torch.testing.assert_close(cm(*args), model(*args), rtol=1e-4, atol=1e-4)
    return cm


def _compile(model: nn.Module, *args: torch.Tensor) -> tuple[Counter, Counter]:
    """The recognized composite ops and the fused regions; outputs compared with eager (interpret backend)."""
    cm = _compiled(model, *args)
    recognized = Counter(re.findall(r"= (dl\.(?:rms_norm|silu|sigmoid|gelu|glu|rotary))", cm.ir("after:recognize")))
    return recognized, Counter(cm.report().patterns)


@pytest.mark.parametrize("spelling", list(RMS_NORMS))
def test_rms_norm_spellings_are_one_op_in_the_gemm_prologue(spelling):
    ops, regions = _compile(NormLinear(RMS_NORMS[spelling]), torch.randn(2, 5, D))
    assert ops == {"dl.rms_norm": 1}
    assert regions == {"gemm": 1}


class LayerNormLinear(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm, self.proj = norm, nn.Linear(D, D)
        self.w, self.b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))

    def forward(self, x):
        return self.proj(self.norm(x, self.w, self.b))


@pytest.mark.parametrize("spelling", list(LAYER_NORMS))
def test_layer_norm_spellings_are_one_op(spelling):
    """The centred x's RMSNorm plus a bias is LayerNorm: one dl.layer_norm, whatever the spelling."""
    cm = _compiled(LayerNormLinear(LAYER_NORMS[spelling]), torch.randn(2, 5, D))
    ops = Counter(re.findall(r"= (dl\.(?:rms_norm|layer_norm|reduce_mean))", cm.ir("after:recognize")))
    assert ops == {"dl.layer_norm": 1}


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_a_spelled_layer_norm_of_a_constant_row_is_exact(backend):
    """Rows made constant by copying a 0-d tensor into them (a broadcast, stride 0, in the compiled program):
    the spelled LayerNorm's mean over the broadcast was an ulp off, which rsqrt(eps) made 2e-5 (fuzz seed 2202);
    raised to dl.layer_norm, the output is the bias, as eager's is."""

    class Fill(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(25)), nn.Parameter(torch.randn(25))

        def forward(self, x, c):
            x.copy_(c)
            return LAYER_NORMS["sqrt_of_var"](x, self.w, self.b)

    model = Fill().eval()
    x, c = torch.randn(2, 2, 25), torch.tensor(0.5249)
    cm = dc.compile(model, backend=backend)
    with torch.no_grad():
        out = cm(x.clone(), c)
    torch.testing.assert_close(out, model.b.detach().expand(2, 2, 25), rtol=0, atol=1e-6)


def test_norm_plus_eps_is_not_an_rms_norm():
    """x / (||x|| / sqrt(D) + eps) puts eps outside the root: not RMSNorm's math, so not raised to it."""
    norm = lambda x, w: x / (x.norm(dim=-1, keepdim=True) / math.sqrt(D) + EPS) * w  # noqa: E731
    ops, _ = _compile(NormLinear(norm), torch.randn(2, 5, D))
    assert "dl.rms_norm" not in ops


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("spelling", list(SILUS))
def test_silu_spellings_are_one_op(spelling, gated):
    """Plain: silu rides in the gate GEMM's epilogue. Gated: glu(gate, up), one dual GEMM, then the down GEMM."""
    ops, regions = _compile(Mlp(SILUS[spelling], gated), torch.randn(2, 5, D))
    assert ops == ({"dl.glu": 1} if gated else {"dl.silu": 1})
    assert regions == {"gemm": 2}


@pytest.mark.parametrize("spelling", list(ROTARIES))
def test_rotary_spellings_are_one_op_in_the_gemm_epilogue(spelling):
    """One dl.rotary, in the GEMM's epilogue. Half-width cos/sin are widened to the head (cat(c, c)) first: each
    such cat runs as a row kernel of its own (a concatenation along the last dim), nothing else does."""
    cos, sin = _rope(5, interleaved=spelling.startswith("stacked"))
    cm = _compiled(QRotary(ROTARIES[spelling]), torch.randn(2, 5, D), cos, sin)
    assert Counter(re.findall(r"= (dl\.rotary)", cm.ir("after:recognize"))) == {"dl.rotary": 1}
    regions = cm.report().regions
    assert [r.pattern for r in regions].count("gemm") == 1
    views = {"dl.slice", "dl.reshape", "dl.permute", "dl.broadcast"}
    widen = [r.ops for r in regions if r.pattern != "gemm"]
    assert all([o for o in ops if o not in views] == ["dl.cat"] for ops in widen), widen
    assert len(widen) == (2 if spelling.endswith("half_width") or spelling == "pairs_into_halves" else 0)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("spelling", list(GELUS))
def test_gelu_spellings_are_one_op(spelling, gated):
    """Plain: gelu (exact or tanh, as spelled) rides in the fc GEMM's epilogue. Gated (GeGLU): glu(gate, up) with
    that gelu, one dual GEMM, then the down GEMM."""
    act, approximate = GELUS[spelling]
    cm = _compiled(Mlp(act, gated), torch.randn(2, 5, D))
    found = re.findall(r"= (dl\.(?:gelu|glu|erf|tanh)) [^{\n]*(\{[^}]*\})?", cm.ir("after:recognize"))
    if gated:
        assert found == [("dl.glu", '{act = "%s"}' % ("gelu_tanh" if approximate == "tanh" else "gelu"))]
    else:
        assert found == [("dl.gelu", '{approximate = "tanh"}' if approximate == "tanh" else "")]
    regions = cm.report().regions
    assert [r.pattern for r in regions] == ["gemm", "gemm"]
    assert ("dl.glu" if gated else "dl.gelu") in regions[0].ops


def test_gelu_with_another_constant_is_not_gelu():
    """0.5 * x * (1 + erf(x / 1.4)) is not GELU (1.4 != sqrt(2)): it stays elementwise math, in the GEMM epilogue."""
    ops, regions = _compile(Mlp(lambda x: 0.5 * x * (1 + torch.erf(x / 1.4)), False), torch.randn(2, 5, D))
    assert "dl.gelu" not in ops
    assert regions == {"gemm": 2}
