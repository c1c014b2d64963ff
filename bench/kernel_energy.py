"""Energy a call of each GEMM region of a layer, ours against cuBLAS's plain product of the same shape, at the card's
power limit (bench/NOTES.md 156: a layer at 2048 tokens holds an H200 at its 700 W limit, where a call's time is
its energy over the limit).

    python bench/kernel_energy.py --out OUT [--layers llama3_8b,qwen25_7b] [--tokens 2048] [--seconds 1.5]

Each layer (bench/blocks.HF_LAYERS) is compiled with quick tuning; each GEMM region's inputs are taken from one call
and its tuned config launched alone (`RegionStep.launch`); beside it `torch.matmul` of random operands of the same
M, K and N (cuBLAS: the product alone, no prologue or epilogue). Each is captured as a CUDA graph of 10 calls and
replayed back to back for `--seconds`, ours and cuBLAS in turn, three rounds, with nvidia-smi sampling the SM clock
and the power every 100 ms. Per phase: µs a call (events), median power and clock; energy a call = power x time.
Writes OUT/kernel_energy.json (first run: the fifty-second session, bench/NOTES.md 157).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from smi import Smi  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.runtime.steps import RegionStep  # noqa: E402

REPS = 10  # calls per graph replay


def region_inputs(cm, call) -> dict[str, tuple[RegionStep, list]]:
    """Each GEMM region that runs our kernel, with the tensors one call hands its launch."""
    steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None
             and s.choice.impl == "kernel" and s.choice.region.startswith("gemm")]  # fmt: skip
    seen: dict[str, tuple[RegionStep, list]] = {}
    for s in steps:
        orig = s.launch

        def spy(tensors, config, s=s, orig=orig):
            seen.setdefault(s.choice.region, (s, list(tensors)))
            return orig(tensors, config)

        s.launch = spy
    program = cm._spec().executor
    program.graph, program.cuda_graphs = None, False  # (a direct run: every launch goes through the spies)
    call()
    for s in steps:
        del s.launch
    return seen


def graphed(fn) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    return g


def sustained(g: torch.cuda.CUDAGraph, seconds: float) -> float:
    """µs a call over `seconds` of back-to-back replays."""
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.perf_counter()
    a.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            g.replay()
        n += 8
        torch.cuda.synchronize()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (n * REPS)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="llama3_8b,qwen25_7b")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--seconds", type=float, default=1.5)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tokens": a.tokens, "regions": []}
    smi = Smi(os.path.join(a.out, "kernel_energy_smi.csv"))
    with torch.no_grad():
        for layer in a.layers.split(","):
            mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](a.tokens, torch.bfloat16, "cuda")
            cm = dc.compile(mod, backend="triton", tune="quick")
            call = lambda cm=cm, x=args, k=kwargs: cm(*x, **k)  # noqa: E731
            call()
            for region, (step, tensors) in region_inputs(cm, call).items():
                cfg = step.choice.config
                key = step.kernel.shape_key  # (K, N a stream, streams; M bucketed: the rows are the call's)
                k, n = key["K"], key["N"] * key.get("streams", 1)  # (a dual GEMM's product is both streams wide)
                m = next(t.numel() // k for t in tensors if isinstance(t, torch.Tensor) and t.shape[-1] == k)
                x2 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                w2 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                ways = {"ours": graphed(lambda s=step, t=tensors, c=cfg: s.launch(t, c)),
                        "cublas": graphed(lambda x=x2, y=w2: torch.matmul(x, y.t()))}  # fmt: skip
                rows = {name: [] for name in ways}
                for r in range(3):
                    for name in ways if r % 2 == 0 else reversed(list(ways)):
                        with smi.phase(f"{layer}/{region}/{name}/{r}"):
                            rows[name].append({"us": sustained(ways[name], a.seconds)})
                res["regions"].append({"layer": layer, "region": region, "M": m, "K": k, "N": n, "config": cfg,
                                       "flops": 2.0 * m * k * n, "rows": rows})  # fmt: skip
                del ways
            del cm
            torch.cuda.empty_cache()
    phases = smi.stop()
    for reg in res["regions"]:
        for name, rows in reg["rows"].items():
            for r, row in enumerate(rows):
                row.update(phases.get(f"{reg['layer']}/{reg['region']}/{name}/{r}", {}))
                if "power_w_median" in row:
                    row["mj_per_call"] = row["power_w_median"] * row["us"] * 1e-3
        for name, rows in reg["rows"].items():
            us = statistics.median(r["us"] for r in rows)
            mj = [r["mj_per_call"] for r in rows if "mj_per_call" in r]
            print(f"{reg['layer']:12s} {reg['region']:7s} {name:6s} {us:8.1f} us  "
                  f"{(statistics.median(mj) if mj else float('nan')):7.3f} mJ  "
                  f"{reg['flops'] / us / 1e6:6.1f} TFLOP/s", flush=True)  # fmt: skip
    with open(os.path.join(a.out, "kernel_energy.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
