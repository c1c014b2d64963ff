"""FX graph → `dl` IR: one `func.func @forward` with shapes and dtypes from a fake-tensor run.

Every node's example value is computed first (FakeTensorMode, so nothing runs for real and no
buffer is mutated). Nodes whose value holds no tensor (sizes, dtypes, asserts) are evaluated at
compile time: the compiled module is specialized on its input signature. Tensor nodes go through
the converter table (`converters.py`); a node it does not know, or whose ops the dialect's verifiers
reject (an int or fp64 tensor, say), becomes an opaque `dl.torch_call` run by PyTorch.

In-place ops are functionalized (`mutation.py`): the written tensor gets a new SSA value that later
readers see, and the final value of a written graph input or module buffer is an extra result of
`forward` that the compiled module copies back (`Imported.writes`). A write that other live tensors
would observe through a view is refused with the op's source line.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree
from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, UnitAttr, i64
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import VerifyException

from ..dialects import ConstantOp, ConvertOp, ParamOp, TorchCallOp
from ..dialects.types import COMPUTE_DTYPES, has_xdsl_dtype, tensor_type, xdsl_dtype
from ..errors import DataDependent, EagerOnly, FrontendError
from . import complex as complex_parts
from .capture import Captured, quiet_fake_tensor_log, source_line, with_sizes
from .converters import CONVERTERS, Unsupported, converter_key, slice_decisions
from .masks import causal_offset, is_random
from .mutation import (hidden_writes, mutated_arg, out_of_place, put, replay, reshapes_in_place, schema_writes,
                       view_steps)


@dataclass(frozen=True)
class SymLeaf:
    """An int output that is a polynomial of int inputs, as dynamo traced it (a static sliding-window cache returns
    its length counter `s + 1`): `expr` over a0, a1, ... (sympy's text), `positions` the placeholders a0, a1, ...
    are. Computed at each call from that call's ints, so the output is right for every value and two compiles
    differing in the counter return the same leaf (a shape family instantiates the other values)."""

    expr: str
    positions: tuple[int, ...]

    def __call__(self, flat: list) -> int:
        return int(_polynomial(self.expr, len(self.positions))(*[flat[i] for i in self.positions]))


@functools.lru_cache(maxsize=256)
def _polynomial(expr: str, n: int) -> Callable[..., int]:
    import sympy

    return sympy.lambdify(sympy.symbols(f"a0:{n}"), sympy.sympify(expr), modules=[{}])


def sym_leaf(value: Any, placeholders: list[torch.fx.Node]) -> SymLeaf | None:
    """The SymLeaf of an output's example value, where it is a SymInt whose expression is a polynomial with integer
    coefficients of the SymInt placeholders' symbols (None otherwise: it is then a constant of this
    specialization)."""
    if not isinstance(value, torch.SymInt):
        return None
    import sympy

    expr = value.node.expr
    where = {}
    for i, n in enumerate(placeholders):
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
            where.setdefault(v.node.expr, i)
    syms = sorted(expr.free_symbols, key=str)
    if not syms or any(s not in where for s in syms):
        return None
    terms = list(sympy.preorder_traversal(expr))
    if not all(isinstance(a, sympy.Symbol | sympy.Integer | sympy.Add | sympy.Mul | sympy.Pow) for a in terms):
        return None  # (floor division, min, max, modulo: a constant per specialization, as any other value)
    if any(isinstance(a, sympy.Pow) and not (a.exp.is_Integer and a.exp > 0) for a in terms):
        return None
    names = sympy.symbols(f"a0:{len(syms)}")
    canonical = expr.xreplace(dict(zip(syms, names)))
    return SymLeaf(str(canonical), tuple(where[s] for s in syms))


def unread_ints(gm: torch.nn.Module) -> frozenset[int]:
    """Positions of a dynamo graph's int inputs that no op reads: each reaches the outputs only through int
    arithmetic whose every result is a polynomial of the int inputs (computed per call: `SymLeaf`), and no other
    input's sizes hold its symbol. One specialization serves every value of such an int, so it is left out of the
    specialization key: a static sliding-window cache's length counter (a new value every decode token) would
    otherwise make each token a new specialization, run without a CUDA graph."""
    graph = getattr(gm, "graph", None)
    if not isinstance(graph, torch.fx.Graph):  # (a module, or a TorchScript module's graph)
        return frozenset()
    import sympy
    from torch.fx.experimental.symbolic_shapes import free_symbols

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    examples = [n.meta.get("example_value") for n in placeholders]
    unread = []
    for i, (node, value) in enumerate(zip(placeholders, examples)):
        if not isinstance(value, torch.SymInt) or not isinstance(value.node.expr, sympy.Symbol):
            continue
        if any(value.node.expr in free_symbols(v) for j, v in enumerate(examples) if j != i and v is not None):
            continue
        seen, todo, read = set(), [node], False
        while todo and not read:
            for user in todo.pop().users:
                if user.op == "output" or user in seen:
                    continue
                out = user.meta.get("example_value")
                read = user.op != "call_function" or sym_leaf(out, placeholders) is None
                if read:
                    break
                seen.add(user)
                todo.append(user)
        if not read:
            unread.append(i)
    return frozenset(unread)


@dataclass
class Imported:
    """The IR of one specialization plus what runs beside it."""

    module: ModuleOp
    params: dict[str, torch.Tensor]  # dl.param name -> live tensor (parameters, buffers, constants)
    calls: dict[str, Callable]  # dl.torch_call node -> fn(*tensors) -> tuple of tensors
    sources: dict[str, str]  # SSA name hint / node name -> "file:line (code)"
    arg_positions: list[int]  # placeholder index of each func argument
    out_leaves: list  # per output leaf: ("value", result index), ("const", python value) or ("sym", SymLeaf)
    out_spec: Any
    notes: list[str] = field(default_factory=list)
    param_placeholders: dict[int, str] = field(default_factory=dict)  # placeholder index -> param name
    # in-place writes to copy back after each call: ("input", placeholder index, result index) or
    # ("param", param name, result index); those results follow the outputs
    writes: list[tuple[str, Any, int]] = field(default_factory=list)
    # per output value (result index): what eager's output shares storage with, as ("input", placeholder
    # index), ("param", name) or ("output", earlier result index); None where eager's value is unknown
    eager_aliases: list[frozenset | None] = field(default_factory=list)
    # per output value: eager's output is a contiguous tensor (a compiled one must be too: `.view` works on it)
    contiguous: list[bool] = field(default_factory=list)
    # inputs the graph only moves to a device (placeholder index -> device), such as a CPU counter the forward
    # calls `.to("cuda")` on: the runtime moves them before the program runs (a copy from the host inside it
    # waits for the GPU to finish all work queued before it, and cannot be captured in a CUDA graph)
    device_moves: dict[int, torch.device] = field(default_factory=dict)
    # function arguments (indices into arg_positions) that are complex inputs, passed as torch.view_as_real of them
    complex_inputs: tuple[int, ...] = ()
    # decisions taken from a tensor's values at this specialization's sizes (a constant mask found causal): they
    # may not hold at other sizes, so no shape family is formed over them
    value_decisions: tuple[str, ...] = ()
    # integers a converter computed from sizes in a way that is not affine in them (a chunk's piece sizes, ceil(n /
    # pieces)), each with the sizes it read: where those differ between two compiles, they form no shape family
    size_decisions: tuple[str, ...] = ()
    # the numbers (and tuples of ints: sizes) the graph's nodes computed at this specialization's sizes, by node
    # name: a shape family lets through integer arithmetic on sizes that do not move (`frontend.sizes_unseen`)
    sizes: dict[str, Any] = field(default_factory=dict)
    # 0-d host tensors of the module read on a device (param name -> device): the program reads a copy there, made
    # again when the tensor changes (`DerivedWeight`), as eager reads such a tensor as a number
    param_devices: dict[str, torch.device] = field(default_factory=dict)
    # output value (result index) -> index into `writes`: eager returns the tensor it wrote itself (`relu_(x)`,
    # `self.n += 1; return self.n`, a cache written by index_copy_), so the call returns that tensor after writing it
    returns_written: dict[int, int] = field(default_factory=dict)
    # per output value: how eager's output views an earlier output or an input (None: it views neither):
    # ("same", kind, key) where it is that tensor, ("view", kind, key, sizes, strides, offset from the base's, the
    # base's sizes, the base's strides) where it is a view of it; kind "output" (result index) or "input"
    # (placeholder index). The call makes such outputs views again (`OutputGuard.views`): code after a graph break
    # may write the base and read the view (before, a view made before a break kept its old values)
    eager_views: list[tuple | None] = field(default_factory=list)

    def program_inputs(self, flat: Any) -> list:
        """The function's arguments from the call's flat inputs."""
        inputs = [flat[i] for i in self.arg_positions]
        for j in self.complex_inputs:
            inputs[j] = torch.view_as_real(inputs[j])
        return inputs


def _is_size(v: Any) -> bool:
    """An int or float (not a bool), or a tuple of ints (torch.Size): what arithmetic on sizes makes."""
    return type(v) in (int, float) or (isinstance(v, tuple) and all(type(x) is int for x in v))


def _moved_to(fn: Callable, dev: torch.device, *args, **kwargs) -> torch.Tensor:
    return fn(*args, **kwargs).to(dev)


def _safe_name(name: str) -> str:
    """A valid xDSL SSA name (xDSL drops a trailing `_<digits>`, so `_0` would become empty)."""
    name = "".join(c if c.isalnum() or c in "_.$-" else "_" for c in name)
    if not name or name[0].isdigit() or not re.sub(r"_\d+$", "", name):
        name = f"v{name}"
    return name


def _has_tensor(value: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value))


_DATA_DEPENDENT = (". What it computes depends on a tensor's values (`.tolist()`, `.item()`, `nonzero`), which one "
                   "graph cannot hold: compile the forward instead (`model.forward = dc.compile(model.forward)`), "
                   "where dynamo runs that code eagerly between compiled graphs")


def _example_values(gm: torch.fx.GraphModule, inputs: list) -> dict[torch.fx.Node, Any]:
    """Run the graph on fake tensors; record every node's value."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import disable_autocast_cache

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    values: dict[torch.fx.Node, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            try:
                out = super().run_node(n)
            except Exception as e:  # noqa: BLE001
                where = source_line(n)
                data = any(k in type(e).__name__ for k in ("DataDependent", "DynamicOutputShape")) or (
                    "data-dependent" in str(e))  # fmt: skip
                error = (DataDependent if data else FrontendError)(
                    f"cannot compute the shape of node '{n.name}' ({n.format_node()})"
                    + (f" at {where}" if where else "")
                    + f": {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    + (_DATA_DEPENDENT if data else "")
                )
                error.node = f"node '{n.name}'" + (f" at {where}" if where else "")
                raise error from e
            if n.op == "get_attr" and isinstance(out, torch.Tensor):  # fake, so views of it share its storage
                out = mode.from_tensor(out, static_shapes=True)
            values[n] = out
            return out

        def call_module(self, target, args, kwargs):
            # (on fake copies of its parameters and buffers: a module that writes its state, BatchNorm's
            # `num_batches_tracked.add_(1)` in training, would write the real ones at every compile)
            mod = self.fetch_attr(target)
            state = {k: mode.from_tensor(v, static_shapes=True) for k, v in (
                *mod.named_parameters(remove_duplicate=False), *mod.named_buffers(remove_duplicate=False))}  # fmt: skip
            return torch.func.functional_call(mod, state, args, kwargs, tie_weights=False)

    fake_inputs = [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x for x in inputs]
    recorder = Recorder(gm)
    recorder.extra_traceback = False  # (the FrontendError names the node and its source line)
    # (autocast's cache off: under autocast a linear casts its weight once per autocast region and keeps the copy,
    # and here that copy would be fake; the compiled program and the caller's own calls in the region then read it)
    # (and nn.MultiheadAttention's fast path off: on fake tensors its native kernel gives an empty tensor for the
    # weights that need_weights=False leaves out, where eager's call returns None; its other path returns None too)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with mode, torch.no_grad(), disable_autocast_cache(), quiet_fake_tensor_log():
            recorder.run(*fake_inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return values


# the ops with converters that torch.autocast runs in its lower precision dtype (every floating operand cast first)
AUTOCAST_LOWER = frozenset({F.linear, torch._C._nn.linear, torch.matmul, operator.matmul, "matmul", "__matmul__",
                            torch.bmm, "bmm", torch.mm, "mm", torch.addmm, "addmm", F.scaled_dot_product_attention,
                            torch._C._nn.scaled_dot_product_attention})  # fmt: skip


class Emitter:
    """What a converter sees: the FX node, its example output `value`, and ways to insert ops
    (named after the node), scalar constants and parameters."""

    def __init__(self, builder: Builder, importer: Importer):
        self.builder = builder
        self.importer = importer
        self.node: torch.fx.Node | None = None
        self.value: Any = None
        self.inserted: list[Operation] = []

    def arg_value(self, i: int) -> Any:
        """The example value of the node's i-th positional argument."""
        a = self.node.args[i]
        return self.importer.values.get(a) if isinstance(a, torch.fx.Node) else a

    def param(self, name: str, t: torch.Tensor) -> SSAValue:
        imp = self.importer
        return imp._emit_param(imp._param_name(name, t), t)

    def emit(self, op: Operation) -> Operation:
        """Insert `op` after verifying it on its own: a verifier's error message prints the op's enclosing module,
        which for a 32-layer model costs a quarter of a second per rejected candidate."""
        try:
            op.verify()
        except VerifyException:
            op.erase()  # (its operands' uses go with it)
            raise
        self.builder.insert(op)
        self.inserted.append(op)
        if self.node is not None:
            for r in op.results:
                r.name_hint = _safe_name(self.node.name)
        return op

    def const(self, value: float, like: SSAValue | None = None) -> SSAValue:
        elem = like.type.element_type if isinstance(like, SSAValue) and isinstance(like.type, TensorType) else None
        if elem is None or not isinstance(like, SSAValue):
            elem = xdsl_dtype(torch.float32)
        return self.emit(ConstantOp(float(value), elem)).results[0]


class Importer:
    def __init__(self, captured: Captured, inputs: list):
        self.captured = captured
        self.gm = captured.gm
        self.inputs = inputs
        self.env: dict[torch.fx.Node, Any] = {}
        self.params: dict[str, torch.Tensor] = {}
        self.param_ids: dict[int, str] = {}
        self.calls: dict[str, Callable] = {}
        self.sources: dict[str, str] = {}
        self.notes: list[str] = []
        self.values: dict[torch.fx.Node, Any] = {}
        # another name of a tensor (an in-place result, a second get_attr) -> the first node naming it
        self.alias_base: dict[torch.fx.Node, torch.fx.Node] = {}
        self.written: dict[torch.fx.Node, SSAValue] = {}  # written input / get_attr node -> its final value
        self.attr_nodes: dict[int, torch.fx.Node] = {}  # id of a module tensor -> the first get_attr of it
        self.order: dict[torch.fx.Node, int] = {}
        self._input_free: dict[torch.fx.Node, bool] = {}
        self._real: dict[torch.fx.Node, Any] = {}
        self.written_bases: set[torch.fx.Node] = set()  # tensors some node writes in place
        self.param_devices: dict[str, torch.device] = {}
        # a view eager shares storage with (of its first argument), as the view steps the IR takes of that
        # argument's value: a write through it is put back into the whole tensor (`mutation.put`)
        self.views: dict[torch.fx.Node, tuple[torch.fx.Node, tuple]] = {}
        self.complex_inputs: list[int] = []  # function arguments that are complex inputs' real views
        self._by_storage: dict[int, list[torch.fx.Node]] | None = None  # storage -> nodes whose value is in it
        self.value_decisions: list[str] = []
        self.size_decisions: list[str] = []
        self.autocast_modes: list = []  # autocast regions the graph has entered and not left yet (`_switch`)
        self.grad_at_call = torch.is_grad_enabled()  # (the call being compiled's grad mode: the graph's outer one)

    def run(self) -> Imported:
        values = self.values = _example_values(self.gm, self.inputs)
        self.order = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        arg_types, arg_positions, param_placeholders = [], [], {}
        for i, (n, v) in enumerate(zip(placeholders, self.inputs)):
            if isinstance(v, torch.nn.Parameter):  # dynamo lifts parameters to inputs: keep them as params
                param_placeholders[i] = self._param_name(n.name, v)
            elif isinstance(v, torch.Tensor):
                if v.is_complex():  # (a complex rotary table dynamo passes in): taken as its real view [..., 2]
                    self.complex_inputs.append(len(arg_positions))
                    v = torch.view_as_real(v)
                if not has_xdsl_dtype(v.dtype):
                    raise FrontendError(f"input '{n.target}' has dtype {v.dtype}, which dlblas_compiler does not support")
                arg_types.append(tensor_type(v.shape, v.dtype))
                arg_positions.append(i)
        block = Block(arg_types=arg_types)
        self.emitter = Emitter(Builder(InsertPoint.at_end(block)), self)
        args = iter(block.args)
        for i, (n, v) in enumerate(zip(placeholders, self.inputs)):
            if i in param_placeholders:
                self.env[n] = self._emit_param(param_placeholders[i], v)
            elif isinstance(v, torch.Tensor):
                arg = next(args)
                arg.name_hint = _safe_name(str(n.target))
                self.env[n] = complex_parts.of_real_view(self, arg) if v.is_complex() else arg
                same = next((m for m, u in zip(placeholders[:i], self.inputs) if _same_view(u, v)), None)
                if same is not None:  # the same tensor passed twice: one value, a write to either updates both
                    self.alias_base[n] = self.alias_base.get(same, same)
                    self.env[n] = self.env[same]
            else:
                self.env[n] = v
        out_node = None
        try:
            for n in self.gm.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    out_node = n
                    continue
                self._convert(n, values[n])
        finally:
            for mode in reversed(self.autocast_modes):  # (entered by the graph and not left: an error on the way)
                mode.__exit__(None, None, None)
        assert out_node is not None
        self._mark_causal_masks()
        # the output structure with every node replaced by its value: SSA values (possibly inside containers a
        # converter or a container constructor returned) and their eager example values, flattened in step
        leaves, spec = pytree.tree_flatten(_plain(out_node.args[0], self.env), is_leaf=_is_ssa)
        if any(isinstance(v, complex_parts.Complex) for v in leaves):
            raise FrontendError("an output is a complex tensor (complex64 / complex128), which dlblas_compiler does "
                                "not support: return torch.view_as_real(...) of it")
        fakes = pytree.tree_leaves(_plain(out_node.args[0], self.values))
        if len(fakes) != len(leaves):
            fakes = [None] * len(leaves)
        # (what dynamo traced each output as: an int output's symbolic expression, `sym_leaf`)
        traced = pytree.tree_leaves(_plain(out_node.args[0], {n: n.meta.get("example_value") for n in self.gm.graph.nodes}))
        if len(traced) != len(leaves):
            traced = [None] * len(leaves)
        results, out_leaves, out_fakes = [], [], []
        for v, fake, symbolic in zip(leaves, fakes, traced):
            if not isinstance(v, SSAValue) and (sym := sym_leaf(symbolic, placeholders)) is not None:
                out_leaves.append(("sym", sym))
            elif isinstance(v, SSAValue):
                out_leaves.append(("value", len(results)))
                results.append(v)
                out_fakes.append(fake if isinstance(fake, torch.Tensor) else None)
            elif isinstance(fake, torch.Tensor):
                raise FrontendError(f"an output holds a tensor inside a {type(v).__name__} that cannot be flattened")
            else:
                out_leaves.append(("const", v))
        eager_aliases, contiguous, eager_views = self._output_layouts(out_fakes, placeholders, param_placeholders)
        writes, returns_written = [], {}
        for j, f in enumerate(out_fakes):
            for w, node in enumerate(self.written):
                if _same_tensor(f, self.values.get(node)):
                    returns_written[j] = w
        for node, v in self.written.items():
            if node.op == "placeholder":
                i = placeholders.index(node)
                writes.append(("param", param_placeholders[i], len(results)) if i in param_placeholders
                              else ("input", i, len(results)))  # fmt: skip
            else:
                writes.append(("param", self._param_name(node.target, self._get_attr(node.target)), len(results)))
            results.append(v)
        self.emitter.builder.insert(func.ReturnOp(*results))
        fn = func.FuncOp("forward", (arg_types, [r.type for r in results]), Region(block))
        module = ModuleOp([fn])
        module.verify()
        moves = {i: dev for i, n in enumerate(placeholders) if i in arg_positions and (dev := self._moved(n)) is not None}
        return Imported(
            module, self.params, self.calls, self.sources, arg_positions, out_leaves, with_sizes(spec), self.notes,
            param_placeholders, writes, eager_aliases, contiguous, moves, tuple(self.complex_inputs),
            tuple(self.value_decisions), tuple(self.size_decisions),
            {n.name: v for n, v in values.items() if _is_size(v)}, self.param_devices, returns_written, eager_views,
        )  # fmt: skip

    # -- values that depend on no input ------------------------------------------------------------
    def input_free(self, n: torch.fx.Node) -> bool:
        """n computes the same value on every call of the specialization: a size or dtype, or torch ops on
        constants and sizes only (torch.arange, comparisons, indexing...), with no graph input's values, module
        state, random number or in-place write among its ancestors."""
        known = self._input_free.get(n)
        if known is None:
            known = n.op in ("call_function", "call_method") and (
                not _has_tensor(self.values.get(n))  # a size or dtype: fixed for the specialization
                or not is_random(n)
                and mutated_arg(n, self.gm) is None
                and all(self.input_free(m) for m in n.all_input_nodes)
            )
            self._input_free[n] = known
        return known

    def _real_value(self, n: torch.fx.Node) -> Any:
        """The value of an input-free node, computed for real (once)."""
        if n not in self._real and not _has_tensor(self.values.get(n)):
            self._real[n] = self.values.get(n)
        if n not in self._real:
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), self._real_value)
            with torch.no_grad():
                self._real[n] = self._callable(n)(*args, **kwargs)
        return self._real[n]

    def _unwritten_input_free(self, n: torch.fx.Node) -> bool:
        """n and every node it is computed from are input-free, and none of them is written in place later."""
        seen, todo = set(), [n]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            if m.op != "placeholder" and not _has_tensor(self.values.get(m)):
                continue  # a size: fixed for the specialization, whatever tensor it was read from
            if not self.input_free(m) or self.alias_base.get(m, m) in self.written_bases:
                return False
            todo.extend(m.all_input_nodes)
        return True

    def _mark_causal_masks(self) -> None:
        """An attention mask made from constants alone that keeps the keys j <= i + d of row i: `d` is recorded
        on the op that makes it (`causal_offset`), for `recognize` (frontend/masks.py)."""
        for n in self.gm.graph.nodes:
            if n.op != "call_function" or n.target not in (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention):
                continue
            mask = n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None)
            if not isinstance(mask, torch.fx.Node) or not self._unwritten_input_free(mask):
                continue
            base = self.alias_base.get(mask, mask)  # (a view of the mask that is the whole mask shares its value)
            v = self.env.get(mask)
            if not isinstance(v, SSAValue) or not isinstance(v.owner, TorchCallOp) or v.owner.node.data != _safe_name(base.name):
                continue
            value = self._real_value(mask)
            d = causal_offset(value) if isinstance(value, torch.Tensor) else None
            if d is not None:
                v.owner.attributes["causal_offset"] = IntegerAttr(d, i64)
                self.value_decisions.append(f"the mask of {n.name} was found causal (offset {d}) from its values at these sizes")

    def _moved(self, n: torch.fx.Node) -> torch.device | None:
        """The device a host input is only ever moved to (`.to(device)`, `.cuda()` by every user), or the one a
        host scalar is read on (`_host_scalar`), else None."""
        example = self.values.get(n)
        if not isinstance(example, torch.Tensor) or example.device.type != "cpu" or not n.users:
            return None
        if (dev := self._host_scalar(n)) is not None:
            return dev
        devices = set()
        for u in n.users:
            moves = (u.op == "call_method" and u.target in ("to", "cuda")) or (
                u.op == "call_function" and u.target in (torch.Tensor.to, torch.Tensor.cuda)
            )
            out = self.values.get(u)
            if not moves or u.args[0] is not n or not isinstance(out, torch.Tensor) or out.dtype != example.dtype:
                return None
            devices.add(out.device)
        (dev,) = devices if len(devices) == 1 else (None,)
        return dev if dev is not None and dev.type != "cpu" else None

    def _host_scalar(self, n: torch.fx.Node) -> torch.device | None:
        """The device every user of a 0-d host tensor computes on, where that is one device other than the CPU:
        eager reads such a tensor as a number (`x.masked_fill(m, torch.tensor(-2.5))` on the GPU), a kernel
        cannot read host memory, so the program reads a copy on that device (made before it runs)."""
        example = self.values.get(n)
        if not isinstance(example, torch.Tensor) or example.device.type != "cpu" or example.dim() != 0 or not n.users:
            return None
        devices = set()
        for u in n.users:
            out = [v for v in pytree.tree_leaves(self.values.get(u)) if isinstance(v, torch.Tensor)]
            if u.op == "output" or not out:
                return None
            devices.update(v.device for v in out)
        (dev,) = devices if len(devices) == 1 else (None,)
        return dev if dev is not None and dev.type != "cpu" else None

    def _output_layouts(
        self, fakes: list, placeholders: list, param_placeholders: dict[int, str]
    ) -> tuple[list[frozenset | None], list[bool], list[tuple | None]]:
        """From eager's example outputs: what each shares storage with (inputs, parameters, earlier outputs),
        whether it is contiguous, and how it views an earlier output or an input (`Imported.eager_views`)."""
        owners: dict[int, set] = {}
        for i, n in enumerate(placeholders):
            if (st := _storage(self.values.get(n))) is not None:
                owners.setdefault(st, set()).add(("input", i))
        for n in self.gm.graph.nodes:
            name = self.param_ids.get(id(self._get_attr(n.target))) if n.op == "get_attr" else None
            if name is not None and (st := _storage(self.values.get(n))) is not None:
                owners.setdefault(st, set()).add(("param", name))
        for i, name in param_placeholders.items():
            if (st := _storage(self.values.get(placeholders[i]))) is not None:
                owners.setdefault(st, set()).add(("param", name))
        aliases, contiguous, seen = [], [], {}
        views: list[tuple | None] = []
        inputs = {_storage(self.values.get(n)): i for i, n in enumerate(placeholders) if i not in param_placeholders}
        for j, f in enumerate(fakes):
            st = _storage(f)
            if st is None:
                aliases.append(None)
                contiguous.append(False)
                views.append(None)
                continue
            aliases.append(frozenset(owners.get(st, set()) | {("output", k) for k in seen.get(st, [])}))
            base = (("output", seen[st][0], fakes[seen[st][0]]) if seen.get(st) else
                    ("input", inputs[st], self.values[placeholders[inputs[st]]]) if st in inputs else None)  # fmt: skip
            views.append(None if base is None or not f.numel() else _view_of(f, *base))
            seen.setdefault(st, []).append(j)
            contiguous.append(f.numel() > 0 and f.is_contiguous())
        return aliases, contiguous, views

    # -- parameters -------------------------------------------------------------------------
    def _param_name(self, name: str, t: torch.Tensor) -> str:
        if id(t) in self.param_ids:
            return self.param_ids[id(t)]
        base = name.removeprefix("L__self___").removeprefix("L_self_").replace("_modules_", ".").replace("_parameters_", ".")
        base = base.strip("_") or "param"
        name, k = base, 1
        while name in self.params:
            name, k = f"{base}_{k}", k + 1
        self.params[name] = t
        self.param_ids[id(t)] = name
        return name

    def _emit_param(self, name: str, t: torch.Tensor) -> SSAValue:
        if not has_xdsl_dtype(t.dtype):
            raise FrontendError(f"parameter '{name}' has dtype {t.dtype}, which dlblas_compiler does not support")
        op = ParamOp(name, tensor_type(t.shape, t.dtype))
        self.emitter.builder.insert(op)
        op.result.name_hint = _safe_name(name.replace(".", "_"))
        return op.result

    # -- nodes --------------------------------------------------------------------------------
    def _resolve(self, a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: self.env[n]) if isinstance(a, (torch.fx.Node, tuple, list, dict)) else a

    def _convert(self, n: torch.fx.Node, value: Any) -> None:
        where = source_line(n)
        if where:
            self.sources[_safe_name(n.name)] = where
        if n.op == "get_attr":
            attr = self._get_attr(n.target)
            if isinstance(attr, torch.Tensor):
                first = self.attr_nodes.setdefault(id(attr), n)
                if first is not n:  # another name of the same tensor: writes to either update both
                    self.alias_base[n] = self.alias_base.get(first, first)
                    self.env[n] = self.env[first]
                    return
                if attr.is_complex():  # a rotary table of complex numbers: its two real parts
                    self.env[n] = complex_parts.param_parts(self, n.target, attr)
                else:
                    name = self._param_name(n.target, attr)
                    if (dev := self._host_scalar(n)) is not None:
                        self.param_devices[name] = dev
                    self.env[n] = self._emit_param(name, attr)
            else:
                self.env[n] = attr
            return
        if n.op == "call_function" and (self._switch(n) or self._refuse_writes(n)):
            return
        written = mutated_arg(n, self.gm)
        if written is not None and isinstance(self.values.get(written), torch.Tensor):  # (n += 1 on an int is no write)
            self._convert_inplace(n, value, written)
            return
        hidden = hidden_writes(n)  # (a batch norm's running statistics in training, ...)
        if hidden and not all(self._sole_reader(n, w) for w in hidden):
            self.env[n], new = self._torch_call(n, value, hidden=tuple(hidden))
            for node, v in zip(hidden, new, strict=True):
                self._convert_inplace(n, value, node, v)
            return
        register_dataclasses(value)
        if not _has_tensor(value):  # sizes, dtypes, asserts: known at compile time
            self.env[n] = value
            return
        same = next((a for a in n.all_input_nodes if _same_view(self.values.get(a), value)), None)
        if same is not None and same in self.env:  # x.to(its device), x.view(x.shape), ...: the tensor itself,
            self.alias_base[n] = self.alias_base.get(same, same)  # so a write through either name updates both
            self.env[n] = self.env[same]
            if n.target is operator.getitem and isinstance(self.values.get(n.args[0]), torch.Tensor):
                self.size_decisions += slice_decisions(n, tuple(self.values[n.args[0]].shape), self._resolve(n.args[1]))
            return
        args, kwargs = self._resolve(n.args), self._resolve(n.kwargs)
        if complex_parts.is_complex(value) or any(isinstance(a, complex_parts.Complex) for a in pytree.tree_leaves(
                (args, kwargs), is_leaf=lambda v: isinstance(v, complex_parts.Complex))):  # fmt: skip
            self.env[n] = complex_parts.convert(self, n, args, kwargs, value)
            return
        if n.op == "call_function" and _container_type(n.target):
            try:  # a namedtuple / dataclass grouping values: built here around the SSA values
                self.env[n] = n.target(*_plain(args, {}), **_plain(kwargs, {}))  # fx's immutable lists: plain
                return
            except Exception:  # noqa: BLE001 - a constructor that inspects its fields runs in PyTorch instead
                pass
        if not _has_ssa((args, kwargs)):
            # A tensor made from nothing (torch.arange, torch.ones...): recomputed by torch on every call.
            self.env[n] = self._torch_call(n, value)
            return
        key = converter_key(n, self.gm)
        out, reason = self._try_converter(n, key, args, kwargs, value)
        if out is None and (recast := self._autocast(n, args, kwargs, value)) is not None:
            cast_key, cast_args, cast_kwargs, casts = recast
            out, _ = self._try_converter(n, cast_key, cast_args, cast_kwargs, value, function=True)
            if out is None:  # (its casts go too)
                for op in reversed(casts):
                    op.detach()
                    op.erase(safe_erase=False)
        if out is not None:
            self.env[n] = out
            self._note_view(n, value)
            return
        self.notes.append(f"torch_call {n.name}: {reason}")
        self.env[n] = self._torch_call(n, value)
        self._note_view(n, value)

    def _switch(self, n: torch.fx.Node) -> bool:
        """A mode a dynamo graph switches inside forward: autocast regions (`with torch.autocast(..)`) are entered
        and left here as the graph does, so the ops between are imported under them (`_autocast`), as their example
        values were computed (they had been dropped as nodes without a tensor: a bf16 autocast inside forward gave
        fp32); gradients turned on inside forward (`with torch.enable_grad()`) need autograd: `EagerOnly`. True
        where `n` is such a switch."""
        if n.target is torch.amp.autocast_mode._enter_autocast:
            mode = n.target(*self._resolve(n.args))  # (entered: left by its _exit_autocast, or at the end of `run`)
            self.autocast_modes.append(mode)
            self.env[n] = mode
            return True
        if n.target is torch.amp.autocast_mode._exit_autocast:
            mode = self.env[n.args[0]]
            self.autocast_modes.remove(mode)
            n.target(mode)
            self.env[n] = None
            return True
        if (n.target in (torch._C._set_grad_enabled, torch.set_grad_enabled) and self._resolve(n.args)[:1] == (True,)
                and not self.grad_at_call):  # (else the exit of a `with torch.no_grad()` block: grad back on)
            raise EagerOnly(f"forward turns gradients on inside ({_describe(n)}{_at(n)}), and the compiled kernels "
                            "build no autograd graph", "compile the code around it, or call the model eagerly")
        return False

    def _refuse_writes(self, n: torch.fx.Node) -> bool:
        """In-place writes of a function call that one functional value cannot follow, refused clearly: an operator
        whose schema writes several arguments, an in-place foreach naming one tensor twice (each write was made to a
        copy of the tensor before the other: 4x where eager gives 3x). False otherwise."""
        name = getattr(n.target, "__name__", "")
        listed = n.args[0] if name.startswith("_foreach_") and name.endswith("_") and n.args else ()
        nodes = [a for a in listed if isinstance(a, torch.fx.Node)] if isinstance(listed, (list, tuple)) else []
        if len(set(nodes)) < len(nodes):
            raise FrontendError(f"{_describe(n)} (node '{n.name}'{_at(n)}) writes one tensor twice in its list, "
                                "which dlblas_compiler does not support; write it once per call")
        if len(schema_writes(n)) > 1:
            raise FrontendError(f"{_describe(n)} (node '{n.name}'{_at(n)}) writes several tensors in place, which "
                                "dlblas_compiler does not support; compile the code around it")
        return False

    def _autocast(self, n: torch.fx.Node, args: Any, kwargs: Any, value: Any) -> tuple | None:
        """Under torch.autocast, an op autocast runs in its lower precision (linear, matmul, attention) first casts
        each floating operand but float64 to the autocast dtype: the same casts as IR ops, so that the converter sees
        eager's dtypes (a cast parameter is then a weight computed once). (converter key, args, kwargs, the casts)
        where this is such an op under autocast, else None. An nn.Linear is taken as F.linear of its parameters."""
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return None
        device = value.device.type
        if not torch.is_autocast_enabled(device) or value.dtype != torch.get_autocast_dtype(device):
            return None
        key = converter_key(n, self.gm)
        if n.op == "call_module" and key is torch.nn.Linear:
            mod = self.gm.get_submodule(n.target)
            params = [self.emitter.param(f"{n.target}.{k}", getattr(mod, k)) for k in ("weight", "bias")
                      if getattr(mod, k) is not None]  # fmt: skip
            key, args = F.linear, (*args, *params)
        elif key not in AUTOCAST_LOWER:
            return None
        target, casts = xdsl_dtype(value.dtype), []
        castable = {xdsl_dtype(t) for t in (torch.float32, torch.float16, torch.bfloat16)} - {target}

        def cast(v: Any) -> Any:
            t = v.type if isinstance(v, SSAValue) else None
            if not isinstance(t, TensorType) or t.element_type not in castable:
                return v
            op = ConvertOp(v, target)
            self.emitter.builder.insert(op)
            op.result.name_hint = _safe_name(f"{n.name}_autocast")
            casts.append(op)
            return op.result

        args, kwargs = pytree.tree_map(cast, (tuple(args), dict(kwargs)))
        return (key, args, kwargs, casts) if casts else None

    def _try_converter(self, n: torch.fx.Node, key: Any, args: Any, kwargs: Any, value: Any,
                       function: bool = False) -> tuple[Any, str]:  # fmt: skip
        """(the converter's SSA value(s) for node n, "") or (None, why not). `function`: `key` names a function's
        converter, whichever kind of node n is."""
        conv = CONVERTERS.get(key)
        if conv is None:
            return None, f"no converter for {_describe(n)}"
        self.emitter.node, self.emitter.value, self.emitter.inserted = n, value, []
        try:
            if n.op == "call_module" and not function:
                out = conv(self.emitter, self.gm.get_submodule(n.target), *args, **kwargs)
            else:
                out = conv(self.emitter, *args, **kwargs)
            self._check(n, out, value)
            return out, ""
        except (Unsupported, VerifyException, TypeError, ValueError) as e:
            for op in reversed(self.emitter.inserted):
                op.detach()
                op.erase(safe_erase=False)
            return None, f"{_describe(n)}: {e}"
        finally:
            self.emitter.node = None

    # -- in-place ops -------------------------------------------------------------------------------
    def _note_view(self, n: torch.fx.Node, value: Any) -> None:
        """Record `n` as a view of its first argument where eager's value shares that argument's storage and
        the IR took it by view steps (see `mutation`)."""
        src = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if src is not None and isinstance(self.env.get(src), (list, tuple)) and src.args:  # a piece of split, chunk,
            src = src.args[0] if isinstance(src.args[0], torch.fx.Node) else None  # unbind: a view of their input
        if src is None or not isinstance(value, torch.Tensor) or not isinstance(self.env.get(src), SSAValue):
            return
        if (st := _storage(value)) is None or st != _storage(self.values.get(src)):
            return
        steps = view_steps(self.env[n], self.env[src])
        if steps is None and n.args[0] is src and n.all_input_nodes == [src] and not _layout_dependent(n):
            steps = TorchView(n)  # (a strided slice, a diagonal, a view of an integer tensor: taken by PyTorch)
        if steps:
            self.views[n] = (src, steps)

    def _root(self, node: torch.fx.Node) -> torch.fx.Node:
        """The tensor a (chain of) tracked view(s) looks into, by its first name."""
        node = self.alias_base.get(node, node)
        while node in self.views:
            node = self.alias_base.get(self.views[node][0], self.views[node][0])
        return node

    def _sole_reader(self, n: torch.fx.Node, w: torch.fx.Node) -> bool:
        """Whether `n` is the only node reading the input or module tensor `w` (no other name of its memory in the
        graph): its side-effect write may then go to that tensor itself, as eager's does, with no copy (an
        embedding's whole weight cloned and copied back on every call cost 5x the lookup)."""
        if w.op not in ("placeholder", "get_attr") or any(u is not n for u in w.users):
            return False
        if w.op == "placeholder":
            return True
        storage = _storage(self._get_attr(w.target))
        return not any(m is not w and m.op == "get_attr" and _storage(self._get_attr(m.target)) == storage
                       for m in self.gm.graph.nodes)  # fmt: skip

    def _convert_inplace(self, n: torch.fx.Node, value: Any, written: torch.fx.Node,
                         given: SSAValue | None = None) -> None:  # fmt: skip
        """Functionalize `n`, which writes the tensor of `written`: compute the new value out of place and
        make every name of that tensor (the node and earlier in-place results on it) see it. A write through a
        tracked view puts the view's new value back into the whole tensor; every tracked view of that tensor is
        then taken again from its new value. `given`: the written tensor's new value, computed by the caller (a
        call writing it as a side effect, whose own value is something else)."""
        target = self.alias_base.get(written, written)
        new = None
        if target in self.views:
            new = given if given is not None else self._written_value(n, written)
            node = target
            while node in self.views:  # (a view of a view: put back step by step)
                src, steps = self.views[node]
                if isinstance(steps, TorchView):
                    new = self._put_back(steps.node, src, new)
                else:
                    new = put(self.emitter, steps, self.env[src], new)
                node = self.alias_base.get(src, src)
            base = node
        else:
            base = target
        self._refuse_aliased_write(n, base)
        if base.op in ("placeholder", "get_attr") and reshapes_in_place(n):
            where = source_line(n)
            what = "input" if base.op == "placeholder" else "module tensor"
            at = f", at {where}" if where else ""
            raise FrontendError(
                f"in-place {_describe(n)} (node '{n.name}'{at}) changes the shape or strides of {what} "
                f"'{base.target}': the compiled module writes the caller's tensors' values, not their shapes; write it "
                "out of place (x = x.t())"
            )
        self.written_bases.add(base)
        if new is None:
            new = given if given is not None else self._written_value(n, written)
        for node in [base, *(k for k, b in self.alias_base.items() if b is base)]:
            self.env[node] = new
        again = [m for m in self.views if self._root(m) is base]
        names: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # other names of those views
        for k, b in self.alias_base.items():
            names.setdefault(b, []).append(k)
        for m in again:  # (in creation order: a view's source, and its other names, are taken again before it)
            src, steps = self.views[m]
            if isinstance(steps, TorchView):  # (m may be an in-place op's result naming the view: steps.node's call)
                self.env[m] = self._torch_call(steps.node, self.values[m], again=True)
            else:
                self.env[m] = replay(self.emitter, steps, self.env[src])
            for k in names.get(m, ()):
                self.env[k] = self.env[m]
        if given is None and target in self.views:  # n (x.copy_(y) returns x) names the written view
            self.views[n] = self.views[target]
            self.env[n] = self.env[target] if isinstance(value, torch.Tensor) else value
        elif given is None:  # (with `given`, n's value is its own)
            self.alias_base[n] = base
            self.env[n] = new if isinstance(value, torch.Tensor) else value
        if base.op in ("placeholder", "get_attr"):
            self.written[base] = new

    def _refuse_aliased_write(self, n: torch.fx.Node, base: torch.fx.Node) -> None:
        """An in-place write that another live tensor sees through a view (or that writes a graph input or
        module state through a view) cannot be functionalized by rebinding one name: refuse it clearly. The
        tracked views of `base` (`_note_view`) are taken again from its new value instead."""
        storage = _storage(self.values.get(base))
        if storage is None:
            return
        if self._by_storage is None:  # (built once: a scan of every value per write was quadratic in the graph)
            self._by_storage = {}
            for m, v in self.values.items():
                if (st := _storage(v)) is not None:
                    self._by_storage.setdefault(st, []).append(m)
        for m in self._by_storage.get(storage, ()):
            state = m.op in ("placeholder", "get_attr")  # (symbolic_trace puts a get_attr at its first read: a
            if m is base or m is n or self.alias_base.get(m) is base or (self.order[m] > self.order[n] and not state):
                continue  # module tensor read after the write is still another name of memory it wrote)
            if self._root(m) is base or not _overlap(self.values[m], self.values[base]):  # a tracked view; apart
                continue
            if m.op == base.op == "get_attr" and self._get_attr(m.target) is self._get_attr(base.target):
                continue  # (the same tensor read again: that read will be another name of it, `_convert`)
            if state or any(self.order[u] > self.order[n] for u in m.users):
                where = source_line(n)
                raise FrontendError(
                    f"in-place {_describe(n)} (node '{n.name}'{', at ' + where if where else ''}) writes a tensor that "
                    f"'{m.name}' shares: dlblas_compiler supports in-place writes only to tensors no other live view "
                    "aliases; write it out of place (y = x.op(...))"
                )

    def _written_value(self, n: torch.fx.Node, written: torch.fx.Node) -> SSAValue:
        """The new value of the written tensor: an out-of-place converter (cast back to the tensor's dtype),
        a broadcast/cast for copy_, else a torch_call on a clone."""
        old, want = self.env[written], self.values[written]
        twin = (converter_key(n, self.gm), n.args, n.kwargs) if n.op == "call_module" else out_of_place(n)
        src = n.args[1] if len(n.args) > 1 and isinstance(n.args[1], torch.fx.Node) else None
        if n.op == "call_method" and n.target == "copy_" and src is not None and isinstance(self.env[src], SSAValue):
            twin = ("expand_as", (n.args[1], written), {})
        if twin is not None and isinstance(old, SSAValue):
            key, args, kwargs = twin
            args, kwargs = self._resolve(args), self._resolve(kwargs)
            expect = _fake_like(want, self.values[src] if key == "expand_as" else None)
            out, _ = self._try_converter(n, key, args, kwargs, expect)
            if isinstance(out, SSAValue) and tuple(out.type.get_shape()) == tuple(want.shape):
                if out.type.element_type != xdsl_dtype(want.dtype):
                    op = ConvertOp(out, xdsl_dtype(want.dtype))
                    self.emitter.builder.insert(op)
                    op.result.name_hint = _safe_name(n.name)
                    out = op.result
                return out
        return self._torch_call(n, want, clone=written)

    def _get_attr(self, target: str):
        obj = self.gm
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    def _check(self, n: torch.fx.Node, out: Any, value: Any) -> None:
        got, want = pytree.tree_leaves(out), pytree.tree_leaves(value)
        if len(got) != len(want):
            raise ValueError(f"converter produced {len(got)} values, torch {len(want)}")
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                if not isinstance(g, SSAValue) or not isinstance(g.type, TensorType):
                    raise ValueError(f"converter produced {g!r} where torch produced a tensor")
                if tuple(g.type.get_shape()) != tuple(w.shape) or g.type.element_type != xdsl_dtype(w.dtype):
                    raise ValueError(f"converter produced {g.type}, torch {tuple(w.shape)} {w.dtype}")

    def _torch_call(self, n: torch.fx.Node, value: Any, clone: torch.fx.Node | None = None, again: bool = False,
                    hidden: tuple[torch.fx.Node, ...] = ()) -> Any:  # fmt: skip
        """`n` run by PyTorch. With `clone` (a node that `n` writes in place), the call writes a copy of
        that tensor instead and returns the copy: its new value. `again`: a view taken again of its source's new
        value after a write (computed on every call, whatever its ancestors are). `hidden`: tensors the call writes
        as a side effect (`mutation.hidden_writes`): it writes copies of them, and returns (its value, their new
        values)."""
        flat_in: list[SSAValue] = []
        contiguous: dict[SSAValue, bool] = {}  # eager's value of the input is contiguous
        marks: dict[torch.fx.Node, _Written] = {}  # the written nodes' marks, and their slots
        slot_of: dict[int, int] = {}
        reads_storage = _reads_storage(n)

        def slot(v):
            if isinstance(v, (SSAValue, _Written)):
                flat_in.append(v.value if isinstance(v, _Written) else v)
                slot_of[id(v)] = len(flat_in) - 1
                return _Slot(len(flat_in) - 1, isinstance(v, _Written))
            return v

        layouts: dict[SSAValue, tuple] = {}  # eager's strides and storage offset of an input that is not dense

        def value_of(m: torch.fx.Node):
            v, example = self.env[m], self.values.get(m)
            for leaf, ex in zip(pytree.tree_leaves(v, is_leaf=_is_ssa), pytree.tree_leaves(example)):
                if isinstance(leaf, SSAValue) and isinstance(ex, torch.Tensor):
                    contiguous[leaf] = ex.is_contiguous()
                    if reads_storage and (not ex.is_contiguous() or ex.storage_offset()):
                        layouts[leaf] = (tuple(ex.stride()), ex.storage_offset())
            return marks.setdefault(m, _Written(v)) if m is clone or m in hidden else v

        def resolve(a):
            return torch.fx.node.map_arg(a, value_of)

        leaf = lambda v: isinstance(v, (SSAValue, _Written))  # noqa: E731
        args = pytree.tree_map(slot, resolve(n.args), is_leaf=leaf)
        kwargs = pytree.tree_map(slot, resolve(n.kwargs), is_leaf=leaf)
        target = self._callable(n)
        if clone is None and not again and self.input_free(n) and (dev := self._host_scalar(n)) is not None:
            target = functools.partial(_moved_to, target, dev)  # (computed once, `TorchStep.once`)
        leaves, spec = pytree.tree_flatten(value)
        tensor_pos = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        for i in tensor_pos:
            if not has_xdsl_dtype(leaves[i].dtype):
                raise FrontendError(f"node '{n.name}' produces dtype {leaves[i].dtype}, which dlblas_compiler does not support")

        # an opaque op may depend on strides (`.view` after a `.contiguous()` the IR drops): an input eager had
        # contiguous is made contiguous first; one whose memory it reads (`as_strided`) is laid out as eager's was
        dense = tuple(i for i, v in enumerate(flat_in) if contiguous.get(v))
        if reads_storage:
            dense = tuple((i, *layouts[v]) if v in layouts else i for i, v in enumerate(flat_in)
                          if v in layouts or contiguous.get(v))  # fmt: skip
            self.size_decisions += tuple(f"{n.name}: {name} of an input laid out {lay}" for name, lay in (
                (v.name_hint, layouts[v]) for v in flat_in if v in layouts))  # (its strides are not sizes: no family)

        # (arguments without containers, the common case, are filled by one comprehension: pytree's tree_map
        # costs ~10 µs a call, and a decode step without a CUDA graph makes ~70 of these calls)
        flat = not any(isinstance(v, (list, tuple, dict)) for v in (*args, *kwargs.values()))

        slots = pytree.tree_leaves((args, kwargs), is_leaf=lambda v: isinstance(v, _Slot))
        also = tuple(slot_of[id(marks[m])] for m in hidden)  # (the hidden writes' copies follow the results, in order)
        call = TorchCall(target, args, kwargs, tuple(tensor_pos), clone is not None, dense, flat, also)
        name = self._call_name(n.name) if again else _safe_name(n.name)
        self.calls[name] = call
        types = [tensor_type(leaves[i].shape, leaves[i].dtype) for i in tensor_pos] + [flat_in[i].type for i in also]
        op = TorchCallOp(_qualname(n, self.gm), name, flat_in, types)
        if again:
            op.attributes["pure"] = UnitAttr()  # (a view: dead code elimination may drop it once unused)
        elif clone is None and self.input_free(n):
            op.attributes["input_free"] = UnitAttr()  # dead code elimination may drop it once unused
        elif clone is None and op.callee.data in ALLOCATIONS:
            op.attributes["pure"] = UnitAttr()  # (reads its inputs' sizes and dtypes only): likewise
        ins = [self.values.get(m) for m in n.all_input_nodes]
        if _fresh(leaves, ins) and not _stride_dependent(n):
            op.attributes["fresh"] = UnitAttr()
        written = [v.index for v in slots if isinstance(v, _Slot) and v.written]
        if clone is not None and written:
            op.writes = IntegerAttr(written[0], 64)
        self.emitter.builder.insert(op)
        for r in op.results:
            r.name_hint = name
        res = list(op.results)
        out_leaves = [res[tensor_pos.index(i)] if i in tensor_pos else v for i, v in enumerate(leaves)]
        if hidden:
            return pytree.tree_unflatten(out_leaves, spec), res[len(tensor_pos):]
        return pytree.tree_unflatten(out_leaves, spec)

    def _put_back(self, view: torch.fx.Node, src: torch.fx.Node, new: SSAValue) -> SSAValue:
        """The value of `src` with the elements its view `view` takes replaced by `new`, computed by PyTorch (a
        view the IR does not take: a strided slice, a diagonal, any view of an integer tensor), as eager's write
        through that view leaves it."""
        example = self.values[src]
        args = (_Slot(0, written=True), _Slot(1), *view.args[1:])
        flat = not any(isinstance(v, (list, tuple, dict)) for v in (*args, *view.kwargs.values()))
        name = self._call_name(f"{view.name}_put")
        self.calls[name] = TorchCall(_PutBack(self._callable(view)), args, dict(view.kwargs), (0,), True, (), flat)
        op = TorchCallOp(_qualname(view, self.gm), name, [self.env[src], new],
                         [tensor_type(example.shape, example.dtype)])  # fmt: skip
        op.writes = IntegerAttr(0, 64)
        self.emitter.builder.insert(op)
        op.results[0].name_hint = name
        return op.results[0]

    def _call_name(self, base: str) -> str:
        """A torch call's name no other call has."""
        name, i = _safe_name(base), 0
        while name in self.calls:
            i += 1
            name = _safe_name(f"{base}_again{i}")
        return name

    def _callable(self, n: torch.fx.Node) -> Callable:
        if n.op == "call_function":
            return n.target
        if n.op == "call_module":
            return self.gm.get_submodule(n.target)
        return _Method(n.target)


