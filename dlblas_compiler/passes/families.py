"""Shape families: one compiled IR that serves every length of a power-of-two bucket.

Two compiles of one model whose inputs differ only in some sizes (a prompt of 17 tokens, then one of 23; a
cache of 9 keys, then 10) give final IRs of the same structure when the pipeline made the same decisions for
both: the same ops, operands, properties and attributes, differing only in integers (the dims of types,
slice bounds). `unify(first, second)` checks that op by op and records every differing integer as an affine
function of one parameter t: its value at the first compile (t = 0) plus its change to the second (t = 1)
times t. `ShapeFamily.instantiate(sizes)` solves t from a new call's input sizes (every size that differed
must give the same t; the others must be unchanged), evaluates each recorded integer at t and returns a copy
of the first IR with them, verified. Nothing is captured, imported, rewritten or tuned again: the kernels'
sources do not depend on the token count (row counts are runtime arguments) and their configs are cached by
bucket, so an instance only rebuilds its launches.

Where it stops: a new size outside the bucket of the two compiles (the pipeline may decide differently
there, and tuning is per bucket), an integer that is not whole at t, or an instance the verifiers reject
(a size that is not affine in the others, such as a product of two lengths, shows up as a reshape or a
matmul whose shapes disagree). The caller then compiles the signature in full. A float that differs
between the two compiles (a scale of 1/length, say) refuses the family outright.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, IntAttr, ModuleOp
from xdsl.ir import Attribute, Block, BlockArgument, Operation, ParametrizedAttribute, SSAValue
from xdsl.utils.exceptions import VerifyException

from ..tuning.cache import bucket


class NotAFamily(Exception):
    """Two IRs that are not one structure with different sizes (the message says where)."""


class Replacements(NamedTuple):
    """An instance's changed ops (`ShapeFamily.replacements`)."""

    replaced: dict[Operation, Operation]  # a changed op -> its copy at the new sizes
    aliases: dict[SSAValue, SSAValue]  # a value the copies read in place of one of the IR's (its argument, or a shared op's result)
    shared: dict[Operation, Operation]  # a changed op not copied -> the op of its class whose copy's step it runs
    retyped: tuple[Operation, ...] = ()  # changed ops not copied whose steps do not read their types (`retype`)


# Where an integer sits: (op index in walk order, "result" | "arg" | "prop" | "attr", key, path in the attribute)
Place = tuple[int, str, object, tuple[int, ...]]


