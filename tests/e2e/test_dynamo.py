"""`torch.compile(model, backend="dlblas")`: options, graph breaks, and how many compilations happen."""

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler import dynamo
from dlblas_compiler.models import RMSNorm, randomize_
from dlblas_compiler.numerics import rel_error

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Mlp(nn.Module):
    """RMSNorm -> up -> SiLU, then (after an optional graph break) down + residual."""

    def __init__(self, d: int = 32, graph_break: str | None = None):
        super().__init__()
        self.norm = RMSNorm(d, 1e-6)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.graph_break = graph_break

    def forward(self, x):
        h = F.silu(self.up(self.norm(x)))
        if self.graph_break == "print":
            print("dlblas test: between the two graphs")
        elif self.graph_break == "branch":
            h = h * 2 if x.mean() > 0 else torch.tanh(h)  # data-dependent: dynamo breaks the graph here
        return x + self.down(h)


def _inputs(seq: int, sign: float = 1.0) -> torch.Tensor:
    return sign * torch.randn(1, seq, 32).abs()


def _regions(cm) -> list[str]:
    return cm.report().patterns


def test_registered_by_entry_point_and_options_pass_through(tmp_path):
    assert "dlblas" in torch._dynamo.list_backends()
    model = randomize_(Mlp()).eval()
    dump = str(tmp_path / "ir")
    fast = torch.compile(model, backend="dlblas", options={"backend": "interpret", "tune": "none", "dump_ir": dump})
    x = _inputs(5)
    with torch.no_grad():
        assert rel_error(fast(x), model(x)) < 1e-5
    (cm,) = dynamo.COMPILATIONS
    assert (cm.options.backend, cm.options.tune, cm.options.dump_ir) == ("interpret", "none", dump)
    (spec,) = os.listdir(os.path.join(dump, "0-Mlp"))  # the graph's folder (named for the traced class), the call's
    spec = os.path.join(dump, "0-Mlp", spec)
    files = os.listdir(os.path.join(spec, "ir"))
    assert any(f.endswith("-input.mlir") for f in files)
    (fused,) = [f for f in files if f.endswith("-after-fuse.mlir")]
    assert 'dl.fused "gemm"' in open(os.path.join(spec, "ir", fused)).read()
    kernels = os.listdir(os.path.join(spec, "kernels"))
    assert kernels and all("@triton.jit" in open(os.path.join(spec, "kernels", f)).read() for f in kernels)
    assert _regions(cm) == ["gemm", "gemm"]  # norm+up+SiLU, down+residual


def test_bad_option_is_reported():
    fast = torch.compile(randomize_(Mlp()).eval(), backend="dlblas", options={"backend": "cuda-please"})
    with pytest.raises(Exception, match="backend must be one of"):
        fast(_inputs(3))


@pytest.mark.parametrize("graph_break,graphs", [("print", 2), ("branch", 2)])
def test_graph_breaks_each_graph_through_the_pipeline(graph_break, graphs, capsys):
    model = randomize_(Mlp(graph_break=graph_break)).eval()
    fast = torch.compile(model, backend="dlblas", options={"backend": "interpret"})
    x = _inputs(6)
    with torch.no_grad():
        assert rel_error(fast(x), model(x)) < 1e-5
    assert len(dynamo.COMPILATIONS) == graphs
    # every graph went through the pipeline and was fused: the first ends in norm+up+SiLU, the last in down+residual
    assert _regions(dynamo.COMPILATIONS[0])[0] == "gemm" and _regions(dynamo.COMPILATIONS[-1])[-1] == "gemm"
    assert all("after:fuse" in cm.passes for cm in dynamo.COMPILATIONS)
    if graph_break == "print":
        assert "between the two graphs" in capsys.readouterr().out


def test_compilation_counter_graphs_and_specializations():
    """Dynamo compiles a graph per frame (a branch adds a frame per side taken) and recompiles with dynamic
    sizes on a new shape; we specialize each graph once per concrete input signature."""
    model = randomize_(Mlp(graph_break="branch")).eval()
    fast = torch.compile(model, backend="dlblas", options={"backend": "reference"})

    def call(seq: int, sign: float = 1.0) -> tuple[int, list[int]]:
        x = _inputs(seq, sign)
        with torch.no_grad():
            assert rel_error(fast(x), model(x)) < 1e-5
        return len(dynamo.COMPILATIONS), [cm.specializations for cm in dynamo.COMPILATIONS]

    assert call(4) == (2, [1, 1])  # the prefix (up to the branch) and the `h * 2` side to the end
    assert call(4) == (2, [1, 1])  # same shapes: nothing new
    assert call(4, -1.0) == (3, [1, 1, 1])  # the other side of the branch
    assert call(6) == (5, [1, 1, 1, 1, 1])  # a new length: dynamo recompiles both frames taken, sizes dynamic
    assert call(8) == (5, [1, 1, 1, 2, 2])  # dynamic graphs are reused; we specialize on the new length


