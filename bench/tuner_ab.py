"""Do the tuner's timing since item 146 and its confirmation round (item 147) choose faster configs? Layers tuned
several times from empty caches by each variant of the tuner, then all replayed side by side in ONE process
(bench/NOTES.md 146's missing A/B: two tunings by one method already differ by 1-2% on a layer, so one tuning of
each proves nothing).

    python bench/tuner_ab.py --out OUT [--layers llama3_8b] [--tokens 2048] [--reps 3] [--rounds 5]
                             [--variants old,new,confirm]

`old`: `profiler._gpu_seconds` replaced by the measure before item 146 (bench/tuner_power.spun_seconds: an idle
spin of 1.5x the host time before every timed call), quick tuning's former 10 ms warm-up and no confirmation round;
`new`: item 146's timing, no confirmation round; `confirm`: the tree as it is. Each (variant, repetition) tunes with
`tune="quick"` into its own empty cache directory, so nothing is shared but Triton's compiled kernels. Then every
compiled layer is called in `--rounds` rounds, the order reversed every other round, call time (do_bench median,
CUDA graphs). Right after each tuning, each GEMM region's tuned kernel and `torch.matmul` of its shape are timed as
graph replays (bench/gemms.time_regions: the issue's fused-GEMM-against-cuBLAS ratio). Writes OUT/tuner_ab.json: per
compilation its variant, repetition, the config each GEMM region chose, the confirmation rounds' finalists (config,
search µs, confirmed µs), the regions' times and the call times; per variant the median of its compilations'
medians.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from gemms import region_inputs, time_regions  # noqa: E402
from tuner_power import spun_seconds  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.runtime import selection  # noqa: E402
from dlblas_compiler.tuning import profiler, tuner  # noqa: E402


def compile_with(variant: str, cache_dir: str, mod, args, kwargs):
    """The layer compiled and tuned (quick) into `cache_dir` with the timing `variant` names."""
    os.makedirs(cache_dir, exist_ok=True)
    os.environ["DLBLAS_CACHE_DIR"] = cache_dir
    gpu_seconds, quick, tune = profiler._gpu_seconds, tuner.TUNE_MODES["quick"], selection.tune
    if variant == "old":
        profiler._gpu_seconds = spun_seconds
        tuner.TUNE_MODES["quick"] = dataclasses.replace(quick, warmup_ms=10.0, confirm=0)
    elif variant == "new":
        tuner.TUNE_MODES["quick"] = dataclasses.replace(quick, confirm=0)
    finals = {}

    def recorded(job, *a, **kw):
        out = tune(job, *a, **kw)
        if out.finalists:
            finals[f"{job.name} {dict(job.shape)}"] = [(c, s * 1e6, t * 1e6) for c, s, t in out.finalists]
        return out

    selection.tune = recorded
    try:
        cm = dc.compile(mod, backend="triton", tune="quick")
        with torch.no_grad():
            cm(*args, **kwargs)
    finally:
        profiler._gpu_seconds, tuner.TUNE_MODES["quick"], selection.tune = gpu_seconds, quick, tune
    return cm, finals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="old,new,confirm")
    a = ap.parse_args()
    variants = a.variants.split(",")
    caches = tempfile.mkdtemp(prefix="tuner_ab-")  # (not under OUT: the device tool brings back few files)
    os.makedirs(a.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tokens": a.tokens, "layers": []}  # fmt: skip
    for name in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](a.tokens, torch.bfloat16, "cuda")
        runs = []
        for rep in range(a.reps):
            for variant in variants if rep % 2 == 0 else variants[::-1]:
                t0 = time.time()
                cm, finals = compile_with(variant, os.path.join(caches, f"{name}-{variant}{rep}"), mod, args, kwargs)
                with torch.no_grad():
                    chosen = {s.choice.region: s.choice.config | {"impl": s.choice.impl}
                              for s, _ in region_inputs(cm, args, kwargs)}  # fmt: skip
                regions = [{k: r[k] for k in ("region", "impl", "M", "N", "K", "kernel_us", "cublas_us", "ratio")}
                           for r in time_regions(cm, args, kwargs, sweep=False)]  # fmt: skip
                changed = sum(f[0][1] != min(s for _, s, _ in f) for f in finals.values())
                print(f"{name} {variant} {rep}: tuned in {time.time() - t0:.1f} s; {len(finals)} confirmation "
                      f"round(s), {changed} chose other than the search's fastest", flush=True)  # fmt: skip
                runs.append({"variant": variant, "rep": rep, "configs": chosen, "finalists": finals, "regions": regions,
                             "cm": cm, "call_us": []})
        with torch.no_grad():
            for rnd in range(a.rounds):
                for r in runs if rnd % 2 == 0 else runs[::-1]:
                    call = functools.partial(r["cm"], *args, **kwargs)
                    r["call_us"].append(triton.testing.do_bench(call, warmup=25, rep=200) * 1e3)
        for r in runs:
            r["median_us"] = statistics.median(r["call_us"])
            del r["cm"]
            spread = f"{min(r['call_us']):.0f}-{max(r['call_us']):.0f}"
            print(f"{name} {r['variant']} {r['rep']}: {r['median_us']:.1f} µs ({spread})", flush=True)
        summary = {v: statistics.median(r["median_us"] for r in runs if r["variant"] == v) for v in variants}
        print(f"{name}: " + ", ".join(f"{v} {t:.1f} µs" for v, t in summary.items()) + f" (medians of {a.reps} "
              f"tunings; /{variants[0]}: " + ", ".join(f"{summary[v] / summary[variants[0]]:.3f}" for v in variants)
              + ")", flush=True)  # fmt: skip
        res["layers"].append({"layer": name, "runs": runs, "median_us": summary})
        with open(os.path.join(a.out, "tuner_ab.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        del mod, runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
