"""`cm.report()`: what the compiler did to a module, in words (and optionally as an HTML picture)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from xdsl.dialects import func

from .dialects import FusedOp, ParamOp, TorchCallOp
from .dialects.traits import kind_of


@dataclass
class Report:
    title: str
    backend: str
    compile_seconds: float
    kinds: Counter = field(default_factory=Counter)
    ops: Counter = field(default_factory=Counter)
    regions: list[dict] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)

    @classmethod
    def build(cls, spec, options) -> Report:
        module = spec.pipeline.module
        fn = next(o for o in module.walk() if isinstance(o, func.FuncOp))
        rep = cls(type(spec.captured.gm).__name__, options.backend, spec.compile_seconds, notes=list(spec.notes))
        sources = spec.imported.sources
        for op in fn.body.block.ops:
            if isinstance(op, (func.ReturnOp, ParamOp)):
                continue
            rep.ops[op.name] += 1
            if isinstance(op, FusedOp):
                inner = [o for o in op.block.ops if not isinstance(o, ParamOp)][:-1]
                rep.regions.append(
                    {
                        "pattern": op.pattern.data,
                        "kernel": op.kernel.data if op.kernel else None,
                        "ops": [o.name for o in inner],
                        "kinds": sorted({k.value for o in inner if (k := kind_of(o))}),
                    }
                )
                for o in inner:
                    if (k := kind_of(o)) is not None:
                        rep.kinds[k.value] += 1
            elif (k := kind_of(op)) is not None:
                rep.kinds[k.value] += 1
            if isinstance(op, TorchCallOp):
                name = op.node.data
                where = sources.get(name)
                rep.fallbacks.append(f"{op.callee.data} (node {name}{', ' + where if where else ''})")
        rep.kernels = list(getattr(spec.executor, "kernel_summaries", lambda: [])())
        return rep

    def render(self, html: str | None = None) -> str:
        lines = [f"dlblas_compiler report: {self.title} (backend {self.backend}, compiled in {self.compile_seconds:.2f} s)"]
        lines.append("ops by mapping kind: " + (", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items())) or "none"))
        lines.append("top-level ops: " + ", ".join(f"{k} x{n}" for k, n in self.ops.most_common()))
        lines.append(f"fused regions: {len(self.regions)}")
        for i, r in enumerate(self.regions):
            lines.append(f"  [{i}] {r['pattern']}: {' '.join(r['ops'])} ({', '.join(r['kinds'])})")
        if self.kernels:
            lines.append(f"kernels: {len(self.kernels)}")
            for k in self.kernels:
                lines.append(f"  {k['name']}: {k.get('config', '')}")
        lines.append(f"torch fallbacks: {len(self.fallbacks)}")
        lines.extend(f"  {f}" for f in self.fallbacks)
        if self.notes:
            lines.append("notes:")
            lines.extend(f"  {n}" for n in self.notes)
        text = "\n".join(lines)
        if html:
            with open(html, "w") as f:
                f.write(f"<html><body><pre>{text}</pre></body></html>")
        return text
