"""Masked prefill attention (NOTES 197, 198): every config of the kernel's search space, on masks as models build
them, beside the causal kernel (no mask, `is_causal`) on the same shapes and torch's SDPA. Where the tree's
space has a choice of how dropped tiles are skipped (the seventy-fifth session's MASK_BLOCKS: a branch per tile
or lists of kept tiles; the seventy-fourth's MASK_RANGE), the best config of each value too.

    python bench/mask_tiles.py --out OUT [--cases nanogpt:2048,window:2048,padded:2048]

Cases (bf16): `nanogpt` (16 heads of 64, a materialized lower-triangular boolean mask broadcast over batch and
heads, as nanoGPT's `bias == 0` gives), `window` (32 heads of 128, a causal sliding window of 512 keys, as HF
builds Mistral's), `padded` (2 sequences of 16 heads of 64, causal, the second's first 300 keys padding, HF's
left-padded batch). Per config: median GPU time (L2 cleared, the host's launch path hidden; `bench` below), the
error against a float32 SDPA of the same inputs, or why it failed (shared memory: Triton's "Required" bytes against
the space's estimate). The best masked and causal configs' kernels are timed one by one by torch.profiler
(`best_*_kernels`, mean µs a launch, no L2 clear). Writes OUT/mask_tiles.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402
from dlblas_compiler.runtime.steps import RegionStep  # noqa: E402
from dlblas_compiler.tuning.profiler import benchmark  # noqa: E402

sys.path.insert(0, HERE)
from attention_dims import Attend  # noqa: E402
from flashnorm import kernel_times  # noqa: E402

DEVICE, BACKEND = "cuda", "triton"  # (a CPU smoke test sets "cpu", "interpret")


def inputs(case: str):
    name, s = case.split(":")
    s = int(s)
    b, h, d = {"nanogpt": (1, 16, 64), "window": (1, 32, 128), "padded": (2, 16, 64)}[name]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device=DEVICE, generator=g).bfloat16() for _ in range(3))
    i, j = torch.arange(s, device=DEVICE)[:, None], torch.arange(s, device=DEVICE)[None, :]
    mask = (j <= i)[None, None]
    if name == "window":
        mask = mask & (j > i - 512)
    if name == "padded":
        pad = torch.tensor([0, 300], device=DEVICE)[:, None, None, None]
        mask = mask & (j >= pad)
    kept = int(mask.expand(b, h, s, s).sum())
    return (q, k, v), mask, 2.0 * kept * 2 * d


def bench(fn) -> float:
    """Median GPU µs of a call, L2 cleared before each, with the host's launch path hidden as the tuner hides it
    (`tuning.profiler.benchmark`): the masked launch enqueues three kernels and their lists' buffers, and
    `do_bench` timed that host path (NOTES 199)."""
    if DEVICE != "cuda":
        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3
    return benchmark(fn, warmup_ms=10, rep_ms=40, device=DEVICE) * 1e6


def sweep(module, args, truth, limit: int | None = None) -> dict:
    cm = dc.compile(module, backend=BACKEND, tune="none", prefer_kernels=True, cuda_graphs=False)
    cm(*args)
    (step,) = [x for x in cm._spec().executor.steps if isinstance(x, RegionStep)]
    space = step.kernel.space
    configs = list(space.configs())[:limit]
    if DEVICE == "cuda":  # (in parallel, before any is timed)
        compile_configs(step.kernel, step.compiled, list(args), configs)
    rows = []
    for config in configs:
        row = {"config": config}
        try:
            (out,) = step.launch(list(args), config)
            row["err"] = rel_error(out.float(), truth)
            row["us"] = bench(lambda c=config: step.launch(list(args), c))
        except Exception as e:  # noqa: BLE001 - recorded: what the card refused
            row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
    return {"default": space.default(), "configs": rows, "step": step}


def best(rows: list, **fixed) -> dict | None:
    ok = [r for r in rows if "us" in r and r["err"] < 2e-2 and all(r["config"].get(k) == v for k, v in fixed.items())]
    return min(ok, key=lambda r: r["us"]) if ok else None


def run_case(case: str) -> dict:
    (q, k, v), mask, flops = inputs(case)
    out = {"case": case, "shape": list(q.shape), "flops": flops}
    with torch.no_grad():
        truth = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        masked = sweep(Attend(False), (q, k, v, mask), truth)
        out["masked"] = masked
        knob = next((k for k in ("MASK_BLOCKS", "MASK_RANGE") if k in masked["default"]), None)  # (earlier trees)
        for value in (0, 1) if knob else ():
            out[f"best_{knob.lower()}_{value}"] = best(masked["configs"], **{knob: value})
        out["best_masked"] = best(masked["configs"])
        if DEVICE == "cuda" and out["best_masked"]:  # each kernel of the best config's launch, by the profiler
            step, c = masked["step"], out["best_masked"]["config"]
            out["best_masked_kernels"] = kernel_times(step, [q, k, v, mask], c)
            out["best_masked_do_bench_us"] = triton.testing.do_bench(  # the host path included, as before NOTES 199
                lambda: step.launch([q, k, v, mask], c), warmup=10, rep=40, return_mode="median") * 1e3
        masked.pop("step", None)
        bad = [r for r in masked["configs"] if "us" in r and r["err"] >= 2e-2]
        out["wrong"] = bad
        out["failed"] = [r for r in masked["configs"] if "failed" in r]
        out["sdpa_masked_us"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        if not case.startswith("window"):  # the same work without a mask tensor: the causal kernel and flash
            ctruth = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
            causal = sweep(Attend(True), (q, k, v), ctruth)
            out["best_causal"] = best(causal["configs"])
            if DEVICE == "cuda" and out["best_causal"]:
                out["best_causal_kernels"] = kernel_times(causal["step"], [q, k, v], out["best_causal"]["config"])
            out["sdpa_causal_us"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--cases", default="nanogpt:2048,window:2048,padded:2048")
    a = ap.parse_args()
    cases = []
    for case in a.cases.split(","):
        t0 = time.perf_counter()
        r = run_case(case)
        cases.append(r)
        short = {k: r[k] for k in r if k.startswith(("best", "sdpa"))}
        print(case, f"{time.perf_counter() - t0:.0f}s", json.dumps(short), f"wrong {len(r['wrong'])}",
              f"failed {[x['failed'][:90] for x in r['failed']]}", flush=True)
    doc = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"), "cases": cases}  # fmt: skip
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "mask_tiles.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
