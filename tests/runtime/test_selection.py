"""The kernel-or-reference check (`runtime.selection.select`): both sides timed in turn, k r | r k | k r, and
their medians compared, so a drift of the timings over the measurements (a card's clocks settling) does not
decide the choice."""

from types import SimpleNamespace

import pytest
import torch

from dlblas_compiler.runtime import selection
from dlblas_compiler.runtime.steps import KernelChoice
from dlblas_compiler.tuning import TuneCache


class FakeStep:
    """A region whose kernel truly takes 1.00 time units a call and its reference 0.97."""

    def __init__(self):
        self.kernel = SimpleNamespace(tuning_key=("gemm", "source"), shape_key={"M": 8, "N": 16})
        self.choice = KernelChoice("gemm_0", "gemm", "kernel", config={"BLOCK_M": 16})
        self.calls: list[str] = []

    def private(self, tensors, every=False):
        return tensors

    def launch(self, tensors, config):
        self.calls.append("kernel")

    def run_reference(self, tensors):
        self.calls.append("reference")


@pytest.mark.parametrize("rounds, kept", [(1, "kernel"), (3, "reference")])
def test_a_drifting_clock_does_not_decide(monkeypatch, tmp_path, rounds, kept):
    """Every measurement reads 5% slower than the one before: one measurement a side (kernel first) keeps the
    slower kernel; three rounds in alternating order keep the reference, which is faster."""
    step = FakeStep()
    truth = {"kernel": 1.00, "reference": 0.97}

    def drifting(fn, **kwargs):
        fn()
        return truth[step.calls[-1]] * 1.05 ** len(step.calls)

    monkeypatch.setattr(selection, "benchmark", drifting)
    monkeypatch.setattr(selection, "SELECT_ROUNDS", rounds)
    monkeypatch.setattr(selection, "default_cache", lambda c=TuneCache(tmp_path / "tune.sqlite"): c)
    selection.select(step, [torch.zeros(1)])
    assert step.calls.count("kernel") == step.calls.count("reference") == rounds
    assert step.choice.impl == kept
    step2 = FakeStep()
    selection.select(step2, [torch.zeros(1)])  # the choice is remembered: nothing timed again
    assert step2.calls == [] and step2.choice.impl == kept
