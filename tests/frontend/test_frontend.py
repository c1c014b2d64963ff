"""FX capture + import + reference backend equal eager (fp32, rel. tol 1e-5) on real model code."""

from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.numerics import rel_error, tolerance

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


class ComplexRotaryAttention(nn.Module):
    """Meta's Llama reference attention: q/k rotated as complex numbers (view_as_complex * freqs_cis)."""

    def __init__(self, dim=64, heads=4, seq=16):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    @staticmethod
    def rotate(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        shape = [d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
        freqs_cis = freqs_cis.view(*shape)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.heads, self.hd) for w in (self.wq, self.wk, self.wv))
        q, k = self.rotate(q, k, self.freqs_cis[:s])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def test_rotary_written_with_complex_numbers():
    """view_as_complex / view_as_real rotary (Meta's Llama reference) imports as real parts and is recognized as
    the interleaved rotary, fused into the q/k GEMM; outputs match eager."""
    torch.manual_seed(0)
    model = ComplexRotaryAttention().eval()
    x = torch.randn(2, 11, 64)
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        out, ref = cm(x), model(x)
    assert (out - ref).abs().max() < 1e-5
    ir = cm.ir()
    assert ir.count("dl.rotary") == 2 and 'layout = "interleaved"' in ir and "complex" not in ir
    assert "attention" in cm.report().patterns and "dl.torch_call" not in ir
    # torch.compile: dynamo passes the complex buffer in as an input, taken as its real view
    from dlblas_compiler import dynamo

    dynamo.COMPILATIONS.clear()
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend="dlblas", options={"backend": "interpret"})(x)
    assert (out - ref).abs().max() < 1e-5
    # (symbolic_trace reads the table as a buffer, so its cos and sin parts are weights computed once; under dynamo
    # it is an input, and they are row kernels at each call)
    assert [[p for p in c.report().patterns if p != "row"] for c in dynamo.COMPILATIONS] == [cm.report().patterns]
    dynamo.COMPILATIONS.clear()
    torch._dynamo.reset()


def test_an_unsupported_op_on_a_complex_tensor_is_named():
    class Abs(nn.Module):
        def forward(self, x):
            return torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)).abs()

    with pytest.raises(dc.FrontendError, match="works on a complex tensor"):
        dc.compile(Abs(), backend="interpret")(torch.randn(3, 8))


class RotaryTableInForward(ComplexRotaryAttention):
    """The complex rotary with its table computed in forward from position ids, by torch.polar or torch.complex."""

    def __init__(self, make_table, dim=64, heads=4):
        super().__init__(dim, heads)
        del self.freqs_cis
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2).float() / self.hd)))
        self.make_table = make_table

    def forward(self, x, pos):
        b, s, _ = x.shape
        freqs = torch.outer(pos.float(), self.inv_freq)
        freqs_cis = self.make_table(freqs)
        q, k, v = (w(x).view(b, s, self.heads, self.hd) for w in (self.wq, self.wk, self.wv))
        q, k = self.rotate(q, k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize(
    "make_table",
    [lambda f: torch.polar(torch.ones_like(f), f), lambda f: torch.complex(torch.cos(f), torch.sin(f))],
    ids=["polar", "complex"],
)
def test_rotary_table_made_complex_in_forward(make_table):
    """torch.polar(abs, angle) / torch.complex(re, im) make complex values (abs*cos, abs*sin) / (re, im): the
    Meta-style rotary on a table computed in forward imports, is recognized and fused into the q/k GEMM."""
    torch.manual_seed(0)
    model = RotaryTableInForward(make_table).eval()
    cm = dc.compile(model, backend="interpret")
    for start in (0, 5):  # fresh inputs and positions on the second call
        x, pos = torch.randn(2, 11, 64), torch.arange(start, start + 11)
        with torch.no_grad():
            assert (cm(x, pos) - model(x, pos)).abs().max() < 1e-5
    ir = cm.ir()
    assert ir.count("dl.rotary") == 2 and 'layout = "interleaved"' in ir and "complex" not in ir
    # cos and sin of the table are row kernels, and so are the two concatenations that repeat each for its pair;
    # torch.outer (and ones_like) stay torch calls
    assert Counter(cm.report().patterns) == {"gemm": 2, "attention": 1, "row": 4}
    assert "rotary" in cm.report().text()


class ActivatedLinear(nn.Module):
    def __init__(self, gate):
        super().__init__()
        self.proj, self.gate = nn.Linear(32, 48), gate

    def forward(self, x):
        y = self.proj(x)
        return y * self.gate(y)


def test_expit_is_sigmoid():
    """x * torch.special.expit(x) becomes silu like x * torch.sigmoid(x): the same regions, outputs equal eager."""
    torch.manual_seed(0)
    counts = []
    for gate in (torch.sigmoid, torch.special.expit, torch.Tensor.sigmoid):
        model = ActivatedLinear(gate).eval()
        cm = dc.compile(model, backend="interpret")
        x = torch.randn(2, 5, 32)
        with torch.no_grad():
            assert (cm(x) - model(x)).abs().max() < 1e-5
        assert "dl.torch_call" not in cm.ir() and "dl.silu" in cm.ir("after:recognize")
        counts.append(Counter(cm.report().patterns))
    assert counts == [{"gemm": 1}] * 3


class WeightContraction(nn.Module):
    def __init__(self, contract, transposed):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, 48) if transposed else torch.randn(48, 32))
        self.contract = contract

    def forward(self, x):
        return self.contract(x, self.weight)


