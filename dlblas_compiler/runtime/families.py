"""Shape families at the level of compiled specializations (`passes.families` compares and instantiates the IR):
what a specialization key's sizes are, what must be the same beside two compiles' IRs (outputs, in-place writes,
kernels, the torch calls' constants: their integers may move too), the masks re-checked per instance, and the
first compile's tuned choices an instance takes. `CompiledModule` (api) forms the families and builds the
instances. (A specialization here is api's `Specialization`: its imported graph, final IR and program.)"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..dialects import ConstantOp, ParamOp, TorchCallOp
from ..dialects.types import shape_of, torch_dtype
from ..frontend import Captured, Imported, TorchCall
from ..frontend.masks import causal_offset
from ..passes import PipelineResult
from ..passes.families import NotAFamily, ShapeFamily
from .program import Program


def sizes_of(key: tuple) -> tuple[tuple, tuple[int, ...]]:
    """A specialization key split into its skeleton (sizes blanked) and its sizes: the dims of the input tensors
    and the int arguments (dynamo passes a symbolic length as one)."""
    (spec, sig, alias), *modes = key
    skeleton, sizes = [], []
    for e in sig:
        if e[0] == "P":
            skeleton.append(e)
        elif e[0] == "V":
            if e[1] == "int":
                sizes.append(e[2])
                skeleton.append(("V", "int"))
            else:
                skeleton.append(e)
        else:
            shape, dtype, device = e
            sizes.extend(shape)
            skeleton.append((len(shape), dtype, device))
    return (spec, tuple(skeleton), alias, *modes), tuple(sizes)


def int_positions(skeleton: tuple) -> tuple[int, ...]:
    """The positions among a key's sizes (`sizes_of`) that are int arguments, not dims of input tensors."""
    out, at = [], 0
    for e in skeleton[1]:
        if e == ("V", "int"):
            out.append(at)
            at += 1
        elif e[0] not in ("P", "V"):  # (a tensor's rank, dtype, device)
            at += e[0]
    return tuple(out)


@dataclass
class Family:
    """A shape family and what its instances share with the first compile."""

    shapes: ShapeFamily
    skeleton: tuple
    captured: Captured
    imported: Imported
    pipeline: PipelineResult
    notes: list[str]
    call_moves: dict[str, list[tuple[int, int, int]]]  # torch call -> its constant integers that move (`surroundings`)
    inputs: ShapeFamily | None = None  # the imported IRs' family, where masks found causal are re-checked per instance
    program: Program | None = None  # the first compile's program: instances share its other steps
    choices: dict = field(default_factory=dict)  # region -> what the first compile runs there, once it has run
    guard: Any = None  # the first compile's output guard (`runtime.outputs`): its instances' outputs alias alike

    @functools.cached_property
    def moved_calls(self) -> frozenset:
        """The torch calls of the first compile's IR whose constant integers move (built again per instance)."""
        return frozenset(op for op in self.shapes.module.walk() if isinstance(op, TorchCallOp) and op.node.data in self.call_moves)

    @functools.cached_property
    def sized_calls(self) -> list[TorchCallOp]:
        """The torch calls of the first compile's IR whose operands' sizes or constant integers move: their results'
        sizes at an instance's sizes are checked (`calls_hold`)."""
        ops, changed = self.shapes._changed()
        return [op for i, op in enumerate(ops)
                if isinstance(op, TorchCallOp) and (i in changed or op in self.moved_calls)]  # fmt: skip

    @functools.cached_property
    def masks(self) -> list[TorchCallOp]:
        """The torch calls of the imported IR whose mask the import found causal from its values (`masks_hold`)."""
        return [op for op in self.inputs.module.walk()
                if isinstance(op, TorchCallOp) and "causal_offset" in op.attributes and len(op.results) == 1]  # fmt: skip