def test_instances_of_one_class_use_their_own_parameters():
    """Dynamo passes a module's parameters as graph inputs and hands one graph to every instance of the class:
    each instance must run with its own weights (not the first instance's)."""
    torch.manual_seed(0)
    models = [randomize_(Mlp(), seed=s).eval() for s in (1, 2, 3)]
    compiled = [torch.compile(m, backend="dlblas", options={"backend": "interpret"}) for m in models]
    x = torch.randn(4, 32)
    with torch.no_grad():
        for _ in range(2):  # (the second round replays the kept specializations)
            for m, c in zip(models, compiled, strict=True):
                assert rel_error(c(x), m(x)) < 1e-5
    assert len(dynamo.COMPILATIONS) == 1  # one graph ...
    assert dynamo.COMPILATIONS[0].specializations == 3  # ... specialized on each instance's parameters


@pytest.mark.parametrize(
    "mode,tune,cuda_graphs",
    [("default", "none", True), ("reduce-overhead", "none", True), ("max-autotune", "full", True),
     ("max-autotune-no-cudagraphs", "full", False)],
)  # fmt: skip
def test_torch_compile_modes_map_onto_options(mode, tune, cuda_graphs, monkeypatch):
    """torch hands `mode` to the backend as a keyword ("default" not at all); each maps onto tune / cuda_graphs."""
    from dlblas_compiler import options

    monkeypatch.setattr(options, "default_backend", lambda: "reference")  # no real tuning, on a GPU too
    model = randomize_(Mlp()).eval()
    fast = torch.compile(model, backend="dlblas", mode=mode)
    x = _inputs(3)
    with torch.no_grad():
        assert rel_error(fast(x), model(x)) < 1e-5
    opts = dynamo.COMPILATIONS[-1].options
    assert (opts.backend, opts.tune, opts.cuda_graphs) == ("reference", tune, cuda_graphs)


def test_mode_among_options_and_options_override_it():
    """torch.compile refuses mode= and options= together, so a "mode" key in options is the mode; other keys win."""
    model = randomize_(Mlp()).eval()
    with pytest.raises(RuntimeError, match="Either mode or options"):
        torch.compile(model, backend="dlblas", mode="max-autotune", options={"backend": "interpret"})
    fast = torch.compile(
        model, backend="dlblas", options={"mode": "max-autotune", "backend": "interpret", "cuda_graphs": False}
    )
    x = _inputs(3)
    with torch.no_grad():
        assert rel_error(fast(x), model(x)) < 1e-5
    opts = dynamo.COMPILATIONS[-1].options
    assert (opts.backend, opts.tune, opts.cuda_graphs) == ("interpret", "full", False)
    # tuning times kernels on the GPU: on the interpret backend it is skipped, and the report says so
    (note,) = [n for n in dynamo.COMPILATIONS[-1].report().notes if "tune=" in n]
    assert "tune='full' was skipped" in note and "triton backend" in note and "'interpret'" in note


def test_unknown_mode_names_the_accepted_ones():
    fast = torch.compile(randomize_(Mlp()).eval(), backend="dlblas", mode="fastest")
    with pytest.raises(Exception, match="mode must be one of .*'max-autotune-no-cudagraphs'.*got 'fastest'"):
        fast(_inputs(3))
    with pytest.raises(ValueError, match="reduce-overhead"):
        dynamo.options_for("turbo")
    assert dynamo.options_for(None, {"backend": "reference"}).tune == "none"


@pytest.mark.parametrize("tune", ["none", "quick"])
def test_tuning_off_the_gpu_is_noted_in_the_report(tune):
    """`dc.compile(tune=...)` off the triton backend runs every kernel with its default config: the report says so."""
    import dlblas_compiler as dc

    model = randomize_(Mlp()).eval()
    cm = dc.compile(model, backend="interpret", tune=tune)
    x = _inputs(3)
    with torch.no_grad():
        assert rel_error(cm(x), model(x)) < 1e-5
    notes = [n for n in cm.report().notes if "tune=" in n]
    skipped = "tune='quick' was skipped: tuning times kernels on a CUDA GPU and runs only on the triton backend"
    assert notes == ([] if tune == "none" else [f"{skipped}, not 'interpret'"])
    assert cm.report().kernels and all(k.time is None for k in cm.report().kernels)  # nothing was timed



