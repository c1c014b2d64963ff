"""`compile()` and `CompiledModule`: capture, import, run the pipeline, lower, execute.

A CompiledModule specializes on its input signature (tensor shapes, dtypes, devices, the non-tensor
arguments, which inputs share storage) and on the module state that tracing reads (the training flags, torch's
TF32 switch); each is compiled once and cached. Outputs come back in the structure the model returns.
Each compile is logged (`dlblas_compiler.compile`, `.fusion`, `.codegen`: see `logs`) and, with a debug folder
(`dump_ir`, `DLBLAS_DEBUG_DIR`), written to its own subfolder (see `report.debug`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import importlib.metadata
import logging
import operator
import os
import pickle
import sys
import threading
import time
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.utils import _pytree as pytree

from .dialects import FusedOp, TorchCallOp
from .errors import DataDependent, EagerOnly, FrontendError, ParametersChanged, UnsupportedError
from .frontend import Captured, Imported, capture, dynamo_call, import_graph, sizes_unseen, traces, unread_ints
from .fusion.patterns import patterns_by_priority
from .fusion.planner import fusion_notes
from .fusion.templates import TEMPLATES, KernelLowering
from .logs import get_logger
from .lowering import dump_kernels, lower_module, lower_regions
from .numerics import compare
from .options import Options
from .passes import PipelineResult, run_pipeline
from .passes.families import NotAFamily, unify
from .report import Report, debug
from .report.text import count, times
from .runtime import Program, build_program
from .runtime.families import (
    Family,
    calls_hold,
    first_choices,
    int_positions,
    masks_hold,
    moved_calls,
    no_gc,
    sizes_of,
    surroundings,
)
from .runtime.outputs import OutputGuard, output_guard
from .runtime.program import rebuild_program
from .tuning.cache import bucket, default_path

log = get_logger("compile")
_FLAT = (torch.Tensor, torch.nn.Parameter, int, float, bool, type(None))
_LEAF = (torch.Tensor, torch.nn.Parameter, int, float, bool)  # (pytree's leaves: None is a node without any)


def call_leaves(args: tuple, kwargs: dict) -> tuple[list, tuple] | None:
    """The call's leaves (None among them, as in dynamo's input spec) in pytree's order and a hashable key of its
    structure, made without pytree, for the calls modules usually get: tensors, numbers and None, positional or by
    keyword, alone or in flat tuples and lists (a decoder layer's `position_embeddings=(cos, sin)`). None for
    anything else, which pytree flattens. (pytree's flatten and its spec's text took ~20 of the ~40 µs our side of
    a Hugging Face layer's call costs on the host, NOTES 151.)"""
    leaves: list = []
    shape: list = []
    for part in (args, kwargs.values()):
        for v in part:
            kind = type(v)
            if kind in _LEAF:
                leaves.append(v)
                shape.append(1)
            elif v is None:
                leaves.append(None)
                shape.append(0)
            elif kind is tuple or kind is list:
                inner = []
                for x in v:
                    if type(x) in _LEAF:
                        leaves.append(x)
                        inner.append(1)
                    elif x is None:
                        leaves.append(None)
                        inner.append(0)
                    else:
                        return None
                shape.append((kind is list, tuple(inner)))
            else:
                return None
    return leaves, ("call", len(args), tuple(kwargs), tuple(shape))


def call_structure(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """(the call's leaves, a hashable key of its structure): the positional arguments themselves where each is a
    tensor, a number or None (dynamo's calls); else `call_leaves`; else pytree's leaves and its spec's text."""
    if not kwargs and all(type(a) in _FLAT for a in args):
        return args, len(args)
    flat = call_leaves(args, kwargs)
    if flat is not None:
        return flat
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return leaves, str(spec)


def signature_of(args: tuple, kwargs: dict, unread: frozenset[int] = frozenset(),
                 flat: tuple[Any, Any] | None = None) -> tuple:  # fmt: skip
    """Hashable description of a call's inputs: what a specialization is keyed by (shapes, dtypes, devices,
    non-tensor values, which tensors share storage, and the identity of each parameter passed as an input: dynamo
    passes a module's parameters as graph inputs and one graph serves every instance of the module class, while a
    specialization reads the parameters it was compiled with). The positional ints at `unread` are left out: no
    op reads them (`importer.unread_ints`). `flat`: the call's `call_structure`, where the caller has it."""
    leaves, spec = call_structure(args, kwargs) if flat is None else flat
    sig, tensors = [], []
    for i, v in enumerate(leaves):
        if i in unread and leaves is args:  # (an int no op reads: `importer.unread_ints`)
            sig.append(("V", "unread int"))
            continue
        kind = type(v)  # (isinstance on Parameter runs Python code: too slow for hundreds of inputs per call)
        if kind is torch.nn.Parameter or (kind is not torch.Tensor and isinstance(v, torch.nn.Parameter)):
            sig.append(("P", id(v), v.shape, v.dtype, v.device))
        elif kind is torch.Tensor or isinstance(v, torch.Tensor):
            sig.append((v.shape, v.dtype, v.device))
            tensors.append(v)
        elif kind is float:  # (as text: -0.0 == 0.0, and a model may divide by it; NaN != NaN)
            sig.append(("V", "float", v.hex()))
        else:
            try:
                hash(v)
                sig.append(("V", type(v).__name__, v))
            except TypeError:
                sig.append(("V", type(v).__name__, repr(v)))
    return (spec, tuple(sig), _alias_pattern(tensors))


# held while a specialization is captured, compiled and called for the first time: symbolic_trace and dynamo patch
# torch's modules globally while they trace (two threads tracing at once broke every nn.Module of the process), and a
# first call tunes
_COMPILING = threading.RLock()


def _alias_pattern(tensors) -> tuple | None:
    """Which input tensors share storage, and how (None when none do): `cm(x, x)` is not `cm(x, y)` for a
    model that writes an input in place, nor is `cm(c.imag, c.conj().imag)` (one view negated by its bit). An
    empty tensor has no memory to share, but passed twice it is one input of the graph dynamo traces: its identity
    counts."""
    ptrs = [t.untyped_storage().data_ptr() if t.numel() else ("empty", id(t)) for t in tensors]
    if len(set(ptrs)) == len(ptrs):
        return None
    return tuple((ptrs.index(p), t.storage_offset(), t.stride(), t.is_neg(), t.is_conj())
                 for p, t in zip(ptrs, tensors))


class _Key:
    """A specialization key that hashes its (long) tuple once: it is looked up more than once per call."""

    __slots__ = ("value", "hash")

    def __init__(self, value: tuple):
        self.value, self.hash = value, hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Key) and self.hash == other.hash and self.value == other.value)


def _picker(positions: list[int]) -> Callable[[tuple], tuple]:
    """args -> the tuple of args[i] for i in `positions` (one C call)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return (lambda args: (args[positions[0]],)) if positions else (lambda args: ())


def _sizes_follow_ints(gm: torch.nn.Module) -> bool:
    """Whether each symbolic size, stride or offset of a dynamo graph's tensor inputs is a function of the
    graph's SymInt inputs alone (dynamo passes each free symbol as one), read from the placeholders' examples."""
    graph = getattr(gm, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return False
    examples = [n.meta.get("example_value") for n in graph.nodes if n.op == "placeholder"]
    passed = set().union(*(free_symbols(v) for v in examples if isinstance(v, torch.SymInt)))
    return bool(examples) and all(
        isinstance(v, torch.Tensor | torch.SymInt | int | float | bool) and free_symbols(v) <= passed for v in examples
    )


def input_kinds(example_inputs: list) -> str:
    """Each of a dynamo graph's inputs as "P" (a parameter), "T" (another tensor) or "V" (another value)."""
    return "".join(
        "P" if isinstance(v, torch.nn.Parameter) else "T" if isinstance(v, torch.Tensor) else "V" for v in example_inputs
    )


# Modules of forward hooks a capture traces into its graph, each doing nothing unless its own forward records: Hugging
# Face's output capturing (a call with output_hidden_states installs them and leaves them on the model).
TRACED_HOOKS = ("transformers.utils.output_capturing",)


def _traced_hook(hook: Callable) -> bool:
    return getattr(hook, "__module__", None) in TRACED_HOOKS


def _hook_dicts(modules) -> list[dict]:
    """The dicts of forward hooks a call of `modules` would run: the global ones first, then each module's (checked
    each call for being empty, at C speed)."""
    module = torch.nn.modules.module
    return [module._global_forward_hooks, module._global_forward_pre_hooks,
            *(d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks))]  # fmt: skip