def surroundings(a: Any, b: Any) -> dict[str, list[tuple[int, int, int]]]:
    """What runs beside two compiles' IRs must be the same up to integers (NotAFamily otherwise): the output
    structure and its constants, the in-place writes, the kernels' sources, and the opaque torch calls' constant
    arguments, whose integers may move like the IR's (`torch.arange(17)` then `torch.arange(18)`): returned as
    {call: [(index among its constants, value at the first compile, at the second)]}. A decision the import took
    from a tensor's values at these sizes (a mask found causal) refuses the family: it may not hold at others."""
    ia, ib = a.imported, b.imported
    for f in ("arg_positions", "out_leaves", "writes", "eager_aliases", "contiguous", "device_moves", "complex_inputs",
              "returns_written", "eager_views"):  # fmt: skip
        if getattr(ia, f) != getattr(ib, f):
            raise NotAFamily(f"their {f.replace('_', ' ')} differ")
    made = [k for k, v in ia.params.items() if k not in ib.params or ib.params[k].shape != v.shape]
    if made or ia.params.keys() != ib.params.keys():  # (a LayerNorm's missing weight, made as ones of its width)
        raise NotAFamily(f"the import made parameters of their sizes: {', '.join(made) or 'others'}")
    if ia.size_decisions != ib.size_decisions:
        differ = [f"{x} against {y}" for x, y in zip(ia.size_decisions, ib.size_decisions) if x != y]
        raise NotAFamily("sizes computed in a way not affine in the input sizes differ: " + "; ".join(differ))
    if ia.value_decisions != ib.value_decisions:
        raise NotAFamily("the import took other decisions from values: " + "; ".join(ia.value_decisions or ib.value_decisions))
    ka = [s.kernel.source for s in a.executor.steps if getattr(s, "kernel", None) is not None]
    kb = [s.kernel.source for s in b.executor.steps if getattr(s, "kernel", None) is not None]
    if ka != kb:
        raise NotAFamily("their kernels' sources differ")
    moves = {}
    ops = list(a.pipeline.module.walk())
    if ia.value_decisions:  # (the masks they were taken from are re-checked per instance: their calls move too)
        ops += list(a.pipeline.input_module.walk())
    for op in ops:
        if isinstance(op, TorchCallOp) and op.node.data not in moves:
            name = op.node.data
            ca, cb = ia.calls.get(name), ib.calls.get(name)
            if ca is None or cb is None:
                raise NotAFamily(f"torch call {name} is not in both compiles")
            (la, sa), (lb, sb) = pytree.tree_flatten(_baked(ca)), pytree.tree_flatten(_baked(cb))
            if sa != sb or len(la) != len(lb):
                raise NotAFamily(f"torch call {name} has other constant arguments")
            for i, (x, y) in enumerate(zip(la, lb)):
                if x is y or (type(x) is type(y) and _equal(x, y)):
                    continue
                if type(x) is not int or type(y) is not int:
                    raise NotAFamily(f"torch call {name} has other constant arguments ({x!r} against {y!r})")
                moves.setdefault(name, []).append((i, x, y))
    return moves


def masks_hold(family: Family, sizes: tuple[int, ...], imported: Imported) -> str | None:
    """None where every attention mask the import found causal from its values (`causal_offset`) is still
    causal with the same offset at these sizes (the masks' ops of the imported IRs' family copied at these sizes
    and evaluated with `imported`'s torch calls); else what changed."""
    for op in family.inputs.sliced(sizes, family.masks):
        value = _evaluate(op.results[0], imported, {})
        d = causal_offset(value) if isinstance(value, torch.Tensor) else None
        if d != op.attributes["causal_offset"].value.data:
            return f"the mask {op.node.data} is not causal with offset {op.attributes['causal_offset'].value.data} at these sizes"
    return None


