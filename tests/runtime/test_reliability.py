"""Reliability: regions fall back (one warning each) under injected faults, the bad-input table of
docs/bad-inputs.md row by row, and check=True (each region against its reference on live inputs)."""

import copy
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
import dlblas_compiler.codegen.kernel as kernel_mod
import dlblas_compiler.codegen.source as source_mod
import dlblas_compiler.runtime.program as program_mod
import dlblas_compiler.runtime.graphs as graphs_mod
import dlblas_compiler.runtime.selection as selection
from dlblas_compiler.fusion.templates import get_template
from dlblas_compiler.lowering import lower_region
from dlblas_compiler.runtime.graphs import CALLS, ROUNDS, graph_pays
from dlblas_compiler.codegen.kernel import Kernel
from dlblas_compiler.dialects import FusedOp, TanhOp
from dlblas_compiler.frontend import capture, import_graph
from dlblas_compiler.models import BlockConfig, LlamaBlock, RMSNorm, llama_block_inputs, randomize_
from dlblas_compiler.numerics import rel_error
from dlblas_compiler.passes import DEFAULT_PIPELINE, run_pipeline
from dlblas_compiler.tuning import TuneOutcome


def _x(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _close(out, ref, tol=1e-5):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_error(out, ref) <= tol, rel_error(out, ref)


def _calls(cm, *args, n=3):
    """Call n times; return the outputs of the last call and the dlblas_compiler warnings raised."""
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(n):
            out = cm(*args)
    return out, [str(w.message) for w in caught if "dlblas_compiler" in str(w.message)]


def _impls(cm) -> dict[str, str]:
    return cm.report().impls()


class TwoRegions(nn.Module):
    """A GEMM with an epilogue (gemm_0) and a softmax (row_1)."""

    def __init__(self, k=24, n=20):
        super().__init__()
        self.lin = nn.Linear(k, n)

    def forward(self, x, r):
        y = self.lin(x)
        return F.silu(y) + r, torch.softmax(y * 0.5, -1)


def _two():
    m = randomize_(TwoRegions()).eval()
    args = (_x(3, 5, 24), _x(3, 5, 20, seed=1))
    with torch.no_grad():
        return m, args, m(*args)


# -- fault tolerance --------------------------------------------------------------------------------------


def _raise(what):
    def fn(*a, **k):
        raise RuntimeError(f"injected {what} fault")

    return fn


class _FailingLaunch:
    """A compiled kernel whose launches raise from call `after` on (counted per kernel)."""

    def __init__(self, real, after: int):
        self.real, self.after, self.calls = real, after, 0

    def __getitem__(self, grid):
        self.calls += 1
        if self.calls > self.after:
            return _raise("launch")
        return self.real[grid]


def _inject(monkeypatch, fault: str) -> tuple[set[str], str]:
    """Make `fault` happen; return the regions it hits and what their warning must say."""
    if fault in ("analyze", "build"):
        method = "can_lower" if fault == "analyze" else "emit"
        monkeypatch.setattr(get_template("row"), method, _raise(fault))  # (the row template alone)
        return {"row_1"}, f"lowering failed (RuntimeError: injected {fault} fault)"
    if fault == "compile":
        monkeypatch.setattr(Kernel, "compiled", _raise(fault))
        return {"gemm_0", "row_1"}, "kernel source does not compile (RuntimeError: injected compile fault)"
    if fault in ("launch", "later launch"):
        real = kernel_mod.compile_source
        after = 0 if fault == "launch" else 1
        monkeypatch.setattr(kernel_mod, "compile_source", lambda *a: _FailingLaunch(real(*a), after))
        return {"gemm_0", "row_1"}, "failed (RuntimeError: injected launch fault)"
    build = program_mod.Builder.build

    def tuned_build(self):  # tuning runs on the triton backend only: turn it on for the interpreter
        prog = build(self)
        prog.tune_mode = "quick"
        return prog

    monkeypatch.setattr(program_mod.Builder, "build", tuned_build)
    if fault == "tuning":
        monkeypatch.setattr(selection, "tune", _raise(fault))
        return {"gemm_0", "row_1"}, "tuning failed (RuntimeError: injected tuning fault)"

    def bad_config(job, *a, **k):  # the search "finds" a config with which the kernel cannot launch
        return TuneOutcome(dict(job.space.default(), BLOCK_M=3), 1e-3, 1e-3, 1, False)

    monkeypatch.setattr(selection, "tune", bad_config)
    monkeypatch.setattr(selection, "select", lambda step, tensors: None)  # (the kernel was chosen before)
    return {"gemm_0", "row_1"}, "'BLOCK_M': 3"


FAULTS = ["analyze", "build", "compile", "launch", "later launch", "tuning", "tuned config"]


@pytest.mark.parametrize("fault", FAULTS)
def test_injected_fault_falls_back_with_one_warning_per_region(monkeypatch, fault):
    m, args, ref = _two()
    hit, cause = _inject(monkeypatch, fault)
    cm = dc.compile(m, backend="interpret")
    out, warned = _calls(cm, *args, n=3)
    for o, r in zip(out, ref):
        _close(o, r)
    assert len(warned) == len(hit), warned
    for region in hit:
        (msg,) = [w for w in warned if f"region {region}:" in w]
        assert cause in msg and msg.endswith("using its reference"), msg
    impls = _impls(cm)
    assert {r for r, impl in impls.items() if impl == "reference"} == hit, impls
    assert all(k.reason for k in cm.report().kernels if k.impl == "reference")


@pytest.mark.parametrize("fault", FAULTS)
def test_injected_fault_under_strict_is_a_compile_error(monkeypatch, fault):
    m, args, _ = _two()
    hit, cause = _inject(monkeypatch, fault)
    cm = dc.compile(m, backend="interpret", strict=True)
    with pytest.raises(dc.CompileError) as e, torch.no_grad():
        for _ in range(2):
            cm(*args)
    assert any(f"region {r}:" in str(e.value) for r in hit) and cause in str(e.value), str(e.value)


class TanhSigmoid(nn.Module):
    def forward(self, x):
        return torch.tanh(torch.sigmoid(x)) * 2.0


def test_a_failing_pattern_callable_falls_back_once():
    """A user pattern lowered to a Python callable that starts failing at the second call."""
    calls = []

    def run(x):
        calls.append(x)
        if len(calls) > 1:
            raise RuntimeError("injected callable fault")
        return torch.tanh(torch.sigmoid(x))

    dc.register_fusion_pattern("test_reliability_tanh_sigmoid", lambda x: dc.P.tanh(dc.P.sigmoid(x)), run, priority=300)
    try:
        cm = dc.compile(TanhSigmoid(), backend="interpret")
        x = _x(3, 5)
        out, warned = _calls(cm, x, n=3)
    finally:
        dc.unregister_fusion_pattern("test_reliability_tanh_sigmoid")
    _close(out, TanhSigmoid()(x))
    assert len(calls) == 2 and len(warned) == 1, warned
    assert "the pattern's callable failed (RuntimeError: injected callable fault); using its reference" in warned[0]


def test_new_shape_compiles_again_and_warns_again_once(monkeypatch):
    """Warnings are per region and specialization: a new input shape is a new program."""
    m, args, _ = _two()
    _inject(monkeypatch, "build")
    cm = dc.compile(m, backend="interpret")
    _, first = _calls(cm, *args)
    _, second = _calls(cm, _x(2, 24), _x(2, 20, seed=1))
    _, again = _calls(cm, *args)
    assert len(first) == len(second) == 1 and again == []


# -- bad inputs (docs/bad-inputs.md) ---------------------------------------------------------------------


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow
            return x * 2
        return x


def test_untraceable_module_is_a_clear_error_naming_the_line():
    cm = dc.compile(DataDependent(), backend="interpret")
    with pytest.raises(dc.FrontendError) as e:
        cm(_x(2, 4))
    msg = str(e.value)
    line = DataDependent.forward.__code__.co_firstlineno + 1
    assert "DataDependent" in msg and "symbolic_trace failed" in msg and "dynamo failed" in msg
    assert f"test_reliability.py:{line}" in msg, msg
    assert "model.forward = dc.compile(model.forward)" in msg  # what it says to do works: the branch runs eagerly
    m = DataDependent()
    forward = dc.compile(m.forward, backend="interpret")
    with torch.no_grad():
        for x in (_x(2, 4).abs(), -_x(2, 4).abs()):
            assert torch.equal(forward(x), m(x))


class Arith(nn.Module):
    def forward(self, x):
        return x * 2 + x.sum(-1, keepdim=True) - x.amax(-1, keepdim=True)


class BoolOps(nn.Module):
    def forward(self, m):
        return (m & ~m.flip(-1)) | m.any(-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool,
                                   torch.float64])  # fmt: skip
