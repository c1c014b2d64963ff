"""Where a cold quick tuning's time goes: Triton compiles on the calling thread against the tuner's compile pool.

    python bench/cold_tuning.py --out OUT [--block layer_llama3_8b] [--tokens 128,1]

A fresh Triton cache and tuning cache (temporary folders), one decoder layer compiled with tune="quick" and called
once per token count. Every Triton compile is timed with the thread it ran on: the tuner compiles each batch of
candidates in a pool of threads before timing them (`compile_configs`), so compiles on the calling thread are
ones that batch did not cover. Writes OUT/cold_tuning.json: per token count the call's wall time, the tuner's
trials, and compile counts and seconds by thread (calling thread: which kernels, how long).
"""

from __future__ import annotations

import argparse
import collections
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

    records: list[tuple[str, str, float]] = []
    original = triton.compiler.compile

    def timed_compile(src, *a, **k):  # (JITFunction takes `compile` from triton.compiler when it first runs)
        t0 = time.perf_counter()
        try:
            return original(src, *a, **k)
        finally:
            records.append((threading.current_thread().name, getattr(src, "name", type(src).__name__),
                            time.perf_counter() - t0))

    triton.compiler.compile = timed_compile
    from blocks import BLOCKS

    import dlblas_compiler as dc
    from dlblas_compiler.runtime.steps import RegionStep

    rows = []
    for m in map(int, args.tokens.split(",")):
        mod, a, kw, _, _ = BLOCKS[args.block](m, torch.bfloat16, "cuda")
        start = len(records)
        t0 = time.perf_counter()
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        with torch.no_grad():
            cm(*a, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        mine = records[start:]
        main = [r for r in mine if r[0] == "MainThread"]
        pool = [r for r in mine if r[0] != "MainThread"]
        per_kernel = collections.defaultdict(lambda: [0, 0.0])
        for _, name, s in main:
            per_kernel[name][0] += 1
            per_kernel[name][1] += s
        steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None]
        row = {"block": args.block, "M": m, "wall_s": round(wall, 2),
               "trials": sum(s.choice.trials or 0 for s in steps), "regions_tuned": sum(1 for s in steps if s.choice.trials),
               "main_thread_compiles": len(main), "main_thread_compile_s": round(sum(r[2] for r in main), 2),
               "pool_compiles": len(pool), "pool_compile_s_summed": round(sum(r[2] for r in pool), 2),
               "main_thread_by_kernel": {k: [n, round(s, 2)] for k, (n, s) in
                                         sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:15]}}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_tuning.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
