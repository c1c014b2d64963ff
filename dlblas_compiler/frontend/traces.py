"""Dynamo's traces kept on disk, so that a new process loads a compiled forward instead of tracing it again.

Tracing a 32-layer Hugging Face model's prefill and decode step costs dynamo ~14 s in every process (bench/NOTES.md
items 92 and 93); torch's `aot_compile` saves what a trace made (the rewritten bytecode, its guards, the backend's
artifact) and `torch.compiler.load_compiled_function` loads it in a fraction of that. This module holds what
that needs from the capture side:

- `TraceStore`: one folder per model (its class, config and parameter dtypes and devices, the compile options,
  the versions of torch, transformers and this package), one file per traced call, named by the call's
  `call_signature` (the shapes, dtypes and devices of its tensor arguments, its other values, the types of its
  objects such as a KV cache): a call loads only the files whose signature it has, and dynamo's saved guards
  then decide whether one serves it.
- `guard_filter`: the guards a file cannot hold (an object's identity and what derives from it) are not built;
  the store's folder key stands in for them (same class, same config, same options).
- `dump_graph` / `load_graph`: a dynamo graph as bytes (torch's GraphPickler), keeping each node's source line
  (error messages name it) and its example values (the sizes a graph's inputs follow).
- `dump_compiled` / `load_compiled` and `CompiledStore`: our compile of a saved graph (the imported IR and the
  passes' result), kept beside the traces; references to the call's input tensors and to the graph module are
  saved as references and bound again at load, IR modules as flat records (`_ir_records`).
- `unwrapped_forward`: the function dynamo is given. A Hugging Face forward is wrapped by `can_return_tuple`,
  a closure a file cannot refer to; the function inside is traced and `return_dict` applied around it, as the
  wrapper does.

torch marks `aot_compile` experimental; torch 2.10 and 2.11 need `torch._dynamo.config.enable_aot_compile`
(`enable_aot_compile()`), on by default from 2.13.
"""

from __future__ import annotations

import builtins
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import io
import json
import os
import pickle
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue

from .importer import _storage

IRObjects = (Operation, Block, Region, SSAValue)  # what a saved compile holds only as whole modules

GRAPH_META = ("stack_trace", "example_value")  # what a saved graph's nodes keep: source lines, example values


def enable_aot_compile() -> None:
    import torch._dynamo

    if hasattr(torch._dynamo.config, "enable_aot_compile"):
        torch._dynamo.config.enable_aot_compile = True


def guard_filter(entries: list) -> list[bool]:
    """A `guard_filter_fn` for torch.compile: keep the guards a saved file can hold (not an object's identity or a
    guard derived from one), as `aot_compile` requires."""
    from torch._dynamo.guards import CheckFunctionManager

    bad = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (g.guard_type in bad or bad & set(g.derived_guard_types)) for g in entries]


def dump_graph(gm: torch.fx.GraphModule) -> bytes:
    """A dynamo graph (parameters arrive as inputs: it holds no state) as bytes."""
    from torch.fx._graph_pickler import GraphPickler, Options

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in graph.nodes:
        node.meta = {k: v for k, v in node.meta.items() if k in GRAPH_META}
        value = node.meta.pop("example_value", None)
        if node.op == "placeholder" and value is not None:  # (read off the inputs only: the rest is bulk)
            node.meta["example_value"] = _plain(value)
    return GraphPickler.dumps(torch.fx.GraphModule(torch.nn.Module(), graph), Options(ops_filter=None))


def _plain(value):
    """A fake tensor as a new one of its sizes, strides, dtype and device: not a view (the pickler cannot save the
    base a view's fake tensor keeps, such as a cache's slice an attention mask is taken from)."""
    mode = getattr(value, "fake_mode", None)
    if not isinstance(value, torch.Tensor) or mode is None:
        return value
    with mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def load_graph(data: bytes) -> torch.fx.GraphModule:
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    gm = GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))
    gm.recompile()
    return gm


def unwrapped_forward(fn) -> tuple[Any, bool]:
    """The plain function of a bound forward for dynamo to trace, and whether `return_dict` must be applied
    around it (Hugging Face's `can_return_tuple` wrapper was taken off). It is a copy whose globals are its
    module's over the builtins: torch 2.11's `aot_compile` resolves the names the traced code loads in the
    function's globals alone (a builtin such as `type` is "missing"), and the globals dynamo installs (a module it
    loads by an id-based name) then stay out of the module."""
    func = getattr(fn, "__func__", fn)
    inner = getattr(func, "__wrapped__", None)
    unwrap = inner is not None and _is_can_return_tuple(func)
    func = inner if unwrap else func
    copy = types.FunctionType(func.__code__, {**vars(builtins), **func.__globals__}, func.__name__, func.__defaults__,
                              func.__closure__)  # fmt: skip
    copy.__kwdefaults__, copy.__qualname__, copy.__module__ = func.__kwdefaults__, func.__qualname__, func.__module__
    copy.__dict__.update(func.__dict__)
    return copy, unwrap


