"""`tune`: the cache lookup, search and bookkeeping the compiler runs for each kernel and shape bucket."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import DeviceFault, DLError, is_device_fault
from . import profiler
from .cache import CacheEntry, CacheKey, TuneCache, default_path
from .policies import POLICIES, Progress, SearchStop, TuneResult
from .profiler import make_objective
from .space import Config, SearchSpace

log = logging.getLogger("dlblas_compiler.tuning")


class TuningError(DLError):
    """No candidate config of a kernel built, ran and matched the reference."""


class CandidateFault(TuningError, DeviceFault, SearchStop):
    """A candidate config faulted the GPU (`DeviceFault`: nothing more can run in this process). The config is
    recorded in the tuning cache and no later search of the same kernel, shape bucket and device tries it again."""


def _side_key(key: CacheKey, what: str) -> CacheKey:
    return dataclasses.replace(key, kernel=f"{key.kernel}:{what}")


def _alive(entry: CacheEntry) -> bool:
    """Whether the process that left an in-flight marker may still be running (another host's: assume so)."""
    host, pid = entry.config.get("host"), entry.config.get("pid")
    if host != socket.gethostname() or not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _FaultLog:
    """The configs of one tuning key that faulted, kept in the tuning cache beside its result: under
    "<kernel>:faults" the list of them; under "<kernel>:trying" the candidate being timed now (with the host and
    process). A process that dies while timing a candidate (a fault that kills it, not one it can catch) leaves
    its marker behind, and the next search of the key counts that candidate as faulted."""

    def __init__(self, cache: TuneCache, key: CacheKey) -> None:
        self.cache, self.faults_key, self.trying_key = cache, _side_key(key, "faults"), _side_key(key, "trying")

    def known(self) -> list[Config]:
        """The configs that faulted before (a marker left by a process that is gone counts as one)."""
        entry = self.cache.get(self.faults_key)
        faults = list(entry.config.get("configs", [])) if entry is not None else []
        trying = self.cache.get(self.trying_key)
        if trying is not None and trying.config.get("config") is not None and not _alive(trying):
            faults.append(trying.config["config"])  # its process died while timing it
            self._write(faults)
            self.cache.delete(self.trying_key)
        return faults

    def _write(self, faults: list[Config]) -> None:
        unique = [dict(c) for i, c in enumerate(faults) if c not in faults[:i]]
        self.cache.put(self.faults_key, CacheEntry({"configs": unique}, 0.0, None, len(unique)))

    def guard(self, objective: Callable[[Config], float], name: str, shape: Mapping[str, Any]):
        """`objective` with each candidate marked in flight while it runs; a sticky error records the config and
        raises CandidateFault."""

        def guarded(config: Config) -> float:
            self.cache.put(self.trying_key, CacheEntry(
                {"config": dict(config), "host": socket.gethostname(), "pid": os.getpid()}, 0.0, None, 0))  # fmt: skip
            try:
                return objective(config)
            except Exception as e:
                if is_device_fault(e):
                    self._write([*self.known(), dict(config)])
                    raise CandidateFault(
                        f"{name} {dict(shape)}: candidate config {dict(config)} faulted ({type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0][:200]}); the GPU cannot run anything more in this process, "
                        f"so restart it: the config is recorded in the tuning cache ({self.cache.path}) and will "
                        "not be tried again") from e  # fmt: skip
                raise
            finally:
                self.cache.delete(self.trying_key)

        return guarded


@dataclass(frozen=True)
class TuneMode:
    """How hard to search: a policy, a budget of `fraction` of the valid space clamped to [floor, cap], how
    long each candidate is timed (`profiler.benchmark`'s warm-up and repetition milliseconds), and `race`:
    a candidate whose brief first timing is more than `race` times the best so far is not timed in full
    (`profiler.make_objective`; None: every candidate timed in full, as an exhaustive study wants), and `confirm`:
    how many of the search's fastest configs a confirmation round times again in turn before one is chosen
    (`profiler.confirm`; long calls on a GPU only; 0: none)."""

    policy: str
    fraction: float
    cap: int | None
    floor: int
    patience: int | None
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    race: float | None = None
    confirm: int = 4

    def budget(self, size: int) -> int:
        n = math.ceil(self.fraction * size)
        if self.cap is not None:
            n = min(n, self.cap)
        return min(size, max(n, self.floor))

    def sizes_that_matter(self) -> int | None:
        """A space size from which the budget no longer grows (None: it always does): counting the valid
        configs up to it is enough."""
        if self.cap is None or self.fraction <= 0:
            return None
        return max(math.ceil(self.cap / self.fraction), self.floor, self.cap)


TUNE_MODES: dict[str, TuneMode | None] = {
    "none": None,  # the space's default config, no timing
    # (a long call warms for at least profiler.LONG_WARMUP_MS whatever the mode says: bench/NOTES.md 146)
    "quick": TuneMode("bayes", fraction=0.12, cap=24, floor=8, patience=8, warmup_ms=10.0, rep_ms=30.0,
                      race=1.2),
    "full": TuneMode("grid", fraction=1.0, cap=None, floor=0, patience=None),
}


@dataclass(frozen=True)
class TuneOutcome:
    """The chosen config and its time, the default config's time (seconds; None when not timed), the number
    of trials behind the choice, whether it came from the cache, the search itself when one ran, and the
    confirmation round's finalists when one ran: (config, search seconds, confirmed seconds) each, fastest
    confirmed first."""

    config: Config
    time: float | None
    default_time: float | None
    trials: int
    from_cache: bool
    result: TuneResult | None = None
    finalists: tuple[tuple[Config, float, float], ...] = ()


_caches: dict[Path, TuneCache] = {}


def default_cache() -> TuneCache:
    """The process-wide cache at the default path (see `cache.default_path`)."""
    path = default_path()
    if path not in _caches:
        _caches[path] = TuneCache(path)
    return _caches[path]


class _Bar:
    def __init__(self, bar: Any, task: Any) -> None:
        self.bar, self.task = bar, task

    def update(self, done: int, best: float | None) -> None:
        self.bar.update(self.task, completed=done, best="-" if best is None else _format_seconds(best))


def _format_seconds(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


@contextmanager
def progress_bar(name: str, total: int, enabled: bool) -> Iterator[Progress | None]:
    """A rich progress bar (trials done / budget, best so far) on a terminal; nothing otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn("tuning {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TimeElapsedColumn(),
    )
    with RichProgress(*columns, console=console) as bar:
        yield _Bar(bar, bar.add_task(name, total=total, best="-"))


@dataclass(frozen=True)
class TuneJob:
    """What to tune: kernel `name` (with the hash of its source) over `space`, for one shape, dtypes and device.

    `build(config)` returns a callable that runs the candidate (on `arg_sets[i]` when given, else on no arguments)
    and returns its outputs; `reference` (the outputs for the first argument set, or a zero-arg callable producing
    them; None skips the check) is what each candidate must match to be eligible. `token_dims` names the
    token-count dims of `shape`, which the cache key buckets to powers of two. `prepare(configs)` (optional) is
    called with the configs about to be tried, a batch at a time (to compile their kernels in parallel)."""

    name: str
    source_hash: str
    space: SearchSpace
    build: Callable[[Config], Callable[..., Any]]
    shape: Mapping[str, Any]
    dtypes: tuple
    device: str | torch.device
    reference: Any = None
    arg_sets: Sequence[tuple] | None = None
    token_dims: tuple[str, ...] = ()
    prepare: Callable[[list[Config]], None] | None = None

    def cache_key(self) -> CacheKey:
        return CacheKey.make(self.name, self.source_hash, self.shape, self.dtypes, self.device,
                             self.space.fingerprint(), self.token_dims)  # fmt: skip


@dataclass(frozen=True)
class _Plan:
    """What `tune` searches: the space (less the configs that faulted before), the policy, budget and patience."""

    space: SearchSpace
    search: Callable[..., TuneResult]
    budget: int | None
    patience: int | None
    settings: TuneMode
    cache: TuneCache
    key: CacheKey
    faults: _FaultLog


def _plan(job: TuneJob, mode: str, policy: str | None, budget: int | None, patience: int | None,
          cache: TuneCache | None, quiet: bool = False) -> TuneOutcome | _Plan:
    """What `tune` searches, or its outcome when nothing is searched (tuning off, a cache hit)."""
    name, space = job.name, job.space
    if mode not in TUNE_MODES:
        raise ValueError(f"unknown tune mode {mode!r}; expected one of {list(TUNE_MODES)}")
    settings = TUNE_MODES[mode]
    if settings is None:
        return TuneOutcome(space.default(), None, None, 0, False)
    policy = policy or settings.policy
    if policy not in POLICIES:
        raise ValueError(f"unknown tuning policy {policy!r}; expected one of {list(POLICIES)}")
    cache = default_cache() if cache is None else cache
    key = job.cache_key()
    hit = cache.get(key)
    if hit is not None and space.is_valid(hit.config):
        if not quiet:
            log.info("%s %s: %s, %s (from the cache)", name, dict(job.shape), hit.config,
                     "-" if hit.time is None else _format_seconds(hit.time))  # fmt: skip
        return TuneOutcome(hit.config, hit.time, hit.default_time, hit.trials, True)

    faults = _FaultLog(cache, key)
    known = faults.known()
    if known:
        if not quiet:
            log.warning("%s %s: %d config(s) faulted in an earlier search and are not tried: %s", name,
                        dict(job.shape), len(known), known)  # fmt: skip
        space = space.without(known)
    budget = settings.budget(space.count(settings.sizes_that_matter())) if budget is None else budget
    patience = settings.patience if patience is None else patience
    return _Plan(space, POLICIES[policy], budget, patience, settings, cache, key, faults)


def searches(job: TuneJob, mode: str = "quick", cache: TuneCache | None = None) -> bool:
    """Whether `tune(job, mode)` will search (tuning is on and the cache does not answer)."""
    return isinstance(_plan(job, mode, None, None, None, cache, quiet=True), _Plan)


def tune(
    job: TuneJob,
    mode: str = "quick",
    *,
    policy: str | None = None,
    budget: int | None = None,
    patience: int | None = None,
    cache: TuneCache | None = None,
    progress: bool = True,
    seed: int = 0,
    warmup_ms: float | None = None,
    rep_ms: float | None = None,
) -> TuneOutcome:
    """Pick the fastest valid config of `job` for its shape bucket, dtypes and device.

    `mode` ("none", "quick", "full", see `TUNE_MODES`) sets the policy, budget and patience; explicit
    `policy`/`budget`/`patience` override it. The `cache` (default: `default_cache()`) is consulted first: a hit
    runs nothing. Otherwise the search runs, the default config is timed too (for the gain report) and the
    result is stored. Raises `TuningError` when every candidate failed.
    """
    name = job.name
    plan = _plan(job, mode, policy, budget, patience, cache)
    if isinstance(plan, TuneOutcome):
        return plan
    space, settings, cache, budget = plan.space, plan.settings, plan.cache, plan.budget

    warmup_ms = settings.warmup_ms if warmup_ms is None else warmup_ms
    rep_ms = settings.rep_ms if rep_ms is None else rep_ms
    refs = job.reference() if callable(job.reference) else job.reference
    objective = make_objective(job.build, refs, job.arg_sets, device=job.device, warmup_ms=warmup_ms, rep_ms=rep_ms,
                               race=settings.race)  # fmt: skip
    objective = plan.faults.guard(objective, name, job.shape)
    with progress_bar(name, space.count(budget), progress) as bar:
        result = plan.search(space, objective, budget, plan.patience, seed, bar, prepare=job.prepare)
    if result.best_config is None or result.best_time is None:
        errors = sorted({t.error for t in result.failures if t.error})
        raise TuningError(f"{name}: all {result.evaluations} candidate configs failed: " + "; ".join(errors[:3]))

    default = space.default()
    best, best_time, finals = _confirmed(job, result, settings.confirm, default)

    timed = next((t for t in result.trials if t.config == default), None)
    held = next((t for c, _, t in finals if c == default), None)  # (timed as the chosen config was)
    if held is not None:
        default_time = held
    elif timed is not None:
        default_time = timed.time
    else:
        try:
            default_time = objective(default)
        except CandidateFault:
            raise
        except Exception:  # the default failing is reported as "no default time", not an error
            default_time = None
    cache.put(plan.key, CacheEntry(best, best_time, default_time, result.evaluations))
    log.info("%s %s: %s, %s (searched %d configs%s; default %s)", name, dict(job.shape), best,
             _format_seconds(best_time), result.evaluations, f", {len(finals)} confirmed" if finals else "",
             "-" if default_time is None else _format_seconds(default_time))  # fmt: skip
    return TuneOutcome(best, best_time, default_time, result.evaluations, False, result, finals)


def _confirmed(job: TuneJob, result: TuneResult, count: int, default: Config) -> tuple[Config, float, tuple]:
    """The search's best config and time, or, where a confirmation round applies (`profiler.confirms`) and finds
    more than one finalist, the config fastest in it, its confirmed time, and the (config, search seconds, confirmed
    seconds) of each config the round timed, fastest confirmed first. The round also times the default config
    when the search timed it (it may win too), so that the report's "default" is timed as the choice is."""
    if count < 2 or not profiler.confirms(job.device, result.best_time):
        return result.best_config, result.best_time, ()
    timed = [(t.config, t.time) for t in result.trials if t.error is None]
    ranked = profiler.finalists(timed, count)
    if len(ranked) < 2:
        return result.best_config, result.best_time, ()
    if all(c != default for c, _ in ranked):
        ranked += [(c, s) for c, s in timed if c == default]
    try:
        times = profiler.confirm(job.build, [c for c, _ in ranked], job.arg_sets, job.device)
    except Exception as e:  # (every config ran in the search; a failure now must not cost the region its kernel)
        if is_device_fault(e):
            raise
        log.warning("%s %s: the confirmation round failed (%s: %s); keeping the search's choice", job.name,
                    dict(job.shape), type(e).__name__, (str(e).strip().splitlines() or [""])[0][:200])  # fmt: skip
        return result.best_config, result.best_time, ()
    finals = tuple(sorted(((c, s, t) for (c, s), t in zip(ranked, times, strict=True)), key=lambda f: f[2]))
    for c, s, t in finals:
        log.debug("%s %s: confirmed %s (searched %s) %s", job.name, dict(job.shape), _format_seconds(t),
                  _format_seconds(s), c)  # fmt: skip
    return finals[0][0], finals[0][2], finals
