"""The fusion pattern API: a pattern picks a set of ops around an anchor; a template implements the region.

`register_fusion_pattern(name, pattern, lowering, priority)` is the one API, for users and built-ins alike.
`pattern` is either
  - a *DAG spec*: a function of placeholder operands returning `P.<op>(...)` expressions, e.g.
        def ln_linear_gelu(x, w, b, W):
            return P.gelu(P.linear(P.layer_norm(x, w, b), W))
    matched exactly (op kinds and operand structure; a placeholder used twice must bind one value;
    intermediate values must have no users outside the match; a placeholder in the place of an optional
    operand, `b` in `P.linear(x, W, b)`, also matches the op without it and binds None), or
  - a *matcher*: `fn(op, plan) -> Match | list[Operation] | None`, given an unclaimed anchor op and the planner
    (`plan.free(op)`, `plan.convex(ops)`), returning the region's ops (a growing rule: the built-in patterns).
`lowering` names a registered template ("gemm", "attention", "row", or one from `register_template`) or is a
Python callable run on the region's input tensors: for a DAG spec `fn(**placeholders, **attrs)` (tensors by
placeholder name), for a matcher `fn(*inputs, **attrs)`; attrs are the region ops' properties, keyed
`<op>_<property>` (e.g. `layer_norm_eps`). A callable is registered as the pattern's own `CallTemplate`.
Before claiming a region, the planner asks its template (`can_lower`): what the template cannot lower is not
fused; and a user pattern's region is lowered once while planning: a lowering that fails leaves the ops to
the other patterns, with a note. `P` lists the ops a pattern can name (`dir(P)`, `P.ops()`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xdsl.ir import Operation, SSAValue
from xdsl.irdl import OptOperandDef

from ..dialects import ALL_OPS
from .templates import TEMPLATES, CallTemplate, register_template


@dataclass(frozen=True)
class Match:
    """A matcher's answer: the region's ops; `profile` asks the runtime to time the region's kernel against its
    reference before keeping it (a lone GEMM gains nothing from fusion and may be faster on cuBLAS)."""

    ops: list[Operation]
    profile: bool = False


@dataclass
class FusionPattern:
    name: str
    matcher: Callable[[Operation, Any], Match | list[Operation] | None]
    template: str  # the registered template that lowers the pattern's regions
    priority: int = 0
    doc: str = ""
    dag: DagPattern | None = None
    builtin: bool = False  # a built-in pattern: not lowered while planning, no note when it matches nothing

    def match(self, op: Operation, plan: Any) -> Match | None:
        found = self.matcher(op, plan)
        if not found:
            return None
        return found if isinstance(found, Match) else Match(list(found))


PATTERNS: dict[str, FusionPattern] = {}


def register_fusion_pattern(
    name: str, pattern: Callable, lowering: str | Callable, priority: int = 0, doc: str = "", builtin: bool = False
) -> FusionPattern:
    """Register a fusion pattern (higher priority is tried first; built-ins use 10..100). A template named by
    `lowering` must be registered already (`register_template`), else ValueError listing the registered ones.
    `builtin`: the package's own patterns (their templates register later, with codegen)."""
    params = list(inspect.signature(pattern).parameters)
    is_matcher = params[:2] == ["op", "plan"]
    if isinstance(lowering, str) and not builtin and lowering not in TEMPLATES:
        raise ValueError(
            f"fusion pattern {name!r}: no template named {lowering!r}; registered templates: "
            f"{', '.join(sorted(TEMPLATES)) or 'none'} (or pass a Python callable)"
        )
    dag = None if is_matcher else DagPattern(pattern)
    matcher = pattern if dag is None else dag.match
    if callable(lowering):
        register_template(CallTemplate(name, lowering, dag))
        template = name
    else:
        template = lowering
    fp = FusionPattern(name, matcher, template, priority, doc or (pattern.__doc__ or "").strip(), dag, builtin)
    PATTERNS[name] = fp
    return fp


def unregister_fusion_pattern(name: str) -> None:
    fp = PATTERNS.pop(name, None)
    if fp is not None and isinstance(TEMPLATES.get(fp.template), CallTemplate) and fp.template == name:
        TEMPLATES.pop(name, None)


def patterns_by_priority() -> list[FusionPattern]:
    return sorted(PATTERNS.values(), key=lambda p: -p.priority)


# -- DAG specs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placeholder:
    name: str


@dataclass(frozen=True)
class Node:
    op: type[Operation]
    operands: tuple
    props: tuple = ()


