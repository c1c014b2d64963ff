"""Elementwise torch calls alike over a program's inputs, run as one call.

HF's static cache computes each layer's cache positions as `torch.arange(n) + layer.cumulative_length`: a PyTorch
kernel per layer and token (32 of a Llama-3-8B decode step's ~195), each reading only an input (that layer's length
counter) and a constant (the arange, made once). Such calls do not depend on anything the program computes, so they
may all run first: `stacked` gathers the calls of one elementwise function with the same form (the same target,
scalars and keyword arguments; `TorchStep.form`) whose tensors are program inputs or input-free constants, and runs
each group as one call on the stacked operands (`StackedCall`): the counters stacked into one tensor, the shared
arange broadcast against it, each call's result a row of the one result. Two kernels (the stack and the add)
where there were 32.

Moving a call that reads an input ahead of the program is safe: an input is written in place only where nothing
reads its old value after the write (`inplace.inplace_updates`), so every read of it comes before every write in the
program's order, and stays before it when moved earlier. A constant (an input-free call, `TorchStep.once`) is the
same at every call, and the constants one group reads in its place are run first with it.

A group runs as one call only when it computes what its calls computed one by one: the stacked operands of one place
have one shape and every tensor operand of the group one dtype and device (a 0-dim tensor takes no part in type
promotion, a stacked one would; a group mixing dtypes runs call by call), and each stacked operand is small (the
stack copies it: a batch of large tensors would move more memory than the launches it saves).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from .steps import TorchStep

ELEMENTWISE = frozenset({operator.add, operator.sub, operator.mul, torch.add, torch.sub, torch.mul})
MAX_STACKED = 4096  # elements of one stacked operand (a cache's length counter: 1; a decode step's positions: 1)


@dataclass
class StackedCall:
    """The calls `members` (one elementwise target, one form) as one: each argument place holds the members' own
    slots (stacked along a new first dim), one slot all of them read (a constant of one form), or a plain value."""

    members: list[TorchStep]
    places: list[tuple[str, Any]]  # ("stack", [slot per member]) | ("shared", slot) | ("value", v)
    kwargs: dict[str, Any]

    def __call__(self, env: list) -> None:
        args, rank = [], 0
        for kind, what in self.places:
            if kind == "value":
                args.append(what)
                continue
            values = [env[s] for s in what] if kind == "stack" else [env[what]]
            first = values[0]
            key = (first.shape, first.dtype, first.device) if type(first) is torch.Tensor else None
            alike = key is not None and all(type(t) is torch.Tensor and (t.shape, t.dtype, t.device) == key for t in values)
            if not alike or first.numel() > MAX_STACKED:  # (sizes passed as ints; shapes that differ at this call)
                return self._one_by_one(env)
            args.append(values if kind == "stack" else first)
            rank = max(rank, first.dim())
        tensors = [a[0] if isinstance(a, list) else a for a in args if isinstance(a, list | torch.Tensor)]
        if len({(t.dtype, t.device) for t in tensors}) != 1:
            return self._one_by_one(env)
        n = len(self.members)
        ready = [torch.stack(a).reshape(n, *(1,) * (rank - a[0].dim()), *a[0].shape) if isinstance(a, list) else a
                 for a in args]  # fmt: skip
        rows = self.members[0].fn.target(*ready, **self.kwargs).unbind(0)
        for step, row in zip(self.members, rows, strict=True):
            env[step.outs[0]] = row

    def _one_by_one(self, env: list) -> None:
        for step in self.members:
            step(env)

    def __repr__(self) -> str:
        outs = [m.outs[0] for m in self.members]
        return f"StackedCall({self.members[0].name} and {len(self.members) - 1} alike -> {outs})"


def stacked(steps: list, frees: list[tuple[int, ...]], inputs: list[int], outputs: list[int]) -> tuple[list, list]:
    """The steps with each group of two or more alike elementwise calls over inputs and constants (see the module
    docstring) replaced by one `StackedCall` at the program's start, after the constants its members read; the
    slots each member freed, but constants, are freed after it. A call whose result may reach the program's outputs
    has no form (`Builder._torch_call`) and keeps its place (the caller gets a tensor of its own)."""
    made = {}  # slot -> the constant step that makes it
    for st in steps:
        if isinstance(st, TorchStep) and st.once and not st.ins:
            for s in st.outs:
                made[s] = st
    avail, returned = set(inputs) | set(made), set(outputs)
    groups: dict[tuple, list[int]] = {}
    for i, st in enumerate(steps):
        if (isinstance(st, TorchStep) and not st.once and st.foreach is None and st.form is not None
                and st.form[0] in ELEMENTWISE and len(st.outs) == 1 and st.outs[0] not in returned
                and set(st.ins) <= avail):  # fmt: skip
            groups.setdefault(st.form, []).append(i)
    groups = {form: group for form, group in groups.items() if len(group) > 1}
    if not groups:
        return steps, frees
    first, moved, calls = [], set(), []
    for form, group in groups.items():
        members = [steps[i] for i in group]
        places, reads = [], []
        for kind, arg, *_ in form[1]:  # (("slot", position) or ("value", v, type, repr))
            if kind == "value":  # (the same in every member: it is part of the form)
                places.append(("value", arg))
                continue
            slots = [m.ins[arg] for m in members]
            constants = [(made[s].form, made[s].outs.index(s)) if s in made else None for s in slots]
            if len(set(slots)) == 1 or (None not in constants and len(set(constants)) == 1 and constants[0][0]):
                places.append(("shared", slots[0]))  # (one slot, or constants of one form: equal values)
            else:
                places.append(("stack", slots))
            reads += slots  # (every member's: a call that cannot stack runs them one by one)
        if not any(kind == "stack" for kind, _ in places):
            continue  # (every member computes the same value: not a batch; each keeps its own tensor)
        for s in reads:
            if s in made and all(made[s] is not f for f in first):
                first.append(made[s])
        call = StackedCall(members, places, {k: v for k, v, *_ in form[2]})
        # (a member's frees past the constants: another reader of a constant may now come after the call; a
        # constant is kept by its step anyway, `TorchStep.once`)
        calls.append((call, tuple(s for i in group for s in frees[i] if s not in made)))
        moved.update(group)
    if not calls:
        return steps, frees
    at = {id(st): i for i, st in enumerate(steps)}
    moved.update(at[id(st)] for st in first)
    ahead = [(st, frees[at[id(st)]]) for st in first] + calls
    rest = [(st, frees[i]) for i, st in enumerate(steps) if i not in moved]
    return [st for st, _ in ahead + rest], [f for _, f in ahead + rest]
