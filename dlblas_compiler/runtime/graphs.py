"""CUDA graphs: a program captured once and replayed while the input signature matches.

A replay saves launch overhead and costs copying the inputs in and cloning the outputs. Where the direct calls
are GPU-bound (enqueueing them takes under half their time) there is no overhead to save, so the graph goes.
Otherwise both are timed, alternating (5 rounds of 3 calls, the best round of each: the first direct calls
after a capture pay allocator growth), and the faster stays. What a call writes into its inputs (a KV cache, its
length counter) is put back before every timed call.
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


_STREAMS: dict[int, torch.cuda.Stream] = {}
# the graphs our programs captured whose every parameter read is a derived weight's source: each replay follows a
# check that those have not moved (`Program.__call__`), so building concatenated weights need not keep parameters in
# place for them (`weights`); a program running a module opaquely reads that module's parameters unchecked
OURS: weakref.WeakSet = weakref.WeakSet()


def _warmup_stream(device: int) -> torch.cuda.Stream:
    """One warm-up stream per device for every capture: cuBLAS keeps a workspace (32 MiB on sm90) for each stream
    it ran on, for the life of the process, so a new stream per capture grew memory by that much each time."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


@contextmanager
def captured(graph: torch.cuda.CUDAGraph, pool: Any = None):
    """`torch.cuda.graph(graph, pool)` whose cuBLAS calls use a workspace of the graph's own memory pool. PyTorch
    keeps one workspace per cuBLAS handle and stream and hands it to every capture on that stream, while anyone may
    free it: Inductor's CUDA-graph trees clear all of them before and after each recording, and a destroyed graph
    clears its stream's. A graph that had captured a workspace made elsewhere then replayed cuBLAS into freed
    memory: "illegal memory access" on an H200 (a Phi-3 model of ours and one under torch.compile's
    reduce-overhead in one process, bench/NOTES.md 104). So the workspaces are dropped before the capture (the
    capture makes its own, in its pool, alive as long as the graph) and after it (no later work is handed it), with
    the call Inductor's CUDA-graph trees make around each recording."""
    torch._C._cuda_clearCublasWorkspaces()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()


@dataclass
class CudaGraph:
    """The capture of `run` (a program's direct execution: inputs -> outputs) and its replays.

    Inputs are copied into the graph's own buffers before each replay, except the `static` ones (inputs the
    program writes in place, such as a KV cache): those are captured at their own address, so a replay writes the
    caller's tensor directly, and a replay with another tensor there is refused (`matches`). Their contents are
    put back after the warm-up and timing runs, which would otherwise apply the update more than once."""

    run: Callable[[list], tuple]
    static: tuple[int, ...] = ()
    note: str = ""  # the keep-or-drop measurement, for the report
    checked: bool = False  # every parameter the run reads is checked before each replay (`OURS`)
    graph: Any = None
    static_in: list[torch.Tensor] | None = None
    static_out: tuple | None = None
    addresses: tuple[int, ...] = ()  # the static inputs' addresses at the capture
    copied: tuple[int, ...] = ()  # the inputs copied into the graph's buffers before a replay
    cloned: tuple[bool, ...] = ()  # which outputs a replay clones (those that are not a static input)

    def capture(self, inputs: list) -> bool:
        """Warm up on a side stream (tunes and compiles kernels, settles the allocator), then capture. False
        (with a warning) when the program cannot be captured: it then runs without."""
        self.static_in = [x if i in self.static else x.detach().clone().contiguous() for i, x in enumerate(inputs)]
        self.addresses = tuple(inputs[i].data_ptr() for i in self.static)
        self.copied = tuple(i for i in range(len(inputs)) if i not in self.static)
        stream = _warmup_stream(torch.cuda.current_device())
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with self._preserved():
                with torch.cuda.stream(stream):
                    self.run(self.static_in)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with captured(graph):
                    self.static_out = self.run(self.static_in)
            kept = {id(self.static_in[i]) for i in self.static}
            self.cloned = tuple(id(o) not in kept for o in self.static_out)
            self.graph = graph
            if self.checked:
                OURS.add(graph)
            return True
        except Exception as e:  # noqa: BLE001 - a program that cannot be captured still runs
            logging.getLogger("dlblas_compiler.runtime").warning("CUDA graph capture failed (%s: %s)", type(e).__name__,
                                                                 e)  # fmt: skip
            warnings.warn(f"dlblas_compiler: CUDA graph capture failed ({type(e).__name__}: {e}); running without", stacklevel=4)
            self.graph = None
            return False

    def matches(self, addresses: tuple[int, ...]) -> bool:
        """Whether the static inputs (at `addresses` now) are where the capture saw them."""
        return addresses == self.addresses

    def replay(self, inputs: list) -> tuple:
        copied = self.copied
        if len(copied) > 1:  # (one launch for all of them: a torch op's launch costs the host ~5 µs, NOTES 151)
            torch._foreach_copy_([self.static_in[i] for i in copied], [inputs[i] for i in copied])
        elif copied:
            self.static_in[copied[0]].copy_(inputs[copied[0]])
        self.graph.replay()
        return tuple(o.clone() if c else o for o, c in zip(self.static_out, self.cloned, strict=True))

    def pays(self, inputs: list) -> bool:
        """Whether replaying beats direct calls (see the module docstring); the timings go to `note`."""
        with self._preserved() as reset:
            return graph_pays(self, inputs, reset)

    @contextmanager
    def _preserved(self):
        """Put the static inputs' contents back afterwards, and whenever the `reset` it yields is called: each
        run inside applies its updates (a KV-cache write at the position a counter input gives, and that counter's
        increment), and runs that went on from each other's state would write past the cache's end."""
        saved = [(self.static_in[i], self.static_in[i].clone()) for i in self.static]

        def reset() -> None:
            for t, v in saved:
                t.copy_(v)

        try:
            yield reset
        finally:
            reset()


def graph_pays(runner: Any, inputs: list, reset: Callable[[], None] = lambda: None) -> bool:
    """The keep-or-drop rule for anything with `run(inputs)` and `replay(inputs)`; sets `runner.note`. `reset`
    puts back what a call writes into its inputs; it runs before every call, outside the timed span."""

    def seconds(fn) -> tuple[float, float]:  # (enqueue, enqueue + wait for the GPU) per call
        enqueue = total = 0.0
        for _ in range(3):
            reset()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            enqueue, total = enqueue + t1 - t0, total + time.perf_counter() - t0
        return enqueue / 3, total / 3

    direct_fn, replay_fn = (lambda: runner.run(inputs)), (lambda: runner.replay(inputs))
    for fn in (direct_fn, replay_fn):
        reset()
        fn()
    rounds = [(seconds(direct_fn), seconds(replay_fn)) for _ in range(5)]
    enqueue, direct = min((r[0] for r in rounds), key=lambda t: t[1])  # the fastest direct round
    replay = min(r[1][1] for r in rounds)
    runner.note = (f"CUDA graph replay {replay * 1e6:.0f} µs vs direct launches {direct * 1e6:.0f} µs per call "
                   f"({enqueue * 1e6:.0f} µs of it enqueueing)")  # fmt: skip
    return enqueue >= 0.5 * direct and replay < direct
