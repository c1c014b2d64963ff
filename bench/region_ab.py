"""In-layer A/B of forced region configs at 2048 tokens, timed paired (the variants' calls in turn, call by call, L2
cleared before each) and profiled per kernel back to back. Variants: QKV (gemm_0) as tuned vs cuBLAS product + our
rotary epilogue (MM) at three epilogue tiles; gate/up (gemm_2) K loop vs MM.

    python bench/region_ab.py OUT llama3_8b,qwen25_7b   (writes OUT/region_ab.json; bench/NOTES.md 156)
    CHAINED=0 python bench/region_ab.py ...             (every variant without programmatic dependent launch,
                                                         `chained_launches=False`: NOTES 158's next step 2)
    ONLY=tuned,gu_kloop,gu_ws3,gu_ws4 python bench/region_ab.py ...   (only these variants; gu_ws3/gu_ws4: gate/up
                                                         on the warp-specialized kernel at 3 or 4 stages, NOTES 160)
"""

import collections
import json
import os
import statistics
import sys

sys.path.insert(0, "bench")
import torch
from blocks import BLOCKS
from profile_kernels import profiled
from run import paired

import dlblas_compiler as dc
from dlblas_compiler.numerics import rel_error
from dlblas_compiler.runtime.steps import RegionStep

out = sys.argv[1]
layers = sys.argv[2].split(",")
CHAINED = os.environ.get("CHAINED", "1") != "0"
ONLY = [n for n in os.environ.get("ONLY", "").split(",") if n]  # (the variants to run; all when empty)
BASE = {
    "SPLIT_K": 1,
    "GROUP_M": 8,
    "num_stages": 2,
    "TMA": 0,
    "MM": 1,
    "NORM_PASS": 1,
    "PERSISTENT": 0,
    "WS": 0,
    "BLOCK_K": 32,
}
MMS = {
    f"mm{bm}x{bn}": {**BASE, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w}
    for bm, bn, w in ((16, 128, 4), (32, 128, 4), (64, 128, 8))
}
KLOOP_GU = {
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


def steps_of(cm):
    p = cm._spec().executor
    return p, {s.choice.region: s for s in p.steps if isinstance(s, RegionStep) and s.kernel is not None}


def per_kernel(fn, calls=20):
    fn()

    def body():
        for _ in range(calls):
            fn()

    d = collections.defaultdict(float)
    for e in profiled(body):
        d[e["name"][:50]] += (e["end"] - e["start"]) / calls
    return {k: round(v, 1) for k, v in d.items()}


res = {}
for layer in layers:
    mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](2048, torch.bfloat16, "cuda")
    with torch.no_grad():
        base = dc.compile(mod, backend="triton", tune="quick", chained_launches=CHAINED)
        ref = base(*args, **kwargs)
        ref = (ref[0] if isinstance(ref, tuple) else ref).clone()
        _, st = steps_of(base)
        tuned = {r: (s.choice.impl, dict(s.choice.config or {}), s.choice.time) for r, s in st.items()}
        print(
            layer,
            "tuned",
            {r: (i, {k: c.get(k) for k in ("BLOCK_M", "BLOCK_N", "MM", "TMA")}, t) for r, (i, c, t) in tuned.items()},
            flush=True,
        )
        variants = {"tuned": {}}
        for name, cfg in MMS.items():
            variants[f"qkv_{name}"] = {"gemm_0": cfg}
        variants["gu_kloop"] = {"gemm_2": KLOOP_GU}
        variants["gu_mm16x128"] = {"gemm_2": MMS["mm16x128"]}
        for stages in (3, 4):
            variants[f"gu_ws{stages}"] = {"gemm_2": {**KLOOP_GU, "WS": 1, "num_stages": stages}}
        if ONLY:
            variants = {n: v for n, v in variants.items() if n in ONLY}
        fns, names, errs = [], [], {}
        mods = []
        for name, forced in variants.items():
            cm = base if name == "tuned" else dc.compile(mod, backend="triton", tune="quick", chained_launches=CHAINED)
            try:
                cm(*args, **kwargs)
                p, st = steps_of(cm)
                for r, cfg in forced.items():
                    st[r].choice.impl, st[r].choice.config = "kernel", cfg
                p.graph = None
                o = cm(*args, **kwargs)
                o = o[0] if isinstance(o, tuple) else o
                errs[name] = rel_error(o.double(), ref.double())
            except Exception as e:  # noqa
                print(name, "failed", type(e).__name__, str(e)[:300], flush=True)
                continue
            mods.append(cm)
            names.append(name)
            fns.append(lambda cm=cm, a=args, k=kwargs: cm(*a, **k))
        for f in fns:
            for _ in range(3):
                f()
        ran = {n: {r: steps_of(cm)[1][r].choice.impl for r in variants[n]} for n, cm in zip(names, mods)}
        times = paired(fns, 80)
        med = {n: statistics.median(t) for n, t in zip(names, times)}
        ratio = {n: statistics.median(a / b for a, b in zip(t, times[0])) for n, t in zip(names, times)}
        kern = {n: per_kernel(f) for n, f in zip(names, fns)}
        res[layer] = {
            "tuned": tuned,
            "median_us": med,
            "per_turn_vs_tuned": ratio,
            "rel_err": errs,
            "kernels": kern,
            "ran": ran,
        }
        for n in names:
            print(
                f"  {n:14s} {med[n]:8.1f} us  x{ratio[n]:.3f} vs tuned  err {errs[n]:.2e} {ran[n]} {kern[n]}",
                flush=True,
            )
        del mods, fns, base
        torch.cuda.empty_cache()
json.dump(res, open(os.path.join(out, "region_ab.json" if CHAINED else "region_ab_unchained.json"), "w"), indent=1)
