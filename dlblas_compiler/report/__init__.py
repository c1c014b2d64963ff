"""`cm.report()`: what the compiler did to a module, as typed records.

A `Report` holds the ops by mapping kind, the fused regions (`RegionRecord`), the implementation of each
(`runtime.steps.KernelChoice`: kernel and config, callable or reference and why, tuned times, check errors),
the ops left to PyTorch with their source lines, and the notes (capture, fusion, CUDA graph, tuning skipped).
`str(report)` is the text, `report.to_dict()` / `to_json()` the data, `report.write_html(path)` the page with
the graph drawn (`report.html`). Nothing is parsed back from the text.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import func

from ..dialects import VIEW_OPS, ConstantOp, FusedOp, ParamOp, TorchCallOp
from ..dialects.traits import kind_of
from ..fusion.planner import fusion_notes
from ..runtime.steps import KernelChoice
from .html import Graph, _bytes, page, traffic_saved


@dataclass
class RegionRecord:
    """One `dl.fused` region: what made it, its kernel's name, its ops and their mapping kinds."""

    pattern: str
    kernel: str | None
    template: str
    ops: list[str]
    kinds: list[str]
    saved_bytes: int = 0  # intermediate traffic eager would move that the region keeps on chip

    def to_dict(self) -> dict:
        return dict(vars(self))


@dataclass
class Report:
    title: str
    backend: str
    compile_seconds: float
    kinds: Counter = field(default_factory=Counter)  # ops by mapping kind (inside regions too)
    ops: Counter = field(default_factory=Counter)  # top-level ops by name
    regions: list[RegionRecord] = field(default_factory=list)
    kernels: list[KernelChoice] = field(default_factory=list)  # what runs each region
    fallbacks: list[str] = field(default_factory=list)  # ops run by PyTorch (dl.torch_call), with source lines
    notes: list[str] = field(default_factory=list)
    graph: Graph = field(default_factory=Graph)

    @classmethod
    def build(cls, spec: Any, backend: str, tune: str = "none") -> Report:
        """The report of one specialization (`api.Specialization`) compiled with that backend and tune mode."""
        fn = next(o for o in spec.pipeline.module.walk() if isinstance(o, func.FuncOp))
        rep = cls(type(spec.captured.gm).__name__, backend, spec.compile_seconds, notes=list(spec.notes))
        if tune != "none" and backend != "triton":
            rep.notes.append(f"tune={tune!r} was skipped: tuning times kernels on a CUDA GPU and runs only on the "
                             f"triton backend, not {backend!r}")  # fmt: skip
        sources = spec.imported.sources
        for op in fn.body.block.ops:
            if isinstance(op, (func.ReturnOp, ParamOp)):
                continue
            rep.ops[op.name] += 1
            if isinstance(op, FusedOp):
                inner = [o for o in op.body_ops if not isinstance(o, ParamOp)]
                kinds = sorted({k.value for o in inner if (k := kind_of(o))})
                rep.regions.append(RegionRecord(op.pattern.data, op.kernel.data if op.kernel else None, op.template_name,
                                                [o.name for o in inner], kinds, traffic_saved(op)))  # fmt: skip
                rep.kinds.update(k.value for o in inner if (k := kind_of(o)) is not None)
            elif (k := kind_of(op)) is not None:
                rep.kinds[k.value] += 1
            if isinstance(op, TorchCallOp):
                name = op.node.data
                where = sources.get(name)
                rep.fallbacks.append(f"{op.callee.data} (node {name}{', ' + where if where else ''})")
        rep.kernels = spec.executor.kernel_choices()
        rep.graph = Graph.of(fn)
        rep.notes.extend(fusion_notes(fn))
        if spec.executor.graph_note:
            rep.notes.append(spec.executor.graph_note)
        for c in rep.kernels:
            if c.check_calls:
                verdict = "ok" if c.check_error <= c.check_tolerance else "EXCEEDS"
                rep.notes.append(f"check {c.region} ({c.impl}): worst relative error {c.check_error:.3g} over "
                                 f"{c.check_calls} calls, tolerance {c.check_tolerance:g}: {verdict}")  # fmt: skip
        return rep

    # -- views -------------------------------------------------------------------------------------------------
    @property
    def patterns(self) -> list[str]:
        """The pattern of each region, in program order."""
        return [r.pattern for r in self.regions]

    def impls(self) -> dict[str, str]:
        """Region (kernel) name -> how it runs: "kernel", "callable" or "reference"."""
        return {c.region: c.impl for c in self.kernels}

    def outside(self) -> list[str]:
        """Top-level compute ops left outside every region (views, parameters and constants aside)."""
        skip = {op.name for op in (*VIEW_OPS, FusedOp, ConstantOp, ParamOp)}
        return [name for name, n in self.ops.items() for _ in range(n) if name not in skip]

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "backend": self.backend,
            "compile_seconds": self.compile_seconds,
            "kinds": dict(self.kinds),
            "ops": dict(self.ops),
            "regions": [r.to_dict() for r in self.regions],
            "kernels": [c.to_dict() for c in self.kernels],
            "fallbacks": list(self.fallbacks),
            "notes": list(self.notes),
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def __str__(self) -> str:
        lines = [f"dlblas_compiler report: {self.title} (backend {self.backend}, compiled in {self.compile_seconds:.2f} s)"]
        lines.append("ops by mapping kind: " + (", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items())) or "none"))
        lines.append("top-level ops: " + ", ".join(f"{k} x{n}" for k, n in self.ops.most_common()))
        lines.append(f"fused regions: {len(self.regions)}")
        for i, r in enumerate(self.regions):
            saved = f"; intermediate traffic removed ≈ {_bytes(r.saved_bytes)}" if r.saved_bytes else ""
            lines.append(f"  [{i}] {r.pattern}: {' '.join(r.ops)} ({', '.join(r.kinds)}){saved}")
        if self.kernels:
            lines.append(f"kernels: {len(self.kernels)}")
            for k in self.kernels:
                timing = ""
                if k.time:
                    timing = f", tuned {k.time * 1e6:.1f} µs"
                    if k.default_time:
                        timing += f" (default config {k.default_time * 1e6:.1f} µs)"
                reason = f" ({k.reason})" if k.reason else ""
                lines.append(f"  {k.region} [{k.impl}{reason}]: {k.config or ''}{timing}")
        lines.append(f"torch fallbacks: {len(self.fallbacks)}")
        lines.extend(f"  {f}" for f in self.fallbacks)
        if self.notes:
            lines.append("notes:")
            lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)

    def __contains__(self, text: str) -> bool:
        """`"..." in report` searches the text."""
        return text in str(self)

    def write_html(self, path: str) -> None:
        """The page: the graph drawn as an SVG (regions as labelled clusters) above the text."""
        with open(path, "w") as f:
            f.write(page(self, str(self)))


__all__ = ["Report", "RegionRecord", "KernelChoice"]
