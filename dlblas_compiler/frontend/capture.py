"""Capture a module's forward as an FX graph: `torch.fx.symbolic_trace` first, dynamo export when
symbolic tracing cannot follow the code (tuple arguments, Python control flow on sizes, ...).

The result knows how to flatten a call's (args, kwargs) into the graph's placeholders and how to
rebuild the call's output structure from the values of the output node's leaves.
"""

from __future__ import annotations

import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import FrontendError


@dataclass
class Captured:
    gm: torch.fx.GraphModule
    how: str  # "graph_module" | "symbolic_trace" | "dynamo"
    in_spec: Any = None  # dynamo: pytree spec of (args, kwargs)
    out_spec: Any = None  # dynamo: pytree spec of the output
    signature: inspect.Signature | None = None  # symbolic_trace: forward's signature
    notes: list[str] = field(default_factory=list)

    def flatten(self, args: tuple, kwargs: dict) -> list:
        """The values of the graph's placeholders for one call."""
        if self.how == "dynamo":
            from torch.fx._pytree import tree_flatten_spec

            return list(tree_flatten_spec((args, kwargs), self.in_spec))
        if self.signature is None:
            if kwargs:
                raise TypeError("a GraphModule takes positional inputs only")
            return list(args)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return list(bound.arguments.values())

    def output_leaves(self) -> tuple[list, Any]:
        """The output node's leaves (fx Nodes or constants) and the spec that rebuilds the result."""
        out = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        leaves, spec = pytree.tree_flatten(out.args[0])
        return leaves, spec

    def unflatten(self, values: list, spec: Any) -> Any:
        result = pytree.tree_unflatten(values, spec)
        if self.out_spec is not None:
            result = pytree.tree_unflatten(list(result), self.out_spec)
        return result


def _plain_signature(model: torch.nn.Module) -> inspect.Signature | None:
    sig = inspect.signature(model.forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return None
    return sig


def capture(model: torch.nn.Module, args: tuple, kwargs: dict) -> Captured:
    """Trace `model` for a call with these inputs. Raises FrontendError naming why both tracers failed."""
    if isinstance(model, torch.fx.GraphModule):
        has_pytree = hasattr(model.graph._codegen, "pytree_info")
        if has_pytree:
            info = model.graph._codegen.pytree_info
            return Captured(model, "dynamo", in_spec=info.in_spec, out_spec=info.out_spec)
        return Captured(model, "graph_module")
    sig = _plain_signature(model)
    failure = "its forward takes *args/**kwargs"
    if sig is not None:
        try:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            concrete = {k: v for k, v in bound.arguments.items() if not isinstance(v, torch.Tensor)}
            if all(v is None or isinstance(v, (bool, int, float, str, torch.dtype)) for v in concrete.values()):
                tracer = torch.fx.Tracer()
                tracer.record_stack_traces = True
                graph = tracer.trace(model, concrete_args=concrete or None)
                gm = torch.fx.GraphModule(tracer.root, graph, model.__class__.__name__)
                return Captured(gm, "symbolic_trace", signature=sig)
            failure = "an argument is a container (tuple, list or dict)"
        except Exception as e:  # noqa: BLE001 - any tracing failure sends us to dynamo
            failure = f"{type(e).__name__}: {_first_line(e)}"
    return _dynamo_capture(model, args, kwargs, failure)


def _dynamo_capture(model, args, kwargs, symbolic_failure: str) -> Captured:
    import torch._dynamo

    # Every input signature is exported afresh; dynamo's per-frame recompile limit must not stop the 9th.
    limits = {"recompile_limit": 1 << 20, "accumulated_recompile_limit": 1 << 20}
    try:
        with warnings.catch_warnings(), torch._dynamo.config.patch(limits):
            warnings.simplefilter("ignore")
            result = torch._dynamo.export(model, aten_graph=False, assume_static_by_default=True)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        raise FrontendError(
            f"cannot trace {type(model).__name__}: torch.fx.symbolic_trace failed ({symbolic_failure}), "
            f"and dynamo failed: {_dynamo_reason(e)}"
        ) from e
    gm = result.graph_module
    info = gm.graph._codegen.pytree_info
    return Captured(
        gm, "dynamo", in_spec=info.in_spec, out_spec=info.out_spec, notes=[f"symbolic_trace failed: {symbolic_failure}"]
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _dynamo_reason(e: BaseException) -> str:
    """The cause and user source line of a dynamo failure, without dynamo's long hints."""
    text = str(e)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    m = re.search(r'File "([^"]+)", line (\d+)', text)
    where = f" at {m.group(1)}:{m.group(2)}" if m else ""
    explanation = next((ln.strip() for ln in lines if ln.strip().startswith("Explanation:")), "")
    return f"{head}{where}" + (f" ({explanation})" if explanation else "")


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_INTERNAL = ("/torch/fx/", "/torch/_dynamo/", "/torch/nn/modules/module.py", "/torch/_ops.py")


def source_line(node: torch.fx.Node) -> str | None:
    """The innermost user frame of an FX node's stack trace, as `file:line (code)`."""
    trace = node.meta.get("stack_trace") or node.stack_trace
    if not trace:
        return None
    frames = [m for m in _FRAME.finditer(trace) if not any(p in m.group(1) for p in _INTERNAL)]
    if not frames:
        return None
    f = frames[-1]
    code = f.group(4).strip()
    return f"{f.group(1)}:{f.group(2)}" + (f" ({code})" if code and not code.startswith("File ") else "")
