"""FlashNorm at prefill against the norm's row pass (issue 19: "or a companion row pass if measured faster").

    python bench/flashnorm.py --out OUT [--layers llama3_8b,qwen25_7b,gemma_7b] [--tokens 2048] [--calls 100]

By default a GEMM region with an RMSNorm prologue runs at prefill a row pass that writes the normalized rows, which
its K loop then reads (the norm's gain may not scale the A tile in the K loop: bench/NOTES.md 167). The opt-in
FlashNorm rewrite (`algebraic{fold_norm_weight=true}`) folds the gain into the linears' weights (a second copy of
each), so the norm left is a per-row scale: a pass that only reads x for the rows' statistics, applied to the
accumulator in the epilogue. For each layer (bench/blocks.HF_LAYERS, random weights, bf16) and both pipelines,
compiled with `--tune` tuning: the output's relative error against a float64 reference, the GPU memory the
compiled module adds, each GEMM region's time at its tuned config (bench/gemms.time_regions: CUDA-graph replay,
L2 cleared, do_bench median; the region's norm pass included), each norm region at its tuned config with NORM_PASS
the other way (the statistics pass against the row pass at one tile) and the GPU time of each kernel of both
(torch.profiler), then the two compiled layers' calls timed in turn, call by call (`--calls` each,
bench/run.paired). Writes OUT/flashnorm.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys

import torch
import triton
from torch.profiler import ProfilerActivity, profile
from torch.utils import _pytree as pytree

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from gemms import graph_time_us, region_inputs, time_regions  # noqa: E402
from run import leaves, paired  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402

REGION_KEYS = ("region", "ops", "impl", "config", "M", "N", "K", "kernel_us", "cublas_us")
PIPELINES = {"row pass": dc.DEFAULT_PIPELINE,
             "flashnorm": dc.DEFAULT_PIPELINE.replace("algebraic", "algebraic{fold_norm_weight=true}")}  # fmt: skip


def norm_pass_flipped(cm, args, kwargs) -> list[dict]:
    """Each GEMM region with a norm prologue timed (as time_regions does) at its tuned config with NORM_PASS the
    other way, where its space has that config: the statistics-only pass (0) against the row pass (1) at one tile
    (quick tuning's starts carry the row pass above 16 rows, so its search may not reach the other)."""
    out = []
    with torch.no_grad():
        for step, tensors in region_inputs(cm, args, kwargs):
            c = step.choice.config
            norm = any(o.name in ("dl.rms_norm", "dl.add_rms_norm") for o in step.kernel.region.body_ops)
            if c.get("MM") or not norm:
                continue
            other = {**c, "NORM_PASS": 1 - c["NORM_PASS"]}
            if not step.kernel.space.is_valid(other):
                continue
            tuned = graph_time_us(lambda s=step, t=tensors, c=c: s.launch(t, c))
            t = graph_time_us(lambda s=step, t=tensors, c=other: s.launch(t, c))
            kernels = {n: kernel_times(step, tensors, cfg) for n, cfg in (("tuned", c), ("flipped", other))}
            out.append({"region": step.choice.region, "config": c, "tuned_us": tuned, "flipped_us": t,
                        "kernels": kernels})
            print(f"  {step.choice.region}: NORM_PASS {c['NORM_PASS']} {tuned:.1f} µs, "
                  f"{other['NORM_PASS']} {t:.1f} µs", flush=True)  # fmt: skip
    return out


def kernel_times(step, tensors, config: dict, launches: int = 20) -> dict[str, float]:
    """Mean GPU µs of each kernel one launch of the region runs (the norm's pass, the GEMM), by torch.profiler over
    `launches` launches (no L2 clear between them)."""
    for _ in range(5):
        step.launch(tensors, config)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(launches):
            step.launch(tensors, config)
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / e.count for e in p.key_averages() if e.device_type.name == "CUDA" and e.count}


def _double(t):
    return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b,gemma_7b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--tune", default="quick")
    ap.add_argument("--calls", type=int, default=100)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "tokens": a.tokens, "tune": a.tune, "layers": []}  # fmt: skip
    for layer in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](a.tokens, torch.bfloat16, "cuda")
        with torch.no_grad():
            ref_mod = copy.deepcopy(mod).double()
            dargs = pytree.tree_map(_double, (args, kwargs))
            ref = leaves(ref_mod(*dargs[0], **dargs[1]))
            del ref_mod
            eager = leaves(mod(*args, **kwargs))
        eager_err = max(rel_error(o, r) for o, r in zip(eager, ref, strict=True))
        entry = {"layer": layer, "eager_rel_err": eager_err, "modes": {}}
        fns = []
        for name, pipeline in PIPELINES.items():
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            with torch.no_grad():
                cm = dc.compile(mod, backend="triton", tune=a.tune, pipeline=pipeline)
                out = leaves(cm(*args, **kwargs))
                torch.cuda.synchronize()
                added = torch.cuda.memory_allocated() - before
                regions = time_regions(cm, args, kwargs, sweep=False)
                flipped = norm_pass_flipped(cm, args, kwargs)
            m = entry["modes"][name] = {
                "rel_err": max(rel_error(o, r) for o, r in zip(out, ref, strict=True)), "added_mb": added / 1e6,
                "regions": [{k: r[k] for k in REGION_KEYS} for r in regions],
                "norm_pass_flipped": flipped}  # fmt: skip
            fns.append(lambda cm=cm, args=args, kwargs=kwargs: cm(*args, **kwargs))
            print(f"{layer} {name:9s} rel. err {m['rel_err']:.2e} (eager {entry['eager_rel_err']:.2e}), "
                  f"+{m['added_mb']:.0f} MB", flush=True)  # fmt: skip
        with torch.no_grad():
            calls = paired(fns, a.calls)
        for m, ts in zip(entry["modes"].values(), calls, strict=True):
            m["call_us_paired"] = statistics.median(ts)
        base = entry["modes"]["row pass"]
        for name, m in entry["modes"].items():
            speedup = base["call_us_paired"] / m["call_us_paired"]
            times = "  ".join(f"{r['region']} {r['kernel_us']:.1f}" for r in m["regions"])
            print(f"  {name:9s} call {m['call_us_paired']:8.1f} µs ({speedup:.3f}x the row pass's)  {times}",
                  flush=True)
        res["layers"].append(entry)
        with open(os.path.join(a.out, "flashnorm.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        del fns, cm, mod
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