_GRAD = ("gradients are needed (grad mode is on and a parameter or an input requires grad), and the compiled "
         "kernels do not build an autograd graph",
         "call it under torch.no_grad() or torch.inference_mode() to run the compiled code")  # fmt: skip


def floats_as_scalars(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions of a dynamo graph's inputs that are Python floats dynamo passes as 0-d tensors and reads with
    `.item()` (module attributes such as a LayerNorm's eps under `torch.compile(dynamic=True)`, which leaves floats
    unspecialized): the graph is rewritten to take the floats themselves, so that a specialization is compiled per
    value as for any float argument (its `.item()` cannot be computed while tracing). Callers pass `a.item()` there."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i, n in enumerate(placeholders):
        arg = n.meta.get("grapharg")
        if not getattr(arg, "pass_arg_as_tensor", False) or not n.users:
            continue
        if all(u.op == "call_method" and u.target == "item" and len(u.args) == 1 and not u.kwargs for u in n.users):
            for u in list(n.users):
                u.replace_all_uses_with(n)
                gm.graph.erase_node(u)
            found.append(i)
    if found:
        gm.recompile()
    return tuple(found)


def _scalars(args: tuple, floats: tuple[int, ...]) -> tuple:
    """A dynamo graph's call arguments with the 0-d tensors at `floats` (`floats_as_scalars`) as Python floats."""
    return tuple(a.item() if i in floats else a for i, a in enumerate(args)) if floats else args


def _precision_mode() -> tuple:
    """torch's switches a specialization is compiled under: TF32 for fp32 matmuls (the generated kernels follow it),
    and autocast on each device type, with its dtype. A program compiled outside autocast runs its kernels in the
    model's dtypes, where eager computes linears and attention in the autocast dtype; one compiled inside it casts
    their operands as autocast does (`Importer._autocast`)."""
    return (torch.backends.cuda.matmul.allow_tf32, _autocast("cuda"), _autocast("cpu"))


def _autocast(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def _finish(spec: Specialization, args: tuple, kwargs: dict, flat: list) -> Specialization:
    """The call path's shortcuts and eager's output layout for a specialization."""
    imported, captured = spec.imported, spec.captured
    # (an instance's outputs alias as the first compile's: its IR is that one's structure)
    spec.guard = spec.family.guard if spec.family is not None else output_guard(spec.pipeline.module, imported) or None
    spec.direct = (not kwargs and len(flat) == len(args) and imported.arg_positions == list(range(len(args)))
                   and not imported.complex_inputs)  # fmt: skip
    spec.direct = spec.direct and all(f is a for f, a in zip(flat, args))
    # (flattening depends on the structure alone, which the specialization's key fixes: one call decides, if
    # no tensor sits at two places in it: the key does not tell apart two empty tensors from one passed twice)
    leaves = call_leaves(args, kwargs)
    tensors = [id(x) for x in leaves[0] if isinstance(x, torch.Tensor)] if leaves is not None else []
    spec.same_leaves = (leaves is not None and len(leaves[0]) == len(flat) and len(set(tensors)) == len(tensors)
                        and all(a is b for a, b in zip(leaves[0], flat)))  # fmt: skip
    marker = object()  # (the output is that one value itself, whatever specs wrap it: a leaf, dynamo's [*] then *)
    spec.single = imported.out_leaves == [("value", 0)] and captured.unflatten([marker], imported.out_spec) is marker
    return spec


@dataclass
class Specialization:
    """One compiled input signature."""

    captured: Captured
    imported: Imported
    pipeline: PipelineResult
    executor: Program
    compile_seconds: float
    notes: list[str] = field(default_factory=list)
    guard: OutputGuard | None = None  # eager's output aliasing and layout (None: nothing to do)
    signature: str = ""  # the input tensors, for logs and the debug folder
    debug_dir: str | None = None  # this specialization's debug folder (see `report.debug`)

    direct: bool = False  # the graph's inputs are exactly the call's positional arguments
    same_leaves: bool = False  # the graph's inputs are exactly the call's `call_leaves` (a call by keyword)
    single: bool = False  # the output is one tensor
    skeleton: tuple = ()  # the signature with its sizes blanked (`sizes_of`)
    sizes: tuple[int, ...] = ()  # its sizes
    family: Family | None = None  # the shape family it was instantiated from (None: compiled in full)
    key: Any = None  # its key in the compiled module's specializations
    ready: bool = False  # its first call (tuning, the first run) is over: other threads may call it

    def __call__(self, args: tuple, kwargs: dict, leaves: tuple[Any, Any] | None = None) -> Any:
        """Run on a call's arguments; `leaves`: their `call_structure`, the graph's inputs where `same_leaves`."""
        if self.direct and not kwargs:
            flat = args
            inputs = list(args)
        else:
            flat = leaves[0] if self.same_leaves and leaves is not None else self.captured.flatten(args, kwargs)
            inputs = self.imported.program_inputs(flat)
        outs = self.executor(inputs)
        if self.guard is not None:
            outs = self.guard(inputs, self.imported.params, outs)
        if self.imported.writes:
            outs = self._write_back(flat, outs)
        if self.single:
            return outs[0]
        values = [outs[x] if kind == "value" else x(flat) if kind == "sym" else x for kind, x in self.imported.out_leaves]
        return self.captured.unflatten(values, self.imported.out_spec)

    def _write_back(self, flat, outs: tuple) -> tuple:
        """Copy the final values of the inputs and buffers the model writes in place into them (eager semantics);
        an output eager returns as the written tensor itself is that tensor."""
        targets = []
        with torch.no_grad():
            for kind, key, i in self.imported.writes:
                target = flat[key] if kind == "input" else self.imported.params[key]
                if outs[i] is not target:  # (a cache the program updated in place is already there)
                    target.copy_(outs[i])
                targets.append(target)
        if not self.imported.returns_written:
            return outs
        outs = list(outs)
        for j, w in self.imported.returns_written.items():
            outs[j] = targets[w]
        return tuple(outs)


def _check_devices(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    if len(devices) > 1:
        raise FrontendError(f"the model's parameters are spread over {sorted(map(str, devices))}; put them on one device")
    if not devices:
        return
    (dev,) = devices
    for i, v in enumerate(pytree.tree_leaves((args, kwargs))):
        host_scalar = isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu"  # (read as a number)
        if isinstance(v, torch.Tensor) and v.device != dev and not host_scalar:
            raise FrontendError(f"input {i} is on {v.device} but the model's parameters are on {dev}; move it first")


# Assignments of a parameter, buffer or submodule to any module in the process (`module.weight = nn.Parameter(..)`,
# `module.proj = nn.Linear(..)`), counted by torch's global registration hooks: a compiled module whose model may
# have changed since its last call compares what its model holds (`_holds`). Not while dynamo traces: Hugging Face's
# forward slices its ModuleList of layers (a new ModuleList each call), and a count dynamo traced would be guarded on
# its value, so every call would trace again.
_ASSIGNMENTS = [0]


def _count_assignment(*_args) -> None:
    if not torch.compiler.is_compiling():
        _ASSIGNMENTS[0] += 1  # (returns None: a hook's return value would replace what is assigned)


for _register in (torch.nn.modules.module.register_module_parameter_registration_hook,
                  torch.nn.modules.module.register_module_buffer_registration_hook,
                  torch.nn.modules.module.register_module_module_registration_hook):  # fmt: skip
    _register(_count_assignment)


def _traced(args: tuple, kwargs: dict) -> bool:
    """Whether dynamo or symbolic_trace is tracing this call of a compiled module (a compiled module inside a model
    compiled again, by `dc.compile` or `torch.compile`). Its arguments are then fake tensors or proxies: compiling
    from them had made a Linear the identity (every fake storage's address is 0). (symbolic_trace's flag is one for
    the process: another thread's call while it traces is told apart by its arguments, which are not proxies.)"""
    if torch.compiler.is_compiling():
        return True
    return torch.fx._symbolic_trace._is_fx_tracing_flag and any(
        isinstance(a, torch.fx.Proxy) for a in (*args, *kwargs.values()))  # fmt: skip


def _counted(fn: Callable) -> Callable:
    def counted(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            _count_assignment()

    # (a code object of its own: dynamo tells torch.nn.Module's methods apart by their code, and refused a traced
    # `del self.x` when __delattr__'s wrapper shared its code with register_parameter's)
    counted.__code__ = counted.__code__.replace(co_name=fn.__name__, co_qualname=fn.__qualname__)
    return functools.wraps(fn)(counted)


# Edits that fire none of those hooks, counted too: a submodule deleted (`del model.layers[1]`, a container's `pop`), a
# parameter set to None (`linear.bias = None`), a container's `insert` and `clear` (they write its dict directly)
for _owner, _method in ((torch.nn.Module, "__delattr__"), (torch.nn.Module, "register_parameter"),
                        (torch.nn.Sequential, "insert"), (torch.nn.ModuleList, "insert"),
                        (torch.nn.ModuleDict, "__delitem__"), (torch.nn.ModuleDict, "clear")):  # fmt: skip
    setattr(_owner, _method, _counted(getattr(_owner, _method)))
_reparametrize = torch.nn.utils.stateless._reparametrize_module


@contextlib.contextmanager
def _counted_reparametrize(*args, **kwargs):
    """`torch.func.functional_call` swaps tensors into the module's dicts for one call and back: both counted."""
    try:
        with _reparametrize(*args, **kwargs) as swapped:
            _count_assignment()
            yield swapped
    finally:
        _count_assignment()


torch.nn.utils.stateless._reparametrize_module = _counted_reparametrize


def _holds(model: torch.nn.Module) -> tuple:
    """What a compile of `model` read and a later call must find again: its submodules, parameters and buffers (each
    tensor by identity; values and `.data` swaps are checked where they are read, runtime/weights.py)."""
    return (tuple(map(id, model.modules())), tuple((n, id(p)) for n, p in model.named_parameters(remove_duplicate=False)),
            tuple((n, id(b)) for n, b in model.named_buffers(remove_duplicate=False)))  # fmt: skip


class CompiledModule(torch.nn.Module):
    """The compiled form of a module: call it like the module. See `ir()`, `passes`, `report()`.

    A parameter, buffer or submodule assigned anew after compiling (`model.proj.weight = nn.Parameter(w)`, a layer
    replaced or deleted, weights tied, a bias set to None, `torch.func.functional_call`) or a parameter whose dtype,
    shape or device changed (`model.half()`) makes the next call compile again from the model as it is then; values
    written into the same tensors (in place, `load_state_dict`, `p.data = t`) are read by the compiled code as they
    are."""

    # (nn.Module's own call, bound here: while another thread's capture traces, symbolic_trace has replaced
    # `nn.Module.__call__` for every module of the process, and a call of this module would enter that tracer's patch
    # instead of waiting for the compile lock)
    __call__ = torch.nn.Module._wrapped_call_impl

    def __init__(self, model: torch.nn.Module, options: Options, name: str | None = None):
        super().__init__()
        self.model = model
        self.options = options
        self.name = name or type(model).__name__  # the report's title and the debug folder's name
        self._debug_dir: str | None = None  # this module's debug folder, made at its first compile
        self._specs: OrderedDict[_Key, Specialization] = OrderedDict()  # least recently used first
        self._guarded: dict[tuple, Specialization] = {}  # `guarded`'s keys (each names a specialization in _specs)
        self._picks: tuple[Callable, Callable, Callable] | None = None  # see `trust_dynamo_guards`
        self.compile_count = 0  # specializations compiled so far (evicted ones included)
        self.instances = 0  # specializations instantiated from a shape family instead (see `_instance`)
        self._families: list[Family] = []
        self._not_affine: set[tuple] = set()  # (skeleton, buckets) where a family failed to verify
        self._last: Specialization | None = None
        self._unread = unread_ints(model)  # int inputs no op reads: not part of the key
        self._warned: set[str] = set()  # why calls ran eagerly, each warned once
        self._eager_only: tuple[str, str] | None = None  # why every call runs eagerly (`errors.EagerOnly`)
        self._read_model()
        # (a dynamo graph's parameters are its inputs, or attributes of the graph module itself)
        self._holding = None if isinstance(model, torch.fx.GraphModule) else _holds(model)
        self._assignments = _ASSIGNMENTS[0]
        # where this graph's compiles are kept across processes (`keep_traces`): the store and the graph's digest
        self.kept: tuple[traces.CompiledStore, str] | None = None
        self.kept_loads = 0  # compiles loaded from there instead of made

    # what a compile made is not saved with the module (`pickle`, `torch.save`, `copy.deepcopy`): a copy compiles
    # again at its first call, from its own copy of the model
    _MADE = ("_specs", "_guarded", "_picks", "_families", "_not_affine", "_last", "kept", "_submodules", "_params",
             "_hooks")  # fmt: skip

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._MADE}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "_specs", OrderedDict())
        self._guarded, self._picks, self._families, self._not_affine = {}, None, [], set()
        self._last, self.kept = None, None
        self._read_model()
        self._holding = None if isinstance(self.model, torch.fx.GraphModule) else _holds(self.model)
        self._assignments = _ASSIGNMENTS[0]

    def _read_model(self) -> None:
        model = self.model
        self._submodules = list(model.modules())  # whose training flags a trace reads (self.training branches)
        self._params = list(model.parameters())
        # forward hooks (a module's own and the global ones): a captured graph would keep what a hook did at trace time
        # (or drop it), and a hook collecting activations would see fake tensors once. Their dicts, checked each call
        # for being empty at C speed; a dynamo graph has its hooks traced into it already
        self._hooks = [] if isinstance(model, torch.fx.GraphModule) else _hook_dicts(self._submodules)

    def _check_holdings(self) -> None:
        """After an assignment somewhere in the process: if this model's submodules, parameters or buffers are no
        longer the ones compiled with, every specialization goes and the next call compiles afresh."""
        object.__setattr__(self, "_assignments", _ASSIGNMENTS[0])
        if self._holding is None or (holding := _holds(self.model)) == self._holding:
            return
        log.info("%s: a parameter, buffer or submodule was assigned anew since compiling: compiling again", self.name)
        self._forget()
        self._holding = holding

    def _forget(self) -> None:
        """Drop every specialization and family: the next call compiles afresh from the model as it is then."""
        for key in list(self._specs):
            self._drop(key)
        self._guarded.clear()
        self._families.clear()
        self._not_affine.clear()
        self._last = None
        self._read_model()

    def forward(self, *args, **kwargs):
        if _traced(args, kwargs):  # (inside a model another compile captures: the model's own code is what it traces)
            return self.model(*args, **kwargs)
        if _ASSIGNMENTS[0] != self._assignments:
            self._check_holdings()
        if self._eager_only is not None:
            return self._eager(args, kwargs, self._eager_only)
        if torch.is_grad_enabled() and self._needs_grad(args, kwargs):
            return self._eager(args, kwargs, _GRAD)
        if any(self._hooks) and (why := self._hooked()) is not None:
            return self._eager(args, kwargs, why)
        flat = call_structure(args, kwargs)
        key = _Key((signature_of(args, kwargs, self._unread, flat), tuple(m.training for m in self._submodules),
                    _precision_mode()))  # fmt: skip
        spec = self._specs.get(key)
        if spec is not None and spec.ready:
            return self._hit(key, spec, args, kwargs, flat)
        with _COMPILING:  # (one thread at a time compiles and makes a first call; another one then finds it ready)
            return self._first_call(key, flat, args, kwargs)

    def _first_call(self, key: _Key, flat: tuple, args: tuple, kwargs: dict):
        spec = self._specs.get(key)
        if spec is not None:
            return self._hit(key, spec, args, kwargs, flat)
        skeleton, sizes = sizes_of(key.value)
        # (no cyclic collections while the IR is built: each one walks every object of the IRs already kept,
        # which costs more than an instance, and ~8% of a 32-layer dc.compile, capture included, on the CPU)
        with no_gc():
            spec = self._instance(skeleton, sizes, args, kwargs) if self.options.shape_families else None
            if spec is None:
                try:
                    spec = self._specialize(args, kwargs, key)
                except EagerOnly as e:  # (the model's own code needs what compiled kernels lack: every call eager)
                    if self.options.strict:
                        raise
                    self._eager_only = (e.reason, e.instead)
                    return self._eager(args, kwargs, self._eager_only)
                except DataDependent as e:  # (in a graph dynamo handed over: that graph runs as dynamo traced it)
                    if self.options.strict or not isinstance(self.model, torch.fx.GraphModule):
                        raise
                    self._eager_only = (f"a shape in this graph depends on a tensor's values ({e.node})",
                                        "the rest of the model is compiled as usual")  # fmt: skip
                    return self._eager(args, kwargs, self._eager_only)
                spec.skeleton, spec.sizes = skeleton, sizes
                self.compile_count += 1
                if self.options.shape_families:
                    self._join_family(spec)
        spec.key = key
        self._specs[key] = spec
        while len(self._specs) > self.options.max_specializations:
            self._evict(spec)
        self._last = spec
        try:
            out = spec(args, kwargs, flat)
        except ParametersChanged:  # (an instance of a family compiled before `model.half()`)
            self._forget()
            return self._first_call(key, flat, args, kwargs)
        spec.ready = True
        if spec.debug_dir:  # (after the first call: it tunes, and the choices are known)
            self._write_debug(spec)
        return out

    def _hit(self, key: _Key, spec: Specialization, args: tuple, kwargs: dict, flat: tuple | None = None):
        self._specs.move_to_end(key)
        if spec is not self._last:  # (a program is captured from its second call in a row: see Program.__call__)
            spec.executor.repeats = 0
            object.__setattr__(self, "_last", spec)  # (a plain attribute: nn.Module's __setattr__ costs ~1 µs)
        try:
            return spec(args, kwargs, flat)
        except ParametersChanged:  # (found before any step ran: nothing was written)
            log.info("%s: a parameter's dtype, shape or device changed since compiling: compiling again", self.name)
            with _COMPILING:  # (another thread may be finding the same)
                if self._specs.get(key) is spec:
                    self._forget()
            return self.forward(*args, **kwargs)

    def guarded(self, args: tuple):
        """A call from the frame dynamo compiled this graph for (see `DynamoBackend`): dynamo's guards have already
        checked each tensor input's type, dtype, device and fixed sizes, and every symbolic size is a function of
        the int arguments (`_sizes_follow_ints`). The specialization is then found from the int and other
        non-tensor arguments, the parameters' identities and which tensor inputs share storage (the parts of
        `signature_of` dynamo does not guard), without describing each of a 32-layer model's ~400 inputs on every
        decode step; a key seen for the first time goes through `forward`."""
        picks = self._picks
        if picks is None or torch.is_grad_enabled():
            return self.forward(*args)
        params, tensors, values = picks
        key = (tuple(map(id, params(args))), tuple(v.hex() if type(v) is float else v for v in values(args)),
               _alias_pattern(tensors(args)),
               tuple(m.training for m in self._submodules), _precision_mode())  # fmt: skip
        spec = self._guarded.get(key)
        if spec is None:
            out = self.forward(*args)
            self._guarded[key] = self._last
            return out
        return self._hit(spec.key, spec, args, {})

    def trust_dynamo_guards(self, kinds: str) -> None:
        """Let `guarded` serve the calls dynamo makes with inputs of these kinds (`input_kinds`: parameters,
        other tensors and non-tensor values by position), where the graph's symbolic sizes follow its int inputs."""
        if not _sizes_follow_ints(self.model):
            return
        self._picks = tuple(_picker([i for i, k in enumerate(kinds) if k == kind and i not in self._unread])
                            for kind in "PTV")

    def _drop(self, key: _Key) -> None:
        """Forget a specialization (its CUDA graph's memory goes at once)."""
        spec = self._specs.pop(key, None)
        if spec is None:  # (another thread dropped it)
            return
        spec.executor.release()
        for k in [k for k, s in self._guarded.items() if s is spec]:
            del self._guarded[k]

    def _evict(self, keep: Specialization) -> None:
        """Drop the least recently used instance (rebuilt in milliseconds), else the least recently used compile
        a shape family can instantiate again, else the least recently used compile: a generate() with the dynamic
        cache makes a new instance every token, and must not push out the compiles its next call needs (the
        prefill, a length at a bucket's edge)."""

        victim = next((k for k, s in self._specs.items() if s.family is not None and s is not keep), None)
        if victim is None:
            compiles = [k for k, s in self._specs.items() if s is not keep]
            victim = next((k for k in compiles if any(f.skeleton == self._specs[k].skeleton and f.shapes.covers(
                self._specs[k].sizes) for f in self._families)), compiles[0])  # fmt: skip
        self._drop(victim)

    def _needs_grad(self, args: tuple, kwargs: dict) -> bool:
        """Grad mode is on and a parameter or an input requires grad: the call must build an autograd graph."""
        if any(p.requires_grad for p in self._params):
            return True
        leaves = args if not kwargs else pytree.tree_leaves((args, kwargs))
        return any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves)

    def _eager(self, args: tuple, kwargs: dict, why: tuple[str, str]):
        """A call the compiled code cannot serve runs the module eagerly, with one warning per reason (strict: an
        error): training (`_GRAD`), forward hooks (`_hooked`). `why`: (the reason, what to do instead)."""
        reason, instead = why
        if self.options.strict:
            raise UnsupportedError(f"{reason}; {instead}")
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"dlblas_compiler: {reason}: running {type(self.model).__name__} eagerly; {instead}",
                          stacklevel=3)  # fmt: skip
        return self.model(*args, **kwargs)

    def _hooked(self) -> tuple[str, str] | None:
        """Why a call with forward hooks runs eagerly, naming the hooked modules; None where every hook is one that
        the capture traces into the graph and that does nothing outside its own forward's recording (`TRACED_HOOKS`:
        Hugging Face's output capturing, left on the model by a call with output_hidden_states)."""
        if all(_traced_hook(h) for d in self._hooks if d for h in d.values()):
            return None
        names = [name or type(self.model).__name__ for name, m in self.model.named_modules()
                 if any(not _traced_hook(h) for d in (m._forward_hooks, m._forward_pre_hooks) for h in d.values())]
        if any(not _traced_hook(h) for d in self._hooks[:2] for h in d.values()):
            names.insert(0, "every module (global hooks)")
        return (f"forward hooks are registered on {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}, which a "
                "captured graph cannot run", "remove them, or compile through dynamo, which traces hooks into its "
                "graphs: torch.compile(model, backend=\"dlblas\")")  # fmt: skip

    def _specialize(self, args: tuple, kwargs: dict, key: _Key | None = None) -> Specialization:
        t0 = time.perf_counter()
        signature = debug.signature_text(args, kwargs)
        folder = self._spec_folder(signature)
        _check_devices(self.model, args, kwargs)
        captured = capture(self.model, args, kwargs)
        flat = captured.flatten(args, kwargs)
        kept_at = self._kept_path(key) if key is not None and folder is None else None
        kept = self._load_kept(kept_at, captured, flat)
        ir_dir, kernel_dir = (os.path.join(folder, "ir"), os.path.join(folder, "kernels")) if folder else (None, None)
        if kept is not None:
            imported, result = kept
        else:
            imported = import_graph(captured, flat)
            check = None
            if self.options.check_each_pass:
                check = self._checker(imported, captured, args, kwargs, flat)
            result = run_pipeline(imported.module, self.options.pipeline, ir_dir, check)
            if kept_at is not None:
                self._save_kept(kept_at, (imported, result), captured, flat)
        self._log_fusion(result)
        lowered = {} if self.options.backend == "reference" else lower_module(result.module, kernel_dir)
        self._log_codegen(lowered)
        program = build_program(result.module, lowered, imported, self.options)
        spec = Specialization(
            captured, imported, result, program, time.perf_counter() - t0, [*captured.notes, *imported.notes]
        )
        spec.signature, spec.debug_dir = signature, folder
        log.info("%s: compiled specialization %d (%s) in %.2f s%s", self.name, self.compile_count, signature,
                 spec.compile_seconds, f"; debug folder {folder}" if folder else "")  # fmt: skip
        return _finish(spec, args, kwargs, flat)

    # -- compiles kept across processes (`keep_traces`) --------------------------------------------------------
    def _kept_path(self, key: _Key) -> Any:
        """Where this graph's compile for this key is kept, or None: nothing kept for this module, options that want
        the passes run (`check_each_pass`), a user's fusion pattern (its code is not part of the key), or a key
        that names something only this process knows."""
        if self.kept is None or self.options.check_each_pass or any(not p.builtin for p in patterns_by_priority()):
            return None
        (spec, sig, aliases), training, precision = key.value
        order: dict[int, int] = {}  # a parameter's identity, as the order it first appears in
        sig = tuple(("P", order.setdefault(v[1], len(order)), *v[2:]) if v and v[0] == "P" else v for v in sig)
        text = repr((spec, sig, aliases, training, precision))
        if " at 0x" in text:
            return None
        store, digest = self.kept
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        templates = sorted((n, type(t).__module__, type(t).__qualname__) for n, t in TEMPLATES.items())
        versions = [importlib.metadata.version(p) for p in ("triton", "xdsl") if _installed(p)]
        return store.path(digest, text, device, templates, versions)

    def _load_kept(self, path: Any, captured: Captured, flat: list) -> tuple[Imported, PipelineResult] | None:
        if path is None or not path.exists():
            return None
        t0 = time.perf_counter()
        try:
            imported, result = traces.load_compiled(path.read_bytes(), captured.gm, flat)
        except Exception as e:  # noqa: BLE001 - another version's file, a partial write: compile instead
            log.warning("%s: the kept compile %s was not loaded (%s: %s); compiling", self.name, path.name,
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")  # fmt: skip
            return None
        log.info("%s: loaded the kept compile %s in %.2f s", self.name, path.name, time.perf_counter() - t0)
        self.kept_loads += 1
        traces.CompiledStore.used(path)
        return imported, result

    def _save_kept(self, path: Any, value: tuple, captured: Captured, flat: list) -> None:
        try:
            self.kept[0].save(path, traces.dump_compiled(value, captured.gm, flat))
        except Exception as e:  # noqa: BLE001 - not kept: the next process compiles again
            log.warning("%s: the compile was not kept (%s: %s)", self.name, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")  # fmt: skip

    # -- shape families: one compile serves every length of a bucket ---------------------------------------------
    def _join_family(self, spec: Specialization) -> None:
        """After a full compile: if an earlier full compile differs from it only in sizes (all in the same
        power-of-two buckets) and both IRs are one structure (`passes.families.unify`), the pair becomes a
        family whose later sizes are instantiated instead of compiled."""
        for other in reversed(list(self._specs.values())):
            if other.family is not None or other.skeleton != spec.skeleton or other.sizes == spec.sizes:
                continue
            if any(a != b and bucket(a) != bucket(b) for a, b in zip(other.sizes, spec.sizes)):
                continue
            if (spec.skeleton, tuple(map(bucket, spec.sizes))) in self._not_affine:
                return
            why = sizes_unseen(spec.captured, (other.imported.sizes, spec.imported.sizes))
            ints = int_positions(spec.skeleton)
            if spec.captured.how == "symbolic_trace" and any(other.sizes[i] != spec.sizes[i] for i in ints):
                why = ("an int argument differs, and symbolic_trace ran the Python code on it (branches, `%`, `//`) at "
                       "the trace: its graph holds the results as constants")  # fmt: skip
            if why:
                log.info("%s: no shape family for sizes %s and %s: %s", self.name, other.sizes, spec.sizes, why)
                spec.notes.append(f"no shape family (each new length is compiled): {why}")
                return
            try:
                call_moves = surroundings(other, spec)
                shapes = unify(other.pipeline.module, spec.pipeline.module, (other.sizes, spec.sizes))
                inputs = unify(other.pipeline.input_module, spec.pipeline.input_module, (other.sizes, spec.sizes)) if (
                    other.imported.value_decisions) else None  # fmt: skip
            except NotAFamily as e:
                log.info("%s: sizes %s and %s do not form a shape family: %s", self.name, other.sizes, spec.sizes, e)
                return
            family = Family(shapes, spec.skeleton, other.captured, other.imported, other.pipeline, list(other.notes),
                             call_moves, inputs, other.executor, first_choices(other.executor), other.guard)  # fmt: skip
            self._families.append(family)
            del self._families[: -self.options.max_specializations]
            log.info("%s: sizes %s and %s form a shape family (%d sizes move); other sizes in their buckets are "
                     "instantiated, not compiled", self.name, other.sizes, spec.sizes, len(shapes.moves))  # fmt: skip
            return

    def _instance(self, skeleton: tuple, sizes: tuple[int, ...], args: tuple, kwargs: dict) -> Specialization | None:
        """The specialization for these sizes from a shape family covering them (None: compile it). Only the ops
        the sizes change are copied, verified and lowered again, one copy per class of equal ops (each layer's
        copy of an op; the other layers run its step on their values); the first compile's program lends the
        rest of its steps, with its tuned choices."""
        for family in reversed(self._families):
            if family.skeleton != skeleton or not family.shapes.covers(sizes):
                continue
            t0 = time.perf_counter()
            try:
                builder = family.program.recipe.builder
                replaced, aliases, shared, retyped = family.shapes.replacements(sizes, family.moved_calls,
                                                                                builder.share_key, builder.retypes)
                calls = moved_calls(family, family.shapes.parameter(sizes))
                imported = dataclasses.replace(family.imported, calls={**family.imported.calls, **calls}) if calls else family.imported
                if family.inputs is not None and (why := masks_hold(family, sizes, imported)):
                    log.info("%s: sizes %s compiled in full: %s", self.name, sizes, why)
                    return None
                if why := calls_hold(family, sizes, imported):
                    raise NotAFamily(why)
            except NotAFamily as e:  # a size that is not affine in the others: the family's instances go with it
                log.warning("%s: shape family of sizes %s dropped: %s", self.name, family.shapes.sizes, e)
                self._families.remove(family)
                self._not_affine.add((skeleton, tuple(map(bucket, sizes))))  # (no new family there: it would fail too)
                for key in [k for k, s in self._specs.items() if s.family is family]:
                    self._drop(key)
                return None
            # (the signature's text names the debug folder and the log line; an instance made every token of a
            # dynamic cache does not spend a millisecond on it otherwise)
            wanted = self.options.dump_ir or log.isEnabledFor(logging.INFO)
            signature = debug.signature_text(args, kwargs) if wanted else ""
            folder = self._spec_folder(signature)
            regions = [op for op in replaced.values() if isinstance(op, FusedOp)]
            lowered = {} if self.options.backend == "reference" else lower_regions(regions)
            if folder:
                dump_kernels(lowered, os.path.join(folder, "kernels"))
            program = rebuild_program(family.program, replaced, lowered, imported, aliases, shared, retyped)
            program.inherit(family.choices)  # (tuned per bucket: the first compile's choices hold here)
            note = f"instantiated from the shape family of sizes {family.shapes.sizes[0]} and {family.shapes.sizes[1]}"
            spec = Specialization(family.captured, imported, family.pipeline, program, time.perf_counter() - t0,
                                  [*family.notes, note + " (no capture, import, passes or tuning)"])  # fmt: skip
            spec.signature, spec.debug_dir, spec.family, spec.skeleton, spec.sizes = signature, folder, family, skeleton, sizes
            self.instances += 1
            log.info("%s: instantiated %s from a shape family in %.3f s (%d ops copied, %d more run their steps)",
                     self.name, signature, spec.compile_seconds, len(replaced), len(shared))  # fmt: skip
            return _finish(spec, args, kwargs, family.captured.flatten(args, kwargs))
        return None

    def _materialized(self, spec: Specialization) -> Specialization:
        """An instance's whole IR at its sizes, made when first asked for (the report, `ir()`, the debug folder);
        its stage texts stay the first compile's."""
        if spec.family is not None and spec.pipeline is spec.family.pipeline:
            spec.pipeline = dataclasses.replace(spec.family.pipeline, module=spec.family.shapes.instantiate(spec.sizes))
        return spec

    # -- logs and the debug folder ------------------------------------------------------------------------------
    def _spec_folder(self, signature: str) -> str | None:
        """The next specialization's debug folder (None without a debug folder)."""
        if not self.options.dump_ir:
            return None
        if self._debug_dir is None:
            self._debug_dir = debug.numbered_folder(self.options.dump_ir, self.name)
        return os.path.join(self._debug_dir, f"{self.compile_count}-{debug.folder_name(signature)}")

    def _write_debug(self, spec: Specialization) -> None:
        try:
            os.makedirs(spec.debug_dir, exist_ok=True)
            debug.write_specialization(spec.debug_dir, self._report(self._materialized(spec)))
        except OSError as e:  # (a debugging aid must not break the model)
            warnings.warn(f"dlblas_compiler: could not write the debug folder {spec.debug_dir}: {e}", stacklevel=3)

    def _log_fusion(self, result: PipelineResult) -> None:
        flog = get_logger("fusion")
        if not flog.isEnabledFor(logging.INFO):  # (walking a 32-layer module costs time no one asked for)
            return
        from xdsl.dialects import func

        from .dialects import FusedOp

        top = [op for fn in result.module.ops if isinstance(fn, func.FuncOp) for op in fn.body.block.ops]
        patterns = Counter(op.pattern.data for op in top if isinstance(op, FusedOp))
        opaque = sum(isinstance(op, TorchCallOp) for op in top)
        flog.info("%s: %s (%s); %s left to PyTorch", self.name, count(sum(patterns.values()), "region") + " fused",
                  times(patterns) or "none", count(opaque, "op"))  # fmt: skip
        for fn in result.module.ops:
            if isinstance(fn, func.FuncOp):
                for note in fusion_notes(fn):
                    flog.debug("%s: %s", self.name, note)

    def _log_codegen(self, lowered: dict) -> None:
        clog = get_logger("codegen")
        if not lowered or not clog.isEnabledFor(logging.INFO):
            return
        kernels = [low.name for low in lowered.values() if isinstance(low, KernelLowering)]
        clog.info("%s: %s generated (%s), %s without one", self.name, count(len(kernels), "kernel"),
                  ", ".join(kernels) or "none", count(len(lowered) - len(kernels), "region"))  # fmt: skip
        for low in lowered.values():
            if not isinstance(low, KernelLowering):
                clog.debug("%s: region %s has no kernel: %s", self.name, low.name, getattr(low, "reason", "a callable"))

    def _checker(self, imported: Imported, captured: Captured, args, kwargs, flat):
        from .runtime.reference import run_reference

        # every run starts from the random state of now and puts it back: a model drawing random numbers (dropout in
        # training) draws the same ones in each, and the call itself, after them, draws eager's
        tensors = [*self._params, *(v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor))]
        cuda = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})

        def same_draws():
            return torch.random.fork_rng(devices=cuda)

        with torch.no_grad(), same_draws():  # eager on copies of the inputs; the buffers it writes are put back
            saved = [(m, k, b, b.clone()) for m in self.model.modules() for k, b in m._buffers.items() if b is not None]
            a, k = pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
            expected = self.model(*a, **k)
            for mod, name, buf, value in saved:
                mod._buffers[name] = buf
                buf.copy_(value)
        exp_leaves = [v for v in pytree.tree_leaves(expected) if isinstance(v, torch.Tensor)]
        inputs = imported.program_inputs(flat)
        n_out = len(exp_leaves)

        def check(module) -> str | None:
            with torch.no_grad(), same_draws():
                got = run_reference(module, inputs, imported.params, imported.calls)
            return compare(got[:n_out], exp_leaves)  # (the values written back follow the outputs)

        msg = check(imported.module)
        if msg:
            raise FrontendError(f"the imported IR does not match eager before any pass: {msg}")
        return check

    # -- introspection -------------------------------------------------------------------------
    def _spec(self) -> Specialization:
        if self._last is None:
            raise RuntimeError("call the compiled module once first: it compiles on the first call's input signature")
        return self._materialized(self._last)

    @property
    def passes(self) -> list[str]:
        """The stage names `ir()` accepts, in order."""
        return list(self._spec().pipeline.names)

    def ir(self, stage: str = "final") -> str:
        """IR text of the last-used specialization: "input", "after:<pass>", "before:<pass>" or "final"."""
        return self._spec().pipeline.ir(stage)

    def report(self, html: str | None = None) -> Report:
        """What the compiler did (typed records; `str()` is the text): ops by mapping kind, regions, kernels,
        configs, fallbacks, notes (and, with check=True, each region's worst relative error against its reference
        on the inputs seen). With `html`, also writes that page (the graph drawn, then the text)."""
        rep = self._report(self._spec())
        if html:
            rep.write_html(html)
        return rep

    def _report(self, spec: Specialization) -> Report:
        return Report.build(spec, self.options.backend, self.options.tune, title=self.name)

    @property
    def specializations(self) -> int:
        """How many input signatures are compiled and kept (at most `max_specializations`)."""
        return len(self._specs)


