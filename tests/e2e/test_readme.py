"""Every ```python block of README.md runs (in order, in a fresh interpreter), so the examples cannot rot."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
BLOCKS = re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, "README.md")).read(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["DLBLAS_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", BLOCKS[index]], capture_output=True, text=True, env=env, timeout=600,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, f"README example {index} failed:\n{BLOCKS[index]}\n{proc.stderr[-3000:]}"
