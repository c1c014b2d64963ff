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

`lowering(cm)` summarizes, from `cm.report()`, what a compiled op became (regions, kernels and how each runs,
ops left outside regions, torch fallbacks): the tests assert each op is the expected number of kernels.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

TUNE = os.environ.get("DLBLAS_KERNELS_TUNE", "quick")

# top-level ops that move no data (views between regions): allowed outside regions
VIEW_OPS = frozenset({"dl.reshape", "dl.permute", "dl.slice", "dl.broadcast", "dl.constant", "dl.param"})

# The templates' search spaces (codegen/row.py, gemm.py, attention.py; each kernel's own space adds shape-dependent
# constraints): the `space` the template-backed ops register. DLBLAS_KERNELS_TUNE makes the compiler search them.
ROW_SPACE = {"BLOCK_M": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8, 16]}
GEMM_SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [32, 64, 128],
              "SPLIT_K": [1, 2, 4, 8], "GROUP_M": [1, 8], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}  # fmt: skip
ATTENTION_SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [4, 8],
                   "num_stages": [1, 2, 3, 4]}  # fmt: skip

_MODULES: dict[tuple, Any] = {}
_LAST: dict[str, Any] = {}
_LOCK = threading.Lock()


def backend_for(device: torch.device) -> str:
    return "triton" if device.type == "cuda" else "interpret"


def compiled(op: str, make: Callable[[], torch.nn.Module], static: tuple, device: torch.device) -> Any:
    """The CompiledModule of library op `op` for these static arguments on this device type (built once)."""
    key = (op, static, device.type, TUNE)
    cm = _MODULES.get(key)
    if cm is None:
        from .. import api

        with _LOCK:
            cm = _MODULES.get(key)
            if cm is None:
                backend = backend_for(device)
                tune = TUNE if backend == "triton" else "none"
                cm = _MODULES[key] = api.compile(
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
    """What a compiled op became, read from `cm.report()` (last-used specialization)."""

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
    """Parse `cm.report()` into a Lowering."""
    low = Lowering()
    for line in cm.report().splitlines():
        if line.startswith("top-level ops: "):
            for item in line.removeprefix("top-level ops: ").split(", "):
                name, _, n = item.rpartition(" x")
                if name and name not in VIEW_OPS and name != "dl.fused":
                    low.outside.extend([name] * int(n))
        elif m := re.match(r"  \[\d+\] (\w+): ", line):
            low.regions.append(m.group(1))
        elif m := re.match(r"  (\S+) \[(\w+)", line):
            low.kernels[m.group(1)] = m.group(2)
        elif line.startswith("torch fallbacks: "):
            low.fallbacks = int(line.removeprefix("torch fallbacks: "))
    return low
