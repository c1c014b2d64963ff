"""Tuning a region on its first call: its kernel's config is searched (`tuning.tune`), then the kernel is
timed against the region's reference (cuBLAS for a lone GEMM, torch's SDPA for attention) on the same inputs
and the faster kept, unless the region must keep its kernel (`prefer_kernels`). Both results live in the
persistent tuning cache: the choice under the kernel's kind with ":impl" appended, keyed like its config.
On the GPU each batch of candidate configs is compiled in parallel before it is timed.

A program's first call tunes its regions together (`Together`): it runs through with the references of the
regions the cache cannot answer, keeping each one's inputs, then searches them all at once in step
(`tuning.Lockstep`: their compiles batched in the workers, their timings one at a time), and a region whose search
another one already makes (the same kernel in every layer) takes that one's choice. `DLBLAS_TUNE_TOGETHER=0`: one
region after another, each tuned where the program reaches it (to measure what tuning together buys)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ..codegen.compile_pool import build
from ..codegen.kernel import compile_configs
from ..errors import DeviceFault, is_device_fault
from ..tuning import (
    CacheEntry,
    CacheKey,
    Lockstep,
    TuneJob,
    benchmark,
    default_cache,
    in_turn,
    progress_bar,
    searches,
    tune,
)
from .steps import KernelChoice, RegionStep, first_line

log = logging.getLogger("dlblas_compiler.tuning")
TOGETHER = os.environ.get("DLBLAS_TUNE_TOGETHER", "1") != "0"  # (0: one region after another, to measure)
# a kernel estimated (`_estimate`) at less than this share of the kernel time of the first call it is tuned in keeps
# its default config, still timed against its reference: a norm run once a forward beside 32 layers' GEMMs is ~1 s
# of search for nothing measurable (bench/NOTES.md item 97). Low enough that a decode attention (~1% of a 70B
# model's estimate, more of its time: it is latency-bound) is still searched.
SMALL_SHARE = 0.005

TOKEN_DIMS = ("M", "rows", "S", "L")  # the shape dims that count tokens: bucketed to powers of two in cache keys
# the kernel and the reference are timed in turn, SELECT_ROUNDS times each, in the order k r | r k | k r ..., and
# each side's median compared: a drift of the card's clocks over the measurements then falls on both sides alike
# (one measurement a side kept cuBLAS for regions whose kernel the search had timed faster: BENCHMARKS.md,
# twenty-first and twenty-second sessions)
SELECT_ROUNDS = 3
# ... unless a brief first timing of each side (warm-up, repetition ms) finds one side this many times slower than
# the other: a fused kernel against its unfused reference is decided there, a kernel close to cuBLAS is not. The
# kernel's side of that first comparison is the search's full timing of its config where the search just made one
# (bench/NOTES.md item 101)
SELECT_PROBE_MS, SELECT_CLEAR = (5.0, 10.0), 1.5
# what measured alone within this share of a region's choice (its confirmation round's finalists; the reference
# against the kernel, or the kernel against the reference) is kept as an alternative, up to MAX_ALTERNATIVES of them,
# for the program to decide in its own CUDA graph (`runtime.in_context`): the finalists of most long GEMMs lie
# within 1% of each other and two rounds timed alone order them differently even 2.3% apart (bench/NOTES.md 158)
NEAR, MAX_ALTERNATIVES = 0.03, 3


def tune_region(step: RegionStep, tensors: list, mode: str, progress: bool = True,
                wait: Callable[[list], Any] = build) -> None:  # fmt: skip
    """Search the kernel's config, then keep the kernel only if it beats the region's reference. Any failure
    of the search falls back to the reference (strict: raises), except a fault of the GPU (`DeviceFault`; a
    candidate's is a `CandidateFault`, its config recorded): nothing can run after it in this process.
    `wait(jobs)` builds a batch's compile jobs in the workers (`Lockstep.wait`: with other searches' batches)."""
    try:
        _search(step, tensors, mode, progress, wait)
        if not step.prefer_kernel:
            select(step, tensors)
    except DeviceFault:  # the device can run nothing more here, the reference included: say so and stop
        raise
    except Exception as e:  # noqa: BLE001
        if is_device_fault(e):
            raise DeviceFault(f"region {step.choice.region}: timing its kernel against its reference faulted the GPU "
                              f"({type(e).__name__}: {first_line(e)}); restart the process") from e  # fmt: skip
        step.fall_back(f"region {step.choice.region}: tuning failed ({type(e).__name__}: {first_line(e)})", e)


def _search(step: RegionStep, tensors: list, mode: str, progress: bool, wait: Callable[[list], Any]) -> None:
    k, c = step.kernel, step.choice
    ref_out: list = []

    def ref() -> list:  # the tuner asks for it only on a cache miss
        if not ref_out:
            with torch.no_grad():
                ref_out.extend(step.reference(tensors))
        return ref_out

    # (a compiled kernel's batches are compiled ahead of their timings; an interpreted one has nothing to compile)
    prepare = None if step.interpret else (lambda configs: compile_configs(k, step.compiled, tensors, configs, wait))
    def make(cfg: dict):  # (each candidate writes its own copy of a tensor the kernel writes: see `private`)
        own = step.private(tensors, every=True)
        return lambda: step.launch(own, cfg)

    job = _job(step, tuple(t.dtype for t in tensors), tensors[0].device, make, ref, prepare)
    out = tune(job, mode, progress=progress)
    c.config, c.time, c.default_time, c.trials, c.from_cache = out.config, out.time, out.default_time, out.trials, out.from_cache
    c.alternatives = [("kernel", cfg, t) for cfg, _, t in out.finalists
                      if cfg != out.config and t <= (1 + NEAR) * out.time][:MAX_ALTERNATIVES]  # fmt: skip


def _job(step: RegionStep, dtypes: tuple, device: torch.device, make: Callable, ref: Any = None,
         prepare: Callable | None = None) -> TuneJob:  # fmt: skip
    kind, key = step.kernel.tuning_key
    return TuneJob(kind, key, step.kernel.space, make, step.kernel.shape_key, dtypes, device, ref,
                   token_dims=TOKEN_DIMS, prepare=prepare)  # fmt: skip


@dataclass
class Group:
    """The regions of a program that share one search (the same kernel in every layer): the search's cache key, the
    first of them (whose choice the others take), its inputs' dtypes and device, and all of them."""

    key: Any
    leader: RegionStep
    dtypes: tuple
    device: torch.device
    members: list[RegionStep]


