"""FX capture + import + reference backend equal eager (fp32, rel. tol 1e-5) on real model code."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.numerics import rel_error

from ..hf import llama_config, llama_layer_and_inputs


def _check(model, *args, tol=1e-5, **kwargs):
    cm = dc.compile(model, backend="reference", check_each_pass=True)
    with torch.no_grad():
        out, ref = cm(*args, **kwargs), model(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(outs, refs):
        assert rel_error(o, r) <= tol, rel_error(o, r)
    return cm


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_llama_block(attention):
    cfg = BlockConfig(attention=attention)
    model = randomize_(LlamaBlock(cfg)).eval()
    cm = _check(model, *llama_block_inputs(cfg, 2, 8))
    ir = cm.ir("input")
    assert "dl.linear" in ir and "dl.reduce_mean" in ir
    assert ("dl.sdpa" in ir) == (attention == "sdpa")
    assert ("dl.softmax" in ir) == (attention == "explicit")


def test_hf_llama_mlp_and_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    cfg = llama_config()
    x = torch.randn(2, 5, cfg.hidden_size)
    cm = _check(randomize_(LlamaMLP(cfg)).eval(), x)
    assert cm._spec().captured.how == "symbolic_trace"
    assert cm.ir("input").count("dl.linear") == 3
    assert cm.ir().count("dl.linear") == 2  # gate and up merged into one GEMM
    norm = LlamaRMSNorm(cfg.hidden_size)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    _check(norm, x)


def test_hf_llama_decoder_layer_via_dynamo():
    """LlamaDecoderLayer takes a (cos, sin) tuple, which symbolic_trace cannot follow: dynamo captures it."""
    layer, args, kwargs = llama_layer_and_inputs(tokens=7)
    cm = _check(layer, *args, **kwargs)
    spec = cm._spec()
    assert spec.captured.how == "dynamo"
    assert any("symbolic_trace failed" in n for n in spec.notes)
    assert "dl.sdpa" in cm.ir("input") and "dl.torch_call" not in cm.ir("input")


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow
            return self.lin(x)
        return x


def test_untraceable_module_names_the_cause():
    cm = dc.compile(Branchy(), backend="reference")
    with pytest.raises(dc.FrontendError) as e, torch.no_grad():
        cm(torch.randn(2, 8))
    msg = str(e.value)
    assert "Branchy" in msg and "symbolic_trace failed" in msg and "test_frontend.py" in msg


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, scale: float = 1.0):
        return F.gelu(self.lin(x)) * scale, x.mean(-1)


def test_new_shape_respecializes_and_outputs_keep_structure():
    m = Small().eval()
    cm = dc.compile(m, backend="reference")
    for shape in [(2, 16), (3, 5, 16), (2, 16)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            out = cm(x, scale=0.5)
            ref = m(x, scale=0.5)
        assert isinstance(out, tuple) and len(out) == 2
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
    assert cm.specializations == 2
    with torch.no_grad():
        cm(torch.randn(2, 16), scale=2.0)  # a different non-tensor argument is a new signature
    assert cm.specializations == 3


def test_dtype_change_respecializes():
    m = Small().eval()
    cm = dc.compile(m, backend="reference")
    with torch.no_grad():
        cm(torch.randn(2, 16))
        m.to(torch.bfloat16)
        out = cm(torch.randn(2, 16, dtype=torch.bfloat16))
    assert out[0].dtype == torch.bfloat16 and cm.specializations == 2
    assert "bf16" in cm.ir("input")


def test_input_on_another_device_is_refused_clearly():
    cm = dc.compile(Small(), backend="reference")
    x = torch.randn(2, 16, device="meta")
    with pytest.raises(dc.FrontendError, match="input 0 is on meta but the model's parameters are on cpu"), torch.no_grad():
        cm(x)


class Unknown(nn.Module):
    def forward(self, x):
        return torch.flip(x, dims=[-1]).cumsum(-1) + 1.0


def test_unknown_ops_become_torch_calls_with_source_lines():
    m = Unknown()
    cm = _check(m, torch.randn(3, 4))
    ir = cm.ir("input")
    assert 'dl.torch_call "torch' in ir and "flip" in ir
    report = cm.report()
    assert "torch fallbacks: 2" in report and "test_frontend.py" in report


def test_int_inputs_and_embedding():
    emb = nn.Embedding(50, 16)
    lin = nn.Linear(16, 4)
    model = nn.Sequential(emb, lin).eval()
    cm = _check(model, torch.randint(0, 50, (2, 7)))
    assert "dl.embedding" in cm.ir("input")


def test_unsupported_dtype_is_a_clear_error():
    cm = dc.compile(nn.Identity(), backend="reference")
    with pytest.raises(dc.FrontendError, match="complex64"):
        cm(torch.randn(3, dtype=torch.complex64))
