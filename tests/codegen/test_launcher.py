"""`codegen.launcher.Launcher`: a kernel's later launches call the binary Triton compiled for the same
specialization (tensor dtypes and 16-byte alignment, int classes, constexprs), never one compiled for another."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dlblas_compiler.codegen.launcher import Launcher, _spec


def test_the_key_follows_what_triton_specializes_on():
    a, b = torch.zeros(8), torch.zeros(8)
    assert _spec(a) == _spec(b) != _spec(a[1:]) and _spec(a[4:]) == _spec(a)  # (16-byte alignment)
    assert _spec(a.double()) != _spec(a) and _spec(a.to(torch.bfloat16)) != _spec(a.half())  # (dtype)
    assert _spec(a) < 0  # (a tensor's code never equals an int's)
    codes = [_spec(n) for n in (1, 16, 48, 7, 5, 2**40, 2**40 + 3)]  # (an int's class: 1, multiple of 16, 64 bits)
    assert codes == [1, 2, 2, 0, 0, 6, 4]
    assert _spec(0.5) == _spec(2.5) == 8 and _spec(True) == 10 and _spec(False) == 9 and _spec(None) is None


@triton.jit
def _add_const(x_ptr, y_ptr, n, C: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + C, mask=i < n)


@pytest.mark.gpu
def test_later_launches_reuse_only_the_binary_of_their_own_specialization():
    """Aligned and misaligned views, n == 1 and n > 1, two constexpr values (by keyword and by position): each
    gets its own binary, every result equals torch's, and a repeated launch goes straight to the binary."""
    fast = Launcher(_add_const)
    base = torch.randn(4100, device="cuda")
    cases = [(base, 4096, 1), (base[1:], 4096, 1), (base, 1, 1), (base, 4096, 3), (base[3:], 777, 3)]
    for _ in range(2):
        for x, n, c in cases:
            y = torch.full_like(x, float("nan"))
            fast[(triton.cdiv(n, 256),)](x, y, n, C=c, BLOCK=256)
            torch.cuda.synchronize()
            assert torch.equal(y[:n], x[:n] + c) and torch.isnan(y[n:]).all()
    assert len(fast._bins) == len(cases)
    y = torch.empty_like(base)
    fast[(16,)](base, y, 4096, 5, 256)  # (constexprs by position: keyed by their values)
    fast[(16,)](base, y, 4096, 6, 256)
    torch.cuda.synchronize()
    assert torch.equal(y[:4096], base[:4096] + 6) and len(fast._bins) == len(cases) + 2


@pytest.mark.gpu
def test_a_launch_inside_a_cuda_graph_capture_uses_the_capture_stream():
    fast = Launcher(_add_const)
    x, y = torch.randn(1024, device="cuda"), torch.zeros(1024, device="cuda")
    fast[(4,)](x, y, 1024, C=2, BLOCK=256)  # (the first launch compiles, outside the capture)
    torch.cuda.synchronize()
    y.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fast[(4,)](x, y, 1024, C=2, BLOCK=256)
    assert torch.equal(y, torch.zeros_like(y))  # (captured, not run)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x + 2)


def test_an_argument_the_key_cannot_hold_goes_through_triton_every_time(monkeypatch):
    from dlblas_compiler.codegen import launcher

    monkeypatch.setattr(launcher, "_device", lambda: 0)
    runs = []

    class Fake:
        params = []

        def run(self, *a, **k):
            runs.append(a)

    fast = Launcher(Fake())
    for _ in range(2):
        fast[(1,)](1, [2, 3])  # (a list: unhashable)
    assert len(runs) == 2 and not fast._bins
