"""The operator registry (DLBlas style): implementations declare symbolic signatures, `get_op` picks one.

An implementation is registered under an op name with a `Sig`: one spec per positional argument (`Tensor`,
`Scalar`, `Optional`) plus constraints over the symbols the specs bind::

    register_op("rms_norm", rms_norm_triton, Sig(
        Tensor(..., "N", dtypes=("f16", "bf16", "f32")),  # `...`: any leading (token) dims
        Tensor("N"),                                      # same symbol -> same size
        Scalar(float),
        constraints=[divisible("N", 16), in_range("N", 1, 65536)],
    ), impl_name="triton")

`get_op(name, args)` matches every implementation of `name` against the actual arguments. None matching raises
`OpMatchError` listing each candidate and why it was rejected; one matching is returned; several matching are
timed on CUDA (on clones of the arguments) and the fastest is remembered, keyed by op, bucketed shapes, dtypes
and device (`ChoiceKey`), in memory and in the tuning package's persistent cache (when `dlblas_compiler.tuning`
imports). On other devices the first registered (priority order) wins without timing.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

import torch

from ..errors import DLError, UnsupportedError

DTYPES: dict[str, torch.dtype] = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f8e4m3": torch.float8_e4m3fn,
    "f8e5m2": torch.float8_e5m2,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The registry's short name of a torch dtype ("f16", "bf16", ...), or torch's own name."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


class KernelUnsupported(UnsupportedError, RuntimeError):
    """A kernel cannot run here (device, dtype, hardware feature); the message says why."""


class OpMatchError(DLError, LookupError):
    """No registered implementation accepts the arguments; the message lists every candidate and why."""


class _Mismatch(Exception):
    """Internal: why one implementation rejects the arguments."""


@dataclass(frozen=True)
class Bound:
    """A symbol's value and where it was first bound ("arg 0 dim 1")."""

    value: Any
    where: str


@dataclass
class Binding:
    """A successful match: symbol values, and the (arg, dim) positions that are token dims (bucketed in keys)."""

    env: dict[str, Bound] = field(default_factory=dict)
    token_dims: set[tuple[int, int]] = field(default_factory=set)

    @property
    def sizes(self) -> dict[str, Any]:
        return {k: b.value for k, b in self.env.items()}


# --------------------------------------------------------------------------------------------- argument specs


Dim = str | int | EllipsisType


class Tensor:
    """A tensor argument: dims are symbols (str), exact sizes (int) or one `...` (any number of token dims).

    `dtypes` are short names (see `DTYPES`), `device` device kinds ("cuda", "cpu"); None accepts any.
    """

    def __init__(
        self,
        *dims: Dim,
        dtypes: Sequence[str] | None = None,
        device: Sequence[str] | None = None,
        contiguous: bool = False,
        name: str | None = None,
    ) -> None:
        if sum(d is ... for d in dims) > 1:
            raise ValueError("a Tensor spec takes at most one `...`")
        unknown = [d for d in dtypes or () if d not in DTYPES]
        if unknown:
            raise ValueError(f"unknown dtype names {unknown}; known: {sorted(DTYPES)}")
        self.dims = dims
        self.dtypes = tuple(dtypes) if dtypes is not None else None
        self.device = tuple(device) if device is not None else None
        self.contiguous = contiguous
        self.name = name
        self.required = True

    def shape_str(self) -> str:
        return "[" + ", ".join("..." if d is ... else str(d) for d in self.dims) + "]"

    def __str__(self) -> str:
        s = (f"{self.name}: " if self.name else "") + "Tensor" + self.shape_str()
        if self.dtypes:
            s += " " + "|".join(self.dtypes)
        if self.device:
            s += " on " + "|".join(self.device)
        return s + (" contiguous" if self.contiguous else "")

    def bind(self, i: int, arg: Any, binding: Binding, token_syms: frozenset[str]) -> None:
        if not isinstance(arg, torch.Tensor):
            raise _Mismatch(f"arg {i} is {type(arg).__name__}, expected a tensor {self.shape_str()}")
        if self.device is not None and arg.device.type not in self.device:
            raise _Mismatch(f"arg {i} is on {arg.device.type}, expected {' or '.join(self.device)}")
        if self.dtypes is not None and dtype_name(arg.dtype) not in self.dtypes:
            raise _Mismatch(f"arg {i} dtype is {dtype_name(arg.dtype)}, expected one of {', '.join(self.dtypes)}")
        if self.contiguous and not arg.is_contiguous():
            raise _Mismatch(f"arg {i} is not contiguous")
        dims: list[str | int | None] = [d for d in self.dims if not isinstance(d, EllipsisType)]
        if ... in self.dims:
            if arg.dim() < len(dims):
                raise _Mismatch(f"arg {i} has rank {arg.dim()}, expected at least {len(dims)} {self.shape_str()}")
            at = self.dims.index(...)
            dims[at:at] = [None] * (arg.dim() - len(dims))
        elif arg.dim() != len(dims):
            raise _Mismatch(f"arg {i} has rank {arg.dim()}, expected {len(dims)} {self.shape_str()}")
        for d, (sym, size) in enumerate(zip(dims, arg.shape, strict=True)):
            pos = f"arg {i} dim {d}"
            if sym is None or sym in token_syms:
                binding.token_dims.add((i, d))
            if sym is None:
                continue
            if isinstance(sym, int):
                if size != sym:
                    raise _Mismatch(f"{pos} is {size}, expected {sym}")
                continue
            _bind_symbol(binding, sym, size, pos)