def test_int_bool_fp64_run_by_torch_exactly(dtype):
    m = BoolOps() if dtype == torch.bool else Arith()
    x = (_x(3, 7) * 4).to(dtype)
    cm = dc.compile(m, backend="interpret")
    out, warned = _calls(cm, x, n=1)
    ref = m(x)
    assert out.dtype == ref.dtype and torch.equal(out, ref) and not warned
    assert "dl.torch_call" in cm.ir("input")


class Image(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, img):
        x = (img.float() / 255 - 0.5) / 0.25
        return self.lin(x), (img * 3).to(torch.int8) + 100  # (wraps in uint8 and in int8 as eager's does)


def test_uint8_images_and_narrow_integers_are_taken():
    """uint8, int8 and int16 tensors run by PyTorch as the other integers are (before the seventy-eighth session a
    model taking uint8 images was refused: 'an input has dtype torch.uint8')."""
    m = randomize_(Image()).eval()
    img = torch.randint(0, 256, (2, 3, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    cm = dc.compile(m, backend="interpret")
    (y, wrapped), warned = _calls(cm, img, n=1)
    ref_y, ref_wrapped = m(img)
    _close(y, ref_y)
    assert wrapped.dtype == torch.int8 and torch.equal(wrapped, ref_wrapped) and not warned


def test_complex_is_a_clear_error():
    """Complex values are carried only through the ops of a complex-number rotary (frontend/complex.py; `x * 2` is
    one of them): other arithmetic on them names the node."""
    cm = dc.compile(Arith(), backend="interpret")
    with pytest.raises(dc.FrontendError, match=r"node 'sum_1' .* works on a complex tensor"):
        cm(torch.randn(3, 4, dtype=torch.complex64))


@pytest.mark.parametrize("shape", [(0, 24), (3, 0, 24), (2, 24)])
def test_zero_size_dims_match_eager_without_warnings(shape):
    m = randomize_(TwoRegions()).eval()
    x = torch.zeros(shape) if 0 in shape else _x(*shape)
    r = torch.randn(*shape[:-1], 20)
    cm = dc.compile(m, backend="interpret")
    out, warned = _calls(cm, x, r, n=2)
    ref = m(x, r)
    assert not warned
    for o, e in zip(out, ref):
        assert o.shape == e.shape and torch.allclose(o, e, atol=1e-6)
    if 0 not in shape:
        assert set(_impls(cm).values()) == {"kernel"}


class Empty(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2 + x.sum(-1, keepdim=True), x.mean(-1)


def test_zero_length_rows_match_eager():
    x = torch.randn(3, 0)
    out, warned = _calls(dc.compile(Empty(), backend="interpret"), x, n=1)
    ref = Empty()(x)
    assert not warned and out[0].shape == (3, 0) and torch.equal(out[1].isnan(), ref[1].isnan())


def test_size_one_dims_run_kernels():
    cfg = BlockConfig()
    m = randomize_(LlamaBlock(cfg)).eval()
    x, cos, sin = llama_block_inputs(cfg, 1, 1)
    cm = dc.compile(m, backend="interpret")
    out, warned = _calls(cm, x, cos, sin, n=1)
    _close(out, m(x, cos, sin))
    assert not warned and list(_impls(cm).values()) == ["kernel"] * 5
    two = randomize_(TwoRegions(1, 1)).eval()
    ones = (_x(1, 1, 1), _x(1, 1, 1, seed=1))
    cm = dc.compile(two, backend="interpret")
    out, warned = _calls(cm, *ones, n=1)
    for o, e in zip(out, two(*ones)):
        _close(o, e)
    assert not warned and set(_impls(cm).values()) == {"kernel"}


class Pointwise4d(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x.mean(-1, keepdim=True)


def test_non_contiguous_and_channels_last_inputs():
    m = randomize_(TwoRegions()).eval()
    x, r = _x(24, 5, 3).permute(2, 1, 0), _x(20, 5, 3).transpose(0, 2)
    assert not x.is_contiguous() and not r.is_contiguous()
    out, warned = _calls(dc.compile(m, backend="interpret"), x, r, n=1)
    for o, e in zip(out, m(x, r)):
        _close(o, e)
    cl = _x(2, 3, 4, 5).to(memory_format=torch.channels_last)
    out, warned2 = _calls(dc.compile(Pointwise4d(), backend="interpret"), cl, n=1)
    _close(out, Pointwise4d()(cl))
    assert out.is_contiguous() and not warned and not warned2  # values as eager; the layout is contiguous


def test_input_on_another_device_than_the_parameters_is_refused():
    cm = dc.compile(TwoRegions(), backend="interpret")
    with pytest.raises(dc.FrontendError, match="input 0 is on meta but the model's parameters are on cpu"), torch.no_grad():
        cm(torch.empty(3, 24, device="meta"), torch.empty(3, 20, device="meta"))
    split = TwoRegions()
    split.lin.bias = nn.Parameter(torch.zeros(20, device="meta"))
    with pytest.raises(dc.FrontendError, match="spread over"), torch.no_grad():
        dc.compile(split, backend="interpret")(_x(3, 24), _x(3, 20))


class Special(nn.Module):
    """Every template: a GEMM with epilogue, norms, softmax, a max, attention."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 32)
        self.norm = RMSNorm(32, 1e-6)
        self.ln = nn.LayerNorm(16)

    def forward(self, x):
        y = F.gelu(self.lin(x))
        q = y.view(1, 6, 2, 16).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(6, 32)
        return self.norm(y), torch.softmax(y, -1), y.amax(-1), self.ln(x), att, torch.exp(x) - 1.0


def test_nan_and_inf_land_where_eager_puts_them():
    m = randomize_(Special()).eval()
    x = _x(6, 16)
    x[0, 3], x[2, 0], x[4, 9], x[5, 15] = float("nan"), float("inf"), float("-inf"), 1e30
    cm = dc.compile(m, backend="interpret")
    out, warned = _calls(cm, x, n=1)
    assert not warned and "kernel" in _impls(cm).values()
    for i, (o, e) in enumerate(zip(out, m(x))):
        assert torch.equal(o.isnan(), e.isnan()), i
        assert torch.equal(o.isposinf(), e.isposinf()) and torch.equal(o.isneginf(), e.isneginf()), i
        fin = torch.isfinite(e)
        assert torch.allclose(o[fin], e[fin], rtol=1e-4, atol=1e-5), i


def _lowered_sources(model, *inputs) -> dict[str, str]:
    """Kernel sources of a model's regions for these (meta) inputs, without running anything."""
    captured = capture(model, inputs, {})
    imported = import_graph(captured, captured.flatten(inputs, {}))
    module = run_pipeline(imported.module, DEFAULT_PIPELINE).module
    return {f.kernel.data: lower_region(f).kernel.source for f in module.walk() if isinstance(f, FusedOp)}


class Lin(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.lin = nn.Linear(k, n)

    def forward(self, x):
        return F.silu(self.lin(x)) + 1.0


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, -1)


@pytest.mark.parametrize("huge", [True, False])
def test_index_arithmetic_is_64_bit_past_two_to_the_31(huge):
    """Tensors of >= 2^31 elements (meta tensors: shapes only) get 64-bit offsets; small ones keep 32-bit."""
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    n = 65537 if huge else 16  # 65537 * 32768 > 2^31
    (row_src,) = _lowered_sources(Softmax(), meta(n, 32768)).values()
    (gemm_src,) = _lowered_sources(Lin(64, 32768).to("meta"), meta(n, 64)).values()
    s = 33000 if huge else 8  # 8 * 64 * 33000 * 128 > 2^31
    (att_src,) = _lowered_sources(Attention(), *(meta(8, 64, s, 128) for _ in range(3))).values()
    assert ("cols = tl.arange(0, BLOCK_N).to(tl.int64)" in row_src) == huge
    assert ("rm = rm.to(tl.int64)" in gemm_src and "rn = rn.to(tl.int64)" in gemm_src) == huge
    assert ("rm.to(tl.int64)" in att_src and "tl.arange(0, BLOCK_N).to(tl.int64)" in att_src) == huge


def test_64_bit_index_variants_compute_the_same(monkeypatch):
    monkeypatch.setattr(source_mod, "INT32_LIMIT", 1)
    cfg = BlockConfig()
    m = randomize_(LlamaBlock(cfg)).eval()
    x, cos, sin = llama_block_inputs(cfg, 2, 7)
    cm = dc.compile(m, backend="interpret")
    out, warned = _calls(cm, x, cos, sin, n=1)
    _close(out, m(x, cos, sin))
    steps = [s for s in cm._spec().executor.steps if isinstance(s, program_mod.RegionStep)]
    assert not warned and len(steps) == 5 and all("to(tl.int64)" in s.kernel.source for s in steps)


class Stateful(nn.Module):
    """Buffers updated by +=, add_ and reassignment; in-place ops on an intermediate and on the input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("total", torch.zeros(8))
        self.register_buffer("ema", torch.zeros(8))
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        self.count += 1
        y = self.lin(x)
        y.add_(1.0)
        self.act(y)
        self.total.add_(y.sum(0))
        self.ema = 0.9 * self.ema + 0.1 * y.mean(0)
        x.mul_(2.0)
        x += 0.5  # torch.fx alone would record x = x + 0.5 and leave the caller's tensor alone
        return y * self.count + x


class ReshapedInPlace(nn.Module):
    """`t_()` and `unsqueeze_()` change a tensor's shape in place: of a computed tensor (made functional: eager's
    values), then of the input (the caller's tensor's shape: refused)."""

    def __init__(self, of_input: bool):
        super().__init__()
        self.of_input = of_input

    def forward(self, x):
        y = x * 2
        y.t_().unsqueeze_(0)
        if self.of_input:
            x.t_()
        return y + 1


@pytest.mark.parametrize("of_input", [False, True])
def test_an_inplace_reshape_follows_eager_or_is_a_clear_error(of_input):
    """An in-place shape change of a computed tensor gives eager's values; of an input or buffer it is a clear error
    naming the op and the line (the runtime's copy back into the caller's tensor failed: "some elements of the input
    tensor and the written-to tensor refer to a single memory location")."""
    model, x = ReshapedInPlace(of_input).eval(), _x(3, 4)
    cm = dc.compile(model, backend="interpret")
    if of_input:
        with pytest.raises(dc.FrontendError, match=r"in-place method \.t_\(\) .*test_reliability\.py:\d+.* changes the "
                           r"shape or strides of input 'x'"), torch.no_grad():  # fmt: skip
            cm(x)
        return
    out, warned = _calls(cm, x, n=1)
    assert torch.equal(out, model(x)) and out.shape == (1, 4, 3) and not warned


def test_check_each_pass_on_a_model_drawing_random_numbers():
    """check_each_pass's runs (eager, then the IR after each pass) each start from the random state of the call and
    put it back: before, each drew its own numbers, and a model with dropout in training was refused ("does not
    match eager before any pass"); the compiled call after them draws eager's numbers."""
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.5)).train()
    x = _x(4, 16)
    cm = dc.compile(m, backend="interpret", check_each_pass=True)
    with torch.no_grad():
        torch.manual_seed(5)
        got = cm(x)
        torch.manual_seed(5)
        _close(got, m(x))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_inplace_ops_and_buffer_updates_follow_eager(backend):
    m = randomize_(Stateful()).eval()
    twin = randomize_(Stateful()).eval()
    cm = dc.compile(m, backend=backend, check_each_pass=True)  # (its eager run must not write m or x)
    for i in range(3):
        x = _x(2, 8, seed=i)
        x2 = x.clone()
        with torch.no_grad():
            out, ref = cm(x), twin(x2)
        _close(out, ref)
        _close(x, x2)  # the caller's tensor was written as eager writes it
        _close(m.total, twin.total)
        _close(m.ema, twin.ema)
        assert m.count.item() == twin.count.item() == i + 1
    assert type(m.count) is torch.Tensor and "dl.torch_call" not in cm.ir("input")


class DynamoStateful(nn.Module):
    """Needs dynamo (a tuple argument); `+=` on a buffer and item assignment on an intermediate."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x, pair):
        self.count += 1
        y = x * pair[0]
        y[:, 0] = 0.5
        return y * self.count + pair[1]


def test_inplace_under_dynamo_follows_eager():
    m, twin = DynamoStateful(), DynamoStateful()
    cm = dc.compile(m, backend="interpret")
    for _ in range(2):
        x, pair = _x(3, 5), (_x(5, seed=1), _x(3, 5, seed=2))
        with torch.no_grad():
            _close(cm(x, pair), twin(x, pair))
    assert cm._spec().captured.how == "dynamo" and m.count.item() == twin.count.item() == 2
    assert type(m.count) is torch.Tensor  # dynamo's export replaced it with a fake tensor; the capture put it back


@pytest.mark.parametrize("act", [nn.LeakyReLU(0.1, inplace=True), nn.Hardtanh(-0.5, 0.5, inplace=True),
                                 nn.ELU(inplace=True), nn.Dropout(1.0, inplace=True)],
                         ids=lambda m: type(m).__name__)  # fmt: skip
def test_inplace_passed_by_position_under_dynamo_follows_eager(act):
    """Dynamo traces these modules as `leaky_relu(h, 0.1, True)`: `inplace` by position. Before, only the keyword
    was seen, the call ran on a copy, and the output was the input unchanged, the input never written."""
    m = nn.Sequential(act).train()
    x, xe = _x(4, 6), _x(4, 6)
    fast = torch.compile(m, backend="dlblas", options={"backend": "reference", "tune": "none"})
    with torch.no_grad():
        y, ye = fast(x), m(xe)
    _close(y, ye)
    _close(x, xe)
    assert not torch.equal(x, _x(4, 6))


class ReturnsWhatItWrites(nn.Module):
    """Returns tensors it writes in place: its input (`relu_`), a buffer after `+=`, a cache after `index_copy_`."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("n", torch.zeros(()))
        self.register_buffer("cache", torch.zeros(6, 8))

    def forward(self, x, pos):
        y = self.lin(x)
        self.n += 1
        self.cache.index_copy_(0, pos, y)
        return F.relu(x, inplace=True), y, self.n, self.cache


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_a_returned_tensor_the_forward_wrote_is_that_tensor(backend):
    """Eager returns the written tensor itself (before, a copy with its values: writing into the output missed the
    input, and an output kept from one call did not follow the next)."""
    m = randomize_(ReturnsWhatItWrites()).eval()
    cm = dc.compile(m, backend=backend)
    x = _x(2, 8)
    with torch.no_grad():
        xr, _, n, cache = cm(x, torch.tensor([1, 4]))
    assert xr is x and n is m.n and cache is m.cache
    with torch.no_grad():
        cm(_x(2, 8, seed=1), torch.tensor([0, 2]))
    assert n.item() == 2 and cache[0].abs().sum() > 0


class AccumulatesUnderDynamo(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("acc", torch.zeros(8))
        self.p = nn.Parameter(torch.zeros(8), requires_grad=False)

    def forward(self, x):
        y = self.lin(x)
        self.acc += y.mean(0)
        self.p += 0.5
        return y


def test_state_written_under_dynamo_stays_the_registered_tensor():
    """torch.compile(backend="dlblas"): dynamo stores each written attribute back from the graph's output; ours was a
    new tensor, so the registered buffer was replaced (a module sharing it stopped seeing updates) and a Parameter's
    `+=` raised "cannot assign 'torch.FloatTensor' as parameter 'p'"."""
    m = randomize_(AccumulatesUnderDynamo()).eval()
    twin = randomize_(AccumulatesUnderDynamo()).eval()
    acc, p = m.acc, m.p
    torch._dynamo.reset()
    cm = torch.compile(m, backend="dlblas", options={"backend": "interpret"})
    with torch.no_grad():
        for i in range(3):
            _close(cm(_x(2, 8, seed=i)), twin(_x(2, 8, seed=i)))
    assert m.acc is acc and m.p is p
    _close(m.acc, twin.acc)
    _close(m.p, twin.p)


class WritesThenReadsShared(nn.Module):
    """Buffers that are views of one storage: `k` is a row of `big`; `v` another tensor's row, apart from `k`."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("big", torch.zeros(2, 8))
        self.register_buffer("k", self.big[0])
        other = torch.zeros(2, 8)
        self.register_buffer("kk", other[0])
        self.register_buffer("vv", other[1])

    def forward(self, x, read_big: bool = True):
        if read_big:
            self.k.add_(1.0)
            return self.lin(x) + self.big.sum(0)
        self.kk.add_(1.0)
        return self.lin(x) + self.vv + self.kk


def test_a_write_seen_through_another_module_tensor_is_refused_or_apart():
    """symbolic_trace puts a get_attr where it is first read: `big`, read after its row `k` was written, read the
    old values (a silent wrong answer on every call). Now refused with the line; two views apart in memory (a cache
    allocated as one tensor's rows) are written and read as eager does."""
    m = randomize_(WritesThenReadsShared()).eval()
    with pytest.raises(dc.FrontendError, match=r"writes a tensor that 'big' shares"), torch.no_grad():
        dc.compile(m, backend="reference")(_x(3, 8))
    m = randomize_(WritesThenReadsShared()).eval()
    twin = copy.deepcopy(m)  # (keeps its buffers' shared storage)
    cm = dc.compile(m, backend="interpret")
    with torch.no_grad():
        for i in range(2):
            _close(cm(_x(3, 8, seed=i), False), twin(_x(3, 8, seed=i), False))
    _close(m.kk, twin.kk)


class Reassigns(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x, pair):
        self.count = self.count + 1
        return x * pair[0]


def test_buffer_reassignment_dynamo_cannot_record_is_refused():
    m = Reassigns()
    with pytest.raises(dc.FrontendError, match="forward assigns 'count'"):
        dc.compile(m, backend="interpret")(_x(2, 3), (_x(3),))
    assert type(m.count) is torch.Tensor and m.count.item() == 0


class WritesThroughView(nn.Module):
    def forward(self, x):
        h = x * 2
        v = h[:, :2]
        v.mul_(3.0)  # also writes h, which is read below
        return h + 1, v - 1


class FillsPieces(nn.Module):
    """DeepSeek-V2/V3's key states: a new tensor filled piece by piece through slices of it."""

    def forward(self, a, b):
        k = a.new_empty(*a.shape[:-1], a.shape[-1] + b.shape[-1])
        k[..., : a.shape[-1]].copy_(a)
        k[..., a.shape[-1] :].copy_(b.expand(*a.shape[:-1], -1))  # (a broadcast source, as DeepSeek's k_rot)
        return torch.softmax(k, -1)


class ViewsOfViews(nn.Module):
    """Writes through a reshape of a slice and through a transpose; a view taken before a write to its tensor and
    read after it; a write through a view of an input (eager writes the caller's tensor)."""

    def forward(self, x, y):
        h = x + 1
        early = h[1:3]  # taken before the writes below, read after them: sees their values
        h.view(2, 2, 3)[:, 1].add_(y[0])
        h.t()[0].mul_(2.0)
        x[:, 1:].copy_(h[:, :2])  # the input itself, through a view
        return h * 1, early + 0, x * 1


class WritesThroughStridedViews(nn.Module):
    """Writes through views the IR does not take, which PyTorch takes and puts back: strided slices (of a
    transpose, and a slice of one), a diagonal of the input, integer tensors' rows as BEiT's relative positions are
    built (`c[:, 0] += k` traced by dynamo as getitem, iadd, setitem); a strided view taken before a write to its
    tensor and read after it."""

    def forward(self, x, **unused):  # (**: captured by dynamo, whose graph spells `a[i] += b` out)
        h = x * 2
        early = h[::2]
        h.t()[::2] -= 1
        h[1:, ::2][0].mul_(3.0)
        x[:, :3].diagonal().add_(10.0)
        c = torch.arange(12).view(3, 4).t().contiguous()
        c[:, 0] += 2
        c[:, 1] *= 3
        i = (x > 0).long().cumsum(-1)
        i[:, 0] -= 1
        return h * 1, early + 0, x * 1, c.sum(-1), i


class StridedViewWrite(nn.Module):
    def forward(self, x):
        h = x * 2
        h.as_strided((2, 2), (1, 2)).mul_(3.0)  # which elements depends on h's strides: not put back
        return h + 1


class WritesAConstant(nn.Module):
    """symbolic_trace computes `c * 2` from a tensor made without the inputs at trace time, before the traced
    write: the graph would return zeros (and the write pile up in its constant); captured by dynamo instead."""

    def forward(self, x):
        c = torch.zeros(4)
        c.add_(x.sum())
        d = torch.arange(4)
        d[1:3] += x.sum().long()
        return c * 2, d * 2


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_inplace_writes_through_views_have_eager_semantics(backend):
    with torch.no_grad():
        for model, args in ((WritesThroughView(), (_x(3, 4),)), (FillsPieces(), (_x(2, 3, 5), _x(2, 1, 4, seed=1))),
                            (ViewsOfViews(), (_x(4, 3), _x(1, 3, seed=2))), (WritesThroughStridedViews(), (_x(4, 5),))):  # fmt: skip
            mine = [a.clone() for a in args]
            out = dc.compile(model, backend=backend)(*mine)
            ref = model(*args)  # (eager writes `args` too: compared below)
            for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
                _close(o, r)
            for a, b in zip(mine, args):
                assert torch.equal(a, b)  # inputs written as eager writes them


def test_a_tensor_filled_piece_by_piece_imports_as_a_concatenation():
    """`k[..., :d].copy_(a); k[..., d:].copy_(b)` on a new tensor: cat(a, b) read by the softmax's kernel, no torch
    call left (the writes are put back; the allocation, unread, is dropped)."""
    args = (_x(2, 3, 5), _x(2, 1, 4, seed=1))
    captured = capture(FillsPieces(), args, {})
    module = import_graph(captured, captured.flatten(args, {})).module
    run_pipeline(module, DEFAULT_PIPELINE)
    names = [op.name for op in module.walk()]
    assert "dl.cat" in names and "dl.torch_call" not in names, names  # (the unread new_empty dropped too)
    assert names.count("dl.fused") == 1


def test_inplace_write_through_a_layout_dependent_view_is_refused_with_the_line():
    with pytest.raises(dc.FrontendError) as e:
        dc.compile(StridedViewWrite(), backend="interpret")(_x(3, 4))
    line = StridedViewWrite.forward.__code__.co_firstlineno + 2
    assert "in-place method .mul_()" in str(e.value) and f"test_reliability.py:{line}" in str(e.value)


class DrawsNoise(nn.Module):
    def forward(self, x):
        return x * 2 + torch.randn(4)  # (drawn from no traced value: symbolic_trace would keep one draw)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_random_numbers_drawn_without_the_inputs_are_drawn_on_every_call(backend):
    m, x = DrawsNoise(), _x(3, 4)
    cm = dc.compile(m, backend=backend)
    with torch.no_grad():
        cm(x)
        for seed in (1, 2):  # eager's numbers for the same seed
            torch.manual_seed(seed)
            ours = cm(x)
            torch.manual_seed(seed)
            _close(ours, m(x))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_a_tensor_made_in_forward_and_written_with_the_inputs_follows_eager(backend):
    m = WritesAConstant()
    cm = dc.compile(m, backend=backend)
    with torch.no_grad():
        for seed in range(3):  # (a write piling up in a constant would show from the second call)
            x = _x(3, seed=seed)
            for o, r in zip(cm(x), m(x)):
                assert torch.equal(o, r)
    assert any("a tensor it made without its inputs" in note for note in cm.report().notes)  # (captured by dynamo)


class Structured(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        y = self.lin(x)
        return {"y": y, "pair": (torch.softmax(y, -1), None), "none": None, "n": 3}


def test_outputs_keep_tuples_dicts_and_none():
    m = randomize_(Structured()).eval()
    x = _x(4, 6)
    out, _ = _calls(dc.compile(m, backend="interpret"), x, n=1)
    ref = m(x)
    assert out.keys() == ref.keys() and out["none"] is None and out["pair"][1] is None and out["n"] == 3
    assert isinstance(out["pair"], tuple)
    _close(out["y"], ref["y"])
    _close(out["pair"][0], ref["pair"][0])

    class ReturnsNone(nn.Module):
        def forward(self, x):
            return None

    assert dc.compile(ReturnsNone(), backend="interpret")(x) is None


def test_second_call_with_another_shape_specializes():
    m, args, ref = _two()
    cm = dc.compile(m, backend="interpret")
    for a in (args, (_x(7, 24), _x(7, 20, seed=1)), args):
        out, warned = _calls(cm, *a, n=1)
        for o, e in zip(out, m(*a)):
            _close(o, e)
        assert not warned
    assert cm.specializations == 2


class NormGLU(nn.Module):
    """gate/up merged into one weight, the norm weight folded in: weights the runtime derives."""

    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(24, 1e-6)
        self.gate = nn.Linear(24, 40, bias=False)
        self.up = nn.Linear(24, 40, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return F.silu(self.gate(h)) * self.up(h)


@pytest.mark.parametrize("change", ["no_grad in-place", "load_state_dict", "assign .data"])
def test_parameters_changed_after_compile_are_used(change):
    m = randomize_(NormGLU()).eval()
    x = _x(5, 24)
    cm = dc.compile(m, backend="interpret")
    before, _ = _calls(cm, x, n=1)
    assert "dl.cat" in cm.ir()  # the merged weight is derived from gate and up
    if change == "no_grad in-place":
        with torch.no_grad():
            m.gate.weight.mul_(2.0)
            m.norm.weight.add_(0.5)
    elif change == "load_state_dict":
        m.load_state_dict({k: v * 1.5 for k, v in m.state_dict().items()})
    else:
        m.gate.weight.data = m.gate.weight.data * 2.0
    after, warned = _calls(cm, x, n=1)
    _close(after, m(x))
    assert not warned and not torch.allclose(before, after)


class ScaledNormGLU(NormGLU):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 40))

    def forward(self, x):
        return super().forward(x) * self.scale


@pytest.mark.parametrize("change", ["a new Parameter", "tied weights", "a new submodule", "a new buffer"])
def test_parameters_modules_and_buffers_assigned_after_compile_are_used(change):
    """What a model holds, assigned anew after compiling (a parameter, a layer, weights tied, a buffer), is what the
    next call computes with, as eager: the compiled module compiles again (before, the first compile's tensors ran
    on, a silent wrong answer). A call with nothing assigned in between compiles nothing."""
    m = randomize_(ScaledNormGLU()).eval()
    x = _x(5, 24)
    cm = dc.compile(m, backend="interpret")
    before, _ = _calls(cm, x, n=1)
    nn.Linear(3, 3)  # (an assignment elsewhere in the process: this module is checked, and compiles nothing)
    _calls(cm, x, n=1)
    assert cm.compile_count == 1
    if change == "a new Parameter":
        m.norm.weight = nn.Parameter(torch.rand(24) + 0.5)
    elif change == "tied weights":
        m.up.weight = m.gate.weight
    elif change == "a new submodule":
        m.gate = randomize_(nn.Linear(24, 40, bias=False))
    else:
        m.scale = torch.linspace(2.0, -1.0, 40)
    after, warned = _calls(cm, x, n=1)
    _close(after, m(x))
    assert not warned and not torch.allclose(before, after) and cm.compile_count == 2


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])
        self.seq = nn.Sequential(nn.Linear(16, 16), nn.ReLU())

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.seq(x)


@pytest.mark.parametrize("change", ["model.half()", "p.data of another shape", "del layers[1]", "Sequential.insert",
                                    "bias = None", "ModuleList.insert"])  # fmt: skip
def test_parameters_and_modules_changed_without_an_assignment_are_followed(change):
    """Changes that fire none of torch's registration hooks: the parameters' dtype (`model.half()` keeps the
    Parameter objects; the inputs, token ids, keep theirs), a parameter's shape through `.data`, submodules deleted or
    inserted, a bias set to None. Before, the first compile ran on: fp32 outputs from an fp16 model, the old output
    width, the deleted layer still applied."""
    m = randomize_(Stack()).eval()
    ids = torch.tensor([[1, 5, 7], [30, 0, 2]])
    extra = randomize_(nn.Linear(16, 16))  # (made before the calls: making it fires registration hooks)
    cm = dc.compile(m, backend="interpret")
    _calls(cm, ids, n=2)
    if change == "model.half()":
        m.half()
    elif change == "p.data of another shape":
        m.seq[0].weight.data = _x(12, 16)
        m.seq[0].bias.data = _x(12, seed=1)
    elif change == "del layers[1]":
        del m.layers[1]
    elif change == "Sequential.insert":
        m.seq.insert(1, nn.Sigmoid())
    elif change == "bias = None":
        m.layers[0].bias = None
    else:
        m.layers.insert(0, extra)
    after, warned = _calls(cm, ids, n=1)
    with torch.no_grad():
        _close(after, m(ids), tol=1e-3 if change == "model.half()" else 1e-5)
    assert not warned


def test_a_family_instance_after_model_half_compiles_again():
    """A shape family compiled in fp32, then `model.half()`, then a length none compiled: the instance finds the
    parameters' layout changed and the module compiles again (before, `ParametersChanged` reached the caller)."""
    m = randomize_(Stack()).eval()
    cm = dc.compile(m, backend="interpret")
    ids = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    for n in (9, 10, 11, 12):
        _calls(cm, ids[:, :n], n=1)
    assert cm.instances >= 1
    m.half()
    for n in (13, 9):  # (token ids keep their dtype: the same keys as before)
        out, warned = _calls(cm, ids[:, :n], n=1)
        with torch.no_grad():
            _close(out, m(ids[:, :n]), tol=1e-3)
        assert not warned


def test_functional_call_uses_the_tensors_it_swaps_in():
    """`torch.func.functional_call` swaps tensors into the module's dicts for one call (no registration hook fires):
    before, the compiled module used the model's own weights, or, where its first call was a functional call, kept
    the swapped-in tensors for every later call."""
    m = randomize_(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8))).eval()
    new = {k: _x(*v.shape, seed=i + 3) for i, (k, v) in enumerate(m.state_dict().items())}
    x = _x(4, 16)
    for first_plain in (True, False):
        cm = dc.compile(m, backend="interpret")
        with torch.no_grad():
            if first_plain:
                _close(cm(x), m(x))
            got = torch.func.functional_call(cm, {f"model.{k}": v for k, v in new.items()}, (x,))
            _close(got, torch.func.functional_call(m, new, (x,)))
            _close(cm(x), m(x))