def test_calls_dynamo_repeats_skip_describing_every_input(monkeypatch):
    """Dynamo's guards check each tensor input's type, dtype, device and fixed sizes before it calls a graph: a
    call it repeats finds its specialization from the ints, the parameters' identities and which inputs share
    storage, without describing every input (`signature_of` runs once per specialization, not per call); a new
    length, another instance's parameters and inputs that share storage still select their own specialization."""
    from dlblas_compiler import api

    described, real = [], api.signature_of
    monkeypatch.setattr(api, "signature_of", lambda *a: described.append(1) or real(*a))

    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x, y):
            return self.lin(x) + y

    models = [randomize_(Mix(), seed=s).eval() for s in (1, 2)]
    fast = [torch.compile(m, backend="dlblas", options={"backend": "reference"}) for m in models]
    calls = 0
    with torch.no_grad():
        for m, f, x, y in [(0, 0, 3, 3)] * 3 + [(1, 1, 3, 3), (0, 0, 3, "x"), (0, 0, 5, 5), (0, 0, 6, 6), (0, 0, 6, 6)]:
            a = torch.randn(x, 8)
            b = a if y == "x" else torch.randn(y, 8)  # (the same tensor twice: dynamo makes it one input)
            assert rel_error(fast[f](a, b), models[m](a, b)) < 1e-5
            calls += 1
    cms = dynamo.COMPILATIONS
    assert all(cm._picks is not None for cm in cms)  # (every graph's symbolic sizes follow its int inputs)
    assert len(described) == sum(cm.specializations for cm in cms) < calls - 2


def test_inputs_that_start_sharing_storage_get_their_own_specialization():
    """Dynamo's guards do not see that two input tensors are views of one storage; a model that writes one of
    them in place must then read the other after the write, as eager does: the call is keyed on the storage
    sharing too, and both ways of calling match eager."""

    class Scale(nn.Module):
        def forward(self, x, y):
            x.mul_(2)
            return x + y

    model = Scale()
    fast = torch.compile(model, backend="dlblas", options={"backend": "reference"})
    with torch.no_grad():
        for alias in (False, True, False, True):
            a = torch.randn(3, 8)
            b = a.view(3, 8) if alias else torch.randn(3, 8)
            a2 = a.clone()
            b2 = a2.view(3, 8) if alias else b.clone()
            assert torch.equal(fast(a, b), model(a2, b2)) and torch.equal(a, a2)
    (cm,) = dynamo.COMPILATIONS
    assert cm.specializations == 2


def test_calls_are_described_in_full_where_sizes_do_not_follow_the_int_inputs():
    """`guarded` trusts dynamo's guards only where every symbolic size of the graph's inputs is a function of its
    SymInt inputs, read from the placeholders' example values: a graph without them is keyed in full."""
    from dlblas_compiler import api

    assert not api._sizes_follow_ints(nn.Linear(2, 2))  # (no graph)
    gm = torch.fx.symbolic_trace(nn.Linear(2, 2))  # (placeholders without dynamo's example values)
    assert not api._sizes_follow_ints(gm)
    cm = api.CompiledModule(gm, api.Options(backend="reference"))
    cm.trust_dynamo_guards(api.input_kinds([torch.randn(3, 2)]))
    assert cm._picks is None
    x = torch.randn(3, 2)
    with torch.no_grad():
        assert torch.equal(cm.guarded((x,)), gm(x))
    assert cm.specializations == 1


def test_more_compiles_of_one_forward_than_dynamos_recompile_limit_all_compile():
    """Dynamo counts the compiles of a code object over every torch.compile of it and runs that code eager after
    8; Hugging Face models' forwards share one code object, so a process compiling several models reached it.
    `dc.compile` raises the limit around its calls: twelve compiles of one forward all run our program. A function
    that compiled nothing says so by name."""
    import dlblas_compiler as dc

    model = randomize_(Mlp()).eval()
    x = _inputs(4)
    with torch.no_grad():
        want = model(x)
        for i in range(12):
            fn = dc.compile(model.forward, backend="reference")
            if i == 0:
                with pytest.raises(RuntimeError, match="Mlp has compiled nothing yet"):
                    fn.report()
            assert rel_error(fn(x), want) < 1e-5
            assert len(fn.compilations) == 1, i  # (ran our program, not eager)
            assert "fused region" in str(fn.report())
    assert torch._dynamo.config.recompile_limit == 8


def test_dynamic_true_floats_dynamo_leaves_unspecialized_compile_per_value():
    """Under `dynamic=True` dynamo passes a module's float attributes (a LayerNorm's eps, a scale) as 0-d tensors
    that the graph reads with `.item()`, whose value cannot be known while tracing: the graph takes the floats
    themselves (`api.floats_as_scalars`), each value its own specialization, and a changed scale is followed."""

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm, self.scale = nn.Linear(16, 32), nn.LayerNorm(32), 0.5

        def forward(self, x):
            return torch.softmax(self.norm(self.lin(x)), -1) * self.scale

    m = randomize_(Scaled()).eval()
    f = torch.compile(m, backend="dlblas", dynamic=True, options={"backend": "interpret"})
    with torch.no_grad():
        for seq, scale in ((3, 0.5), (5, 0.5), (5, 2.0), (3, 0.5)):
            m.scale = scale
            x = torch.randn(2, seq, 16)
            assert rel_error(f(x), m(x)) < 1e-5
    (cm,) = dynamo.COMPILATIONS
    assert cm.specializations == 3 and set(cm.report().impls().values()) == {"kernel"}


