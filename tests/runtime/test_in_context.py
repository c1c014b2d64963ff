"""Near-ties decided in the program (`runtime.in_context`): a region's alternatives (what measured within
`selection.NEAR` of its choice alone) are timed in the whole program, every region sharing the search alike, and
the winner replaces the choice in every region and in the tuning cache. On the CPU the program runs directly (the
runner) and the timings come from a table of made-up true times by what each region runs (the timer); the GPU
test captures real CUDA graphs and times them in turn."""

from __future__ import annotations

import pytest
import torch

import dlblas_compiler as dc
from dlblas_compiler.models import BlockConfig, llama_block_inputs, randomize_
from dlblas_compiler.runtime import in_context, selection
from dlblas_compiler.runtime.steps import RegionStep
from dlblas_compiler.tuning import default_cache

from .test_selection import TwoBlocks

CFG = BlockConfig(hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32)


def _groups(program) -> list[selection.Group]:
    """The program's kernel regions grouped by their search, as `selection.Together` groups them."""
    groups: dict = {}
    for s in program.steps:
        if isinstance(s, RegionStep) and s.kernel is not None and s.choice.impl == "kernel":
            dtypes, device = (torch.float32,) * len(s.ins), torch.device("cpu")
            key = selection._job(s, dtypes, device, selection._no_build).cache_key()
            if key in groups:
                groups[key].members.append(s)
            else:
                groups[key] = selection.Group(key, s, dtypes, device, [s])
    return list(groups.values())


def _state(groups) -> tuple:
    return tuple((g.leader.choice.impl, str(sorted((g.leader.choice.config or {}).items()))) for g in groups)


def _fixture(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    model = randomize_(TwoBlocks(CFG)).eval()
    inputs = llama_block_inputs(CFG, 1, 16)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False, tune="none")
    with torch.no_grad():
        expected = model(*inputs)
        cm(*inputs)
    program = cm._spec().executor
    # each layer's region of one search, but the first layer's o-proj: its residual is the model's input, which it
    # may not write over (the second layer's may: cuBLAS's MM=2), so its source and search are its own
    every = _groups(program)
    groups = [g for g in every if len(g.members) == 2]
    assert len(groups) >= 3 and [len(g.members) for g in every].count(1) == 2
    return model, inputs, expected, program, groups


def _fake(groups, slower: dict):
    """A runner that snapshots what every group runs, and a timer whose calls take 1.0 plus `slower[(group index,
    impl, config key)]` for each group running that (also checking that every member runs what its leader runs)."""
    calls: list = []

    def runner():
        for g in groups:
            assert all((m.choice.impl, m.choice.config) == (g.leader.choice.impl, g.leader.choice.config)
                       for m in g.members)  # fmt: skip
        state = _state(groups)

        def call():
            calls.append(state)
            return state

        return call

    def timer(fns, turns, before=None):
        out = []
        for fn in fns:
            state = fn()
            t = 1.0 + sum(slower.get((i, impl, cfg), 0.0) for i, (impl, cfg) in enumerate(state))
            out.append([t] * turns)
        return out

    return runner, timer, calls


@pytest.mark.parametrize("faster", [True, False])
def test_an_alternative_config_faster_in_the_program_replaces_the_choice(tmp_path, monkeypatch, faster):
    """The first group's alternative (its space's largest-BLOCK config other than the chosen one) times 1% faster
    (or slower) in the program: kept in both regions of the group and written to the tuning cache (or not kept,
    both regions back on the config chosen alone); the program's outputs stay eager's either way."""
    model, inputs, expected, program, groups = _fixture(tmp_path, monkeypatch)
    g = groups[0]
    chosen = dict(g.leader.choice.config)
    other = next(c for c in g.leader.kernel.space.configs() if c != chosen)
    key = str(sorted(other.items()))
    for m in g.members:
        m.choice.time = 1e-4
    g.leader.choice.alternatives = [("kernel", other, 1.01e-4)]
    runner, timer, _ = _fake(groups, {(0, "kernel", key): -0.01 if faster else 0.01})
    changed = in_context.decide(program, list(inputs), groups, runner, timer)
    want = other if faster else chosen
    assert changed == (1 if faster else 0)
    assert all(m.choice.config == want and m.choice.impl == "kernel" for m in g.members)
    assert all(m.choice.alternatives == [] for m in g.members)
    hit = default_cache().get(g.key)
    if faster:
        assert hit is not None and hit.config == other and hit.time == 1.01e-4
        assert all("program's CUDA graph" in m.choice.reason for m in g.members)
        sel = default_cache().get(selection._select_key(g.leader, g.dtypes, g.device, other))
        assert sel is not None and sel.config == {"impl": "kernel"}
    else:
        assert hit is None  # (nothing written: the choice made alone stands)
    with torch.no_grad():
        out = program.run(list(inputs))[0]
    assert torch.allclose(out, expected, rtol=1e-3, atol=1e-3)


