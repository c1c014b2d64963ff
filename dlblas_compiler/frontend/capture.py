"""Capture a module's forward as an FX graph: `torch.fx.symbolic_trace` first, dynamo export when
symbolic tracing cannot follow the code (tuple arguments, Python control flow on sizes, ...).

The result knows how to flatten a call's (args, kwargs) into the graph's placeholders and how to
rebuild the call's output structure from the values of the output node's leaves.

Tracing never changes the module: buffers are traced as graph values (so `self.count.add_(1)` is a node,
not a write at trace time), and a buffer that forward reassigns (`self.count += 1`) is put back and the
assignment recorded as `copy_` into the buffer, which the importer turns into a write-back.

Why `torch._dynamo.export` and not the public `torch.export.export`: the importer's converters take torch-level
calls (`F.linear`, `F.scaled_dot_product_attention`, `Tensor.view`, ...), the level at which the fusion patterns
are written, and dynamo's export with `aten_graph=False` gives that graph with its pytree specs. `torch.export`
gives an ATen graph (`aten.linear`, `aten.mul.Tensor`, decomposed attention), which would need a second converter
table for every op. Its errors are read from the exceptions' own fields where dynamo keeps them (the user stack in
`real_stack`, torch's error as the innermost exception of the chain); only dynamo's explanation of a graph break
is read from its text.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import operator
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import FrontendError
from .functorch import transforms_as_calls
from .masks import is_random_name
from .moe import moe_blocks_as_ops
from .mutation import INPLACE_OPERATORS
from .torch_modules import torch_attention_in, torch_modules_traced


@dataclass
class Captured:
    gm: torch.fx.GraphModule
    how: str  # "graph_module" | "symbolic_trace" | "dynamo"
    in_spec: Any = None  # dynamo: pytree spec of (args, kwargs)
    out_spec: Any = None  # dynamo: pytree spec of the output
    signature: inspect.Signature | None = None  # symbolic_trace: forward's signature
    notes: list[str] = field(default_factory=list)

    def flatten(self, args: tuple, kwargs: dict) -> list:
        """The values of the graph's placeholders for one call."""
        if self.how == "dynamo":
            from torch.fx._pytree import tree_flatten_spec

            return list(tree_flatten_spec((args, kwargs), self.in_spec))
        if self.signature is None:
            if kwargs:
                raise TypeError("a GraphModule takes positional inputs only")
            return list(args)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return list(bound.arguments.values())

    def output_leaves(self) -> tuple[list, Any]:
        """The output node's leaves (fx Nodes or constants) and the spec that rebuilds the result."""
        out = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        leaves, spec = pytree.tree_flatten(out.args[0])
        return leaves, spec

    def unflatten(self, values: list, spec: Any) -> Any:
        result = _unflatten_sizes(values, spec.spec) if type(spec) is SizeSpec else pytree.tree_unflatten(values, spec)
        if self.out_spec is not None:
            result = pytree.tree_unflatten(list(result), self.out_spec)
        return result


@dataclass(frozen=True)
class SizeSpec:
    """An output structure holding a `torch.Size` (`return y, x.shape`), which pytree gives back as a plain tuple:
    rebuilt as eager's type (`with_sizes`)."""

    spec: Any


def with_sizes(spec: Any) -> Any:
    """`spec`, or a SizeSpec of it where it holds a torch.Size."""
    def holds(s) -> bool:
        return s.type is torch.Size or any(holds(c) for c in _children(s))

    return SizeSpec(spec) if holds(spec) else spec


def _children(spec) -> list:
    if spec.is_leaf():
        return []
    return list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)  # (torch < 2.12)


def _unflatten_sizes(values: list, spec: Any) -> Any:
    leaves = iter(values)

    def build(s):
        if s.is_leaf():
            return next(leaves)
        kids = [build(c) for c in _children(s)]
        if s.type is torch.Size:
            return torch.Size(kids)
        return pytree.SUPPORTED_NODES[s.type].unflatten_fn(kids, s.context)

    return build(spec)


