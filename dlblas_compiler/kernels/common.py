"""Helpers shared by the library's Triton kernels.

On CPU the kernels run under the Triton interpreter. Triton 3.6 decides interpreted-vs-compiled when a function
is decorated with `@triton.jit`, and that includes triton.language's own jit helpers (`tl.zeros`, `tl.sum`, ...)
decorated at `import triton`: so `TRITON_INTERPRET=1` must be in the environment before triton is first
imported. A kernel launched on CPU tensors without it raises `KernelUnsupported` saying so.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import KernelUnsupported

FLOAT_DTYPES = ("f16", "bf16", "f32")


def require_launchable(kernel: Any, device: torch.device, op: str) -> None:
    """Raise KernelUnsupported unless `kernel` can run on `device` (CUDA, or any device under the interpreter)."""
    if device.type == "cuda":
        return
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise KernelUnsupported(
            f"{op}: tensors are on {device.type}; Triton kernels run there only under the interpreter: "
            "set TRITON_INTERPRET=1 in the environment before triton is first imported"
        )


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision matching torch's matmul: exact fp32 ("ieee", not TF32); irrelevant otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"
