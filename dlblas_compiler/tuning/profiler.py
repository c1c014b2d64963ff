"""Timing candidates, and the objective that checks a candidate's outputs before it may be timed."""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import DLError
from ..numerics import compare
from .policies import Objective
from .space import Config

_MAX_CPU_SAMPLES = 1000
# a raced candidate is first timed this briefly (warm-up, repetition ms): enough to tell a candidate far slower than
# the best so far, a quarter of a quick search's full timing
PROBE_MS = (2.0, 6.0)


class TuningCheckError(DLError):
    """A candidate's outputs differ from the reference: it is recorded as a failed trial and cannot win."""


def _is_cuda(device: str | torch.device | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return str(device).startswith("cuda")


def benchmark(
    fn: Callable[..., Any],
    arg_sets: Sequence[tuple] | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    device: str | torch.device | None = None,
    settle: bool = True,
) -> float:
    """Median seconds of one call of `fn`, calling it in turn with each argument tuple of `arg_sets` (or with
    no arguments) so that several input buffers rotate and the L2 cache does not flatter small shapes.

    On CUDA (`device` None means "if available") this is `_gpu_seconds`: the GPU's time, L2 cleared before each
    call (`settle`: a long call warms for at least LONG_WARMUP_MS; off for a brief probe); elsewhere (CPU, the
    Triton interpreter) a `time.perf_counter` loop: warm-up for `warmup_ms`, then time single calls for `rep_ms`
    (at least 3) and take the median.
    """
    calls = itertools.cycle(list(arg_sets) if arg_sets else [()])

    def call() -> None:
        fn(*next(calls))

    if _is_cuda(device):
        return _gpu_seconds(call, warmup_ms, rep_ms, settle)
    clock = time.perf_counter
    call()
    end = clock() + warmup_ms / 1e3
    while clock() < end:
        call()
    samples: list[float] = []
    end = clock() + rep_ms / 1e3
    while len(samples) < 3 or (clock() < end and len(samples) < _MAX_CPU_SAMPLES):
        start = clock()
        call()
        samples.append(clock() - start)
    return statistics.median(samples)


# the longest host path per call that `_gpu_seconds` hides behind a spin of the GPU (longer ones are timed with it)
MAX_HIDDEN_S = 2e-3
SPIN_HZ = 2.0e9  # cycles per second the spin is reckoned at: no card clocks faster, so it never ends too soon
# a call whose clear and call keep the GPU busy this long (a prefill GEMM, not a decode GEMV: ~75 µs with the clear)
# warms for at least LONG_WARMUP_MS, so that a compute-bound one nears its clock at the card's power limit
# (quick tuning's 10 ms left such GEMMs up to 13% fast; 25 ms, up to 9%: bench/NOTES.md 146). (Warming on in blocks
# until the card's clock stopped falling was measured and not kept: bench/NOTES.md 148.)
LONG_CALL_S = 100e-6
LONG_WARMUP_MS = 25.0


def _gpu_seconds(call: Callable[[], None], warmup_ms: float, rep_ms: float, settle: bool = True) -> float:
    """Median GPU seconds of `call`, as `triton.testing.do_bench` times it (L2 cleared before each call, events
    around it, repetitions for `rep_ms`) but with the host's launch path hidden: before each timed call the GPU
    spins (`torch.cuda._sleep`) for as long as the call takes the host to enqueue, less what the GPU is busy with
    the clear and the call before it, so its kernels are queued when the start event is reached. A generated
    kernel's launch costs 25-80 µs of host time (H200 host, a GEMM region of 44 arguments), the L2 clear ~60 µs of
    GPU time: timed without the spin, a 15 µs decode GEMV measured 38-121 µs, by the host, and its configs ranked
    as noise (bench/NOTES.md 108). A program replays its kernels from CUDA graphs, where only their GPU time counts;
    this is that time.

    A call longer than its host path runs back to back with no spin, as a graph replays it: a long compute-bound
    GEMM holds the card at its power limit, where its clock drops (an H200 at 700 W: 1.5-1.7 GHz against 1.98), and
    a spin of idle GPU between calls let it run cooler and faster, up to 14-18% below its replay, by amounts that
    differ between configs (bench/NOTES.md 145, 146). With `settle`, such a call (the clear and it busy for
    LONG_CALL_S or more) warms for at least LONG_WARMUP_MS."""
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        call()
    host = (time.perf_counter() - t0) / 3
    hidden = min(MAX_HIDDEN_S, 1.5 * host + 20e-6)  # seconds of GPU work that keep the host ahead
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
    torch.cuda.synchronize()
    for i in range(5):  # the GPU time of a clear and a call, each queued behind a full spin
        torch.cuda._sleep(int(hidden * SPIN_HZ))
        starts[i].record()
        driver.clear_cache(cache)
        call()
        ends[i].record()
    torch.cuda.synchronize()
    busy = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3
    spin = max(0.0, hidden - busy)
    estimate_ms = (busy + spin) * 1e3
    if settle and busy >= LONG_CALL_S:
        warmup_ms = max(warmup_ms, LONG_WARMUP_MS)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        call()
    n = max(5, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        driver.clear_cache(cache)
        if spin:
            torch.cuda._sleep(int(spin * SPIN_HZ))
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3


def turn_orders(n: int, turns: int) -> list[list[int]]:
    """The order of `paired`'s calls in each turn: a seeded random permutation of range(n) per turn, the same in every
    run (bench/report.py rebuilds it for results that did not record it)."""
    rng = random.Random(0)
    return [rng.sample(range(n), n) for _ in range(turns)]


def paired(calls: Sequence[Callable[[], Any]], turns: int, before: Callable[[], Any] | None = None) -> list[list[float]]:
    """`turns` calls of each of `calls` taken in turn, one call at a time (in a new order each turn), each timed
    as `triton.testing.do_bench` times one (L2 cleared, events around the call, no wait for the GPU between calls):
    all of them run under the same state of the card (the power limiter's clock drifts by up to ~10% between
    blocks of 0.1 s, bench/NOTES.md 156), so the median of their per-turn ratios compares like with like. `before`
    (optional) runs ahead of each call's clear, outside its events (putting back what a call wrote in place). Per
    call, its seconds in turn order. GPU only.

    No wait for the GPU means a call's events also hold whatever the GPU waited for since the call before it: the
    host's own time where that call left the GPU idle (an eager model, a host-bound call). So each turn's order is a
    random permutation (seeded, so runs repeat), and every call follows each other one about equally often. A
    rotation made call i follow call i - 1 in all but one turn of n: with an eager model first in a rotation of three,
    the compiled call after it read 6-28% slower than the third, its twin, which later calls timing the two alone found
    1.6-2.1% slower than it (bench/NOTES.md 179). Where a call leaves the GPU idle (a host-bound eager or Inductor
    call, one token), the host work of the call after it is timed too: at 1 and 128 tokens a layer's call read up to
    2x slower after Inductor's default mode than after itself, at 2048 tokens within 1% (bench/NOTES.md 184). There
    only calls after a GPU-bound one compare like with like (bench/report.py splits them by predecessor)."""
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    n = len(calls)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(turns)]
              for _ in calls]  # fmt: skip
    for call in calls:  # (a warm call each: a first call after another's may allocate)
        if before is not None:
            before()
        call()
    torch.cuda.synchronize()
    for t, order in enumerate(turn_orders(n, turns)):
        for i in order:
            if before is not None:
                before()
            driver.clear_cache(cache)
            start, end = events[i][t]
            start.record()
            calls[i]()
            end.record()
    torch.cuda.synchronize()
    return [[start.elapsed_time(end) / 1e3 for start, end in evs] for evs in events]


