"""Differential fuzzer: random modules compiled with each backend and compared with eager.

    python scripts/fuzz.py --count 2000 --backends reference,interpret --jobs 2
    python scripts/fuzz.py --count 300 --dtype bfloat16 --backends triton --json bf16_gpu.json   # on a GPU
    python scripts/fuzz.py --count 500 --lengths --jobs 2   # each graph called at 4 sizes of one dim: shape families

Graph i of a run is drawn from random.Random(f"{seed}-{i}") (redrawn while out of float64 range), so a run
splits over processes (--jobs) or machines (--start) and gives the same graphs. Prints the graphs run per
dtype and, per backend, the mismatches, errors and unexpected fallbacks (a fused region running its
reference for a reason tests/fuzz/generator.py's EXPECTED_REFERENCE does not list, or a dlblas_compiler
warning), the kernels launched, and the distinct failures: the first graph of each (same backend, kind and
message up to numbers) is shrunk and saved as a regression under tests/fuzz/regressions/, which
tests/fuzz/test_fuzz.py replays. --json writes all of it (with the device and versions) to a file.
Backends: reference and interpret, and triton when CUDA is available (or --backends).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import random
import re
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tests.fuzz.generator import (  # noqa: E402
    REGRESSIONS,
    Outcome,
    check,
    default_backends,
    features,
    random_spec,
    save_regression,
    shrink,
    with_lengths,
)

KINDS = ("mismatch", "error", "fallback")


_POISONED: list[str] = []  # a sticky CUDA error this worker process cannot recover from


def run_graph(job: tuple) -> dict:
    """Draw graph `index` of the run and check it: the spec, its features and what each backend did. After a
    sticky CUDA error (an illegal or misaligned access poisons the process's CUDA context) the worker answers
    every later job with "retry", and the main process runs those in a fresh pool."""
    seed, index, dtype, max_ops, backends, lengths = job
    if _POISONED:
        return {"index": index, "retry": True}
    rng = random.Random(f"{seed}-{index}")
    redrawn = 0
    while True:
        spec = random_spec(rng, dtype, max_ops)
        if lengths and (spec := with_lengths(spec, rng)) is None:
            redrawn += 1
            continue
        try:
            results = check(spec, backends)
        except Exception as e:  # noqa: BLE001 - outside a backend's own try: the CUDA context is gone
            if "CUDA error" not in str(e):
                raise
            _POISONED.append(str(e))
            return {"index": index, "retry": True}
        if results is not None:
            break
        redrawn += 1
    outcomes = [
        {"backend": r.backend, "failure": r.failure, "message": r.message, "kernels": dict(r.kernels),
         "fallbacks": r.fallbacks}
        for r in results
    ]  # fmt: skip
    return {"index": index, "spec": spec, "redrawn": redrawn, "features": sorted(features(spec)), "results": outcomes}


def _worker_init() -> None:
    torch.set_num_threads(1)  # one core per process


def _results(jobs: list[tuple], processes: int):
    """Each job's result, from a pool of worker processes (or in this one); jobs a poisoned worker handed back
    run again in a fresh pool."""
    while jobs:
        if processes <= 1:
            results = map(run_graph, jobs)
        else:
            pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
            results = pool.map(run_graph, jobs, chunksize=4)
        retry = []
        for g in results:
            if g.get("retry"):
                retry.append(next(j for j in jobs if j[1] == g["index"]))
            else:
                yield g
        if processes > 1:
            pool.shutdown()
        if retry and processes <= 1:
            raise RuntimeError(f"the CUDA context was lost ({_POISONED[0][:200]}); run with --jobs 2 or more")
        jobs = retry


def signature(backend: str, failure: str, message: str) -> str:
    """A failure with its numbers blanked: graphs failing alike count as one finding."""
    return f"{backend} {failure}: " + re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", message)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200, help="graphs to run")
    ap.add_argument("--start", type=int, default=0, help="index of the first graph")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default=",".join(default_backends()))
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                    help="one dtype (default: fp32, fp16 and bf16 at random)")  # fmt: skip
    ap.add_argument("--max-ops", type=int, default=7)
    ap.add_argument("--lengths", action="store_true",
                    help="call each compiled graph at 4 sizes of one dim in one power-of-two bucket (shape families)")
    ap.add_argument("--jobs", type=int, default=1, help="processes (CPU backends; one per core)")
    ap.add_argument("--save-dir", type=Path, default=REGRESSIONS)
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-budget", type=int, default=40, help="checks the shrinker may spend per finding")
    ap.add_argument("--json", type=Path, help="write the summary (counts, findings, device) to this file")
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    jobs = [(args.seed, i, args.dtype, args.max_ops, backends, args.lengths)
            for i in range(args.start, args.start + args.count)]  # fmt: skip

    t0 = time.time()
    graphs: list[dict] = []
    by_dtype: Counter = Counter()
    covered: Counter = Counter()
    counts = {b: Counter() for b in backends}
    kernels = {b: Counter() for b in backends}
    findings: dict[str, dict] = {}
    for g in _results(jobs, args.jobs):
        graphs.append(g)
        by_dtype[g["spec"]["dtype"]] += 1
        covered.update(g["features"])
        for r in g["results"]:
            b = r["backend"]
            kernels[b].update(r["kernels"])
            if r["failure"] in ("mismatch", "error"):
                counts[b][r["failure"]] += 1
            if r["fallbacks"]:
                counts[b]["fallback"] += 1  # graphs with an unexpected fallback (whatever else failed)
                counts[b]["fallback regions"] += len(r["fallbacks"])
            if r["failure"]:
                key = signature(b, r["failure"], r["message"])
                f = findings.setdefault(key, {**r, "graphs": 0, "first": g["index"], "spec": g["spec"]})
                f["graphs"] += 1
                if f["graphs"] == 1:
                    print(f"[{len(graphs)}] graph {g['index']}: {b} {r['failure']}: {r['message']}", flush=True)
        if len(graphs) % 50 == 0:
            bad = sum(sum(c[k] for k in KINDS) for c in counts.values())
            print(f"[{len(graphs)}] {bad} failures, {len(findings)} distinct, {time.time() - t0:.0f} s", flush=True)
    seconds = time.time() - t0

    for f in findings.values():  # shrink and save the first graph of each distinct finding
        outcome = Outcome(f["backend"], f["failure"], f["message"])
        small = f["spec"] if args.no_shrink else shrink(f["spec"], outcome, backends, budget=args.shrink_budget)
        f["shrunk"] = small
        f["saved"] = str(save_regression(small, outcome, args.save_dir))

    redrawn = sum(g["redrawn"] for g in graphs)
    dtypes = ", ".join(f"{d} {n}" for d, n in sorted(by_dtype.items()))
    print(f"graphs run: {len(graphs)} ({dtypes}; seed {args.seed}, graphs {args.start}..{args.start + args.count - 1}; "
          f"{redrawn} redrawn: out of range in float64), {seconds:.0f} s")  # fmt: skip
    for b in backends:
        c = counts[b]
        by_pattern = ", ".join(f"{p} {n}" for p, n in sorted(kernels[b].items())) or "none"
        print(f"  {b}: {c['mismatch']} mismatches, {c['error']} errors, {c['fallback']} graphs with unexpected "
              f"fallbacks ({c['fallback regions']} regions or warnings); kernels launched: {by_pattern}")  # fmt: skip
    print(f"distinct failures: {len(findings)}")
    for f in findings.values():
        print(f"  {f['graphs']} graphs: {f['backend']} {f['failure']}: {f['message']}\n    saved {f['saved']}")
    print("coverage (graphs): " + ", ".join(f"{k} {n}" for k, n in sorted(covered.items())))

    if args.json:
        summary = {
            "graphs": len(graphs), "seed": args.seed, "start": args.start, "dtype": args.dtype, "backends": backends,
            "by_dtype": dict(by_dtype), "redrawn": redrawn, "seconds": round(seconds, 1),
            "counts": {b: {k: counts[b][k] for k in (*KINDS, "fallback regions")} for b in backends},
            "kernels": {b: dict(kernels[b]) for b in backends},
            "findings": [{k: f[k] for k in ("backend", "failure", "message", "graphs", "first", "spec", "shrunk",
                                            "saved")} for f in findings.values()],
            "failed_graphs": [{"index": g["index"], "results": [r for r in g["results"] if r["failure"]]}
                              for g in graphs if any(r["failure"] for r in g["results"])],
            "coverage": dict(covered),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
            "versions": {"torch": torch.__version__, "triton": _version("triton"), "python": platform.python_version()},
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"summary written to {args.json}")
    return 1 if findings else 0


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
