"""The template protocol: what a fused region's template promises, and the registry the planner asks.

A template implements a kind of region. The planner grows and checks regions only through
`can_lower(ops, inputs) -> plan | WhyNot`; the lowering pass turns a `dl.fused` op into a `Lowered` record
through `lower(fused, plan, name)`. A `dl.fused` op names its template (`FusedOp.template_name`), and
`get_template` resolves the name. Codegen templates (row, gemm, attention) derive from `KernelTemplate`:
`emit(fused, plan, name)` writes the kernel, `space(plan)` declares its tunable configs (drawn from `params`,
every parameter and its choices); the built-in ones are `PlannedTemplate`s, made from an analyze, a build and a
space function. A user pattern whose lowering is a Python callable gets a `CallTemplate`.

    register_template(MyTemplate())          # a user template, next to the built-in ones
    register_fusion_pattern("mine", dag, "my_template")
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from xdsl.ir import Operation, SSAValue

from ..dialects import ConstantOp, FusedOp

if TYPE_CHECKING:
    from ..tuning.space import SearchSpace


@dataclass(frozen=True)
class WhyNot:
    """A template's reason for not taking a region."""

    reason: str

    def __str__(self) -> str:
        return self.reason


# -- what lowering a region gives ------------------------------------------------------------------------------


@dataclass
class KernelLowering:
    """A generated kernel (`codegen.kernel.Kernel`: source, launch) and its search space."""

    kernel: Any
    space: SearchSpace

    @property
    def name(self) -> str:
        return self.kernel.name


@dataclass
class CallLowering:
    """A Python callable run on the region's input tensors: fn(*inputs, **attrs), or with `arg_names` (a DAG
    pattern's placeholders) fn(**named, **attrs). attrs are the region ops' properties, `<op>_<property>`."""

    name: str
    fn: Callable
    attrs: dict = field(default_factory=dict)
    arg_names: list[str] | None = None

    def __call__(self, *tensors):
        if self.arg_names is None:
            return self.fn(*tensors, **self.attrs)
        return self.fn(**dict(zip(self.arg_names, tensors)), **self.attrs)


@dataclass
class ReferenceLowering:
    """No kernel: the region runs its ops' torch references, for `reason`; `failure`: the region should have
    had a kernel (the runtime warns, or raises under strict=True), not a planned reference (empty tensors)."""

    name: str
    reason: str
    failure: bool = True


Lowered = KernelLowering | CallLowering | ReferenceLowering


# -- the protocol ----------------------------------------------------------------------------------------------


@runtime_checkable
class Template(Protocol):
    name: str

    def can_lower(self, ops: list[Operation], inputs: list[SSAValue]) -> Any | WhyNot:
        """A plan for lowering these ops (inputs: the values they read from outside), or why not."""

    def lower(self, fused: FusedOp, plan: Any, name: str) -> Lowered:
        """The region's implementation, from the plan `can_lower` gave for its ops."""


class KernelTemplate(abc.ABC):
    """A template that generates a Triton kernel: `can_lower` plans, `emit` writes the kernel (a
    `codegen.kernel.Kernel`), `space` declares its configs, drawn from `params` (every parameter and its choices)."""

    name: str = ""
    params: dict[str, list] = {}

    @abc.abstractmethod
    def can_lower(self, ops: list[Operation], inputs: list[SSAValue]) -> Any | WhyNot: ...

    @abc.abstractmethod
    def emit(self, fused: FusedOp, plan: Any, name: str) -> Any: ...

    @abc.abstractmethod
    def space(self, plan: Any) -> SearchSpace: ...

    def lower(self, fused: FusedOp, plan: Any, name: str) -> KernelLowering:
        kernel = self.emit(fused, plan, name)
        kernel.space = self.space(plan)
        return KernelLowering(kernel, kernel.space)