class Scalar:
    """A Python scalar of `type_` (float accepts int; bool is not an int here). `sym` binds its value as a symbol
    for constraints; an argument with a `default` may be omitted."""

    _REQUIRED = object()

    def __init__(self, type_: type, *, sym: str | None = None, default: Any = _REQUIRED, name: str | None = None):
        self.type, self.sym, self.name, self.default = type_, sym, name, default
        self.required = default is Scalar._REQUIRED

    def __str__(self) -> str:
        s = (f"{self.name}: " if self.name else "") + self.type.__name__
        s += f" as {self.sym}" if self.sym and self.sym != self.name else ""
        return s + ("" if self.required else f" = {self.default}")

    def accepts(self, arg: Any) -> bool:
        if isinstance(arg, bool) and self.type is not bool:
            return False
        return isinstance(arg, (int, float) if self.type is float else self.type)

    def bind(self, i: int, arg: Any, binding: Binding, token_syms: frozenset[str]) -> None:
        if not self.accepts(arg):
            raise _Mismatch(f"arg {i} is {type(arg).__name__}, expected {self.type.__name__}")
        if self.sym is not None:
            _bind_symbol(binding, self.sym, arg, f"arg {i}")


class Optional:
    """An argument that may be None or omitted; otherwise it must match `spec`."""

    def __init__(self, spec: Tensor | Scalar) -> None:
        self.spec = spec
        self.required = False

    def __str__(self) -> str:
        return f"Optional[{self.spec}]"

    def bind(self, i: int, arg: Any, binding: Binding, token_syms: frozenset[str]) -> None:
        if arg is not None:
            self.spec.bind(i, arg, binding, token_syms)


Spec = Tensor | Scalar | Optional


def _bind_symbol(binding: Binding, sym: str, value: Any, where: str) -> None:
    seen = binding.env.get(sym)
    if seen is None:
        binding.env[sym] = Bound(value, where)
    elif seen.value != value:
        raise _Mismatch(f"{where} is {sym}={value}, but {seen.where} is {sym}={seen.value}")


# ------------------------------------------------------------------------------------------------ constraints


class Constraint(ABC):
    """A condition over a match's symbols and arguments; `check` returns why it fails, or None."""

    @abstractmethod
    def check(self, binding: Binding, args: Sequence[Any]) -> str | None: ...


def _value_str(x: int | float | str | None, env: Mapping[str, Bound]) -> str:
    if isinstance(x, str) and x in env:
        return f"{x}={env[x].value}"
    return str(x)