def calls_hold(family: Family, sizes: tuple[int, ...], imported: Imported) -> str | None:
    """None where every torch call whose input sizes or constants move (`Family.sized_calls`) returns, at these sizes,
    results of the sizes the family's line gives them; else which one does not. A torch call is opaque: the line
    through two compiles holds for `torch.cat` or `torch.arange(p, p + n)`, not for a pooling's or an unfold's
    `(n - k) // stride + 1` rows, which two compiles fit to a line that is wrong at the third length. Each call runs
    on meta tensors of its operands' types at these sizes (one run per form and operand types)."""
    type_at, seen = family.shapes.types_at(sizes), {}
    for op in family.sized_calls:
        name = op.node.data
        fn = imported.calls[name]
        ins = tuple(type_at(v) for v in op.args)
        want = [shape_of(type_at(r)) for r in op.res]
        form = fn.form() if isinstance(fn, TorchCall) else None
        key = (form, ins) if form is not None else (name, ins)
        if key not in seen:
            seen[key] = _same_or_broadcast(fn, ins) or _result_shapes(fn, ins)
        got = seen[key]
        if isinstance(got, str):
            return f"the torch call {name} could not run on meta tensors at these sizes ({got})"
        if got != want[: len(got)]:
            return f"the torch call {name} returns sizes {got} at these sizes, where the family's line gives {want}"
    return None


