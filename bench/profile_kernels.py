"""Where a block's time goes on the GPU: per-kernel times, the idle time between kernels, and the same call
timed four ways, for our compiled block and for Inductor (torch.profiler + CUDA events).

    python bench/profile_kernels.py --out OUT [--block decoder_layer] [--tokens 2048] [--calls 5]
                                    [--modes ours,max-autotune-no-cudagraphs]

For each mode, launched directly and replayed from a CUDA graph:
* timings (µs): do_bench median with L2 cleared before each call (what bench/run.py reports), and a
  back-to-back loop of `--calls`*4 calls without clearing (CUDA events around the loop);
* from a profiler trace of `--calls` calls, each preceded by an L2 clear: per kernel name the mean time per
  call, the kernel sum, the span from the first kernel's start to the last one's end, and the largest idle gaps
  (which two kernels they sit between).
Writes OUT/profile_<block>_<M>.json and prints a summary.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from run import graphed  # noqa: E402

FLUSH = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda") if torch.cuda.is_available() else None


def timings(fn, calls: int) -> dict:
    from triton.testing import do_bench

    flushed = do_bench(fn, warmup=25, rep=100, return_mode="all")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    a.record()
    for _ in range(calls * 4):
        fn()
    b.record()
    torch.cuda.synchronize()
    q = statistics.quantiles([t * 1e3 for t in flushed], n=10)
    return {"do_bench_median": statistics.median(flushed) * 1e3, "do_bench_p10": q[0], "do_bench_p90": q[-1],
            "loop_per_call": a.elapsed_time(b) * 1e3 / (calls * 4)}  # fmt: skip


def trace(fn, calls: int) -> dict:
    """Kernels per call from a profile of `calls` calls, each after an L2 clear."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            FLUSH.zero_()
            fn()
        torch.cuda.synchronize()
    ev = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
        key=lambda e: e.time_range.start,
    )
    per = len(ev) // calls  # the flush, then the call's kernels
    per_name: dict[str, float] = collections.defaultdict(float)
    spans, sums, gaps = [], [], collections.defaultdict(float)
    for c in range(calls):
        ks = ev[c * per + 1 : (c + 1) * per]
        spans.append(ks[-1].time_range.end - ks[0].time_range.start)
        sums.append(sum(e.time_range.end - e.time_range.start for e in ks))
        for e in ks:
            per_name[e.name[:90]] += (e.time_range.end - e.time_range.start) / calls
        for x, y in zip(ks, ks[1:]):
            gaps[f"{x.name[:40]} -> {y.name[:40]}"] += (y.time_range.start - x.time_range.end) / calls
    top = sorted(gaps.items(), key=lambda kv: -kv[1])[:6]
    return {"kernels_per_call": per - 1, "span": statistics.median(spans), "kernel_sum": statistics.median(sums),
            "per_kernel": dict(per_name), "largest_gaps": dict(top)}  # fmt: skip


def make(mode: str, mod, args, kwargs):
    if mode == "ours":
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        return lambda: cm(*args, **kwargs)
    torch._dynamo.reset()
    fn = torch.compile(mod, mode=mode, dynamic=False)
    return lambda: fn(*args, **kwargs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="profile_out")
    p.add_argument("--block", default="decoder_layer")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--modes", default="ours,max-autotune-no-cudagraphs")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    mod, args, kwargs, _, _ = BLOCKS[a.block](a.tokens, torch.bfloat16, "cuda")
    res = {"gpu": torch.cuda.get_device_name(), "block": a.block, "M": a.tokens}
    with torch.no_grad():
        for mode in a.modes.split(","):
            direct = make(mode, mod, args, kwargs)
            direct()
            g = graphed(direct)
            for how, fn in (("direct", direct), ("graph", g.replay)):
                r = res[f"{mode}/{how}"] = {**timings(fn, a.calls), **trace(fn, a.calls)}
                print(f"== {mode} {how}: " + json.dumps({k: round(v, 1) for k, v in r.items() if isinstance(v, float)}))
                for n, t in sorted(r["per_kernel"].items(), key=lambda kv: -kv[1]):
                    print(f"   {t:9.1f}  {n}")
                for n, t in r["largest_gaps"].items():
                    print(f"   gap {t:7.1f}  {n}")
            del g, direct
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, f"profile_{a.block}_{a.tokens}.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
