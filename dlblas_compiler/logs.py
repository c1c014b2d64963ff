"""The `dlblas_compiler` loggers and the `DLBLAS_LOGS` switch (in the spirit of torch's `TORCH_LOGS`).

Every stage logs through a child of the `dlblas_compiler` logger:

    dlblas_compiler.compile   each specialization compiled (model, input signature, seconds), the debug folder
    dlblas_compiler.fusion    regions fused by pattern (DEBUG: the planner's notes)
    dlblas_compiler.codegen   kernels generated (DEBUG: regions that got none, and why)
    dlblas_compiler.tuning    each kernel tuned: config, time, trials, from the cache or searched
    dlblas_compiler.runtime   what runs each region after the first call, fallbacks, CUDA graph keep/drop

They are ordinary `logging` loggers: `logging.basicConfig(level=logging.INFO)` shows them all. The switch turns
some on with a handler to stderr, without touching the rest of the program's logging:

    DLBLAS_LOGS=fusion,tuning python run.py      INFO of those stages
    DLBLAS_LOGS=all,+codegen python run.py       INFO of every stage, DEBUG of codegen
    dc.set_logs("+tuning")                        the same from Python ("" turns them off again)

Read once when the package is imported. Fallbacks are also logged (WARNING) beside their `warnings.warn`.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

ROOT = "dlblas_compiler"
STAGES = ("compile", "fusion", "codegen", "tuning", "runtime")
ENV = "DLBLAS_LOGS"

logging.getLogger(ROOT).addHandler(logging.NullHandler())  # (a library's loggers print nothing unless asked)

_handler: logging.Handler | None = None
_enabled: list[logging.Logger] = []


def get_logger(stage: str) -> logging.Logger:
    """The logger of a stage: `dlblas_compiler.<stage>`."""
    return logging.getLogger(f"{ROOT}.{stage}")


def parse(spec: str) -> dict[str, int]:
    """`"fusion,+tuning"` -> {"dlblas_compiler.fusion": INFO, "dlblas_compiler.tuning": DEBUG}; `all` is every
    stage (the `dlblas_compiler` logger itself). Unknown names are warned about and skipped."""
    levels: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        level = logging.DEBUG if item.startswith("+") else logging.INFO
        name = item.lstrip("+")
        if name == "all":
            levels[ROOT] = level
        elif name in STAGES:
            levels[f"{ROOT}.{name}"] = level
        else:
            warnings.warn(f"{ENV}: unknown log name {name!r}; known: all, {', '.join(STAGES)}", stacklevel=3)
    return levels


def set_logs(spec: str | None = None) -> None:
    """Turn the named stages' loggers on (see the module docstring), with one handler to stderr on the
    `dlblas_compiler` logger; `""` or None turns what an earlier call enabled off again."""
    global _handler
    root = logging.getLogger(ROOT)
    for logger in _enabled:
        logger.setLevel(logging.NOTSET)
    _enabled.clear()
    if _handler is not None:
        root.removeHandler(_handler)
        root.propagate = True
        _handler = None
    levels = parse(spec or "")
    if not levels:
        return
    for name, level in levels.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        _enabled.append(logger)
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
    root.addHandler(_handler)
    root.propagate = False  # (printed once, by this handler, even where the program configured logging too)


def configure_from_env() -> None:
    """Apply `DLBLAS_LOGS` if it is set."""
    spec = os.environ.get(ENV)
    if spec:
        set_logs(spec)