# the confirmation round (`confirm`): after a search, the finalists (up to TuneMode.confirm of them, each within
# CONFIRM_WITHIN of the best search time, and the default config: tuner._confirmed) are timed again `in_turn`,
# CONFIRM_ROUNDS blocks of CONFIRM_MS (warm-up, repetition ms) each, and the one with the lowest median wins. Only on
# a GPU and for calls of CONFIRM_MIN_S or more: a long GEMM at the card's power limit reads +-3-4% from one brief
# timing to the next (bench/NOTES.md 146), and some candidates read 7-15% fast in the search (NOTES 147: a
# cuBLAS-product config of a gate/up GEMM 669 µs there, 770 µs held and as a graph replays it, the layer 2-3% slower
# with it; our reading: timed on a card that cooled while the search waited for compiles); short calls time within
# ~1-2% and are not re-timed. The margin is wide so that the configs such a fast reading pushed down are finalists.
CONFIRM_WITHIN = 1.15
CONFIRM_MIN_S = 50e-6
CONFIRM_ROUNDS = 3
CONFIRM_MS = (25.0, 100.0)


def confirms(device: str | torch.device | None, seconds: float) -> bool:
    """Whether a search whose best time is `seconds` on `device` gets a confirmation round."""
    return _is_cuda(device) and seconds >= CONFIRM_MIN_S


