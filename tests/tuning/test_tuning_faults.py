"""Candidates that fault the device: a config raising one of CUDA's sticky errors (after which the process's
context can run nothing more) ends the search with `CandidateFault`, naming the config; the config is kept in the
tuning cache, and the next search of the same kernel and shape never tries it. A process killed while it timed a
candidate leaves that candidate marked in flight, and the next search counts it as faulted too. Emulated on the
CPU: the faults are raised (or the process exits) by the candidates themselves."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dlblas_compiler.tuning import CandidateFault, SearchSpace, TuneCache, TuneJob, pow2, tune

SPACE = {"BLOCK": pow2(16, 128), "num_warps": [2, 4]}
BAD = {"BLOCK": 64, "num_warps": 2}


def _job(built: list, fault=None) -> TuneJob:
    x = torch.randn(16, 16)

    def build(config):
        built.append(dict(config))
        if fault is not None and config == BAD:
            return fault
        return lambda: torch.relu(x)

    space = SearchSpace(SPACE, {"warps": lambda c: c["BLOCK"] >= 16 * c["num_warps"]}, default=BAD)
    return TuneJob("relu", "h", space, build, {"M": 16}, (torch.float32,), "cpu", torch.relu(x))


def _illegal_access():
    raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")


def test_a_sticky_fault_ends_the_search_and_is_not_tried_again(tmp_path):
    cache = TuneCache(tmp_path / "tune.sqlite")
    built: list = []
    with pytest.raises(CandidateFault, match=r"candidate config \{'BLOCK': 64, 'num_warps': 2\} faulted .*restart"):
        tune(_job(built, _illegal_access), "full", cache=cache, progress=False, warmup_ms=1, rep_ms=2)
    assert built[-1] == BAD  # nothing was tried after the fault
    built.clear()
    out = tune(_job(built, _illegal_access), "full", cache=cache, progress=False, warmup_ms=1, rep_ms=2)
    assert BAD not in built and out.config != BAD and len(built) == 4  # every other valid config, once
    assert tune(_job(built, _illegal_access), "full", cache=cache, progress=False).from_cache


def test_an_ordinary_failure_fails_one_candidate(tmp_path):
    def out_of_resources():
        raise RuntimeError("out of resource: shared memory, Required: 270336, Hardware limit: 232448")

    built: list = []
    out = tune(_job(built, out_of_resources), "full", cache=TuneCache(tmp_path / "tune.sqlite"), progress=False,
               warmup_ms=1, rep_ms=2)  # fmt: skip
    assert BAD in built and out.config != BAD and len(built) == 5  # all five valid configs were tried


def test_a_candidate_that_kills_its_process_is_not_tried_again(tmp_path):
    """The first process exits while timing the default candidate (as a fault that aborts it would); the second
    finds that candidate still marked in flight by a process that is gone, and skips it."""
    path = tmp_path / "tune.sqlite"
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_tuning_faults import _job
        from dlblas_compiler.tuning import TuneCache, tune
        tune(_job([], lambda: os._exit(7)), "full", cache=TuneCache({str(path)!r}), progress=False)
    """)
    assert subprocess.run([sys.executable, "-c", child]).returncode == 7
    built: list = []
    out = tune(_job(built), "full", cache=TuneCache(path), progress=False, warmup_ms=1, rep_ms=2)
    assert BAD not in built and out.config != BAD


def test_a_candidate_in_flight_in_a_live_process_is_not_taken_for_a_fault(tmp_path):
    """A marker left by a process still running (here: this one) is another search under way, not a fault."""
    path = tmp_path / "tune.sqlite"
    cache = TuneCache(path)
    seen: list = []

    def look_from_another_search():  # while the default is timed, a second search of the same key starts
        inner: list = []
        tune(_job(inner), "full", cache=TuneCache(path), progress=False, warmup_ms=1, rep_ms=2)
        seen.extend(inner)
        return torch.zeros(1)

    out = tune(_job([], look_from_another_search), "full", cache=cache, progress=False, warmup_ms=1, rep_ms=2)
    assert BAD in seen  # the live marker did not ban the default for the other search
    assert out.config != BAD  # (its wrong output failed only its own check)


def test_a_fault_of_the_default_timed_after_the_search_is_raised(tmp_path):
    """The default config is timed after the search for the gain report; when it faults there (the search, with a
    budget of one, tried another config), the fault is raised and recorded, not taken for "no default time"."""
    cache = TuneCache(tmp_path / "tune.sqlite")
    with pytest.raises(CandidateFault):
        tune(_job([], _illegal_access), "full", cache=cache, progress=False, warmup_ms=1, rep_ms=2, budget=1)
    built: list = []
    tune(_job(built, _illegal_access), "full", cache=TuneCache(tmp_path / "tune.sqlite"), progress=False,
         warmup_ms=1, rep_ms=2)  # fmt: skip
    assert BAD not in built


def test_a_kernel_that_faults_while_the_program_runs_is_named_not_fallen_back_from(monkeypatch):
    """A region's kernel faulting the GPU while the program runs raises DeviceFault naming the region and config
    (its reference could not run in the faulted process); an ordinary failure still falls back to the reference."""
    import torch.nn as nn

    import dlblas_compiler as dc
    from dlblas_compiler.runtime.steps import RegionStep

    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU()).eval()
    x = torch.randn(8, 32)
    for message, faults in (("Triton Error [CUDA]: an illegal memory access was encountered", True),
                            ("out of resource: shared memory", False)):  # fmt: skip

        def launch(self, tensors, config, message=message):
            raise RuntimeError(message)

        monkeypatch.setattr(RegionStep, "launch", launch)
        cm = dc.compile(model, backend="interpret")
        with torch.no_grad():
            if faults:
                with pytest.raises(dc.DeviceFault, match=r"region gemm_0: kernel launch with config .* faulted"):
                    cm(x)
            else:
                with pytest.warns(UserWarning, match="using its reference"):
                    assert torch.allclose(cm(x), model(x))