@dataclass
class DynamoBackend:
    """A torch.compile backend: each graph dynamo hands over becomes a CompiledModule (kept in `compilations`).
    With `saveable`, it returns a `SavedGraph` (what torch's `aot_compile` can write to a file) instead of a
    plain function."""

    options: Options
    compilations: list[CompiledModule] = field(default_factory=list)
    name: str | None = None  # the graphs' name (dc.compile of a bound method: its owner's class), else found
    saveable: bool = False
    kept: traces.CompiledStore | None = None  # with `saveable`: where a saved graph's compiles are kept

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        floats = floats_as_scalars(gm)
        kinds = "".join("V" if i in floats else k for i, k in enumerate(input_kinds(example_inputs)))
        cm = self.module(gm, self.name or traced_class() or type(gm).__name__, kinds)
        log.info("%s: dynamo graph %d handed over (%d nodes)", cm.name, len(self.compilations) - 1, len(gm.graph.nodes))
        if self.saveable:
            return SavedGraph(cm, floats)

        def run(*args):
            return cm.guarded(_scalars(args, floats))

        run.compiled_module = cm  # for inspection: run.compiled_module.report()
        return run

    def module(self, gm: torch.fx.GraphModule, name: str, kinds: str) -> CompiledModule:
        cm = CompiledModule(gm, self.options, name)
        cm.kinds = kinds
        cm.kept_in = self.kept
        cm.trust_dynamo_guards(kinds)
        self.compilations.append(cm)
        return cm