def _plain_signature(model: torch.nn.Module) -> inspect.Signature | None:
    sig = inspect.signature(model.forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return None
    return sig


def capture(model: torch.nn.Module, args: tuple, kwargs: dict) -> Captured:
    """Trace `model` for a call with these inputs (MoE blocks as one op each, see frontend/moe.py; torch.func
    transforms dynamo inlined, as vmap, as one PyTorch call each, frontend/functorch.py). Raises
    FrontendError naming why both tracers failed, or that the call does not fit forward's signature."""
    if not isinstance(model, torch.fx.GraphModule):
        check_arguments(model, args, kwargs)
        _refuse_hf_caches(model, args, kwargs)
    with moe_blocks_as_ops(model) as moe_names, torch_modules_traced(model):
        captured = _capture(model, args, kwargs)
    if moe_names:
        captured.notes.append(f"MoE blocks captured as dl.moe: {', '.join(moe_names)}")
    captured.gm = transforms_as_calls(captured.gm)
    return captured


def _capture(model: torch.nn.Module, args: tuple, kwargs: dict) -> Captured:
    if isinstance(model, torch.fx.GraphModule):
        has_pytree = hasattr(model.graph._codegen, "pytree_info")
        if has_pytree:
            info = model.graph._codegen.pytree_info
            return Captured(model, "dynamo", in_spec=info.in_spec, out_spec=info.out_spec)
        return Captured(model, "graph_module")
    if "forward" in vars(model):  # symbolic_trace would trace the class's forward, not this one
        return _dynamo_capture(model, args, kwargs, "forward is set on the instance")
    if attention := torch_attention_in(model):  # symbolic_trace would keep it whole, as one opaque call
        with contextlib.suppress(FrontendError):  # (else symbolic_trace's graph, with the attention as one call)
            return _dynamo_capture(model, args, kwargs, f"it holds torch's {attention}, kept whole by symbolic_trace")
    sig = _plain_signature(model)
    failure = "its forward takes *args/**kwargs"
    if sig is not None:
        try:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            concrete = {k: v for k, v in bound.arguments.items() if not isinstance(v, torch.Tensor)}
            if all(v is None or isinstance(v, (bool, int, float, str, torch.dtype)) for v in concrete.values()):
                return Captured(_symbolic_trace(model, concrete), "symbolic_trace", signature=sig)
            failure = "an argument is a container (tuple, list or dict)"
        except Exception as e:  # noqa: BLE001 - any tracing failure sends us to dynamo
            failure = f"{type(e).__name__}: {_first_line(e)}"
    return _dynamo_capture(model, args, kwargs, failure)


def _hf_cache_class() -> type | None:
    """Hugging Face's KV cache base class, where transformers is in use (it is not imported for this)."""
    module = sys.modules.get("transformers.cache_utils")
    return getattr(module, "Cache", None)


def _refuse_hf_caches(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """A Hugging Face cache passed in (`past_key_values=...`): its forward grows the cache object in place (new
    tensors set on its layers), which a captured graph cannot follow. Compiling the forward through dynamo can."""
    cache = _hf_cache_class()
    if cache is None:
        return
    named = [(f"input {i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    for name, value in named:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
        if isinstance(value, cache) or any(isinstance(v, cache) for v in inner):
            raise FrontendError(
                f"{type(model).__name__}: {name} is a Hugging Face cache ({type(value).__name__}), which forward "
                "updates in place; a compiled module cannot follow that. Compile the forward instead, as for "
                "generate(): model.forward = dc.compile(model.forward)"
            )


@functools.cache
def _hf_caches_as_pytrees() -> None:
    """Hugging Face's DynamicCache, and the EncoderDecoderCache of seq2seq models, as pytree nodes (transformers' own
    registrations, made for torch.export): a model called without a cache returns a new one (`use_cache` is on by
    default), its tensors the graph's outputs."""
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:
        return
    register_dynamic_cache_export_support()
    try:
        from transformers.cache_utils import EncoderDecoderCache
        from transformers.exporters.exporter_dynamo import register_pytree_node
    except ImportError:
        return
    register_pytree_node(EncoderDecoderCache)


def check_arguments(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Raise FrontendError when (args, kwargs) do not bind to forward's parameters, saying how many it takes
    and how many were given (before any tracer turns the mismatch into a tracing failure)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to check
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        required = [p for p in params if p.default is p.empty]
        takes = f"{len(required)}" if len(required) == len(params) else f"{len(required)} to {len(params)}"
        if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
            takes = f"at least {len(required)}"
        given = f"{len(args)} positional" + (f" and {len(kwargs)} keyword ({', '.join(kwargs)})" if kwargs else "")
        names = ", ".join(p.name for p in params)
        raise FrontendError(
            f"{type(model).__name__}.forward({names}) takes {takes} argument{'s' * (takes != '1')}, "
            f"given {given}: {e}"
        ) from None


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Iterator[list[logging.LogRecord]]:
    """Capture what FakeTensorMode logs about an op that fails on fake tensors (its traceback, ~40 lines at ERROR
    level): the failure reaches the user as one FrontendError naming the op and source line instead. Yields the
    captured records."""
    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        records.append(record)
        return False

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addFilter(keep)
    try:
        yield records
    finally:
        logger.removeFilter(keep)


def _module_state(model: torch.nn.Module) -> dict[tuple[str, str], Any]:
    """(module path, slot) -> value of every buffer, parameter and public plain attribute."""
    state: dict[tuple[str, str], Any] = {}
    for path, mod in model.named_modules(remove_duplicate=False):
        state.update({(path, f"b:{k}"): v for k, v in mod._buffers.items()})
        state.update({(path, f"p:{k}"): v for k, v in mod._parameters.items()})
        state.update({(path, k): v for k, v in vars(mod).items() if not k.startswith("_")})
    return state


def _restore(model: torch.nn.Module, before: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """Undo what tracing did to the module: buffers and parameters reassigned, attributes set to proxies or
    fake tensors. Returns {qualified name: the value tracing assigned}. (An attribute set to a plain
    Python value stays: eager forward sets it too.)"""
    from torch._subclasses.fake_tensor import FakeTensor

    changed: dict[str, Any] = {}
    for key, value in _module_state(model).items():
        old = before.get(key, _MISSING)
        path, slot = key
        tensor_slot = slot[:2] in ("b:", "p:")
        if old is value or not (tensor_slot or isinstance(value, (torch.fx.Proxy, FakeTensor))):
            continue
        mod, name = model.get_submodule(path), slot.removeprefix("b:").removeprefix("p:")
        changed[f"{path}.{name}" if path else name] = value
        if tensor_slot:
            (mod._buffers if slot.startswith("b:") else mod._parameters)[name] = old
        elif old is _MISSING:
            object.__delattr__(mod, name)
        else:
            object.__setattr__(mod, name, old)
    return changed


_MISSING = object()


class _InplaceProxy(torch.fx.Proxy):
    """Records `a += b` as operator.iadd: a plain Proxy records `a = a + b`, losing the write to a's tensor."""


def _inplace_method(op):
    return lambda self, other: self.tracer.create_proxy("call_function", op, (self, other), {})


for _op in INPLACE_OPERATORS:
    setattr(_InplaceProxy, f"__{_op.__name__}__", _inplace_method(_op))


class _Tracer(torch.fx.Tracer):
    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _InplaceProxy(node, self)

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        """torch's modules are kept whole (one call each), except those writing their own state as a side effect
        (a batch norm's running statistics in training, an embedding renormalized to `max_norm`): traced into
        their functional calls, whose writes the importer follows (`mutation.hidden_writes`), or, where their
        Python cannot be traced, captured by dynamo."""
        return super().is_leaf_module(m, qualname) and not _writes_own_state(m)


def _writes_own_state(m: torch.nn.Module) -> bool:
    norms = (torch.nn.modules.batchnorm._NormBase,)
    if isinstance(m, norms):
        return m.training and m.track_running_stats
    return isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.max_norm is not None


def _symbolic_trace(model: torch.nn.Module, concrete: dict) -> torch.fx.GraphModule:
    """symbolic_trace with buffers as graph values; a reassigned buffer becomes a `copy_` into it."""
    tracer = _Tracer()
    tracer.record_stack_traces = True
    tracer.proxy_buffer_attributes = True
    before = _module_state(model)
    try:
        with _RandomWithoutInputs(), _refuse_mode_switches():
            graph = tracer.trace(model, concrete_args=concrete or None)
    finally:
        changed = _restore(model, before)
    _refuse_written_trace_constants(graph)
    buffers = dict(model.named_buffers(remove_duplicate=False))
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for name, value in changed.items():
        if name not in buffers or not isinstance(value, torch.fx.Proxy):
            raise RuntimeError(f"forward assigns the module attribute '{name}'")
        with graph.inserting_before(output):
            graph.call_method("copy_", (graph.get_attr(name), value.node))
    return torch.fx.GraphModule(tracer.root, graph, model.__class__.__name__)


@contextlib.contextmanager
def _refuse_mode_switches():
    """symbolic_trace runs forward's Python, so a `with torch.autocast(..)` or `with torch.enable_grad()` inside it
    switches the mode at trace time and leaves no trace in the graph: its ops were imported in fp32 where eager's
    ran in bf16. Such a forward is captured by dynamo, whose graph records the switches (`Importer._switch`)."""
    autocast = torch.amp.autocast_mode.autocast
    enter, set_grad, grad_at_call = autocast.__enter__, torch._C._set_grad_enabled, torch.is_grad_enabled()
    tracing = threading.get_ident()  # (the patches are the process's: another thread's code is left alone)

    def refuse_autocast(self):
        if threading.get_ident() == tracing:
            raise RuntimeError("forward enters torch.autocast, which symbolic_trace does not record")
        return enter(self)

    def refuse_grad(mode):
        if mode and not grad_at_call and threading.get_ident() == tracing:  # (not a `no_grad()` block's exit
            raise RuntimeError("forward turns gradients on, which symbolic_trace does not record")  # under grad)
        return set_grad(mode)

    autocast.__enter__, torch._C._set_grad_enabled = refuse_autocast, refuse_grad
    try:
        yield
    finally:
        autocast.__enter__, torch._C._set_grad_enabled = enter, set_grad


class _RandomWithoutInputs(torch.overrides.TorchFunctionMode):
    """Refuses a draw of random numbers with no traced value among its arguments (`torch.randn(4)`): symbolic_trace
    would run it once and keep its numbers as a constant, the same on every call where eager draws new ones. Such
    a forward is captured by dynamo, which traces the draw."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if is_random_name(name) and not any(isinstance(a, torch.fx.Proxy) for a in pytree.tree_leaves((args, kwargs))):
            raise RuntimeError(f"forward draws random numbers ({name}) from no traced value, which symbolic_trace "
                               "would keep as a constant")  # fmt: skip
        return func(*args, **kwargs)


# Ops whose result is a view of their first argument: a write through one writes that argument's tensor.
_VIEW_METHODS = frozenset({
    "__getitem__", "getitem", "view", "view_as", "reshape", "select", "narrow", "t", "transpose", "swapaxes",
    "permute", "movedim", "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "diagonal",
    "as_strided", "unfold", "split", "chunk", "unbind", "detach", "real", "imag",
})  # fmt: skip


def _refuse_written_trace_constants(graph: torch.fx.Graph) -> None:
    """symbolic_trace runs the ops on tensors made without the inputs (`c = torch.zeros(4)`) at trace time and
    keeps their results as constants (`_tensor_constant0`); an in-place write of such a tensor with a traced value
    (`c.add_(x.sum())`, `c[1:3] += y`) is recorded on the constant, but what forward computed from it after the write
    was baked before it: the graph would return `c * 2` as zeros, and the write would pile up in the constant call
    after call. Such a forward is captured by dynamo, which traces the tensor's creation."""
    from .mutation import mutated_arg

    for n in graph.nodes:
        target = mutated_arg(n, None) if n.op in ("call_function", "call_method") else None
        while target is not None and target.op in ("call_function", "call_method") and target.args:
            name = target.target if isinstance(target.target, str) else getattr(target.target, "__name__", "")
            if name not in _VIEW_METHODS or not isinstance(target.args[0], torch.fx.Node):
                break
            target = target.args[0]
        if target is not None and target.op == "get_attr" and target.target.startswith("_tensor_constant"):
            raise RuntimeError(f"forward writes in place ({n.name}) a tensor it made without its inputs, which "
                               "symbolic_trace computes at trace time")  # fmt: skip


def _dynamo_capture(model, args, kwargs, symbolic_failure: str) -> Captured:
    import torch._dynamo

    from .mutation import hidden_writes, mutated_arg

    if _hf_cache_class() is not None:
        _hf_caches_as_pytrees()
    # Every input signature is exported afresh; dynamo's per-frame recompile limit must not stop the 9th.
    limits = {"recompile_limit": 1 << 20, "accumulated_recompile_limit": 1 << 20}
    before = _module_state(model)
    try:
        with warnings.catch_warnings(), torch._dynamo.config.patch(limits), quiet_fake_tensor_log():
            warnings.simplefilter("ignore")
            result = torch._dynamo.export(model, aten_graph=False, assume_static_by_default=True)(*args, **kwargs)
    except torch._dynamo.exc.TorchRuntimeError as e:  # an op failed on the inputs' (fake) tensors: a shape error
        raise FrontendError(_shape_failure(type(model).__name__, e)) from None  # (dynamo's text says nothing more)
    except Exception as e:  # noqa: BLE001
        raise FrontendError(
            f"cannot trace {type(model).__name__}: torch.fx.symbolic_trace failed ({symbolic_failure}), "
            f"and dynamo failed: {_dynamo_reason(e)}. A module is captured as one graph; to compile the rest around "
            "code dynamo cannot trace (run eagerly between compiled graphs), compile its forward: "
            "`model.forward = dc.compile(model.forward)`"
        ) from e
    finally:
        changed = _restore(model, before)
    gm = result.graph_module
    # dynamo's graph keeps in-place writes (x += 1 as operator.iadd); an assignment it cannot show is refused
    targets = [mutated_arg(n, gm) for n in gm.graph.nodes] + [w for n in gm.graph.nodes for w in hidden_writes(n)]
    written = {id(operator.attrgetter(t.target)(gm)) for t in targets if t is not None and t.op == "get_attr"}
    states = dict(model.named_buffers(remove_duplicate=False)) | dict(model.named_parameters(remove_duplicate=False))
    for name in changed:
        if name not in states or id(states[name]) not in written:
            raise FrontendError(
                f"cannot capture {type(model).__name__}: forward assigns '{name}' (self.{name} = ...), which dynamo's "
                "graph does not record; update it in place (copy_, +=) or return it"
            )
    info = gm.graph._codegen.pytree_info
    return Captured(
        gm, "dynamo", in_spec=info.in_spec, out_spec=info.out_spec, notes=[f"symbolic_trace failed: {symbolic_failure}"]
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _dynamo_reason(e: BaseException) -> str:
    """The cause and user source line of a dynamo failure, without dynamo's long hints: the user frame from the
    exception's `real_stack` (dynamo's record of the code it was tracing), the first line and the explanation from
    its message."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    frame = _user_frame(getattr(e, "real_stack", None) or [])
    where = f" at {frame}" if frame else ""
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")), "")
    return f"{head}{where}" + (f" ({explanation})" if explanation else "")


class _QuietWhileCalling(logging.Filter):
    """Drops FakeTensorMode's log records while a function compiled through dynamo is being called (`calling`
    counts the calls in progress): installed once, so a call costs a counter, not a filter's installation."""

    calling = 0

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.calling


_QUIET = _QuietWhileCalling()


# Dynamo counts the compiles of a code object over every torch.compile of it, and after `recompile_limit` (8)
# runs that code eager from then on, silently but for a log line. Hugging Face models' forwards share one code
# object (transformers' decorator around them), so a process that compiles a few models, or one model in a few modes,
# reached it and our later compiles ran eager. Our own calls allow this many.
RECOMPILE_LIMIT = 64


def dynamo_call(name: str, fn: Callable) -> Callable:
    """`fn` (a function compiled through dynamo: `dc.compile(model.forward)`) called so that an op failing on the
    call's shapes while dynamo traces it raises one FrontendError naming the op's source line, as `capture` does,
    instead of dynamo's TorchRuntimeError after FakeTensorMode's logged traceback, and so that dynamo's recompile
    limit is at least RECOMPILE_LIMIT during the call and its guards check the modules' hooks (both set and restored
    around it: ~4 µs, where the config's `patch` takes ~18)."""
    import torch._dynamo

    logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QUIET)  # (once per logger: a set of filters)
    config = torch._dynamo.config

    @functools.wraps(fn)
    def call(*args, **kwargs):
        _QUIET.calling += 1
        limit, skip_hooks = config.recompile_limit, config.skip_nnmodule_hook_guards
        config.recompile_limit = max(limit, RECOMPILE_LIMIT)
        # (guards on the modules' hooks: a forward hook registered after a trace makes the next call trace again, with
        # it; torch.compile's default skips them, and such a hook was silently not run)
        config.skip_nnmodule_hook_guards = False
        try:
            return fn(*args, **kwargs)
        except torch._dynamo.exc.TorchRuntimeError as e:
            raise FrontendError(_shape_failure(name, e)) from None
        finally:
            config.recompile_limit, config.skip_nnmodule_hook_guards = limit, skip_hooks
            _QUIET.calling -= 1

    return call


def _shape_failure(name: str, e: BaseException) -> str:
    """One line for an op that fails on the call's shapes while dynamo traces `name`: the op's source line (from
    dynamo's record of the user stack) and torch's own error, the innermost exception of the chain dynamo raised
    from (not its text)."""
    frame = _user_frame(getattr(e, "real_stack", None) or [])
    root, seen = e, set()
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        seen.add(id(root))
        root = inner
    cause = f"{type(root).__name__}: {_first_line(root)}" if root is not e else _first_line(e)
    where = f" at {frame}" if frame else ""
    return f"cannot compute the shape of an op of {name}{where}: {cause}"


def _user_frame(stack: list[traceback.FrameSummary]) -> str | None:
    """The innermost frame outside torch's own modules, as `file:line (code)`."""
    frames = [f for f in stack if not any(p in f.filename for p in _INTERNAL)]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno}" + (f" ({f.line.strip()})" if f.line and f.line.strip() else "")


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
# (and this file: symbolic_trace's calls pass through `_RandomWithoutInputs`)
_INTERNAL = ("/torch/fx/", "/torch/_dynamo/", "/torch/nn/modules/module.py", "/torch/_ops.py", __file__)


def source_line(node: torch.fx.Node) -> str | None:
    """The innermost user frame of an FX node's stack trace, as `file:line (code)`."""
    trace = node.meta.get("stack_trace") or node.stack_trace
    if not trace:
        return None
    frames = [m for m in _FRAME.finditer(trace) if not any(p in m.group(1) for p in _INTERNAL)]
    if not frames:
        return None
    f = frames[-1]
    code = f.group(4).strip()
    return f"{f.group(1)}:{f.group(2)}" + (f" ({code})" if code and not code.startswith("File ") else "")


_AFFINE = {operator.add, operator.sub, operator.neg, operator.pos, torch.sym_sum}
_NOT_AFFINE = {operator.floordiv, operator.mod, operator.truediv, operator.pow, min, max, math.floor, math.ceil,
               math.sqrt, torch.sym_max, torch.sym_min, torch.sym_float, torch.sym_int}  # fmt: skip


# a tensor's numel and strides: products of its sizes
_PRODUCTS = {"numel", "nelement", "stride", torch.numel, torch.ops.aten.sym_numel, torch.ops.aten.sym_numel.default,
             torch.ops.aten.sym_stride, torch.ops.aten.sym_stride.int}  # fmt: skip


_COMPARE = {operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.not_}


def _is_assert(target: Any) -> bool:
    return target in (torch._assert, torch._check, torch._check_is_size) or "assert" in str(target)


def _python_op(target: Any) -> bool:
    """A Python operator, builtin or math function (integer arithmetic), not a torch op on tensors."""
    return getattr(target, "__module__", None) in ("_operator", "operator", "builtins", "math")


def sizes_unseen(captured: Captured, values: tuple[dict, dict] | None = None) -> str | None:
    """Why integers the graph computes from its input sizes may not be affine in them (None: every such integer is
    a graph node, and each is a sum of sizes times constants). A shape family infers each integer's line in the
    sizes from two compiles, which is only sound for those: `x[:, : x.shape[1] // 2]` has 5 at 10 and 11 tokens and
    6 at 12. A graph whose capture evaluated sizes in Python (dynamo's static export, a static dynamo graph) hides
    them as constants, so it gets no family. `values`: the two compiles' sizes by node name (`Imported.sizes`):
    any arithmetic on sizes equal in both (nanoGPT's `C // n_head`, a head's `k.size(-1) ** -0.5`) is a constant
    of the family (affine sizes equal at two points of its line are equal along all of it)."""
    gm = captured.gm
    if captured.how == "dynamo":
        return "the capture evaluated the input sizes in Python (static shapes): integers made from them are constants"
    sized: set[torch.fx.Node] = set()
    symbolic = captured.how == "symbolic_trace"

    def constant(nodes) -> bool:  # (each equal at both compiles)
        return values is not None and all(n.name in values[0] and values[0][n.name] == values[1].get(n.name, None)
                                          for n in nodes)  # fmt: skip

    def refused(node, what: str) -> str:
        where = source_line(node)
        return f"{node.name} = {what}" + (f" ({where})" if where else "")

    # numbers made from sizes in a way not known to be affine -> why: refused once one reaches a value of the graph
    # (a tensor op, an output); one only compared or checked (HF's cache `keys.numel() == 0`, which dynamo guards)
    # changes nothing the graph computes
    bad: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if node.op == "placeholder":
            if isinstance(value, torch.SymInt) or node.type is torch.SymInt:
                sized.add(node)
                symbolic = True
            elif isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
                symbolic = True
            continue
        inputs = node.all_input_nodes
        target = node.target
        if (why := next((bad[a] for a in inputs if a in bad), None)) is not None:
            if node.op in ("call_function", "call_method") and _is_assert(target):
                continue
            number = isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                values is not None and node.name in values[0]) or target in _COMPARE  # fmt: skip
            if node.op == "call_function" and _python_op(target) and number:
                bad[node] = why  # (arithmetic on it, a comparison: a number not known to be affine either)
                continue
            return why
        if node.op not in ("call_function", "call_method"):
            continue
        name = getattr(target, "__name__", target)
        if (target is getattr and len(node.args) > 1 and node.args[1] == "shape") or target in ("size", "dim") or (
            target in (torch.ops.aten.sym_size, torch.ops.aten.sym_size.int) or target is len
        ):
            sized.add(node)
        elif target in _PRODUCTS:  # a product of a tensor's sizes: affine only where at most one of them moves
            if constant([node]):
                sized.add(node)
            else:
                bad[node] = refused(node, f"{name} of a tensor, a product of its sizes, moves: not known to be affine")
        elif not inputs or any(a not in sized for a in inputs):
            continue  # (an op on tensors, which may read sizes: not integer arithmetic on sizes)
        elif target is operator.getitem or target in _AFFINE or (
            target is operator.mul and sum(isinstance(a, torch.fx.Node) for a in node.args) == 1  # (not n * n)
        ):
            sized.add(node)  # (a size plus or times a constant)
        elif constant(inputs):
            sized.add(node)  # (of sizes that do not move: a constant)
        elif (target is operator.mul or target in _NOT_AFFINE or _python_op(target)
              or (isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool))
              or (values is not None and node.name in values[0])):  # fmt: skip
            # (any other op making a number of sizes, `>>`, `&`, `abs`, a comparison among them: not known to be
            # affine; a symbolic trace's nodes carry no example value, their numbers are in `values`)
            bad[node] = refused(node, f"{name} of sizes is not affine in them")
    if not symbolic:
        return "a graph specialized to its input sizes (static shapes)"
    return None
