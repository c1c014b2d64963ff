"""Fusion on real decoder layers (region counts, numerics) and a property test of the row fuser."""

import copy
import warnings
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dlblas_compiler as dc
from dlblas_compiler.models import randomize_
from dlblas_compiler.numerics import rel_error

from ..hf import llama_layer_and_inputs


def _regions(cm) -> dict[str, int]:
    return dict(Counter(cm.report().patterns))


def _layer(name: str):
    if name == "llama":
        return llama_layer_and_inputs(tokens=7)
    from transformers import PhiConfig, Qwen2Config
    from transformers.models.phi.modeling_phi import PhiDecoderLayer, PhiRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    base = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, vocab_size=100)
    if name == "qwen2":  # bias in q/k/v, GQA
        cfg, layer_cls, rot = Qwen2Config(**base, num_key_value_heads=2), Qwen2DecoderLayer, Qwen2RotaryEmbedding
    else:  # phi: partial rotary, GELU MLP, LayerNorm, attention and MLP in parallel
        cfg = PhiConfig(**base, num_key_value_heads=4, partial_rotary_factor=0.5)
        layer_cls, rot = PhiDecoderLayer, PhiRotaryEmbedding
    cfg._attn_implementation = "sdpa"
    layer = randomize_(layer_cls(cfg, 0)).eval()
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    cos, sin = rot(cfg)(x, torch.arange(7)[None])
    return layer, (x,), {"position_embeddings": (cos, sin), "attention_mask": None}