def _same_view(a: Any, b: Any) -> bool:
    """Two tensors that are the same view of one storage (`cm(x, x)`; `x.to(x.device)` in a graph): real
    tensors compared by address, fake ones (a graph's example values) by their shared fake storage. A view that
    negates or conjugates by its bit (`c.conj().imag`) is another value."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a is b:
        return True
    if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype or a.numel() == 0:
        return False
    if a.storage_offset() != b.storage_offset() or a.is_neg() != b.is_neg() or a.is_conj() != b.is_conj():
        return False
    sa, sb = _storage(a), _storage(b)
    if isinstance(a, FakeTensor) or isinstance(b, FakeTensor):  # (every fake storage's address is 0)
        return sa is not None and sa == sb
    return a.device.type != "meta" and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _is_ssa(v: Any) -> bool:
    return isinstance(v, SSAValue)


def _plain(a: Any, table: dict) -> Any:
    """An FX argument structure with each node replaced by table[node], fx's immutable lists and dicts turned
    into the plain ones eager returns (tuples, namedtuples and other values kept)."""
    if isinstance(a, torch.fx.Node):
        return table.get(a)
    if isinstance(a, list):
        return [_plain(x, table) for x in a]
    if isinstance(a, dict):
        return {k: _plain(v, table) for k, v in a.items()}
    if isinstance(a, tuple):
        items = [_plain(x, table) for x in a]
        return type(a)(*items) if hasattr(a, "_fields") else tuple(items)
    return a


def _container_type(target: Any) -> bool:
    """A namedtuple or dataclass type: building one from tensors only groups them (no computation)."""
    return isinstance(target, type) and (dataclasses.is_dataclass(target) or (issubclass(target, tuple) and hasattr(target, "_fields")))


def register_dataclasses(value: Any) -> None:
    """Make the dataclass instances inside `value` (outputs such as `Out(logits=..., loss=...)`) pytree nodes,
    so their tensors flatten like a tuple's (torch.export's `register_dataclass`, process-wide)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if type(value) not in pytree.SUPPORTED_NODES:
            pytree.register_dataclass(type(value))
        for f in dataclasses.fields(value):
            register_dataclasses(getattr(value, f.name, None))
    elif isinstance(value, (list, tuple)):
        for v in value:
            register_dataclasses(v)
    elif isinstance(value, dict):
        for v in value.values():
            register_dataclasses(v)