class Together:
    """The regions a program's first call tunes, searched together after the call (see the module's docstring).
    `defer(step, tensors)` at each region to tune, in program order: False when it was tuned at once (the cache
    answers its search, or tuning together is off), True when its search waits for `tune()`: the program then runs
    the region's reference for this call. Inputs the program writes in place later (a KV cache, a counter: the
    `written` storages) are kept as copies, so a search sees the values the region saw."""

    def __init__(self, mode: str, written: set[int], progress: bool = True) -> None:
        self.mode, self.written, self.progress = mode, written, progress
        self.searches: dict[Any, tuple[RegionStep, list]] = {}  # search key -> the first region making it, inputs
        self.followers: list[tuple[RegionStep, Any]] = []  # a region whose search another makes, that search's key
        self.weights: dict[Any, float] = {}  # search key -> the estimated seconds of every region it serves
        self.total = 0.0  # the estimated seconds of every region to tune (searched here or answered by the cache)
        self.groups: dict[Any, Group] = {}  # search key -> the regions sharing that search (`in_context`)

    def defer(self, step: RegionStep, tensors: list) -> bool:
        dtypes, device = tuple(t.dtype for t in tensors), tensors[0].device
        job = _job(step, dtypes, device, _no_build)
        key = job.cache_key()
        if key in self.groups:
            self.groups[key].members.append(step)
        else:
            self.groups[key] = Group(key, step, dtypes, device, [step])
        if not TOGETHER:
            tune_region(step, tensors, self.mode, self.progress)
            return False
        cost = _estimate(step)
        self.total += cost
        if key in self.searches:
            self.followers.append((step, key))
            self.weights[key] += cost
            return True
        if not searches(job, self.mode):
            tune_region(step, tensors, self.mode, self.progress)
            return False
        kept = [t.clone() if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.written else t
                for t in tensors]  # fmt: skip
        self.searches[key] = (step, kept)
        self.weights[key] = cost
        return True

    def tune(self) -> None:
        """Search every deferred region's kernel in step (`Lockstep`), then give each follower its leader's choice."""
        if not self.searches:
            return
        t0 = time.perf_counter()
        lockstep = Lockstep(build)
        n = len(self.searches)
        with progress_bar(f"{n} regions together", n, self.progress) as bar:
            done: list[RegionStep] = []
            grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

            def task(key: Any, step: RegionStep, tensors: list) -> Callable[[], None]:
                device = tensors[0].device if tensors[0].is_cuda else None
                share = self.weights[key] / self.total if self.total > 0 else 1.0

                def run() -> None:  # (on the caller's device and in its grad mode: both are per thread)
                    with (torch.cuda.device(device) if device is not None else nullcontext(),
                          torch.inference_mode(inference), torch.set_grad_enabled(grad)):  # fmt: skip
                        if share >= SMALL_SHARE:
                            tune_region(step, tensors, self.mode, progress=False, wait=lockstep.wait)
                        else:
                            _keep_default(step, tensors, share, lockstep.wait)
                    done.append(step)
                    if bar is not None:
                        bar.update(len(done), None)

                return run

            lockstep.run([task(key, step, tensors) for key, (step, tensors) in self.searches.items()])
        for step, key in self.followers:
            _follow(step.choice, self.searches[key][0].choice)
        log.info("tuned %d regions together (%d more took their choices) in %.1f s; compile batches %s",
                 n, len(self.followers), time.perf_counter() - t0, lockstep.batches)  # fmt: skip
        self.searches, self.followers, self.weights, self.total = {}, [], {}, 0.0


