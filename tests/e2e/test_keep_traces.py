"""`dc.compile(model.forward, keep_traces=True)`: dynamo's traces saved by one process and loaded by the next,
which then traces nothing; greedy tokens equal eager's in both, for a static and a dynamic cache and a padded
batch; a file that cannot be loaded is traced again; a forward with a graph break is compiled without saving.
(Checked beyond these: Llama, Qwen2, Mistral, Gemma, Phi-3, Qwen3, Gemma-2, GPT-NeoX and DeepSeek-V3, static and
dynamic caches, batch 1 and a padded batch: the tokens equal eager's in the saving and the loading process.)"""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import dlblas_compiler as dc

SCRIPT = textwrap.dedent('''
    import json, sys, warnings
    import torch
    from torch._dynamo.utils import counters
    import dlblas_compiler as dc
    from tests.e2e.test_generate import causal_lm

    name, cache, padded = sys.argv[1], sys.argv[2], sys.argv[3] == "padded"
    model = causal_lm(name)
    ids = torch.randint(1, 128, (2 if padded else 1, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.forward = dc.compile(model.forward, backend="reference", keep_traces=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="dlblas_compiler")
            out = model.generate(ids, **kw)
        as_tuple = model(ids, attention_mask=mask, return_dict=False)
    print(json.dumps({"equal": torch.equal(out, ref), "traced": counters["stats"]["unique_graphs"],
                      "graphs": len(model.forward.compilations), "tuple": isinstance(as_tuple, tuple),
                      "counts": dict(model.forward.counts),
                      "kept_loads": sum(cm.kept_loads for cm in model.forward.compilations)}))
''')


def _run(tmp_path, *argv) -> dict:
    import json

    path = os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "DLBLAS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": path}
    script = tmp_path / "generate.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), *argv], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _files(tmp_path) -> list:
    return sorted((tmp_path / "cache" / "traces").glob("*/*.bin"))


def _compiles(tmp_path) -> list:
    return sorted((tmp_path / "cache" / "traces").glob("*/compiled/*.pkl"))


def test_a_second_process_loads_the_traces_and_traces_nothing(tmp_path):
    """The static cache's prefill and decode step are traced and saved once, and so is our compile of each graph; a
    new process loads both, dynamo traces nothing, nothing is imported or run through the passes again, and the
    tokens equal eager's in both (a left-padded batch of 2)."""
    first = _run(tmp_path, "llama", "static", "padded")
    assert first["equal"] and first["tuple"] and first["kept_loads"] == 0
    assert len(_files(tmp_path)) == 3  # prefill, decode step, the return_dict=False call
    kept = _compiles(tmp_path)
    assert len(kept) == 3
    second = _run(tmp_path, "llama", "static", "padded")
    assert second["equal"] and second["tuple"]
    assert second["traced"] == 0 and second["counts"]["loaded"] == 3 and "traced" not in second["counts"], second
    assert second["kept_loads"] == 3
    assert len(_files(tmp_path)) == 3 and _compiles(tmp_path) == kept


def test_a_file_that_does_not_load_is_traced_again(tmp_path):
    first = _run(tmp_path, "qwen2", "static", "batch1")
    assert first["equal"]
    for path in _files(tmp_path):
        path.write_bytes(b"not a trace")
    second = _run(tmp_path, "qwen2", "static", "batch1")
    assert second["equal"] and second["traced"] >= 2
    assert second["kept_loads"] >= 2  # (the graphs traced again are the same bytes: their kept compiles serve them)


def test_a_kept_compile_that_does_not_load_is_compiled_again(tmp_path):
    first = _run(tmp_path, "qwen2", "static", "batch1")
    assert first["equal"] and _compiles(tmp_path)
    for path in _compiles(tmp_path):
        path.write_bytes(path.read_bytes()[:1000])
    second = _run(tmp_path, "qwen2", "static", "batch1")
    assert second["equal"] and second["traced"] == 0 and second["kept_loads"] == 0
    third = _run(tmp_path, "qwen2", "static", "batch1")  # (the second process kept its compiles again)
    assert third["equal"] and third["kept_loads"] == 3