@pytest.mark.parametrize(
    "name,expected",
    [
        ("llama", {"gemm": 4, "attention": 1}),
        ("qwen2", {"gemm": 4, "attention": 1}),
        ("phi", {"gemm": 3, "attention": 1}),  # (its LayerNorm the QKV+fc1 GEMM's prologue)
    ],
)
def test_decoder_layers_fuse_to_five_kernels(name, expected):
    layer, args, kwargs = _layer(name)
    cm = dc.compile(layer, backend="interpret", check_each_pass=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(*args, **kwargs)
        ref = layer(*args, **kwargs)
    out, ref = (o[0] if isinstance(o, tuple) else o for o in (out, ref))
    assert rel_error(out, ref) < 1e-5
    assert _regions(cm) == expected
    top = [ln for ln in cm.ir().splitlines() if ln.startswith("    %") and "= dl." in ln]
    assert all(any(k in ln for k in ("dl.fused", "dl.param", "dl.cat", "dl.mul", "dl.constant")) for ln in top), top


def test_llama_qkv_rotary_in_one_gemm_and_v_untouched():
    layer, args, kwargs = llama_layer_and_inputs(tokens=5)
    cm = dc.compile(layer, backend="reference")
    with torch.no_grad():
        cm(*args, **kwargs)
    ir = cm.ir()
    first = ir.split('dl.fused "gemm"')[1].split("dl.yield")[0]
    assert first.count("dl.rotary") == 2 and "dl.rms_norm" in first and first.count("dl.linear") == 1


class HeadsAttention(nn.Module):
    """q = k = v = heads of x @ W^T, transposed to [B, H, S, D] as HF's attention does; SDPA; o back to [B, S, H*D]
    (and with `keep_q` q returned too)."""

    def __init__(self, keep_q: bool, norm: bool = False):
        super().__init__()
        self.keep_q, self.norm = keep_q, norm
        self.proj = nn.Linear(32, 64, bias=False)
        self.head_norm = nn.RMSNorm(16, eps=1e-6)  # (Qwen3's per-head norm, after the transpose)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, 4, 16).transpose(1, 2)
        q = self.head_norm(q) if self.norm else q
        o = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(b, s, 64)
        return (o, q) if self.keep_q else o


@pytest.mark.parametrize("keep_q,norm,tokens", [(False, False, 24), (True, False, 24), (False, True, 24), (False, True, 5)])
def test_heads_leave_the_gemm_in_eager_order_for_the_attention(keep_q, norm, tokens):
    """A GEMM output transposed into heads for an attention region leaves the GEMM in the order before the
    transpose, as eager lays it out ([B, S, H, D]: its tiles store whole rows), and the attention region reads it
    through the transpose; so an SDPA run by torch returns its output in that order too (cuDNN's follows q's), and
    the reshape to [B, S, H*D] is a view instead of a copy. A value also returned to the caller keeps its place. A
    per-head RMSNorm after the transpose (Qwen3's) keeps eager's order too, at 48 rows and at 10."""
    m = randomize_(HeadsAttention(keep_q, norm)).eval()
    x = torch.randn(2, tokens, 32, generator=torch.Generator().manual_seed(3))
    cm = dc.compile(m, backend="interpret", check_each_pass=True)
    with torch.no_grad():
        out, ref = cm(x), m(x)
    for o, r in zip(*(v if keep_q else (v,) for v in (out, ref)), strict=True):
        assert rel_error(o, r) < 1e-5
    assert all(k.impl == "kernel" for k in cm.report().kernels), cm.report().kernels
    gemm = cm.ir().split('dl.fused "gemm"')[1].split("dl.yield")[1].splitlines()[0]
    attention = cm.ir().split('dl.fused "attention"')[1].split("dl.sdpa")[0]
    if keep_q:
        assert f"tensor<2x4x{tokens}x16xf32>" in gemm and "dl.permute" not in attention, (gemm, attention)
    else:
        assert f"tensor<2x{tokens}x4x16xf32>" in gemm and "dl.permute" in attention, (gemm, attention)


# -- a matmul by a weight is a linear, however the code spells it ------------------------------------

LINEAR_SPELLINGS = ["W.t()", "W.T", "W.transpose(0, 1)", "torch.matmul(x, W.T) + b", "x @ W_io", "torch.addmm"]


class WeightMatmul(nn.Module):
    """x times a weight in one of the spellings models use, then a residual add (the GEMM's epilogue)."""

    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling
        self.w = nn.Parameter(torch.randn(48, 32) / 6)  # [out, in]: nn.Linear's layout
        self.w_io = nn.Parameter(torch.randn(32, 48) / 6)  # [in, out]: GPT-2 Conv1D's layout
        self.b = nn.Parameter(torch.randn(48))

    def forward(self, x, r):
        s = self.spelling
        if s == "W.t()":
            y = x @ self.w.t()
        elif s == "W.T":
            y = x @ self.w.T
        elif s == "W.transpose(0, 1)":
            y = x @ self.w.transpose(0, 1)
        elif s == "torch.matmul(x, W.T) + b":
            y = torch.matmul(x, self.w.T) + self.b
        elif s == "x @ W_io":
            y = x @ self.w_io
        else:  # GPT-2's Conv1D
            y = torch.addmm(self.b, x.view(-1, x.shape[-1]), self.w_io).view(*x.shape[:-1], 48)
        return y + r


@pytest.mark.parametrize("spelling", LINEAR_SPELLINGS)
def test_matmul_by_a_weight_is_one_gemm(spelling):
    torch.manual_seed(0)
    model = WeightMatmul(spelling).eval()
    x, r = torch.randn(2, 5, 32), torch.randn(2, 5, 48)
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(x, r)
        ref = copy.deepcopy(model).double()(x.double(), r.double())
    assert rel_error(out, ref) < 1e-5
    assert _regions(cm) == {"gemm": 1}  # the linear, its bias and the residual add: one kernel
    ir = cm.ir()
    assert "dl.matmul" not in ir and "addmm" not in ir
    linear = next(ln for ln in ir.splitlines() if "dl.linear" in ln)
    assert ("bias" in linear) == (spelling in ("torch.matmul(x, W.T) + b", "torch.addmm"))
    # a weight the code transposes in a way the linear does not read through is transposed once, at load time
    assert ("= dl.permute" in ir) == (spelling in ("x @ W_io", "torch.addmm"))


# -- grouped-query / multi-query attention, however the code spells it ------------------------------

GQA_SPELLINGS = ["expand+reshape", "repeat_interleave", "enable_gqa", "expand before transpose"]
GQA_SPELLINGS += ["multi-query", "explicit multi-query"]


class GroupedAttention(nn.Module):
    """Attention (causal) of 4 query heads over fewer k/v heads, k/v repeated per group in one of the spellings models
    use (HF's repeat_kv, repeat_interleave, SDPA's enable_gqa, Falcon's broadcast_to + flatten on [B, S, H, D],
    and one k/v head broadcast by SDPA itself or by the matmuls of softmax(q k^T s) v: multi-query)."""

    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling

    def forward(self, q, k, v):
        s, g = self.spelling, q.shape[1] // k.shape[1]
        b, hk, n, d = k.shape
        if s == "expand+reshape":
            k, v = (t[:, :, None].expand(b, hk, g, n, d).reshape(b, hk * g, n, d) for t in (k, v))
        elif s == "repeat_interleave":
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        elif s == "expand before transpose":
            bshd = (t.transpose(1, 2)[:, :, :, None].expand(b, n, hk, g, d) for t in (k, v))
            k, v = (t.flatten(2, 3).transpose(1, 2) for t in bshd)
        elif s == "explicit multi-query":  # (not causal)
            return torch.softmax(q @ k.transpose(-1, -2) * d**-0.5, dim=-1) @ v
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=s == "enable_gqa")


