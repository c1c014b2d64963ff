"""Where a block's time goes on the GPU: per-kernel times, the idle time between kernels, and the same call
timed four ways, for our compiled block and for Inductor (torch.profiler + CUDA events).

    python bench/profile_kernels.py --out OUT [--block decoder_layer] [--tokens 2048] [--calls 5]
                                    [--modes ours,max-autotune-no-cudagraphs]

For each mode, launched directly and replayed from a CUDA graph:
* timings (µs): do_bench median with L2 cleared before each call (what bench/run.py reports), and a
  back-to-back loop of `--calls`*4 calls without clearing (CUDA events around the loop);
* from a profiler trace of `--calls` calls, each preceded by an L2 clear: per kernel name the mean time per
  call, the kernel sum, the span from the first kernel's start to the last one's end, the largest idle gaps
  (which two kernels they sit between) and each kernel's launch shape (grid, block, registers, shared memory);
* `<mode>/interleaved`: one trace in which direct calls and graph replays alternate (each after an L2 clear,
  the order swapped every pair), so both see the same clocks, temperature and power state; per-kernel times
  of each kind and their launch shapes. A kernel slower under replay here, with the same launch shape, is
  slower because of how it runs, not because the GPU's state drifted between two separate traces.
nvidia-smi samples SM clock, power and temperature every 100 ms during the whole run (OUT/smi_<block>_<M>.csv);
the JSON's `smi` summarizes them per phase (which mode, direct or replay, timing or trace). The card's
ceilings (bench/ceilings.py) are measured first and recorded. Writes OUT/profile_<block>_<M>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from ceilings import measure as measure_ceilings  # noqa: E402
from run import graphed  # noqa: E402
from smi import Smi  # noqa: E402

FLUSH = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda") if torch.cuda.is_available() else None
GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


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


def _launch(args: dict) -> str:
    if "grid" not in args:  # a memset or copy: its size tells the L2 clear from the block's own memsets
        return f"bytes {args.get('bytes')}"
    return (f"grid {args.get('grid')} block {args.get('block')} regs {args.get('registers per thread')} "
            f"smem {args.get('shared memory')}")  # fmt: skip


def gpu_events(trace: dict) -> list[dict]:
    """The GPU-side events (kernels, memsets, copies) of a Chrome trace, in start order, with launch shapes."""
    evs = [
        {"name": e["name"], "start": float(e["ts"]), "end": float(e["ts"]) + float(e["dur"]),
         "launch": _launch(e.get("args", {}))}
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS
    ]  # fmt: skip
    return sorted(evs, key=lambda e: e["start"])


def split_calls(evs: list[dict], flush: set[tuple[str, str]]) -> list[list[dict]]:
    """The events between consecutive L2 clears (recognized by name and launch shape): one list per call."""
    calls: list[list[dict]] = []
    for e in evs:
        if (e["name"], e["launch"]) in flush:
            calls.append([])
        elif calls:
            calls[-1].append(e)
    return [c for c in calls if c]


def summarize(calls: list[list[dict]]) -> dict:
    """Per kernel name the mean time per call, the median kernel sum and span, the largest mean idle gaps, and
    the distinct launch shapes of each kernel name."""
    n = len(calls)
    per_name: dict[str, float] = collections.defaultdict(float)
    gaps: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, set] = collections.defaultdict(set)
    spans, sums = [], []
    for ks in calls:
        spans.append(ks[-1]["end"] - ks[0]["start"])
        sums.append(sum(e["end"] - e["start"] for e in ks))
        for e in ks:
            per_name[e["name"][:90]] += (e["end"] - e["start"]) / n
            launches[e["name"][:90]].add(e["launch"])
        for x, y in zip(ks, ks[1:]):
            gaps[f"{x['name'][:40]} -> {y['name'][:40]}"] += (y["start"] - x["end"]) / n
    top = sorted(gaps.items(), key=lambda kv: -kv[1])[:6]
    return {"calls": n, "kernels_per_call": statistics.median(len(c) for c in calls), "span": statistics.median(spans),
            "kernel_sum": statistics.median(sums), "per_kernel": dict(per_name), "largest_gaps": dict(top),
            "launches": {k: sorted(v) for k, v in launches.items()}}  # fmt: skip


def profiled(body) -> list[dict]:
    """Run `body()` under torch.profiler (CUDA activity); its GPU events."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        body()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return gpu_events(json.load(f))