def _is_can_return_tuple(func) -> bool:
    try:
        from transformers.utils.generic import can_return_tuple
    except ImportError:
        return False
    return getattr(func, "__code__", None) is can_return_tuple(lambda self: None).__code__


def apply_return_dict(owner, passed: bool | None, output):
    """What `can_return_tuple` does to a forward's output: a tuple when `return_dict=False` is passed (`passed`;
    None: not passed) or set in the config."""
    return_dict = getattr(getattr(owner, "config", None), "return_dict", True) if passed is None else passed
    if not return_dict and not isinstance(output, tuple):
        output = output.to_tuple()
    return output


@functools.cache
def _module_source(name: str) -> str | None:
    try:
        return inspect.getsource(importlib.import_module(name))
    except Exception:  # noqa: BLE001 - gone, or its source unreadable: counts as changed
        return None


def changed_sources(compiled) -> list[str]:
    """The modules whose source now differs from the text a loaded trace was made from (torch records every
    module whose code dynamo inlined, but checks only the versions when loading: an edited modeling file of the same
    transformers version would otherwise run its old bytecode)."""
    changed = {src.module for src in compiled.source_info().inlined_sources if _module_source(src.module) != src.content}
    return sorted(changed)


def call_signature(args: tuple, kwargs: dict) -> str:
    """A short name for a call's arguments: each tensor's shape, dtype and device, each other plain value, and the
    type of each object (a cache's contents are the guards' business). Calls with one name may still differ in
    what the guards check; calls with different names never share a trace."""
    parts = []
    for name, v in [*enumerate(args), *sorted(kwargs.items())]:
        if isinstance(v, torch.Tensor):
            parts.append((name, "T", tuple(v.shape), str(v.dtype), v.device.type))
        elif v is None or isinstance(v, (bool, int, float, str)):
            parts.append((name, "V", v))
        else:
            parts.append((name, "O", type(v).__qualname__))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def model_key(owner: torch.nn.Module, func, options: dict) -> str:
    """The store folder's name: what a saved trace was made for besides what its guards check."""
    config = getattr(owner, "config", None)
    config_text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    params = sorted({(str(p.dtype), p.device.type) for p in owner.parameters()})
    versions = {"torch": torch.__version__}
    for package in ("dlblas_compiler", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    text = json.dumps([type(owner).__module__, type(owner).__qualname__, func.__qualname__, config_text, params,
                       sorted(options.items()), versions, _identities(owner)], default=str)  # fmt: skip
    return f"{type(owner).__name__}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _identities(owner: torch.nn.Module) -> list:
    """What a saved file's guards cannot check, as text: the functions, classes and enum members the modules hold
    (`self.act = F.gelu`, `self.kind = Kind.PLUS`; dynamo guards them by identity, which `guard_filter` drops) and
    the plain values their classes hold (`Block.scale = 3.0`, read through the class). Before, a process whose model
    held F.relu there loaded the trace of one holding F.gelu."""
    out, classes = [], {}
    for name, m in owner.named_modules(remove_duplicate=False):
        for k, v in vars(m).items():
            if (text := _identity(v)) is not None:
                out.append((name, k, text))
        for cls in type(m).__mro__:
            if cls.__module__.startswith("torch.nn") or cls is object:
                continue
            for k, v in vars(cls).items():
                if not k.startswith("__") and (isinstance(v, bool | int | float | str | enum.Enum) or v is None):
                    classes[(cls.__module__, cls.__qualname__, k)] = repr(v)
    return out + sorted(classes.items())


def _identity(v) -> str | None:
    if isinstance(v, enum.Enum):
        return repr(v)
    if isinstance(v, type | types.FunctionType | types.BuiltinFunctionType | types.MethodType):
        return f"{getattr(v, '__module__', None)}.{getattr(v, '__qualname__', None) or getattr(v, '__name__', None)}"
    if isinstance(v, functools.partial):
        return f"partial({_identity(v.func)}, {v.args!r}, {sorted(v.keywords.items())!r})"
    return None


class TraceStore:
    """The saved traces of one model: `<root>/<model key>/<call signature>-<n>.bin`, at most `MAX_FILES` (a
    dynamic cache's every length is a new signature)."""

    MAX_FILES = 32

    def __init__(self, root: Path, key: str):
        self.folder = Path(root) / key

    def paths(self, signature: str) -> list[Path]:
        """The files of a call signature, the last used first (`used`)."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"{signature}-*.bin"), key=lambda p: -p.stat().st_mtime)

    @staticmethod
    def used(path: Path) -> None:
        try:
            os.utime(path)
        except OSError:  # (a file removed meanwhile, a read-only cache: the order is a guess anyway)
            pass

    def save(self, signature: str, compiled, f_globals: dict) -> Path:
        """Write an `aot_compile`d function as the next file of its signature (atomically: readers never see a
        part of it). A module dynamo's code loads through a global of its own (`___module_<name>_<id>`, where the
        traced function's globals do not hold the module under its name) is saved as an import."""
        if self.folder.is_dir() and len(list(self.folder.glob("*.bin"))) >= self.MAX_FILES:
            raise OSError(f"{self.folder} holds {self.MAX_FILES} traces already")
        env = compiled._artifacts.runtime_env
        for ref in list(env.external_refs):
            module = f_globals.get(ref)
            if isinstance(module, types.ModuleType):
                env.import_sources[ref] = module.__name__
                env.external_refs.discard(ref)
        self.folder.mkdir(parents=True, exist_ok=True)
        n = len(self.paths(signature))
        path = self.folder / f"{signature}-{n}.bin"
        while path.exists():
            n += 1
            path = self.folder / f"{signature}-{n}.bin"
        _write_atomically(path, lambda part: compiled.save_compiled_function(str(part)))
        return path

    @staticmethod
    def load(path: Path, f_globals: dict):
        with open(path, "rb") as f:
            return torch.compiler.load_compiled_function(f, f_globals=f_globals)


# -- our compile of a kept graph, kept too ---------------------------------------------------------------------------
# A warm process that loads a trace still imports its graph into the IR and runs the passes (~1.5 s a 32-layer
# graph): the results of that (the imported program and the pipeline's result) are saved beside the traces, keyed by
# the graph's bytes, the call's inputs and this package's source, and loaded instead (bench/NOTES.md item 94).

MAX_COMPILED = 64  # files kept in a model's `compiled` folder (the last used)
MAX_BYTES = 64 << 20  # tensors saved by value (constants the import computed), in all


@functools.cache
def source_digest() -> str:
    """A hash of this package's source: a saved compile is used only by the code that made it."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# the types `_Refs.persistent_id` looks at; objects of any other type are pickled as they are (`_PLAIN`: seen so)
_SPECIAL = (torch._ops.OpOverload, torch._ops.OpOverloadPacket, *IRObjects, torch.fx.Node, torch.fx.Graph,
            torch.nn.Module, torch.Tensor)  # fmt: skip
_PLAIN: set[type] = set()


class _Refs:
    """The objects a saved compile refers to instead of holding: the call's input tensors, the graph module's
    submodules and tensors. Any other tensor is saved by value: a small constant, never a part of an input."""

    def __init__(self, gm: torch.nn.Module, inputs: list):
        self.ids: dict[int, tuple] = {}
        self.objects: dict[tuple, Any] = {}
        for name, m in gm.named_modules(remove_duplicate=False):
            self._add(("module", name), m)
        for name, t in [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]:
            self._add(("attr", name), t)
        for i, v in enumerate(inputs):
            if isinstance(v, torch.Tensor):
                self._add(("input", i), v)
        self.storages = {_storage(t) for t in self.objects.values()} - {None}
        self.by_value = 0
        self.modules: list = []  # IR modules saved or loaded (`_ir_records`)

    def load(self, ref: tuple) -> Any:
        if ref[0] == "op":  # (the library that registers a custom op is imported by the model's code, as at save)
            namespace, name = ref[1].split("::")
            packet = getattr(getattr(torch.ops, namespace), name)
            return packet if ref[2] is None else getattr(packet, ref[2] or "default")
        if ref[0] != "ir":
            return self.objects[ref]
        if len(ref) > 2:
            self.modules.append(_ir_module(ref[2]))
        return self.modules[ref[1]]

    def _add(self, ref: tuple, obj: Any) -> None:
        self.ids.setdefault(id(obj), ref)
        self.objects.setdefault(ref, obj)

    def persistent_id(self, obj: Any) -> tuple | None:
        ref = self.ids.get(id(obj))
        if ref is not None:
            return ref
        kind = type(obj)
        if kind in _PLAIN:  # (asked of every object pickled: ~220,000 for a 32-layer graph)
            return None
        if not isinstance(obj, _SPECIAL):
            _PLAIN.add(kind)
            return None
        if isinstance(obj, torch._ops.OpOverload | torch._ops.OpOverloadPacket):  # (a custom op pickles by no name)
            overload = getattr(obj, "_overloadname", None)
            return ("op", obj._qualified_op_name if overload is None else obj._schema.name, overload)
        if isinstance(obj, IRObjects):
            if not isinstance(obj, ModuleOp) or obj.parent is not None:
                raise TypeError(f"a saved compile can hold whole IR modules only, not {type(obj).__name__}")
            n = len(self.modules)  # (a module met again is the same one when loaded)
            self.modules.append(obj)
            self.ids[id(obj)] = ("ir", n)
            return ("ir", n, _ir_records(obj))
        if isinstance(obj, torch.fx.Node | torch.fx.Graph) or isinstance(obj, torch.nn.Module):
            raise TypeError(f"a saved compile cannot hold {type(obj).__name__} {obj}")
        if isinstance(obj, torch.Tensor):
            if getattr(obj, "fake_mode", None) is not None or obj.device.type == "meta":
                raise TypeError("a saved compile cannot hold a fake tensor")
            if _storage(obj) in self.storages:  # (a view of an input: by value it would be a stale copy)
                raise TypeError("a saved compile cannot hold a view of an input or a module tensor")
            self.by_value += obj.untyped_storage().nbytes()
            if self.by_value > MAX_BYTES:
                raise TypeError(f"a saved compile would hold more than {MAX_BYTES >> 20} MiB of constants")
        return None


def _ir_records(module: ModuleOp) -> tuple:
    """An IR module as flat records (each op: its class, operand numbers, result types and names, properties,
    attributes, regions): pickling the ops themselves recurses along their chains of ops and uses, deeper than
    Python 3.12's fixed C stack allows for a 32-layer model."""
    numbers: dict = {}

    def block(b) -> tuple:
        for a in b.args:
            numbers[a] = len(numbers)
        return [(a.type, a.name_hint) for a in b.args], [op(o) for o in b.ops]

    def op(o) -> tuple:
        if o.successors:
            raise TypeError(f"a saved compile cannot hold {o.name}: it has successor blocks")
        record = (type(o), [numbers[v] for v in o.operands], [(r.type, r.name_hint) for r in o.results],
                  dict(o.properties), dict(o.attributes), getattr(o, "location", None),
                  [[block(b) for b in r.blocks] for r in o.regions])  # fmt: skip
        for r in o.results:
            numbers[r] = len(numbers)
        return record

    return op(module)


def _ir_module(records: tuple) -> ModuleOp:
    """The module `_ir_records` describes, its values numbered in the same order."""
    values: list = []

    def block(record: tuple) -> Block:
        args, ops = record
        b = Block(arg_types=[t for t, _ in args])
        for a, (_, hint) in zip(b.args, args):
            a.name_hint = hint
            values.append(a)
        b.add_ops([op(r) for r in ops])
        return b

    def op(record: tuple):
        cls, operands, results, properties, attributes, location, regions = record
        regions = [Region([block(b) for b in r]) for r in regions]
        kw = {} if location is None else {"location": location}
        o = cls.create(operands=[values[i] for i in operands], result_types=[t for t, _ in results],
                       properties=properties, attributes=attributes, regions=regions, **kw)  # fmt: skip
        for r, (_, hint) in zip(o.results, results):
            r.name_hint = hint
            values.append(r)
        return o

    return op(records)


def dump_compiled(value: Any, gm: torch.nn.Module, inputs: list) -> bytes:
    """`value` (an import's result and the pipeline's, say) as bytes, its references to the call's input tensors
    and to the graph module's submodules and tensors kept as references (`load_compiled` binds them again)."""
    refs = _Refs(gm, inputs)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> tuple | None:
            return refs.persistent_id(obj)

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()


def load_compiled(data: bytes, gm: torch.nn.Module, inputs: list) -> Any:
    """What `dump_compiled` saved, bound to this graph module and these inputs (of the same signature)."""
    refs = _Refs(gm, inputs)

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, ref: tuple) -> Any:
            return refs.load(tuple(ref))

    with warnings.catch_warnings():  # (torch's pytree warns when its leaf spec is made, as unpickling does)
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        return Unpickler(io.BytesIO(data)).load()


class CompiledStore:
    """Saved compiles of a model's graphs (`dump_compiled`): `<folder>/<key>.pkl`, at most `MAX_COMPILED`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def path(self, *key: Any) -> Path:
        text = json.dumps([source_digest(), *key], default=str)
        return self.folder / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.pkl"

    used = TraceStore.used

    def save(self, path: Path, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        old = sorted(self.folder.glob("*.pkl"), key=lambda p: p.stat().st_mtime)
        for p in old[: max(0, len(old) + 1 - MAX_COMPILED)]:
            p.unlink(missing_ok=True)
        _write_atomically(path, lambda part: part.write_bytes(data))


def _write_atomically(path: Path, write) -> None:
    """`write(part)` to a file beside `path`, then renamed to it: readers never see a part of it."""
    part = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        write(part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
