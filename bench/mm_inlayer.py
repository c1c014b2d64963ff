"""Where the cuBLAS-product (MM) gate/up config loses its time in the Llama-3-8B layer at 2048: per-kernel times in
the layer (graph replays, back to back and with L2 clears) against the region alone (held as the tuner times it,
back to back from a CUDA graph), MM against the TMA K loop, three alternating rounds.

    python bench/mm_inlayer.py OUT   (writes OUT/mm_inlayer.json; bench/NOTES.md 156)
"""

import collections
import json
import os
import sys

sys.path.insert(0, "bench")
import torch
from blocks import BLOCKS
from profile_kernels import flush_signature, profiled, trace
from triton.testing import do_bench

import dlblas_compiler as dc
from dlblas_compiler.runtime.steps import RegionStep
from dlblas_compiler.tuning.profiler import benchmark

KLOOP = {
    "BLOCK_M": 128,
    "BLOCK_N": 128,
    "BLOCK_K": 64,
    "SPLIT_K": 1,
    "GROUP_M": 8,
    "num_warps": 8,
    "num_stages": 3,
    "TMA": 1,
    "MM": 0,
    "NORM_PASS": 1,
    "PERSISTENT": 1,
    "WS": 0,
}
MM = {
    "BLOCK_M": 16,
    "BLOCK_N": 128,
    "BLOCK_K": 32,
    "SPLIT_K": 1,
    "GROUP_M": 8,
    "num_warps": 4,
    "num_stages": 2,
    "TMA": 0,
    "MM": 1,
    "NORM_PASS": 1,
    "PERSISTENT": 0,
    "WS": 0,
}
out = sys.argv[1]
mod, args, kwargs, _, _ = BLOCKS["layer_llama3_8b"](2048, torch.bfloat16, "cuda")
flush = flush_signature()


def per_kernel_b2b(fn, calls=20):
    fn()
    evs = profiled(lambda: [fn() for _ in range(calls)])
    d = collections.defaultdict(float)
    for e in evs:
        d[e["name"][:60]] += (e["end"] - e["start"]) / calls
    return dict(d)


res = {"rounds": []}
with torch.no_grad():
    cm = dc.compile(mod, backend="triton", tune="quick")
    for _ in range(3):
        cm(*args, **kwargs)
    p = cm._spec().executor
    steps = [s for s in p.steps if isinstance(s, RegionStep) and s.kernel is not None]
    gu = next(s for s in steps if s.choice.region == "gemm_2")
    res["tuned"] = [gu.choice.impl, gu.choice.config, gu.choice.time]
    cap = {}
    orig = gu.launch

    def spy(tensors, config):
        cap.setdefault("t", list(tensors))
        return orig(tensors, config)

    gu.launch = spy
    p.graph = None
    cm(*args, **kwargs)
    gu.launch = orig
    t = cap["t"]
    call = lambda: cm(*args, **kwargs)
    for r in range(3):
        row = {}
        for name, cfg in (("kloop", KLOOP), ("mm", MM)) if r % 2 == 0 else (("mm", MM), ("kloop", KLOOP)):
            gu.choice.impl, gu.choice.config = "kernel", cfg
            p.graph = None
            for _ in range(3):
                call()
            one = lambda cfg=cfg: gu.launch(t, cfg)
            g = torch.cuda.CUDAGraph()
            one()
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for _ in range(4):
                    one()
            for _ in range(20):
                g.replay()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(25):
                g.replay()
            b.record()
            torch.cuda.synchronize()
            row[name] = {
                "layer_do_bench": do_bench(call, warmup=25, rep=200) * 1e3,
                "layer_kernels_flushed": trace(call, 20, flush)["per_kernel"],
                "layer_kernels_b2b": per_kernel_b2b(call),
                "region_held": benchmark(one, warmup_ms=25, rep_ms=100) * 1e6,
                "region_graph_b2b": a.elapsed_time(b) * 1e3 / 100,
                "region_kernels_b2b": per_kernel_b2b(g.replay, 10),
            }
            del g
            print(
                r,
                name,
                {
                    k: (round(v, 1) if isinstance(v, float) else {n[:30]: round(x, 1) for n, x in v.items()})
                    for k, v in row[name].items()
                },
                flush=True,
            )
        res["rounds"].append(row)
json.dump(res, open(os.path.join(out, "mm_inlayer.json"), "w"), indent=1)