class _OpBuilder:
    """`P.<short name>(*operands, **props)`: a pattern node for the dl op `dl.<short name>`; `dir(P)` and
    `P.ops()` list the names, `help(P.<name>)` shows the op's operands and properties."""

    def __init__(self):
        self._ops = {o.name.removeprefix("dl."): o for o in ALL_OPS if o.name not in ("dl.fused", "dl.yield")}

    def __getattr__(self, short: str):
        op = self._ops.get(short)
        if op is None:
            raise AttributeError(f"no dl op named dl.{short}; P's ops: {', '.join(sorted(self._ops))}")

        def node(*operands, **props) -> Node:
            return Node(op, operands, tuple(sorted(props.items())))

        node.__name__ = short
        node.__doc__ = f"{op.name}({signature(op)}): {(op.__doc__ or '').strip().splitlines()[0] if op.__doc__ else ''}"
        return node

    def __dir__(self) -> list[str]:
        return sorted(self._ops)

    def ops(self) -> dict[str, str]:
        """{short name: its operands and properties} for every op a pattern can name."""
        return {short: signature(op) for short, op in sorted(self._ops.items())}

    def __repr__(self) -> str:
        return f"P: pattern nodes for the dl ops {', '.join(sorted(self._ops))}"


def signature(op: type[Operation]) -> str:
    """An op's operands (optional ones with `?`, variadic with `*`) and properties, e.g.
    `input, weight, bias?; eps`."""
    d = op.get_irdl_definition()
    operands = [n + ("?" if isinstance(o, OptOperandDef) else "*" if type(o).__name__ == "VarOperandDef" else "")
                for n, o in d.operands]  # fmt: skip
    props = [n for n in d.properties if n != "operandSegmentSizes"]
    return ", ".join(operands) + (f"; {', '.join(props)}" if props else "")


P = _OpBuilder()


@dataclass
class DagPattern:
    fn: Callable
    root: Node = field(init=False)

    def __post_init__(self):
        names = list(inspect.signature(self.fn).parameters)
        self.root = self.fn(*[Placeholder(n) for n in names])
        if not isinstance(self.root, Node):
            raise TypeError("a fusion pattern must return a P.<op>(...) expression")

    @property
    def names(self) -> list[str]:
        return list(inspect.signature(self.fn).parameters)

    def bind(self, op: Operation) -> dict[str, SSAValue] | None:
        """The values the placeholders bind to when the pattern's root matches `op`."""
        binding: dict[str, SSAValue] = {}
        return binding if self._match(self.root, op, binding, []) else None

    def match(self, op: Operation, plan: Any) -> Match | None:
        binding: dict[str, SSAValue] = {}
        matched: list[Operation] = []
        if not self._match(self.root, op, binding, matched):
            return None
        inner = {o for o in matched if o is not op}
        for o in inner:  # intermediates are used only inside the match
            if any(u.operation not in matched for r in o.results for u in r.uses):
                return None
        return Match(matched)

    def _match(self, node: Node, op: Operation, binding: dict, matched: list) -> bool:
        if type(op) is not node.op or not _operands_fit(node, op):
            return False
        for key, want in node.props:
            have = op.properties.get(key)
            if have is None or _prop_value(have) != want:
                return False
        matched.append(op)
        for pat in node.operands[len(op.operands) :]:  # optional operands the op lacks (a linear's bias)
            if binding.setdefault(pat.name, None) is not None:
                return False
        for pat, val in zip(node.operands, op.operands):
            if isinstance(pat, Placeholder):
                if binding.setdefault(pat.name, val) is not val:
                    return False
            elif isinstance(pat, Node):
                owner = val.owner
                if not isinstance(owner, Operation) or not self._match(pat, owner, binding, matched):
                    return False
            else:
                raise TypeError(f"bad pattern operand {pat!r}")
        return True


def _operands_fit(node: Node, op: Operation) -> bool:
    """The pattern names every operand the op has; the ones it names beyond them are placeholders for optional
    operands the op lacks."""
    if len(op.operands) == len(node.operands):
        return True
    if len(op.operands) > len(node.operands):
        return False
    defs = op.get_irdl_definition().operands
    missing = node.operands[len(op.operands) :]
    optional = [isinstance(d, OptOperandDef) for _, d in defs]
    return (
        len(defs) == len(node.operands)
        and all(isinstance(p, Placeholder) for p in missing)
        and all(optional[len(op.operands) :])
    )


def _prop_value(attr) -> Any:
    for getter in (lambda a: a.data, lambda a: a.value.data):
        try:
            return getter(attr)
        except AttributeError:
            continue
    return attr