def test_concatenated_parameters_live_in_their_buffer_once():
    """gate and up become slices of the merged weight (held once, also by a second compile of the module);
    their values and the module's own forward are unchanged, and an update still reaches the kernels."""
    m = randomize_(NormGLU()).eval()
    x = _x(5, 24)
    gate, up = m.gate.weight.detach().clone(), m.up.weight.detach().clone()
    first, _ = _calls(dc.compile(m, backend="interpret"), x, n=1)
    assert m.gate.weight.untyped_storage().data_ptr() == m.up.weight.untyped_storage().data_ptr()
    assert torch.equal(m.gate.weight, gate) and torch.equal(m.up.weight, up)
    _close(first, m(x))
    other = dc.compile(m, backend="interpret")  # shares the buffer: nothing more is allocated
    again, _ = _calls(other, x, n=1)
    assert torch.equal(first, again) and m.gate.weight.untyped_storage().nbytes() == (gate.numel() + up.numel()) * 4
    with torch.no_grad():
        m.up.weight.mul_(-1.0)
    changed, _ = _calls(other, x, n=1)
    _close(changed, m(x))


def test_an_in_place_update_of_a_concatenated_parameter_keeps_its_buffer():
    """A parameter living in its concatenated buffer and updated in place updates the buffer itself: the next call
    uses it as it is (no new buffer: a graph captured with it keeps reading the right memory); `p.data = t` builds
    the buffer again and the parameters move into it."""
    m = randomize_(NormGLU()).eval()
    x = _x(5, 24)
    cm = dc.compile(m, backend="interpret")
    _calls(cm, x, n=1)
    buffer = m.gate.weight.untyped_storage().data_ptr()
    assert m.up.weight.untyped_storage().data_ptr() == buffer
    with torch.no_grad():
        m.up.weight.mul_(-1.0)
    out, _ = _calls(cm, x, n=1)
    _close(out, m(x))
    assert m.up.weight.untyped_storage().data_ptr() == m.gate.weight.untyped_storage().data_ptr() == buffer
    m.up.weight.data = m.up.weight.data * 2.0
    out, _ = _calls(cm, x, n=1)
    _close(out, m(x))
    assert m.up.weight.untyped_storage().data_ptr() == m.gate.weight.untyped_storage().data_ptr() != buffer


