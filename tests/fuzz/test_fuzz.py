"""Differential fuzzing in CI: a fixed-seed sample of random graphs, every saved regression, and a check
that the harness itself catches (and shrinks) a wrong kernel. `scripts/fuzz.py` runs thousands on demand."""

import json
import random

import pytest

from dlblas_compiler.dialects import TanhOp

from .generator import (
    check,
    default_backends,
    first_failure,
    load_regressions,
    random_spec,
    save_regression,
    shrink,
    valid,
)

SAMPLE = 250


def _failures(spec: dict) -> list[str]:
    results = check(spec, default_backends())
    assert results is not None, "a regression must stay in range"
    return [f"{r.backend} {r.failure}: {r.message}" for r in results if r.failure]


@pytest.mark.parametrize("seed", range(SAMPLE))
def test_random_graph_matches_eager(seed):
    rng = random.Random(f"ci-{seed}")
    results = None
    while results is None:  # redraw the rare graph out of float64 range
        spec = random_spec(rng, max_ops=6)
        results = check(spec, default_backends())
    bad = [f"{r.backend} {r.failure}: {r.message}" for r in results if r.failure]
    assert not bad, f"{bad}\nspec: {json.dumps(spec)}"


@pytest.mark.parametrize("record", [pytest.param(r, id=name) for name, r in load_regressions()])
def test_saved_regression_passes(record):
    assert not _failures(record["spec"]), record["message"]


TANH_CHAIN = {
    "seed": 7,
    "dtype": "float32",
    "dims": {"d0": 5, "d1": 21, "d2": 9},
    "inputs": [{"shape": ["d0", "d1"], "kind": "randn"}],
    "ops": [
        {"op": "linear", "args": [0], "w": ["d2", "d1"], "bias": True, "module": True, "act": "none", "residual": None,
         "scale": 1.0},
        {"op": "unary", "args": [1], "fn": "tanh"},
        {"op": "softmax", "args": [2], "how": "torch"},
    ],
    "outputs": [3],
}


def test_harness_finds_shrinks_and_saves_a_wrong_kernel(monkeypatch, tmp_path):
    """A tanh kernel off by 1e-4 (relative) is a mismatch on the interpret backend only; the shrinker
    drops the linear and the softmax and shrinks the dims; the saved file rebuilds the same spec."""
    assert valid(TANH_CHAIN) and first_failure(TANH_CHAIN, ["reference", "interpret"]) is None
    monkeypatch.setattr(TanhOp, "triton", lambda self, x: f"((2.0 * tl.sigmoid(2.0 * {x}) - 1.0) * 1.0001)")
    bad = first_failure(TANH_CHAIN, ["reference", "interpret"])
    assert bad is not None and (bad.backend, bad.failure) == ("interpret", "mismatch"), bad
    small = shrink(TANH_CHAIN, bad, ["reference", "interpret"])
    assert [o["op"] for o in small["ops"]] == ["unary"]
    assert sum(small["dims"].values()) < sum(TANH_CHAIN["dims"].values())
    path = save_regression(small, bad, tmp_path)
    ((name, record),) = load_regressions(tmp_path)
    assert name == path.name and record["spec"] == small and record["failure"] == "mismatch"