class _Divisible(Constraint):
    def __init__(self, sym: str, n: int) -> None:
        self.sym, self.n = sym, n

    def __str__(self) -> str:
        return f"{self.sym} % {self.n} == 0"

    def check(self, binding: Binding, args: Sequence[Any]) -> str | None:
        b = binding.env.get(self.sym)
        if b is None or b.value % self.n == 0:
            return None
        return f"{b.where} is {self.sym}={b.value}, but {self.sym} must be divisible by {self.n}"


class _InRange(Constraint):
    def __init__(self, sym: str, lo: int | float | str | None, hi: int | float | str | None) -> None:
        self.sym, self.lo, self.hi = sym, lo, hi

    def __str__(self) -> str:
        return f"{self.sym} in [{'-inf' if self.lo is None else self.lo}, {'inf' if self.hi is None else self.hi}]"

    def check(self, binding: Binding, args: Sequence[Any]) -> str | None:
        env = binding.env
        b = env.get(self.sym)
        bounds = [env[x].value if isinstance(x, str) and x in env else x for x in (self.lo, self.hi)]
        if b is None or any(isinstance(x, str) for x in bounds):  # a symbol of an omitted optional argument
            return None
        lo, hi = bounds
        if (lo is None or b.value >= lo) and (hi is None or b.value <= hi):
            return None
        lo_s, hi_s = _value_str(self.lo, env), _value_str(self.hi, env)
        need = f">= {lo_s}" if hi is None else f"<= {hi_s}" if lo is None else f"in [{lo_s}, {hi_s}]"
        return f"{b.where} is {self.sym}={b.value}, but {self.sym} must be {need}"


class _SameDtype(Constraint):
    def __init__(self, indices: tuple[int, ...]) -> None:
        self.indices = indices

    def __str__(self) -> str:
        return "same dtype: args " + ", ".join(map(str, self.indices))

    def check(self, binding: Binding, args: Sequence[Any]) -> str | None:
        present = [i for i in self.indices if i < len(args) and isinstance(args[i], torch.Tensor)]
        for i in present[1:]:
            if args[i].dtype != args[present[0]].dtype:
                a, b = dtype_name(args[i].dtype), dtype_name(args[present[0]].dtype)
                return f"arg {i} dtype is {a}, but arg {present[0]} dtype is {b}"
        return None


class _MinCapability(Constraint):
    def __init__(self, major: int, minor: int, why: str) -> None:
        self.need, self.why = (major, minor), why

    def __str__(self) -> str:
        return f"CUDA compute capability >= {self.need[0]}.{self.need[1]}"

    def check(self, binding: Binding, args: Sequence[Any]) -> str | None:
        dev = _device_of(args)
        need = f"{self.need[0]}.{self.need[1]}"
        if dev.type != "cuda":
            return f"tensors are on {dev.type}, but {self.why} needs a CUDA GPU of compute capability >= {need}"
        cap = torch.cuda.get_device_capability(dev)
        if cap >= self.need:
            return None
        name = torch.cuda.get_device_name(dev)
        return f"{dev} ({name}) has compute capability {cap[0]}.{cap[1]}, but {self.why} needs >= {need}"


class _Where(Constraint):
    def __init__(self, pred: Callable[[dict[str, Any], Sequence[Any]], bool], text: str) -> None:
        self.pred, self.text = pred, text

    def __str__(self) -> str:
        return self.text

    def check(self, binding: Binding, args: Sequence[Any]) -> str | None:
        return None if self.pred(binding.sizes, args) else f"requires {self.text}"


def divisible(sym: str, n: int) -> Constraint:
    """`sym` must be a multiple of `n`."""
    return _Divisible(sym, n)


def in_range(sym: str, lo: int | float | str | None = None, hi: int | float | str | None = None) -> Constraint:
    """lo <= sym <= hi (inclusive); a bound may be another symbol's name, None means unbounded."""
    return _InRange(sym, lo, hi)


def same_dtype(*indices: int) -> Constraint:
    """The tensor arguments at `indices` (those present) share one dtype."""
    return _SameDtype(indices)


