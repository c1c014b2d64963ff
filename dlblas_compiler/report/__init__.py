"""`cm.report()`: what the compiler did to a module, as typed records.

A `Report` holds the ops by mapping kind, the fused regions (`RegionRecord`), the implementation of each
(`runtime.steps.KernelChoice`: kernel and config, callable or reference and why, tuned times, check errors),
the ops left to PyTorch with their source lines (`Fallback`), the weight-preparation ops computed once, and the
notes (capture, fusion, CUDA graph, tuning skipped). `str(report)` is the concise text (one line per region),
`report.text(detail=True)` the detailed one (`report.text` renders both), `report.to_dict()` / `to_json()` the
data, `report.write_html(path)` the page with the graph drawn (`report.html`). Nothing is parsed back from the text.
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
from ..passes.match import is_constant
from ..runtime.steps import KernelChoice, ReferenceStep
from . import text as _text
from .html import Graph, page, traffic_saved


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
class Fallback:
    """An op PyTorch runs as an opaque call (`dl.torch_call`): its callable, FX node and source line."""

    callee: str  # the importable path, as the IR holds it
    node: str
    where: str = ""

    @property
    def name(self) -> str:
        """The callable as users spell it: `torch.addmm`, `operator.add`, `torch.Tensor.unsqueeze`."""
        return _text.readable(self.callee)

    def __str__(self) -> str:
        return f"{self.name} (node {self.node}{', ' + self.where if self.where else ''})"

    def to_dict(self) -> dict:
        return {"name": self.name, "callee": self.callee, "node": self.node, "where": self.where}


@dataclass
class Report:
    title: str  # the model's class (for a dynamo graph, the class whose code dynamo traced)
    backend: str
    compile_seconds: float
    kinds: Counter = field(default_factory=Counter)  # ops by mapping kind (inside regions too)
    ops: Counter = field(default_factory=Counter)  # top-level ops by name (those computed once included)
    regions: list[RegionRecord] = field(default_factory=list)
    kernels: list[KernelChoice] = field(default_factory=list)  # what runs each region
    fallbacks: list[Fallback] = field(default_factory=list)  # ops run by PyTorch (dl.torch_call), with source lines
    unfused: Counter = field(default_factory=Counter)  # dl ops outside regions run by their torch reference each call
    once: Counter = field(default_factory=Counter)  # top-level ops of weights only: computed once, not per call
    notes: list[str] = field(default_factory=list)
    graph: Graph = field(default_factory=Graph)

    @classmethod
    def build(cls, spec: Any, backend: str, tune: str = "none", title: str | None = None) -> Report:
        """The report of one specialization (`api.Specialization`) compiled with that backend and tune mode
        (`title`: the model's name; by default the class of the captured graph)."""
        fn = next(o for o in spec.pipeline.module.walk() if isinstance(o, func.FuncOp))
        rep = cls(title or type(spec.captured.gm).__name__, backend, spec.compile_seconds, notes=list(spec.notes))
        if tune != "none" and backend != "triton":
            rep.notes.append(f"tune={tune!r} was skipped: tuning times kernels on a CUDA GPU and runs only on the "
                             f"triton backend, not {backend!r}")  # fmt: skip
        sources = spec.imported.sources
        for op in fn.body.block.ops:
            if isinstance(op, (func.ReturnOp, ParamOp)):
                continue
            rep.ops[op.name] += 1
            if not isinstance(op, ConstantOp) and op.results and all(is_constant(r) for r in op.results):
                rep.once[op.name] += 1  # weights only: the runtime computes it once, not per call
            elif isinstance(op, FusedOp):
                inner = [o for o in op.body_ops if not isinstance(o, ParamOp)]
                kinds = sorted({k.value for o in inner if (k := kind_of(o))})
                rep.regions.append(RegionRecord(op.pattern.data, op.kernel.data if op.kernel else None, op.template_name,
                                                [o.name for o in inner], kinds, traffic_saved(op)))  # fmt: skip
                rep.kinds.update(k.value for o in inner if (k := kind_of(o)) is not None)
            elif (k := kind_of(op)) is not None:
                rep.kinds[k.value] += 1
            if isinstance(op, TorchCallOp):
                rep.fallbacks.append(Fallback(op.callee.data, op.node.data, sources.get(op.node.data) or ""))
        rep.kernels = spec.executor.kernel_choices()
        views = {o.name for o in VIEW_OPS}
        rep.unfused.update(s.op for s in spec.executor.steps if isinstance(s, ReferenceStep) and s.op not in views)
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

    def choice(self, region: RegionRecord) -> KernelChoice | None:
        """What runs a region (None where no program step runs it)."""
        return next((c for c in self.kernels if c.region == (region.kernel or region.pattern)), None)

    def counts(self) -> dict[str, int]:
        """Regions by what runs them (a generated kernel, a pattern's callable, their reference: cuBLAS, SDPA or
        torch ops), opaque torch calls, unfused dl ops run by their reference each call, ops computed once."""
        impls = Counter(c.impl for c in self.kernels)
        return {
            "regions": len(self.regions),
            "kernels": impls["kernel"],
            "callables": impls["callable"],
            "references": impls["reference"],
            "torch_fallbacks": len(self.fallbacks),
            "unfused": sum(self.unfused.values()),
            "computed_once": sum(self.once.values()),
        }

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
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "unfused": dict(self.unfused),
            "computed_once": dict(self.once),
            "counts": self.counts(),
            "notes": [_text.one_line(n) for n in self.notes],  # (verifier and dynamo texts span lines)
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def text(self, detail: bool = False) -> str:
        """The concise text (`str(report)`: the counts, one line per region saying what runs it, one-line notes
        with the many alike summarized) or, with `detail`, every op, config, fallback's source line and note."""
        return _text.detailed(self) if detail else _text.concise(self)

    def detailed(self) -> str:
        return self.text(detail=True)

    def __str__(self) -> str:
        return self.text()

    def __contains__(self, text: str) -> bool:
        """`"..." in report` searches the detailed text."""
        return text in self.text(detail=True)

    def write_html(self, path: str) -> None:
        """The page: the graph drawn as an SVG (regions as labelled clusters) above the detailed text."""
        with open(path, "w") as f:
            f.write(page(self, self.text(detail=True)))


__all__ = ["Report", "RegionRecord", "Fallback", "KernelChoice"]
