"""dlblas_compiler: fused, tuned Triton kernels from torch.fx-traceable PyTorch modules, and an operator library."""

from .api import CompiledModule, compile
from .dynamo import compilations, reports
from .errors import CompileError, DeviceFault, DLError, FrontendError, UnsupportedError
from .fusion import P, register_fusion_pattern, register_template, unregister_fusion_pattern, unregister_template
from .library import get_op, list_ops, register_op
from .logs import configure_from_env, set_logs
from .options import Options
from .passes import DEFAULT_PIPELINE, PASSES, register_pass
from .report import Report

__all__ = [
    "compile",
    "CompiledModule",
    "compilations",
    "reports",
    "set_logs",
    "Options",
    "Report",
    "get_op",
    "register_op",
    "list_ops",
    "register_fusion_pattern",
    "unregister_fusion_pattern",
    "register_template",
    "unregister_template",
    "P",
    "register_pass",
    "PASSES",
    "DEFAULT_PIPELINE",
    "DLError",
    "FrontendError",
    "CompileError",
    "UnsupportedError",
    "DeviceFault",
]
__version__ = "0.1.0"

configure_from_env()  # DLBLAS_LOGS (see logs.py)
