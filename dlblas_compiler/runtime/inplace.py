"""In-place writes into inputs (a KV-cache update) where eager's semantics allow them.

The IR has value semantics: `k_cache.index_copy_(2, pos, k)` is `%k2 = dl.index_copy %k_cache[%pos] = %k`, the
new cache is an extra result, and the compiled module copies it into the caller's tensor after the call. That is
correct and costs two copies of the whole cache per call. `inplace_updates` finds the updates that may write the
caller's tensor directly: the destination is an input, the update's result is the value written back to that
input, and nothing reads the old value afterwards, directly or through a view (write after read in program
order). Those run as `InPlaceIndexCopy` steps; the write-back then copies the tensor onto itself, which torch
skips, and a CUDA graph captures the input at its own address (`CudaGraph.static`).

A GEMM region whose epilogue stores k and v into the cache (`region_writes`: it yields an index_copy's result) is
given the caller's cache tensor under the same conditions, else a copy of it (`RegionStep.writes`).

An in-place torch method on an input (a cache's length counter: `cumulative_length.add_(n)`), which the IR runs
on a copy of the input, runs on the input itself under the same conditions (no copy before it, none after).
Such calls whose result only the outputs read (each layer's counter) run at the program's end, those alike as
one `torch._foreach_*` call (`batched`): one kernel a token where each layer's counter was one.
Every other input the model writes gets its final value copied into it by the program's last steps
(`WriteInput`) rather than by the compiled module after the call, so that a CUDA graph captures that copy too and
the input at its address: a replay then updates the caller's tensor, with no copy in, clone out or copy back on
the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from xdsl.dialects import func
from xdsl.ir import BlockArgument, Operation, SSAValue

from ..dialects import FusedOp, IndexCopyOp, TorchCallOp
from ..dialects.aliasing import input_root, read_after, readers


def inplace_updates(fn: func.FuncOp, imported) -> dict[Operation, tuple[int, ...]]:
    """The ops that may write their destination inputs in place -> those block arguments' indices: dl.index_copy
    into an input, in-place torch methods on an input (`counter.add_(n)`, which the IR runs on a copy), and regions
    whose kernel stores into an input at indexed positions (`region_writes`)."""
    block = fn.body.block
    order = {op: i for i, op in enumerate(block.ops)}
    ret = block.last_op
    written = {}  # block argument index -> the value written back into that input
    n_out = len(ret.operands) - len(imported.writes)
    for kind, key, res in imported.writes:
        if kind == "input" and key in imported.arg_positions:
            written[imported.arg_positions.index(key)] = ret.operands[res]
    found: dict[Operation, tuple[int, ...]] = {}
    for op in block.ops:
        args = []
        for dest, result in _destinations(op):
            if not isinstance(dest, BlockArgument):
                continue
            arg = dest.index
            if written.get(arg) is not result or read_after(dest, op, order):
                continue
            if any(v is result for v in list(ret.operands)[:n_out]):
                continue  # also a user-visible output: eager returns the cache tensor there, keep it functional
            args.append(arg)
        if args:
            found[op] = tuple(args)
    return found


def deferrable(op: TorchCallOp) -> bool:
    """Whether the in-place call `op`'s new value is read by nothing but the function's outputs, so that the call
    may run at the program's end (nothing reads the old value after it either: `inplace_updates`)."""
    return all(isinstance(user, func.ReturnOp) for user in readers(list(op.res)))


def region_writes(fused: FusedOp) -> list[tuple[int, int]]:
    """(input position, output position) of each region input a region's kernel writes at indexed positions: the
    destination of an index_copy whose result the region yields (a GEMM storing k and v into a KV cache)."""
    args = list(fused.block.args)
    return [(args.index(y.owner.dest), i) for i, y in enumerate(fused.yielded.values)
            if isinstance(y.owner, IndexCopyOp) and y.owner.dest in args]  # fmt: skip


def _destinations(op: Operation) -> list[tuple[SSAValue, SSAValue]]:
    """(the tensor `op` writes a new value of, that new value) for the ops that may write in place."""
    if isinstance(op, IndexCopyOp):
        return [(op.dest, op.result)]
    if isinstance(op, TorchCallOp) and op.written is not None:
        return [(op.written, op.res[0])]
    if isinstance(op, FusedOp):
        return [(op.inputs[i], op.outputs[o]) for i, o in region_writes(op)]
    return []


