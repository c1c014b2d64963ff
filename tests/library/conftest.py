import pytest
import torch


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty / empty_like return NaN-filled floats (-7777 for integers): an element a kernel leaves unwritten
    and something then reads shows up."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan") if t.is_floating_point() else -7777)

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))