class VmapsAndScans(nn.Module):
    """torch.vmap in forward, and torch's associative_scan in its generic mode (which runs vmap), as Jamba's and
    other Mamba-style layers use it while dynamo compiles them; linears and a norm around them."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.up, self.norm = nn.Linear(d, d), RMSNorm(d, 1e-6)

    def forward(self, x):
        from torch._higher_order_ops.associative_scan import associative_scan

        h = self.up(x)
        h = torch.vmap(lambda a, b: a * b.sigmoid() + b)(h, x)  # (batched over x's first dim)

        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]

        _, states = associative_scan(combine, (h.sigmoid(), x), dim=1, combine_mode="generic")
        return self.norm(states + h)


def test_vmap_and_generic_associative_scan_run_as_one_torch_call_each():
    """Dynamo inlines vmap into the graph as functorch's steps on batched tensors, which only PyTorch can run, in
    order: each transform region is one PyTorch call (`frontend/functorch.py`), the linear and the norm around it
    generated kernels; the result equals eager's. (It had failed while importing: "Cannot access storage of
    BatchedTensorImpl".)"""
    m = randomize_(VmapsAndScans()).eval()
    f = torch.compile(m, backend="dlblas", options={"backend": "interpret"})
    with torch.no_grad():
        for seq in (6, 9):
            x = torch.randn(2, seq, 16)
            assert rel_error(f(x), m(x)) < 1e-5
    assert dynamo.COMPILATIONS
    for cm in dynamo.COMPILATIONS:
        report = cm.report()
        assert set(report.impls().values()) == {"kernel"}, report.impls()
        assert "functorch_region" in {f.name.rsplit(".", 1)[-1] for f in report.fallbacks}, report.fallbacks


class _Hooked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(self.a(x).relu())


@pytest.mark.parametrize("keep_traces", [False, True])
def test_a_forward_hook_registered_after_the_first_call_runs(keep_traces, tmp_path, monkeypatch, fresh_dynamo):
    """torch.compile's dynamo skips guards on the modules' hooks by default: a hook registered after the first call
    was silently not run by `dc.compile(model.forward)`, and a saved trace (keep_traces) ignored one registered
    before. Our dynamo calls now guard the hooks, and a module with hooks does not use saved traces."""
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    model, x = _Hooked().eval(), torch.randn(3, 8)
    model.forward = dc.compile(model.forward, backend="reference", keep_traces=keep_traces)
    with torch.no_grad():
        model(x)
        handle = model.a.register_forward_hook(lambda m, i, o: o * 0 + 1)
        torch.testing.assert_close(model(x), _Hooked.forward(model, x))
        handle.remove()
        torch.testing.assert_close(model(x), _Hooked.forward(model, x))


class GlobalTokens(nn.Module):
    """Longformer's global attention: after `nonzero` breaks the graph, the next graph takes the most global tokens
    as a 0-d tensor and makes `torch.arange` of it, a shape that depends on that tensor's value."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, mask):
        h = self.lin(x)
        num = mask.long().sum(dim=1)
        most = num.max()
        picked = h[mask.nonzero(as_tuple=True)]
        local = torch.arange(most, device=x.device) < num.unsqueeze(-1)
        return h * 2, local, picked


def test_a_graph_whose_shapes_depend_on_values_runs_as_dynamo_traced_it(fresh_dynamo):
    """Such a graph runs eagerly, with one warning naming the node and its line, and the other graphs are compiled
    (before, an error that said to compile the forward, which this already was)."""
    m = randomize_(GlobalTokens()).eval()
    x = torch.randn(2, 6, 8)
    fast = torch.compile(m, backend="dlblas", options={"backend": "interpret", "tune": "none"})
    for mask in ([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], [[1, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]]):
        mask = torch.tensor(mask).bool()
        with torch.no_grad(), pytest.warns(UserWarning, match=r"depends on a tensor's values \(node 'arange' at "
                                           r".*test_dynamo\.py:\d+"):  # fmt: skip
            got = fast(x, mask)  # (the second mask: other sizes after the break, another graph)
        for a, b in zip(got, m(x, mask), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any("dl.fused" in cm.ir() for cm in dynamo.COMPILATIONS if cm._last is not None)
