"""Helpers shared by the library's Triton kernels.

The kernels are decorated once, at import (compiled kernels, unless TRITON_INTERPRET=1 was set before triton was
first imported). `launch` runs them on CUDA tensors as they are, and on CPU tensors through the Triton
interpreter: an interpreted twin of the kernel, launched while triton.language's own jit helpers (`tl.sum`,
`tl.cumsum`, ...) are swapped for interpreted twins (`codegen.kernel.interpreted`, shared with the
compiler's generated kernels). Triton 3.6 fixes compiled-vs-interpreted when a function is decorated, so without
this a CPU launch would depend on the environment and the import order of the whole process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

FLOAT_DTYPES = ("f16", "bf16", "f32")

_TWINS: dict[Any, Any] = {}  # compiled kernel -> its interpreted twin


def launch(kernel: Any, grid: Sequence[int], device: torch.device, *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)` on CUDA; elsewhere under the Triton interpreter."""
    if device.type == "cuda":
        kernel[grid](*args, **kwargs)
        return
    from triton.runtime.interpreter import InterpretedFunction

    from ..codegen.kernel import interpreted

    twin = kernel if isinstance(kernel, InterpretedFunction) else _TWINS.get(kernel)
    if twin is None:
        twin = _TWINS[kernel] = InterpretedFunction(kernel.fn)
    with interpreted():
        twin[grid](*args, **kwargs)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision matching torch's matmul for fp32 (IEEE unless TF32 is allowed); irrelevant
    otherwise."""
    from ..codegen.device import fp32_dot_precision

    return fp32_dot_precision() if dtype == torch.float32 else "tf32"
