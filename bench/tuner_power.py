"""The tuner's timing of long GEMMs against their graph replays, with the card's clock and power (bench/NOTES.md 146).

    python bench/tuner_power.py --out OUT [--layers llama3_8b,qwen25_7b] [--tokens 2048]

A long compute-bound GEMM holds an H100/H200 at its power limit, where its SM clock drops. For each GEMM region of
each decoder layer (bench/blocks.HF_LAYERS, compiled with quick tuning), its tuned config, two persistent configs
and `torch.matmul` of the same operands are timed four ways, twice:
* `spun`: the tuner's measure before item 146 (L2 cleared, then the GPU idled for 1.5x the call's host time before
  every call, quick tuning's 10 ms warm-up and 30 ms of repetitions);
* `quick`, `full`: `tuning.benchmark` as quick and full tuning call it now (the idle spin only where the host is
  slower than the GPU);
* `graph`: the call replayed from a CUDA graph by `triton.testing.do_bench` (L2 cleared), as bench/gemms.py times it.
nvidia-smi samples the SM clock, the power draw and the throttle reasons every 20 ms; each measure's mean clock and
power are recorded with it. Writes OUT/tuner_power.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from gemms import SWEEP, graph_time_us, operands, region_inputs  # noqa: E402
from smi import Smi  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.tuning import TUNE_MODES, benchmark, profiler  # noqa: E402


def spun_seconds(call, warmup_ms: float = 10.0, rep_ms: float = 30.0, settle: bool = False) -> float:
    """The tuner's GPU time before item 146: every call behind an idle spin of 1.5x its host time (`settle` is
    ignored: the old measure warmed every call for `warmup_ms` alone)."""
    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        call()
    spin = int(min(profiler.MAX_HIDDEN_S, 1.5 * (time.perf_counter() - t0) / 3 + 20e-6) * profiler.SPIN_HZ)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(5):
        driver.clear_cache(cache)
        torch.cuda._sleep(spin)
        call()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = start.elapsed_time(end) / 5
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        call()
    n = max(5, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        driver.clear_cache(cache)
        torch.cuda._sleep(spin)
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b")
    ap.add_argument("--tokens", type=int, default=2048)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    smi = Smi(os.path.join(a.out, "smi.csv"), period_ms=20)
    quick, full = TUNE_MODES["quick"], TUNE_MODES["full"]
    measures = {
        "spun": lambda call: spun_seconds(call),
        "quick": lambda call: benchmark(call, warmup_ms=quick.warmup_ms, rep_ms=quick.rep_ms, device="cuda"),
        "full": lambda call: benchmark(call, warmup_ms=full.warmup_ms, rep_ms=full.rep_ms, device="cuda"),
        "graph": lambda call: graph_time_us(call) / 1e6,
    }
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tokens": a.tokens, "rows": []}  # fmt: skip
    timed = []
    for name in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](a.tokens, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        with torch.no_grad():
            cm(*args, **kwargs)
            for step, tensors in region_inputs(cm, args, kwargs):
                configs = {"tuned": step.choice.config}
                for cfg in SWEEP:
                    if cfg["PERSISTENT"] and step.kernel.space.is_valid(cfg) and (cfg["BLOCK_N"], cfg["num_stages"]) in ((256, 3), (128, 4)):
                        configs[f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} s{cfg['num_stages']}"] = cfg
                compile_configs(step.kernel, step.compiled, tensors, list(configs.values()))
                a_, w = operands(step, tensors)
                out = torch.empty(a_.shape[0], w.shape[0], dtype=a_.dtype, device=a_.device)
                calls = {"cuBLAS": lambda: torch.matmul(a_, w.t(), out=out)}
                calls |= {label: (lambda cfg: lambda: step.launch(tensors, cfg))(cfg) for label, cfg in configs.items()}
                for rnd in range(2):
                    for label, call in calls.items():
                        row = {"layer": name, "region": step.choice.region, "candidate": label, "round": rnd,
                               "config": configs.get(label)}  # fmt: skip
                        for m, measure in measures.items():
                            t0 = time.time()
                            row[f"{m}_us"] = measure(call) * 1e6
                            timed.append((row, m, t0, time.time()))
                        res["rows"].append(row)
                        print(f"{name:12s} {row['region']:8s} {label:18s} r{rnd}  " + "  ".join(
                            f"{m} {row[f'{m}_us']:7.1f}" for m in measures) + f"  spun/graph {row['spun_us'] / row['graph_us']:.3f}"
                            f"  quick/graph {row['quick_us'] / row['graph_us']:.3f}  full/graph {row['full_us'] / row['graph_us']:.3f}", flush=True)  # fmt: skip
        del cm, mod
        torch.cuda.empty_cache()
    time.sleep(0.1)
    smi.stop()
    for row, m, t0, t1 in timed:
        row[f"{m}_smi"] = smi.window(t0, t1)
    with open(os.path.join(a.out, "tuner_power.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    for key in ("spun", "quick", "full"):
        r = [row[f"{key}_us"] / row["graph_us"] for row in res["rows"]]
        print(f"{key}/graph: median {statistics.median(r):.3f}, {min(r):.3f}-{max(r):.3f}")
    print(f"wrote {a.out}/tuner_power.json")


if __name__ == "__main__":
    main()
