"""Fusion on real decoder layers (region counts, numerics) and a property test of the row fuser."""

from collections import Counter

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
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
        ("phi", {"row": 1, "gemm": 3, "attention": 1}),
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
def test_random_row_programs_fused_equal_eager(plan, rows, n, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
    model = RandomRow(plan)
    cm = dc.compile(model, backend="interpret")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(x, w)
    ref = model(x.double(), w.double())
    # forward-error bound: fp32 rounding relative to the largest intermediate (cancellation, as in
    # x - mean(x) of an already centred x, makes a purely relative bound meaningless)
    scale = max(v.abs().max().item() for v in model.values(x.double(), w.double()))
    for o, r in zip(out, ref):
        err = (o.double() - r).abs().max().item()
        assert err <= 1e-5 * scale + 1e-6, (plan, rows, n, err, scale)
