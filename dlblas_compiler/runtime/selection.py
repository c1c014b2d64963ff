"""Tuning a region on its first call: its kernel's config is searched (`tuning.tune`), then the kernel is
timed against the region's reference (cuBLAS for a lone GEMM, torch's SDPA for attention) on the same inputs
and the faster kept, unless the region must keep its kernel (`prefer_kernels`). Both results live in the
persistent tuning cache: the choice under the kernel's kind with ":impl" appended, keyed like its config.
On the GPU each batch of candidate configs is compiled in parallel before it is timed."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..codegen.compile_pool import build, compiles
from ..codegen.kernel import compile_configs, warm_ups
from ..dialects.types import shape_of, torch_dtype
from ..errors import DeviceFault, is_device_fault
from ..tuning import CacheEntry, CacheKey, TuneJob, benchmark, default_cache, first_candidates, tune
from .steps import RegionStep, first_line

log = logging.getLogger("dlblas_compiler.tuning")
# `compile_first_rounds` on (DLBLAS_COMPILE_AHEAD=0: off, to measure what it buys)
COMPILE_AHEAD = os.environ.get("DLBLAS_COMPILE_AHEAD", "1") != "0"

TOKEN_DIMS = ("M", "rows", "S", "L")  # the shape dims that count tokens: bucketed to powers of two in cache keys
# the kernel and the reference are timed in turn, SELECT_ROUNDS times each, in the order k r | r k | k r ..., and
# each side's median compared: a drift of the card's clocks over the measurements then falls on both sides alike
# (one measurement a side kept cuBLAS for regions whose kernel the search had timed faster: BENCHMARKS.md,
# twenty-first and twenty-second sessions)
SELECT_ROUNDS = 3


def tune_region(step: RegionStep, tensors: list, mode: str, progress: bool = True) -> None:
    """Search the kernel's config, then keep the kernel only if it beats the region's reference. Any failure
    of the search falls back to the reference (strict: raises), except a fault of the GPU (`DeviceFault`; a
    candidate's is a `CandidateFault`, its config recorded): nothing can run after it in this process."""
    try:
        _search(step, tensors, mode, progress)
        if not step.prefer_kernel:
            select(step, tensors)
    except DeviceFault:  # the device can run nothing more here, the reference included: say so and stop
        raise
    except Exception as e:  # noqa: BLE001
        if is_device_fault(e):
            raise DeviceFault(f"region {step.choice.region}: timing its kernel against its reference faulted the GPU "
                              f"({type(e).__name__}: {first_line(e)}); restart the process") from e  # fmt: skip
        step.fall_back(f"region {step.choice.region}: tuning failed ({type(e).__name__}: {first_line(e)})", e)


def _search(step: RegionStep, tensors: list, mode: str, progress: bool) -> None:
    k, c = step.kernel, step.choice
    ref_out: list = []

    def ref() -> list:  # the tuner asks for it only on a cache miss
        if not ref_out:
            with torch.no_grad():
                ref_out.extend(step.reference(tensors))
        return ref_out

    on_gpu = not step.interpret and tensors[0].is_cuda
    prepare = (lambda configs: compile_configs(k, step.compiled, tensors, configs)) if on_gpu else None
    def make(cfg: dict):  # (each candidate writes its own copy of a tensor the kernel writes: see `private`)
        own = step.private(tensors, every=True)
        return lambda: step.launch(own, cfg)

    job = _job(step, tuple(t.dtype for t in tensors), tensors[0].device, make, ref, prepare)
    out = tune(job, mode, progress=progress)
    c.config, c.time, c.default_time, c.trials, c.from_cache = out.config, out.time, out.default_time, out.trials, out.from_cache


def _job(step: RegionStep, dtypes: tuple, device: torch.device, make: Callable, ref: Any = None,
         prepare: Callable | None = None) -> TuneJob:  # fmt: skip
    kind, key = step.kernel.tuning_key
    return TuneJob(kind, key, step.kernel.space, make, step.kernel.shape_key, dtypes, device, ref,
                   token_dims=TOKEN_DIMS, prepare=prepare)  # fmt: skip


def compile_first_rounds(steps: list, env: list, mode: str, device: torch.device | None = None) -> None:
    """Before a program's first call tunes its regions one after another on the GPU: the configs each region's
    search will compile first (`first_candidates`: its default, seeds and first proposals), for every region at
    once, compiled in the worker processes as one batch (`compile_pool.build`). Each search's first round then
    finds its binaries in Triton's cache instead of waiting for its slowest compile (~1.7 s a region on a 16-core
    host: bench/NOTES.md item 90). A region's inputs not known yet (the values earlier regions compute) stand in
    as zeros of their IR types: the compiles depend on shapes, dtypes and alignment alone. Best effort: a region
    that cannot be planned so compiles in its own search as before."""
    if device is None:  # (a program on the GPU: its inputs are there)
        device = next((v.device for v in env if isinstance(v, torch.Tensor) and v.is_cuda), None)
    if not COMPILE_AHEAD or device is None:
        return
    t0 = time.perf_counter()
    jobs: list = []
    regions = 0
    for step in steps:
        if not isinstance(step, RegionStep) or step.kernel is None or step.choice.impl != "kernel" or step.interpret:
            continue
        try:
            pairs = list(zip([env[i] for i in step.ins], step.kernel.region.inputs, strict=True))
            dtypes = tuple(v.dtype if v is not None else torch_dtype(ir.type.element_type) for v, ir in pairs)
            configs = first_candidates(_job(step, dtypes, device, _no_build), mode)  # (none where the cache answers)
            if configs:
                tensors = [_stand_in(v, ir, device) for v, ir in pairs]
                jobs += compiles(warm_ups(step.kernel, step.compiled, step.private(tensors, every=True), configs))
                regions += 1
        except Exception as e:  # noqa: BLE001 - an optimisation: the region's own search compiles what it needs
            log.debug("region %s: its first candidates not compiled ahead (%s: %s)", step.choice.region,
                      type(e).__name__, first_line(e))  # fmt: skip
    if jobs:
        try:
            built = build(jobs)
        except Exception as e:  # noqa: BLE001 - (as above)
            log.debug("the first candidates were not compiled ahead (%s: %s)", type(e).__name__, first_line(e))
            return
        log.info("compiled the first candidates of %d regions ahead: %d of %d compiles in %.1f s", regions, built,
                 len(jobs), time.perf_counter() - t0)  # fmt: skip


def _stand_in(value: Any, ir_value: Any, device: torch.device) -> Any:
    """An input for a planning warm-up: the value when known (made contiguous, as `RegionStep.inputs` does), else
    zeros of the IR value's shape and dtype."""
    if value is not None:
        return value if not isinstance(value, torch.Tensor) or value.is_contiguous() else value.contiguous()
    return torch.zeros(shape_of(ir_value), dtype=torch_dtype(ir_value.type.element_type), device=device)


def _no_build(config: dict) -> Callable:
    raise RuntimeError("a planning job builds no candidate")


def select(step: RegionStep, tensors: list) -> None:
    """Kernel (with its tuned config) or reference, whichever measures faster on these inputs (timed in turn,
    SELECT_ROUNDS times each; the choice remembered)."""
    k, c = step.kernel, step.choice
    kind, source = k.tuning_key
    device = tensors[0].device
    key = CacheKey.make(f"{kind}:impl", source, {**k.shape_key, "config": str(sorted(c.config.items()))},
                        [t.dtype for t in tensors], device, "kernel|reference", TOKEN_DIMS)  # fmt: skip
    cache = default_cache()
    hit = cache.get(key)
    if hit is None:
        own = step.private(tensors, every=True)
        sides = {"kernel": lambda: step.launch(own, c.config), "reference": lambda: step.run_reference(tensors)}
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(SELECT_ROUNDS):
            for name in ("kernel", "reference") if i % 2 == 0 else ("reference", "kernel"):
                samples[name].append(benchmark(sides[name], warmup_ms=25.0 if i == 0 else 5.0, rep_ms=40.0,
                                               device=device))  # fmt: skip
        times = {name: statistics.median(ts) for name, ts in samples.items()}
        impl = min(times, key=times.get)
        hit = CacheEntry({"impl": impl}, times[impl], times["kernel"], 2)
        cache.put(key, hit)
    if hit.config["impl"] == "reference":
        c.impl, c.reference_time = "reference", hit.time
        c.reason = "the reference (torch / cuBLAS) measured faster"