@pytest.mark.parametrize(
    "contract, transposed",
    [
        (lambda x, w: torch.einsum("bsd,od->bso", x, w), False),
        (lambda x, w: torch.einsum("...d,od->...o", x, w), False),
        (lambda x, w: torch.einsum("bsd,do->bso", x, w), True),
        (lambda x, w: torch.einsum("n i k , j k -> n i j", [x, w]), False),
        (lambda x, w: torch.einsum("od,bsd->bso", w, x), False),
        (lambda x, w: torch.tensordot(x, w, dims=([-1], [1])), False),
        (lambda x, w: torch.tensordot(x, w, dims=([2], [0])), True),
        (lambda x, w: torch.tensordot(x, w, dims=1), True),
    ],
    ids=["einsum", "einsum-ellipsis", "einsum-in-out", "einsum-list", "einsum-weight-first",
         "tensordot", "tensordot-in-out", "tensordot-int"],  # fmt: skip
)
def test_einsum_and_tensordot_by_a_weight_are_linear(contract, transposed):
    """x's last dim contracted with a 2-D weight, spelled with einsum or tensordot, is one GEMM region."""
    torch.manual_seed(0)
    model = WeightContraction(contract, transposed).eval()
    cm = dc.compile(model, backend="interpret")
    for _ in range(2):
        x = torch.randn(2, 5, 32)
        with torch.no_grad():
            assert (cm(x) - model(x)).abs().max() < 1e-4
    assert Counter(cm.report().patterns) == {"gemm": 1} and "dl.torch_call" not in cm.ir()


@pytest.mark.parametrize("equation", ["bsd,od", "bsd,od->bos", "bsd,od->bs", "bsd,bsd->bs"])
def test_other_einsums_stay_torch_calls(equation):
    """Any other einsum (an implicit output in another order, a transposed output, no weight) runs in torch."""
    model = WeightContraction(lambda x, w: torch.einsum(equation, x, w if "o" in equation else x), False).eval()
    cm = dc.compile(model, backend="interpret")
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert (cm(x) - model(x)).abs().max() < 1e-4
    assert Counter(cm.report().patterns) == {} and 'dl.torch_call "torch.functional.einsum"' in cm.ir()


def test_einsum_in_sublist_form_stays_a_torch_call():
    """einsum(x, [0, 1, 2], w, [3, 2], [0, 1, 3]): the same contraction, not in the converted spelling."""
    model = WeightContraction(lambda x, w: torch.einsum(x, [0, 1, 2], w, [3, 2], [0, 1, 3]), False).eval()
    cm = dc.compile(model, backend="interpret")
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert (cm(x) - model(x)).abs().max() < 1e-4
    assert 'dl.torch_call "torch.functional.einsum"' in cm.ir()


class Pieces(nn.Module):
    """unbind, chunk, split and tensor_split with their dims given by position and by keyword, on a square tensor
    (where taking the pieces along the wrong dim still has the right shapes)."""

    def forward(self, x):
        a, b, c, d = x.unbind(1)
        e = torch.unbind(x, 1)[2]
        f = torch.unbind(x, dim=1)[3]
        g = x.chunk(2, 1)[1]
        h = torch.split(x, 1, 1)[0]
        i = x.tensor_split(2, 1)[0]
        return a * 2 + d, b - c + e * f, g * 3, h + 1, i * 2


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_pieces_along_the_dim_asked_for(backend):
    """Found by the random writes through views (tests/frontend/test_view_writes.py): `x.unbind(1)` took rows, not
    columns (the dim read from the position split's takes it at), a silent wrong answer on square tensors."""
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, ref = dc.compile(Pieces(), backend=backend)(x), Pieces()(x)
    for o, r in zip(out, ref, strict=True):
        assert o.shape == r.shape and torch.allclose(o, r, atol=1e-6), (o, r)


LOG_SOFTMAX_SPELLINGS = {
    "torch.log_softmax": lambda x: torch.log_softmax(x, -1),
    "Tensor.log_softmax": lambda x: x.log_softmax(dim=-1),
    "special.log_softmax": lambda x: torch.special.log_softmax(x, -1),
    "F.log_softmax(dtype=float32)": lambda x: F.log_softmax(x, -1, dtype=torch.float32),
    "nn.LogSoftmax": nn.LogSoftmax(-1),
    "F.softmin": lambda x: F.softmin(x, -1),
    "nn.Softmin": nn.Softmin(-1),
    "torch.logsumexp": lambda x: torch.logsumexp(x, -1),
    "Tensor.logsumexp(keepdim)": lambda x: x.logsumexp(-1, keepdim=True),
    "special.logsumexp": lambda x: torch.special.logsumexp(x, [-1]),
}