@pytest.mark.parametrize("spelling", GQA_SPELLINGS)
def test_grouped_attention_is_one_kernel_over_the_unrepeated_heads(spelling):
    hk = 1 if "multi-query" in spelling else 2
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 20, 16, generator=g)
    k, v = torch.randn(2, hk, 20, 16, generator=g), torch.randn(2, hk, 20, 16, generator=g)
    model = GroupedAttention(spelling)
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(q, k, v)
    ref = model(q.double(), k.double(), v.double())
    assert rel_error(out, ref) < 1e-5
    assert _regions(cm) == {"attention": 1}
    sdpa = next(ln for ln in cm.ir().splitlines() if "dl.sdpa" in ln)
    # the kernel reads each k/v head once per group: no repeated copy of k and v is made
    assert "enable_gqa = true" in sdpa and f"tensor<2x4x20x16xf32>, tensor<2x{hk}x20x16xf32>" in sdpa
    assert "dl.broadcast" not in cm.ir()


class MaskedAttention(nn.Module):
    """Attention over a static cache's keys (L > S) with a mask spelled several ways: made from constants
    alone (causal ones the compiler can recognize by their values, and others), or from an input."""

    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling

    def forward(self, q, k, v, pos):
        s, l_, sp = q.shape[-2], k.shape[-2], self.spelling
        rows, cols = torch.arange(s)[None, None, :, None], torch.arange(l_)[None, None, None, :]
        if sp == "aranges":  # Hugging Face's spelling under tracing
            mask = cols <= rows
        elif sp == "tril":
            mask = torch.ones(s, l_, dtype=torch.bool).tril()
        elif sp == "additive":
            # (in the query's dtype: torch 2.13's CPU SDPA of float64 inputs under a float32 mask gives other
            # values on some machines, which made the float64 reference wrong)
            mask = torch.full((s, l_), float("-inf"), dtype=q.dtype).triu(1)
        elif sp == "offset 2":
            mask = cols <= rows + 2
        elif sp == "sliding window":
            mask = (cols <= rows) & (cols > rows - 3)
        elif sp == "from an input":
            mask = cols <= pos[None, None, :, None]
        else:  # "written in place": causal, then padding from an input
            mask = (cols <= rows).expand(q.shape[0], 1, s, l_).clone()
            mask &= pos[: q.shape[0], None, None, None] <= cols
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize(
    "spelling", ["aranges", "tril", "additive", "offset 2", "sliding window", "from an input", "written in place"]
)
def test_a_causal_mask_made_from_constants_becomes_causal_attention(spelling):
    """A causal mask the graph builds from constants (here over 5 unused cache slots) is recognized by its
    values: the attention runs torch's causal form over the first S keys and reads no mask. Other masks stay."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 16, generator=g)
    k, v = torch.randn(2, 2, 14, 16, generator=g), torch.randn(2, 2, 14, 16, generator=g)
    pos = torch.arange(9) % 4  # an input (rows keep keys <= pos; in "written in place" the first keys padding)
    model = MaskedAttention(spelling)
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(q, k, v, pos)
    ref = model(q.double(), k.double(), v.double(), pos)
    assert rel_error(out, ref) < 1e-5
    sdpa = next(ln for ln in cm.ir().splitlines() if "dl.sdpa" in ln)
    if spelling in ("aranges", "tril", "additive"):
        assert "is_causal = true" in sdpa and " mask " not in sdpa and "x9x16xf32>, tensor<2x2x9x16xf32>" in sdpa
        assert "torch_call" not in cm.ir()  # the mask's ops are gone
    else:
        assert " mask " in sdpa and "is_causal" not in sdpa


# -- regions that would read each other: no cycle through a region already claimed --------------------


class SharedBranch(nn.Module):
    """A GEMM's output h multiplied by a transform t of a second input (the GEMM's epilogue) and, row-reduced, by
    t's row reduction: a row region taking t and both reductions would read the GEMM region and be read by it (a
    cycle through the GEMM region though no op path leaves the row ops and comes back). `variant` gives the same
    diamond other shapes: a bool mask as t, a second GEMM adding h (its epilogue) whose output the row region
    reduces, a second GEMM on t itself."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.lin, self.lin2 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x, w):
        h = self.lin(x)
        if self.variant == "mask":
            bm = w > 0.3
            return h * bm, bm.float().mean(-1) * h.mean(-1)
        t = w.exp()
        if self.variant == "exp":
            return h * t, t.mean(-1) * h.mean(-1)
        if self.variant == "second_gemm_residual":
            g = self.lin2(x) + h
            return h * t, t.sum(-1) + g.amax(-1)
        g = self.lin2(t)  # "second_gemm_on_t"
        return h * t, g + h, t.mean(-1) * h.mean(-1) * g.mean(-1)


