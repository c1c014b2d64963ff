"""Search policies: exhaustive grid, random sampling, and Bayesian optimisation (optuna TPE).

Every policy has the signature `policy(space, objective, budget, patience, seed, progress) -> TuneResult`.
`objective(config)` returns seconds and may raise: a raising config is recorded as a failed trial and can never
win. Only valid configs (see `SearchSpace.violations`) are ever passed to the objective, each at most once.
`budget` caps the number of objective evaluations; `patience` stops the search once that many evaluations in a
row have not improved the best time (bayes: its TPE phase, before the climb from the best). `prepare(configs)`,
when given, is told the configs about to be evaluated, up to `BATCH` at a time, before the first of them is (the
compiler compiles their kernels in parallel there, so the objective's first call of each finds its kernel built).
"""

from __future__ import annotations

import itertools
import logging
import math
import random as _random
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .space import Config, SearchSpace

log = logging.getLogger("dlblas_compiler.tuning")

Objective = Callable[[Config], float]
Prepare = Callable[[list[Config]], None]
BATCH = 8  # configs proposed (and prepared) together


class Progress(Protocol):
    """Receives the search's state after each objective evaluation."""

    def update(self, done: int, best: float | None) -> None: ...


class SearchStop(Exception):
    """An objective error that ends the search instead of failing one candidate (a fault that leaves the device
    unable to run anything more)."""


@dataclass(frozen=True)
class Trial:
    """One evaluated config: its time in seconds, or the error that made it fail."""

    config: Config
    time: float | None
    error: str | None = None


@dataclass
class TuneResult:
    """The outcome of a search. `best_config`/`best_time` are None when every evaluated config failed."""

    best_config: Config | None
    best_time: float | None
    trials: list[Trial] = field(default_factory=list)
    evaluations: int = 0

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.error is not None]


class _Search:
    """Book-keeping shared by the policies: memo of evaluated configs, budget, patience, best, progress."""

    def __init__(
        self,
        space: SearchSpace,
        objective: Objective,
        budget: int | None,
        patience: int | None,
        progress: Progress | None,
        prepare: Prepare | None = None,
    ) -> None:
        self.space, self.objective, self.progress, self.prepare = space, objective, progress, prepare
        self.limit = space.size() if budget is None else space.count(budget)
        self.patience = patience
        self.memo: dict[tuple[Any, ...], Trial] = {}
        self.trials: list[Trial] = []
        self.best: Trial | None = None
        self.stale = 0

    @property
    def done(self) -> bool:
        return len(self.trials) >= self.limit or (self.patience is not None and self.stale >= self.patience)

    @property
    def left(self) -> int:
        return self.limit - len(self.trials)

    def prefetch(self, configs: list[Config]) -> None:
        """Tell `prepare` the configs (not evaluated yet) that come next."""
        fresh = [dict(c) for c in configs if self.space.key(c) not in self.memo]
        if self.prepare is not None and fresh:
            try:
                self.prepare(fresh)
            except Exception:  # noqa: BLE001 - preparing is an optimisation: the evaluation reports any failure
                pass

    def evaluate(self, config: Config) -> Trial:
        """Time a valid config once; a config seen before is answered from the memo."""
        key = self.space.key(config)
        if key in self.memo:
            return self.memo[key]
        try:
            seconds = float(self.objective(dict(config)))
            error = None if math.isfinite(seconds) else f"non-finite time {seconds}"
            trial = Trial(dict(config), seconds if error is None else None, error)
        except SearchStop:
            raise
        except Exception as e:  # a failing candidate is a result, not a crash
            trial = Trial(dict(config), None, f"{type(e).__name__}: {e}")
            log.debug("candidate %s failed", dict(config), exc_info=True)  # (where: the result keeps the message)
        self.memo[key] = trial
        self.trials.append(trial)
        if trial.time is not None and (self.best is None or trial.time < self.best.time):
            self.best, self.stale = trial, 0
        else:
            self.stale += 1
        if self.progress is not None:
            self.progress.update(len(self.trials), self.best.time if self.best else None)
        return trial

    def result(self) -> TuneResult:
        best = self.best
        return TuneResult(
            best.config if best else None, best.time if best else None, list(self.trials), len(self.trials)
        )


def grid(
    space: SearchSpace,
    objective: Objective,
    budget: int | None = None,
    patience: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    prepare: Prepare | None = None,
) -> TuneResult:
    """Every valid config in grid order (the first `budget` of them when capped)."""
    search = _Search(space, objective, budget, patience, progress, prepare)
    _in_order(search, space.configs())
    return search.result()


def _in_order(search: _Search, configs) -> None:
    configs = iter(configs)
    while not search.done:
        batch = list(itertools.islice(configs, min(BATCH, search.left)))
        if not batch:
            return
        search.prefetch(batch)
        for config in batch:
            if search.done:
                return
            search.evaluate(config)


def random(
    space: SearchSpace,
    objective: Objective,
    budget: int | None = None,
    patience: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    prepare: Prepare | None = None,
) -> TuneResult:
    """Valid configs in a seeded random order, without replacement."""
    search = _Search(space, objective, budget, patience, progress, prepare)
    configs = list(space.configs())
    _random.Random(seed).shuffle(configs)
    _in_order(search, configs)
    return search.result()


