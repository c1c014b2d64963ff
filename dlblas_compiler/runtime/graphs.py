"""CUDA graphs: a program captured once and replayed while the input signature matches.

A replay saves launch overhead and may cost copying inputs in (those not read where the caller's tensors are) and
cloning outputs (once the caller has kept one past the next call): `CudaGraph`. Both ways are timed as a caller
runs them, calls back to back (the host enqueues one while the GPU runs the one before), alternating
(5 rounds of 4 calls, the best round of each: the first direct calls after a capture pay allocator growth), and
the faster stays. A call synchronized alone would charge direct launches their whole enqueueing, which calls in
a row hide while the GPU is busy; a rule that dropped every graph whose direct calls enqueue in under half their
time (bench/NOTES.md 17) went with that timing (item 155). What a call writes into its inputs (a KV cache, its
length counter) is put back before every timed call.
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ParametersChanged

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


# inputs from this size up are read where the caller's tensor is, when it stays there; copied (an input that moved),
# each has its own copy kernel: a foreach copy gives each block 64K elements, walked in ~32 dependent steps, ~15 µs
# for a 0.5 MB input where a plain copy takes ~2 (bench/NOTES.md 156); smaller ones share one foreach launch
IN_PLACE_BYTES = 64 << 10


def input_key(t) -> tuple:
    """What a capture that reads `t` where it is relies on: its address and layout."""
    return (t.data_ptr(), tuple(t.shape), t.stride()) if isinstance(t, torch.Tensor) else (id(t),)


def _uses(storage) -> int:
    """How many tensors and storage objects hold `storage` (torch's count: a view adds one)."""
    return torch._C._storage_Use_Count(storage._cdata)


@dataclass
class CudaGraph:
    """The capture of `run` (a program's direct execution: inputs -> outputs) and its replays.

    Inputs reach the graph three ways. The `static` ones (inputs the program writes in place, such as a KV cache)
    and the `in_place` ones (large inputs the caller passed at one address twice in a row: a benchmark's, or a
    serving loop's input buffer) are captured where the caller's tensors are, so a replay reads (or writes) them
    there, and a replay with another tensor there is refused (`matches`): the program then captures again, copying
    from then on. The rest are copied into the graph's own buffers before each replay. The static inputs' contents
    are put back after the warm-up and timing runs, which would otherwise apply the update more than once.

    Outputs: with `handout`, a replay returns the graph's own output buffers (no clone). The next replay would
    overwrite them, so before it the program asks whether the caller still holds any (`held`: a tensor or view of
    one alive), and if so captures again with `handout` off, cloning each output from then on; the caller keeps
    the old buffers, and with them the old capture's memory."""

    run: Callable[[list], tuple]
    static: tuple[int, ...] = ()
    in_place: tuple[int, ...] = ()
    handout: bool = True
    note: str = ""  # the keep-or-drop measurement, for the report
    checked: bool = False  # every parameter the run reads is checked before each replay (`OURS`)
    quiet: bool = False  # a failed capture raises (a timing's capture: the caller says what failed), no warning
    graph: Any = None
    static_in: list[torch.Tensor] | None = None
    static_out: tuple | None = None
    addresses: tuple[int, ...] = ()  # the static inputs' addresses at the capture
    keys: tuple = ()  # the in-place inputs' addresses and layouts at the capture
    copied: tuple[int, ...] = ()  # the inputs copied into the graph's buffers before a replay
    together: tuple[int, ...] = ()  # of those, the ones copied by one foreach launch (two or more under IN_PLACE_BYTES)
    alone: tuple[int, ...] = ()  # and the ones copied one by one
    cloned: tuple[bool, ...] = ()  # which outputs are the graph's own (not an input it reads where it is)
    storages: list = field(default_factory=list)  # of the graph's own outputs, and their use counts at the capture
    base: list[int] = field(default_factory=list)

    def capture(self, inputs: list) -> bool:
        """Warm up on a side stream (tunes and compiles kernels, settles the allocator), then capture. False
        (with a warning) when the program cannot be captured: it then runs without."""
        own = {*self.static, *self.in_place}
        self.static_in = [x if i in own else x.detach().clone().contiguous() for i, x in enumerate(inputs)]
        self.addresses = tuple(inputs[i].data_ptr() for i in self.static)
        self.keys = tuple(input_key(inputs[i]) for i in self.in_place)
        self.copied = tuple(i for i in range(len(inputs)) if i not in own)
        small = tuple(i for i in self.copied if inputs[i].numel() * inputs[i].element_size() < IN_PLACE_BYTES)
        self.together = small if len(small) > 1 else ()
        self.alone = tuple(i for i in self.copied if i not in self.together)
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
            kept = {id(self.static_in[i]) for i in own}
            self.cloned = tuple(isinstance(o, torch.Tensor) and id(o) not in kept for o in self.static_out)
            self.storages = [o.untyped_storage() for o, c in zip(self.static_out, self.cloned, strict=True) if c]
            self.base = [_uses(st) for st in self.storages]
            self.graph = graph
            if self.checked:
                OURS.add(graph)
            return True
        except Exception as e:  # noqa: BLE001 - a program that cannot be captured still runs
            if self.quiet or isinstance(e, ParametersChanged):  # (stale: the compiled module compiles again)
                raise
            logging.getLogger("dlblas_compiler.runtime").warning("CUDA graph capture failed (%s: %s)", type(e).__name__,
                                                                 e)  # fmt: skip
            warnings.warn(f"dlblas_compiler: CUDA graph capture failed ({type(e).__name__}: {e}); running without", stacklevel=4)
            self.graph = None
            return False

    def matches(self, addresses: tuple[int, ...], inputs: list) -> bool:
        """Whether the static inputs (at `addresses` now) and the in-place ones are where the capture saw them."""
        return addresses == self.addresses and all(
            input_key(inputs[i]) == k for i, k in zip(self.in_place, self.keys, strict=True))

    def held(self) -> bool:
        """Whether the caller still holds an output buffer a replay handed out (a tensor or a view of it alive)."""
        return self.handout and any(_uses(st) > n for st, n in zip(self.storages, self.base, strict=True))

    def replay(self, inputs: list) -> tuple:
        if self.together:  # (one launch for the small ones: a torch op's launch costs the host ~5 µs, NOTES 151)
            torch._foreach_copy_([self.static_in[i] for i in self.together], [inputs[i] for i in self.together])
        for i in self.alone:
            self.static_in[i].copy_(inputs[i])
        self.graph.replay()
        if self.handout:  # (a new tensor object on the buffer: what the caller holds shows in the storage's count)
            return tuple(o.detach() if c else o for o, c in zip(self.static_out, self.cloned, strict=True))
        return tuple(o.clone() if c else o for o, c in zip(self.static_out, self.cloned, strict=True))

    def replay_captured(self) -> None:
        """Replay on the inputs the capture holds (none copied in, no outputs handed out): a timing's call. Held as a
        bound method it keeps those inputs alive; a replay after they were freed, and their memory given back by the
        next capture (`torch.cuda.graph` empties the allocator's cache), reads unmapped memory."""
        self.graph.replay()

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
    """The keep-or-drop rule for anything with `run(inputs)` and `replay(inputs)`; sets `runner.note`. Each way is
    timed as a caller runs it: CALLS calls back to back, then one wait for the GPU (the host enqueues a call while
    the GPU runs the one before, so a call costs the larger of the two, and a replay its input copies and output
    clones). `reset` puts back what a call writes into its inputs; it runs before every call."""

    def seconds(fn) -> tuple[float, float]:  # (enqueue, wall time) per call
        reset()
        torch.cuda.synchronize()
        enqueue, t0 = 0.0, time.perf_counter()
        for _ in range(CALLS):
            reset()
            t1 = time.perf_counter()
            fn()
            enqueue += time.perf_counter() - t1
        torch.cuda.synchronize()
        return enqueue / CALLS, (time.perf_counter() - t0) / CALLS

    direct_fn, replay_fn = (lambda: runner.run(inputs)), (lambda: runner.replay(inputs))
    for fn in (direct_fn, replay_fn):
        reset()
        fn()
    rounds = [(seconds(direct_fn), seconds(replay_fn)) for _ in range(ROUNDS)]
    enqueue, direct = min((r[0] for r in rounds), key=lambda t: t[1])  # the fastest direct round
    replay = min(r[1][1] for r in rounds)
    runner.note = (f"CUDA graph replay {replay * 1e6:.0f} µs vs direct launches {direct * 1e6:.0f} µs per call "
                   f"back to back ({enqueue * 1e6:.0f} µs of it enqueueing)")  # fmt: skip
    return replay < direct


ROUNDS, CALLS = 5, 4  # the keep-or-drop timing: rounds of back-to-back calls, alternating ways, the best round of each