class Scaled(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spelling", list(LOG_SOFTMAX_SPELLINGS))
def test_log_softmax_softmin_and_logsumexp_are_row_kernels(spelling, dtype):
    """log_softmax, softmin and logsumexp over the last dim (each spelling) import as dl ops the row template fuses
    into one kernel with the op after them, computed in float32 and rounded once: fp32 within 1e-6 of eager, bf16 no
    further from an fp64 reference than eager is, plus a rounding; non-finite values where eager has them (a row of
    -inf, a row holding +inf, a NaN)."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16) * 3
    x[0, 1], x[0, 2, 3], x[1, 0, 5], x[2, 3, 1] = -torch.inf, -torch.inf, torch.inf, torch.nan
    model = Scaled(LOG_SOFTMAX_SPELLINGS[spelling]).eval()
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref, exact = cm(x.to(dtype)), model(x.to(dtype)), model(x.to(dtype).double())
    assert "dl.torch_call" not in cm.ir() and cm.report().patterns == ["row"], cm.report()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert torch.equal(out[out.isinf()], ref[ref.isinf()])
    finite = ref.isfinite()
    if out.dtype == torch.float32:
        assert rel_error(out[finite], ref[finite]) <= 1e-6
    else:
        ulp = 2.0**-8 * exact[finite].abs()
        assert ((out[finite] - exact[finite]).abs() <= (ref[finite] - exact[finite]).abs() + ulp).all()


@pytest.mark.parametrize("keepdim", [True, False])
def test_a_reduction_over_rows_seeds_a_row_kernel(keepdim):
    """A region whose first op reduces the rows (amax with keepdim, then a clamp: logsumexp's start) is one row
    kernel: the rows are the reduction's input, not its (narrower) result."""
    model = Scaled(lambda x: x.amax(-1, keepdim=keepdim).clamp(-1e30, 1e30) + x.sum(-1, keepdim=keepdim)).eval()
    x = torch.randn(4, 24)
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        assert rel_error(cm(x), model(x)) <= 1e-6
    assert cm.report().patterns == ["row"] and "unfused" not in cm.report().text(), cm.report()


CLAMP_SPELLINGS = {
    "Tensor.clamp": lambda x, lo: x.clamp(-1, 1),
    "torch.clamp(min=)": lambda x, lo: torch.clamp(x, min=0.5),
    "torch.clip(max=)": lambda x, lo: torch.clip(x, max=0.3),
    "Tensor.clamp_min": lambda x, lo: x.clamp_min(1e-2),
    "torch.clamp_max": lambda x, lo: torch.clamp_max(x, 2),
    "a tensor bound": lambda x, lo: x.clamp(min=lo),
    "min above max": lambda x, lo: x.clamp(1, -1),
    "bf16 with an f32 bound": lambda x, lo: x.bfloat16().clamp(lo),
}


@pytest.mark.parametrize("spelling", list(CLAMP_SPELLINGS))
def test_clamp_is_elementwise(spelling):
    """clamp, clip, clamp_min and clamp_max (numbers or tensors as bounds) are maximum/minimum in a row kernel, with
    eager's values bit for bit: NaN and infinities kept, min above max giving max, bounds promoting the dtype."""
    fn = CLAMP_SPELLINGS[spelling]
    model = Scaled(lambda x: fn(x, torch.linspace(-2, 0, 24))).eval()
    x = torch.randn(4, 24) * 3
    x[0, 0], x[1, 1], x[2, 2] = torch.nan, torch.inf, -torch.inf
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(x), model(x)
    assert "dl.torch_call" not in cm.ir() and cm.report().patterns == ["row"]
    assert out.dtype == ref.dtype and torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num())


ACTIVATIONS = {
    "F.hardtanh": lambda x: F.hardtanh(x),
    "nn.Hardtanh": nn.Hardtanh(-0.5, 0.7),
    "F.relu6": lambda x: F.relu6(x * 4),
    "nn.ReLU6": nn.ReLU6(),
    "F.leaky_relu": lambda x: F.leaky_relu(x),
    "nn.LeakyReLU(0.2)": nn.LeakyReLU(0.2),
    "leaky_relu slope above 1": lambda x: F.leaky_relu(x, 1.5),
    "F.hardsigmoid": lambda x: F.hardsigmoid(x * 2),
    "nn.Hardsigmoid": nn.Hardsigmoid(),
    "F.hardswish": lambda x: F.hardswish(x * 2),
    "nn.Hardswish": nn.Hardswish(),
}


class Activation(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x * 0.5)  # (exact: each op rounds as eager's)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spelling", list(ACTIVATIONS))
def test_piecewise_linear_activations_are_elementwise(spelling, dtype):
    """hardtanh, relu6, leaky_relu, hardsigmoid and hardswish (functions and modules) are max/min chains in one row
    kernel with eager's values bit for bit on the CPU, NaN and infinities included (not the sign of a zero: a max of
    -0.0 and 0.0 is 0.0 in Triton, as in eager's CUDA kernels, where eager's CPU clamp keeps -0.0), hardsigmoid and
    hardswish computed in float32 and rounded once."""
    model = Activation(ACTIVATIONS[spelling]).eval()
    x = (torch.randn(6, 40) * 4).to(dtype)
    x[0, :5] = torch.tensor([torch.nan, torch.inf, -torch.inf, -0.0, 0.0])
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(x), model(x)
    assert "dl.torch_call" not in cm.ir() and cm.report().patterns == ["row"], cm.report()
    assert out.dtype == ref.dtype and torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num()), (out - ref).abs().nan_to_num().max()


@pytest.mark.parametrize("make", [lambda: nn.ReLU6(inplace=True), lambda: nn.LeakyReLU(0.0),
                                  lambda: nn.LeakyReLU(-0.5)])
def test_activations_eager_computes_differently_stay_torch_calls(make):
    """In-place forms, and leaky_relu with a slope of 0 or below (eager's select gives NaN at -inf there, which no
    max or min of x and the slope times x gives), stay torch calls, with eager's values."""
    model = Activation(make()).eval()
    x = torch.randn(6, 40) * 4
    x[0, 0] = -torch.inf
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        out, ref = cm(x.clone()), model(x.clone())
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())


