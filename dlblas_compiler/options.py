"""`Options`: how a module is compiled, one typed record passed whole from `compile()` to every stage."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from xdsl.utils.exceptions import ArgSpecParseError

from .passes import DEFAULT_PIPELINE
from .passes.registry import check_pipeline

BACKENDS = ("triton", "interpret", "reference")
TUNE_MODES = ("none", "quick", "full")
DEBUG_DIR_ENV = "DLBLAS_DEBUG_DIR"  # a debug folder for every compile (what `dump_ir` gives one)


def default_backend() -> str:
    return "triton" if torch.cuda.is_available() else "reference"


@dataclass
class Options:
    """backend: "triton" (CUDA), "interpret" (the same Triton kernels on CPU), "reference" (the torch reference
    of every op); None picks triton when CUDA is available, else reference.
    tune: "none" (each kernel's default config), "quick" (Bayesian search, <= 24 trials), "full" (every config).
    dump_ir: a debug folder: each compiled graph gets a subfolder `<graph index>-<model class>/`, and each input
    signature of it one inside, `<specialization index>-<short signature>/`, holding the IR after every pass
    (`ir/`), every kernel's source (`kernels/`), the kernel choices and tuning results (`tuning.json`) and the
    report (`report.txt`, `report.json`, `report.html`). Unset, the `DLBLAS_DEBUG_DIR` environment variable
    gives it.
    cuda_graphs: capture the program as one CUDA graph and replay it, where that measures faster.
    chained_launches: on Hopper and newer GPUs, launch the generated kernels with programmatic dependent launch:
    each may start while the kernel before it drains and waits on the device for its results (directly and
    inside CUDA graphs); a GEMM lets the next kernel start once its K loop has read its operands. On an H200 the
    32-layer decode graph replayed 0.6-1.3% faster with it (bench/NOTES.md 124). No effect on GPUs before sm90,
    with a CUDA driver before 12.3 (it would not capture such launches into CUDA graphs), or on the interpreter.
    share_weights: where the compiler concatenates parameters into one GEMM weight (q/k/v, gate/up), the
    parameters become slices of that buffer at the first call (`p.data` is re-pointed; values, the model's own
    forward and later updates are unchanged), so the model holds those weights once — except while a CUDA graph
    is alive in the process (yours, torch.compile's "reduce-overhead" / "max-autotune" ones; not our programs',
    which check their weights before each replay), which may read the old addresses: then the concatenated
    weights are copies, with one warning. A tensor taken from `p.data` before the first call no longer aliases the
    parameter. False: every parameter always stays where it
    is (the concatenated weights are copies: more memory).
    pipeline: the passes, xdsl-opt style ("canonicalize,cse,...,fuse").
    check_each_pass: run the reference after every pass and name the first pass that changed the result.
    strict: a region that fails to lower, compile, tune or launch raises CompileError instead of falling back
    to its reference with a warning; a call that needs gradients raises instead of running eagerly.
    check: True compares every kernel's outputs with its region's reference on every call (N: the first N
    calls), warns once per region above its dtype's tolerance and shows the worst error in report(); it runs
    each region twice and without CUDA graphs: a debugging mode.
    expert_parallel: a torch.distributed process group; MoE blocks (`dl.moe`) then run as EPMoE, each rank
    holding its share of the experts. Without it, on the kernel backends they run as topk_gating + fused_moe.
    expert_parallel_tokens: with expert_parallel, the most tokens any rank passes to a MoE block in one call (the
    same number on every rank): the tokens then travel through the GPUs' memory (EPMoE's `peer_tokens`: no NCCL,
    no wait for the host), so the compiled program is replayed from a CUDA graph like any other; without it they
    travel by `all_to_all_single`, whose counts go through the host, and the program runs without graphs.
    Every rank must call the compiled module the same number of times, as with any collective.
    prefer_kernels: every region with a kernel runs it, even a lone GEMM that would run on cuBLAS or a tuned
    kernel that measured slower than its region's reference (the library's template-backed ops use this).
    max_specializations: how many input signatures a compiled module keeps compiled (shape-family instances go
    first, then compiles a family can instantiate again, then the others, least recently used first, with their
    buffers and CUDA graphs; derived weights are shared by all): memory does not grow with the number of
    sequence lengths seen.
    shape_families: when a second input signature differs from a compiled one only in sizes within the same
    power-of-two buckets, and the two compiled IRs have one structure, every further size of those buckets is
    instantiated from the first IR (its sizes affine in the new ones, verified) instead of compiled: a prompt or
    cache length whose bucket was seen twice compiles no more (`passes.families`), where the graph holds its
    integer arithmetic on sizes and that is affine, or reads only sizes the two compiles share
    (`frontend.sizes_unseen`). False compiles every signature.
    keep_traces: for `dc.compile(model.forward)` (a module's forward compiled through dynamo): keep dynamo's
    traces on disk beside the tuning cache (`traces/` in `$DLBLAS_CACHE_DIR`, else `~/.cache/dlblas_compiler`), so
    that a new process loads a call's trace instead of tracing the model again (`api.TracedForward`; torch's
    experimental `aot_compile`, torch >= 2.10), and our compile of each traced graph (its IR after the passes) is
    kept beside it and loaded instead of made again. Each trace is a whole graph: a forward with a graph break is
    compiled as without this option, with a warning.
    """

    backend: str | None = None
    tune: str = "none"
    dump_ir: str | None = None
    cuda_graphs: bool = True
    chained_launches: bool = True
    share_weights: bool = True
    pipeline: str = DEFAULT_PIPELINE
    check_each_pass: bool = False
    strict: bool = False
    check: bool | int = False
    expert_parallel: Any = None
    expert_parallel_tokens: int | None = None
    prefer_kernels: bool = False
    max_specializations: int = 16
    shape_families: bool = True
    keep_traces: bool = False

    def __post_init__(self):
        self.backend = self.backend or default_backend()
        if isinstance(self.pipeline, (list, tuple)) and all(isinstance(p, str) for p in self.pipeline):
            self.pipeline = ",".join(self.pipeline)
        self.pipeline = self.pipeline or DEFAULT_PIPELINE
        if not isinstance(self.pipeline, str):
            raise ValueError(f"pipeline must be a string of passes ('cse,fuse') or a list of them, "
                             f"got {self.pipeline!r}")
        try:
            check_pipeline(self.pipeline)
        except ArgSpecParseError as e:  # (xDSL's syntax error is not an Exception: a BaseException)
            raise ValueError(f"pipeline {self.pipeline!r} cannot be parsed: {e}") from None
        self.dump_ir = self.dump_ir or os.environ.get(DEBUG_DIR_ENV) or None
        if self.dump_ir is not None:
            self.dump_ir = os.path.expanduser(os.fspath(self.dump_ir))
            if os.path.exists(self.dump_ir) and not os.path.isdir(self.dump_ir):
                raise ValueError(f"dump_ir (or ${DEBUG_DIR_ENV}) names a file, not a folder: {self.dump_ir!r}")
        for name in ("cuda_graphs", "chained_launches", "share_weights", "check_each_pass", "strict", "prefer_kernels",
                     "shape_families", "keep_traces"):  # fmt: skip
            value = getattr(self, name)
            if type(value) is int and value in (0, 1):
                setattr(self, name, bool(value))
            elif not isinstance(value, bool):  # (`strict="no"` is true in Python)
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.tune not in TUNE_MODES:
            raise ValueError(f"tune must be one of {TUNE_MODES}, got {self.tune!r}")
        if not isinstance(self.check, bool) and (not isinstance(self.check, int) or self.check < 0):
            raise ValueError(f"check must be a bool or a number of calls >= 0, got {self.check!r}")
        if type(self.max_specializations) is not int or self.max_specializations < 1:
            raise ValueError(f"max_specializations must be a positive int, got {self.max_specializations!r}")
        tokens = self.expert_parallel_tokens
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
            raise ValueError(f"expert_parallel_tokens must be a positive int, got {tokens!r}")
        if tokens is not None and self.expert_parallel is None:
            raise ValueError("expert_parallel_tokens sizes the expert-parallel exchange: give expert_parallel (a "
                             "process group) too")
        if self.backend == "triton" and not torch.cuda.is_available():
            raise ValueError("backend='triton' needs a CUDA GPU; use 'interpret' (Triton on CPU) or 'reference'")
