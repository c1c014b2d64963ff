"""The RMSNorm statistics pass (`row_rms`, run before a GEMM whose epilogue scales its rows) in two launch
geometries, and the row pass (`row_norm`, which also writes the normalized rows) beside them (bench/NOTES.md 178).

    python bench/row_rms.py --out OUT

  steps      the geometry used until the sixty-third session: 4 rows a program, 1024 columns a step, 4 warps
  whole_w8   whole rows of up to 8192 columns at once, 8192 // K_BLOCK rows a program, 8 warps (the row pass's)
  whole_w4   the same with 4 warps
Each launch is captured in a CUDA graph and timed by do_bench (median, L2 cleared before each replay); rs is
compared with torch's in fp32 (largest relative difference). Writes OUT/row_rms.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlblas_compiler.codegen.gemm.norms import row_norm, row_rms  # noqa: E402
from dlblas_compiler.codegen.interpreter import launch  # noqa: E402

SHAPES = [(2048, 4096), (2048, 3072), (2048, 3584), (2048, 5120), (2048, 16384), (128, 4096), (32, 4096), (512, 8192)]
EPS = 1e-6


def forms(x: torch.Tensor, rs: torch.Tensor, y: torch.Tensor) -> dict:
    """Each launch of the pass over x ([M, K]) as a callable: the statistics into rs, the row pass into y."""
    (m, k), dev = x.shape, x.device
    kb = min(8192, triton.next_power_of_2(k))
    rows = max(1, 8192 // kb)
    whole = dict(K_BLOCK=kb, ROWS=rows)
    return {
        "steps": lambda: launch(row_rms, (triton.cdiv(m, 4),), dev, x, rs, m, k, EPS, K_BLOCK=min(1024, kb), ROWS=4),
        "whole_w8": lambda: launch(row_rms, (triton.cdiv(m, rows),), dev, x, rs, m, k, EPS, **whole, num_warps=8),
        "whole_w4": lambda: launch(row_rms, (triton.cdiv(m, rows),), dev, x, rs, m, k, EPS, **whole, num_warps=4),
        "row_norm": lambda: launch(row_norm, (triton.cdiv(m, rows),), dev, x, x, y, m, k, EPS, 0.0, HAS_W=False,
                                   SCALE_F32=False, **whole, ONE_PASS=kb >= k, num_warps=8),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        rs = torch.empty(m, device="cuda", dtype=torch.float32)
        y = torch.empty_like(x)
        want = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
        row = {"M": m, "K": k}
        for name, f in forms(x, rs, y).items():
            rs.zero_()
            f()
            torch.cuda.synchronize()
            if name != "row_norm":
                row[name + "_maxrel"] = ((rs - want).abs() / want).max().item()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                f()
            row[name] = triton.testing.do_bench(g.replay, warmup=25, rep=200) * 1e3
        res["rows"].append(row)
        times = "  ".join(f"{n} {row[n]:.1f} µs" for n in ("steps", "whole_w8", "whole_w4", "row_norm"))
        print(f"M={m} K={k}: {times}", flush=True)
        with open(os.path.join(a.out, "row_rms.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