def test_a_growing_length_is_traced_once_with_symbolic_sizes(tmp_path):
    """A dynamic cache's every decode step has a new length: as in plain dynamo, the trace after the second
    length makes the sizes symbolic (automatic dynamic), and that one trace serves every later length; saved, it
    serves the next process too, which then traces nothing."""
    first = _run(tmp_path, "mistral", "dynamic", "batch1")
    assert first["equal"]
    saved = _files(tmp_path)
    assert len(saved) == 4, saved  # prefill, decode at L, decode made symbolic at L + 1, the return_dict=False call
    second = _run(tmp_path, "mistral", "dynamic", "batch1")
    assert second["equal"]
    assert second["traced"] == 0 and "traced" not in second["counts"], second
    assert _files(tmp_path) == saved


def test_a_graph_break_compiles_without_saving(tmp_path, monkeypatch, fresh_dynamo):
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "cache"))

    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.a(x).relu()
            torch._dynamo.graph_break()
            return self.b(y)

    model = Broken().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        ref = model(x)
        model.forward = dc.compile(model.forward, backend="reference", keep_traces=True)
        with pytest.warns(UserWarning, match="could not be traced whole"):
            out = model(x)
        torch.testing.assert_close(out, ref)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(model(x + 1), model.forward.__wrapped__(x + 1))
    assert not _files(tmp_path)
    assert len(model.forward.compilations) == 2  # the two graphs plain dynamo made


def test_keep_traces_needs_a_module_s_forward(fresh_dynamo):
    """Only a forward compiled through dynamo has traces to keep: a function that is not a module's bound method,
    a module compiled whole and torch.compile's backend say so."""
    with pytest.raises(ValueError, match="bound method such as model.forward"):
        dc.compile(lambda x: x + 1, keep_traces=True)
    with pytest.raises(ValueError, match="bound method such as model.forward"):
        dc.compile(torch.nn.Linear(2, 2), keep_traces=True)
    with pytest.raises(Exception, match="keep_traces is an option of dc.compile"):  # (dynamo wraps the ValueError)
        torch.compile(torch.nn.Linear(2, 2), backend="dlblas", options={"keep_traces": True})(torch.randn(1, 2))


