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
def interpreted():
    """Run Triton kernels under the interpreter (on CPU tensors) with the semantics they have on a GPU.

    1. Triton's @jit standard-library functions (tl.sum, tl.max, tl.cdiv, ...): Triton picks compiled or
       interpreted ones when `triton.language` is imported; a process that imported it for the GPU (or before
       TRITON_INTERPRET was set) holds compiled ones, which interpreted kernels cannot call. For the duration of
       an interpreted launch they are swapped for interpreted twins.
    2. bfloat16: the interpreter keeps bf16 values as their 16-bit patterns in uint16 arrays and computes on the
       patterns as integers (a bf16 `tl.dot` is off by ~1e11, a bf16 max orders negative numbers wrongly).
       For the duration of the launch, arithmetic, comparisons and dots on bf16 operands compute on the exact
       fp32 values and round results back to bf16 (round to nearest even), as the GPU does: a bf16 dot
       multiplies exactly and accumulates in fp32; a cast to bf16 rounds to nearest even (the interpreter
       truncates).
    """
    from triton.runtime.interpreter import InterpretedFunction, InterpreterBuilder
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
    if not _BF16_BUILDER:
        _BF16_BUILDER.update(_bf16_builder())
    for name, patched in _BF16_BUILDER.items():
        saved.append((InterpreterBuilder, name, getattr(InterpreterBuilder, name)))
        setattr(InterpreterBuilder, name, patched)
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


def _bf16_to_f32(bits):
    import numpy as np

    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    """fp32 -> bf16 bit patterns, rounding to nearest even (NaN stays NaN)."""
    import numpy as np

    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def _bf16_builder() -> dict[str, Callable]:
    """InterpreterBuilder methods that compute on bf16 operands as fp32 values (see `interpreted`)."""
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle, _get_np_dtype, np_erf_fp32

    def is_bf16(*handles) -> bool:
        return any(getattr(h, "dtype", None) is not None and h.dtype.scalar == tl.bfloat16 for h in handles)

    def values(h):
        return _bf16_to_f32(h.data) if h.dtype.scalar == tl.bfloat16 else h.data

    def result(out, dtype):
        if dtype == tl.bfloat16 and out.dtype.kind == "f":
            return TensorHandle(_f32_to_bf16(out), dtype)
        return TensorHandle(out, dtype)

    base_binary, base_unary, base_ternary = (
        InterpreterBuilder.binary_op, InterpreterBuilder.unary_op, InterpreterBuilder.ternary_op,
    )  # fmt: skip
    base_dot, base_fma, base_rsqrt = InterpreterBuilder.create_dot, InterpreterBuilder.create_fma, InterpreterBuilder.create_rsqrt
    base_erf, base_cast = InterpreterBuilder.create_erf, InterpreterBuilder.cast_impl

    def binary_op(self, lhs, rhs, op):
        if not is_bf16(lhs, rhs):
            return base_binary(self, lhs, rhs, op)
        out = op(values(lhs), values(rhs))
        if out.dtype == np.bool_:
            return TensorHandle(out.astype(np.uint16), lhs.dtype.scalar)  # as the interpreter returns compares
        return result(out, lhs.dtype.scalar)

    def unary_op(self, arg, op):
        if not is_bf16(arg):
            return base_unary(self, arg, op)
        return result(op(values(arg)), arg.dtype.scalar)

    def ternary_op(self, lhs, rhs, other, op):
        if op is np.where or not is_bf16(lhs, rhs, other):  # a select moves bit patterns unchanged
            return base_ternary(self, lhs, rhs, other, op)
        return result(op(values(lhs), values(rhs), values(other)), other.dtype.scalar)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not is_bf16(a, b):
            return base_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        out = np.matmul(values(a), values(b), dtype=np.float32) + values(d)
        return result(out.astype(np.float32), d.dtype.scalar)

    def create_fma(self, x, y, z):
        if not is_bf16(x, y, z):
            return base_fma(self, x, y, z)
        return result(values(x) * values(y) + values(z), z.dtype.scalar)

    def create_rsqrt(self, arg):
        if not is_bf16(arg):
            return base_rsqrt(self, arg)
        return result(1 / np.sqrt(values(arg)), arg.dtype.scalar)

    def create_erf(self, arg):
        if not is_bf16(arg):
            return base_erf(self, arg)
        return result(np_erf_fp32(values(arg)), arg.dtype.scalar)

    def cast_impl(self, src, dst_type):
        dst = dst_type.scalar
        if dst == tl.bfloat16 and src.dtype.scalar != tl.bfloat16 and src.dtype.scalar.is_floating():
            return TensorHandle(_f32_to_bf16(src.data.astype(np.float32)), dst)  # an fptrunc rounds to nearest even
        if src.dtype.scalar == tl.bfloat16 and dst != tl.bfloat16:
            return TensorHandle(values(src).astype(_get_np_dtype(dst_type)), dst)
        return base_cast(self, src, dst_type)

    return {"binary_op": binary_op, "unary_op": unary_op, "ternary_op": ternary_op, "create_dot": create_dot,
            "create_fma": create_fma, "create_rsqrt": create_rsqrt, "create_erf": create_erf,
            "cast_impl": cast_impl}  # fmt: skip


_TWINS: dict = {}
_BF16_BUILDER: dict[str, Callable] = {}


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
