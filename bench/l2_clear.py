"""How the L2 clear before each timed call moves decode-sized timings (bench/NOTES.md 164).

`triton.testing.do_bench`, the tuner (`tuning.profiler`) and bench/run.py clear L2 before each call by writing
zeros over a 256 MB buffer: the call then starts with L2 full of dirty lines, which are written back to memory
while it streams its own reads. A long GEMM hides that; a decode GEMV of 20-60 MB does not. In a model, the
kernel before a decode GEMM has read its own weights: L2 holds clean lines. This times each call three ways:

  dirty   after the zero-fill of 256 MB (what do_bench does)
  clean   after a read of 256 MB (`sum`): L2 holds other data, none of it dirty
  warm    after nothing (the call's own data may still be in L2 from the call before: a lower bound)

    python bench/l2_clear.py --out OUT [--layers llama3_8b,...] [--tokens 1] [--torch-modes max-autotune]
                             [--torch-layers mistral_nemo_12b]

For each layer (bench/blocks.HF_LAYERS, random weights, bf16; ours with quick tuning, called through its CUDA
graph): the layer's call, and each GEMM region's launch at its tuned config replayed from a CUDA graph, with its
weight's bytes and the copy bandwidth of the card (bench/ceilings.py, measured first) for the fraction of it
reached; `--torch-modes` on `--torch-layers`: those torch.compile modes' calls too. Medians of 100 calls each,
the three clears in turn call by call. Writes OUT/l2_clear.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from ceilings import measure as measure_ceilings  # noqa: E402
from gemms import operands, region_inputs  # noqa: E402
from run import graphed  # noqa: E402

import dlblas_compiler as dc  # noqa: E402

CLEARS = ("dirty", "clean", "warm")


def timed(fn, calls: int = 100) -> dict[str, float]:
    """Median µs of `fn` after each kind of clear, the kinds in turn call by call."""
    buf = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    total = torch.empty((), dtype=torch.int64, device="cuda")
    clear = {"dirty": buf.zero_, "clean": lambda: torch.sum(buf, dim=0, out=total), "warm": lambda: None}
    events = {c: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
              for c in CLEARS}  # fmt: skip
    fn()
    torch.cuda.synchronize()
    for i in range(calls):
        for c in CLEARS[i % 3:] + CLEARS[: i % 3]:
            clear[c]()
            start, end = events[c][i]
            start.record()
            fn()
            end.record()
    torch.cuda.synchronize()
    return {c: statistics.median(s.elapsed_time(e) * 1e3 for s, e in events[c]) for c in CLEARS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b,gemma_7b,llama32_3b,mistral_nemo_12b")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--torch-modes", default="")
    ap.add_argument("--torch-layers", default="")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ceil = measure_ceilings()
    bw = ceil["copy_bytes_per_s"]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "tokens": a.tokens, "ceilings": ceil, "layers": []}  # fmt: skip
    for layer in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](a.tokens, torch.bfloat16, "cuda")
        entry = {"layer": layer, "modes": {}, "regions": []}
        with torch.no_grad():
            cm = dc.compile(mod, backend="triton", tune="quick")
            cm(*args, **kwargs)
            entry["modes"]["ours"] = timed(functools.partial(cm, *args, **kwargs))
            for step, tensors in region_inputs(cm, args, kwargs):
                _, w = operands(step, tensors)
                g = graphed(lambda s=step, t=tensors: s.launch(t, s.choice.config))
                t = timed(g.replay)
                nbytes = w.numel() * w.element_size()
                entry["regions"].append({"region": step.choice.region, "shape": dict(step.kernel.shape_key),
                                         "config": step.choice.config, "weight_bytes": nbytes, "us": t,
                                         "of_copy_bw": {c: nbytes / (t[c] * 1e-6) / bw for c in CLEARS}})  # fmt: skip
                del g
            if layer in a.torch_layers.split(","):
                for mode in (m for m in a.torch_modes.split(",") if m):
                    fn = torch.compile(mod, mode=None if mode == "inductor" else mode, dynamic=False)
                    fn(*args, **kwargs)
                    entry["modes"][mode] = timed(functools.partial(fn, *args, **kwargs))
        for mode, t in entry["modes"].items():
            print(f"{layer} M={a.tokens} {mode:13s} " + "  ".join(f"{c} {t[c]:7.1f} µs" for c in CLEARS), flush=True)
        for r in entry["regions"]:
            print(f"  {r['region']:8s} {r['weight_bytes'] / 1e6:6.1f} MB  " + "  ".join(
                f"{c} {r['us'][c]:6.1f} µs ({r['of_copy_bw'][c]:.0%})" for c in CLEARS), flush=True)
        res["layers"].append(entry)
        with open(os.path.join(a.out, "l2_clear.json"), "w") as f:
            json.dump(res, f, indent=1)
        del cm, mod
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
