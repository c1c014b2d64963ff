"""The kernel-or-reference check (`runtime.selection.select`): both sides timed in turn, k r | r k | k r, and
their medians compared, so a drift of the timings over the measurements (a card's clocks settling) does not
decide the choice."""

from types import SimpleNamespace

import pytest
import torch

from dlblas_compiler.runtime import selection
from dlblas_compiler.runtime.steps import KernelChoice
from dlblas_compiler.tuning import TuneCache, profiler


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
    monkeypatch.setattr(profiler, "benchmark", drifting)  # (the rounds in turn: `profiler.in_turn`)
    monkeypatch.setattr(selection, "SELECT_ROUNDS", rounds)
    monkeypatch.setattr(selection, "default_cache", lambda c=TuneCache(tmp_path / "tune.sqlite"): c)
    selection.select(step, [torch.zeros(1)])
    assert step.calls.count("kernel") == step.calls.count("reference") == rounds + 1  # (+ the brief first timing)
    assert step.choice.impl == kept
    step2 = FakeStep()
    selection.select(step2, [torch.zeros(1)])  # the choice is remembered: nothing timed again
    assert step2.calls == [] and step2.choice.impl == kept


@pytest.mark.parametrize("reference_time, kept", [(3.0, "kernel"), (0.5, "reference")])
def test_a_clear_winner_is_decided_by_the_first_brief_timing(monkeypatch, tmp_path, reference_time, kept):
    """A side `SELECT_CLEAR` times slower than the other in its first brief timing (a fused kernel against its
    unfused reference) decides the choice without the rounds in turn."""
    step = FakeStep()
    truth = {"kernel": 1.0, "reference": reference_time}
    briefs = []

    def timing(fn, warmup_ms, rep_ms, device=None):
        fn()
        briefs.append((warmup_ms, rep_ms) == selection.SELECT_PROBE_MS)
        return truth[step.calls[-1]]

    monkeypatch.setattr(selection, "benchmark", timing)
    monkeypatch.setattr(selection, "default_cache", lambda c=TuneCache(tmp_path / "tune.sqlite"): c)
    selection.select(step, [torch.zeros(1)])
    assert step.calls == ["kernel", "reference"] and briefs == [True, True]
    assert step.choice.impl == kept


ROUNDS = ["kernel", "reference", "reference", "kernel", "kernel", "reference"]


@pytest.mark.parametrize("reference_time, calls, kept", [(2.0, ["reference"], "kernel"),
                                                         (0.5, ["reference"], "reference"),
                                                         (1.2, ["reference", *ROUNDS], "kernel")])
def test_the_first_comparison_takes_the_kernels_time_from_its_search(monkeypatch, tmp_path, reference_time, calls,
                                                                     kept):  # fmt: skip
    """Where the search has just timed the kernel's config (`choice.time`, not from the cache), the brief first
    timing measures the reference alone against the search's time (a brief timing of the kernel, taken first, once
    read it far slower than its search had): a clear winner either way is decided there; close times still go to the
    rounds in turn, which time both sides."""
    step = FakeStep()
    step.choice.time = 1.0
    truth = {"kernel": 1.0, "reference": reference_time}

    def timing(fn, warmup_ms, rep_ms, device=None):
        fn()
        return truth[step.calls[-1]]

    monkeypatch.setattr(selection, "benchmark", timing)
    monkeypatch.setattr(profiler, "benchmark", timing)  # (the rounds in turn: `profiler.in_turn`)
    monkeypatch.setattr(selection, "default_cache", lambda c=TuneCache(tmp_path / "tune.sqlite"): c)
    selection.select(step, [torch.zeros(1)])
    assert step.calls == calls
    assert step.choice.impl == kept