def _keep_default(step: RegionStep, tensors: list, share: float, wait: Callable[[list], Any]) -> None:
    """A region too small a share of the call to search: its default config (compiled in the lockstep's batch
    unless its selection is remembered), timed against its reference as any choice is."""
    default = step.kernel.space.default()
    key = _select_key(step, [t.dtype for t in tensors], tensors[0].device, default)
    if not step.interpret and default_cache().get(key) is None:
        try:
            compile_configs(step.kernel, step.compiled, tensors, [default], wait)
        except Exception:  # noqa: BLE001, S110 - an optimisation: the launch compiles it
            pass
    tune_region(step, tensors, "none", progress=False)
    step.choice.reason = step.choice.reason or f"default config: {share:.2%} of the call's estimated kernel time, not searched"


def _estimate(step: RegionStep) -> float:
    """A region's kernel time in seconds by its bytes and flops on an H100-class card, plus a launch: what its
    share of a call's kernel time is reckoned from (only ratios are used)."""
    return step.kernel.bytes / 3e12 + step.kernel.flops / 6e14 + 4e-6


def _follow(choice: KernelChoice, leader: KernelChoice) -> None:
    """A region whose search another made takes its choice, as from the tuning cache."""
    for name in ("impl", "config", "reason", "time", "default_time", "reference_time", "trials"):
        setattr(choice, name, getattr(leader, name))
    choice.from_cache = True


def _no_build(config: dict) -> Callable:
    raise RuntimeError("a job made for its cache key builds no candidate")


def _select_key(step: RegionStep, dtypes: tuple | list, device: torch.device, config: dict) -> CacheKey:
    """Where `select` remembers its choice for the kernel with this config, on inputs of these dtypes on `device`."""
    k = step.kernel
    kind, source = k.tuning_key
    return CacheKey.make(f"{kind}:impl", source, {**k.shape_key, "config": str(sorted(config.items()))},
                         list(dtypes), device, "kernel|reference", TOKEN_DIMS)  # fmt: skip


def select(step: RegionStep, tensors: list) -> None:
    """Kernel (with its tuned config) or reference, whichever measures faster on these inputs (timed briefly, and
    where neither is `SELECT_CLEAR` times the other, in turn SELECT_ROUNDS times each; the choice remembered)."""
    c = step.choice
    device = tensors[0].device
    key = _select_key(step, [t.dtype for t in tensors], device, c.config)
    cache = default_cache()
    hit = cache.get(key)
    if hit is None:
        own = step.private(tensors, every=True)
        sides = {"kernel": lambda: step.launch(own, c.config), "reference": lambda: step.run_reference(tensors)}
        warmup, rep = SELECT_PROBE_MS
        # (the kernel's side: the full timing the search just made of this config, where it made one; a brief
        # timing of its own, taken first, once read it over 1.6x slower than its search and kept cuBLAS)
        searched = c.time if c.time and not c.from_cache else None
        times = {"kernel": searched or benchmark(sides["kernel"], warmup_ms=warmup, rep_ms=rep, device=device),
                 "reference": benchmark(sides["reference"], warmup_ms=warmup, rep_ms=rep, device=device)}  # fmt: skip
        if max(times.values()) < SELECT_CLEAR * min(times.values()):  # close: time them in turn
            medians = in_turn(list(sides.values()), rounds=SELECT_ROUNDS, warmup_ms=25.0, rep_ms=40.0,
                              later_warmup_ms=5.0, device=device)  # fmt: skip
            times = dict(zip(sides, medians, strict=True))
        impl = min(times, key=times.get)
        hit = CacheEntry({"impl": impl}, times[impl], times["kernel"], 2)
        cache.put(key, hit)
        _near_ties(c, times, impl)
    if hit.config["impl"] == "reference":
        c.impl, c.reference_time = "reference", hit.time
        c.reason = "the reference (torch / cuBLAS) measured faster"


def _near_ties(c: KernelChoice, times: dict[str, float], impl: str) -> None:
    """The alternatives left after `select` chose `impl` by `times`: those within NEAR of its time, with the side
    not chosen among them where it is (the kernel with its tuned config, or the reference)."""
    within = (1 + NEAR) * times[impl]
    other = "reference" if impl == "kernel" else "kernel"
    alts = [a for a in c.alternatives if a[2] <= within]
    if times[other] <= within:
        alts.insert(0, (other, None if other == "reference" else dict(c.config or {}), times[other]))
    c.alternatives = alts[:MAX_ALTERNATIVES]