def finalists(trials: Sequence[tuple[Config, float]], count: int) -> list[tuple[Config, float]]:
    """The (config, seconds) a confirmation round re-times: the `count` fastest of `trials`, those within
    CONFIRM_WITHIN of the fastest."""
    ranked = sorted(trials, key=lambda t: t[1])[:count]
    return [(c, s) for c, s in ranked if s <= CONFIRM_WITHIN * ranked[0][1]]


def in_turn(
    calls: Sequence[Callable[..., Any]],
    *,
    rounds: int,
    warmup_ms: float,
    rep_ms: float,
    later_warmup_ms: float | None = None,
    arg_sets: Sequence[tuple] | None = None,
    device: str | torch.device | None = None,
) -> list[float]:
    """The median seconds of each of `calls` over `rounds` `benchmark`s taken in turn (in order, then reversed,
    ...; `later_warmup_ms` is the warm-up after the first round, where given): a drift of the card's clock over the
    rounds falls on every call alike, and each block starts on a card the block before kept busy, as a model's
    replay does."""
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        warm = warmup_ms if r == 0 or later_warmup_ms is None else later_warmup_ms
        for i in range(len(calls)) if r % 2 == 0 else reversed(range(len(calls))):
            kw = {"arg_sets": arg_sets} if arg_sets else {}
            times[i].append(benchmark(calls[i], warmup_ms=warm, rep_ms=rep_ms, device=device, **kw))
    return [statistics.median(t) for t in times]


def confirm(
    build: Callable[[Config], Callable[..., Any]],
    configs: Sequence[Config],
    arg_sets: Sequence[tuple] | None = None,
    device: str | torch.device | None = None,
) -> list[float]:
    """The confirmation round: the median seconds of each of `configs`, timed `in_turn` for CONFIRM_ROUNDS rounds
    of CONFIRM_MS. The candidates are built once (each was checked against the reference in the search)."""
    warmup_ms, rep_ms = CONFIRM_MS
    return in_turn([build(c) for c in configs], rounds=CONFIRM_ROUNDS, warmup_ms=warmup_ms, rep_ms=rep_ms,
                   arg_sets=arg_sets, device=device)  # fmt: skip


def as_outputs(value: Any) -> tuple[Any, ...]:
    """A candidate's or reference's result as a tuple of outputs (a lone tensor becomes a 1-tuple)."""
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def make_objective(
    build: Callable[[Config], Callable[..., Any]],
    reference_outputs: Any = None,
    arg_sets: Sequence[tuple] | None = None,
    *,
    device: str | torch.device | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    race: float | None = None,
) -> Objective:
    """The objective `config -> seconds` for a kernel: `build(config)` gives the candidate callable (taking one
    tuple of `arg_sets`, or nothing); it is run once on the first argument set and its outputs compared with
    `reference_outputs` by `numerics.compare` (a mismatch raises `TuningCheckError`), then benchmarked.
    Errors from building or running propagate, and the policy records them as failures.

    With `race` (a factor > 1), a candidate after the first is timed briefly first (`PROBE_MS`); one that takes
    more than `race` times the best full timing so far returns that brief time, which is all a search needs of a
    candidate it will not choose; the others are timed in full. (No race where the full timing is no longer.)"""
    refs = None if reference_outputs is None else as_outputs(reference_outputs)
    first = tuple(arg_sets[0]) if arg_sets else ()
    best = math.inf
    race = race if rep_ms > PROBE_MS[1] else None

    def objective(config: Config) -> float:
        nonlocal best
        run = build(config)
        if refs is not None:
            problem = compare(as_outputs(run(*first)), refs)
            if problem is not None:
                raise TuningCheckError(f"outputs differ from the reference: {problem}")
        if race is not None and best < math.inf:
            probe = benchmark(run, arg_sets, *PROBE_MS, device, settle=False)  # (brief by design)
            if probe > race * best:
                return probe
        seconds = benchmark(run, arg_sets, warmup_ms, rep_ms, device)
        best = min(best, seconds)
        return seconds

    return objective
