"""The command line: `dlblas-compiler` with its subcommands opt, demo and tune."""

import os
import re
import subprocess
import sys

import pytest
import torch

from dlblas_compiler import cli
from dlblas_compiler.passes import PASSES, parse_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
MLIR = """func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = dl.exp %x : tensor<4x8xf32>
  %1 = dl.exp %x : tensor<4x8xf32>
  %2 = dl.add %0, %1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %2 : tensor<4x8xf32>
}"""


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "dlblas_compiler.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_demo_runs_on_cpu_and_reports_error(tmp_path):
    p = _run("demo", "--backend", "reference", "--dump-ir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    m = re.search(r"relative error vs float64 eager: ([0-9.e+-]+)", p.stdout)
    assert m and float(m.group(1)) < 1e-5, p.stdout
    assert "ops by mapping kind" in p.stdout
    assert any(f.endswith(".mlir") for _, _, files in os.walk(tmp_path) for f in files)


def test_opt_runs_passes(tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(MLIR)
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


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    """`dlblas-compiler ARGV` in this process: (exit status, stdout, stderr)."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:  # argparse's --help and usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_help_at_every_level(capsys):
    rc, out, _ = _main(capsys, "--help")
    assert rc == 0
    for command in ("opt", "demo", "tune"):
        assert re.search(rf"^    {command} +\w", out, re.M), out  # each subcommand listed with what it does
    documented = set(re.findall(r"^(\w+)  ", cli.__doc__, re.M))
    assert documented == {"opt", "demo", "tune"}  # the module docstring names exactly the subcommands
    for command, expect in [("opt", "--print-between-passes"), ("demo", "--backend"), ("tune", "MODULE:FACTORY")]:
        rc, out, _ = _main(capsys, command, "--help")
        assert rc == 0 and f"usage: dlblas-compiler {command}" in out and expect in out, out
    rc, _, err = _main(capsys)
    assert rc == 2 and "usage: dlblas-compiler" in err


def test_opt_lists_the_compilers_passes_first():
    tool = cli.DLOptMain(args=[])
    names = list(tool.available_passes)
    assert names[: len(PASSES)] == list(PASSES) and len(names) > 2 * len(PASSES)  # then xDSL's


def test_opt_unknown_pass_or_option_is_one_line(tmp_path, capsys):
    src = tmp_path / "in.mlir"
    src.write_text(MLIR)
    rc, out, err = _main(capsys, "opt", str(src), "-p", "cse,fusee")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "unknown pass 'fusee'" in err and "classify, recognize, fuse" in err
    rc, _, err = _main(capsys, "opt", str(src), "-p", "fuse{profile=true}")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "pass 'fuse' has no option 'profile'" in err, err


def test_files_that_cannot_be_read_or_written_are_one_line(tmp_path, capsys):
    src = tmp_path / "in.mlir"
    src.write_text(MLIR)
    for argv in (("opt", str(tmp_path / "missing.mlir")), ("opt", str(src), "-o", str(tmp_path / "no" / "out.mlir"))):
        rc, out, err = _main(capsys, *argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "No such file or directory" in err, err
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        cli.main(["demo", "--backend", "reference", "--dump-ir", str(tmp_path / "file")])
    assert "names a file, not a folder" in capsys.readouterr().err


def test_opt_runs_the_documented_pass_option_example(tmp_path, capsys):
    """The pipeline example in `parse_pipeline`'s docstring works, in the API and on the command line."""
    (example,) = re.findall(r'`"([^"]+)"`', parse_pipeline.__doc__)
    assert "{" in example  # it shows a pass option
    passes = parse_pipeline(example)
    assert [p.name for p in passes] == ["classify", "algebraic"] and passes[1].fold_norm_weight is True
    src = tmp_path / "in.mlir"
    src.write_text(MLIR)
    rc, out, err = _main(capsys, "opt", str(src), "-p", example)
    assert rc == 0 and 'kind = "one-to-one"' in out, err


def test_opt_mlir_print_ir_after_all_is_print_between_passes(tmp_path, capsys):
    src = tmp_path / "in.mlir"
    src.write_text(MLIR)
    runs = [_main(capsys, "opt", str(src), "-p", "cse,classify", flag) for flag in
            ("--print-between-passes", "--mlir-print-ir-after-all")]  # fmt: skip
    assert runs[0] == runs[1] and runs[0][0] == 0 and "IR after cse:" in runs[0][1]


def test_tune_reports_an_import_error_before_looking_for_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    rc, _, err = _main(capsys, "tune", "no_such_module_here:make", "--tokens", "1")
    assert rc == 2 and "cannot import the factory 'no_such_module_here:make'" in err and "No module named" in err
    (tmp_path / "dl_cli_factories.py").write_text("def make(tokens, dtype, device):\n    raise AssertionError\n")
    rc, _, err = _main(capsys, "tune", "dl_cli_factories:nothing")
    assert rc == 2 and "has no 'nothing'" in err
    if not torch.cuda.is_available():  # found in the current directory, then the GPU is missing
        rc, _, err = _main(capsys, "tune", "dl_cli_factories:make")
        assert rc == 1 and "CUDA GPU" in err


@pytest.mark.parametrize("argv, message", [
    (["demo", "--tokens", "0"], "a sequence length is at least 1"),
    (["demo", "--backend", "triton"], "none is available"),
])  # fmt: skip
def test_demo_refuses_what_it_cannot_run_in_one_line(argv, message):
    if "triton" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is here: the triton backend runs")
    p = _run(*argv)
    assert p.returncode != 0 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