def test_each_call_checks_the_guards_once(tmp_path, monkeypatch, fresh_dynamo):
    """A call served by a kept trace runs dynamo's guards once (the dispatch's check; the loaded function's own
    check is off): twice cost a 32-layer decode step ~0.35 ms on an H200 (BENCHMARKS.md, twenty-sixth session)."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    from .test_generate import causal_lm

    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "cache"))
    model = causal_lm("llama")
    ids = torch.randint(1, 128, (1, 7), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.forward = dc.compile(model.forward, backend="reference", keep_traces=True)
        assert torch.equal(model.generate(ids, **kw), ref)
        checks = []
        check = AOTCompiledFunction.guard_check
        monkeypatch.setattr(AOTCompiledFunction, "guard_check", lambda self, *a, **k: checks.append(1) or check(self, *a, **k))
        calls = model.forward.counts["kept"]
        assert torch.equal(model.generate(ids, **kw), ref)
    calls = model.forward.counts["kept"] - calls
    assert calls == 4  # the prefill and three decode steps, each served by a kept trace
    # each call: the last used trace first; the prefill after the decode steps (and the decode step after a
    # prefill) fails one check before its own
    assert len(checks) == calls + 2, (len(checks), calls)


def test_a_trace_made_from_other_source_code_is_not_loaded():
    """torch checks only the versions when loading a trace; the modules whose code it inlined are compared with
    their source now, so that an edited modeling file traces again instead of running its old bytecode."""
    import inspect
    import json
    import types

    from torch._dynamo.package import InlinedSource

    from dlblas_compiler.frontend import traces

    def source(module: str, content: str) -> InlinedSource:
        return InlinedSource(module=module, firstlineno=1, lastlineno=2, checksum="", content=content)

    kept = [source("json", inspect.getsource(json)), source("os", "an older os.py"), source("no.such.module", "")]
    compiled = types.SimpleNamespace(source_info=lambda: types.SimpleNamespace(inlined_sources=set(kept)))
    assert traces.changed_sources(compiled) == ["no.such.module", "os"]


def test_a_kept_compile_refers_to_inputs_and_holds_only_small_constants():
    """What `dump_compiled` writes: the call's input tensors and the graph module's own as references, bound to the
    loading call's tensors (never a stale copy); a view of an input, a fake tensor or too many bytes of constants
    are refused (the compile is then not kept)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dlblas_compiler.frontend import traces

    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    x, const = torch.randn(2, 4), torch.arange(3)
    ops = [torch.ops.aten.add, torch.ops.aten.add.Tensor, torch.ops.aten.relu.default]  # (saved by name)
    data = traces.dump_compiled({"x": x, "w": gm.weight, "m": gm, "c": const, "ops": ops}, gm, [x])
    y = torch.randn(2, 4)
    back = traces.load_compiled(data, gm, [y])
    assert back["x"] is y and back["w"] is gm.weight and back["m"] is gm and back["ops"] == ops
    assert torch.equal(back["c"], const) and back["c"] is not const
    for bad, why in [(x[0], "view of an input"), (FakeTensorMode().from_tensor(x), "fake tensor"),
                     (torch.zeros(traces.MAX_BYTES // 4 + 1), "MiB of constants")]:  # fmt: skip
        with pytest.raises(TypeError, match=why):
            traces.dump_compiled([bad], gm, [x])


def test_a_kept_compile_holds_a_long_ir_module_without_deep_recursion():
    """An IR module is saved as flat records: pickling its ops recursed along their chains (a 32-layer model's
    ~1,800 ops overflowed Python 3.12's fixed C stack on the GPU machine); a chain of 3,000 ops round-trips under a
    recursion limit of 400, the same module (one object) wherever it is referred to."""
    import sys

    from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i32
    from xdsl.dialects.test import TestOp
    from xdsl.ir import Block, Region

    from dlblas_compiler.frontend import traces

    block = Block(arg_types=[i32])
    value = block.args[0]
    for i in range(3000):
        op = TestOp.create(operands=[value], result_types=[i32], attributes={"i": IntegerAttr(i, 64)})
        op.results[0].name_hint = f"v{i}"
        block.add_op(op)
        value = op.results[0]
    module = ModuleOp(Region(block))
    gm = torch.fx.symbolic_trace(torch.nn.Identity())
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        back = traces.load_compiled(traces.dump_compiled([module, {"again": module}], gm, []), gm, [])
    finally:
        sys.setrecursionlimit(limit)
    assert back[0] is back[1]["again"] and str(back[0]) == str(module)
    back[0].verify()


class Activated(torch.nn.Module):
    scale = 1.0  # (read through the class)

    def __init__(self, act):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.act = act

    def forward(self, x):
        return self.act(self.lin(x)) * self.scale


def test_what_the_saved_guards_cannot_check_keys_the_store(tmp_path, monkeypatch, fresh_dynamo):
    """A function the module holds (`self.act`), and a number its class holds, are guarded by identity, which a
    saved file cannot hold: they are part of the store's key. Before, a model holding F.relu loaded the trace saved
    for one holding F.gelu (a silent wrong answer, in a later process or in the same one)."""
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.randn(3, 8)
    for act, scale in ((F.gelu, 1.0), (F.relu, 1.0), (F.relu, 3.0)):
        monkeypatch.setattr(Activated, "scale", scale)
        torch.manual_seed(0)
        model = Activated(act).eval()
        with torch.no_grad():
            ref = model(x)
            model.forward = dc.compile(model.forward, backend="reference", keep_traces=True)
            torch.testing.assert_close(model(x), ref)
        torch._dynamo.reset()
    assert len({p.parent for p in _files(tmp_path)}) == 3