def input_writes(fn: func.FuncOp, imported, inplace: dict[Operation, tuple[int, ...]]) -> list[tuple[int, SSAValue]]:
    """(block argument index, the value written into that input) for the inputs the model writes whose new
    value the program can copy into them as its last step: not already written in place, not the input itself
    unchanged, not also a user-visible output (eager returns the input tensor there), and not an input whose old
    value another write or an output still needs."""
    ret = fn.body.block.last_op
    n_out = len(ret.operands) - len(imported.writes)
    done = {result for op, found in inplace.items() for dest, result in _destinations(op)
            if isinstance(dest, BlockArgument) and dest.index in found}  # fmt: skip
    args = list(fn.body.block.args)
    writes = [(imported.arg_positions.index(key), ret.operands[res]) for kind, key, res in imported.writes
              if kind == "input" and key in imported.arg_positions]  # fmt: skip
    # an input whose new value is (a view of) another written input's old value (`x.copy_(y)`, then `y.mul_(2)`):
    # both are copied by the compiled module's write-back after the call, in the order the module wrote them,
    # since a last step writing y would change what x must receive
    written = {arg for arg, _ in writes}
    tangled = set()
    for arg, value in writes:
        root = input_root(value, args)
        if root is not None and root != arg and root in written:
            tangled |= {arg, root}
    # and an input a user-visible output reads the old value of (`y = x.clone()` kept as x, or a view of x; then
    # `x.mul_(2)`): the output is made from it after the program, so x is written after that
    outputs = list(ret.operands)[:n_out]
    read = {input_root(v, args) for v in outputs}
    return [
        (arg, value) for arg, value in writes
        if arg not in tangled and arg not in read and value not in done and value is not args[arg]
        and not any(v is value for v in outputs)
    ]  # fmt: skip


@dataclass
class InPlaceIndexCopy:
    """`dest.index_copy_(dim, index, source)` on the input's own tensor; its slot then holds that tensor."""

    dest: int
    dim: int
    index: int
    source: int
    out: int

    def __call__(self, env: list) -> None:
        t = env[self.dest]
        t.index_copy_(self.dim, env[self.index], env[self.source])
        env[self.out] = t

    def __repr__(self) -> str:
        return f"InPlaceIndexCopy(slot {self.dest}[{self.index}] = {self.source} along dim {self.dim} -> {self.out})"


@dataclass
class WriteInput:
    """`input.copy_(value)` as one of the program's last steps; the value's slot then holds the input tensor (so
    the compiled module's write-back finds it already there)."""

    dest: int
    value: int

    def __call__(self, env: list) -> None:
        t, v = env[self.dest], env[self.value]
        if v is not t:
            t.copy_(v)
        env[self.value] = t

    def __repr__(self) -> str:
        return f"WriteInput(slot {self.dest} = {self.value})"


@dataclass
class ForeachInPlace:
    """`t.<method>(scalar)` on each of several inputs at once (`torch._foreach_<method>`: one kernel for all of
    them), the calls' slots then holding those tensors."""

    method: str
    scalar: int | float
    ins: list[int]
    outs: list[int]

    def __call__(self, env: list) -> None:
        tensors = [env[i] for i in self.ins]
        getattr(torch, "_foreach_" + self.method)(tensors, self.scalar)
        for slot, t in zip(self.outs, tensors):
            env[slot] = t

    def __repr__(self) -> str:
        return f"ForeachInPlace({self.method}({self.scalar}) on slots {self.ins} -> {self.outs})"


def batched(steps: list, frees: list[tuple[int, ...]]) -> tuple[list, list[tuple[int, ...]]]:
    """The steps as a program runs them, with the slots to drop after each (`frees`, one entry per step): the
    deferrable in-place calls (`TorchStep.foreach`) that have others alike leave their places and run last, each
    group as one `ForeachInPlace`. Alike: the same method and the same scalar by type and repr (an int tensor's
    `add_(1.0)` fails where `add_(1)` runs; `mul_(-0.0)` is not `mul_(0.0)`). A call that frees a slot keeps its
    place (none does: a deferrable call reads and makes inputs and outputs, which are kept)."""
    groups: dict[tuple, list[int]] = {}
    for i, st in enumerate(steps):
        if getattr(st, "foreach", None) is not None and not frees[i]:
            method, scalar, _ = st.foreach
            groups.setdefault((method, type(scalar), repr(scalar)), []).append(i)
    groups = {key: group for key, group in groups.items() if len(group) > 1}
    if not groups:
        return steps, frees
    moved = {i for group in groups.values() for i in group}
    kept = [i for i in range(len(steps)) if i not in moved]
    last = [ForeachInPlace(method, steps[group[0]].foreach[1], [steps[i].foreach[2] for i in group],
                           [steps[i].outs[0] for i in group])
            for (method, _, _), group in groups.items()]  # fmt: skip
    return [steps[i] for i in kept] + last, [frees[i] for i in kept] + [()] * len(last)