@dataclass
class ShapeFamily:
    """The IR of a first compile, the integers that move with the sizes, and the sizes it was unified at."""

    module: ModuleOp  # the first compile's final IR (never modified: instances are copies)
    sizes: tuple[tuple[int, ...], tuple[int, ...]]  # the input sizes of the two compiles (t = 0, t = 1)
    moves: list[tuple[Place, int, int]]  # (where, value at t = 0, value at t = 1)
    # top-level op index -> its class: ops equal at both compiles up to the values they read (each layer's copy of
    # an op), hence equal at every size; only classes of two or more ops
    classes: dict[int, int] = field(default_factory=dict)
    _ops: list[Operation] | None = field(default=None, repr=False)
    _changed_set: set[int] = field(default_factory=set, repr=False)
    _index: dict[Operation, int] = field(default_factory=dict, repr=False)
    _at: dict[int, list[tuple[Place, int, int]]] = field(default_factory=dict, repr=False)  # op index -> its moves
    _order: dict[frozenset, list[Operation]] = field(default_factory=dict, repr=False)  # also -> the ops to copy
    _shares: dict[Operation, object] = field(default_factory=dict, repr=False)
    _last_parameter: tuple = field(default=(None, None), repr=False)

    @functools.cached_property
    def _line(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        """The positions of the sizes the two compiles share, and (position, first, second) of those that move."""
        first, second = self.sizes
        return [i for i, (a, b) in enumerate(zip(first, second)) if a == b], [
            (i, a, b) for i, (a, b) in enumerate(zip(first, second)) if a != b]  # fmt: skip

    def parameter(self, sizes: tuple[int, ...]) -> Fraction | None:
        """t for these input sizes, or None where they are not on the family's line inside its buckets."""
        if self._last_parameter[0] == sizes:  # (an instance asks several times, with a tuple of a few hundred sizes)
            return self._last_parameter[1]
        t = self._parameter(sizes)
        self._last_parameter = (sizes, t)
        return t

    def _parameter(self, sizes: tuple[int, ...]) -> Fraction | None:
        first = self.sizes[0]
        if len(sizes) != len(first):
            return None
        fixed, moving = self._line
        if any(sizes[i] != first[i] for i in fixed):
            return None
        if not moving:
            return Fraction(0)
        i0, a0, b0 = moving[0]
        for i, a, b in moving:  # (x - a) / (b - a) the same for each: (x - a)(b0 - a0) = (x0 - a0)(b - a)
            x = sizes[i]
            if (x - a) * (b0 - a0) != (sizes[i0] - a0) * (b - a) or not bucket(x) == bucket(a) == bucket(b):
                return None
        return Fraction(sizes[i0] - a0, b0 - a0)

    def covers(self, sizes: tuple[int, ...]) -> bool:
        return self.parameter(sizes) is not None

    def _values(self, sizes: tuple[int, ...]) -> list[int]:
        """Every moving integer at these sizes (NotAFamily where they are not covered or one is not whole)."""
        value = self._evaluator(sizes)
        return [value(i, a, b) for (i, *_), a, b in self.moves]

    def _evaluator(self, sizes: tuple[int, ...]):
        """(op index, value at t = 0, at t = 1) -> the integer at these sizes (NotAFamily where the sizes are not
        covered or the integer is not whole)."""
        t = self.parameter(sizes)
        if t is None:
            raise NotAFamily(f"sizes {sizes} are not on the line through {self.sizes[0]} and {self.sizes[1]} within their buckets")

        def value(i: int, a: int, b: int) -> int:
            v = a + (b - a) * t
            if v.denominator != 1 or v < 0:
                raise NotAFamily(f"a size of op {i} is {v} at sizes {sizes}")
            return int(v)

        return value

    def _changed(self) -> tuple[list[Operation], set[int]]:
        """The IR's ops in walk order, and the indices of those an instance changes: the ops whose integers move,
        the ops reading their values, and the ops enclosing them (the same for every instance)."""
        if self._ops is None:
            ops = list(self.module.walk())
            index = {op: i for i, op in enumerate(ops)}
            changed: set[int] = set()
            for (i, kind, key, _), _a, _b in self.moves:
                changed.add(i)
                values = ops[i].results if kind == "result" else ops[i].regions[key[0]].blocks[key[1]].args if kind == "arg" else ()
                changed.update(index[u.operation] for v in values for u in v.uses)
            for i in list(changed):
                parent = ops[i].parent_op()
                while parent is not None and index[parent] not in changed:
                    changed.add(index[parent])
                    parent = parent.parent_op()
            self._ops, self._changed_set, self._index = ops, changed, index
            for move in self.moves:
                self._at.setdefault(move[0][0], []).append(move)
        return self._ops, self._changed_set

    def _copied(self, also: frozenset[Operation]) -> list[Operation]:
        """The function body's ops an instance copies, in order: the changed ones and `also`."""
        if also not in self._order:
            ops, changed = self._changed()
            fn = next(op for op in ops if isinstance(op, func.FuncOp))
            self._order[also] = [op for op in fn.body.block.ops if (self._index[op] in changed or op in also)
                                 and not isinstance(op, func.ReturnOp)]  # fmt: skip
        return self._order[also]

    def _put_all(self, copies: dict[Operation, Operation], value) -> None:
        """Each moving integer of the copied ops (original -> copy, nested ops included) at these sizes."""
        for op, new in copies.items():
            for (i, kind, key, path), a, b in self._at.get(self._index[op], ()):
                _put(new, kind, key, path, value(i, a, b))

    def replacements(self, sizes: tuple[int, ...], also: frozenset[Operation] = frozenset(),
                     share: Callable[[Operation], Hashable | None] | None = None,
                     retype: Callable[[Operation], bool] | None = None) -> Replacements:  # fmt: skip
        """The ops of the function body that these sizes change, each mapped to a verified copy at these sizes
        (the copies read each other's values, and the function's arguments as new values of their new types: the
        `aliases` map those to the arguments); the rest of the IR is shared with the first compile.
        NotAFamily where the sizes are not covered or a copy fails to verify. The ops in `also` are copied too
        (a torch call whose constant arguments move: its step must be built again).
        With `share` (op -> what must match for one op's step to run another's on other values; None: never),
        an op of a class whose first changed op was copied is not copied: `shared` maps it to that op (every
        layer's copy of an op is one copy, verified and lowered once, whose step the other layers run on their
        own values). With `retype` (op -> whether its step ignores its types: an opaque torch call), such an op is
        not copied: the copies read its values with their types at these sizes, and `retyped` lists it (its
        step is the first compile's, or rebuilt by the caller where its constants move)."""
        value = self._evaluator(sizes)
        ops, changed = self._changed()
        fn = next(op for op in ops if isinstance(op, func.FuncOp))
        block = fn.body.block
        scratch = Block()  # stand-ins for the values the copies read at these sizes (arguments, ops not copied)
        aliases: dict[SSAValue, SSAValue] = {}
        mapper: dict = {}
        copies: dict[Operation, Operation] = {}
        replaced: dict[Operation, Operation] = {}
        shared: dict[Operation, Operation] = {}
        first: dict[int, Operation] = {}  # class -> its first copied op
        placeholders: list[tuple[BlockArgument, Operation, int]] = []
        index = self._index
        retyped: list[Operation] = []
        # a value of a changed op not copied (shared, or retyped) -> (that op or its class's copied op, result index):
        # a copy reading it reads a stand-in of its type at these sizes, made when a copy first reads it
        elsewhere: dict[SSAValue, tuple[Operation, int, bool | None]] = {a: (fn, a.index, None) for a in block.args}
        for op in self._copied(also):
            if retype is not None and retype(op):
                elsewhere.update((r, (op, j, False)) for j, r in enumerate(op.results))
                retyped.append(op)
                continue
            cls = self.classes.get(index[op]) if share is not None and op not in also else None
            if cls is not None and (k := self._share(op, share)) is not None:
                rep = first.get(cls)
                if rep is not None and k == self._share(rep, share):
                    shared[op] = rep
                    elsewhere.update((r, (rep, j, True)) for j, r in enumerate(op.results))
                    continue
                first.setdefault(cls, op)
            for v in {v for o in op.walk() for v in o.operands if v in elsewhere and v not in mapper}:
                owner, j, is_shared = elsewhere[v]
                t = v.type if is_shared else self._arg_type(j, value) if is_shared is None else self._result_type(owner, j, value)
                arg = scratch.insert_arg(t, len(scratch.args))
                mapper[v], aliases[arg] = arg, v
                if is_shared:  # (typed once its class's copy has its sizes, below)
                    placeholders.append((arg, owner, j))
            new = replaced[op] = op.clone(mapper)
            copies.update(zip(op.walk(), new.walk()))
        self._put_all(copies, value)
        for arg, rep, j in placeholders:
            arg._type = replaced[rep].results[j].type
        try:
            _verify([new for op, new in copies.items() if self._index[op] in changed])
        except VerifyException as e:
            raise NotAFamily(f"the IR at sizes {sizes} does not verify: {str(e).splitlines()[0]}") from None
        return Replacements(replaced, aliases, shared, tuple(retyped))

    def types_at(self, sizes: tuple[int, ...]) -> Callable[[SSAValue], Attribute]:
        """value -> its type at these sizes, for the values of the function body (its arguments, its ops' results)."""
        value = self._evaluator(sizes)
        self._changed()
        return lambda v: self._type_at(v, value)

    def _type_at(self, v: SSAValue, value) -> Attribute:
        if isinstance(v, BlockArgument):
            return self._arg_type(v.index, value)
        return self._result_type(v.owner, v.index, value)

    def _arg_type(self, j: int, value) -> Attribute:
        """The type of the function's j-th argument at the sizes `value` evaluates."""
        fn = next(op for op in self._ops if isinstance(op, func.FuncOp))
        t = fn.body.block.args[j].type
        for (i, kind, key, path), a, b in self._at.get(self._index[fn], ()):
            if kind == "arg" and key[2] == j:
                t = _replace(t, path, value(i, a, b))
        return t

    def _result_type(self, op: Operation, j: int, value) -> Attribute:
        """The type of `op`'s j-th result at the sizes `value` evaluates."""
        t = op.results[j].type
        for (i, kind, key, path), a, b in self._at.get(self._index[op], ()):
            if kind == "result" and key == j:
                t = _replace(t, path, value(i, a, b))
        return t

    def _share(self, op: Operation, share: Callable[[Operation], Hashable | None]) -> Hashable | None:
        if op not in self._shares:
            self._shares[op] = share(op)
        return self._shares[op]

    def sliced(self, sizes: tuple[int, ...], roots: list[Operation]) -> list[Operation]:
        """Copies of `roots` (ops of the function body) at these sizes, reading copies of the ops they read,
        transitively, verified: a few values re-evaluated at other sizes (the masks) without copying the IR."""
        value = self._evaluator(sizes)
        ops, changed = self._changed()
        needed: set[Operation] = set()
        stack = list(roots)
        while stack:
            op = stack.pop()
            if op not in needed:
                needed.add(op)
                stack.extend(v.owner for v in op.operands if isinstance(v.owner, Operation))
        fn = next(op for op in ops if isinstance(op, func.FuncOp))
        mapper: dict = {}
        copies: dict[Operation, Operation] = {}
        for op in fn.body.block.ops:
            if op in needed:
                copies.update(zip(op.walk(), op.clone(mapper).walk()))
        self._put_all(copies, value)
        try:
            _verify([new for op, new in copies.items() if self._index[op] in changed])
        except VerifyException as e:
            raise NotAFamily(f"the IR at sizes {sizes} does not verify: {str(e).splitlines()[0]}") from None
        return [copies[r] for r in roots]

    def instantiate(self, sizes: tuple[int, ...]) -> ModuleOp:
        """The whole IR at these sizes: a copy with every moving integer evaluated, its changed ops verified (for
        the report and `ir()` of an instance; `replacements` is what runs)."""
        values = self._values(sizes)
        _, changed = self._changed()
        module = self.module.clone()
        ops = list(module.walk())
        for ((i, kind, key, path), _a, _b), v in zip(self.moves, values):
            _put(ops[i], kind, key, path, v)
        try:
            _verify([ops[i] for i in sorted(changed)])
        except VerifyException as e:
            raise NotAFamily(f"the IR at sizes {sizes} does not verify: {str(e).splitlines()[0]}") from None
        return module


def unify(first: ModuleOp, second: ModuleOp, sizes: tuple[tuple[int, ...], tuple[int, ...]]) -> ShapeFamily:
    """The family through two final IRs (NotAFamily, naming the first difference, where they differ in more
    than integers)."""
    ops1, ops2 = list(first.walk()), list(second.walk())
    if len(ops1) != len(ops2):
        raise NotAFamily(f"{len(ops1)} ops against {len(ops2)}")
    values: dict = {}
    moves: list[tuple[Place, int, int]] = []
    for i, (a, b) in enumerate(zip(ops1, ops2)):
        where = f"op {i} ({a.name})"
        if a.name != b.name or len(a.operands) != len(b.operands) or len(a.results) != len(b.results) or len(
            a.regions
        ) != len(b.regions):
            raise NotAFamily(f"{where} against {b.name}")
        if any(values.get(x) is not y for x, y in zip(a.operands, b.operands)):
            raise NotAFamily(f"{where} reads other values")
        for j, (x, y) in enumerate(zip(a.results, b.results)):
            values[x] = y
            _diff(x.type, y.type, (i, "result", j, ()), moves, where)
        for r, (ra, rb) in enumerate(zip(a.regions, b.regions)):
            if len(ra.blocks) != len(rb.blocks):
                raise NotAFamily(f"{where}: its regions differ")
            for k, (ba, bb) in enumerate(zip(ra.blocks, rb.blocks)):
                if len(ba.args) != len(bb.args):
                    raise NotAFamily(f"{where}: its block arguments differ")
                for m, (x, y) in enumerate(zip(ba.args, bb.args)):
                    values[x] = y
                    _diff(x.type, y.type, (i, "arg", (r, k, m), ()), moves, where)
        for kind, da, db in (("prop", a.properties, b.properties), ("attr", a.attributes, b.attributes)):
            if da.keys() != db.keys():
                raise NotAFamily(f"{where}: {kind}erties differ" if kind == "prop" else f"{where}: attributes differ")
            for key in da:
                _diff(da[key], db[key], (i, kind, key, ()), moves, where)
    return ShapeFamily(first, sizes, moves, _classes(ops1, ops2))


def _classes(ops1: list[Operation], ops2: list[Operation]) -> dict[int, int]:
    """Top-level op index -> class, for the ops of the function body equal to another one in both IRs up to the
    values they read (their integers are then equal at every size: each is affine in t)."""
    index = {op: i for i, op in enumerate(ops1)}
    fn1, fn2 = (next(op for op in ops if isinstance(op, func.FuncOp)) for ops in (ops1, ops2))
    members: dict[tuple, list[int]] = {}
    for a, b in zip(fn1.body.block.ops, fn2.body.block.ops):
        members.setdefault((_key(a), _key(b)), []).append(index[a])
    return {i: n for n, group in enumerate(g for g in members.values() if len(g) > 1) for i in group}


def _key(op: Operation) -> tuple:
    """An op up to the values it reads (their types only) and its kernel's name: its name, types, properties,
    attributes and nested ops (which read each other by position)."""
    local: dict[SSAValue, int] = {}
    parts = []
    for o in op.walk():
        parts.append((o.name, tuple(local.get(v, v.type) for v in o.operands), tuple(r.type for r in o.results),
                      tuple((k, v) for k, v in o.properties.items() if k != "kernel"),
                      tuple((k, v) for k, v in o.attributes.items() if k != "kernel"),
                      tuple(tuple(a.type for a in blk.args) for reg in o.regions for blk in reg.blocks)))  # fmt: skip
        for v in (*o.results, *(a for reg in o.regions for blk in reg.blocks for a in blk.args)):
            local[v] = len(local)
    return tuple(parts)


def _verify(ops: list[Operation]) -> None:
    """Verify each op on its own (not its nested ops), once per distinct op: every layer's copy of an op has the
    same types and properties (up to its region's kernel name), and the verdict depends on nothing else (and,
    inside a region, on its parent's result types)."""
    seen = set()
    for op in ops:
        parent = op.parent_op()
        key = (op.name, tuple(v.type for v in op.operands), tuple(r.type for r in op.results),
               tuple((k, v) for k, v in op.properties.items() if k != "kernel"),
               tuple((k, v) for k, v in op.attributes.items() if k != "kernel"),
               tuple(r.type for r in parent.results) if parent is not None and not isinstance(parent, func.FuncOp) else None,
               len(op.regions))  # fmt: skip
        if key not in seen:
            seen.add(key)
            op.verify(verify_nested_ops=False)


def _diff(a: Attribute, b: Attribute, place: Place, moves: list, where: str) -> None:
    """Record the integers in which attributes a and b differ; NotAFamily where they differ otherwise."""
    if a == b:
        return
    i, kind, key, path = place
    if isinstance(a, IntAttr) and isinstance(b, IntAttr):
        moves.append((place, a.data, b.data))
    elif isinstance(a, ArrayAttr) and isinstance(b, ArrayAttr) and len(a.data) == len(b.data):
        for n, (x, y) in enumerate(zip(a.data, b.data)):
            _diff(x, y, (i, kind, key, (*path, n)), moves, where)
    elif type(a) is type(b) and isinstance(a, ParametrizedAttribute) and len(a.parameters) == len(b.parameters):
        for n, (x, y) in enumerate(zip(a.parameters, b.parameters)):
            _diff(x, y, (i, kind, key, (*path, n)), moves, where)
    else:
        raise NotAFamily(f"{where}: {a} against {b}")


def _replace(attr: Attribute, path: tuple[int, ...], value: int) -> Attribute:
    if not path:
        return IntAttr(value)
    n, rest = path[0], path[1:]
    if isinstance(attr, ArrayAttr):
        items = list(attr.data)
        items[n] = _replace(items[n], rest, value)
        return ArrayAttr(items)
    params = list(attr.parameters)
    params[n] = _replace(params[n], rest, value)
    return type(attr).new(params)


def _put(op: Operation, kind: str, key, path: tuple[int, ...], value: int) -> None:
    if kind == "result":
        v = op.results[key]
        v._type = _replace(v.type, path, value)
    elif kind == "arg":
        r, k, m = key
        v = op.regions[r].blocks[k].args[m]
        v._type = _replace(v.type, path, value)
    elif kind == "prop":
        op.properties[key] = _replace(op.properties[key], path, value)
    else:
        op.attributes[key] = _replace(op.attributes[key], path, value)
