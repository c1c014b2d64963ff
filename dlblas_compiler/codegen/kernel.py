"""Generated kernels: readable source text, compiled once per source (per backend) and cached.

A template produces a `Kernel`: the Triton source of one `@triton.jit` function, its tunable search
space and default config, and a `launch(inputs, config) -> outputs` built for one specialization (it
knows the shapes, allocates outputs, applies the view chains that were fused as index maps, and
computes the grid). The kernel source is the same for every token count (row counts are runtime
arguments), so a new batch size reuses the compiled kernel; and regions whose kernels differ only in their
names (the same pattern in every layer) share one compiled function (`Kernel.compiled`). `compile_configs`
builds the candidates of a tuning batch in parallel: in worker processes (`compile_pool`), then in threads.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from ..tuning.space import SearchSpace
from .compile_pool import build, compiles
from .launcher import Chained, Launcher, launcher
from .source import HEADER

__all__ = ["Chained", "Kernel", "Launcher", "compile_configs", "compile_source", "source_hash", "warm_ups"]

_COMPILED: dict[tuple[str, bool], Callable] = {}


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def compile_source(source: str, name: str, interpret: bool) -> Callable:
    """Exec the kernel source and return the jitted function (interpreted on CPU). Cached by source."""
    key = (source, interpret)
    fn = _COMPILED.get(key)
    if fn is not None:
        return fn
    filename = f"<dlblas:{name}:{source_hash(source)}>"
    text = HEADER + source
    # register the text so tracebacks (and Triton, which reads the function's source) can see it
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    # (a module name: Triton's code generator reads it from each @triton.jit function a kernel calls)
    module = f"dlblas_compiler.generated.{name}"
    namespace: dict[str, Any] = {"triton": triton, "tl": tl, "__name__": module}
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
    fn = namespace[name]
    fn.dlblas_source = (text, module, name, filename)  # (what a compile worker builds it from: `compile_pool`)
    # the source's other kernels: a GEMM's warp-specialized Gluon kernel (gemm/warp_specialized.py), a masked
    # attention's kept key tiles and their lists (attention/prefill.py `blocks_source`)
    fn.variants = {v: namespace[f"{name}_{v}"] for v in ("ws", "blocks", "lists") if f"{name}_{v}" in namespace}
    for v, other in fn.variants.items():
        other.dlblas_source = (text, module, f"{name}_{v}", filename)
    _COMPILED[key] = fn
    return fn


@dataclass
class Kernel:
    """One generated kernel for one region and specialization."""

    name: str
    source: str  # the @triton.jit function (without imports)
    launch: Callable[[Callable, list[torch.Tensor], dict], list[torch.Tensor]]
    region: Any = ""  # the region (a dl.fused op) or its IR text: printed only when a kernel file is written
    shape_key: dict = field(default_factory=dict)  # what the tuning cache keys on (token dims bucketed)
    flops: float = 0.0
    bytes: float = 0.0
    space: SearchSpace | None = None  # its configs: the template's `space(plan)`, set when the region is lowered
    overwrites: tuple[int, ...] = ()  # the region inputs some config writes over (of `FusedOp.overwritable_inputs`)
    _fns: dict = field(default_factory=dict, repr=False)  # interpret -> the jitted function (`compiled`)
    _tuning_key: tuple[str, str] | None = field(default=None, init=False, repr=False)  # (not copied by `replace`)

    @property
    def region_ir(self) -> str:
        return str(self.region)

    @property
    def hash(self) -> str:
        return source_hash(self.source)

    @property
    def tuning_key(self) -> tuple[str, str]:
        """(kind, hash of the source with the kernel's own name blanked): what the tuning cache files this
        kernel under, so the same kernel of every layer (gemm_2, gemm_6, ...) is tuned once."""
        if self._tuning_key is None:  # (asked at every tuning lookup: the name and source do not change)
            kind = re.sub(r"_\d+$", "", self.name)
            self._tuning_key = kind, source_hash(_renamed(self.source, self.name, kind))
        return self._tuning_key

    def file_text(self) -> str:
        """The kernel as a readable Python file, with the region's IR as a comment."""
        ir = "\n".join("# " + line for line in self.region_ir.splitlines())
        return f"# dlblas_compiler kernel {self.name} (source hash {self.hash})\n# region:\n{ir}\n\n{HEADER}{self.source}"

    @property
    def shared_name(self) -> str:
        """The name the kernel is compiled (and profiled) under: its kind and the hash of its source up to its
        name, so every region with the same kernel (each layer's QKV GEMM, say) shares one compiled function."""
        kind, digest = self.tuning_key
        return f"{kind}_{digest[:8]}"

    def compiled(self, interpret: bool, chained: bool = False) -> Callable:
        """The jitted function, shared by every region whose kernel differs only in its name: Triton compiles
        it once per config for all of them (not once per layer). On CUDA it comes as a `Launcher` (each
        specialization's binary launched directly after its first launch); `chained`: with programmatic dependent
        launch (`Chained`; sm90+)."""
        fn = self._fns.get(interpret)
        if fn is None:
            name = self.shared_name
            source = _renamed(self.source, self.name, name)
            fn = self._fns[interpret] = compile_source(source, name, interpret)
        if interpret:
            return fn
        return launcher(fn, chained)


def _renamed(source: str, old: str, new: str) -> str:
    """`source` with the kernel's name `old` replaced by `new`, also where it begins a longer name (`<name>_ws`)."""
    return re.sub(rf"\b{re.escape(old)}(?![0-9A-Za-z])", new, source)


class _Warmup:
    """Stands in for a jitted function in a template's launch: `fn[grid](*args)` compiles `fn` for those
    arguments and constants instead of launching it (asynchronously inside `triton.AsyncCompileMode`)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable:
        return lambda *args, **kwargs: self.fn.run(*args, grid=grid, warmup=True, **kwargs)

    def variant(self, name: str) -> _Warmup:
        """The warm-up of the source's other kernel `name` (`Launcher.variant`)."""
        return _Warmup(self.fn.variants[name])


def warming_up(fn: Any) -> bool:
    """Whether a template's launch got a warm-up's stand-in (`warm_ups`) rather than the jitted function: a launch
    that runs something other than its kernel (cuBLAS) does nothing then."""
    return isinstance(fn, _Warmup)


_POOL: ThreadPoolExecutor | None = None


def warm_ups(kernel: Kernel, fn: Callable, tensors: list, configs: list[dict]) -> Callable[[], None]:
    """A function making the warm-up launch of `fn` (the kernel's jitted function) for each config on these inputs:
    each compiles, none runs (a config whose launch fails is skipped: its real launch reports it)."""

    def warm_up() -> None:
        for config in configs:
            try:
                kernel.launch(_Warmup(fn), tensors, config)
            except Exception:  # noqa: BLE001, S112 - the launch of this config reports it
                continue

    return warm_up


def compile_configs(kernel: Kernel, fn: Callable, tensors: list, configs: list[dict],
                    wait: Callable[[list], Any] = build) -> None:  # fmt: skip
    """Compile `fn` (the kernel's jitted function) for each config on these inputs, in parallel, so that
    launching any of them afterwards finds it built: first in worker processes into Triton's disk cache
    (`wait(jobs)`: `compile_pool.build`, or a `tuning.Lockstep`'s batch with other searches' jobs), then here in
    threads (each finding its binary in that cache). A config that fails to compile is left for its launch to
    report."""
    global _POOL

    warm_up = warm_ups(kernel, fn, tensors, configs)
    wait(compiles(warm_up))
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1)), thread_name_prefix="dlblas-compile")
    with triton.AsyncCompileMode(_POOL, ignore_errors=True):
        warm_up()