def test_the_reference_faster_in_the_program_runs_every_region_of_the_group(tmp_path, monkeypatch):
    """A kernel that beat its reference by under NEAR alone, and whose reference is faster in the program: every
    region of its group runs the reference, remembered under the kernel-or-reference key of its config."""
    model, inputs, expected, program, groups = _fixture(tmp_path, monkeypatch)
    g = groups[-1]
    config = dict(g.leader.choice.config)
    for m in g.members:
        m.choice.time = 1e-4
    g.leader.choice.alternatives = [("reference", None, 1.02e-4)]
    runner, timer, _ = _fake(groups, {(len(groups) - 1, "reference", str(sorted(config.items()))): -0.005})
    assert in_context.decide(program, list(inputs), groups, runner, timer) == 1
    assert all(m.choice.impl == "reference" and m.choice.reference_time == 1.02e-4 for m in g.members)
    sel = default_cache().get(selection._select_key(g.leader, g.dtypes, g.device, config))
    assert sel is not None and sel.config == {"impl": "reference"}
    assert default_cache().get(g.key) is None  # (the config is unchanged)
    with torch.no_grad():
        out = program.run(list(inputs))[0]
    assert torch.allclose(out, expected, rtol=1e-3, atol=1e-3)


def test_a_kernel_alternative_not_kept_leaves_a_reference_choice_as_it_was(tmp_path, monkeypatch):
    """A region on its reference (its kernel lost the kernel-or-reference timing narrowly) whose kernel configs are
    slower in the program too: the regions stay on the reference with the kernel's config as tuned, and nothing is
    written to the tuning cache (a first form left the rejected config in the choice and cached it as searched)."""
    model, inputs, expected, program, groups = _fixture(tmp_path, monkeypatch)
    g = groups[0]
    config = dict(g.leader.choice.config)
    other = next(c for c in g.leader.kernel.space.configs() if c != config)
    for m in g.members:
        m.choice.impl, m.choice.time, m.choice.reference_time = "reference", 1.01e-4, 1e-4
    g.leader.choice.alternatives = [("kernel", other, 1.02e-4)]
    runner, timer, _ = _fake(groups, {(0, "kernel", str(sorted(other.items()))): 0.01})
    assert in_context.decide(program, list(inputs), groups, runner, timer) == 0
    assert all((m.choice.impl, m.choice.config) == ("reference", config) for m in g.members)
    assert default_cache().get(g.key) is None
    assert default_cache().get(selection._select_key(g.leader, g.dtypes, g.device, other)) is None


class Counting(torch.nn.Module):
    """A projection whose call also counts itself in an input it writes in place (as a cache's length does)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x, n):
        n.add_(1)
        return self.proj(x) * n


def test_inputs_written_in_place_are_put_back_after_the_round(tmp_path, monkeypatch):
    """A program that writes an input in place (a counter): every timed run of the round applies the write again,
    so the round puts the input back before each timed call and once more at its end, as the first call left it
    (the program's next call then counts on from there, as eager does)."""
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    model = Counting().eval()
    x, n = torch.randn(8, 64), torch.zeros(1)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False, tune="none")
    with torch.no_grad():
        cm(x, n)
    program = cm._spec().executor
    assert program.static_inputs and float(n) == 1.0
    groups = _groups(program)
    g = groups[0]
    other = next(c for c in g.leader.kernel.space.configs() if c != g.leader.choice.config)
    g.leader.choice.time, g.leader.choice.alternatives = 1e-4, [("kernel", other, 1e-4)]
    runs = []

    def runner(program, inputs):
        return lambda: (lambda: runs.append(float(inputs[1])) or program.run(list(inputs)))

    def timer(fns, turns, before=None):
        out = []
        for fn in fns:
            for _ in range(turns):
                if before is not None:
                    before()
                fn()
            out.append([1.0] * turns)
        return out

    monkeypatch.setattr(in_context, "_graph_runner", runner)
    with torch.no_grad():
        in_context.decide(program, [x, n], groups, timer=timer)
        assert runs and all(v == 1.0 for v in runs)  # (each timed run saw the counter as the first call left it)
        assert float(n) == 1.0
        out = cm(x, n)
    assert float(n) == 2.0 and torch.allclose(out, model.proj(x) * 2.0, rtol=1e-4, atol=1e-4)


