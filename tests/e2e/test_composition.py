"""Compiled modules among other code: inside a model compiled again (by dc.compile or torch.compile), TorchScript,
outputs that are sizes."""

import pytest
import torch
import torch.nn as nn

import dlblas_compiler as dc


class Outer(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + 1


def _outer_compiled(outer, how):
    if how == "torch.compile":
        torch._dynamo.reset()
        return torch.compile(outer, backend="dlblas", options={"backend": "interpret", "tune": "none"})
    if how == "forward":
        torch._dynamo.reset()
        return dc.compile(outer.forward, backend="interpret")
    return dc.compile(outer, backend="interpret")


@pytest.mark.parametrize("how", ["torch.compile", "forward", "dc.compile"])
@pytest.mark.parametrize("warm", [False, True])
def test_a_compiled_module_inside_a_model_compiled_again(how, warm):
    """The outer capture traces the inner model's own code. Before, the inner module compiled itself from the outer
    trace's fake tensors, where every storage's address is 0: a Linear came out as the identity, for that call and
    every later one at that shape."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 16)
    inner = dc.compile(lin, backend="interpret")
    x = torch.randn(3, 16)
    with torch.no_grad():
        if warm:
            inner(torch.randn(5, 16))
        got = _outer_compiled(Outer(inner), how)(x)
        torch.testing.assert_close(got, lin(x) + 1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(inner(x), lin(x), rtol=1e-5, atol=1e-5)  # (and it is not left the identity)


def test_torchscript_is_a_clear_error():
    scripted = torch.jit.script(nn.Linear(4, 4))
    with pytest.raises(dc.FrontendError, match="is TorchScript.*compile the Python module"):
        dc.compile(scripted)


class Sizes(nn.Module):
    def forward(self, x):
        return x * 2, x.shape, {"size": x.size()}, x.size(1)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_sizes_returned_are_torch_sizes(backend):
    """Before, a returned `x.shape` came back a plain tuple (pytree rebuilds torch.Size as one): `.numel()` failed."""
    cm = dc.compile(Sizes(), backend=backend)
    for n in (3, 5, 9):  # (shape families: the sizes follow the input)
        x = torch.randn(n, 4)
        with torch.no_grad():
            y, shape, d, one = cm(x)
        assert type(shape) is torch.Size and shape == x.shape and shape.numel() == 4 * n
        assert type(d["size"]) is torch.Size and d["size"] == x.shape and one == 4
        torch.testing.assert_close(y, x * 2)