@contextmanager
def _quiet_optuna():
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield optuna
    finally:
        optuna.logging.set_verbosity(level)


def _distribution(optuna, choices: tuple[Any, ...]):
    """The distribution of a parameter's choice index: ordinal when the choices are ascending numbers (so TPE
    sees that BLOCK 32 is next to 64), categorical otherwise."""
    numeric = all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)
    if numeric and list(choices) == sorted(choices):
        return optuna.distributions.IntDistribution(0, len(choices) - 1)
    return optuna.distributions.CategoricalDistribution(list(range(len(choices))))


def bayes(
    space: SearchSpace,
    objective: Objective,
    budget: int | None = None,
    patience: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    prepare: Prepare | None = None,
    max_misses: int = 16,
    refine: float = 0.25,
) -> TuneResult:
    """Bayesian optimisation with optuna's (constrained, multivariate) TPE sampler through ask/tell, starting
    from the space's default and seeds (`SearchSpace.starts`), proposing up to `BATCH` configs at a time (the
    "constant liar" keeps a batch's proposals apart) so that their kernels can be prepared together; then, when
    the budget is smaller than the space, its last `refine` share (at least 2 evaluations once the budget reaches
    8) climbs from the best config found (`_refine`). `patience` ends the TPE phase, not the climb.

    Proposals that violate a constraint are told to the study as infeasible without calling the objective,
    and so are configs whose evaluation failed; proposals already evaluated are answered from the memo and do
    not count against the budget. After `max_misses` proposals in a row brought nothing new, a random unseen
    valid config is enqueued so the search always makes progress.
    """
    search = _Search(space, objective, budget, patience, progress, prepare)
    if search.done:
        return search.result()
    full = search.limit  # (fewer than the budget: the space is smaller, and TPE gets to see all of it)
    reserve = max(2, int(refine * full)) if refine and budget is not None and full == budget >= 8 else 0
    search.limit = full - reserve  # the TPE phase; its patience ends it, not the climb after it
    _tpe(search, space, seed, max_misses)
    search.limit, search.stale, search.patience = min(full, len(search.trials) + reserve), 0, None
    if search.best is not None:
        _refine(search, space)
    return search.result()


def _neighbours(space: SearchSpace, config: Config) -> list[Config]:
    """The valid configs one step from `config`: each parameter in declaration order moved to its adjacent
    choices (the next smaller first), the others unchanged."""
    out = []
    for name, choices in space.params.items():
        i = choices.index(config[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(choices):
                c = {**config, name: choices[j]}
                if space.is_valid(c):
                    out.append(c)
    return out


def _refine(search: _Search, space: SearchSpace) -> None:
    """Hill-climbing from the best config: its unseen neighbours in turn, moving to the first that is faster,
    until the budget is spent or none is left. TPE models the whole space from a few samples; a variant that
    is a small part of it (the GEMM's cuBLAS-product family) can be reached by a start and left unpolished, its
    better tile one step away (bench/NOTES.md 61)."""
    while not search.done:
        best = search.best
        fresh = [c for c in _neighbours(space, best.config) if space.key(c) not in search.memo]
        if not fresh:
            return
        for i, c in enumerate(fresh):
            if search.done or search.best is not best:
                break
            if i % BATCH == 0:
                search.prefetch(fresh[i : i + min(BATCH, search.left)])
            search.evaluate(c)


def _tpe(search: _Search, space: SearchSpace, seed: int, max_misses: int) -> None:
    if search.done:
        return
    varying = {n: c for n, c in space.params.items() if len(c) > 1}
    fixed = {n: c[0] for n, c in space.params.items() if len(c) == 1}
    rng = _random.Random(seed)
    with _quiet_optuna() as optuna:
        dists = {n: _distribution(optuna, c) for n, c in varying.items()}
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=max(4, min(10, search.limit // 5)), multivariate=True, constant_liar=True
        )
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for start in space.starts():
            study.enqueue_trial({n: space.params[n].index(v) for n, v in start.items() if n in varying})
        misses = 0
        while not search.done:
            batch: list[tuple[Any, Config]] = []  # (optuna trial, valid config) to evaluate
            keys: set = set()
            while len(keys) < min(BATCH, search.left) and misses < max_misses:
                trial = study.ask(dists)
                config = {**fixed, **{n: varying[n][i] for n, i in trial.params.items()}}
                config = {n: config[n] for n in space.params}
                violated = space.violations(config)
                if violated:
                    for name in violated:
                        trial.set_constraint(name, 1.0)
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    misses += 1
                    continue
                key = space.key(config)
                misses = misses + 1 if key in search.memo or key in keys else 0
                keys.add(key)
                batch.append((trial, config))
            if misses >= max_misses and not keys - set(search.memo):
                unseen = space.sample(rng, search.memo)  # (drawn from the grid: listing a GEMM space takes ~0.5 s)
                if unseen is None:
                    break
                study.enqueue_trial({n: space.params[n].index(unseen[n]) for n in varying})
                misses = 0
            search.prefetch([c for _, c in batch])
            for trial, config in batch:
                if search.done:
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    continue
                result = search.evaluate(config)
                if result.time is None:
                    trial.set_constraint("failed", 1.0)
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(trial, result.time)


Policy = Callable[..., TuneResult]
POLICIES: dict[str, Policy] = {"grid": grid, "random": random, "bayes": bayes}