def test_a_group_whose_regions_disagree_is_left_as_it_is(tmp_path, monkeypatch):
    """A group where one region fell back to its reference alone (its kernel failed) while the first kept its kernel
    is not decided: trying an alternative would move every region, the one that fell back too."""
    model, inputs, expected, program, groups = _fixture(tmp_path, monkeypatch)
    g = groups[0]
    other = next(c for c in g.leader.kernel.space.configs() if c != g.leader.choice.config)
    g.members[1].choice.impl = "reference"
    g.leader.choice.alternatives = [("kernel", other, 1e-4)]
    runner, timer, calls = _fake(groups, {})
    assert in_context.decide(program, list(inputs), groups, lambda: pytest.fail("captured"), timer) == 0
    assert g.members[1].choice.impl == "reference" and g.leader.choice.alternatives == []


def test_within_the_margin_and_a_failing_capture_keep_the_choice(tmp_path, monkeypatch):
    """An alternative faster by less than MARGIN in the program is not kept; one whose capture fails neither (a
    warning says so), and the next group is still decided."""
    model, inputs, expected, program, groups = _fixture(tmp_path, monkeypatch)
    g0, g1 = groups[0], groups[1]
    space = list(g0.leader.kernel.space.configs())
    chosen = [dict(g.leader.choice.config) for g in (g0, g1)]
    alt0 = next(c for c in space if c != chosen[0])
    alt1 = next(c for c in g1.leader.kernel.space.configs() if c != chosen[1])
    g0.leader.choice.alternatives = [("kernel", alt0, 1e-4)]
    g1.leader.choice.alternatives = [("kernel", alt1, 1e-4), ("reference", None, 1e-4)]
    runner, timer, _ = _fake(groups, {(0, "kernel", str(sorted(alt0.items()))): -in_context.MARGIN / 2,
                                      (1, "reference", str(sorted(chosen[1].items()))): -0.02})  # fmt: skip
    failing = {"on": False}

    def flaky_runner():
        if failing["on"] and g1.leader.choice.config == alt1:
            raise RuntimeError("capture failed")
        return runner()

    failing["on"] = True
    assert in_context.decide(program, list(inputs), groups, flaky_runner, timer) == 1
    assert all(m.choice.config == chosen[0] and m.choice.impl == "kernel" for m in g0.members)
    assert all(m.choice.config == chosen[1] and m.choice.impl == "reference" for m in g1.members)