# The backend a saved graph being loaded joins (`TracedForward._load`): torch's loader calls a class method with
# the file's bytes alone.
_LOADING: contextvars.ContextVar[DynamoBackend] = contextvars.ContextVar("dlblas_loading")


class SavedGraph:
    """A dynamo graph's CompiledModule as torch's `aot_compile` saves it (registered as a `SerializableCallable`):
    the graph (`frontend.traces.dump_graph`), its name and its inputs' kinds. Loaded, it becomes a new
    CompiledModule of the loading backend, which compiles it at its first call as any other (the tuning cache then
    spares the tuning)."""

    def __init__(self, cm: CompiledModule, floats: tuple[int, ...] = ()):
        self.compiled_module = cm
        self.floats = floats  # (`floats_as_scalars`)

    def __call__(self, *args):
        return self.compiled_module.guarded(_scalars(args, self.floats))

    @classmethod
    def serialize_compile_artifacts(cls, fn: SavedGraph) -> bytes:
        cm = fn.compiled_module
        graph = traces.dump_graph(cm.model)
        cm.kept = _kept(cm.kept_in, graph)
        return pickle.dumps({"graph": graph, "name": cm.name, "kinds": cm.kinds, "floats": fn.floats})

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> SavedGraph:
        saved = pickle.loads(data)
        backend = _LOADING.get()
        cm = backend.module(traces.load_graph(saved["graph"]), saved["name"], saved["kinds"])
        cm.kept = _kept(backend.kept, saved["graph"])
        return cls(cm, saved.get("floats", ()))