class PlannedTemplate(KernelTemplate):
    """A KernelTemplate made of three functions, as the built-in templates are: `analyze(ops, inputs)` returns the
    plan or the reason it cannot lower them, `build(fused, plan, name)` the kernel, `space(plan)` its configs."""

    def __init__(self, name: str, params: dict[str, list], analyze: Callable[[list[Operation], list[SSAValue]], Any],
                 build: Callable[[FusedOp, Any, str], Any], space: Callable[[Any], SearchSpace]) -> None:  # fmt: skip
        self.name, self.params = name, params
        self._analyze, self._build, self._space = analyze, build, space

    def can_lower(self, ops: list[Operation], inputs: list[SSAValue]) -> Any | WhyNot:
        plan = self._analyze(ops, inputs)
        return WhyNot(plan) if isinstance(plan, str) else plan

    def emit(self, fused: FusedOp, plan: Any, name: str) -> Any:
        return self._build(fused, plan, name)

    def space(self, plan: Any) -> SearchSpace:
        return self._space(plan)


@dataclass
class CallTemplate:
    """The template of a pattern lowered to a Python callable (see `register_fusion_pattern`)."""

    name: str
    fn: Callable
    dag: Any = None  # the pattern's DagPattern, to bind its placeholders to the region's inputs

    def can_lower(self, ops: list[Operation], inputs: list[SSAValue]) -> Any | WhyNot:
        return ops

    def lower(self, fused: FusedOp, plan: Any, name: str) -> CallLowering:
        attrs = {}
        for o in fused.body_ops:
            if isinstance(o, ConstantOp):
                continue
            short = o.name.removeprefix("dl.")
            for k, v in o.properties.items():
                if k != "operandSegmentSizes":
                    attrs[f"{short}_{k}"] = _py(v)
        names = None
        if self.dag is not None:
            binding = self.dag.bind(fused.yielded.values[0].owner) or {}
            by_value = {v: k for k, v in binding.items() if v is not None}
            names = [by_value.get(a, f"arg{i}") for i, a in enumerate(fused.block.args)]
            attrs |= {k: None for k, v in binding.items() if v is None}  # an optional operand the op lacks
        self._check_arguments(names or len(fused.block.args), attrs)
        return CallLowering(name, self.fn, attrs, names)

    def _check_arguments(self, inputs: list[str] | int, attrs: dict) -> None:
        """Raise TypeError when the callable cannot be called with the region's inputs and attrs (found while
        planning, so the region's ops go to the other patterns instead of running their reference)."""
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return
        try:
            if isinstance(inputs, int):
                sig.bind(*[None] * inputs, **attrs)
            else:
                sig.bind(**dict.fromkeys(inputs), **attrs)
        except TypeError as e:
            given = inputs if isinstance(inputs, list) else [f"{inputs} positional tensors"]
            raise TypeError(
                f"the lowering {getattr(self.fn, '__name__', self.fn)!r} of pattern {self.name!r} cannot take the "
                f"region's arguments ({', '.join([*given, *attrs])}): {e}"
            ) from None


def _py(attr):
    for get in (lambda a: a.value.data, lambda a: a.data, lambda a: a.get_values()):
        try:
            return get(attr)
        except AttributeError:
            continue
    return attr


# -- the registry ----------------------------------------------------------------------------------------------

TEMPLATES: dict[str, Template] = {}


def register_template(template: Template) -> Template:
    """Make `template` available under `template.name` to patterns, the planner and lowering."""
    if not getattr(template, "name", None):
        raise ValueError("a template needs a name")
    TEMPLATES[template.name] = template
    return template


def unregister_template(name: str) -> None:
    TEMPLATES.pop(name, None)


def get_template(name: str) -> Template:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise KeyError(f"no template named {name!r} (registered: {', '.join(sorted(TEMPLATES)) or 'none'})") from None


def can_lower(template: str, ops: list[Operation], inputs: list[SSAValue]) -> Any | WhyNot:
    """Ask the named template about a region (an unknown name is a WhyNot, not an error)."""
    t = TEMPLATES.get(template)
    if t is None:
        return WhyNot(f"no template named {template!r}")
    return t.can_lower(ops, inputs)