class TwoBlocks(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        from dlblas_compiler.models import LlamaBlock

        self.blocks = torch.nn.ModuleList([LlamaBlock(cfg), LlamaBlock(cfg)])

    def forward(self, x, cos, sin):
        for block in self.blocks:
            x = block(x, cos, sin)
        return x


@pytest.mark.parametrize("small_share", [0.01, 0.5])
def test_a_first_call_runs_references_then_tunes_its_regions_together(monkeypatch, tmp_path, small_share):
    """A program's first call with tuning on (`Program.run` with `selection.Together`): the regions the cache
    cannot answer run their references for that call; then each distinct search runs once (the second layer's
    regions take the first layer's choices) and the next call runs the chosen kernels (on the interpreter here,
    each candidate checked against the reference; timings faked by a hash of the config). A kernel estimated below
    `SMALL_SHARE` of the call's kernel time keeps its default config (here, with a threshold of one half, every one:
    this block's regions are all about a launch's time)."""
    import zlib

    import dlblas_compiler as dc
    from dlblas_compiler.models import BlockConfig, llama_block_inputs, randomize_
    from dlblas_compiler.runtime.steps import RegionStep
    from dlblas_compiler.tuning import TUNE_MODES, TuneMode, profiler

    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(TUNE_MODES, "small", TuneMode("bayes", fraction=0.0, cap=3, floor=3, patience=None))
    launched: list = []

    def fake_benchmark(fn, arg_sets=None, warmup_ms=0.0, rep_ms=0.0, device=None, settle=True):
        n = len(launched)
        fn()
        config = launched[-1] if len(launched) > n else {}
        return 1e-6 * (1 + zlib.crc32(repr(sorted(config.items())).encode()) % 1000)

    monkeypatch.setattr(profiler, "benchmark", fake_benchmark)
    monkeypatch.setattr(selection, "benchmark", fake_benchmark)
    monkeypatch.setattr(selection, "SMALL_SHARE", small_share)
    cfg = BlockConfig(hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32)
    model = randomize_(TwoBlocks(cfg)).eval()
    inputs = llama_block_inputs(cfg, 1, 16)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        expected = model(*inputs)
        cm(*inputs)
        program = cm._spec().executor
        regions = [s for s in program.steps if isinstance(s, RegionStep) and s.kernel is not None]
        assert len(regions) >= 6 and all(s.choice.impl == "kernel" for s in regions)
        program.tune_mode, program.tuned = "small", False
        for step in regions:
            real = step.launch
            monkeypatch.setattr(step, "launch", lambda t, c, real=real: (launched.append(c), real(t, c))[1])
        first = program.run(list(inputs))[0]
        by_kernel: dict = {}
        for step in regions:
            by_kernel.setdefault((step.kernel.tuning_key, str(step.kernel.shape_key)), []).append(step.choice)
        # (each layer's region of one kernel and shape, but the o-proj's: the first layer's residual is the model's
        # input, the second's the first layer's output, which its kernel may write over, so their sources differ)
        assert sorted(len(choices) for choices in by_kernel.values()) == [1, 1] + [2] * (len(by_kernel) - 2)
        for (kernel, _), (leader, *others) in by_kernel.items():
            if small_share < 0.1:
                assert leader.trials == 3 and not leader.from_cache and leader.config is not None
            else:
                default = next(s for s in regions if s.kernel.tuning_key == kernel).kernel.space.default()
                assert leader.trials == 0 and leader.config == default
                assert "not searched" in leader.reason or leader.impl == "reference"  # (which the timing chose)
            for follower in others:
                assert follower.from_cache and (follower.impl, follower.config) == (leader.impl, leader.config)
        launched.clear()
        second = program.run(list(inputs))[0]
    kernels = sum(1 for s in regions if s.choice.impl == "kernel")
    assert len(launched) == kernels  # (the chosen kernels, once each)
    for out in (first, second):
        assert torch.allclose(out, expected, rtol=1e-3, atol=1e-3)


def test_an_interrupted_first_call_leaves_the_program_to_tune_again(monkeypatch, tmp_path):
    """Ctrl-C while a first call tunes: the regions not tuned yet have no config, so the program's next call
    tunes again (what the cache holds is answered at once) instead of launching kernels without configs."""
    import dlblas_compiler as dc
    from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_

    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    cfg = BlockConfig(hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32)
    model = randomize_(LlamaBlock(cfg)).eval()
    inputs = llama_block_inputs(cfg, 1, 16)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(*inputs)
        program = cm._spec().executor
        program.tune_mode, program.tuned = "quick", False

        def interrupted(self):
            raise KeyboardInterrupt

        monkeypatch.setattr(selection.Together, "tune", interrupted)
        with pytest.raises(KeyboardInterrupt):
            program.run(list(inputs))
    assert not program.tuned


def test_a_tuning_first_call_writes_the_cache_once_and_searches_on_what_the_region_saw(monkeypatch, tmp_path):
    """A region that stores k and v into the caller's static cache (its GEMM's epilogue), tuned on a first call:
    the call runs its reference, which writes the caches once, as eager does; the search after the call sees the
    caches as the region saw them (a copy made before the write: the program writes them in place), and its
    candidates write copies of that. The next call, by the chosen kernel, writes the caller's caches again."""
    import zlib

    import dlblas_compiler as dc
    from dlblas_compiler.models import randomize_
    from dlblas_compiler.numerics import rel_error, tolerance
    from dlblas_compiler.tuning import TUNE_MODES, TuneMode, profiler

    from ..codegen.test_codegen import CacheWriteQKV, _cache_write_args

    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(TUNE_MODES, "small", TuneMode("bayes", fraction=0.0, cap=3, floor=3, patience=None))
    monkeypatch.setattr(profiler, "benchmark", lambda fn, *a, **k: (fn(), 1e-6 * (1 + zlib.crc32(repr(fn).encode()) % 7))[1])
    monkeypatch.setattr(selection, "benchmark", lambda fn, *a, **k: (fn(), 1e-6)[1])
    seen: list = []
    real = selection.tune_region

    def recording(step, tensors, mode, *a, **k):
        seen.append([t.clone() for t in tensors])
        return real(step, tensors, mode, *a, **k)

    monkeypatch.setattr(selection, "tune_region", recording)
    model = randomize_(CacheWriteQKV(64, 4, 2, 16)).eval()
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(*_cache_write_args(1, 3, 64, 2, 16, 9, [0, 1, 2]))
        program = cm._spec().executor
        program.tune_mode, program.tuned = "small", False
        for call, where in enumerate([[3, 4, 5], [6, 7, 8]]):
            args = _cache_write_args(1, 3, 64, 2, 16, 9, where, seed=call + 1)
            twin, before = [a.clone() for a in args], [a.clone() for a in args]
            q = cm(*args)
            eager = model(*twin)
            assert rel_error(q, eager) <= tolerance(torch.float32)
            for c in (3, 4):  # the caller's caches: written once, as eager's, the other rows untouched
                assert rel_error(args[c], twin[c]) <= tolerance(torch.float32)
                kept = [i for i in range(9) if i not in where]
                assert torch.equal(args[c][:, :, kept], before[c][:, :, kept])
            if call == 0:  # (the search after the first call: on the caches as they were before its write)
                (tensors,) = seen
                caches = [t for t in tensors if t.shape == before[3].shape]
                assert len(caches) == 2 and all(torch.equal(t, b) for t, b in zip(caches, before[3:5]))
    (step,) = [s for s in program.steps if getattr(s, "kernel", None) is not None]
    assert step.choice.config is not None and step.choice.trials == 3