def min_capability(major: int, minor: int, why: str) -> Constraint:
    """The tensors are on a CUDA GPU of compute capability >= major.minor (`why` names the feature)."""
    return _MinCapability(major, minor, why)


def where(pred: Callable[[dict[str, Any], Sequence[Any]], bool], text: str) -> Constraint:
    """A custom condition `pred(sizes, args)`; `text` states it ("a_scale has 1 or M elements")."""
    return _Where(pred, text)


# ------------------------------------------------------------------------------------------------- signatures


class Sig:
    """The positional argument specs of an implementation, its constraints, and its token symbols (the dims that
    vary with the number of tokens; bucketed to the next power of two in the choice cache, like `...` dims)."""

    def __init__(self, *specs: Spec, constraints: Sequence[Constraint] = (), token: Sequence[str] = ()) -> None:
        required = [s.required for s in specs]
        if any(r and not prev for prev, r in zip(required, required[1:], strict=False)):
            raise ValueError("required arguments must come before optional ones")
        self.specs, self.constraints, self.token = specs, tuple(constraints), frozenset(token)
        self._fits: set[tuple] = set()  # argument kinds `check` found to fit

    def __str__(self) -> str:
        s = "(" + ", ".join(str(s) for s in self.specs) + ")"
        return s + (" where " + ", ".join(str(c) for c in self.constraints) if self.constraints else "")

    def bind(self, args: Sequence[Any]) -> Binding:
        """Match `args`; raises `_Mismatch` with the first reason they do not fit."""
        if len(args) > len(self.specs):
            raise _Mismatch(f"takes at most {len(self.specs)} arguments, got {len(args)}")
        binding = Binding()
        device: tuple[int, torch.device] | None = None
        for i, spec in enumerate(self.specs):
            if i >= len(args):
                if spec.required:
                    raise _Mismatch(f"missing arg {i} ({spec})")
                continue
            spec.bind(i, args[i], binding, self.token)
            if isinstance(args[i], torch.Tensor):
                if device is None:
                    device = (i, args[i].device)
                elif args[i].device != device[1]:
                    raise _Mismatch(f"arg {i} is on {args[i].device}, but arg {device[0]} is on {device[1]}")
        for c in self.constraints:
            why = c.check(binding, args)
            if why is not None:
                raise _Mismatch(why)
        return binding

    def check(self, name: str, args: Sequence[Any]) -> None:
        """For a direct call of an implementation (not through get_op, which would have matched it): raise
        OpMatchError with why these positional `args` do not fit, each "arg i" followed by its name, rather than
        let the kernel fail inside the interpreter or compute garbage (float64 through tf32 dots). Arguments of a
        kind seen to fit before (each tensor's dtype, sizes and device; each other value's type) are not bound
        again: a MoE layer calls fused_moe on every decode step, and a bind costs ~20 µs (numbers are keyed by value,
        other values by type)."""
        key = tuple((a.dtype, a.shape, a.device) if isinstance(a, torch.Tensor)
                    else (type(a), a) if isinstance(a, int | float | str | None)
                    else type(a) for a in args)  # fmt: skip
        if key in self._fits:
            return
        try:
            self.bind(args)
            if len(self._fits) < 1024:
                self._fits.add(key)
        except _Mismatch as e:
            names = [getattr(s.spec if isinstance(s, Optional) else s, "name", None) for s in self.specs]

            def named(m: re.Match) -> str:
                i = int(m.group(1))
                return m.group(0) + (f" ({names[i]})" if i < len(names) and names[i] else "")

            reason = re.sub(r"\barg (\d+)", named, str(e))
            raise OpMatchError(f"{name}: {reason}; got {_describe(args)}; it takes {self}") from None


# ---------------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class OpImpl:
    """One registered implementation of an op."""

    op: str
    name: str
    fn: Callable[..., Any]
    signature: Sig
    space: Mapping[str, Sequence[Any]] | None = None
    bench: Callable[..., Any] | None = None
    description: str = ""

    @property
    def qualname(self) -> str:
        return f"{self.op}/{self.name}"

    def __str__(self) -> str:
        return f"{self.qualname}{self.signature}" + (f": {self.description}" if self.description else "")


