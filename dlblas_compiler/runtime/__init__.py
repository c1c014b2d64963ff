"""Execution of lowered `dl` modules: the reference interpreter and the kernel Program."""

from __future__ import annotations

from collections.abc import Callable

from .reference import run_reference


def build_executor(module, imported, options) -> Callable[[list], tuple]:
    """The callable that runs one specialization: inputs (func args in order) → outputs."""
    if options.backend == "reference":
        params, calls = imported.params, imported.calls
        return lambda inputs: run_reference(module, inputs, params, calls)
    from .program import build_program

    return build_program(module, imported, options)


__all__ = ["build_executor", "run_reference"]