def _kept(store: traces.CompiledStore | None, graph: bytes) -> tuple[traces.CompiledStore, str] | None:
    """A saved graph's compiles are kept under the digest of its bytes (what the file holds)."""
    return None if store is None else (store, hashlib.sha256(graph).hexdigest())


@functools.cache
def _installed(package: str) -> bool:
    try:
        importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _no_forward() -> None:
    """What a pickled `TracedForward` becomes."""


class TracedForward:
    """`dc.compile(model.forward, keep_traces=True)`: a module's forward compiled through dynamo, each of dynamo's
    traces kept on disk (`frontend.traces`), so that a call in a new process loads its trace (~0.7 s for a
    32-layer Llama's graph) instead of tracing again (~7 s). Each call runs the first kept trace whose guards
    accept it (the last used first); a call none accepts loads the files saved under its signature one by one
    until one accepts it, else traces (`aot_compile`, a whole graph: a graph break falls back to plain dynamo with
    a warning) and saves. As in plain dynamo, a size that changes between two traces of a process is symbolic in
    the next (automatic dynamic): a dynamic cache's growing length, or a static cache's third prompt length, is
    traced once more and that trace serves every later length. After `NEW_TRACES` traces in one process (dynamo's
    own recompile limit), later calls none accepts go through plain dynamo and are not saved. Our compile of each
    graph a call meets (the import and the passes) is kept too, in the store's `compiled` folder (`CompiledModule.
    _kept_path`), so that a new process builds only the program from it (~0.2 s for each of a 32-layer model's
    graphs on an H200, instead of ~2–3 s)."""

    NEW_TRACES = 8

    def __init__(self, owner: torch.nn.Module, method, backend: DynamoBackend, name: str):
        try:  # (imported here: dynamo is not imported with this package)
            from torch._dynamo.aot_compile_types import SerializableCallable
        except ImportError:
            raise UnsupportedError(f"keep_traces needs torch's aot_compile (torch >= 2.10; this is {torch.__version__})") from None
        SerializableCallable.register(SavedGraph)
        traces.enable_aot_compile()
        self.owner, self.backend, self.name = owner, backend, name
        self.hooks = _hook_dicts(owner.modules())
        self.func, self.return_dict = traces.unwrapped_forward(method)
        self.aot = torch.compile(self.func, fullgraph=True, backend=backend,
                                 options={"guard_filter_fn": traces.guard_filter})  # fmt: skip
        plain = DynamoBackend(backend.options, backend.compilations, backend.name)
        self.plain = dynamo_call(name, torch.compile(self.func, backend=plain))
        options = {f.name: getattr(backend.options, f.name) for f in dataclasses.fields(backend.options)
                   if f.name not in ("dump_ir", "check")}  # fmt: skip
        # (beside the tuning cache)
        self.store = traces.TraceStore(default_path().parent / "traces", traces.model_key(owner, self.func, options))
        backend.kept = traces.CompiledStore(self.store.folder / "compiled")  # (our compiles of the graphs, beside)
        self.entries: list = []  # AOTCompiledFunctions loaded or traced here, the last used first
        self.unloaded: dict[str, list] = {}  # each call signature seen: its saved files not loaded yet
        self.traced = 0  # new traces in this process
        self.broken: str | None = None  # why aot_compile cannot serve this forward (then plain dynamo does)
        # calls served by a kept trace ("kept"), files loaded ("loaded"), traces made and saved ("traced"), calls
        # through plain dynamo ("dynamo")
        self.counts: Counter[str] = Counter()

    def __reduce__(self):
        # (dynamo's saved guards pickle the module, and with it this forward installed on it: its traces and guard
        # managers cannot be pickled, nor are they state of the module)
        return (_no_forward, ())

    def __call__(self, *args, **kwargs):
        if not self.return_dict:
            return self._run(args, kwargs)
        passed = kwargs.pop("return_dict", None)  # (applied around the traced forward, as its wrapper does)
        return traces.apply_return_dict(self.owner, passed, self._run(args, kwargs))

    def _run(self, args: tuple, kwargs: dict):
        owner, counts = self.owner, self.counts
        if any(self.hooks):  # (a saved trace's guards cannot hold the hooks: plain dynamo traces them and guards them)
            counts["dynamo"] += 1
            return self.plain(owner, *args, **kwargs)
        for i, f in enumerate(self.entries):
            if f.guard_check(owner, *args, **kwargs):
                if i:
                    self.entries.insert(0, self.entries.pop(i))
                counts["kept"] += 1
                return f(owner, *args, **kwargs)
        signature = traces.call_signature(args, kwargs)
        if signature not in self.unloaded:
            self.unloaded[signature] = self.store.paths(signature)
        paths = self.unloaded[signature]
        while paths:  # (one file at a time: a signature's files differ in what the guards check, a cache's size)
            path = paths.pop(0)
            f = self._load(path)
            if f is not None:
                counts["loaded"] += 1
                self.entries.insert(0, f)
                if f.guard_check(owner, *args, **kwargs):
                    counts["kept"] += 1
                    self.store.used(path)
                    return f(owner, *args, **kwargs)
        if self.broken is None and self.traced < self.NEW_TRACES:
            f = self._trace(signature, args, kwargs)
            if f is not None:
                counts["traced"] += 1
                return f(owner, *args, **kwargs)
        counts["dynamo"] += 1
        return self.plain(owner, *args, **kwargs)

    def _load(self, path):
        t0 = time.perf_counter()
        token = _LOADING.set(self.backend)
        try:
            f = self.store.load(path, self.func.__globals__)
        except Exception as e:  # noqa: BLE001 - a file from another torch, a changed model file: trace again
            log.warning("%s: the saved trace %s was not loaded (%s: %s); tracing instead", self.name, path,
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")  # fmt: skip
            return None
        finally:
            _LOADING.reset(token)
        changed = traces.changed_sources(f)
        if changed:
            log.warning("%s: the saved trace %s was made from other source code of %s; tracing instead", self.name,
                        path, ", ".join(changed))  # fmt: skip
            return None
        log.info("%s: loaded the saved trace %s in %.2f s", self.name, path.name, time.perf_counter() - t0)
        f.disable_guard_check()  # (as in `_trace`)
        return f

    def _trace(self, signature: str, args: tuple, kwargs: dict):
        t0 = time.perf_counter()
        try:
            f = dynamo_call(self.name, self.aot.aot_compile)(((self.owner, *args), kwargs))
        except FrontendError:
            raise
        except Exception as e:  # noqa: BLE001 - a graph break, a guard a file cannot hold: plain dynamo instead
            self.broken = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(f"dlblas_compiler: keep_traces: {self.name}'s forward could not be traced whole for "
                          f"saving ({self.broken}); compiling it through dynamo without saving", stacklevel=4)  # fmt: skip
            return None
        f.disable_guard_check()  # (`_run` checks the guards before each call: a call would check them again)
        self.traced += 1
        self.entries.insert(0, f)
        try:
            path = self.store.save(signature, f, self.func.__globals__)
        except Exception as e:  # noqa: BLE001 - an unsaveable trace still runs here
            log.warning("%s: the trace was not saved (%s: %s)", self.name, type(e).__name__, e)
        else:
            log.info("%s: traced in %.2f s and saved as %s", self.name, time.perf_counter() - t0, path)
        return f


def traced_class() -> str | None:
    """The class of the module whose code dynamo is compiling while a torch.compile backend runs (`Mlp` for
    `Mlp.forward`, for the code after a graph break in it, and for a decorator's wrapper around it, as Hugging
    Face's forward has), else the compiled function's name; None outside a backend call. Read from the frame
    dynamo's `convert_frame` holds: torch internals, so any surprise gives None."""
    try:
        f = sys._getframe(1)
        while f is not None:
            frame = f.f_locals.get("frame") if f.f_code.co_filename.endswith("convert_frame.py") else None
            if frame is not None and hasattr(frame, "f_locals"):
                owner = frame.f_locals.get("self")
                if isinstance(owner, torch.nn.Module):
                    return type(owner).__name__
                code = getattr(frame, "f_code", None)
                return code.co_name if code is not None else None
            f = f.f_back
    except Exception:  # noqa: BLE001 - a name is nice to have, never needed
        return None
    return None


def compile(model, backend: str | None = None, **options):  # noqa: A001
    """Compile `model`; compilation happens on the first call of each input signature. `backend` and the other
    keyword options are the fields of `Options` (see there): tune, dump_ir, cuda_graphs, chained_launches, pipeline,
    check_each_pass, strict, check, expert_parallel, expert_parallel_tokens, prefer_kernels, max_specializations,
    shape_families, keep_traces (a module's forward: dynamo's traces kept on disk for the next process, see
    `TracedForward`).

    An nn.Module (or fx.GraphModule) becomes a `CompiledModule`, captured whole (symbolic_trace, else dynamo's
    export). Any other callable, such as `model.forward` of a Hugging Face causal LM for `generate()`, is compiled
    through dynamo (`torch.compile` with this compiler as its backend: graph breaks, caches and their in-place
    updates as dynamo handles them), each graph a CompiledModule; the returned function's `compilations` lists
    them (`fn.compilations[i].report()`) and `fn.report()` gives the last one's report:

        model.forward = dc.compile(model.forward, backend="interpret")
        model.generate(ids, max_new_tokens=32, cache_implementation="static")

    For such a model, Hugging Face's own compilation of the decode step in generate() (on for static caches on a
    GPU) is turned off (`model.generation_config.disable_compile = True`): it would trace through the compiled
    forward and hand the decode step to Inductor. With `torch.compile(model.forward, backend="dlblas")` instead,
    pass `disable_compile=True` to generate() for the same reason.
    """
    opts = Options(backend=backend, **options)
    if isinstance(model, torch.jit.ScriptModule | torch.jit.ScriptFunction):
        raise FrontendError(f"{type(model).__name__} is TorchScript, which neither symbolic_trace nor dynamo can "
                            "follow: compile the Python module it was scripted or traced from")  # fmt: skip
    if isinstance(model, torch.nn.Module):
        if opts.keep_traces:
            raise ValueError("keep_traces keeps dynamo's traces of a module's forward, and a module is captured whole: "
                             f"pass a bound method such as model.forward, not the {type(model).__name__}")  # fmt: skip
        return CompiledModule(model, opts)
    if not callable(model):
        raise TypeError(f"dc.compile takes an nn.Module or a callable, got {type(model).__name__}")
    owner = getattr(model, "__self__", None)  # (a bound method: model.forward)
    name = type(owner).__name__ if isinstance(owner, torch.nn.Module) else None
    if opts.keep_traces:
        if name is None:
            raise ValueError("keep_traces keeps the traces of a module's forward: pass a bound method such as "
                             f"model.forward, not {getattr(model, '__qualname__', type(model).__name__)}")  # fmt: skip
        dynamo_backend = DynamoBackend(opts, name=name, saveable=True)
        fn = functools.wraps(model)(TracedForward(owner, model, dynamo_backend, name))
    else:
        dynamo_backend = DynamoBackend(opts, name=name)
        # (a shape error while dynamo traces a call: one line, not dynamo's log)
        fn = dynamo_call(name or getattr(model, "__qualname__", "the function"),
                          torch.compile(model, backend=dynamo_backend))

    generation = getattr(owner, "generation_config", None)
    if generation is not None and hasattr(generation, "disable_compile"):
        # Hugging Face's generate() compiles the decode step itself (torch.compile of the model's __call__, for
        # static caches on a GPU); that compile would trace through this function and run Inductor instead
        generation.disable_compile = True
    fn.compilations = dynamo_backend.compilations

    def report() -> Report:
        if not dynamo_backend.compilations:
            raise RuntimeError(f"{name or 'the function'} has compiled nothing yet: call it first (a call that dynamo "
                               "ran eagerly, its whole code skipped, compiles nothing either)")  # fmt: skip
        return dynamo_backend.compilations[-1].report()

    fn.report = report
    return fn
