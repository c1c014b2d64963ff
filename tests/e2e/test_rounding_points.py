"""Eager's rounding points in bf16 and fp16, and its overflows: each `dl` op's result is rounded to its dtype as eager
rounds each op's result (codegen/exprs.py); a torch op the converters spell as several `dl` ops computes them in fp32
and rounds once, as eager's one kernel does (`converters._one_op_in_f32`); the recognizers raise a spelled-out chain
to a composite op (RMSNorm, softmax, a mean) only where its arithmetic is fp32; scalar chains fold only where exact.
Each case was a silent difference from eager, found by a probe in the seventy-seventh session: a finite value where
eager's is inf or NaN, or an fp32 output off by bf16's rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc

BACKENDS = ["interpret", "reference"]


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def _compare(f, x, backend, exact=False):
    m = Fn(f).eval()
    with torch.no_grad():
        want = m(x)
        cm = dc.compile(m, backend=backend)
        got = cm(x)
    assert got.dtype == want.dtype
    # non-finite values exactly where eager's are, and the finite ones at the dtype's precision (or equal)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    assert torch.equal(torch.isinf(got) & (got > 0), torch.isinf(want) & (want > 0)), (got, want)
    assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(want) & (want < 0)), (got, want)
    fin = torch.isfinite(want)
    if exact:
        assert torch.equal(got[fin], want[fin]), (got, want)
    else:
        torch.testing.assert_close(got[fin], want[fin])
    return cm


def _kernels(cm) -> int:
    return sum(1 for k in cm.report().kernels if k.impl == "kernel")


@pytest.mark.parametrize("backend", BACKENDS)
def test_low_precision_chains_overflow_and_round_where_eager_does(backend):
    h = torch.tensor([12.0, 11.0, 1.0, -1.0, 10.5, -3.0, 0.25, 11.2]).half()
    cm = _compare(lambda x: torch.exp(x) / 1000, h, backend)  # exp(12) = 162755 overflows fp16 before the division
    _compare(lambda x: torch.log(torch.sigmoid(x)), torch.tensor([-20.0, -10.0, 0.0, 3.0]).half(), backend)
    _compare(lambda x: (x * 300) * 300 / 90000, torch.tensor([1.0, -2.0, 0.5, 0.1]).half(), backend)
    # the mean rounded to bf16 before the subtraction: [0, 4, 0, 0], not [-1, 3, -1, -1]
    b = torch.tensor([[1000.0, 1004.0, 1000.0, 1000.0]]).bfloat16()
    _compare(lambda x: x - x.mean(-1, keepdim=True), b, backend, exact=True)
    _compare(lambda x: (x + 256) - 256, torch.tensor([0.3, 1.7, -2.2, 5.5]).bfloat16(), backend, exact=True)
    if backend == "interpret":
        assert _kernels(cm) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cast_up_reads_the_value_its_dtype_holds(backend):
    """silu(x_bf16).float(): eager's silu rounds to bf16, then the cast widens that value (the kernel had widened its
    fp32 silu: an fp32 output off by bf16's rounding, 3e-3)."""
    torch.manual_seed(0)
    x = torch.randn(4, 64).bfloat16()
    y = torch.randn(4, 64)
    _compare(lambda x: F.silu(x).float(), x, backend, exact=True)
    _compare(lambda x: (x * 1.1).float() + y, x, backend, exact=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_chains_fold_only_where_the_result_is_the_same(backend):
    x = torch.tensor([1.0, -2.0, 0.5, 3.0])
    _compare(lambda x: (x + 1e8) + (-1e8), x, backend, exact=True)  # 0 in eager: 1e8 + x rounds to 1e8
    _compare(lambda x: ((x * 1e20) * 1e20) * 1e-30, x, backend, exact=True)  # inf in eager
    _compare(lambda x: (x * 1000.0) * 0.001, (torch.randn(4, 8) * 100).half(), backend)  # x * 1000 overflows fp16
    cm = _compare(lambda x: (x * 2.0) * 4.0, x, backend, exact=True)  # powers of two >= 1: folded, exactly
    assert cm.ir("after:algebraic").count("dl.mul") == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_spelled_norms_softmax_and_means_in_fp16_stay_as_eager_computes_them(backend):
    """x.pow(2) overflows fp16 past 256 and a sum past 65504: eager's spelled RMSNorm gives 0 there and sum / n gives
    inf, where dl.rms_norm and dl.reduce_mean (fp32 inside) would not; a softmax spelled without the max gives NaN
    where exp overflows, in any dtype."""
    rms = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # noqa: E731
    _compare(rms, torch.tensor([[300.0, -200.0, 100.0, 50.0], [1.0, 2.0, -3.0, 0.5]]).half(), backend)
    _compare(lambda x: x.sum(-1, keepdim=True) / 1024, torch.full((2, 1024), 100.0).half(), backend)
    naive = lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)  # noqa: E731
    torch.manual_seed(1)
    _compare(naive, torch.randn(4, 8) * 50, backend)
    cm = _compare(rms, torch.randn(3, 16), backend)  # in fp32 it is still one dl.rms_norm
    assert "dl.rms_norm" in cm.ir("after:recognize")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["softplus2", "mish", "logsigmoid", "elu", "selu", "celu", "glu"])
def test_activations_spelled_as_several_ops_round_once(backend, dtype, name):
    """Eager's kernel for each computes in fp32 and rounds once; so do the `dl` ops they are spelled as."""
    f = {"softplus2": lambda x: F.softplus(x, beta=2.0), "mish": F.mish, "logsigmoid": F.logsigmoid, "elu": F.elu,
         "selu": F.selu, "celu": lambda x: F.celu(x, alpha=0.5), "glu": F.glu}[name]  # fmt: skip
    torch.manual_seed(2)
    x = torch.cat([torch.randn(62) * 4, torch.tensor([30.0, -30.0])]).to(dtype).reshape(2, 32)
    if name == "softplus2" and dtype == torch.float16:
        x[0, 0] = 40000.0  # beta x overflows fp16: eager gives x
    m = Fn(f).eval()
    with torch.no_grad():
        want, got = m(x), dc.compile(m, backend=backend)(x)
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_scalar_power_takes_its_exponent_in_the_tensors_dtype(backend, dtype):
    """Eager (CPU and CUDA) rounds a scalar exponent to a bf16 or fp16 tensor's dtype: x ** 2.3 in bf16 is
    x ** 2.296875 (the kernel's 2.3 was 2.1% off at x = 1000)."""
    x = torch.tensor([100.0, 31.0, 7.0, 2.0, 0.5, 3.3]).to(dtype)
    _compare(lambda x: x**2.3, x, backend, exact=True)
    _compare(lambda x: x ** (1 / 3), x, backend, exact=True)
