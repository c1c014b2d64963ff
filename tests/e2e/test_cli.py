"""The command line: `dlblas-compiler demo` and `dlblas-compiler opt`."""

import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "dlblas_compiler.cli", *args], capture_output=True, text=True, env=env, timeout=600)


def test_demo_runs_on_cpu_and_reports_error(tmp_path):
    p = _run("demo", "--backend", "reference", "--dump-ir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    m = re.search(r"relative error vs float64 eager: ([0-9.e+-]+)", p.stdout)
    assert m and float(m.group(1)) < 1e-5, p.stdout
    assert "ops by mapping kind" in p.stdout
    assert any(f.endswith(".mlir") for f in os.listdir(tmp_path))


def test_opt_runs_passes(tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(
        """func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = dl.exp %x : tensor<4x8xf32>
  %1 = dl.exp %x : tensor<4x8xf32>
  %2 = dl.add %0, %1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %2 : tensor<4x8xf32>
}"""
    )
    p = _run("opt", str(src), "-p", "cse")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("dl.exp") == 1  # cse merged the two exps
    p = _run("opt", str(src), "-p", "cse,classify", "--print-between-passes")
    assert p.returncode == 0, p.stderr
    assert "IR after cse:" in p.stdout and 'kind = "one-to-one"' in p.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command tunes for real")
def test_tune_needs_a_gpu_and_says_so():
    p = _run("tune", "dlblas_compiler.models:BlockConfig", "--tokens", "1")
    assert p.returncode == 1 and "CUDA GPU" in p.stderr