@pytest.mark.parametrize("variant", ["exp", "mask", "second_gemm_residual", "second_gemm_on_t"])
def test_regions_that_would_read_each_other_are_not_planned(variant):
    m = randomize_(SharedBranch(variant)).eval()
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(2, 5, 16, generator=g), torch.rand(2, 5, 16, generator=g)
    cm = dc.compile(m, backend="interpret")
    with torch.no_grad():
        out, ref = cm(x, w), m(x, w)
    for o, r in zip(out, ref, strict=True):
        assert rel_error(o, r) < 1e-5
    assert all(k.impl == "kernel" for k in cm.report().kernels), cm.report().kernels
    ir = cm.ir("final")
    gemms = [body.split("dl.yield")[0] for body in ir.split('dl.fused "gemm"')[1:]]
    assert ir.count("dl.linear") == sum(b.count("dl.linear") for b in gemms), ir  # every linear in a GEMM region
    assert any("dl.linear" in b and "dl.mul" in b for b in gemms), ir  # h * t in the first GEMM's epilogue


# -- property test: random row programs, fused and run as generated kernels, equal eager ------------

UNARY = [torch.tanh, torch.sigmoid, F.silu, F.gelu, torch.abs, lambda t: t * 0.5, lambda t: -t]
BINARY = [torch.add, torch.sub, torch.mul, lambda a, b: a / (b.abs() + 1.0), torch.maximum]


class RandomRow(nn.Module):
    def __init__(self, plan):
        super().__init__()
        self.plan = plan

    def forward(self, x, w):
        vals = self.values(x, w)
        return vals[-1], vals[len(vals) // 2]

    def values(self, x, w):
        vals = [x]
        for kind, i, j in self.plan:
            a = vals[i % len(vals)]
            if kind == "unary":
                vals.append(UNARY[j % len(UNARY)](a))
            elif kind == "weight":
                vals.append(BINARY[j % len(BINARY)](a, w))
            elif kind == "binary":
                vals.append(BINARY[j % len(BINARY)](a, vals[j % len(vals)]))
            elif kind == "center":
                vals.append(a - a.mean(-1, keepdim=True))
            elif kind == "scale":
                vals.append(a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-5))
            else:
                vals.append(torch.softmax(a, dim=-1))
        return vals


steps = st.lists(
    st.tuples(
        st.sampled_from(["unary", "weight", "binary", "center", "scale", "softmax"]),
        st.integers(0, 7),
        st.integers(0, 7),
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps, rows=st.integers(1, 5), n=st.integers(2, 40), seed=st.integers(0, 2**16))
# (a cancellation normalized again, the case the bound's last term is for)
@example(plan=[("scale", 0, 0), ("binary", 1, 6), ("scale", 2, 0)], rows=3, n=38, seed=1440)
def test_random_row_programs_fused_equal_eager(plan, rows, n, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
    model = RandomRow(plan)
    cm = dc.compile(model, backend="interpret")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(x, w)
    ref = model(x.double(), w.double())
    eager = model(x, w)
    # forward-error bound: fp32 rounding relative to the largest intermediate (cancellation, as in
    # x - mean(x) of an already centred x, makes a purely relative bound meaningless), or twice eager's own fp32 error
    # where a later normalization amplifies a cancellation (x * rsqrt(mean(x^2)) - x of a row already near unit RMS,
    # normalized again: eager in fp32 is itself 1.2x past the first bound on such a row)
    scale = max(v.abs().max().item() for v in model.values(x.double(), w.double()))
    for o, e, r in zip(out, eager, ref, strict=True):
        err = (o.double() - r).abs().max().item()
        eager_err = (e.double() - r).abs().max().item()
        assert err <= 1e-5 * scale + 1e-6 + 2 * eager_err, (plan, rows, n, err, eager_err, scale)