def test_share_weights_false_leaves_every_parameter_where_it_is():
    """With share_weights=False no parameter is re-pointed (a CUDA graph or a tensor that holds a parameter's
    storage from before the first call keeps seeing the parameter: bench/NOTES.md 116), the merged weight is a
    copy, and the results and later updates are as with sharing."""
    m = randomize_(NormGLU()).eval()
    x = _x(5, 24)
    held = {name: p.data for name, p in m.named_parameters()}  # (what a graph captured before compiling reads)
    cm = dc.compile(m, backend="interpret", share_weights=False)
    out, _ = _calls(cm, x, n=1)
    _close(out, m(x))
    for name, p in m.named_parameters():
        assert p.untyped_storage().data_ptr() == held[name].untyped_storage().data_ptr(), name
    assert m.gate.weight.untyped_storage().data_ptr() != m.up.weight.untyped_storage().data_ptr()
    with torch.no_grad():
        m.up.weight.mul_(-1.0)
    assert torch.equal(held["up.weight"], m.up.weight)  # the tensor taken before still is the parameter's storage
    changed, _ = _calls(cm, x, n=1)
    _close(changed, m(x))
    assert not torch.allclose(changed, out)


def test_parameters_stay_where_they_are_while_a_cuda_graph_is_alive(monkeypatch):
    """A CUDA graph alive at the first compiled call may read the parameters where they are (bench/NOTES.md 116):
    the merged weight is then a copy, with one warning, and the results are the same. (CUDA stood in for on the
    CPU: the scan looks for instances of torch.cuda.CUDAGraph for buffers on a CUDA device once CUDA is
    initialized; CPU tensors are never moved on that account.)"""
    from dlblas_compiler.runtime import graphs, weights

    class Graph:  # (a stand-in: torch.cuda.CUDAGraph cannot be made without CUDA)
        pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(weights, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(weights, "_WARNED", [])
    # no graph, and a dead weak proxy among the collector's objects (HF's modules leave some): the scan passes it
    # (isinstance on it raised ReferenceError and failed every first call on the GPU) and the parameters move
    # and a graph of one of our programs alive (it checks its weights before each replay) does not count either
    gone = weakref.proxy(Graph())  # noqa: F841
    ours = Graph()
    graphs.OURS.add(ours)
    m = randomize_(NormGLU()).eval()
    x = _x(5, 24)
    out, warned = _calls(dc.compile(m, backend="interpret"), x, n=1)
    assert not warned
    _close(out, m(x))
    assert m.gate.weight.untyped_storage().data_ptr() == m.up.weight.untyped_storage().data_ptr()
    weights._SCAN.clear()
    graph = Graph()  # noqa: F841 - alive during the first call
    m = randomize_(NormGLU()).eval()
    x = _x(5, 24)
    held = {name: p.untyped_storage().data_ptr() for name, p in m.named_parameters()}
    out, warned = _calls(dc.compile(m, backend="interpret"), x, n=1)
    assert any("a CUDA graph exists as the concatenated weights" in w for w in warned), warned
    _close(out, m(x))
    assert all(p.untyped_storage().data_ptr() == held[name] for name, p in m.named_parameters())


class PromotingCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(8, 24))
        self.b = nn.Parameter(torch.randn(4, 24).half())

    def forward(self, x):
        return x @ torch.cat([self.a, self.b]).t()  # torch.cat promotes b to float32


