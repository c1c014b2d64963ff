"""dlblas_compiler: fused, tuned Triton kernels from torch.fx-traceable PyTorch modules."""

from .api import CompiledModule, compile
from .errors import CompileError, DLError, FrontendError, UnsupportedError
from .passes import DEFAULT_PIPELINE, PASSES, register_pass

__all__ = [
    "compile",
    "CompiledModule",
    "DLError",
    "FrontendError",
    "CompileError",
    "UnsupportedError",
    "DEFAULT_PIPELINE",
    "PASSES",
    "register_pass",
]
__version__ = "0.1.0"
