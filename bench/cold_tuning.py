"""Where a cold quick tuning's time goes: Triton compiles on the calling thread against the tuner's compile pool.

    python bench/cold_tuning.py --out OUT [--block layer_llama3_8b] [--tokens 128,1]

A fresh Triton cache and tuning cache (temporary folders), one decoder layer compiled with tune="quick" and called
once per token count. Every Triton compile in this process is timed with the thread it ran on: the tuner builds
each batch of candidates before timing them (`compile_configs`: in the compile workers, whose binaries a pool of
threads then loads; with DLBLAS_COMPILE_WORKERS=0, compiled in those threads), so compiles on the calling thread
are ones that batch did not cover. Writes OUT/cold_tuning-BLOCK.json: per token count the call's wall time, the tuned layer's GPU time (its calls
replayed from a CUDA graph: what the choices are worth), the tuner's
trials, and compile counts and seconds by thread (calling thread: which kernels, how long); and where the calling
thread's time went (`timeline`): choosing configs (the search's own work), submitting a batch's compiles, a
candidate's first run (waiting for its compile, the check against the reference), timing candidates, and timing the
kernel against the region's reference; with how many compiles ran at once while any ran; and what the compile
workers did (`compile_workers`: batches, compiles, their seconds summed, each batch's slowest compile summed, the
batches' wall time).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", default="layer_llama3_8b")
    ap.add_argument("--tokens", default="128,1")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
    os.environ["DLBLAS_CACHE_DIR"] = os.path.join(tmp, "dlblas")
    import torch
    import triton.compiler

    records: list[tuple[str, str, float, float]] = []  # (thread, kernel, start, end)
    original = triton.compiler.compile

    def timed_compile(src, *a, **k):  # (JITFunction takes `compile` from triton.compiler when it first runs)
        t0 = time.perf_counter()
        try:
            return original(src, *a, **k)
        finally:
            records.append((threading.current_thread().name, getattr(src, "name", type(src).__name__),
                            t0, time.perf_counter()))

    triton.compiler.compile = timed_compile
    spans: list[tuple[str, float, float]] = []  # the calling thread's (what, start, end)

    def timed(what, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spans.append((what, t0, time.perf_counter()))

        return wrapper

    from dlblas_compiler.runtime import selection
    from dlblas_compiler.tuning import profiler

    profiler.benchmark = timed("timing candidates", profiler.benchmark)
    selection.benchmark = timed("kernel against reference", selection.benchmark)
    selection.compile_configs = timed("submitting compiles", selection.compile_configs)
    selection._search = timed("search", selection._search)  # (in threads when regions tune together: spans overlap)
    selection.Together.tune = timed("tuning together", selection.Together.tune)
    original_objective = profiler.make_objective

    def make_objective(*a, **k):
        return timed("objective", original_objective(*a, **k))

    profiler.make_objective = make_objective
    from dlblas_compiler.tuning import tuner

    tuner.make_objective = make_objective
    from blocks import BLOCKS

    import dlblas_compiler as dc
    from dlblas_compiler.codegen.compile_pool import STATS
    from dlblas_compiler.runtime.steps import RegionStep

    rows = []
    for m in map(int, args.tokens.split(",")):
        workers_before = dataclasses.asdict(STATS)
        mod, a, kw, _, _ = BLOCKS[args.block](m, torch.bfloat16, "cuda")
        start, first_span = len(records), len(spans)
        t0 = time.perf_counter()
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        with torch.no_grad():
            cm(*a, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        layer_us = _replayed_us(cm, a, kw)
        mine = records[start:]
        main = [r for r in mine if r[0] == "MainThread"]
        pool = [r for r in mine if r[0] != "MainThread"]
        per_kernel = collections.defaultdict(lambda: [0, 0.0])
        for _, name, c0, c1 in main:
            per_kernel[name][0] += 1
            per_kernel[name][1] += c1 - c0
        steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None]
        row = {"block": args.block, "M": m, "wall_s": round(wall, 2), "layer_us_replayed": round(layer_us, 1),
               "chosen": {s.choice.region: [s.choice.impl, round((s.choice.time or 0) * 1e6, 1)] for s in steps},
               "trials": sum(s.choice.trials or 0 for s in steps), "regions_tuned": sum(1 for s in steps if s.choice.trials),
               "main_thread_compiles": len(main), "main_thread_compile_s": round(sum(r[3] - r[2] for r in main), 2),
               "pool_compiles": len(pool), "pool_compile_s_summed": round(sum(r[3] - r[2] for r in pool), 2),
               "timeline": _timeline(spans[first_span:], mine),
               "compile_workers": {k: round(v - workers_before[k], 2)
                                   for k, v in dataclasses.asdict(STATS).items()},  # fmt: skip
               "main_thread_by_kernel": {k: [n, round(s, 2)] for k, (n, s) in
                                         sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:15]}}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"cold_tuning-{args.block}.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "rows": rows}, f, indent=1)  # fmt: skip


def _replayed_us(cm, args, kwargs) -> float:
    """The tuned layer's GPU time (its calls captured in a CUDA graph and replayed, L2 cleared, median µs): what
    the chosen kernels are worth, measured alike for every way of tuning."""
    import torch
    from run import graphed  # (bench/run.py's capture, imported once the caches above are set)
    from triton.testing import do_bench

    with torch.no_grad():
        g = graphed(lambda: cm(*args, **kwargs))
    return do_bench(g.replay, warmup=25, rep=200, return_mode="median") * 1e3


def _timeline(spans: list, compiles: list) -> dict:
    """Seconds of the calling thread by activity (an objective's own share is its first run: build, the wait for
    its compile, the check), and the compiles' concurrency: the seconds during which any ran, and the mean number
    running then."""
    total = collections.defaultdict(float)
    for what, a, b in spans:
        total[what] += b - a
    out = {k: round(v, 2) for k, v in total.items()}
    out["candidate first runs (build, compile wait, check)"] = round(total["objective"] - total["timing candidates"], 2)
    # (the timing against the reference runs after the search, in `tune_region`: not part of the search's span)
    out["search's own work (config choice, bookkeeping, the reference's outputs)"] = round(
        total["search"] - total["objective"] - total["submitting compiles"], 2)
    events = sorted([(c[2], 1) for c in compiles] + [(c[3], -1) for c in compiles])
    busy = weighted = 0.0
    running, last = 0, None
    for t, d in events:
        if last is not None and running:
            busy += t - last
            weighted += running * (t - last)
        running, last = running + d, t
    out["compiles busy s"] = round(busy, 2)
    out["compiles running at once (mean while busy)"] = round(weighted / busy, 2) if busy else 0.0
    return out


if __name__ == "__main__":
    main()
