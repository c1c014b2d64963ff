"""Passes by name, xdsl-opt style: `register_pass` adds one; `parse_pipeline("a,b{opt=1}")` builds a list."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from xdsl.passes import ModulePass, PassPipeline
from xdsl.transforms.canonicalize import CanonicalizePass
from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination
from xdsl.transforms.dead_code_elimination import DeadCodeElimination
from xdsl.utils.arg_spec import parse_pipeline as parse_pipeline_spec

PassFactory = Callable[[], type[ModulePass]]

PASSES: dict[str, PassFactory] = {
    "cse": lambda: CommonSubexpressionElimination,
    "dce": lambda: DeadCodeElimination,
    "canonicalize": lambda: CanonicalizePass,
}


def register_pass(cls: type[ModulePass]) -> type[ModulePass]:
    """Class decorator: make a ModulePass available by its `name` in pipelines and the CLI."""
    PASSES[cls.name] = lambda: cls
    return cls


def pass_options(cls: type[ModulePass]) -> list[str]:
    """The options a pass takes in a pipeline (`name{option=value}`): its dataclass fields."""
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"]


def check_pipeline(spec: str, available: Mapping[str, PassFactory] | None = None) -> None:
    """Raise ValueError, in one line, for an unknown pass or pass option in `spec` (xdsl-opt's syntax; a syntax
    error raises xDSL's ArgSpecParseError). `available`: the passes that may run (default: the compiler's)."""
    available = PASSES if available is None else available
    specs = list(parse_pipeline_spec(spec))
    unknown = [s.name for s in specs if s.name not in available]
    if unknown:
        more = "" if available is PASSES else ", and xDSL's (see --help)"
        raise ValueError(f"unknown pass {', '.join(map(repr, unknown))}; known passes: {', '.join(PASSES)}{more}")
    for s in specs:
        options = pass_options(available[s.name]())
        extra = [o for o in s.normalize_parameter_names().parameters if o not in options]
        if extra:
            raise ValueError(f"pass {s.name!r} has no option {', '.join(map(repr, extra))}; "
                             f"its options: {', '.join(options) or 'none'}")  # fmt: skip


def parse_pipeline(spec: str) -> tuple[ModulePass, ...]:
    """`"classify,algebraic{fold_norm_weight=true}"` → pass instances. An unknown pass or option raises ValueError
    naming it and what exists."""
    check_pipeline(spec)
    return PassPipeline.parse_spec(PASSES, spec).passes
