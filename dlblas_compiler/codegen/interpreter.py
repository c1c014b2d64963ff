"""Triton kernels on CPU tensors: the Triton interpreter, with the semantics the kernels have on a GPU.

`interpreted()` is the context every interpreted launch runs in (the compiler's generated kernels and the
library's hand-written ones); `launch` runs a kernel on CUDA as it is, elsewhere through its interpreted twin.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton.language as tl

from .launcher import Launcher, launcher

_TWINS: dict[Any, Any] = {}  # a jitted function (stdlib helper or kernel) -> its interpreted twin
_BF16_BUILDER: dict[str, Callable] = {}


def twin(fn: Any) -> Any:
    """The interpreted twin of a @triton.jit function (made once)."""
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(fn, InterpretedFunction):
        return fn
    t = _TWINS.get(fn)
    if t is None:
        t = _TWINS[fn] = InterpretedFunction(fn.fn)
    return t


@contextlib.contextmanager
def interpreted():
    """Run Triton kernels under the interpreter (on CPU tensors) with the semantics they have on a GPU.

    1. Triton's @jit standard-library functions (tl.sum, tl.max, tl.cdiv, ...): Triton picks compiled or
       interpreted ones when `triton.language` is imported; a process that imported it for the GPU (or before
       TRITON_INTERPRET was set) holds compiled ones, which interpreted kernels cannot call. For the duration of
       an interpreted launch they are swapped for interpreted twins.
    2. Triton's language as compiled kernels see it: the interpreter swaps `triton.language`'s builtins (tl.arange,
       tensor operators, ...) for interpreted ones at each launch and undoes that at the launch's end, but its call
       of a jitted helper (`InterpretedFunction.__call__`, Triton 3.6) swaps them without undoing it: after a
       program ran on the interpreter, a Triton kernel compiled in the process failed ("'ir.value' object has no
       attribute 'dtype'"). What the launch changed in `triton.language` is put back when it ends.
    3. bfloat16: the interpreter keeps bf16 values as their 16-bit patterns in uint16 arrays and computes on the
       patterns as integers (a bf16 `tl.dot` is off by ~1e11, a bf16 max orders negative numbers wrongly).
       For the duration of the launch, arithmetic, comparisons and dots on bf16 operands compute on the exact
       fp32 values and round results back to bf16 (round to nearest even), as the GPU does: a bf16 dot
       multiplies exactly and accumulates in fp32; a cast to bf16 rounds to nearest even (the interpreter
       truncates).
    """
    with _ONE_AT_A_TIME:  # (items 1-3 patch modules process-wide: another thread's launch would undo them mid-launch)
        yield from _interpreted()


# interpreted launches in one thread at a time (reentrant: a launch inside a launch, a helper's own)
_ONE_AT_A_TIME = threading.RLock()


def _interpreted():
    from triton.runtime.interpreter import InterpreterBuilder
    from triton.runtime.jit import JITFunction

    with contextlib.suppress(ImportError):  # imported lazily by the launcher; it checks the originals
        import triton.experimental.gluon  # noqa: F401
    # what this launch changes (our twins and bf16 arithmetic, Triton's unreverted swaps: items 1-3) is put back
    touched = (tl, tl.core, tl.math, tl.standard, tl.core.tensor, tl.core.tensor_descriptor_base, InterpreterBuilder)
    before = [(o, dict(vars(o))) for o in touched]
    for mod in (tl, tl.math, tl.standard):
        for name, value in list(vars(mod).items()):
            if isinstance(value, JITFunction):
                setattr(mod, name, twin(value))
    if not _BF16_BUILDER:
        _BF16_BUILDER.update(_bf16_builder())
    for name, patched in _BF16_BUILDER.items():
        setattr(InterpreterBuilder, name, patched)
    try:
        yield
    finally:
        for o, attrs in before:
            for name, value in attrs.items():
                if vars(o).get(name) is not value:
                    setattr(o, name, value)


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


def launch(kernel: Any, grid: Sequence[int], device: torch.device, *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)` on CUDA (through its shared `Launcher`); elsewhere under the Triton
    interpreter."""
    if device.type == "cuda":
        (kernel if isinstance(kernel, Launcher) else launcher(kernel))[grid](*args, **kwargs)
        return
    with interpreted():
        twin(kernel)[grid](*args, **kwargs)
