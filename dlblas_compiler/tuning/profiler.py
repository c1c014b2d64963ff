"""Timing candidates, and the objective that checks a candidate's outputs before it may be timed."""

from __future__ import annotations

import itertools
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


class TuningCheckError(DLError):
    """A candidate's outputs differ from the reference: it is recorded as a failed trial and cannot win."""


def _is_cuda(device: str | torch.device | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return str(device).startswith("cuda")


GRAPH_BELOW_S = 100e-6  # candidates faster than this on CUDA are timed inside a CUDA graph (`graph_seconds`)
GRAPH_CALLS = 16  # calls per graph


def benchmark(
    fn: Callable[..., Any],
    arg_sets: Sequence[tuple] | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    device: str | torch.device | None = None,
) -> float:
    """Median seconds of one call of `fn`, calling it in turn with each argument tuple of `arg_sets` (or with
    no arguments) so that several input buffers rotate and the L2 cache does not flatter small shapes.

    On CUDA (`device` None means "if available") a call under `GRAPH_BELOW_S` is timed as a decode step runs it:
    inside a CUDA graph, after an L2 flush (`graph_seconds`); a longer one, or one that cannot be captured, with
    `triton.testing.do_bench`, which also clears L2 before each call. Elsewhere (CPU, the Triton interpreter) a
    `time.perf_counter` loop: warm-up for `warmup_ms`, then time single calls for `rep_ms` (at least 3) and take
    the median.
    """
    calls = itertools.cycle(list(arg_sets) if arg_sets else [()])

    def call() -> None:
        fn(*next(calls))

    if _is_cuda(device):
        from triton.testing import do_bench

        if _one_call_seconds(call) < GRAPH_BELOW_S:
            seconds = graph_seconds(call)
            if seconds is not None:
                return seconds
        return do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median") / 1e3
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


def _one_call_seconds(call: Callable[[], None]) -> float:
    """A rough time of one call (CUDA events around it, after a warm call): which timing method suits it."""
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


_FLUSH: dict[int, torch.Tensor] = {}
_SIDE: dict[int, torch.cuda.Stream] = {}  # one warm-up stream per device: cuBLAS keeps a workspace per stream


def _flush_buffer() -> torch.Tensor:
    """Twice the L2 cache's bytes: zeroing it evicts what the previous call left there."""
    dev = torch.cuda.current_device()
    if dev not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 64 << 20
        _FLUSH[dev] = torch.empty(2 * l2, dtype=torch.int8, device="cuda")
    return _FLUSH[dev]


def graph_seconds(call: Callable[[], None], calls: int = GRAPH_CALLS, rounds: int = 5) -> float | None:
    """Seconds per call of `call` replayed from a CUDA graph of `calls` (L2 flush, call) pairs, less the same
    graph without the calls (median of `rounds` replays of each, alternating): the time a small kernel takes
    where it runs, a decode step's graph, without the host's launch overhead or the event timing's that
    do_bench adds to every call (for a 20 µs GEMV, noise of the same size as the differences between
    candidates). None when `call` cannot be captured (it synchronizes with the host, say)."""
    flush = _flush_buffer()
    current = torch.cuda.current_stream()
    dev = torch.cuda.current_device()
    if dev not in _SIDE:
        _SIDE[dev] = torch.cuda.Stream()
    side = _SIDE[dev]

    def capture(body: Callable[[], None]) -> torch.cuda.CUDAGraph:
        side.wait_stream(current)
        with torch.cuda.stream(side):  # (a warm-up off the capture: allocator, lazy initialization)
            body()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # (compile threads may run meanwhile)
            for _ in range(calls):
                flush.zero_()
                body()
        return graph

    try:
        timed, base = capture(call), capture(lambda: None)
    except Exception:  # noqa: BLE001 - not capturable: the caller times it with do_bench
        torch.cuda.synchronize()
        return None
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(rounds):
        for i, graph in enumerate((timed, base)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[i].append(start.elapsed_time(end) / 1e3)
    del timed, base
    return max(statistics.median(times[0]) - statistics.median(times[1]), 1e-9) / calls


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
) -> Objective:
    """The objective `config -> seconds` for a kernel: `build(config)` gives the candidate callable (taking one
    tuple of `arg_sets`, or nothing); it is run once on the first argument set and its outputs compared with
    `reference_outputs` by `numerics.compare` (a mismatch raises `TuningCheckError`), then benchmarked.
    Errors from building or running propagate, and the policy records them as failures."""
    refs = None if reference_outputs is None else as_outputs(reference_outputs)
    first = tuple(arg_sets[0]) if arg_sets else ()

    def objective(config: Config) -> float:
        run = build(config)
        if refs is not None:
            problem = compare(as_outputs(run(*first)), refs)
            if problem is not None:
                raise TuningCheckError(f"outputs differ from the reference: {problem}")
        return benchmark(run, arg_sets, warmup_ms, rep_ms, device)

    return objective