def test_parameters_of_another_dtype_keep_their_storage():
    m = PromotingCat().eval()
    x = _x(5, 24)
    out, _ = _calls(dc.compile(m, backend="interpret"), x, n=1)
    _close(out, m(x))
    assert m.b.dtype == torch.float16 and m.a.untyped_storage().data_ptr() != m.b.untyped_storage().data_ptr()
    from dlblas_compiler.runtime.weights import _fits

    a, b = torch.randn(8, 24), torch.randn(4, 24)
    assert _fits(torch.cat([a, b]), [a, b])
    assert not _fits(torch.cat([a, b]), [a, b.half()]) and not _fits(torch.cat([a, a]), [a, a])
    assert not _fits(torch.cat([a, b]), [a, torch.randn(24, 4).t()])  # not contiguous


# -- check=True ----------------------------------------------------------------------------------------


def test_check_reports_the_worst_error_per_region():
    m, args, _ = _two()
    cm = dc.compile(m, backend="interpret", check=2)
    _, warned = _calls(cm, *args, n=4)
    summaries = {k.region: k.to_dict() for k in cm.report().kernels}
    assert not warned and {k["check_calls"] for k in summaries.values()} == {2}
    assert all(0 <= k["check_error"] <= 1e-5 for k in summaries.values())
    report = cm.report()
    assert "check gemm_0 (kernel): worst relative error" in report and "over 2 calls" in report and ": ok" in report