EXPONENTIAL_ACTIVATIONS = {
    "nn.ELU": nn.ELU(),
    "F.elu(alpha=0.5)": lambda x: F.elu(x, 0.5),
    "nn.SELU": nn.SELU(),
    "torch.selu": torch.selu,
    "nn.CELU(2)": nn.CELU(2.0),
    "nn.Softplus": nn.Softplus(),
    "F.softplus(beta=2)": lambda x: F.softplus(x, beta=2.0),
    "nn.Mish": nn.Mish(),
    "F.mish": F.mish,
    "nn.LogSigmoid": nn.LogSigmoid(),
    "F.logsigmoid": F.logsigmoid,
    "F.glu": lambda x: F.glu(x, -1),
    "nn.GLU(0)": nn.GLU(0),
    "torch.expm1": torch.expm1,
    "Tensor.log1p": lambda x: x.abs().log1p(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spelling", list(EXPONENTIAL_ACTIVATIONS))
def test_exponential_activations_are_elementwise(spelling, dtype):
    """ELU, SELU, CELU, softplus, mish, logsigmoid, GLU, expm1 and log1p are elementwise ops in row kernels (the ELUs
    and softplus as max and min of their two branches, with dl.expm1 and dl.log1p computed without cancellation near
    0). Against float64: no more than four times eager's error plus 1e-7 (fp32; expm1's polynomial and exp branches
    are within 3 ulp), NaN and infinities where eager has them, over inputs from 1e-6 to 200 in magnitude."""
    model = Activation(EXPONENTIAL_ACTIVATIONS[spelling]).eval()
    x = torch.randn(6, 64) * 8
    x[0, :5] = torch.tensor([torch.nan, torch.inf, -torch.inf, -0.0, 0.0])
    x[1, :4] = torch.tensor([400.0, -400.0, 2e-6, -2e-6])
    x = x.to(dtype)
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref, exact = cm(x), model(x), model.double()(x.double())
    assert "dl.torch_call" not in cm.ir(), cm.report()
    # (GLU's halves are narrower rows than its input: the scaling before it is a row kernel of its own)
    assert cm.report().patterns == ["row"] * (2 if "glu" in spelling.lower() else 1), cm.report()
    assert out.dtype == ref.dtype and torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out[out.isinf()], ref[out.isinf()]) and torch.equal(out.isinf(), ref.isinf())
    fin = ref.isfinite()
    assert rel_error(out[fin], exact[fin]) <= 4 * rel_error(ref[fin], exact[fin]) + 1e-7


def test_softplus_with_a_low_threshold_stays_a_torch_call():
    """Below a threshold of 17 eager's softplus returns x where the smooth form does not round to it (the smooth
    form is only used where both agree in float32): such a softplus is eager's own call."""
    model = Activation(lambda x: F.softplus(x, threshold=5.0)).eval()
    x = torch.randn(6, 64) * 8
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        assert torch.equal(cm(x), model(x))
    assert "dl.torch_call" in cm.ir()


class Norms(nn.Module):
    """torch's own norms with and without their affine parameters, after a Linear of small outputs (rows whose mean
    square is near bfloat16's epsilon)."""

    def __init__(self, n=40):
        super().__init__()
        self.proj = nn.Linear(n, n)
        self.ln_plain, self.ln_no_bias = nn.LayerNorm(n, elementwise_affine=False), nn.LayerNorm(n, bias=False)
        self.rms_plain = nn.RMSNorm(n, elementwise_affine=False)
        self.rms, self.rms_eps = nn.RMSNorm(n), nn.RMSNorm(n, 1e-5)
        with torch.no_grad():
            self.proj.weight.mul_(0.05)
            for w in (self.ln_no_bias.weight, self.rms.weight, self.rms_eps.weight):
                w.normal_()

    def forward(self, x):
        y = self.proj(x)
        return (self.ln_plain(y), self.ln_no_bias(y), F.layer_norm(y, y.shape[-1:]), self.rms_plain(y), self.rms(y),
                self.rms_eps(y), F.rms_norm(y, y.shape[-1:]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("traced", ["module", "dynamo"])
def test_torch_norms_with_and_without_affine_parameters_equal_eager(dtype, traced):
    """nn.RMSNorm / F.rms_norm without eps use float32's epsilon for bfloat16 and float16 inputs, as torch does (the
    input type's own, 64x larger in bfloat16, changed these rows by 30%: a silent wrong answer), and scale by the weight
    in float32; LayerNorm and RMSNorm without weight or bias are row kernels too (they were torch calls). Eager's
    values bit for bit, through the module and through dynamo (where F.rms_norm is `torch.rms_norm`)."""
    model = Norms().to(dtype).eval()
    x = (torch.randn(6, 40) * 0.05).to(dtype)
    cm = dc.compile(model if traced == "module" else model.forward, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        outs, refs = cm(x), model(x)
    for k, (o, r) in enumerate(zip(outs, refs, strict=True)):
        assert torch.equal(o, r), (k, (o.float() - r.float()).abs().max())
    assert "torch fallbacks (run" not in cm.report().text(), cm.report()


TWO_NORMS = {
    "F.normalize": lambda x: F.normalize(x, dim=-1),
    "F.normalize of rows of zeros": lambda x: F.normalize(x * 0, dim=1),
    "x / x.norm(p=2, dim=-1, keepdim=True)": lambda x: x / x.norm(p=2, dim=-1, keepdim=True),
    "linalg.vector_norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "Tensor.norm over two dims": lambda x: x.norm(dim=(0, 1)),
    "torch.norm of everything": lambda x: torch.norm(x),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spelling", list(TWO_NORMS))
def test_two_norms_and_normalize_are_row_kernels(spelling, dtype):
    """2-norms along dims (torch.norm, Tensor.norm, linalg.vector_norm) and F.normalize (CLIP's and SigLIP's
    embeddings) are reductions in row kernels: sums of squares in float32, the norm rounded to the input's type as
    eager's is, and for F.normalize the clamped norm rounded too, so a row of zeros in float16 (whose eps of 1e-12
    rounds to 0) gives NaN as eager's does. Eager's values bit for bit in half types; fp32 within an ulp (eager's CPU
    kernels sum in float64)."""
    model = Activation(TWO_NORMS[spelling]).eval()
    x = (torch.randn(4, 6, 40) * 3).to(dtype)
    x[0, 0, 0], x[1, 0, 0] = torch.nan, torch.inf
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(x), model(x)
    assert "dl.torch_call" not in cm.ir(), cm.report()
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    fin = ref.isfinite()
    if dtype == torch.float32:
        assert ((out[fin] - ref[fin]).abs() <= 2.4e-7 * ref[fin].abs()).all()
    else:
        assert torch.equal(out[fin], ref[fin])


class Selects(nn.Module):
    """torch.where and masked_fill in each form (function, method, a number, a 0-d tensor of another dtype, NaN)
    after a linear, with masks broadcast over rows and columns."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 48)

    def forward(self, x, m, y):
        h = self.lin(x).masked_fill(m, 0.1)
        z = torch.where(m, y, h * 2).where(m[:1], y * 3)
        u = torch.masked_fill(h.relu(), m[..., :1], float("nan"))
        return z + u.masked_fill(~m, torch.tensor(-2.5)) + torch.where(m, 1.5, h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_where_and_masked_fill_are_elementwise(dtype):
    """torch.where and masked_fill import as `dl.where` and run in the GEMM's epilogue, the mask loaded as a boolean
    tensor: NaN where eager has it (a NaN of the branch not taken leaves no trace), finite values within 1e-6 of
    eager's in float32 and within the dtype's tolerance of float64 in half types (the epilogue keeps its sums in
    float32 where eager rounds each)."""
    g = torch.Generator().manual_seed(0)
    model = Selects().to(dtype).eval()
    x, y = (torch.randn(5, n, generator=g).to(dtype) for n in (32, 48))
    y[0, 0] = torch.nan
    m = torch.rand(5, 48, generator=g) > 0.5
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(x, m, y), model(x, m, y)
        exact = model.double()(x.double(), m, y.double())
    assert "dl.where" in cm.ir() and "masked_fill" not in str(cm.report()), cm.report()
    assert sorted(cm.report().patterns) == ["gemm", "row", "row"], cm.report()  # (the row kernels: y * 3 and ~m)
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any()
    fin = ~ref.isnan()
    assert rel_error(out[fin], ref[fin] if dtype == torch.float32 else exact[fin]) <= (
        1e-6 if dtype == torch.float32 else tolerance(dtype))


class Compares(nn.Module):
    """Comparisons, logic and booleans in float arithmetic: a leaky ReLU written by hand after a linear, a mask
    from ranges and NaNs, booleans times floats, and boolean outputs."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 48)

    def forward(self, x, y, t):
        h = self.lin(x)
        leaky = torch.where(h > 0, h, 0.01 * h) * (y <= 3)
        keep = ((y >= -0.5) & (y < t)) | torch.isnan(y)
        z = leaky.masked_fill(~keep, -1.0) + torch.isinf(y) * 2.0 + (y > 0.1).to(y.dtype) - torch.isposinf(y).float()
        return z, keep, y.bool() ^ (y < 70000.0), torch.isfinite(y).logical_not(), 0.1 >= y


def compares_inputs(dtype, device="cpu"):
    """Inputs of `Compares` with NaN, infinities, 0 and the number 0.1 rounded to the dtype (which eager's `y > 0.1`
    compares in the dtype: equal, in bfloat16)."""
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(5, n, generator=g).to(dtype) for n in (32, 48))
    y[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    y[1, :2] = torch.tensor([0.1, 1e5])  # (1e5 and 70000 are inf in float16)
    return x.to(device), y.to(device), torch.tensor(0.3, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_comparisons_and_logic_are_elementwise(dtype):
    """Comparisons, logical ops and booleans cast to floats import as `dl.compare`, `dl.logical`, `dl.not` and
    `dl.convert`: the hand-written leaky ReLU runs in the GEMM's epilogue, everything else in row kernels, no torch
    call. Booleans equal eager's (numbers compared in the dtype, as eager compares them; NaN unequal to itself);
    floats within 1e-6 of eager's in float32 and within the dtype's tolerance of eager's in half types (not of float64:
    there y > 0.1 compares other numbers)."""
    model = Compares().to(dtype).eval()
    args = compares_inputs(dtype)
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(*args), model(*args)
    ir = cm.ir()
    assert all(f"dl.{name}" in ir for name in ("compare", "logical", "not", "convert")), ir
    counts = cm.report().counts()
    assert counts["torch_fallbacks"] == counts["unfused"] == 0 and counts["kernels"] == counts["regions"], counts
    gemm = [r for r in cm.report().regions if r.pattern == "gemm"]
    assert len(gemm) == 1 and {"dl.compare", "dl.where"} <= set(gemm[0].ops), cm.report()
    assert ref[4][1, 0]  # (0.1 >= y: true, y being 0.1 in the dtype; in bfloat16 only if 0.1 is rounded first)
    for o, r in zip(out[1:], ref[1:], strict=True):
        assert o.dtype == torch.bool and torch.equal(o, r)
    assert torch.equal(out[0].isnan(), ref[0].isnan())
    assert rel_error(out[0], ref[0]) <= (1e-6 if dtype == torch.float32 else tolerance(dtype))


class BufferMask(nn.Module):
    """A mask computed from a buffer alone (nanoGPT's `bias == 0`), filled into a linear's output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("keep", torch.tril(torch.ones(8, 8)))

    def forward(self, x):
        return self.lin(x).masked_fill((self.keep == 0) | (self.keep.exp() > 2.0), -1.0)


def test_a_mask_of_buffers_alone_is_a_weight():
    """Elementwise ops of parameters and buffers alone (a comparison, a logical or, exp) are a weight-only value,
    computed once, not at every call (nanoGPT's `bias == 0` was a row region of its own); a buffer written in place
    after compiling is seen (the value is computed again)."""
    model, x = BufferMask().eval(), torch.randn(8, 8)
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        assert torch.equal(cm(x), model(x))
        assert [r.pattern for r in cm.report().regions] == ["gemm"], cm.report()
        model.keep.fill_(1.0)
        assert torch.equal(cm(x), model(x))
        model.keep.fill_(3.0)
        assert torch.equal(cm(x), model(x)) and (cm(x) == -1.0).all()


class MaskedAttention(nn.Module):
    """nanoGPT's attention: scores scaled, dropped keys set to `fill` (masked_fill or where), softmax, times v."""

    def __init__(self, form: str, fill: float = float("-inf")):
        super().__init__()
        self.form, self.fill = form, fill

    def forward(self, q, k, v, keep):
        att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1) ** 0.5)
        if self.form == "masked_fill":
            att = att.masked_fill(keep == 0, self.fill)
        elif self.form == "torch.masked_fill":
            att = torch.masked_fill(att, ~(keep != 0), self.fill)
        elif self.form == "masked_fill twice":  # (then the last key dropped for every row: two masks in turn)
            att = att.masked_fill(keep == 0, self.fill)
            att = att.masked_fill(torch.arange(att.size(-1)) == att.size(-1) - 1, self.fill)
        else:
            att = torch.where(keep != 0, att, self.fill)
        return F.softmax(att, dim=-1) @ v


def masked_attention_inputs(s: int, l_: int, dtype, device="cpu"):
    """q, k, v of 2 x 4 heads and a float 0/1 mask of [2, 1, s, l_]: batch 0's first row keeps no key (its output
    is NaN, as eager's softmax gives), batch 1 drops key 2 everywhere and that key is NaN (it leaves no trace)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g).to(dtype) for n in (s, l_, l_))
    keep = (torch.rand(2, 1, s, l_, generator=g) > 0.3).float()
    keep[0, 0, 0] = 0
    keep[1, :, :, 2] = 0
    k[1, :, 2] = torch.nan
    return [t.to(device) for t in (q, k, v, keep)]


def attention_against_eager(model, args, backend="interpret"):
    """(ours, eager's, eager's in float64) for `model` compiled to one attention region (after the row kernel that
    compares the float `keep` with 0, where the model does)."""
    cm = dc.compile(model, backend=backend, strict=True, cuda_graphs=False)
    with torch.no_grad():
        out, ref, exact = cm(*args), model(*args), model(*(t.double() for t in args))
    assert cm.report().patterns in (["attention"], ["row", "attention"]), cm.report()
    assert set(cm.report().impls().values()) <= {"kernel", "reference"}
    return out, ref, exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [(9, 9), (1, 13), (3, 40)])
@pytest.mark.parametrize("form", ["masked_fill", "torch.masked_fill", "where", "masked_fill twice"])
def test_attention_with_masked_fill_is_an_attention_kernel(form, lengths, dtype):
    """softmax(scores.masked_fill(~keep, -inf)) @ v (nanoGPT, minGPT and most hand-written transformers) and its
    torch.where form become one attention region (prefill and decode kernels) reading the boolean mask, where the
    matmuls, the fill and the softmax were torch calls and a row kernel: the dropped keys' scores are replaced, not
    added to, so batch 1's NaN key changes nothing, as in eager (SDPA with that mask gives NaN rows), and a row
    keeping no key is NaN. Two masks filled in turn are one mask (their union, a `dl.logical`). Finite values
    within the dtype's tolerance of float64."""
    out, ref, exact = attention_against_eager(MaskedAttention(form).eval(), masked_attention_inputs(*lengths, dtype))
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(ref.isnan(), exact.isnan())
    assert ref.isnan().sum() == 4 * 16  # (batch 0's first row, every head)
    fin = ~ref.isnan()
    assert rel_error(out[fin], exact[fin]) <= tolerance(dtype)


class TwoMasks(nn.Module):
    """Scores filled with -1e9 through two masks in turn, with k and v repeated over head pairs (grouped attention),
    or scaled by a negative number (not attention: a softmax of negated scores)."""

    def __init__(self, grouped: bool):
        super().__init__()
        self.grouped = grouped

    def forward(self, q, k, v, keep):
        if self.grouped:
            k, v = k[:, :2].repeat_interleave(2, dim=1), v[:, :2].repeat_interleave(2, dim=1)
        att = (q @ k.transpose(-2, -1)) * (0.25 if self.grouped else -0.25)
        att = att.masked_fill(keep == 0, -1e9).masked_fill(torch.arange(att.size(-1)) == 0, -1e9)
        return att.softmax(-1) @ v


@pytest.mark.parametrize("grouped", [True, False])
def test_two_masks_in_grouped_attention_and_in_what_is_not_attention(grouped):
    """Grouped attention keeps the masks' union, mask_mode and mask_fill when its k/v repeat is undone; where the
    match fails after the masks were peeled (a negative scale), nothing the recognizer made is left behind: the
    fills and softmax stay a row kernel between the matmuls. Eager's values either way."""
    model = TwoMasks(grouped).eval()
    args = masked_attention_inputs(9, 9, torch.float32)
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(*args), model(*args)
    assert cm.report().patterns == (["row", "attention"] if grouped else ["row"]), cm.report()
    if grouped:
        assert 'mask_mode = "drop"' in cm.ir() and "mask_fill = -1.000000e+09" in cm.ir() and "enable_gqa" in cm.ir()
    assert 'dl.logical "or"' in cm.ir() if grouped else "dl.logical" not in cm.ir()
    module = cm._spec().pipeline.module  # (every use of every value is by an op in the IR: none left dangling)
    assert all(u.operation.parent_block() is not None for op in module.walk() for r in op.results for u in r.uses)
    assert not ref.isnan().any() and rel_error(out, ref) <= 1e-5


@pytest.mark.parametrize("lengths", [(9, 9), (1, 13)])
def test_attention_of_one_head_a_module_is_an_attention_kernel(lengths):
    """Karpathy's GPT lecture writes attention per head, [B, T, head size] operands without a heads dim: it becomes
    an attention kernel over [1, B, T, D] views, with eager's NaN and values."""
    args = [t[:, 0] for t in masked_attention_inputs(*lengths, torch.float32)]
    out, ref, exact = attention_against_eager(MaskedAttention("masked_fill").eval(), args)
    assert torch.equal(out.isnan(), ref.isnan()) and ref.isnan().any()
    assert rel_error(out[~ref.isnan()], exact[~ref.isnan()]) <= tolerance(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [(9, 9), (1, 13), (3, 40)])
@pytest.mark.parametrize("fill", [-1e9, -1e4, "min"])
def test_attention_filled_with_a_finite_value_is_an_attention_kernel(fill, lengths, dtype):
    """A finite fill (the Annotated Transformer's -1e9, HF's dtype minimum) is not -inf: a dropped key still counts,
    so a row keeping no key averages every value (no NaN), and a NaN score there leaves no trace. It is one
    attention region (`mask_fill`) reading every key tile, within the dtype's tolerance of float64."""
    model = MaskedAttention("masked_fill", torch.finfo(dtype).min if fill == "min" else fill).eval()
    out, ref, exact = attention_against_eager(model, masked_attention_inputs(*lengths, dtype))
    assert not ref.isnan().any() and not out.isnan().any()
    assert rel_error(out, exact) <= tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activations_and_norms_on_the_gpu(dtype):
    """The converters above on the GPU (`triton` backend; its exp and log are not the interpreter's): every spelling
    within the dtype's tolerance of float64, with NaN and infinities where eager's CUDA kernels put them."""
    spellings = {**ACTIVATIONS, **EXPONENTIAL_ACTIVATIONS, **TWO_NORMS}
    x = torch.randn(6, 8, 64, device="cuda") * 8
    x[0, 0, :5] = torch.tensor([torch.nan, torch.inf, -torch.inf, -0.0, 0.0])
    x[1, 0, :4] = torch.tensor([400.0, -400.0, 2e-6, -2e-6])
    x = x.to(dtype)
    for name, fn in spellings.items():
        model = Activation(fn).eval()
        cm = dc.compile(model, backend="triton", strict=True, cuda_graphs=False)
        with torch.no_grad():
            out, ref, exact = cm(x), model(x), model.double()(x.double())
        assert "dl.torch_call" not in cm.ir(), name
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf()), name
        fin = ref.isfinite()
        assert rel_error(out[fin], exact[fin]) <= tolerance(dtype), name


class RoundedBeforeCompared(nn.Module):
    """Half-precision sums compared: with each other, with themselves after a second add, against a float32 tensor,
    and with a large integer; each boolean flips on the last bit eager rounds the sums to."""

    def forward(self, a, b, c):
        s = a + b
        return s > c, (s + b) == a, (s - a).bool(), c == 2**60 + 2**36 + 1


def test_comparisons_see_the_values_eager_compares():
    """Kernels keep elementwise results in float32 where eager rounds each to its dtype; along a chain into a
    comparison every result is rounded (1 + 2**-9 is 1 in bfloat16, and 1 + 2**-8 + 2**-8 is 1 + 2**-8 + 2**-8
    rounded twice: 1), and an integer is converted to the tensor's dtype once, as eager converts it."""
    bf = torch.bfloat16
    a, b = torch.ones(2, 4, dtype=bf), torch.full((2, 4), 2**-9, dtype=bf)
    b[1] = 2**-8
    c = torch.full((2, 4), 1 + 2**-10)
    c[1] = 2.0**60 + 2.0**37
    cm = dc.compile(RoundedBeforeCompared().eval(), backend="interpret", strict=True)
    with torch.no_grad():
        out, ref = cm(a, b, c), RoundedBeforeCompared()(a, b, c)
    assert set(cm.report().patterns) == {"row"} and cm.report().counts()["torch_fallbacks"] == 0, cm.report()
    for o, r in zip(out, ref, strict=True):
        assert torch.equal(o, r), (o, r)


class InplaceLogic(nn.Module):
    """`m &= ...` and `m |= ...` on a boolean input mask (written in place, as eager writes the caller's tensor)."""

    def forward(self, x, m):
        m &= x > 0
        m |= x < -1.5
        return x * m


class InplaceLogicOfArgs(InplaceLogic):
    """The same, with `*args`: symbolic_trace refuses it, so dynamo captures it (as operator.iand and ior)."""

    def forward(self, *args):
        return super().forward(*args)


@pytest.mark.parametrize("dynamo", [False, True])
def test_inplace_logic_writes_its_tensor(dynamo):
    """`&=`, `|=` (and the other in-place operators) write their tensor: the result and the caller's mask are eager's
    (they were dropped: the mask kept its values, and under dynamo the result read the unwritten mask)."""
    x = torch.tensor([[1.0, -1.0, 2.0, -2.0]])
    model = (InplaceLogicOfArgs() if dynamo else InplaceLogic()).eval()
    cm = dc.compile(model, backend="interpret", strict=True)
    m_ref, m_out = torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool)
    with torch.no_grad():
        ref, out = model(x, m_ref), cm(x, m_out)
    assert torch.equal(out, ref) and torch.equal(m_out, m_ref), (out, m_out, ref, m_ref)
    assert cm._spec().captured.how == ("dynamo" if dynamo else "symbolic_trace")


class HostScalars(nn.Module):
    """0-d host tensors beside device tensors, which eager reads as numbers: a constant made in forward (a trace
    constant under symbolic_trace, a `torch.tensor` call under dynamo), an input, and a plain tensor attribute
    (`.to(device)` moves buffers and parameters, not it)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.shift = torch.tensor(0.25)

    def forward(self, x, m, s):
        return self.lin(x).masked_fill(m, torch.tensor(-2.5)) * s + self.shift

    def _apply(self, fn, recurse=True):  # (the attribute stays on the host, whatever the module is moved to)
        out = super()._apply(fn, recurse)
        self.shift = torch.tensor(0.25)
        return out


class HostScalarsOfArgs(HostScalars):
    """The same, with `*args`: dynamo captures it."""

    def forward(self, *args):
        return super().forward(*args)


def host_scalars_inputs(device: str) -> tuple:
    g = torch.Generator().manual_seed(0)
    x, m = torch.randn(4, 8, generator=g).to(device), (torch.rand(4, 8, generator=g) > 0.5).to(device)
    return x, m, torch.tensor(3.0)  # (the scale stays on the host)


@pytest.mark.parametrize("dynamo", [False, True])
def test_host_scalars_are_read_on_the_device(dynamo):
    """A kernel cannot read host memory: a 0-d host tensor that every user reads on one device is read from a copy
    there (an input moved before the program runs, a constant copied once), so the GEMM epilogue gets a device
    pointer (it got the host's: a launch error, then the reference). Checked on the meta device here, by values
    on the GPU in `test_host_scalars_on_the_gpu`."""
    from dlblas_compiler.frontend.capture import capture
    from dlblas_compiler.frontend.importer import import_graph

    model, args = (HostScalarsOfArgs() if dynamo else HostScalars()).to("meta"), host_scalars_inputs("meta")
    captured = capture(model, args, {})
    imported = import_graph(captured, captured.flatten(args, {}))
    assert captured.how == ("dynamo" if dynamo else "symbolic_trace")
    meta = torch.device("meta")
    host = {name for name, p in imported.params.items() if p.device.type == "cpu"}
    assert imported.param_devices == dict.fromkeys(host, meta) and len(host) == 2 - dynamo, imported.param_devices
    assert imported.device_moves == {2: meta}, imported.device_moves
    constants = [name for name, call in imported.calls.items() if "tensor" in name]
    assert len(constants) == dynamo
    for name in constants:
        call = imported.calls[name]
        assert call.target(*call.args, **call.kwargs).device.type == "meta"


@pytest.mark.gpu
@pytest.mark.parametrize("dynamo", [False, True])
def test_host_scalars_on_the_gpu(dynamo):
    """`HostScalars` on the GPU, with CUDA graphs: eager's values (float32, within 1e-5), on both capture paths,
    for two values of the host input and of the attribute (written in place after compiling)."""
    model = (HostScalarsOfArgs() if dynamo else HostScalars()).cuda().eval()
    x, m, s = host_scalars_inputs("cuda")
    cm = dc.compile(model, backend="triton", strict=True)
    with torch.no_grad():
        for v in (3.0, -0.5):
            s.fill_(v)
            model.shift.fill_(v / 2)
            out, ref = cm(x, m, s), model(x, m, s)
            assert rel_error(out, ref) <= 1e-5, v
    assert cm._spec().captured.how == ("dynamo" if dynamo else "symbolic_trace")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_comparisons_on_the_gpu(dtype):
    """`Compares` compiled by Triton for the GPU (booleans loaded and stored by real loads and stores, compared in
    the GEMM's epilogue): booleans equal eager's, floats within the dtype's tolerance of eager's."""
    model = Compares().to(dtype).cuda().eval()
    args = compares_inputs(dtype, "cuda")
    cm = dc.compile(model, backend="triton", strict=True, cuda_graphs=False)
    with torch.no_grad():
        out, ref = cm(*args), model(*args)
    for o, r in zip(out[1:], ref[1:], strict=True):
        assert o.dtype == torch.bool and torch.equal(o, r)
    assert torch.equal(out[0].isnan(), ref[0].isnan())
    assert rel_error(out[0], ref[0]) <= tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_where_and_masked_attention_on_the_gpu(dtype):
    """dl.where in a GEMM epilogue and a row kernel, and the masked_fill attention's prefill and decode kernels,
    compiled by Triton for the GPU (boolean masks loaded by real loads): NaN where eager has it, finite values
    within the dtype's tolerance of float64."""
    g = torch.Generator().manual_seed(0)
    model = Selects().to(dtype).cuda().eval()
    x, y = (torch.randn(5, n, generator=g).to(dtype).cuda() for n in (32, 48))
    m = (torch.rand(5, 48, generator=g) > 0.5).cuda()
    cm = dc.compile(model, backend="triton", strict=True, cuda_graphs=False)
    with torch.no_grad():
        out, ref, exact = cm(x, m, y), model(x, m, y), model.double()(x.double(), m, y.double())
    assert torch.equal(out.isnan(), ref.isnan())
    fin = ~ref.isnan()
    assert rel_error(out[fin], exact[fin]) <= tolerance(dtype)
    for lengths in [(200, 200), (1, 300)]:
        args = masked_attention_inputs(*lengths, dtype, "cuda")
        out, ref, exact = attention_against_eager(MaskedAttention("masked_fill").eval(), args, "triton")
        assert torch.equal(out.isnan(), ref.isnan()), lengths
        fin = ~ref.isnan()
        assert rel_error(out[fin], exact[fin]) <= tolerance(dtype), lengths
