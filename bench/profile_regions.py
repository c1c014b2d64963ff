"""Launch a decoder layer's GEMM regions under given configs, and cuBLAS on the same operands, inside NVTX ranges
named "prof", for Nsight Compute to profile exactly those launches:

    ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight ... \\
        python bench/profile_regions.py --layer qwen25_7b [--tokens 2048] [--with-op dl.rotary] [--configs JSON]

The layer of bench/blocks.HF_LAYERS is compiled (tune "none") and called once; then each GEMM region's kernel is
launched once per config (JSON list; default: the tuned default config) after a warm-up launch outside the ranges,
then `torch.matmul` of the region's operands ([M, K] x [K, N·streams]). The launches print in order, so the
profiler's kernels can be matched to them (a config with MM runs the norm pass, cuBLAS and the epilogue kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from gemms import operands, region_inputs  # noqa: E402

import dlblas_compiler as dc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="qwen25_7b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--with-op", default="", help="only the regions with this op (e.g. dl.rotary)")
    ap.add_argument("--configs", default="", help="a JSON list of configs (default: each region's default)")
    a = ap.parse_args()
    mod, args, kwargs, _, _ = BLOCKS[f"layer_{a.layer}"](a.tokens, torch.bfloat16, "cuda")
    cm = dc.compile(mod, backend="triton", tune="none", cuda_graphs=False)
    with torch.no_grad():
        cm(*args, **kwargs)
        for step, tensors in region_inputs(cm, args, kwargs):
            if a.with_op and a.with_op not in {o.name for o in step.kernel.region.body_ops}:
                continue
            configs = json.loads(a.configs) if a.configs else [step.kernel.space.default()]
            for c in configs:
                if not step.kernel.space.is_valid(c):
                    print(f"{step.choice.region}: not valid here, skipped: {c}", flush=True)
                    continue
                step.launch(tensors, c)  # (compiles; outside the profiled ranges)
                torch.cuda.synchronize()
                print(f"PROFILED {step.choice.region} kernel {c}", flush=True)
                torch.cuda.nvtx.range_push("prof")
                step.launch(tensors, c)
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
            x, w = operands(step, tensors)
            out = torch.matmul(x, w.t())
            torch.cuda.synchronize()
            print(f"PROFILED {step.choice.region} cuBLAS {tuple(x.shape)} x {tuple(w.t().shape)}", flush=True)
            torch.cuda.nvtx.range_push("prof")
            torch.matmul(x, w.t(), out=out)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