class TanhSoftmax(nn.Module):
    def forward(self, x):
        return torch.softmax(torch.tanh(x) * 3.0, -1), x * 2.0


def test_check_warns_once_when_a_region_exceeds_its_tolerance(monkeypatch):
    monkeypatch.setattr(TanhOp, "triton", lambda self, x: f"((2.0 * tl.sigmoid(2.0 * {x}) - 1.0) * 1.01)")
    cm = dc.compile(TanhSoftmax(), backend="interpret", check=True)
    _, warned = _calls(cm, _x(4, 9), n=3)
    assert len(warned) == 1 and "exceeds the tolerance" in warned[0] and "region row_0" in warned[0], warned
    assert "over 3 calls, tolerance 1e-05: EXCEEDS" in cm.report()


def test_check_argument_is_validated():
    with pytest.raises(ValueError, match="check must be"):
        dc.compile(TwoRegions(), check=-1)


@pytest.mark.parametrize("direct_us,replay_us,keep", [(300, 100, True), (100, 300, False)])
def test_cuda_graph_is_kept_only_when_its_replay_measures_faster(monkeypatch, direct_us, replay_us, keep):
    """The keep-or-drop decision of a captured CUDA graph (GPU-only path, timed here with sleeps): the first
    direct call after a capture is slow (allocator growth) and must not tip the decision."""
    import time
    import types

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = {"direct": 0}

    def run(inputs):
        calls["direct"] += 1
        time.sleep((5000 if calls["direct"] == 1 else direct_us) * 1e-6)

    fake = types.SimpleNamespace(run=run, replay=lambda inputs: time.sleep(replay_us * 1e-6))
    assert graph_pays(fake, []) is keep
    assert "CUDA graph replay" in fake.note


class _FakeGpu:
    """A stream on the host's clock: a kernel enqueued at time t runs from max(t, the end of the one before) for its
    duration; `synchronize` sleeps until the last one ends."""

    def __init__(self):
        import time

        self.time, self.free_at = time, 0.0

    def launch(self, host_s: float, gpu_s: float) -> None:
        self.time.sleep(host_s)  # (the host's cost of the launch)
        now = self.time.perf_counter()
        self.free_at = max(now, self.free_at) + gpu_s

    def synchronize(self, *a) -> None:
        self.time.sleep(max(0.0, self.free_at - self.time.perf_counter()))


@pytest.mark.parametrize(
    "launches,replay_gpu_ms,keep",
    [
        # GPU-bound direct calls (1 ms of enqueueing, 4 ms on the GPU): back to back, the host hides behind the
        # GPU, and the replay's copies make it the slower way (a call timed alone would charge direct launches
        # their enqueueing and keep the graph)
        ([(0.1e-3, 0.4e-3)] * 10, 4.4, False),
        # host-bound direct calls (10 launches of 0.8 ms for 0.3 ms of GPU work each): the graph saves the host
        ([(0.8e-3, 0.3e-3)] * 10, 3.3, True),
    ],
)
def test_cuda_graph_keep_or_drop_times_calls_back_to_back(monkeypatch, launches, replay_gpu_ms, keep):
    """The keep-or-drop decision compares the two ways as a caller runs them, calls back to back: a direct call
    costs the larger of its enqueueing and its GPU time, a replay its GPU time with its copies."""
    import types

    gpu = _FakeGpu()
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)

    def run(inputs):
        for host_s, gpu_s in launches:
            gpu.launch(host_s, gpu_s)

    fake = types.SimpleNamespace(run=run, replay=lambda inputs: gpu.launch(20e-6, replay_gpu_ms * 1e-3))
    assert graph_pays(fake, []) is keep
    assert "back to back" in fake.note and "enqueueing" in fake.note


def test_keep_or_drop_timing_puts_the_written_inputs_back_before_every_call(monkeypatch):
    """A decode step writes the cache at the position its counter input gives, and increments the counter: the
    ~40 timed calls must each start from the caller's state, or they write past the cache's end (a device-side
    assert at a prompt of 1024 with 4 new tokens, found on the H100)."""
    import types

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    counter, cache = torch.tensor([5]), torch.zeros(8)
    seen = []

    def step(inputs):  # cache[counter] = 1; counter += 1
        seen.append(int(counter))
        cache[int(counter)] = 1.0
        counter.add_(1)

    saved = (counter.clone(), cache.clone())

    def reset():
        counter.copy_(saved[0])
        cache.copy_(saved[1])

    fake = types.SimpleNamespace(run=step, replay=step)
    graph_pays(fake, [], reset)
    assert len(seen) == 2 + ROUNDS * 2 * CALLS and set(seen) == {5}


def test_cuda_graph_capture_policy_for_a_cache_written_in_place(monkeypatch):
    """A program whose cache input is written in place is captured from its second consecutive call with the
    cache at the same address (the decode steps), never for a cache seen once (each generate()'s prefill), and
    captured again when a new cache comes back twice; the keep-or-drop timing is measured once."""
    events = []

    class FakeGraph:
        note = ""

        def __init__(self, run, static, in_place=(), handout=True, checked=False):
            self.run, self.static = run, static

        def capture(self, inputs):
            self.address = self.addresses = inputs[0].data_ptr()
            events.append(("capture", self.address))
            return True

        def pays(self, inputs):
            events.append(("timed",))
            return True

        def matches(self, addresses, inputs):
            return addresses == (self.address,)

        def held(self):
            return False

        def replay(self, inputs):
            events.append(("replay", inputs[0].data_ptr()))
            return self.run(inputs)

    monkeypatch.setattr(program_mod, "CudaGraph", FakeGraph)
    program = program_mod.Program([0], [0], [], 1, cuda_graphs=True, static_inputs=(0,))
    first, second, third = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    for cache in [first, second, second, second, first, third, third, third, second]:
        program([cache])
    b, c = second.data_ptr(), third.data_ptr()
    assert events == [("capture", b), ("timed",), ("replay", b), ("replay", b), ("capture", c), ("replay", c), ("replay", c)]


