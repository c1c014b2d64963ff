"""Where a compiled layer's call time goes beyond its graph's GPU time (Llama-3-8B layer at 2048, H200): the call,
the program's replay, the raw CUDA graph replay, each do_bench'd (L2 cleared) and back to back; the host's time per
call; what the replay copies (a foreach copy of the inputs under 1 MiB against a copy each), and the A/B of the
tree before (inputs under 1 MiB copied before each replay) against now (read in place from 64 KiB), paired;
Inductor's default mode beside it; then 1.5 s phases of each (nvidia-smi's clock and power): at the card's power
limit a call's time is its energy over the limit.

    python bench/callpath.py OUT [layer_llama3_8b]   (writes OUT/callpath_<block>.json, a trace and nvidia-smi samples;
    bench/NOTES.md 156)
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, "bench")
import torch
from blocks import BLOCKS
from run import paired
from triton.testing import do_bench

import dlblas_compiler as dc

out = sys.argv[1]
block = sys.argv[2] if len(sys.argv) > 2 else "layer_llama3_8b"
mod, args, kwargs, _, _ = BLOCKS[block](2048, torch.bfloat16, "cuda")
res = {}


def host_us(fn, n=30):
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.2))  # 0.2 s of GPU spin: the host never waits for the queue
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def b2b_us(fn, n=40):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / n


with torch.no_grad():
    cm = dc.compile(mod, backend="triton", tune="quick")
    call = lambda: cm(*args, **kwargs)
    for _ in range(4):
        call()
    spec = cm._spec()
    p = spec.executor
    g = p.graph
    inputs = spec.imported.program_inputs(spec.captured.flatten(args, kwargs)) if not spec.direct else list(args)
    res["inputs"] = [
        (tuple(x.shape), str(x.dtype), x.numel() * x.element_size()) if isinstance(x, torch.Tensor) else repr(x)[:40]
        for x in inputs
    ]
    res["graph"] = {
        "copied": list(g.copied),
        "together": list(g.together),
        "in_place": list(g.in_place),
        "static": list(g.static),
        "handout": g.handout,
        "copy_inputs": p.copy_inputs,
        "note": p.graph_note,
        "spec_direct": spec.direct,
        "same_leaves": spec.same_leaves,
    }
    mids = [x for x in inputs if isinstance(x, torch.Tensor) and x.numel() * x.element_size() < (1 << 20)]
    cp, src = [x.clone() for x in mids], mids

    def graph_us(body, reps=20):
        gg = torch.cuda.CUDAGraph()
        body()
        torch.cuda.synchronize()
        with torch.cuda.graph(gg):
            for _ in range(reps):
                body()
        return b2b_us(gg.replay, 20) / reps

    if cp:
        res["copy_us"] = {
            "foreach": graph_us(lambda: torch._foreach_copy_(cp, src)),
            "each": graph_us(lambda: [a.copy_(b) for a, b in zip(cp, src)]),
        }
    print(json.dumps(res), flush=True)
    # the A/B: the tree before (inputs under 1 MiB copied by one foreach launch) against now (read in place)
    from dlblas_compiler.runtime import graphs as G
    from dlblas_compiler.runtime import program as P

    G.IN_PLACE_BYTES = P.IN_PLACE_BYTES = 1 << 20
    cm_old = dc.compile(mod, backend="triton", tune="quick")
    call_old = lambda: cm_old(*args, **kwargs)
    for _ in range(4):
        call_old()
    G.IN_PLACE_BYTES = P.IN_PLACE_BYTES = 64 << 10
    go = cm_old._spec().executor.graph
    res["old_graph"] = {"copied": list(go.copied), "together": list(go.together), "in_place": list(go.in_place)}
    pt = paired([call, call_old], 150)
    res["ab_paired"] = {
        "new": statistics.median(pt[0]),
        "old": statistics.median(pt[1]),
        "per_turn_new_over_old": statistics.median(a / b for a, b in zip(*pt)),
    }
    print(json.dumps(res["ab_paired"]), json.dumps(res["old_graph"]), flush=True)
    raw = g.graph.replay
    prog = lambda: p(inputs)
    ind = torch.compile(mod, dynamic=False)
    icall = lambda: ind(*args, **kwargs)
    for _ in range(3):
        icall()
    torch.cuda.synchronize()
    ways = {"call": call, "program": prog, "raw_replay": raw, "inductor": icall}
    rows = {}
    for _round in range(3):
        for name, fn in ways.items():
            row = rows.setdefault(name, {"do_bench": [], "b2b": [], "host": []})
            row["do_bench"].append(do_bench(fn, warmup=25, rep=100) * 1e3)
            row["b2b"].append(b2b_us(fn))
            row["host"].append(host_us(fn))
    res["ways"] = {n: {k: round(statistics.median(v), 1) for k, v in row.items()} for n, row in rows.items()}
    pt = paired(list(ways.values()), 60)
    res["paired"] = {n: round(statistics.median(t), 1) for n, t in zip(ways, pt)}
    print(json.dumps(res["ways"]), json.dumps(res["paired"]), flush=True)
    # sustained phases (1.5 s of L2 clear + call, as do_bench calls), ours and Inductor's in turn, with nvidia-smi's
    # SM clock and power: at the power limit a call's time is its energy over the limit
    from smi import Smi
    from triton import runtime

    drv = runtime.driver.active
    cache = drv.get_empty_cache_for_benchmark()
    smi = Smi(os.path.join(out, f"smi_{block}.csv"))
    energy = {}
    for r in range(3):
        for name in ("call", "inductor") if r % 2 == 0 else ("inductor", "call"):
            fn = ways[name]
            with smi.phase(f"{name}/{r}"):
                torch.cuda.synchronize()
                t0, n = time.perf_counter(), 0
                while time.perf_counter() - t0 < 1.5:
                    drv.clear_cache(cache)
                    fn()
                    n += 1
                    if n % 50 == 0:
                        torch.cuda.synchronize()
                torch.cuda.synchronize()
                energy.setdefault(name, []).append({"calls": n, "s": time.perf_counter() - t0})
    phases = smi.stop()
    for name, rows_ in energy.items():
        for r, row in enumerate(rows_):
            row.update(phases.get(f"{name}/{r}", {}))
    res["energy"] = energy
    print(json.dumps(energy), flush=True)
    # the timeline of a few do_bench-like calls (clear, call) with the host's side
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            drv.clear_cache(cache)
            call()
        torch.cuda.synchronize()
    prof.export_chrome_trace(os.path.join(out, f"callpath_{block}.trace.json"))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25), flush=True)
json.dump(res, open(os.path.join(out, f"callpath_{block}.json"), "w"), indent=1)
