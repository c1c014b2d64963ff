"""What a forward switches or writes without returning a tensor: an autocast region or gradients turned on inside
forward, and an operator whose schema writes one of its arguments and returns None (vLLM's and flash-attn's cache
writes). Each was a node without a tensor result that the import dropped, found by a probe of the dynamo path in the
seventy-seventh session: fp32 where eager's autocast gave bf16, gradients silently off, a cache never written."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import dlblas_compiler as dc


@torch.library.custom_op("dlblas_test::accumulate", mutates_args=("out",))
def accumulate(x: torch.Tensor, out: torch.Tensor) -> None:
    out.add_(x)


@accumulate.register_fake
def _(x, out):
    return None


@torch.library.custom_op("dlblas_test::write_both", mutates_args=("a", "b"))
def write_both(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    a.add_(x)
    b.sub_(x)


@write_both.register_fake
def _(x, a, b):
    return None


def _entries(model, backend="interpret"):
    return {
        "torch.compile": torch.compile(copy.deepcopy(model), backend="dlblas", options={"backend": backend}),
        "dc.compile(forward)": _forward_compiled(copy.deepcopy(model), backend),
        "dc.compile(module)": dc.compile(copy.deepcopy(model), backend=backend),
    }


def _forward_compiled(model, backend):
    model.forward = dc.compile(model.forward, backend=backend)
    return model


class AutocastInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.lin(x)
        return y, y * 3, x * 2


@pytest.mark.parametrize("backend", ["interpret", "reference"])
def test_an_autocast_region_inside_forward_is_followed(backend, fresh_dynamo):
    """Each entry gives eager's dtypes (bf16 inside the region, fp32 after it) and values."""
    model = AutocastInside().eval()
    x = torch.randn(4, 16) * 10
    with torch.no_grad():
        want = model(x)
        for name, fn in _entries(model, backend).items():
            got = fn(x)
            assert [g.dtype for g in got] == [w.dtype for w in want], name
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, msg=name)
    assert not torch.is_autocast_enabled("cpu")  # (every region the import entered is left)


class GradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        with torch.enable_grad():
            z = self.lin(x)
        return z


def test_gradients_turned_on_inside_forward_run_eagerly_with_one_warning(fresh_dynamo):
    """Under an outer no_grad, a forward that turns gradients on builds an autograd graph in eager (its output
    requires grad), which compiled kernels do not: every call runs the model eagerly, with one warning (before, the
    output came back without its grad_fn, and `torch.autograd.grad` inside forward failed)."""
    model = GradInside().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = model(x)
        for name, fn in _entries(model).items():
            with pytest.warns(UserWarning, match="turns gradients on inside"):
                got = fn(x)
            assert got.requires_grad and got.grad_fn is not None, name
            torch.testing.assert_close(got, want, msg=name)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                torch.testing.assert_close(fn(x), want, msg=name)  # (warned once)


class NoGradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            y = self.lin(x)
        return torch.relu(y) * 2


def test_a_no_grad_block_inside_forward_under_grad_mode_still_compiles(fresh_dynamo):
    """The exit of a `with torch.no_grad()` block turns gradients back on: not a forward turning them on."""
    model = NoGradInside().eval().requires_grad_(False)
    x = torch.randn(2, 8)
    want = model(x)
    for name, fn in _entries(model).items():
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            torch.testing.assert_close(fn(x), want, msg=name)


class WritesThroughAnOperator(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, cache):
        accumulate(self.lin(x), cache)  # into an input
        y = torch.zeros_like(x)
        accumulate(x, y)  # into a tensor made in forward
        return y * 3


@pytest.mark.parametrize("backend", ["interpret", "reference"])
def test_an_operator_writing_its_argument_and_returning_none_writes_it(backend, fresh_dynamo):
    model = WritesThroughAnOperator().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        want_cache = torch.randn(2, 8)
        cache0 = want_cache.clone()
        want = model(x, want_cache)
        for name, fn in _entries(model, backend).items():
            if name == "dc.compile(forward)":
                continue  # (the same graph as torch.compile's)
            cache = cache0.clone()
            got = fn(x, cache)
            torch.testing.assert_close(got, want, msg=name)
            torch.testing.assert_close(cache, want_cache, msg=name)


class WritesTwo(nn.Module):
    def forward(self, x, a, b):
        write_both(x * 2, a, b)
        return x + 1


def test_an_operator_writing_two_arguments_is_a_clear_error():
    with pytest.raises(dc.FrontendError, match="writes several tensors in place"), torch.no_grad():
        dc.compile(WritesTwo(), backend="reference")(torch.randn(3), torch.zeros(3), torch.zeros(3))


def _foreach_twice(x):
    y = x * 1
    torch._foreach_add_([y, y], [x, x])
    return y


def test_an_inplace_foreach_writing_one_tensor_twice_is_a_clear_error(fresh_dynamo):
    """Eager adds twice (3x); each write was made to a copy of the tensor as it was before the other (4x, silently,
    found by a probe). A list naming distinct tensors runs as before."""
    compiled = torch.compile(_foreach_twice, backend="dlblas", options={"backend": "reference"})
    with pytest.raises(dc.FrontendError, match="writes one tensor twice"), torch.no_grad():
        compiled(torch.arange(4.0))
