"""What deciding near-ties in the program buys (`runtime.in_context`, bench/NOTES.md 159). Each layer at 2048
tokens is compiled and tuned afresh (an empty tuning cache of its own) with the round on; a second compile of the
same layer (its choices from that cache) then has every region the round changed put back on the choice measured
fastest alone, and the two programs' CUDA graphs are timed paired (`profiler.paired`, calls in turn).

    python bench/in_context_ab.py OUT llama3_8b,qwen25_7b   (writes OUT/in_context_ab.json)
"""

import json
import logging
import os
import statistics
import sys
import tempfile

sys.path.insert(0, "bench")
import torch
from blocks import BLOCKS

import dlblas_compiler as dc
from dlblas_compiler.numerics import rel_error
from dlblas_compiler.runtime import in_context
from dlblas_compiler.runtime.steps import RegionStep
from dlblas_compiler.tuning import profiler

out_dir, layers = sys.argv[1], sys.argv[2].split(",")
TOKENS, TURNS = int(os.environ.get("TOKENS", "2048")), int(os.environ.get("TURNS", "100"))
logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("dlblas_compiler.tuning").setLevel(logging.INFO)

changes: list = []  # (the group's region names, its choice before the round: impl, config)
persist = in_context._persist


def recording(g, start, *a):
    changes.append(([m.choice.region for m in g.members], start))
    return persist(g, start, *a)


in_context._persist = recording


def regions(cm):
    p = cm._spec().executor
    return p, {s.choice.region: s for s in p.steps if isinstance(s, RegionStep) and s.kernel is not None}


def output(cm, args, kwargs):
    o = cm(*args, **kwargs)
    return (o[0] if isinstance(o, tuple) else o).clone()


res = {}
for layer in layers:
    os.environ["DLBLAS_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"ctx-{layer}-")
    changes.clear()
    mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](TOKENS, torch.bfloat16, "cuda")
    with torch.no_grad():
        ctx = dc.compile(mod, backend="triton", tune="quick")
        output(ctx, args, kwargs)  # (tunes; the round runs at the end of this call)
        _, st = regions(ctx)
        chosen = {r: (s.choice.impl, s.choice.config, s.choice.reason) for r, s in st.items()}
        row = {"chosen": chosen, "changed": [list(c) for c in changes]}
        print(layer, "changed by the round:", changes or "nothing", flush=True)
        if changes:
            alone = dc.compile(mod, backend="triton", tune="quick")
            output(alone, args, kwargs)
            p, st2 = regions(alone)
            for names, (impl, config) in changes:
                for r in names:
                    st2[r].choice.impl, st2[r].choice.config = impl, dict(config)
            p.graph = None
            fns = [lambda cm=cm: cm(*args, **kwargs) for cm in (alone, ctx)]
            for f in fns:
                for _ in range(3):
                    f()
            a, b = output(alone, args, kwargs), output(ctx, args, kwargs)
            times = profiler.paired(fns, TURNS)
            med = [statistics.median(t) * 1e6 for t in times]
            ratio = statistics.median(y / x for x, y in zip(times[0], times[1], strict=True))
            row.update(alone_us=med[0], in_context_us=med[1], per_turn_ratio=ratio,
                       rel_err_between=rel_error(b.double(), a.double()))
            print(f"  alone {med[0]:8.1f} us  in context {med[1]:8.1f} us  per-turn ratio x{ratio:.4f}", flush=True)
            del alone
        res[layer] = row
        del ctx
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(out_dir, "in_context_ab.json"), "w"), indent=1, default=str)  # (each layer)
