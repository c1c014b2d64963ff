"""Does a quick search time candidates on a card that cooled while it waited for compiles? (bench/NOTES.md 147's
reading; measured in NOTES 148: in part. The results of that session's runs also hold tunings with the warm-up
in blocks NOTES 148 describes, which the tree no longer has.)

    python bench/search_heat.py --out OUT [--layers llama3_8b,qwen25_7b] [--tokens 2048] [--held 6]

Each layer (bench/blocks.HF_LAYERS) is compiled and quick-tuned from an empty cache while nvidia-smi samples the SM
clock, power and throttle reasons every 20 ms (bench/smi.Smi). Every candidate the searches time is recorded
with its wall-clock window, the GPU-idle gap before it (since the previous candidate or compile batch ended) and
whether a batch of compiles ran in that gap. Afterwards the `--held` fastest candidates of each long search (50 µs or
more) are timed again as the confirmation round times them (`profiler.confirm`: in turn, three rounds, on a card held
at its power limit). Writes OUT/search_heat.json: per candidate its search time, held time, their ratio, the clock
and power in its window, the gap before it and whether compiles ran there; and prints, per layer, the median
search / held ratio of the candidates timed right after a compile batch and of the others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from smi import Smi  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.runtime import selection  # noqa: E402
from dlblas_compiler.tuning import profiler, tuner  # noqa: E402


class Recorder:
    """Wraps the tuner's searches (`selection.tune`), objectives (`tuner.make_objective`) and compile batches
    (`selection.build`) to record when each candidate was timed and what the GPU did before it."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict] = {}  # job key -> build, arg_sets, device
        self.rows: list[dict] = []
        self.batches: list[tuple[float, float, int]] = []
        self.last_end = time.time()
        self.compiled_since = False
        self._job = threading.local()
        self._saved = (selection.tune, tuner.make_objective, selection.build)

    def __enter__(self) -> Recorder:
        tune, make_objective, build = self._saved

        def recorded_tune(job, *a, **kw):
            self._job.key = f"{job.name} {dict(job.shape)}"
            self.jobs[self._job.key] = {"build": job.build, "arg_sets": job.arg_sets, "device": job.device}
            return tune(job, *a, **kw)

        def recorded_objective(*a, **kw):
            objective = make_objective(*a, **kw)

            def timed(config):
                t0 = time.time()
                gap, compiled = t0 - self.last_end, self.compiled_since
                try:
                    seconds = objective(config)
                finally:
                    self.last_end, self.compiled_since = time.time(), False
                self.rows.append({"job": getattr(self._job, "key", "?"), "config": dict(config), "t0": t0,
                                  "t1": self.last_end, "search_us": seconds * 1e6, "gap_s": gap,
                                  "after_compile": compiled})  # fmt: skip
                return seconds

            return timed

        def recorded_build(jobs):
            t0 = time.time()
            try:
                return build(jobs)
            finally:
                self.batches.append((t0, time.time(), len(jobs)))
                self.last_end, self.compiled_since = time.time(), True

        selection.tune, tuner.make_objective, selection.build = recorded_tune, recorded_objective, recorded_build
        return self

    def __exit__(self, *exc) -> None:
        selection.tune, tuner.make_objective, selection.build = self._saved


def tune_layer(a, smi: Smi, name: str) -> dict:
    """One layer compiled and quick-tuned from an empty cache: every candidate its searches timed, the long
    searches' fastest held."""
    mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](a.tokens, torch.bfloat16, "cuda")
    os.environ["DLBLAS_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"search_heat-{name}-")
    t_tune = time.time()
    with Recorder() as rec, torch.no_grad():
        cm = dc.compile(mod, backend="triton", tune="quick")
        cm(*args, **kwargs)
    t_tune = time.time() - t_tune
    print(f"{name}: first call (tuning) {t_tune:.1f} s", flush=True)
    for r in rec.rows:
        r.update(smi.window(r["t0"], r["t1"]))
    for key, job in rec.jobs.items():  # the fastest candidates of each long search, held
        rows = sorted((r for r in rec.rows if r["job"] == key and r["search_us"] < float("inf")),
                      key=lambda r: r["search_us"])[: a.held]  # fmt: skip
        if not rows or rows[0]["search_us"] < profiler.CONFIRM_MIN_S * 1e6:
            continue
        held = profiler.confirm(job["build"], [r["config"] for r in rows], job["arg_sets"], job["device"])
        for r, t in zip(rows, held, strict=True):
            r["held_us"] = t * 1e6
            r["search_over_held"] = r["search_us"] / r["held_us"]
    lay = {"layer": name, "first_call_s": t_tune, "batches": rec.batches, "rows": rec.rows}
    for after in (True, False):
        ratios = [r["search_over_held"] for r in rec.rows if "held_us" in r and r["after_compile"] == after]
        if ratios:
            lay[f"search_over_held_{'after' if after else 'not_after'}_compile"] = {
                "n": len(ratios), "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            print(f"{name}: candidates {'right after' if after else 'not right after'} a compile "
                  f"batch: search / held median {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
                  f"{max(ratios):.3f}, n={len(ratios)})", flush=True)  # fmt: skip
    for r in (r for r in rec.rows if "held_us" in r):
        print(f"  {r['job'][:60]:60s} search {r['search_us']:7.1f} held {r['held_us']:7.1f} "
              f"gap {r['gap_s']:5.2f} s{' (compiles)' if r['after_compile'] else ''} "
              f"{r.get('sm_mhz', 0):.0f} MHz {r.get('watts', 0):.0f} W", flush=True)  # fmt: skip
    del cm, mod, rec
    torch.cuda.empty_cache()
    return lay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--held", type=int, default=6)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    smi = Smi(os.path.join(tempfile.mkdtemp(prefix="search_heat-"), "smi.csv"), period_ms=20)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tokens": a.tokens, "layers": []}  # fmt: skip
    try:
        for name in a.layers.split(","):
            res["layers"].append(tune_layer(a, smi, name))
            with open(os.path.join(a.out, "search_heat.json"), "w") as fh:
                json.dump(res, fh, indent=1, default=str)
    finally:
        smi.stop()


if __name__ == "__main__":
    main()