def test_a_first_call_decides_its_near_ties_in_the_program(tmp_path, monkeypatch):
    """`Program.run`'s first call with tuning on, where the program replays CUDA graphs: after its regions are
    tuned together (two layers: each search's group holds both layers' regions), the kernel-or-reference timings
    that came out even leave the reference as an alternative, and the round (graphs and timings faked on the CPU)
    takes it for every region where the program times it faster."""
    from dlblas_compiler.tuning import TUNE_MODES, TuneMode, profiler

    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(TUNE_MODES, "small", TuneMode("bayes", fraction=0.0, cap=3, floor=3, patience=None))
    even = lambda fn, *a, **k: (fn(), 1e-6)[1]  # noqa: E731 - every candidate, kernel and reference alike
    monkeypatch.setattr(profiler, "benchmark", even)
    monkeypatch.setattr(selection, "benchmark", even)
    monkeypatch.setattr(selection, "in_turn", lambda calls, **k: [(fn(), 1e-6)[1] for fn in calls])
    model = randomize_(TwoBlocks(CFG)).eval()
    inputs = llama_block_inputs(CFG, 1, 16)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    seen: list = []
    decided: list = []
    real_decide = in_context.decide

    def recording(program, inputs, groups, **kw):
        decided.extend(groups)
        return real_decide(program, inputs, groups, **kw)

    monkeypatch.setattr(in_context, "decide", recording)

    def fake_runner(program, inputs):
        def runner():
            state = tuple((s.choice.impl, str(s.choice.config)) for s in program.steps if isinstance(s, RegionStep))
            return lambda: seen.append(state) or state

        return runner

    def timer(fns, turns, before=None):  # (a region on its reference: 1% faster)
        return [[1.0 - 0.01 * sum(impl == "reference" for impl, _ in fn()) for _ in range(turns)] for fn in fns]

    monkeypatch.setattr(in_context, "_graph_runner", fake_runner)
    monkeypatch.setattr(in_context, "paired", timer)
    with torch.no_grad():
        expected = model(*inputs)
        cm(*inputs)
        program = cm._spec().executor
        regions = [s for s in program.steps if isinstance(s, RegionStep) and s.kernel is not None]
        program.tune_mode, program.tuned, program.cuda_graphs = "small", False, True
        first = program.run(list(inputs))[0]
        assert seen  # (the round ran)
        assert all(s.choice.impl == "reference" and "program's CUDA graph" in s.choice.reason
                   for s in regions if not s.prefer_kernel)  # fmt: skip
        assert all(s.choice.alternatives == [] for s in regions)
        # (each layer's region of a search, one group; the first layer's o-proj alone, see `_fixture`)
        singles = {g.members[0].choice.region for g in decided if len(g.members) == 1}
        assert decided and all(len(g.members) in (1, 2) for g in decided) and singles <= {"gemm_1", "gemm_5"}
        second = program.run(list(inputs))[0]
    for out in (first, second):
        assert torch.allclose(out, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_near_ties_are_decided_in_real_cuda_graphs(tmp_path, monkeypatch):
    """On a GPU: a two-layer Llama stack's regions, each given another config of its space (a start of the quick
    search) as an alternative, decided by capturing the program as CUDA graphs and timing their replays in turn;
    every region ends on its choice or its alternative, the two layers alike, and the compiled stack still matches
    a float64 eager run afterwards (its own graph captured anew)."""
    import copy

    from dlblas_compiler.numerics import rel_error, tolerance
    from dlblas_compiler.tuning import paired

    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(in_context, "TURNS", (10, 10))
    cfg = BlockConfig(hidden=512, intermediate=1024, heads=8, kv_heads=2, head_dim=64)
    model = randomize_(TwoBlocks(cfg)).eval()
    exact = copy.deepcopy(model).double()
    inputs = llama_block_inputs(cfg, 1, 256)
    with torch.no_grad():
        ref = exact(*[t.double() if t.is_floating_point() else t for t in inputs])
    model = model.to("cuda", torch.bfloat16)
    inputs = [t.to("cuda", torch.bfloat16) if t.is_floating_point() else t.to("cuda") for t in inputs]
    cm = dc.compile(model, backend="triton", tune="none")
    with torch.no_grad():
        cm(*inputs)
        program = cm._spec().executor
        groups = _groups(program)
        assert groups
        options = {}
        for g in groups:
            space = g.leader.kernel.space
            other = next(c for c in [*space.starts(), *space.configs()] if c != g.leader.choice.config)
            options[id(g)] = (dict(g.leader.choice.config), other)
            for m in g.members:
                m.choice.time = 1e-4
            g.leader.choice.alternatives = [("kernel", other, 1e-4)]
        timed: list = []
        monkeypatch.setattr(in_context, "paired", lambda calls, *a: timed.append(len(calls)) or paired(calls, *a))
        in_context.decide(program, list(inputs), groups)
        assert timed.count(2) == len(groups)  # (each group's alternative timed against its choice)
        for g in groups:
            assert g.leader.choice.config in options[id(g)] and g.leader.choice.impl == "kernel"
            assert all(m.choice.config == g.leader.choice.config for m in g.members)
        program.graph = None
        out = [cm(*inputs) for _ in range(3)][-1]
    assert rel_error(out.double().cpu(), ref) <= 4 * tolerance(torch.bfloat16)


@pytest.mark.gpu
def test_a_capture_replays_after_the_next_capture_gave_memory_back():
    """The round holds the current choice's capture while it captures an alternative, whose `torch.cuda.graph`
    empties the allocator's cache: the first capture's replay must still find the inputs it was captured on (its
    call holds them: `CudaGraph.replay_captured`). A call that dropped them read unmapped memory on Qwen2.5-7B's
    layer (an illegal memory access). The input here (12 MiB) has a segment of its own, given back when freed."""
    import gc

    from dlblas_compiler.numerics import rel_error, tolerance
    from dlblas_compiler.runtime.graphs import CudaGraph

    cfg = BlockConfig(hidden=3072, intermediate=1024, heads=24, kv_heads=8, head_dim=128)
    model = randomize_(TwoBlocks(cfg)).to("cuda", torch.bfloat16).eval()
    inputs = [t.to("cuda", torch.bfloat16) if t.is_floating_point() else t.to("cuda")
              for t in llama_block_inputs(cfg, 1, 2048)]  # fmt: skip
    cm = dc.compile(model, backend="triton", tune="none")
    with torch.no_grad():
        expected = cm(*inputs).clone()
        program = cm._spec().executor
        runner = in_context._graph_runner(program, list(inputs))
        first = runner()
        assert isinstance(first.__self__, CudaGraph)  # (the capture's inputs held by the call)
        second = runner()
        gc.collect()
        torch.cuda.empty_cache()
        for _ in range(2):
            first()
            second()
        torch.cuda.synchronize()
        out = first.__self__.static_out[0]
    assert rel_error(out, expected) <= tolerance(torch.bfloat16)  # (the same kernels, replayed)
