"""Run a pass pipeline with the IR of every stage at hand (and optionally dumped), verified, and optionally checked
against eager outputs after every pass (naming the first pass that changed the result). The IR is verified after
the last pass (after every pass when stages are recorded or checked); invalid IR found there is traced back to the
pass that made it by running the passes again from the input, verifying after each."""

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
    """The final module, and the IR text of every stage. The texts are made when asked for (or written at once
    with `dump_dir`): the input's text is kept and the passes run again on it, recording each stage, since
    printing a 32-layer model's IR after each of ten passes costs seconds that most compiles never use."""

    module: ModuleOp
    passes: tuple = ()
    names: list[str] = field(default_factory=list)  # stage names: "input", "after:<pass>", ...
    input_module: ModuleOp | None = None  # a copy of the input, printed when asked (a clone costs ~1/3 of a print)
    _input_text: str | None = None
    _stages: list[tuple[str, str]] | None = None

    @property
    def input_text(self) -> str:
        if self._input_text is None:
            self._input_text = str(self.input_module) if self.input_module is not None else ""
        return self._input_text

    @property
    def stages(self) -> list[tuple[str, str]]:
        """(stage name, IR text) for every stage."""
        if self._stages is None:
            from xdsl.parser import Parser

            again = Parser(make_context(), self.input_text).parse_module()
            self._stages = run_pipeline(again, self.passes, keep_text=True)._stages
        return self._stages

    def ir(self, stage: str = "final") -> str:
        """IR text at a stage: "input", "after:<pass>", "before:<pass>", "final" (a repeated pass: "after:cse#2")."""
        names = self.names
        if stage == "final":
            return str(self.module)
        if stage == "input":
            return self.input_text
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
    keep_text: bool = False,
) -> PipelineResult:
    """Apply the passes in `spec` to `module` in place. `check(module)` returns None or a mismatch message.
    With `keep_text` (or `dump_dir`) every stage's text is recorded as the passes run."""
    passes = parse_pipeline(spec) if isinstance(spec, str) else tuple(spec)
    ctx = make_context()
    result = PipelineResult(module, passes, input_module=module.clone())
    if keep_text:
        result._stages = []
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
    seen: dict[str, int] = {}
    index = iter(range(10**6))

    def record(stage: str) -> None:
        result.names.append(stage)
        if not (keep_text or dump_dir):
            return
        text = result.input_text if stage == "input" else str(module)
        if keep_text:
            result._stages.append((stage, text))
        if dump_dir:
            fname = f"{next(index):02d}-{re.sub(r'[^A-Za-z0-9_.#-]', '-', stage)}.mlir"
            with open(os.path.join(dump_dir, fname), "w") as f:
                f.write(f"// stage: {stage}\n{text}\n")

    record("input")
    each = keep_text or bool(dump_dir) or check is not None  # (verifying a 32-layer model takes ~0.2 s a pass)
    for p in passes:
        seen[p.name] = seen.get(p.name, 0) + 1
        stage = f"after:{p.name}" + (f"#{seen[p.name]}" if seen[p.name] > 1 else "")
        try:
            p.apply(ctx, module)
            if each:
                module.verify()
        except VerifyException as e:
            raise CompileError(f"pass '{p.name}' produced invalid IR: {e}") from e
        record(stage)
        if check is not None:
            msg = check(module)
            if msg:
                raise CompileError(f"pass '{p.name}' changed the result: {msg}")
    if not each:
        try:
            module.verify()
        except VerifyException as e:
            from xdsl.parser import Parser

            run_pipeline(Parser(make_context(), result.input_text).parse_module(), passes, keep_text=True)
            raise CompileError(f"the pass pipeline produced invalid IR: {e}") from e  # (if the replay did not name it)
    return result
