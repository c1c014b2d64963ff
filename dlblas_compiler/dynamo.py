"""`torch.compile(model, backend="dlblas")`: each FX graph dynamo hands over goes through the same pipeline.

Registered by the `torch_dynamo_backends` entry point in pyproject, so no import is needed. Options pass
through `torch.compile(..., options={"backend": "interpret", "tune": "quick", "dump_ir": "dir/"})`.
A graph is specialized on the concrete shapes of each call (dynamo's symbolic sizes arrive as plain ints),
so a growing sequence compiles once per length; tuning results are keyed by power-of-two token buckets,
so it does not retune per length.
"""

from __future__ import annotations

from typing import Any

import torch

from .api import CompiledModule, DynamoBackend
from .options import Options

# One CompiledModule per dynamo graph handed to the backend (graph breaks and dynamo's recompilations add
# more); each counts its own specializations (one per input signature it was called with).
COMPILATIONS: list[CompiledModule] = []


def dlblas_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict | None = None, **kwargs):
    backend = DynamoBackend(Options(**dict(options or {}, **kwargs)), COMPILATIONS)
    return backend(gm, example_inputs)
