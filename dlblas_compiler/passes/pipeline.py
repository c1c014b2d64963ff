"""Run a pass pipeline with the IR kept (and optionally dumped) at every stage, verified after every
pass, and optionally checked against eager outputs after every pass (naming the first pass that
changed the result)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from ..dialects import make_context
from ..errors import CompileError
from .registry import parse_pipeline


@dataclass
class PipelineResult:
    module: ModuleOp
    stages: list[tuple[str, str]] = field(default_factory=list)  # (stage name, IR text)

    def ir(self, stage: str = "final") -> str:
        """IR text at a stage: "input", "after:<pass>", "before:<pass>", "final" (a repeated pass: "after:cse#2")."""
        names = [s for s, _ in self.stages]
        if stage == "final":
            return self.stages[-1][1]
        if stage.startswith("before:"):
            i = names.index("after:" + stage[7:]) if "after:" + stage[7:] in names else -1
            if i > 0:
                return self.stages[i - 1][1]
        elif stage in names:
            return self.stages[names.index(stage)][1]
        raise KeyError(f"no IR stage {stage!r}; stages are: input, final, {', '.join(names[1:])} (and before:<pass>)")


def run_pipeline(
    module: ModuleOp,
    spec: str | tuple[ModulePass, ...],
    dump_dir: str | None = None,
    check: Callable[[ModuleOp], str | None] | None = None,
    keep_text: bool = True,
) -> PipelineResult:
    """Apply the passes in `spec` to `module` in place. `check(module)` returns None or a mismatch message."""
    passes = parse_pipeline(spec) if isinstance(spec, str) else spec
    ctx = make_context()
    result = PipelineResult(module)
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
    seen: dict[str, int] = {}
    index = iter(range(10**6))

    def record(stage: str) -> None:
        if not (keep_text or dump_dir):
            return
        text = str(module)
        if keep_text:
            result.stages.append((stage, text))
        if dump_dir:
            fname = f"{next(index):02d}-{re.sub(r'[^A-Za-z0-9_.#-]', '-', stage)}.mlir"
            with open(os.path.join(dump_dir, fname), "w") as f:
                f.write(f"// stage: {stage}\n{text}\n")

    record("input")
    for p in passes:
        seen[p.name] = seen.get(p.name, 0) + 1
        stage = f"after:{p.name}" + (f"#{seen[p.name]}" if seen[p.name] > 1 else "")
        try:
            p.apply(ctx, module)
            module.verify()
        except VerifyException as e:
            raise CompileError(f"pass '{p.name}' produced invalid IR: {e}") from e
        record(stage)
        if check is not None:
            msg = check(module)
            if msg:
                raise CompileError(f"pass '{p.name}' changed the result: {msg}")
    return result
