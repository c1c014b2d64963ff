"""Helpers shared by the library's Triton kernels.

The kernels are decorated once, at import (compiled kernels, unless TRITON_INTERPRET=1 was set before triton was
first imported). `launch` (from codegen.interpreter, shared with the compiler's generated kernels) runs them on
CUDA tensors as they are, and on CPU tensors through the Triton interpreter. Triton 3.6 fixes compiled-vs-
interpreted when a function is decorated, so without this a CPU launch would depend on the environment and the
import order of the whole process.
"""

from __future__ import annotations

import torch

from ..codegen.device import fp32_dot_precision
from ..codegen.interpreter import launch

FLOAT_DTYPES = ("f16", "bf16", "f32")


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision matching torch's matmul for fp32 (IEEE unless TF32 is allowed); irrelevant
    otherwise."""
    return fp32_dot_precision() if dtype == torch.float32 else "tf32"


__all__ = ["FLOAT_DTYPES", "launch", "next_pow2", "dot_precision"]
