"""Attention at head dims the template took only from the twenty-second session on: DeepSeek-V3's latent
attention (128 heads, q/k 192 = pieces of 128 + 64, v 128) and Phi-3-mini's (32 heads of 96 = 64 + 32), beside
Llama-3-8B's (GQA 32/8 heads of 128) as the control, at prefill (causal, 128 and 2048 tokens) and one decode token
over a 2048-slot static cache (a boolean mask keeping the first 2011 slots), bf16.

    python bench/attention_dims.py --out OUT [--tag new] [--cases deepseek_v3:2048,phi3_mini:1,...]

Per case: our kernel (the region compiled with `tune="quick"` and `prefer_kernels`, its tuned config launched
alone), torch's SDPA as the compiled region's reference runs it (no backend forced: what torch picks), and each
SDPA backend forced in turn (flash, efficient, cuDNN; math is not timed), or why it refused. Times: median of
`triton.testing.do_bench` (L2 flushed between calls). Errors against SDPA in float32 over the same bf16 inputs.
Writes OUT/attention_dims_<tag>.json; run it from two source trees to compare them in one device call (a case
the tree's template refuses is recorded with the reason).
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
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402
from dlblas_compiler.runtime.steps import RegionStep  # noqa: E402

# query heads, kv heads, q/k head dim, v head dim
MODELS = {"deepseek_v3": (128, 128, 192, 128), "phi3_mini": (32, 32, 96, 96), "llama3_8b": (32, 8, 128, 128)}
CASES = [f"{m}:{s}" for m in MODELS for s in (2048, 128, 1)]
CACHE, VALID = 2048, 2011  # decode: a static cache of CACHE slots, the first VALID attended to
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}  # fmt: skip
DEVICE, BACKEND = "cuda", "triton"  # (a CPU smoke test sets "cpu", "interpret")


class Attend(torch.nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=True)


def inputs(model: str, s: int):
    hq, hk, d, dv = MODELS[model]
    l_ = s if s > 16 else CACHE
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q = torch.randn(1, hq, s, d, device=DEVICE, generator=g).bfloat16()
    k = torch.randn(1, hk, l_, d, device=DEVICE, generator=g).bfloat16()
    v = torch.randn(1, hk, l_, dv, device=DEVICE, generator=g).bfloat16()
    if s > 16:
        return Attend(causal=True), (q, k, v), 2.0 * hq * s * l_ * (d + dv) / 2
    mask = (torch.arange(l_, device=DEVICE) < VALID).expand(1, 1, s, l_)
    return Attend(causal=False), (q, k, v, mask), 2.0 * hq * s * VALID * (d + dv)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # µs


def run_case(case: str) -> dict:
    model, s = case.split(":")
    s = int(s)
    module, args, flops = inputs(model, s)
    hq, hk, d, dv = MODELS[model]
    row = {"case": case, "model": model, "S": s, "L": args[1].shape[2], "HQ": hq, "HK": hk, "D": d, "DV": dv,
           "flops": flops}  # fmt: skip
    with torch.no_grad():
        truth = module(*(t.float() if t.is_floating_point() else t for t in args))
        t0 = time.perf_counter()
        cm = dc.compile(module, backend=BACKEND, tune="quick", prefer_kernels=True, cuda_graphs=False)
        out = cm(*args)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        row["compile_s"] = time.perf_counter() - t0
        steps = [x for x in cm._spec().executor.steps if isinstance(x, RegionStep)]
        if steps and steps[0].choice.impl == "kernel":
            step = steps[0]
            row["config"] = step.choice.config
            row["ours_err"] = rel_error(out.float(), truth)
            row["ours_us"] = bench(lambda: step.launch(list(args), step.choice.config))
        else:
            notes = str(cm.report())
            row["ours_refused"] = next((ln.strip() for ln in notes.splitlines() if "not fused" in ln), "no region")
        row["sdpa_us"] = bench(lambda: module(*args))
        row["sdpa_err"] = rel_error(module(*args).float(), truth)
        for name, backend in BACKENDS.items():
            try:
                with sdpa_kernel([backend]):
                    module(*args)
                    row[f"{name}_us"] = bench(lambda: module(*args))
            except RuntimeError as e:
                row[f"{name}_refused"] = str(e).strip().splitlines()[0][:160]
    return row


SWEEP = {"BLOCK_M": [64, 128], "BLOCK_N": [64, 128], "num_warps": [4, 8], "num_stages": [2, 3]}


def sweep_case(case: str) -> dict:
    """A prefill case's kernel at every config of SWEEP, inside its search space or not (`in_space`): time and
    error against SDPA in float32, or why the config failed (out of shared memory, registers)."""
    import itertools

    model, s = case.split(":")
    module, args, flops = inputs(model, int(s))
    with torch.no_grad():
        truth = module(*(t.float() if t.is_floating_point() else t for t in args))
        cm = dc.compile(module, backend=BACKEND, tune="none", prefer_kernels=True, cuda_graphs=False)
        cm(*args)
        (step,) = [x for x in cm._spec().executor.steps if isinstance(x, RegionStep)]
        rows = []
        for values in itertools.product(*SWEEP.values()):
            config = dict(zip(SWEEP, values, strict=True))
            row = {"config": config, "in_space": step.kernel.space.is_valid(config)}
            try:
                (out,) = step.launch(list(args), config)
                row["err"] = rel_error(out.float(), truth)
                row["us"] = bench(lambda c=config: step.launch(list(args), c))
            except Exception as e:  # noqa: BLE001 - recorded: what the card refused
                row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
            print(case, row, flush=True)
    return {"case": case, "flops": flops, "default": step.kernel.space.default(), "configs": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--tag", default="new")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--sweep", action="store_true", help="prefill cases: every config of SWEEP (sweep_case)")
    a = ap.parse_args()
    rows = []
    if a.sweep:
        doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": time.strftime("%Y-%m-%d"), "tag": a.tag, "sweeps": [sweep_case(c) for c in a.cases.split(",")]}
        with open(os.path.join(a.out, f"attention_sweep_{a.tag}.json"), "w") as f:
            json.dump(doc, f, indent=1)
        return
    for case in a.cases.split(","):
        try:
            rows.append(run_case(case))
        except Exception as e:  # noqa: BLE001 - a failing case is recorded, the others still run
            rows.append({"case": case, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
        r = rows[-1]
        print(case, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "case"}, flush=True)
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    doc = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
           "tag": a.tag, "rows": rows}  # fmt: skip
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"attention_dims_{a.tag}.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
