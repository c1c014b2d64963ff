"""Logging (`dlblas_compiler.*` loggers, the DLBLAS_LOGS switch), the debug folder per compile (`dump_ir`,
DLBLAS_DEBUG_DIR) and the reports of torch.compile's graphs (`dc.compilations()`, `dc.reports()`)."""

import ast
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import dlblas_compiler as dc
from dlblas_compiler import P, dynamo, logs
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.tuning import SearchSpace, TuneCache, TuneJob, tune

from .test_dynamo import Mlp  # (RMSNorm -> up -> SiLU, an optional graph break, down + residual)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def block():
    cfg = BlockConfig()
    return randomize_(LlamaBlock(cfg)).eval(), cfg


def _messages(caplog, name: str, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == level]


# -- logging ----------------------------------------------------------------------------------------------------
def test_each_stage_logs_what_it_did(block, caplog):
    model, cfg = block
    caplog.set_level(logging.DEBUG, logger="dlblas_compiler")
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        cm(*llama_block_inputs(cfg, 1, 8))
    (compiled,) = _messages(caplog, "dlblas_compiler.compile")
    assert compiled.startswith("LlamaBlock: compiled specialization 0 (f32[1,8,64], f32[8,16], f32[8,16]) in ")
    (fused,) = _messages(caplog, "dlblas_compiler.fusion")
    assert fused == "LlamaBlock: 5 regions fused (gemm ×4, attention); 0 ops left to PyTorch"
    assert _messages(caplog, "dlblas_compiler.fusion", logging.DEBUG) == [
        "LlamaBlock: split add_rms_norm %add: the add joins the GEMM epilogue, the norm the next prologue"
    ]
    assert _messages(caplog, "dlblas_compiler.codegen") == [
        "LlamaBlock: 5 kernels generated (gemm_0, attention_4, gemm_1, gemm_2, gemm_3), 0 regions without one"
    ]
    assert _messages(caplog, "dlblas_compiler.runtime") == ["what runs the regions: kernel 5"]
    each = _messages(caplog, "dlblas_compiler.runtime", logging.DEBUG)
    assert len(each) == 5 and each[0].startswith("region gemm_0 runs its kernel with {'BLOCK_M': 16")
    caplog.clear()
    with torch.no_grad():
        cm(*llama_block_inputs(cfg, 1, 8))  # the same signature: nothing compiled, nothing logged
    assert not caplog.records


def test_a_fallback_is_logged_beside_its_warning(caplog):
    def square_tanh(x):
        return P.tanh(P.mul(x, x))

    def broken(x):
        raise RuntimeError("no luck")

    class M(nn.Module):
        def forward(self, x):
            return torch.tanh(x * x) + 1

    caplog.set_level(logging.INFO, logger="dlblas_compiler")
    dc.register_fusion_pattern("test_log_square_tanh", square_tanh, broken, priority=300)
    try:
        cm = dc.compile(M(), backend="interpret")
        with torch.no_grad(), pytest.warns(UserWarning, match="pattern's callable failed"):
            cm(torch.randn(4, 16))
    finally:
        dc.unregister_fusion_pattern("test_log_square_tanh")
    (warned,) = _messages(caplog, "dlblas_compiler.runtime", logging.WARNING)
    assert "fell back to its reference" in warned and "RuntimeError: no luck" in warned
    (summary,) = _messages(caplog, "dlblas_compiler.runtime")
    assert summary.startswith("what runs the regions: ") and "reference 1" in summary


def test_each_kernel_tuned_is_logged_with_its_config_time_and_source(tmp_path, caplog):
    x = torch.randn(64, 64)
    space = SearchSpace({"BLOCK": [16, 32], "num_warps": [1, 2]})
    job = TuneJob("relu_test", "h", space, lambda cfg: (lambda: torch.relu(x)), {"M": 64}, (torch.float32,), "cpu",
                  torch.relu(x))  # fmt: skip
    cache = TuneCache(tmp_path / "tune.sqlite")
    caplog.set_level(logging.INFO, logger="dlblas_compiler.tuning")
    searched = tune(job, "full", cache=cache, progress=False, warmup_ms=1, rep_ms=2)
    hit = tune(job, "full", cache=cache, progress=False, warmup_ms=1, rep_ms=2)
    first, second = _messages(caplog, "dlblas_compiler.tuning")
    assert first.startswith(f"relu_test {{'M': 64}}: {searched.config}, ") and "(searched 4 configs; default" in first
    assert second.startswith(f"relu_test {{'M': 64}}: {hit.config}, ") and second.endswith("(from the cache)")


