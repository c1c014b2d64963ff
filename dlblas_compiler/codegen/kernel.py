"""Generated kernels: readable source text, compiled once per source (per backend) and cached.

A template produces a `Kernel`: the Triton source of one `@triton.jit` function, its tunable search
space and default config, and a `launch(inputs, config) -> outputs` built for one specialization (it
knows the shapes, allocates outputs, applies the view chains that were fused as index maps, and
computes the grid). The kernel source is the same for every token count (row counts are runtime
arguments), so a new batch size reuses the compiled kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from ..dialects.types import numel, shape_of
from ..tuning.space import SearchSpace

_COMPILED: dict[tuple[str, bool], Callable] = {}

# A kernel touching a tensor of this many elements or more computes its offsets in 64-bit integers
# (int32 products such as row * stride would wrap); smaller ones keep the cheaper 32-bit arithmetic.
INT32_LIMIT = 2**31

HEADER = "import triton\nimport triton.language as tl\n\n"

TL_DTYPE = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32"}


@contextlib.contextmanager
def interpreted_stdlib():
    """Run Triton's @jit standard-library functions (tl.sum, tl.max, tl.cdiv, ...) under the interpreter.

    Triton picks compiled or interpreted functions when `triton.language` is imported; a process that
    imported it for the GPU (or before TRITON_INTERPRET was set) holds compiled ones, which interpreted
    kernels cannot call. For the duration of an interpreted launch they are swapped for interpreted twins.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    with contextlib.suppress(ImportError):  # imported lazily by the launcher; it checks the originals
        import triton.experimental.gluon  # noqa: F401
    saved = []
    for mod in (tl, tl.math, tl.standard):
        for name, value in list(vars(mod).items()):
            if isinstance(value, JITFunction):
                twin = _TWINS.get(value)
                if twin is None:
                    twin = _TWINS[value] = InterpretedFunction(value.fn)
                saved.append((mod, name, value))
                setattr(mod, name, twin)
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


_TWINS: dict = {}


def wide_indices(values) -> bool:
    """Whether a kernel reading or writing these SSA tensors needs 64-bit index arithmetic."""
    return any(numel(shape_of(v)) >= INT32_LIMIT for v in values)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def compile_source(source: str, name: str, interpret: bool) -> Callable:
    """Exec the kernel source and return the jitted function (interpreted on CPU). Cached by source."""
    key = (source, interpret)
    fn = _COMPILED.get(key)
    if fn is not None:
        return fn
    filename = f"<dlblas:{name}:{source_hash(source)}>"
    # register the text so tracebacks (and Triton, which reads the function's source) can see it
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"triton": triton, "tl": tl}
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        exec(compile(HEADER + source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
    fn = namespace[name]
    _COMPILED[key] = fn
    return fn


@dataclass
class Kernel:
    """One generated kernel for one region and specialization."""

    name: str
    source: str  # the @triton.jit function (without imports)
    space: SearchSpace
    launch: Callable[[Callable, list[torch.Tensor], dict], list[torch.Tensor]]
    region_ir: str = ""
    shape_key: dict = field(default_factory=dict)  # what the tuning cache keys on (token dims bucketed)
    flops: float = 0.0
    bytes: float = 0.0

    @property
    def hash(self) -> str:
        return source_hash(self.source)

    @property
    def tuning_key(self) -> tuple[str, str]:
        """(kind, hash of the source with the kernel's own name blanked): what the tuning cache files this
        kernel under, so the same kernel of every layer (gemm_2, gemm_6, ...) is tuned once."""
        kind = re.sub(r"_\d+$", "", self.name)
        return kind, source_hash(re.sub(rf"\b{re.escape(self.name)}\b", kind, self.source))

    def file_text(self) -> str:
        """The kernel as a readable Python file, with the region's IR as a comment."""
        ir = "\n".join("# " + line for line in self.region_ir.splitlines())
        return f"# dlblas_compiler kernel {self.name} (source hash {self.hash})\n# region:\n{ir}\n\n{HEADER}{self.source}"

    def compiled(self, interpret: bool) -> Callable:
        return compile_source(self.source, self.name, interpret)


class Writer:
    """Indented source text."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.depth + line) if line else "")

    def indent(self) -> Writer:
        self.depth += 1
        return self

    def dedent(self) -> None:
        self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def row_indices(w: Writer, flat: str, nrow: int) -> None:
    """Emit i0..i{nrow-1}: the multi-index of flat row numbers over row dims of runtime sizes R1.. (R0 implied)."""
    rest = flat
    for d in reversed(range(nrow)):
        if d == 0:
            w(f"i0 = {rest}")
        else:
            w(f"i{d} = {rest} % R{d}")
            w(f"q{d} = {rest} // R{d}")
            rest = f"q{d}"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
