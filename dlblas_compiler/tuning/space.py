"""Search spaces: named parameters with their choices, and named constraints that reject invalid configs."""

from __future__ import annotations

import hashlib
import itertools
import random
import types
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any

Config = dict[str, Any]
Constraint = Callable[[Config], bool]


def pow2(lo: int, hi: int) -> list[int]:
    """The powers of two p with lo <= p <= hi, ascending: pow2(16, 128) == [16, 32, 64, 128]."""
    if lo < 1 or hi < lo:
        raise ValueError(f"pow2({lo}, {hi}): need 1 <= lo <= hi")
    p = 1 << (lo - 1).bit_length()
    out = []
    while p <= hi:
        out.append(p)
        p <<= 1
    return out


def _code_key(rule: Any) -> Any:
    """What a constraint computes, stable across processes: its bytecode, constants (nested code objects, such
    as a generator expression's, taken apart the same way) and names; the qualified name of a non-function."""
    code = rule if isinstance(rule, types.CodeType) else getattr(rule, "__code__", None)
    if code is None:
        return getattr(rule, "__qualname__", type(rule).__qualname__)
    return (code.co_code, tuple(_code_key(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts),
            code.co_names)


class SearchSpace:
    """A grid of configs (the product of each parameter's choices) minus those a constraint rejects.

    Parameters keep their declaration order, and choices their listed order; `configs()` walks the grid in
    that order (last parameter fastest). Constraints are named so a rejected config can say why. `seeds` are
    known-good configs (from sweeps) that a guided search tries right after the default. Spaces are
    immutable: `narrow` returns a new one.
    """

    def __init__(
        self,
        params: Mapping[str, Sequence[Any]],
        constraints: Mapping[str, Constraint] | None = None,
        default: Config | None = None,
        seeds: Sequence[Config] = (),
    ) -> None:
        self.params: dict[str, tuple[Any, ...]] = {}
        for name, choices in params.items():
            choices = tuple(choices)
            if not choices:
                raise ValueError(f"parameter {name!r} has no choices")
            if len(set(choices)) != len(choices):
                raise ValueError(f"parameter {name!r} repeats a choice: {choices}")
            self.params[name] = choices
        self.constraints: dict[str, Constraint] = dict(constraints or {})
        self._default = dict(default) if default is not None else None
        if self._default is not None and self._default.keys() != self.params.keys():
            raise ValueError(f"default {self._default} must set exactly the parameters {list(self.params)}")
        self._seeds = [dict(c) for c in seeds]
        self._valid: list[tuple[Any, ...]] | None = None
        self._counts: dict[int, int] = {}  # count(limit) by limit (a search asks for the same ones several times)
        self._fingerprint: str | None = None

    @property
    def names(self) -> list[str]:
        return list(self.params)

    def key(self, config: Config) -> tuple[Any, ...]:
        """A hashable identity of a config (its values in parameter order)."""
        return tuple(config[name] for name in self.params)

    def violations(self, config: Config) -> list[str]:
        """Why `config` is not in this space: unknown/missing parameters, values not among the choices, and
        the names of the constraints it fails. Empty when the config is valid."""
        if config.keys() != self.params.keys():
            return [f"parameters {sorted(config)} != {sorted(self.params)}"]
        why = [f"{n}={config[n]!r} not in {list(c)}" for n, c in self.params.items() if config[n] not in c]
        if why:
            return why
        return [name for name, ok in self.constraints.items() if not ok(config)]

    def is_valid(self, config: Config) -> bool:
        return not self.violations(config)

    def __contains__(self, config: Config) -> bool:
        return self.is_valid(config)

    def _valid_keys(self) -> list[tuple[Any, ...]]:
        if self._valid is None:
            self._valid = list(self._walk())
        return self._valid

    def _walk(self) -> Iterator[tuple[Any, ...]]:
        names, checks = list(self.params), list(self.constraints.values())
        for values in itertools.product(*self.params.values()):
            if all(ok(dict(zip(names, values, strict=True))) for ok in checks):
                yield values

    def configs(self) -> Iterator[Config]:
        """Every valid config, in the deterministic grid order."""
        names = list(self.params)
        for values in self._valid_keys():
            yield dict(zip(names, values, strict=True))

    def size(self) -> int:
        """The number of valid configs."""
        return len(self._valid_keys())

    def count(self, limit: int | None = None) -> int:
        """The number of valid configs, or `limit` if there are at least that many: found without walking the
        whole grid where `limit` valid configs come first (a GEMM grid has ~10^5 points, ~2% of them valid;
        walking all of it for each of a model's tuning jobs took ~15 s of a 32-layer model's first call)."""
        if limit is None or self._valid is not None:
            return self.size() if limit is None else min(limit, self.size())
        if limit not in self._counts:
            self._counts[limit] = sum(1 for _ in itertools.islice(self._walk(), limit))
        return self._counts[limit]

    def default(self) -> Config:
        """The declared default if it is valid here; else the default with the fewest parameters changed (one,
        then two) that is valid; else the first valid config. Found without enumerating the space (a GEMM
        space has ~10^5 configs: listing them for each of a 32-layer model's regions took seconds)."""
        if self._default is not None:
            if self.is_valid(self._default):
                return dict(self._default)
            names = list(self.params)
            for changed in (1, 2):
                for which in itertools.combinations(names, changed):
                    for values in itertools.product(*(self.params[n] for n in which)):
                        config = {**self._default, **dict(zip(which, values, strict=True))}
                        if self.is_valid(config):
                            return config
        names, checks = list(self.params), list(self.constraints.values())
        for values in itertools.product(*self.params.values()):
            config = dict(zip(names, values, strict=True))
            if all(ok(config) for ok in checks):
                return config
        raise ValueError(f"search space has no valid config: {self}")

    def sample(self, rng: random.Random, exclude: Container = (), tries: int = 4096) -> Config | None:
        """A valid config drawn uniformly from the grid (its points tried at random until one is valid and not in
        `exclude`, a set of `key`s), without listing the space; after `tries` draws, one from the list of the
        valid configs not excluded (None when there is none)."""
        names = list(self.params)
        for _ in range(tries):
            values = tuple(rng.choice(c) for c in self.params.values())
            if values not in exclude and self.is_valid(dict(zip(names, values, strict=True))):
                return dict(zip(names, values, strict=True))
        left = [v for v in self._valid_keys() if v not in exclude]
        return dict(zip(names, rng.choice(left), strict=True)) if left else None

    def starts(self) -> list[Config]:
        """The default, then the seeds valid here, without repeats: where a guided search begins."""
        out = [self.default()]
        for c in self._seeds:
            if self.is_valid(c) and c not in out:  # is_valid also rejects other parameter names
                out.append(dict(c))
        return out

    def narrow(self, **fixed: Any) -> SearchSpace:
        """A new space with some parameters fixed (a single value) or restricted (a list/tuple/set of values,
        kept in this space's order). Constraints, the default and the seeds carry over."""
        params = dict(self.params)
        for name, value in fixed.items():
            if name not in params:
                raise ValueError(f"narrow: unknown parameter {name!r} (have {list(params)})")
            wanted = set(value) if isinstance(value, list | tuple | set | frozenset) else {value}
            unknown = wanted - set(params[name])
            if unknown:
                raise ValueError(f"narrow: {name}={sorted(unknown, key=repr)} not among {list(params[name])}")
            params[name] = tuple(c for c in params[name] if c in wanted)
        return SearchSpace(params, self.constraints, self._default, self._seeds)

    def without(self, configs: Sequence[Config]) -> SearchSpace:
        """This space less the given configs (the default moves to a valid neighbour if it is among them)."""
        banned = {self.key(c) for c in configs if set(c) == set(self.params)}
        rules = {**self.constraints, "not a config that faulted": lambda c: self.key(c) not in banned}
        return SearchSpace(self.params, rules, self._default, self._seeds)

    def fingerprint(self) -> str:
        """A short hash of the parameters, their choices, and the constraints' names and code (part of the cache
        key: a constraint rewritten under its old name is a new space, and configs tuned in the old one are not
        taken from the cache for it)."""
        if self._fingerprint is None:  # (asked at every tuning lookup; the space does not change)
            rules = sorted((name, _code_key(rule)) for name, rule in self.constraints.items())
            text = repr((sorted(self.params.items()), rules))
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._fingerprint

    def __repr__(self) -> str:
        params = ", ".join(f"{n}={list(c)}" for n, c in self.params.items())
        return f"SearchSpace({params}; constraints={list(self.constraints)})"