@dataclass(frozen=True)
class TorchView:
    """The steps of a view the IR does not take (`Importer.views`): PyTorch takes it again, by `node`'s call, after
    a write to its source, and puts a write through it back into that source (`_PutBack`)."""

    node: torch.fx.Node


def _layout_dependent(n: torch.fx.Node) -> bool:
    """Whether which elements the view `n` takes depends on its source's strides (as_strided), which ours may not
    share with eager's."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name in ("as_strided", "view_as_real") or "memory_format" in n.kwargs


@dataclass(frozen=True)
class _PutBack:
    """`view(base, *args, **kwargs).copy_(new)`, writing `base`: the view's call (its node's target). Where our
    `base`'s strides make the call a copy (a reshape of a non-contiguous tensor; eager's was a view), the write
    goes through a contiguous copy of `base` that is then copied into it."""

    view: Callable

    def __call__(self, base: torch.Tensor, new: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        v = self.view(base, *args, **kwargs)
        if v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
            v.copy_(new)
        else:
            dense = base.contiguous()
            self.view(dense, *args, **kwargs).copy_(new)
            base.copy_(dense)
        return base


@dataclass(frozen=True)
class _Method:
    """Calls the method `name` of its first argument (compared by name: two imports' calls of it are equal)."""

    name: str

    def __call__(self, self_: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self_, self.name)(*args, **kwargs)


class TorchCall:
    """An FX node run by PyTorch on the tensors of its `dl.torch_call` (`Importer._torch_call`): its arguments
    with each tensor a `_Slot` into the call's tensors. A tensor it writes in place is copied first (value
    semantics), unless `_in_place` (the runtime found that the write may go to the caller's tensor). A class,
    not a closure, so that a compiled graph can be saved (`keep_traces`)."""

    __slots__ = ("target", "args", "kwargs", "pos", "clone", "dense", "flat", "also")

    def __init__(self, target: Callable, args: Any, kwargs: dict, pos: tuple[int, ...], clone: bool,
                 dense: tuple[int, ...], flat: bool, also: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.target, self.args, self.kwargs, self.pos = target, args, kwargs, pos
        self.clone, self.dense = clone, dense  # clone: returns the copy it wrote; dense: made contiguous first (or,
        # (i, strides, offset), laid out in memory as eager's was: `_reads_storage`)
        self.flat = flat  # no containers among the arguments: filled without pytree (~10 µs a call less)
        self.also = also  # the written tensors (their positions) whose copies follow the results

    def fields(self) -> dict[str, Any]:
        """What it was made with: `TorchCall(**fields)` makes it again (a shape family moves its integers)."""
        return {k: getattr(self, k) for k in self.__slots__}

    def __getstate__(self) -> dict[str, Any]:
        return self.fields()

    def foreach(self) -> tuple[str, int | float] | None:
        """(method, scalar) where this call is `t.<method>(scalar)` on its one tensor, written in place (a cache's
        length counter: `cumulative_length.add_(1)`), for a method `torch._foreach_<method>` runs on many tensors
        at once; else None."""
        if type(self.target) is not _Method or self.target.name not in FOREACH_METHODS or self.kwargs:
            return None
        if len(self.args) != 2 or not (isinstance(self.args[0], _Slot) and self.args[0].written):
            return None
        scalar = self.args[1]
        return (self.target.name, scalar) if type(scalar) in (int, float) else None

    def form(self) -> tuple | None:
        """(target, arguments, keyword arguments) with each tensor argument as ("slot", its position among the
        call's tensors) and every other as ("value", v, its type, its repr) — `x + 1`, `x + 1.0` and `x + True`
        differ (and promote differently) though 1 == 1.0 == True, as do 0.0 and -0.0: calls of one form on equal
        tensors compute equal values. Keyword arguments as (name, v, type, repr). None where that cannot be told
        from the call alone: a tensor written in place, containers, an argument that is a tensor or not hashable."""
        if not self.flat or self.clone or any(isinstance(v, _Slot) for v in self.kwargs.values()):
            return None
        if any(isinstance(a, _Slot) and a.written for a in self.args) or any(
                isinstance(v, torch.Tensor) for v in (*self.args, *self.kwargs.values())):  # fmt: skip
            return None
        args = tuple(("slot", a.index) if isinstance(a, _Slot) else ("value", a, type(a), repr(a)) for a in self.args)
        form = (self.target, args, tuple((k, v, type(v), repr(v)) for k, v in sorted(self.kwargs.items())))
        try:
            hash(form)
        except TypeError:
            return None
        return form

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.also = ()  # (a call saved before it had this field)
        for k, v in state.items():
            setattr(self, k, v)

    def __call__(self, *tensors: torch.Tensor, _in_place: bool = False) -> tuple:
        copies: dict[int, torch.Tensor] = {}
        if self.dense:
            tensors = list(tensors)
            for i in self.dense:
                if type(i) is tuple:  # (laid out as eager's: a call reading its memory, `_reads_storage`)
                    tensors[i[0]] = _laid_out(tensors[i[0]], *i[1:])
                elif not tensors[i].is_contiguous():
                    tensors[i] = tensors[i].contiguous()

        def fill(v):
            if not isinstance(v, _Slot):
                return v
            if v.written:
                return copies.setdefault(v.index, tensors[v.index] if _in_place else tensors[v.index].clone())
            return tensors[v.index]

        if self.flat:
            a, k = [fill(v) for v in self.args], {key: fill(v) for key, v in self.kwargs.items()}
        else:
            a = pytree.tree_map(fill, self.args, is_leaf=lambda v: isinstance(v, _Slot))
            k = pytree.tree_map(fill, self.kwargs, is_leaf=lambda v: isinstance(v, _Slot))
        out = self.target(*a, **k)
        if self.clone:
            return (next(iter(copies.values())),)
        if isinstance(out, torch.Tensor):
            out = (out,)
        elif type(out) is not tuple or any(isinstance(v, (list, tuple, dict)) for v in out):
            out = pytree.tree_leaves(out)
        if self.also:
            return (*(out[i] for i in self.pos), *(copies[i] for i in self.also))
        return tuple(out[i] for i in self.pos)


FOREACH_METHODS = frozenset({"add_", "sub_", "mul_"})  # in-place methods with a `torch._foreach_*` twin


@dataclass(frozen=True)
class _Slot:
    index: int
    written: bool = False  # the tensor the call writes in place (a copy is passed)


@dataclass(frozen=True)
class _Written:
    value: SSAValue


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b (of one storage) may touch the same bytes: their spans from the first to the last element overlap."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        lo = t.storage_offset() * t.element_size()
        return lo, lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()

    if not a.numel() or not b.numel():
        return False
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _view_of(f: torch.Tensor, kind: str, key: int, base: torch.Tensor) -> tuple:
    """How eager's output f views `base` (an earlier output or an input of the same storage): `Imported.eager_views`."""
    if _same_tensor(f, base):
        return ("same", kind, key)
    return ("view", kind, key, tuple(f.shape), tuple(f.stride()), f.storage_offset() - base.storage_offset(),
            tuple(base.shape), tuple(base.stride()))  # fmt: skip


def _same_tensor(a: Any, b: Any) -> bool:
    """a and b are one tensor: the same storage, offset, sizes and strides."""
    st = _storage(a)
    return (st is not None and st == _storage(b) and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset())  # fmt: skip


def _storage(v: Any) -> int | None:
    if not isinstance(v, torch.Tensor):
        return None
    try:
        return v.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # tensors without storage (fake, functional wrappers)
        return None


def _fresh(outs: list, ins: list) -> bool:
    """Whether eager's example outputs of a call share no memory with its example inputs (an arithmetic op's new
    tensor, not a view or the input itself), as far as their storages can be told apart."""
    inputs = [x for x in pytree.tree_leaves(ins) if isinstance(x, torch.Tensor)]
    outputs = [x for x in outs if isinstance(x, torch.Tensor)]
    storages = [_storage(x) for x in inputs + outputs]
    if any(s is None for s in storages):
        return False
    return not set(storages[: len(inputs)]) & set(storages[len(inputs):])


# calls that return a view or a copy depending on their input's strides: a signature fixes shapes, dtypes and
# devices, not strides (the program's inputs are made contiguous), so the example's answer may not hold at run time
_STRIDE_ALIASING = frozenset({"contiguous", "reshape", "reshape_as", "flatten", "ravel", "view_as_real"})


def _reads_storage(n: torch.fx.Node) -> bool:
    """`n` reads its input's memory, not its value (`x.as_strided(size, stride)`: Longformer's overlapping chunks of
    a transposed view): that input must be laid out in memory as eager's was (`TorchCall.dense`)."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name in ("as_strided", "as_strided_copy")


def _laid_out(x: torch.Tensor, stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """x's values in memory laid out as eager's tensor was: these strides, at this offset into its storage (what
    lies outside x's own elements is not eager's)."""
    if x.stride() == stride and x.storage_offset() == offset:
        return x
    span = sum((size - 1) * st for size, st in zip(x.shape, stride, strict=True)) + 1 if x.numel() else 0
    out = x.new_empty(offset + span).as_strided(x.shape, stride, offset)
    return out.copy_(x)


def _stride_dependent(n: torch.fx.Node) -> bool:
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name in _STRIDE_ALIASING or "memory_format" in n.kwargs


def _fake_like(want: torch.Tensor, src: Any) -> Any:
    """The example value a converter of an in-place op's out-of-place twin should produce: `want`'s
    shape, in the dtype the out-of-place op computes (the source's, for copy_)."""
    return want if src is None else torch.empty(want.shape, dtype=src.dtype, device="meta")


def _has_ssa(value: Any) -> bool:
    return any(isinstance(v, SSAValue) for v in pytree.tree_leaves(value, is_leaf=lambda v: isinstance(v, SSAValue)))


def _at(n: torch.fx.Node) -> str:
    where = source_line(n)
    return f", at {where}" if where else ""


def _describe(n: torch.fx.Node) -> str:
    if n.op == "call_method":
        return f"method .{n.target}()"
    if n.op == "call_module":
        return f"module {n.target}"
    return f"function {_qualname_fn(n.target)}"


# torch calls that make a new tensor from their inputs' sizes, dtypes and devices alone (no effect but the result;
# `t = x.new_empty(...)` filled through views of it is left unread once the writes are put back)
ALLOCATIONS = {f"torch.Tensor.{m}" for m in ("new_empty", "new_zeros", "new_ones", "new_full")} | {
    f"torch.{f}" for f in ("empty_like", "zeros_like", "ones_like", "full_like")}  # fmt: skip


def _qualname_fn(fn: Any) -> str:
    if isinstance(fn, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        return f"torch.ops.{fn}"  # (torch.ops.aten.slice, torch.ops.aten.slice.Tensor)
    mod = getattr(fn, "__module__", None) or "builtins"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{mod}.{name}"


def _qualname(n: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    if n.op == "call_function":
        return _qualname_fn(n.target)
    if n.op == "call_module":
        return _qualname_fn(type(gm.get_submodule(n.target)))
    return f"torch.Tensor.{n.target}"


def import_graph(captured: Captured, inputs: list) -> Imported:
    """Import a captured graph for one set of placeholder values."""
    for v in inputs:
        if isinstance(v, torch.Tensor) and v.dtype not in COMPUTE_DTYPES and not has_xdsl_dtype(v.dtype) and not v.is_complex():
            raise FrontendError(f"an input has dtype {v.dtype}, which dlblas_compiler does not support")
    return Importer(captured, inputs).run()
