"""Passes by name, xdsl-opt style: `register_pass` adds one; `parse_pipeline("a,b{opt=1}")` builds a list."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass, PassPipeline
from xdsl.transforms.canonicalize import CanonicalizePass
from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination
from xdsl.transforms.dead_code_elimination import DeadCodeElimination

PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "cse": lambda: CommonSubexpressionElimination,
    "dce": lambda: DeadCodeElimination,
    "canonicalize": lambda: CanonicalizePass,
}


def register_pass(cls: type[ModulePass]) -> type[ModulePass]:
    """Class decorator: make a ModulePass available by its `name` in pipelines and the CLI."""
    PASSES[cls.name] = lambda: cls
    return cls


def parse_pipeline(spec: str) -> tuple[ModulePass, ...]:
    """`"classify,fuse{profile=true}"` → pass instances. Unknown names raise ValueError listing the known ones."""
    try:
        return PassPipeline.parse_spec(PASSES, spec).passes
    except ValueError as e:
        raise ValueError(f"{e}; known passes: {', '.join(sorted(PASSES))}") from None