def test_cuda_graph_reads_a_repeated_input_in_place_and_hands_out_its_outputs_until_one_is_kept(monkeypatch):
    """A large input passed at one address and layout in the two calls before a capture is read there (no copy);
    when one arrives elsewhere the program captures again and copies its inputs from then on. Replays hand out the
    graph's output buffers until the caller keeps one past the next call; then it captures again, cloning."""
    captures, kept = [], {"held": False}

    class FakeGraph:
        note, addresses = "", ()

        def __init__(self, run, static, in_place=(), handout=True, checked=False):
            self.run, self.in_place, self.handout = run, in_place, handout

        def capture(self, inputs):
            self.keys = [graphs_mod.input_key(inputs[i]) for i in self.in_place]
            captures.append((self.in_place, self.handout))
            return True

        def pays(self, inputs):
            return True

        def matches(self, addresses, inputs):
            return all(graphs_mod.input_key(inputs[i]) == k for i, k in zip(self.in_place, self.keys))

        def held(self):
            return self.handout and kept["held"]

        def replay(self, inputs):
            return self.run(inputs)

    monkeypatch.setattr(program_mod, "CudaGraph", FakeGraph)
    program = program_mod.Program([0, 1], [0], [], 2, cuda_graphs=True)
    big = torch.zeros(graphs_mod.IN_PLACE_BYTES // 4)
    small = torch.zeros(4)
    program([big, small])
    program([big, small.clone()])  # (the small one is copied whatever its address: too small to matter)
    assert captures == [((0,), True)]
    program([big, small])
    assert len(captures) == 1  # the in-place input is still where it was
    program([big.clone(), small])  # it moved: captured again, copying every input from now on
    assert captures[-1] == ((), True) and program.copy_inputs
    kept["held"] = True  # the caller kept an output of the last replay
    program([big, small])
    assert captures[-1] == ((), False) and not program.handout
    program([big, small])
    assert len(captures) == 3


@pytest.mark.parametrize("backend", ["interpret", "reference"])
def test_intermediates_are_dropped_after_their_last_read(backend):
    """A program drops each intermediate value after the last step that reads it (at a 2048-token prefill the
    value table held every layer's activations until the call ended: 1.28x eager's peak memory on the H100):
    by the last step only inputs, weights, outputs and what that step reads are still held; values are
    unchanged."""
    model = randomize_(LlamaBlock(BlockConfig())).eval()
    x, cos, sin = llama_block_inputs(BlockConfig(), batch=1, seq=9)
    cm = dc.compile(model, backend=backend, cuda_graphs=False)
    with torch.no_grad():
        expected = model(x, cos, sin)
        torch.testing.assert_close(cm(x, cos, sin), expected, rtol=1e-4, atol=1e-4)
    program = cm._spec().executor
    held = []
    program.steps.append(lambda env: held.extend(i for i, v in enumerate(env) if isinstance(v, torch.Tensor)))
    program.frees.append(())
    with torch.no_grad():
        torch.testing.assert_close(program.run([x, cos, sin])[0], expected, rtol=1e-4, atol=1e-4)
    kept = {*program.inputs, *program.outputs, *(slot for slot, _ in program.weights.weights)}
    assert sum(len(f) for f in program.frees) > 0
    assert set(held) <= kept, f"slots {sorted(set(held) - kept)} outlive their last read"


def test_frees_are_each_slots_last_read_or_making_step():
    assert program_mod._frees([[0, 1, 5], [1, 2], [2, 3, 6]], kept={0, 3}) == [(5,), (1,), (2, 6)]


class CounterCache(nn.Module):
    """A decode step as HF's static cache writes it: positions from a length counter, the counter incremented in
    place, the cache written at those positions; `old_after`: the counter's old value (as a float) is also used
    after the increment."""

    def __init__(self, old_after: bool):
        super().__init__()
        self.old_after = old_after
        self.lin = nn.Linear(4, 4)

    def forward(self, x, counter, cache):
        pos = torch.arange(x.shape[0]) + counter
        old = counter.float() * 2.0
        counter.add_(x.shape[0])
        cache.index_copy_(0, pos, self.lin(x))
        out = cache.sum(0)
        return out + old if self.old_after else out


@pytest.mark.parametrize("old_after", [False, True])
def test_an_input_counter_is_incremented_in_place_and_follows_eager(old_after):
    """`counter.add_(n)` on an input, which the IR runs on a copy, writes the caller's tensor directly (no copy
    of the counter before, none back after: no `WriteInput` step) where no later step reads its old value; the
    outputs, the counter and the cache follow eager over several calls."""
    from dlblas_compiler.dialects import TorchCallOp
    from dlblas_compiler.runtime.inplace import WriteInput

    m = randomize_(CounterCache(old_after)).eval()
    cm = dc.compile(m, backend="interpret")
    state, twin = (torch.tensor(0), torch.zeros(12, 4)), (torch.tensor(0), torch.zeros(12, 4))
    for i in range(3):
        x = _x(3, 4, seed=i)
        with torch.no_grad():
            out, ref = cm(x, *state), m(x, *twin)
        _close(out, ref)
        assert int(state[0]) == int(twin[0]) == 3 * (i + 1)
        _close(state[1], twin[1])
    program = cm._spec().executor
    in_place = [op for op in program.recipe.builder.inplace if isinstance(op, TorchCallOp)]
    assert [op.callee.data for op in in_place] == ["torch.Tensor.add_"]
    assert not [s for s in program.steps if isinstance(s, WriteInput)]


class LayerCounters(nn.Module):
    """Three layers of a static cache as HF writes them: each layer's positions from its own length counter, the
    counter incremented in place, its cache written there; `reads_new`: the first counter's new value is read at
    the end too."""

    def __init__(self, reads_new: bool):
        super().__init__()
        self.reads_new = reads_new
        self.lins = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, c0, c1, c2, k0, k1, k2):
        out = torch.zeros(4)
        for lin, counter, cache in zip(self.lins, (c0, c1, c2), (k0, k1, k2)):
            pos = torch.arange(x.shape[0]) + counter
            counter.add_(1)
            cache.index_copy_(0, pos, lin(x))
            out = out + cache.sum(0)
        return out + c0.float() if self.reads_new else out


@pytest.mark.parametrize("reads_new", [False, True])
def test_counters_incremented_in_place_run_last_as_one_foreach_call(reads_new):
    """Each layer's `counter.add_(1)` whose new value only the outputs read runs at the program's end, those alike
    as one `torch._foreach_add_` (one kernel a token where each layer's counter was one); a counter whose new
    value a later op reads keeps its place. Outputs, counters and caches follow eager over several calls."""
    from dlblas_compiler.frontend.importer import _Method
    from dlblas_compiler.runtime.inplace import ForeachInPlace
    from dlblas_compiler.runtime.stacked import StackedCall
    from dlblas_compiler.runtime.steps import TorchStep

    m = randomize_(LayerCounters(reads_new)).eval()
    cm = dc.compile(m, backend="interpret")
    state = [torch.tensor(0) for _ in range(3)] + [torch.zeros(12, 4) for _ in range(3)]
    twin = [t.clone() for t in state]
    for i in range(3):
        x = _x(2, 4, seed=i)
        with torch.no_grad():
            out, ref = cm(x, *state), m(x, *twin)
        _close(out, ref)
        assert [int(c) for c in state[:3]] == [int(c) for c in twin[:3]] == [i + 1] * 3
        for a, b in zip(state[3:], twin[3:]):
            _close(a, b)
    steps = cm._spec().executor.plan[0]
    (batch,) = [s for s in steps if isinstance(s, ForeachInPlace)]
    assert steps[-1] is batch and (batch.method, batch.scalar) == ("add_", 1) and len(batch.ins) == (2 if reads_new else 3)
    in_place_adds = [s for s in steps if getattr(getattr(getattr(s, "fn", None), "func", None), "target", None) == _Method("add_")]
    assert len(in_place_adds) == (1 if reads_new else 0)
    (positions,) = [s for s in steps if isinstance(s, StackedCall)]  # each layer's `arange + counter`, as one
    assert len(positions.members) == 3 and all(isinstance(s, TorchStep) and s.once for s in steps[: steps.index(positions)])


