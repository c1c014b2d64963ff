"""In-place ops in FX graphs: which node a call writes, and the out-of-place call computing the same value.

The importer functionalizes them: the written tensor's new value becomes a fresh SSA value that later
readers see, and a write to a graph input or a module buffer/parameter is copied back after the call.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

# `a op= b` as traced by dynamo, and the operator computing the same value out of place
INPLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ipow: operator.pow,
}
INPLACE_DUNDERS = {"__iadd__": "add", "__isub__": "sub", "__imul__": "mul", "__itruediv__": "div"}
NOT_WRITES = {"requires_grad_", "share_memory_", "retain_grad", "record_stream"}  # end in "_" but change no values


def _writes_by_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name not in NOT_WRITES


def mutated_arg(n: torch.fx.Node, gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The node whose tensor `n` writes in place (x.add_(y), x[i] = y, x += y, relu(x, inplace=True),
    out=x), or None."""
    target: Any = None
    if isinstance(n.kwargs.get("out"), torch.fx.Node):
        target = n.kwargs["out"]
    elif n.op == "call_method" and (_writes_by_name(n.target) or n.target in (*INPLACE_DUNDERS, "__setitem__")):
        target = n.args[0]
    elif n.op == "call_function":
        name = getattr(n.target, "__name__", "")
        torch_fn = (getattr(n.target, "__module__", None) or "").startswith("torch")
        if n.target in INPLACE_OPERATORS or n.target is operator.setitem or (torch_fn and _writes_by_name(name)):
            target = n.args[0]
        elif n.kwargs.get("inplace") is True:
            target = n.args[0]
    elif n.op == "call_module" and getattr(gm.get_submodule(n.target), "inplace", False) is True:
        target = n.args[0]
    return target if isinstance(target, torch.fx.Node) else None


def out_of_place(n: torch.fx.Node) -> tuple[Any, tuple, dict] | None:
    """(converter key, args, kwargs) of the out-of-place call computing what `n` writes, if there is one
    (copy_ and item assignment have none: the importer broadcasts and casts the source, or runs the call
    on a copy)."""
    kwargs = {k: v for k, v in n.kwargs.items() if k not in ("inplace", "out")}
    if n.op == "call_method":
        if n.target in INPLACE_DUNDERS:
            return INPLACE_DUNDERS[n.target], n.args, kwargs
        if _writes_by_name(n.target) and n.target != "copy_":
            return n.target[:-1], n.args, kwargs
        return None
    if n.op == "call_function":
        if n.target in INPLACE_OPERATORS:
            return INPLACE_OPERATORS[n.target], n.args, kwargs
        name = getattr(n.target, "__name__", "")
        if _writes_by_name(name) and (twin := getattr(torch, name[:-1], None)) is not None:
            return twin, n.args, kwargs
        if n.target is operator.setitem:
            return None
        return n.target, n.args, kwargs
    return None
