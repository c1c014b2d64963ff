"""Replay the tuner's search policies over saved tables of timed configs, on a CPU.

    python bench/replay_tuning.py FILE.json [FILE.json ...] [--seeds 5]

Each file is a `bench/tuning_study.py` result (a whole exhaustive run, or one `--part I/N` of one, or a narrowed
run's table). Tables of the same region and M are merged, so an exhaustive search split over several device calls
becomes one table. The search space is rebuilt from the file (its parameters and choices, default and starts):
a config is valid where the table timed it, and its time is the table's (a config that failed there fails here).
For each table, per policy: the best time found over the table's best (mean and worst over `--seeds` searches):
the tuner's quick mode (Bayesian with the quick budget and patience, then the climb from the best) from the
default and every start, from the default and the device-independent starts only (as on a card without the
sweeps' seeds), from the default alone, and the same without the climb. Issue 19's goal: quick tuning on a
shape no sweep has seen within 5% of exhaustive.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlblas_compiler.tuning import SearchSpace  # noqa: E402
from dlblas_compiler.tuning.policies import bayes  # noqa: E402
from dlblas_compiler.tuning.tuner import TUNE_MODES  # noqa: E402


def merge(paths: list[str]) -> dict[str, dict]:
    """region key -> {"record": the first file's space record, "times": config key -> µs or None}."""
    merged: dict[str, dict] = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for key, r in doc.items():
            if key.startswith("_") or "table" not in r:
                continue
            entry = merged.setdefault(key, {"record": r, "times": {}})
            if entry["record"]["params"] != r["params"]:
                raise ValueError(f"{path}: {key} was timed over another space than the files before it")
            entry["times"].update((tuple(k), t) for k, t in r["table"])
    return merged


def replay_space(record: dict, times: dict, starts: str | None) -> SearchSpace:
    """The space of a saved table: the file's parameters, valid where timed; `starts` names the record's starts
    to offer after the default ("starts", "starts_no_sweeps"; None: the default alone)."""
    names = list(record["params"])
    seeds = record[starts] if starts else []
    return SearchSpace(record["params"], {"timed by the table": lambda c: tuple(c[n] for n in names) in times},
                       default=record["default"], seeds=seeds)  # fmt: skip


def replay(record: dict, times: dict, seeds: int) -> dict:
    names = list(record["params"])
    valid = SearchSpace(record["params"]).is_valid  # (rows of another space's parameters are not this table's)
    times = {k: t for k, t in times.items() if valid(dict(zip(names, k, strict=True)))}
    good = {k: t for k, t in times.items() if t is not None}
    best = min(good.values())
    quick = TUNE_MODES["quick"]

    def lookup(cfg):
        t = times[tuple(cfg[n] for n in record["params"])]
        if t is None:
            raise RuntimeError("failed when timed")
        return t

    out = {"configs": len(times), "failed": len(times) - len(good), "best_us": best, "policies": {}}
    for label, starts in (("quick", "starts"), ("quick, no sweep seeds", "starts_no_sweeps"),
                          ("quick, default alone", None)):  # fmt: skip
        space = replay_space(record, times, starts)
        budget = quick.budget(space.count(quick.sizes_that_matter()))
        for climb in (True, False):
            refine = 0.25 if climb else 0
            ratios = [bayes(space, lookup, budget, quick.patience, s, None, refine=refine).best_time / best
                      for s in range(seeds)]  # fmt: skip
            name = label + ("" if climb else ", no climb")
            out["policies"][name] = {"budget": budget, "mean": statistics.mean(ratios), "worst": max(ratios)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", default="", help="write the results here as JSON")
    a = p.parse_args(argv)
    results = {key: replay(e["record"], e["times"], a.seeds) for key, e in merge(a.files).items()}
    for key, r in results.items():
        print(f"{key}: {r['configs']} configs timed ({r['failed']} failed), best {r['best_us']:.1f} µs")
        for name, v in r["policies"].items():
            print(f"  {name:32s} budget {v['budget']:3d}: best/exhaustive mean {v['mean']:.3f} worst {v['worst']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