def test_set_logs_parses_names_and_levels():
    levels = logs.parse("fusion, +tuning")
    assert levels == {"dlblas_compiler.fusion": logging.INFO, "dlblas_compiler.tuning": logging.DEBUG}
    assert logs.parse("all") == {"dlblas_compiler": logging.INFO}
    with pytest.warns(UserWarning, match="unknown log name 'fusoin'"):
        assert logs.parse("fusoin,codegen") == {"dlblas_compiler.codegen": logging.INFO}
    try:
        dc.set_logs("+codegen")
        assert logging.getLogger("dlblas_compiler.codegen").level == logging.DEBUG
        assert not logging.getLogger("dlblas_compiler").propagate
    finally:
        dc.set_logs("")
    assert logging.getLogger("dlblas_compiler.codegen").level == logging.NOTSET
    assert logging.getLogger("dlblas_compiler").propagate


SCRIPT = """
import torch
import dlblas_compiler as dc
from dlblas_compiler.models import RMSNorm
m = torch.nn.Sequential(RMSNorm(32, 1e-6), torch.nn.Linear(32, 64, bias=False)).eval()
with torch.no_grad():
    dc.compile(m, backend="interpret")(torch.randn(3, 32))
"""


def test_the_environment_switch_prints_the_named_stages_to_stderr(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DLBLAS_LOGS="fusion,+runtime", DLBLAS_CACHE_DIR=str(tmp_path))
    env.pop("DLBLAS_DEBUG_DIR", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "[dlblas_compiler.fusion] INFO: Sequential: 1 region fused (gemm); 0 ops left to PyTorch" in lines
    assert "[dlblas_compiler.runtime] INFO: what runs the regions: kernel 1" in lines
    assert any(ln.startswith("[dlblas_compiler.runtime] DEBUG: region gemm_0 runs its kernel with") for ln in lines)
    assert not any("dlblas_compiler.compile" in ln or "dlblas_compiler.codegen" in ln for ln in lines)
    assert proc.stdout == ""


def test_no_print_calls_for_diagnostics_in_the_library():
    """Diagnostics go through logging (or warnings): `print(` only in the command line and where text is rendered
    into a given stream (`file=`)."""
    found = []
    for path in (ROOT / "dlblas_compiler").rglob("*.py"):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                if not any(k.arg == "file" for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


# -- the debug folder -------------------------------------------------------------------------------------------
def test_every_module_and_specialization_gets_its_own_debug_folder(block, tmp_path):
    model, cfg = block
    cm = dc.compile(model, backend="interpret", dump_ir=str(tmp_path))
    with torch.no_grad():
        cm(*llama_block_inputs(cfg, 1, 8))
        cm(*llama_block_inputs(cfg, 1, 5))
        cm(*llama_block_inputs(cfg, 1, 8))  # compiled already: nothing new
    assert os.listdir(tmp_path) == ["0-LlamaBlock"]
    specs = sorted(os.listdir(tmp_path / "0-LlamaBlock"))
    assert specs == ["0-f32_1x8x64-f32_8x16-f32_8x16", "1-f32_1x5x64-f32_5x16-f32_5x16"]
    for spec in specs:
        folder = tmp_path / "0-LlamaBlock" / spec
        files = sorted(os.listdir(folder))
        assert files == ["ir", "kernels", "report.html", "report.json", "report.txt", "tuning.json"]
        ir = sorted(os.listdir(folder / "ir"))
        assert ir[0] == "00-input.mlir" and ir[-1].endswith("-after-fuse.mlir") and len(ir) == 9
        assert 'dl.fused "attention"' in (folder / "ir" / ir[-1]).read_text()
        kernels = sorted(os.listdir(folder / "kernels"))
        assert kernels == ["attention_4.py", "gemm_0.py", "gemm_1.py", "gemm_2.py", "gemm_3.py"]
        assert all("@triton.jit" in (folder / "kernels" / k).read_text() for k in kernels)
        tuning = json.loads((folder / "tuning.json").read_text())
        assert [t["name"] for t in tuning] == ["gemm_0", "attention_4", "gemm_1", "gemm_2", "gemm_3"]
        assert all(t["impl"] == "kernel" and t["config"]["num_warps"] and t["from_cache"] is False for t in tuning)
        report = json.loads((folder / "report.json").read_text())
        assert report["title"] == "LlamaBlock" and report["counts"]["kernels"] == 5
        assert "gemm_0 [kernel]" in (folder / "report.txt").read_text()
        assert "<svg" in (folder / "report.html").read_text()
    assert "1x5x64" in (tmp_path / "0-LlamaBlock" / specs[1] / "ir" / "00-input.mlir").read_text()
    # a second compile into the same folder takes the next index, overwriting nothing
    again = dc.compile(model, backend="reference", dump_ir=str(tmp_path))
    with torch.no_grad():
        again(*llama_block_inputs(cfg, 1, 8))
    assert sorted(os.listdir(tmp_path)) == ["0-LlamaBlock", "1-LlamaBlock"]
    assert "kernels" not in os.listdir(tmp_path / "1-LlamaBlock" / specs[0])  # the reference backend lowers nothing


def test_the_environment_gives_every_compile_a_debug_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("DLBLAS_DEBUG_DIR", str(tmp_path / "dbg"))
    cm = dc.compile(Mlp().eval(), backend="reference")
    assert cm.options.dump_ir == str(tmp_path / "dbg")
    with torch.no_grad():
        cm(torch.randn(1, 3, 32))
    (spec,) = os.listdir(tmp_path / "dbg" / "0-Mlp")
    assert spec == "0-f32_1x3x32" and "report.json" in os.listdir(tmp_path / "dbg" / "0-Mlp" / spec)
    monkeypatch.delenv("DLBLAS_DEBUG_DIR")
    assert dc.Options().dump_ir is None


@pytest.mark.usefixtures("fresh_dynamo")
def test_dynamo_graphs_get_folders_named_for_the_traced_class_and_reports(tmp_path):
    model = randomize_(Mlp(graph_break="print")).eval()
    fast = torch.compile(model, backend="dlblas", options={"backend": "interpret", "dump_ir": str(tmp_path)})
    with torch.no_grad():
        fast(torch.randn(1, 5, 32).abs())
    assert dc.compilations() is dynamo.COMPILATIONS and len(dc.compilations()) == 2  # the graph break: two graphs
    assert [cm.name for cm in dc.compilations()] == ["Mlp", "Mlp"]
    assert sorted(os.listdir(tmp_path)) == ["0-Mlp", "1-Mlp"]
    assert os.listdir(tmp_path / "0-Mlp") == ["0-f32_1x5x32"]  # (the parameters dynamo passes are left out)
    assert os.listdir(tmp_path / "1-Mlp") == ["0-f32_1x5x64-f32_1x5x32"]
    reports = dc.reports()
    assert [r.title for r in reports] == ["Mlp", "Mlp"]
    assert [r.patterns for r in reports] == [["gemm"], ["gemm"]]
    assert str(reports[0]).startswith("dlblas_compiler report: Mlp (backend interpret")
    assert "rms_norm linear silu" in str(reports[0]) and "linear add" in str(reports[1])


@pytest.mark.usefixtures("fresh_dynamo")
def test_dc_compile_of_a_function_lists_its_graphs_and_reports(block):
    model, cfg = block
    fn = dc.compile(model.forward, backend="reference")
    with torch.no_grad():
        fn(*llama_block_inputs(cfg, 1, 4))
    (cm,) = fn.compilations
    assert cm.name == "LlamaBlock" and fn.report().title == "LlamaBlock"
    assert fn.report().patterns == ["gemm", "attention", "gemm", "gemm", "gemm"]
