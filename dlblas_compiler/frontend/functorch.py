"""torch.func transforms in a captured graph, each run by PyTorch as one call.

Dynamo inlines `torch.vmap` (and what calls it: torch's `associative_scan` in its generic mode, which Jamba's
and other Mamba-style layers use while dynamo compiles them; `torch.func.grad`, `jvp`) into the graph as the
transform's own steps: `_vmap_increment_nesting`, `_add_batch_dim`, the function's ops on batched tensors,
`_remove_batch_dim`, `_vmap_decrement_nesting`. Between the nesting calls the values are functorch's wrapped
tensors, which only those steps, run in that order, make sense of; the nesting calls return no tensor, so the
importer would have kept none of them. `transforms_as_calls` cuts each outermost region (from an increment to its
matching decrement) out into a GraphModule of its own and calls it as one node, which the importer runs in PyTorch
like any op it has no converter for; the rest of the graph compiles as usual.
"""

from __future__ import annotations

import operator

import torch


def _step(n: torch.fx.Node) -> int:
    """+1 where `n` enters a functorch transform's level, -1 where it leaves one, else 0."""
    name = getattr(n.target, "__name__", "") if n.op == "call_function" else ""
    return 1 if name.endswith("_increment_nesting") else -1 if name.endswith("_decrement_nesting") else 0


class TransformRegion:
    """A graph region between a functorch transform's entry and exit, called with the values it reads from the
    rest of the graph; returns the values the rest of the graph reads from it, as a tuple."""

    __name__ = "functorch_region"

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm

    def __call__(self, *args):
        return tuple(self.gm(*args))

    def __repr__(self) -> str:
        return "functorch_region"


def transforms_as_calls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` itself where it has no functorch transform steps, else a new GraphModule (the given one is left as it
    is: it may be saved or captured again) in which each outermost transform region is one `TransformRegion` call
    followed by a getitem per value read after it."""
    nodes = list(gm.graph.nodes)
    if not any(_step(n) for n in nodes):
        return gm
    regions: list[list[torch.fx.Node]] = []
    depth = 0
    for n in nodes:
        if depth == 0 and _step(n) == 1:
            regions.append([])
        if depth > 0 or _step(n) == 1:
            regions[-1].append(n)
        depth += _step(n)
    if depth != 0:
        return gm  # (unbalanced: left to the importer, which then names the op it cannot take)
    first = {r[0]: r for r in regions}
    inside = {n: r for r in regions for n in r}
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in nodes:
        if n in first:
            _outline(gm, graph, first[n], env)
        elif n not in inside:
            env[n] = graph.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, graph, gm.__class__.__name__)


def _outline(gm: torch.fx.GraphModule, graph: torch.fx.Graph, region: list[torch.fx.Node],
             env: dict[torch.fx.Node, torch.fx.Node]) -> None:  # fmt: skip
    """Add to `graph` one call of `region` as its own GraphModule and a getitem per value read after it (into
    `env`)."""
    members = set(region)
    reads = list(dict.fromkeys(a for n in region for a in n.all_input_nodes if a not in members))
    results = [n for n in region if any(u not in members for u in n.users)]
    sub = torch.fx.Graph()
    local = {a: sub.placeholder(a.name) for a in reads}
    for n in region:
        local[n] = sub.node_copy(n, lambda a: local[a])
    sub.output(tuple(local[n] for n in results))
    call = graph.call_function(TransformRegion(torch.fx.GraphModule(gm, sub, "functorch_region")),
                               tuple(env[a] for a in reads))  # fmt: skip
    trace = next((n.meta["stack_trace"] for n in region if n.meta.get("stack_trace")), None)
    if trace:
        call.meta["stack_trace"] = trace
    for i, n in enumerate(results):
        env[n] = graph.call_function(operator.getitem, (call, i))
        env[n].meta = dict(n.meta)
