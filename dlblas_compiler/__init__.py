"""dlblas_compiler: fused, tuned Triton kernels from torch.fx-traceable PyTorch modules, and an operator library."""

from .api import CompiledModule, compile
from .errors import CompileError, DLError, FrontendError, UnsupportedError
from .kernels import get_op, list_ops, register_op
from .passes import DEFAULT_PIPELINE, PASSES, register_pass
from .passes.patterns import P, register_fusion_pattern, unregister_fusion_pattern

__all__ = [
    "compile",
    "CompiledModule",
    "get_op",
    "register_op",
    "list_ops",
    "register_fusion_pattern",
    "unregister_fusion_pattern",
    "P",
    "register_pass",
    "PASSES",
    "DEFAULT_PIPELINE",
    "DLError",
    "FrontendError",
    "CompileError",
    "UnsupportedError",
]
__version__ = "0.1.0"
