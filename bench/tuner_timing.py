"""What the tuner's timing ranks, against how the model's graph runs the same kernels (bench/NOTES.md 108).

    python bench/tuner_timing.py --out OUT [--layers phi3_mini,llama3_8b] [--configs 10]

For each decoder layer of bench/blocks.HF_LAYERS at M = 1 (decode), compiled with quick tuning, each GEMM region's
tuned config, its default and `--configs` one-row configs sampled from its space are timed four ways:
* `ours`: `tuning.benchmark`, the tuner's measure (GPU time: L2 cleared, the GPU spinning while the host enqueues);
* `dirty`: `triton.testing.do_bench` as called (L2 cleared by writing it, the host's launch path included where
  it outlasts the clear);
* `clean`: L2 cleared by reading a 256 MB buffer, events around each call (the host's path included likewise);
* `chain`: back to back in a CUDA graph over 2n distinct copies of the weight, (t(2n) - t(n)) / n: how the decode
  graph runs the kernel, one layer's weights after another's.
Per region it prints the tuned config's four times and the graph time of each measure's first choice. Writes
OUT/tuner_timing.json (per region: layer, region, N, K, weight_MB, rows of {config, ours, dirty, clean, chain}).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from gemms import operands, region_inputs  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.tuning import benchmark  # noqa: E402

MEASURES = ("ours", "dirty", "clean", "chain")


def clean_us(fn, flush: torch.Tensor, reps: int = 60) -> float:
    """Median µs of fn() with L2 cleared by reading `flush` (no dirty lines left) before each call."""
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush.sum()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2] * 1e3


def chain_us(launch, tensors: list, w_index: int, flush: torch.Tensor, n: int = 8) -> float:
    """µs per call of launch(tensors) back to back in a CUDA graph, each call on its own copy of the weight."""
    copies = []
    for _ in range(2 * n):
        t = list(tensors)
        t[w_index] = tensors[w_index].clone()
        copies.append(t)
    for t in copies[:2]:
        launch(t)
    torch.cuda.synchronize()
    graphs = []
    for k in (n, 2 * n):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for t in copies[:k]:
                launch(t)
        graphs.append(g)
    one, two = (clean_us(g.replay, flush, 30) for g in graphs)
    return (two - one) / n


def sample(space, n: int, seed: int = 0) -> list[dict]:
    """Up to n distinct valid one-row configs of the space (no TMA, no cuBLAS product, not persistent)."""
    rng, found = random.Random(seed), []
    for _ in range(4000):
        c = {k: rng.choice(v) for k, v in space.params.items()}
        c.update(BLOCK_M=1, TMA=0, MM=0, PERSISTENT=0, GROUP_M=1)
        if space.is_valid(c) and c not in found:
            found.append(c)
        if len(found) >= n:
            break
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="phi3_mini,llama3_8b")
    ap.add_argument("--configs", type=int, default=10, help="sampled configs per region (besides tuned and default)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    flush = torch.ones(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    res = []
    for name in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](1, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        with torch.no_grad():
            cm(*args, **kwargs)
            for step, tensors in region_inputs(cm, args, kwargs):
                _, w = operands(step, tensors)
                w_index = next(i for i, t in enumerate(tensors)
                               if isinstance(t, torch.Tensor) and t.data_ptr() == w.data_ptr())  # fmt: skip
                tuned, default = step.choice.config, step.kernel.space.default()
                configs = [tuned] + [default] * (default != tuned)
                configs += [c for c in sample(step.kernel.space, a.configs) if c not in configs]
                compile_configs(step.kernel, step.compiled, tensors, configs)
                rows = []
                for c in configs:
                    def fn(c=c, step=step, tensors=tensors):
                        step.launch(tensors, c)

                    try:
                        rows.append({"config": c, "ours": benchmark(fn, warmup_ms=10, rep_ms=60) * 1e6,
                                     "dirty": triton.testing.do_bench(fn, warmup=10, rep=60) * 1e3,
                                     "clean": clean_us(fn, flush),
                                     "chain": chain_us(lambda t, c=c, s=step: s.launch(t, c), tensors, w_index, flush)})
                    except Exception as e:  # noqa: BLE001 - a config that does not run is left out
                        print(f"  {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                mb = w.numel() * w.element_size() / 1e6
                first = {k: min(rows, key=lambda r, k=k: r[k])["chain"] for k in MEASURES}
                t = rows[0]
                print(f"{name} {step.choice.region} N={w.shape[0]} K={w.shape[1]} {mb:.0f} MB: tuned "
                      + " ".join(f"{k} {t[k]:.1f}" for k in MEASURES) + " | graph µs of the first choice by "
                      + " ".join(f"{k} {first[k]:.1f}" for k in MEASURES), flush=True)  # fmt: skip
                res.append({"layer": name, "region": step.choice.region, "N": w.shape[0], "K": w.shape[1],
                            "weight_MB": mb, "rows": rows})  # fmt: skip
                with open(os.path.join(a.out, "tuner_timing.json"), "w") as f:
                    json.dump(res, f, indent=1, default=str)
        del cm, mod
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