_REGISTRY: dict[str, list[OpImpl]] = {}
_CHOICES: dict[ChoiceKey, str] = {}  # -> implementation name

# Modules whose import registers ops; loaded on the first get_op/list_ops, so that importing the registry (and
# dlblas_compiler) does not import triton. Append a module name to add a library.
BUILTIN_MODULES: list[str] = [
    f"{__package__}.{m}" for m in ("gating", "moe_gemm", "fp8", "matmul", "norms", "rotary", "flash_attention")
]


def load_builtin_ops() -> None:
    """Import every module of BUILTIN_MODULES (registering their ops); cheap after the first call."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def register_op(
    name: str,
    impl: Callable[..., Any],
    signature: Sig,
    space: Mapping[str, Sequence[Any]] | None = None,
    bench: Callable[..., Any] | None = None,
    description: str = "",
    *,
    impl_name: str | None = None,
) -> OpImpl:
    """Register `impl` as an implementation of op `name`. Registration order is priority order (the pick on
    devices where nothing is timed). `space` is the implementation's config search space (parameter ->
    choices) for the tuner; `bench`, when given, is timed instead of `impl` (same arguments). Registering an
    `impl_name` again replaces that implementation in place."""
    entry = OpImpl(name, impl_name or impl.__name__, impl, signature, space, bench, description)
    impls = _REGISTRY.setdefault(name, [])
    for i, old in enumerate(impls):
        if old.name == entry.name:
            impls[i] = entry
            break
    else:
        impls.append(entry)
    return entry


def list_ops() -> dict[str, list[OpImpl]]:
    """Every op name with its implementations in priority order (`str(impl)` shows signature and description)."""
    load_builtin_ops()
    return {name: list(impls) for name, impls in sorted(_REGISTRY.items())}


def _describe(args: Sequence[Any]) -> str:
    def one(a: Any) -> str:
        if isinstance(a, torch.Tensor):
            return f"{dtype_name(a.dtype)}{list(a.shape)} {a.device.type}"
        return repr(a)

    return "(" + ", ".join(one(a) for a in args) + ")"


def match_impls(name: str, args: Sequence[Any]) -> list[tuple[OpImpl, Binding]]:
    """The implementations of `name` that accept `args`, in priority order; raises OpMatchError if none does."""
    load_builtin_ops()
    if name not in _REGISTRY:
        raise OpMatchError(f"no op named {name!r}; registered ops: {', '.join(sorted(_REGISTRY)) or 'none'}")
    matched, reasons = [], []
    for impl in _REGISTRY[name]:
        try:
            matched.append((impl, impl.signature.bind(args)))
        except _Mismatch as e:
            reasons.append(f"  {impl.qualname}: {e}")
    if not matched:
        raise OpMatchError(f"no implementation of {name!r} accepts {_describe(args)}:\n" + "\n".join(reasons))
    return matched


def _device_of(args: Sequence[Any]) -> torch.device:
    return next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class ChoiceKey:
    """What an implementation choice depends on: the op, its matching candidates, the argument shapes (token dims
    bucketed to the next power of two; non-float scalars by value), tensor dtypes and the device."""

    op: str
    candidates: tuple[str, ...]
    shape: tuple[tuple[str, Any], ...]
    dtypes: tuple[str, ...]
    device: str

    def cache_key(self, tuning: Any) -> Any:
        """The persistent `tuning.CacheKey` (which adds the device name, capability and Triton/torch versions)."""
        candidates = hashlib.sha256(",".join(self.candidates).encode()).hexdigest()[:16]
        return tuning.CacheKey.make(f"op:{self.op}", candidates, dict(self.shape), self.dtypes, self.device)


def choice_key(name: str, args: Sequence[Any], matched: Sequence[tuple[OpImpl, Binding]]) -> ChoiceKey:
    """The ChoiceKey of calling op `name` on `args`; a dim is bucketed if any matched signature calls it a token
    dim."""
    token = set().union(*(b.token_dims for _, b in matched))
    shape: list[tuple[str, Any]] = []
    dtypes: list[str] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            shape.append((f"arg{i}", tuple(_next_pow2(s) if (i, d) in token else s for d, s in enumerate(a.shape))))
            dtypes.append(dtype_name(a.dtype))
        else:
            shape.append((f"arg{i}", "float" if isinstance(a, float) else repr(a)))
    candidates = tuple(impl.name for impl, _ in matched)
    return ChoiceKey(name, candidates, tuple(shape), tuple(dtypes), str(_device_of(args)))


def _tuning() -> Any:
    """The dlblas_compiler.tuning package (persistent cache), or None if it cannot be imported: choices are then
    remembered in memory only."""
    try:
        from .. import tuning
    except ImportError:
        return None
    return tuning


def _clone_args(args: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def cuda_timer(thunk: Callable[[], Any]) -> float:
    """Median milliseconds of `thunk` on the current CUDA device: its GPU time, as the compiler's tuning takes it
    (`tuning.benchmark`)."""
    from ..tuning import benchmark

    return benchmark(thunk, warmup_ms=5, rep_ms=25, device="cuda") * 1e3


def _time_candidates(
    impls: Sequence[OpImpl], args: Sequence[Any], timer: Callable[[Callable[[], Any]], float]
) -> tuple[OpImpl, dict[str, float]]:
    """Time each implementation on its own clones of `args`; those raising KernelUnsupported drop out."""
    times: dict[str, float] = {}
    unsupported: list[str] = []
    for impl in impls:
        fn, clones = impl.bench or impl.fn, _clone_args(args)
        try:
            times[impl.name] = timer(lambda fn=fn, clones=clones: fn(*clones))
        except KernelUnsupported as e:
            unsupported.append(f"  {impl.qualname}: {e}")
    if not times:
        raise OpMatchError("every matching implementation is unsupported here:\n" + "\n".join(unsupported))
    best = min(times, key=times.__getitem__)
    return next(i for i in impls if i.name == best), times


def select_impl(
    name: str, args: Sequence[Any], *, timer: Callable[[Callable[[], Any]], float] | None = None
) -> OpImpl:
    """The implementation `get_op` returns. With several matching, candidates are timed when the arguments are on
    CUDA (with `cuda_timer`) or when a `timer` is given (thunk -> ms), and the choice is remembered (in memory and
    in the tuning cache). Otherwise the first matching in priority order is taken."""
    matched = match_impls(name, args)
    if len(matched) == 1 or (timer is None and _device_of(args).type != "cuda"):
        return matched[0][0]
    impls = [impl for impl, _ in matched]
    by_name = {impl.name: impl for impl in impls}
    key = choice_key(name, args, matched)
    tuning = _tuning()
    chosen = _CHOICES.get(key)
    if chosen is None and tuning is not None:
        entry = tuning.default_cache().get(key.cache_key(tuning))
        chosen = entry.config.get("impl") if entry is not None else None
    if chosen in by_name:
        _CHOICES[key] = chosen
        return by_name[chosen]
    best, times = _time_candidates(impls, args, timer or cuda_timer)
    _CHOICES[key] = best.name
    if tuning is not None:
        first = times.get(impls[0].name)
        entry = tuning.CacheEntry(
            config={"impl": best.name, "times_ms": times},
            time=times[best.name] / 1e3,
            default_time=None if first is None else first / 1e3,
            trials=len(times),
        )
        tuning.default_cache().put(key.cache_key(tuning), entry)
    return best


def get_op(
    name: str, args: Sequence[Any], *, timer: Callable[[Callable[[], Any]], float] | None = None
) -> Callable[..., Any]:
    """The best implementation of op `name` for positional `args` (see `select_impl`); call it with the same
    arguments (or others of the same signature)."""
    return select_impl(name, args, timer=timer).fn