def flush_signature() -> set[tuple[str, str]]:
    """(name, launch shape) of the L2 clear's own events, from a profile of the clear alone."""
    return {(e["name"], e["launch"]) for e in profiled(FLUSH.zero_)}


def trace(fn, calls: int, flush: set) -> dict:
    """Kernels per call from a profile of `calls` calls, each after an L2 clear."""
    fn()

    def body():
        for _ in range(calls):
            FLUSH.zero_()
            fn()

    return summarize(split_calls(profiled(body), flush))


def interleaved(direct, replay, calls: int, flush: set) -> dict:
    """One profile in which direct calls and graph replays alternate (each after an L2 clear; direct first in
    even pairs, replay first in odd ones): per-kernel times of each under the same GPU state."""
    direct()
    replay()
    order: list[str] = []

    def body():
        for i in range(calls):
            for how in ("direct", "graph") if i % 2 == 0 else ("graph", "direct"):
                FLUSH.zero_()
                (direct if how == "direct" else replay)()
                order.append(how)

    segments = split_calls(profiled(body), flush)
    if len(segments) != len(order):
        return {"error": f"{len(segments)} traced calls for {len(order)} launched"}
    return {how: summarize([s for s, o in zip(segments, order) if o == how]) for how in ("direct", "graph")}


def make(mode: str, mod, args, kwargs):
    if mode == "ours":
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        return lambda: cm(*args, **kwargs)
    torch._dynamo.reset()
    fn = torch.compile(mod, mode=mode, dynamic=False)
    return lambda: fn(*args, **kwargs)


def _print(title: str, r: dict) -> None:
    print(f"== {title}: " + json.dumps({k: round(v, 1) for k, v in r.items() if isinstance(v, float)}))
    for n, t in sorted(r["per_kernel"].items(), key=lambda kv: -kv[1]):
        print(f"   {t:9.1f}  {n}")
    for n, t in r["largest_gaps"].items():
        print(f"   gap {t:7.1f}  {n}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="profile_out")
    p.add_argument("--block", default="decoder_layer")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--modes", default="ours,max-autotune-no-cudagraphs")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    smi = Smi(os.path.join(a.out, f"smi_{a.block}_{a.tokens}.csv"))
    res: dict = {"gpu": torch.cuda.get_device_name(), "block": a.block, "M": a.tokens, "torch": torch.__version__}
    try:
        with smi.phase("ceilings"):
            res["ceilings"] = measure_ceilings()
    except Exception as e:  # noqa: BLE001 - the profile is worth keeping without them
        res["ceilings_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    mod, args, kwargs, _, _ = BLOCKS[a.block](a.tokens, torch.bfloat16, "cuda")
    flush = flush_signature()
    try:
        with torch.no_grad():
            for mode in a.modes.split(","):
                direct = make(mode, mod, args, kwargs)
                direct()
                g = graphed(direct)
                for how, fn in (("direct", direct), ("graph", g.replay)):
                    with smi.phase(f"{mode}/{how} timings"):
                        t = timings(fn, a.calls)
                    with smi.phase(f"{mode}/{how} trace"):
                        r = res[f"{mode}/{how}"] = {**t, **trace(fn, a.calls, flush)}
                    _print(f"{mode} {how}", r)
                with smi.phase(f"{mode}/interleaved trace"):
                    r = res[f"{mode}/interleaved"] = interleaved(direct, g.replay, a.calls, flush)
                for how in ("direct", "graph"):
                    if how in r:
                        _print(f"{mode} interleaved, {how}", r[how])
                del g, direct
                torch.cuda.empty_cache()
    finally:
        res["smi"] = smi.stop()
        with open(os.path.join(a.out, f"profile_{a.block}_{a.tokens}.json"), "w") as f:
            json.dump(res, f, indent=1)
    for name, s in res["smi"].items():
        print(f"smi {name}: {json.dumps(s)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
