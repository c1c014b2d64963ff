"""Layer call time with gate/up forced to the K-loop kernel or the cuBLAS-product (MM) config, and down to our
kernel or cuBLAS + torch's add: which the tuner's choice costs the Llama-3-8B layer at 2048 (one process).

    python bench/gateup_ab.py OUT   (writes OUT/ab_gateup.json; bench/NOTES.md 155-156)
"""

import json
import os
import statistics
import sys

sys.path.insert(0, "bench")
import torch
from blocks import BLOCKS
from triton.testing import do_bench

import dlblas_compiler as dc
from dlblas_compiler.runtime.steps import RegionStep

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
DOWN_K = {
    "BLOCK_M": 128,
    "BLOCK_N": 256,
    "BLOCK_K": 64,
    "SPLIT_K": 1,
    "GROUP_M": 8,
    "num_warps": 8,
    "num_stages": 3,
    "TMA": 1,
    "MM": 0,
    "NORM_PASS": 0,
    "PERSISTENT": 1,
    "WS": 0,
}
mod, args, kwargs, _, _ = BLOCKS["layer_llama3_8b"](2048, torch.bfloat16, "cuda")
res = {}
with torch.no_grad():
    cm = dc.compile(mod, backend="triton", tune="quick")
    for _ in range(3):
        cm(*args, **kwargs)
    p = cm._spec().executor
    steps = [s for s in p.steps if isinstance(s, RegionStep) and s.kernel is not None]
    gu = next(s for s in steps if s.choice.region == "gemm_2")
    dn = next(s for s in steps if s.choice.region == "gemm_3")
    res["tuned"] = {
        "gate_up": [gu.choice.impl, gu.choice.config, gu.choice.time],
        "down": [dn.choice.impl, dn.choice.config, dn.choice.time, dn.choice.reference_time],
    }
    print(res["tuned"], flush=True)
    ways = {
        "kloop+down_kernel": (KLOOP, ("kernel", DOWN_K)),
        "mm+down_kernel": (MM, ("kernel", DOWN_K)),
        "kloop+down_ref": (KLOOP, ("reference", DOWN_K)),
        "mm+down_ref": (MM, ("reference", DOWN_K)),
    }
    times = {w: [] for w in ways}
    for r in range(4):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for w in order:
            g, (dimpl, dcfg) = ways[w]
            gu.choice.impl, gu.choice.config = "kernel", g
            dn.choice.impl, dn.choice.config = dimpl, dcfg
            p.graph = None
            for _ in range(3):
                cm(*args, **kwargs)
            times[w].append(do_bench(lambda: cm(*args, **kwargs), warmup=25, rep=100) * 1e3)
    res["times"] = times
    res["medians"] = {w: statistics.median(t) for w, t in times.items()}
    print(json.dumps(res["medians"]), flush=True)
json.dump(res, open(os.path.join(sys.argv[1], "ab_gateup.json"), "w"), indent=1)
