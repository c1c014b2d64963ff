"""Library ops implemented by the compiler's own templates (one implementation per computation).

Where the compiler's codegen templates already generate an op (row template: norms, gated activations, rotary;
GEMM template: RMSNorm prologue, glu-of-halves dual GEMM, epilogues; attention template: flash attention), the
library does not keep a second hand-written kernel: the op is a tiny nn.Module whose forward is the op's torch
semantics, spelled the way the recognizer raises it, compiled with `dlblas_compiler.compile` and called.

    cm = compiled("rms_norm", lambda: RMSNormModule(eps), (eps,), x.device)    # cached per (op, static args)
    y = run("rms_norm", lambda: RMSNormModule(eps), (eps,), x, w)

* Backend: "triton" for CUDA tensors, "interpret" (the same generated kernels under the Triton interpreter)
  otherwise. Weights are forward *inputs* (a library op gets them per call), never module constants.
* Caching: one CompiledModule per (op, static arguments such as eps / layout / causal, device type, tune mode);
  the CompiledModule itself specializes (and compiles once) per input shapes and dtypes.
* Kernels, not references: a library op *is* its generated kernels (the torch reference is registered as a
  separate candidate), so it is compiled with `prefer_kernels=True`: no region goes to cuBLAS or its reference
  for speed (a lone GEMM untuned, a tuned kernel measured slower). A region that *failed* to lower, compile or
  launch still falls back to its reference, with the compiler's warning.
* Tuning: DLBLAS_KERNELS_TUNE ("quick" default, "full", "none") is passed to compile on CUDA: the first call
  of each shape searches each kernel's config (Bayesian, cached persistently: later processes reuse it).
* Calls run under torch.no_grad(): library ops are inference kernels (no autograd).

`lowering(cm)` summarizes, from `cm.report()`'s records, what a compiled op became (regions, kernels and how each
runs, ops left outside regions, torch fallbacks): the tests assert each op is the expected number of kernels.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..api import compile as compile_module
from ..codegen import attention, gemm, row

# The templates' parameters (each kernel's own space adds shape-dependent constraints): the `space` the
# template-backed ops register. DLBLAS_KERNELS_TUNE makes the compiler search them.
ROW_SPACE, GEMM_SPACE, ATTENTION_SPACE = row.PARAMS, gemm.PARAMS, attention.PARAMS

_MODULES: dict[tuple, Any] = {}
_LAST: dict[str, Any] = {}
_LOCK = threading.Lock()


def backend_for(device: torch.device) -> str:
    return "triton" if device.type == "cuda" else "interpret"


def tune_mode() -> str:
    """DLBLAS_KERNELS_TUNE: "quick" (default), "full" or "none", read at each compile."""
    return os.environ.get("DLBLAS_KERNELS_TUNE", "quick")


def compiled(op: str, make: Callable[[], torch.nn.Module], static: tuple, device: torch.device) -> Any:
    """The CompiledModule of library op `op` for these static arguments on this device type (built once)."""
    key = (op, static, device.type, tune_mode())
    cm = _MODULES.get(key)
    if cm is None:
        with _LOCK:
            cm = _MODULES.get(key)
            if cm is None:
                backend = backend_for(device)
                tune = key[-1] if backend == "triton" else "none"
                cm = _MODULES[key] = compile_module(
                    make().eval(), backend=backend, tune=tune, cuda_graphs=False, prefer_kernels=True
                )
    _LAST[op] = cm
    return cm


def run(op: str, make: Callable[[], torch.nn.Module], static: tuple, *args: torch.Tensor) -> Any:
    """Call op `op`'s compiled module on `args` (see the module docstring)."""
    cm = compiled(op, make, static, args[0].device)
    with torch.no_grad():
        return cm(*args)


def last_compiled(op: str) -> Any:
    """The CompiledModule that op `op` used last (for `report()`, `ir()` and `lowering`)."""
    return _LAST[op]


def clear_cache() -> None:
    """Forget every compiled library module (they hold compiled kernels and their specializations)."""
    _MODULES.clear()
    _LAST.clear()


@dataclass
class Lowering:
    """What a compiled op became (its last-used specialization), from `cm.report()`'s records."""

    regions: list[str] = field(default_factory=list)  # pattern of each fused region: "row", "gemm", "attention"
    kernels: dict[str, str] = field(default_factory=dict)  # kernel name -> how it runs ("kernel", "reference", ...)
    outside: list[str] = field(default_factory=list)  # top-level compute ops left outside any region
    fallbacks: int = 0  # ops run by PyTorch as opaque calls

    @property
    def all_kernels(self) -> bool:
        """Every region runs its generated kernel, and nothing computes outside the regions."""
        return bool(self.kernels) and all(v == "kernel" for v in self.kernels.values()) and not self.outside and (
            self.fallbacks == 0
        )


def lowering(cm: Any) -> Lowering:
    """The Lowering of a compiled op."""
    rep = cm.report()
    return Lowering(rep.patterns, rep.impls(), rep.outside(), len(rep.fallbacks))