class _OnMeta(torch.overrides.TorchFunctionMode):
    """Every torch function and method on meta tensors: a tensor it is given (a module's weight, a constant) and a
    device it names (`mask.to(device)`, `torch.arange(n, device=...)`) taken to the meta device, `.cpu()` and
    `.cuda()` as they are. Only sizes and dtypes come out."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.cpu, torch.Tensor.cuda):
            return args[0]
        meta = func is torch.Tensor.to
        args, kwargs = _to_meta(args, meta), _to_meta(kwargs or {}, meta)
        if "device" in kwargs:
            kwargs["device"] = _META
        return func(*args, **kwargs)


_META = torch.device("meta")


def _to_meta(a: Any, device_strings: bool) -> Any:
    """`_meta` of every leaf: plain tuples, lists and dicts walked here (pytree's map costs ~5x as much, and the
    meta check runs each token of a dynamic cache), other containers by pytree."""
    kind = type(a)
    if kind in (tuple, list, torch.Size):
        return kind(_to_meta(x, device_strings) for x in a)
    if kind is dict:
        return {k: _to_meta(v, device_strings) for k, v in a.items()}
    if isinstance(a, (tuple, list, dict)):
        return pytree.tree_map(lambda x: _meta(x, device_strings), a)
    return _meta(a, device_strings)


def _meta(a: Any, device_strings: bool) -> Any:
    if isinstance(a, torch.Tensor):
        return a if a.device.type == "meta" else a.to(_META)
    if isinstance(a, torch.device) or (device_strings and isinstance(a, str)):  # (`.to("cuda")`)
        return _META
    return a


# elementwise operators and methods: their result has the broadcast sizes of their tensors (a decode step's position
# and mask arithmetic); methods giving a tensor of their tensor's own sizes
_BROADCAST = {operator.add, operator.sub, operator.mul, operator.truediv, operator.lt, operator.le, operator.gt,
              operator.ge, operator.eq, operator.ne, operator.and_, operator.or_, operator.xor, operator.invert,
              operator.neg, torch.add, torch.sub, torch.mul, torch.lt, torch.le, torch.gt, torch.ge, torch.eq,
              torch.ne, torch.logical_and, torch.logical_or, torch.logical_not, torch.bitwise_and, torch.bitwise_or}
_SAME = {"to", "contiguous", "clone", "float", "half", "bfloat16", "bool", "int", "long", "detach", "add", "sub",
         "mul", "lt", "le", "gt", "ge", "eq", "ne", "__and__", "__or__", "__invert__", "logical_not", "neg"}


def _same_or_broadcast(fn: Callable, types: tuple) -> list[tuple[int, ...]] | None:
    """The result sizes of an elementwise call without running it (None: not such a call): the broadcast of its
    tensors' sizes. Running a call on meta tensors costs 30-130 µs on the CPU, and a decode step's instance checks
    several each token."""
    if not isinstance(fn, TorchCall) or fn.pos not in ((0,), ()) or any(isinstance(v, torch.Tensor) for v in (
            *fn.args, *fn.kwargs.values())):  # fmt: skip
        return None
    target = fn.target
    name = getattr(target, "name", None)
    if not (target in _BROADCAST or (name in _SAME and all(k in ("dtype", "device", "non_blocking", "copy",
                                                                   "memory_format") for k in fn.kwargs))):  # fmt: skip
        return None
    if name == "to" and any(not isinstance(a, (torch.dtype, torch.device, str)) for a in fn.args[1:]):
        return None  # (`x.to(other)`: another tensor's dtype and device, its own sizes)
    return [tuple(torch.broadcast_shapes(*(shape_of(t) for t in types)))] if types else None


def _result_shapes(fn: Callable, types: tuple) -> list[tuple[int, ...]] | str:
    """The sizes of what `fn` returns on meta tensors of these types (the reason where it cannot run), with every
    tensor and device it names taken to the meta device (`_OnMeta`): never on the real ones, which a call may write
    (a BatchNorm's counter)."""
    metas = [torch.empty(shape_of(t), dtype=torch_dtype(t.element_type), device="meta") for t in types]
    if not types and isinstance(fn, TorchCall) and "device" in fn.kwargs:  # (`torch.arange(n, device=...)`)
        fn = TorchCall(**{**fn.fields(), "kwargs": {**fn.kwargs, "device": _META}})
    try:
        with torch.no_grad(), _OnMeta():
            out = fn(*metas)
    except Exception as e:  # noqa: BLE001 - a call that needs values: the caller compiles in full
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return [tuple(x.shape) for x in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(x, torch.Tensor)]


def _evaluate(v, imported: Imported, memo: dict) -> Any:
    """The value of an input-free IR value: its ops run by their torch references and torch calls."""
    if v in memo:
        return memo[v]
    op = v.owner
    if isinstance(op, ParamOp):
        out = (imported.params[op.pname],)
    elif isinstance(op, ConstantOp):
        out = (op.scalar,)
    elif isinstance(op, TorchCallOp):
        out = imported.calls[op.node.data](*[_evaluate(x, imported, memo) for x in op.args])
    elif hasattr(op, "reference"):
        out = op.reference(*[_evaluate(x, imported, memo) for x in op.operands])
        out = out if isinstance(out, tuple) else (out,)
    else:
        raise NotAFamily(f"the mask depends on {v}")
    for r, x in zip(op.results, out):
        memo[r] = x
    return memo[v]


def _baked(fn: TorchCall) -> dict:
    """What a torch call was made with (its node's target and arguments)."""
    return fn.fields()


def _equal(x: Any, y: Any) -> bool:
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - values that do not compare: not equal
        return False


def moved_calls(family: Family, t) -> dict[str, Callable]:
    """The torch calls whose constant integers move, rebuilt at parameter t (NotAFamily where one is not whole)."""
    calls = {}
    for name, moves in family.call_moves.items():
        fn = family.imported.calls[name]
        leaves, spec = pytree.tree_flatten(_baked(fn))
        for i, x, y in moves:
            v = x + (y - x) * t
            if v.denominator != 1:
                raise NotAFamily(f"a constant of torch call {name} is {v}")
            leaves[i] = int(v)
        calls[name] = TorchCall(**pytree.tree_unflatten(leaves, spec))
    return calls


@contextlib.contextmanager
def no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def first_choices(program: Program) -> dict:
    """Region -> a copy of what a program runs there (its kernel and tuned config, or its reference), once it has
    run its first call (tuning then); empty before."""
    if not (program.tuned or program.tune_mode == "none") or not program.logged:
        return {}
    return {c.region: dataclasses.replace(c) for c in program.choices}
