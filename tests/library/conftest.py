import pytest
import torch


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty / empty_like return NaN-filled floats (-7777 for integers, or the nearest value the type holds):
    an element a kernel leaves unwritten and something then reads shows up. (Triton's scratch for tensor
    descriptors is an int8 `torch.empty` too: -7777 itself overflowed it, and every TMA candidate failed.)"""
    empty, empty_like = torch.empty, torch.empty_like

    def value(dtype: torch.dtype) -> float | int | bool:
        if dtype.is_floating_point or dtype.is_complex:
            return float("nan")
        if dtype == torch.bool:
            return True
        info = torch.iinfo(dtype)
        return max(info.min, -7777) if info.min < 0 else min(info.max, 7777)

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(value(t.dtype))

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))

