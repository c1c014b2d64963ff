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

from dataclasses import dataclass, field
from fractions import Fraction

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, IntAttr, ModuleOp
from xdsl.ir import Attribute, Block, Operation, ParametrizedAttribute, SSAValue
from xdsl.utils.exceptions import VerifyException

from ..tuning.cache import bucket


class NotAFamily(Exception):
    """Two IRs that are not one structure with different sizes (the message says where)."""


# Where an integer sits: (op index in walk order, "result" | "arg" | "prop" | "attr", key, path in the attribute)
Place = tuple[int, str, object, tuple[int, ...]]


@dataclass
class ShapeFamily:
    """The IR of a first compile, the integers that move with the sizes, and the sizes it was unified at."""

    module: ModuleOp  # the first compile's final IR (never modified: instances are copies)
    sizes: tuple[tuple[int, ...], tuple[int, ...]]  # the input sizes of the two compiles (t = 0, t = 1)
    moves: list[tuple[Place, int, int]]  # (where, value at t = 0, value at t = 1)
    _ops: list[Operation] | None = field(default=None, repr=False)
    _changed_set: set[int] = field(default_factory=set, repr=False)

    def parameter(self, sizes: tuple[int, ...]) -> Fraction | None:
        """t for these input sizes, or None where they are not on the family's line inside its buckets."""
        first, second = self.sizes
        if len(sizes) != len(first):
            return None
        t = None
        for x, a, b in zip(sizes, first, second):
            if a == b:
                if x != a:
                    return None
                continue
            if not bucket(x) == bucket(a) == bucket(b):
                return None
            u = Fraction(x - a, b - a)
            if t is not None and u != t:
                return None
            t = u
        return t

    def covers(self, sizes: tuple[int, ...]) -> bool:
        return self.parameter(sizes) is not None

    def _values(self, sizes: tuple[int, ...]) -> list[int]:
        """Every moving integer at these sizes (NotAFamily where they are not covered or one is not whole)."""
        t = self.parameter(sizes)
        if t is None:
            raise NotAFamily(f"sizes {sizes} are not on the line through {self.sizes[0]} and {self.sizes[1]} within their buckets")
        values = []
        for (i, *_), a, b in self.moves:
            v = a + (b - a) * t
            if v.denominator != 1 or v < 0:
                raise NotAFamily(f"a size of op {i} is {v} at sizes {sizes}")
            values.append(int(v))
        return values

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
            self._ops, self._changed_set = ops, changed
        return self._ops, self._changed_set

    def replacements(self, sizes: tuple[int, ...], also: frozenset[Operation] = frozenset()
                     ) -> tuple[dict[Operation, Operation], dict[SSAValue, SSAValue]]:  # fmt: skip
        """The ops of the function body that these sizes change, each mapped to a verified copy at these sizes
        (the copies read each other's values, and the function's arguments as new values of their new types: the
        second dict maps those to the arguments); the rest of the IR is shared with the first compile.
        NotAFamily where the sizes are not covered or a copy fails to verify. The ops in `also` are copied too
        (a torch call whose constant arguments move: its step must be built again)."""
        values = self._values(sizes)
        ops, changed = self._changed()
        fn = next(op for op in ops if isinstance(op, func.FuncOp))
        block = fn.body.block
        arg_types = [a.type for a in block.args]
        for ((i, kind, key, path), _a, _b), v in zip(self.moves, values):
            if ops[i] is fn and kind == "arg":
                arg_types[key[2]] = _replace(arg_types[key[2]], path, v)
        scratch = Block(arg_types=arg_types)  # the arguments at these sizes, for the copies to read
        mapper: dict = dict(zip(block.args, scratch.args))
        copies: dict[Operation, Operation] = {}
        replaced: dict[Operation, Operation] = {}
        index = {op: i for i, op in enumerate(ops)}
        for op in block.ops:
            if (index[op] in changed or op in also) and not isinstance(op, func.ReturnOp):
                new = replaced[op] = op.clone(mapper)
                copies.update(zip(op.walk(), new.walk()))
        for ((i, kind, key, path), _a, _b), v in zip(self.moves, values):
            if ops[i] in copies:
                _put(copies[ops[i]], kind, key, path, v)
        try:
            _verify([copies[ops[i]] for i in sorted(changed) if ops[i] in copies])
        except VerifyException as e:
            raise NotAFamily(f"the IR at sizes {sizes} does not verify: {str(e).splitlines()[0]}") from None
        return replaced, dict(zip(scratch.args, block.args))

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
    return ShapeFamily(first, sizes, moves)


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
