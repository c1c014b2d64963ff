"""`torch.compile(model, backend="dlblas")`: each FX graph dynamo hands over goes through the same pipeline.

Registered by the `torch_dynamo_backends` entry point in pyproject, so no import is needed.

`mode=` takes torch.compile's modes and maps them onto `Options`:
    "default" (or no mode)          tune="none"
    "reduce-overhead"               cuda_graphs=True
    "max-autotune"                  tune="full", cuda_graphs=True
    "max-autotune-no-cudagraphs"    tune="full", cuda_graphs=False
Any other mode is a ValueError naming these. Unlike Inductor's, our default mode keeps `Options.cuda_graphs`
(True: a program is captured from its second call, where replaying measured faster), so "default" and
"reduce-overhead" differ only in what options set.

`options=` takes the fields of `Options` (see there), e.g.
`torch.compile(model, backend="dlblas", options={"backend": "interpret", "tune": "quick", "dump_ir": "dir/"})`.
torch.compile refuses `mode=` and `options=` together, so to combine them put the mode among the options:
`options={"mode": "max-autotune", "backend": "interpret"}`; the other keys override what the mode sets.
Tuning times kernels on the GPU: it runs on the triton backend only, and `cm.report()` notes when it was skipped.

What was compiled: `dc.compilations()` lists the CompiledModule of every graph handed to this backend (in order;
`cm.name` is the class dynamo traced, `cm.report()` its last-used specialization's report) and `dc.reports()`
their reports.

A graph is specialized on the concrete shapes of each call (dynamo's symbolic sizes arrive as plain ints), and on
the value of each float dynamo leaves unspecialized (`dynamic=True` passes a module's float attributes as 0-d
tensors read by `.item()`: `api.floats_as_scalars` passes the floats instead); with
shape families (`Options.shape_families`, on by default) only the first two lengths of a power-of-two bucket are
compiled and the others are instances of the first IR, and tuning results are keyed by the same buckets, so a
growing sequence neither recompiles nor retunes per length.
"""

from __future__ import annotations

from typing import Any

import torch

from .api import CompiledModule, DynamoBackend
from .options import Options
from .report import Report

# One CompiledModule per dynamo graph handed to the backend (graph breaks and dynamo's recompilations add
# more); each counts its own specializations (one per input signature it was called with).
COMPILATIONS: list[CompiledModule] = []



def compilations() -> list[CompiledModule]:
    """The CompiledModule of every graph torch.compile(..., backend="dlblas") handed over, in order (graph breaks
    and dynamo's recompilations add more; `torch._dynamo.reset()` does not clear them: `.clear()` the list)."""
    return COMPILATIONS


def reports() -> list[Report]:
    """The report of each of `compilations()` that has run (its last-used input signature)."""
    return [cm.report() for cm in COMPILATIONS if cm.compile_count]


# torch.compile's modes -> the Options fields each sets.
MODES: dict[str, dict[str, Any]] = {
    "default": {"tune": "none"},
    "reduce-overhead": {"cuda_graphs": True},
    "max-autotune": {"tune": "full", "cuda_graphs": True},
    "max-autotune-no-cudagraphs": {"tune": "full", "cuda_graphs": False},
}


def options_for(mode: str | None = None, options: dict[str, Any] | None = None, **kwargs: Any) -> Options:
    """The Options of a torch.compile call: the mode's fields (a "mode" key in `options` counts as the mode),
    then `options` and keyword arguments over them."""
    options = dict(options or {}, **kwargs)
    mode = options.pop("mode", mode) or "default"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))} (torch.compile's modes), got {mode!r}")
    return Options(**{**MODES[mode], **options})


def dlblas_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    **kwargs: Any,
):
    opts = options_for(mode, options, **kwargs)
    if opts.keep_traces:
        raise ValueError("keep_traces is an option of dc.compile(model.forward): torch.compile traces each call itself")
    backend = DynamoBackend(opts, COMPILATIONS)
    return backend(gm, example_inputs)
