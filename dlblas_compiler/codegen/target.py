"""`dl-opt -t triton`: the Triton emitter as an xDSL target.

Prints, for every `dl.fused` region of the module (in program order), the generated kernel as the readable
Python file that `dump_ir` writes; a region that no template can lower (or that lowers to a user callable)
gets a comment saying so instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from ..dialects import FusedOp
from .lower import CallableLowering, LoweringError, lower_region


@dataclass(frozen=True)
class TritonTarget(Target):
    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        regions = [op for op in module.walk() if isinstance(op, FusedOp)]
        if not regions:
            print("# no dl.fused regions: run the `fuse` pass first (dl-opt -p fuse -t triton)", file=output)
        for i, fused in enumerate(regions):
            label = f"region {i}: {fused.pattern.data}" + (f" ({fused.kernel.data})" if fused.kernel else "")
            print(f"# ---- {label}", file=output)
            try:
                lowered = lower_region(fused)
            except LoweringError as e:
                print(f"# not lowered: {e}\n", file=output)
                continue
            if isinstance(lowered, CallableLowering):
                fn = getattr(lowered.fn, "__qualname__", repr(lowered.fn))
                print(f"# not a generated kernel: the pattern lowers to the Python callable {fn}\n", file=output)
                continue
            print(lowered.file_text(), file=output)
