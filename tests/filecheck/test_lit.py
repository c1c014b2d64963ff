"""Runs the lit/filecheck IR tests under tests/filecheck (dl-opt in xdsl-opt style)."""

import os
import subprocess
import sys


def test_lit_filecheck_suite():
    here = os.path.dirname(__file__)
    proc = subprocess.run(
        [sys.executable, "-c", "from lit.main import main; main()", "-v", here], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "Failed" not in proc.stdout.split("Testing Time")[-1]
