"""The operator library (DLBlas style): a registry of implementations with symbolic signatures, kernels, and
layers built on them (EPMoE, the expert-parallel mixture of experts). A client of the compiler: it imports the
public API and the codegen templates, and registers its MoE implementation into the runtime.

Three ways to use a kernel:

    op = get_op("topk_gating", (logits, 2)); op(logits, 2)      # matched, chosen (timed on CUDA) and cached
    from dlblas_compiler.library.gating import topk_gating       # from its module
    dlblas_compiler.library.topk_gating(logits, 2)               # from this package

Importing this package does not import triton: kernel modules load on first use (an attribute below, get_op or
list_ops). On CPU tensors the kernels run under the Triton interpreter (see kernels/common.py).
"""

from __future__ import annotations

import importlib
from typing import Any

from . import moe_step  # noqa: F401  (registers dl.moe's implementation into the runtime)
from .registry import (
    BUILTIN_MODULES,
    DTYPES,
    Binding,
    ChoiceKey,
    Constraint,
    KernelUnsupported,
    OpImpl,
    OpMatchError,
    Optional,
    Scalar,
    Sig,
    Tensor,
    choice_key,
    cuda_timer,
    divisible,
    get_op,
    in_range,
    list_ops,
    load_builtin_ops,
    match_impls,
    min_capability,
    register_op,
    same_dtype,
    select_impl,
    where,
)

_KERNELS = {
    "Routing": "gating",
    "expert_capacity": "gating",
    "topk_gating": "gating",
    "topk_gating_reference": "gating",
    "fused_moe": "moe_gemm",
    "fused_moe_reference": "moe_gemm",
    "moe_align_block_size": "moe_gemm",
    "fp8_gemm": "fp8",
    "fp8_gemm_reference": "fp8",
    "quantize_fp8": "fp8",
    "matmul_persistent": "matmul",
    "matmul_tiled": "matmul",
    "matmul_reference": "matmul",
    "rms_norm": "norms",
    "rms_norm_reference": "norms",
    "add_rms_norm": "norms",
    "add_rms_norm_reference": "norms",
    "silu_and_mul": "norms",
    "silu_and_mul_reference": "norms",
    "ffn": "norms",
    "ffn_reference": "norms",
    "apply_rotary_pos_emb": "rotary",
    "apply_rotary_pos_emb_reference": "rotary",
    "partial_rotary_emb": "rotary",
    "partial_rotary_emb_reference": "rotary",
    "flash_attention_v2": "flash_attention",
    "flash_attention_v2_reference": "flash_attention",
    "fused_rotary_and_fa": "flash_attention",
    "fused_rotary_and_fa_compiled": "flash_attention",
    "fused_rotary_and_fa_reference": "flash_attention",
    "EPMoE": "ep_moe",
    "moe_reference": "ep_moe",
    "router_logits": "ep_moe",
}


def __getattr__(name: str) -> Any:
    module = _KERNELS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_KERNELS])


__all__ = [
    "BUILTIN_MODULES",
    "DTYPES",
    "Binding",
    "ChoiceKey",
    "Constraint",
    "KernelUnsupported",
    "OpImpl",
    "OpMatchError",
    "Optional",
    "Scalar",
    "Sig",
    "Tensor",
    "choice_key",
    "cuda_timer",
    "divisible",
    "get_op",
    "in_range",
    "list_ops",
    "load_builtin_ops",
    "match_impls",
    "min_capability",
    "register_op",
    "same_dtype",
    "select_impl",
    "where",
    *_KERNELS,
]