def test_elementwise_calls_alike_over_inputs_run_first_as_one_stacked_call():
    """`torch.arange(2) + counter_i` for three counters (HF's static cache computes each layer's positions so: a
    kernel per layer and token) runs first as one call on the stacked counters, the aranges (constants of one
    form) read once; each result equals the call's own, in its dtype. Run call by call where stacking would change
    the result: operands of different dtypes (a bf16 tensor plus a float32 0-dim one stays bf16; stacked, the
    float32 would promote it), operands whose shapes differ at this call. A call whose result the program returns
    keeps its place. Scalars of one value but another type (1, 1.0) are different forms."""
    import operator

    from dlblas_compiler.frontend.importer import TorchCall, _Slot
    from dlblas_compiler.runtime.stacked import StackedCall, stacked
    from dlblas_compiler.runtime.steps import TorchStep

    def call(target, args) -> TorchCall:
        return TorchCall(target, args, {}, (0,), False, (), True)

    def step(name, fn, ins, outs, once=False) -> TorchStep:
        st = TorchStep(name, fn, ins, outs, once)
        st.form = fn.form()
        return st

    aranges = [step(f"arange_{i}", call(torch.arange, (2,)), [], [3 + i], once=True) for i in range(3)]
    adds = [step(f"pos_{i}", call(operator.add, (_Slot(0), _Slot(1))), [3 + i, i], [6 + i]) for i in range(3)]
    other = TorchStep("other", lambda t: (t * 2,), [6], [9])
    steps = [aranges[0], adds[0], other, aranges[1], adds[1], aranges[2], adds[2]]
    plan, frees = stacked(steps, [()] * len(steps), inputs=[0, 1, 2], outputs=[9])
    assert plan[:3] == aranges and isinstance(plan[3], StackedCall) and plan[3].members == adds and len(frees) == len(plan)
    assert [kind for kind, _ in plan[3].places] == ["shared", "stack"] and other in plan and adds[0] not in plan

    def run(counters):
        env = [*counters] + [None] * 7
        for st in plan:
            st(env)
        return env[6:9]

    for out, c in zip(run([torch.tensor(3), torch.tensor(5), torch.tensor(7)]), (3, 5, 7)):
        assert out.tolist() == [c, c + 1] and out.dtype == torch.int64 and out.is_contiguous()
    bf16 = [step(f"b_{i}", call(operator.add, (_Slot(0), _Slot(1))), [3, i], [6 + i]) for i in range(3)]
    env = [torch.tensor(0.5), torch.tensor(1.5), torch.tensor(2.5), torch.ones(2, dtype=torch.bfloat16)] + [None] * 5
    for st in stacked(bf16, [()] * 3, inputs=[0, 1, 2, 3], outputs=[])[0]:
        st(env)
    assert [t.dtype for t in env[6:9]] == [torch.bfloat16] * 3 and env[8].tolist() == [3.5, 3.5]
    ragged = run([torch.tensor(3), torch.tensor([5]), torch.tensor(7)])
    assert [t.tolist() for t in ragged] == [[3, 4], [5, 6], [7, 8]]
    kept, _ = stacked(steps, [()] * len(steps), inputs=[0, 1, 2], outputs=[7, 9])  # (pos_1 is returned)
    (batch,) = [s for s in kept if isinstance(s, StackedCall)]
    assert batch.members == [adds[0], adds[2]] and adds[1] in kept
    # `x + 1`, `y + 1` and `z + 1.0` on int counters: 1 == 1.0, but the last promotes to float (its own form)
    ints = [step(f"i_{i}", call(operator.add, (_Slot(0), v)), [i], [3 + i]) for i, v in enumerate((1, 1, 1.0))]
    plan, _ = stacked(ints, [()] * 3, inputs=[0, 1, 2], outputs=[])
    assert isinstance(plan[0], StackedCall) and plan[0].members == ints[:2] and plan[1] is ints[2]
    env = [torch.tensor(3), torch.tensor(5), torch.tensor(7)] + [None] * 3
    for st in plan:
        st(env)
    assert [(t.item(), t.dtype) for t in env[3:]] == [(4, torch.int64), (6, torch.int64), (8.0, torch.float32)]
    # one place's tensors of two dtypes (float32 and bf16 inputs, each `+ 1`): call by call, each in its own dtype
    plan, _ = stacked(ints[:2], [()] * 2, inputs=[0, 1], outputs=[])
    env = [torch.ones(4), torch.ones(4, dtype=torch.bfloat16)] + [None] * 3
    for st in plan:
        st(env)
    assert (env[3].dtype, env[4].dtype) == (torch.float32, torch.bfloat16)
    # a constant another step reads after the first member keeps its value for it: the members' frees of constants
    # are dropped (`_frees` put the arange's free on its last reader, the second member, which now runs first)
    times = TorchStep("times", lambda a, p: (a * p,), [3, 6], [10])
    steps = [aranges[0], adds[0], times, step("pos_1", call(operator.add, (_Slot(0), _Slot(1))), [3, 1], [7])]
    plan, frees = stacked(steps, [(), (), (6,), (3,)], inputs=[0, 1], outputs=[])
    env = [torch.tensor(3), torch.tensor(5)] + [None] * 9
    for st, free in zip(plan, frees, strict=True):
        st(env)
        for slot in free:
            env[slot] = None
    assert isinstance(plan[1], StackedCall) and env[10].tolist() == [0, 4] and env[7].tolist() == [5, 6]


def test_deferred_in_place_calls_group_by_method_and_scalar_type():
    """`add_(1)` on int counters and `add_(1.0)` on float tensors are two groups (an int tensor's `add_(1.0)` fails
    where `add_(1)` runs); a call with no other alike keeps its place; each group runs after every other step."""
    from dlblas_compiler.runtime.inplace import ForeachInPlace, batched
    from dlblas_compiler.runtime.steps import TorchStep

    def never(*a, **k):
        raise AssertionError("a deferred call ran in its place")

    def add(slot: int, scalar, out: int) -> TorchStep:
        step = TorchStep(f"add_{slot}", never, [slot], [out])
        step.foreach = ("add_", scalar, slot)
        return step

    other = TorchStep("other", lambda t: (t * 2,), [4], [9])
    alone = TorchStep("mul_", lambda t: (t.mul_(3),), [5], [10])
    alone.foreach = ("mul_", 3, 5)
    steps, frees = batched([add(0, 1, 6), other, add(1, 1, 7), add(2, 1.0, 8), add(3, 1.0, 11), alone], [()] * 6)
    assert steps[:2] == [other, alone] and all(isinstance(s, ForeachInPlace) for s in steps[2:]) and len(steps) == 4
    assert len(frees) == 4
    env = [torch.tensor(0), torch.tensor(5), torch.tensor(0.5), torch.tensor([1.5, 2.0]), torch.ones(2), torch.ones(2)]
    env += [None] * 6
    for step in steps:
        step(env)
    assert [env[6].item(), env[7].item(), env[8].item()] == [1, 6, 1.5] and env[11].tolist() == [2.5, 3.0]
    assert env[6].dtype == torch.int64 and env[6] is env[0] and env[10].tolist() == [3.0, 3.0]
    zero, negative = TorchStep("a", never, [0], [1]), TorchStep("b", never, [2], [3])
    zero.foreach, negative.foreach = ("mul_", 0.0, 0), ("mul_", -0.0, 2)
    assert batched([zero, negative], [(), ()])[0] == [zero, negative]  # (0.0 and -0.0: not alike)


def test_a_program_running_a_module_opaquely_does_not_count_as_checking_its_weights():
    """A module run by PyTorch (an opaque call_module) reads its parameters live, unseen by the weight check before a
    replay: such a program's CUDA graph is not one of `graphs.OURS`, so building concatenated weights keeps the
    parameters in place for it."""
    from dlblas_compiler.frontend.importer import TorchCall, _Method, _Slot
    from dlblas_compiler.runtime.program import Program
    from dlblas_compiler.runtime.steps import TorchStep

    def program(target) -> Program:
        call = TorchCall(target, (_Slot(0),), {}, (0,), False, (), True)
        return Program([0], [1], [TorchStep("n", call, [0], [1])], 2)

    assert program(nn.Linear(2, 2))._runs_modules() and not program(_Method("relu"))._runs_modules()


def test_an_input_counter_read_after_its_increment_is_not_written_in_place():
    """Where a step after the increment still reads the counter's old value (a reader moved after it, as a
    scheduling pass could), the increment must run on a copy: `inplace_updates` no longer lists it."""
    from dlblas_compiler.dialects import TorchCallOp
    from dlblas_compiler.runtime.inplace import inplace_updates

    m = randomize_(CounterCache(True)).eval()
    cm = dc.compile(m, backend="interpret")
    with torch.no_grad():
        cm(_x(3, 4), torch.tensor(0), torch.zeros(12, 4))
    builder = cm._spec().executor.recipe.builder
    fn, imported = builder.fn, builder.imported
    (add,) = [op for op in fn.body.block.ops if isinstance(op, TorchCallOp) and op.written is not None]
    assert inplace_updates(fn, imported).get(add) is not None
    readers = [u.operation for u in add.written.uses if u.operation is not add]
    reader = readers[0]
    reader.detach()
    fn.body.block.insert_op_after(reader, add)
    assert add not in inplace_updates(fn, imported)


def test_a_call_whose_aliasing_depends_on_strides_is_never_taken_as_fresh():
    """`fresh` (eager's example result shared no memory with the call's inputs) must not be trusted for calls that
    return a view or a copy depending on their input's strides: the program makes its inputs contiguous, so a
    `reshape` that copied in the example may return a view at run time."""
    import torch.fx

    from dlblas_compiler.frontend.importer import _stride_dependent

    g = torch.fx.Graph()
    x = g.placeholder("x")
    nodes = [g.call_method("reshape", (x, -1)), g.call_function(torch.reshape, (x, (-1,))), g.call_method("flatten", (x,)),
             g.call_method("to", (x,), {"memory_format": torch.channels_last}), g.call_function(torch.add, (x, 1))]
    assert [_stride_dependent(n) for n in nodes] == [True, True, True, True, False]
