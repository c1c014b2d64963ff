"""Near-ties decided in the program's own CUDA graph, after its first call is tuned.

A region's search times each candidate alone: L2 cleared, no neighbours, at the clock a lone kernel holds. The
program runs it between other kernels, at the clock the whole program holds at the card's power limit. Among configs
within a few per cent of each other the order measured alone is noise against that: two confirmation rounds of the
same finalists chose differently in five of nine regions, even 2.3% apart, and a cuBLAS-product config that beat our
K loop alone by 0.7% made its layer 0.9% slower (bench/NOTES.md 156, 158; programmatic dependent launch is not why:
item 159).

So each group of regions sharing a search (the same kernel in every layer: `selection.Group`) whose choice kept
alternatives (`KernelChoice.alternatives`: what measured within `selection.NEAR` of it alone) is decided here: the
program is captured as a CUDA graph with the current choice and with each alternative (every region of the group
alike), the two replays are timed in turn (`tuning.paired`), and the alternative is kept where the median of their
per-turn ratios is below 1 - MARGIN. Groups go in order of their estimated share of the call. The winner is written
to the tuning cache in place of the choice made alone (the search's entry, and the kernel-or-reference entry), so a
later process starts from it and does not decide again. Only where CUDA graphs are on (a program run by direct
launches is timed by its host as much as by its kernels). What the program writes into its inputs (a KV cache, a
counter) is put back before each timed replay and at the end; at most two captures are alive at once. Measured on an
H200 (item 159): 1-3 s a layer's first call, ~0.4% of a layer where it changes a choice, and most choices made alone
already the program's best within 0.2%. `DLBLAS_IN_CONTEXT=0` turns it off (to measure what it buys).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import is_device_fault
from ..tuning import CacheEntry, default_cache, paired
from .graphs import CudaGraph
from .selection import Group, _estimate, _select_key
from .steps import first_line

log = logging.getLogger("dlblas_compiler.tuning")
ENABLED = os.environ.get("DLBLAS_IN_CONTEXT", "1") != "0"
# an alternative is kept where the median of its per-turn time ratios against the current choice is below 1 - MARGIN
MARGIN = 0.002
# each comparison takes about BUDGET_S of GPU time (both graphs), in TURNS turns at least and at most
BUDGET_S, TURNS = 0.3, (10, 60)

Alternative = tuple[str, dict | None, float]  # (impl, config, seconds alone)
Runner = Callable[[], Callable[[], Any]]  # captures the program as it stands; returns one call of it (a replay)


def contested(groups: Sequence[Group]) -> list[Group]:
    """The groups whose choice kept alternatives, every region of the group running what the first does (a region
    that fell back alone is left as it is), the largest estimated share of the call first."""
    def agreed(g: Group) -> bool:
        c = g.leader.choice
        return c.impl in ("kernel", "reference") and all((m.choice.impl, m.choice.config) == (c.impl, c.config)
                                                         for m in g.members)  # fmt: skip

    out = [g for g in groups if g.leader.choice.alternatives and agreed(g)]
    return sorted(out, key=lambda g: -_estimate(g.leader) * len(g.members))


def decide(program: Any, inputs: list, groups: Sequence[Group], runner: Runner | None = None,
           timer: Callable[..., list[list[float]]] | None = None) -> int:  # fmt: skip
    """Decide each contested group's choice in the program (see the module docstring); the number of groups whose
    choice changed. `runner` captures the program and returns a replay (default: a CUDA graph of `program.run` on
    `inputs`); `timer(calls, turns, before)` times calls in turn (`tuning.paired`). What the program writes into its
    inputs (a KV cache, a counter) is put back before each timed call and at the end."""
    todo = contested(groups)
    for g in groups:  # (decided here or not at all)
        if all(g is not t for t in todo):
            for m in g.members:
                m.choice.alternatives = []
    if not todo:
        return 0
    timer, reset = timer or paired, _reset_of(program, inputs)
    try:
        return _decide(todo, runner or _graph_runner(program, inputs), timer, reset)
    finally:
        if reset is not None:
            reset()
        for g in todo:
            for m in g.members:
                m.choice.alternatives = []


def _decide(todo: list[Group], runner: Runner, timer: Callable[..., list[list[float]]],
            before: Callable[[], None] | None) -> int:  # fmt: skip
    t0 = time.perf_counter()
    changed = 0
    current = runner()
    turns = _turns(current, timer, before)
    for g in todo:
        c = g.leader.choice
        start = (c.impl, dict(c.config or {}))
        alone = {_key(c.config): c.time}  # (each kernel config's seconds alone)
        reference = c.reference_time
        for alt in list(c.alternatives):
            was: Alternative = (c.impl, dict(c.config or {}), 0.0)
            reasons = [m.choice.reason for m in g.members]  # (a candidate's failed launch rewrites them)
            _apply(g, alt)
            candidate = None
            try:
                candidate = runner()
                ratio = _ratio(timer([current, candidate], turns, before))
            except Exception as e:  # noqa: BLE001 - the alternative ran in its search; the choice stands
                if is_device_fault(e):
                    raise
                log.warning("region %s: timing %s %s in the program failed (%s: %s); keeping %s %s", c.region,
                            alt[0], alt[1] or "", type(e).__name__, first_line(e), was[0], was[1])  # fmt: skip
                ratio = None
            kept = ratio is not None and ratio < 1 - MARGIN and all(m.choice.impl == alt[0] for m in g.members)
            if ratio is not None:
                log.info("region %s (%d regions): %s %s in the program x%.4f against %s %s: %s", c.region,
                         len(g.members), alt[0], alt[1] or "", ratio, was[0], was[1] if was[0] == "kernel" else "",
                         "kept" if kept else "not kept")  # fmt: skip
            if kept:
                current = candidate
                if alt[0] == "kernel":
                    alone[_key(alt[1])] = alt[2]
                else:
                    reference = alt[2]
            else:
                candidate = None  # (its capture's memory goes before the next one is made)
                _apply(g, was)
                for m, why in zip(g.members, reasons, strict=True):
                    m.choice.reason = why
        if (c.impl, dict(c.config or {})) != start:
            _persist(g, start, alone.get(_key(c.config)), reference)
            changed += 1
    log.info("decided %d contested region kernels in the program's CUDA graph in %.1f s (%d turns a comparison); "
             "%d changed", len(todo), time.perf_counter() - t0, turns, changed)  # fmt: skip
    return changed


def _key(config: dict | None) -> str:
    return str(sorted((config or {}).items()))


def _apply(g: Group, alt: Alternative) -> None:
    """Every region of the group runs `alt`: its impl, and its config where it names one (a reference alternative
    names none: the kernel's config stays, for the report and for putting the kernel back)."""
    impl, config, _ = alt
    for m in g.members:
        m.choice.impl = impl
        if config is not None:
            m.choice.config = dict(config)


def _persist(g: Group, start: tuple[str, dict], kernel_s: float | None, reference_s: float | None) -> None:
    """Write the group's choice, changed from `start` (impl, config) in the program, where the tuning cache keeps
    it: the search's entry (its config) and the kernel-or-reference entry; each region's report says why."""
    c = g.leader.choice
    cache = default_cache()
    config = dict(c.config or {})
    if config != start[1]:
        hit = cache.get(g.key)
        cache.put(g.key, CacheEntry(config, kernel_s, hit.default_time if hit else None, hit.trials if hit else 0))
    chosen = kernel_s if c.impl == "kernel" else reference_s
    cache.put(_select_key(g.leader, g.dtypes, g.device, config), CacheEntry({"impl": c.impl}, chosen, kernel_s, 2))
    what = "the reference" if start[0] == "reference" else f"the kernel with {start[1]}"
    why = f"decided in the program's CUDA graph over {what}, measured fastest alone"
    for m in g.members:
        m.choice.reason, m.choice.time = why, kernel_s
        m.choice.reference_time = reference_s if c.impl == "reference" else None


def _ratio(times: list[list[float]]) -> float:
    """The median per-turn ratio of the second call's time to the first's."""
    return statistics.median(b / a for a, b in zip(times[0], times[1], strict=True))


def _turns(call: Callable[[], Any], timer: Callable[..., list[list[float]]], before: Callable | None) -> int:
    """Turns a comparison takes: about BUDGET_S of GPU time for two calls, within TURNS."""
    seconds = statistics.median(timer([call], 3, before)[0])
    return int(min(TURNS[1], max(TURNS[0], BUDGET_S / max(2 * seconds, 1e-9))))


def _reset_of(program: Any, inputs: list) -> Callable[[], None] | None:
    """What puts back the inputs the program writes in place (a KV cache, a counter) as they are now; None when it
    writes none."""
    saved = [(inputs[i], inputs[i].clone()) for i in program.static_inputs if isinstance(inputs[i], torch.Tensor)]
    if not saved:
        return None

    def reset() -> None:
        for t, v in saved:
            t.copy_(v)

    return reset


def _graph_runner(program: Any, inputs: list) -> Runner:
    """Captures of `program.run` on `inputs` as CUDA graphs, as the program's own replays run it."""

    def runner() -> Callable[[], Any]:
        graph = CudaGraph(program.run, program.static_inputs, checked=False, quiet=True)
        graph.capture(inputs)
        return graph.replay_captured  # (holding the capture's own inputs: see `CudaGraph.replay_captured`)

    return runner
