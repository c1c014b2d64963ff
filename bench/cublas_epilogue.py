"""Does cuBLAS add a residual for free? For the plain GEMM regions of issue 19's five layers (o-proj+residual,
down+residual) at M tokens: `torch.matmul` of the bare product against `torch.addmm(residual, x, W^T)` (cuBLAS
reads the residual as C, beta = 1, in its epilogue), against the same addmm written into the residual itself
(`out=residual`: torch then skips the copy of C into the output it makes otherwise, and cuBLAS's epilogue adds C
in place) and against the product followed by torch's add (two kernels). Each replayed from a CUDA graph,
do_bench median with L2 cleared, all in one process on one card.

    python bench/cublas_epilogue.py --out OUT [--tokens 2048] [--layers ...]

Writes OUT/cublas_epilogue.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blocks import HF_LAYERS, hf_layer_dims  # noqa: E402
from gemms import graph_time_us  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="2048")
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b,gemma_7b,llama32_3b,mistral_nemo_12b")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    g = torch.Generator("cuda").manual_seed(0)
    for m in map(int, args.tokens.split(",")):
        for name in args.layers.split(","):
            d = hf_layer_dims(name)
            for region, n, k in (("o-proj+residual", d["H"], d["HQ"] * d["D"]), ("down+residual", d["H"], d["I"])):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
                r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                ref = x.double() @ w.double().t() + r.double()
                mm = graph_time_us(lambda: torch.matmul(x, w.t(), out=out))
                addmm = graph_time_us(lambda: torch.addmm(r, x, w.t(), out=out))
                two = graph_time_us(lambda: torch.add(torch.matmul(x, w.t()), r, out=out))
                acc = r.clone()  # (each replay adds the product to it again: the values grow, the work is the same)
                inplace = graph_time_us(lambda: torch.addmm(acc, x, w.t(), out=acc))
                c = r.clone()
                err_in = ((torch.addmm(c, x, w.t(), out=c).double() - ref).norm() / ref.norm()).item()
                err = ((torch.addmm(r, x, w.t()).double() - ref).norm() / ref.norm()).item()
                err_two = ((torch.matmul(x, w.t()) + r).double() - ref).norm().item() / ref.norm().item()
                row = {"layer": name, "region": region, "M": m, "N": n, "K": k, "mm_us": mm, "addmm_us": addmm,
                       "mm_then_add_us": two, "addmm_inplace_us": inplace, "addmm_rel_err": err,
                       "addmm_inplace_rel_err": err_in, "mm_then_add_rel_err": err_two}
                rows.append(row)
                print(f"{name:18s} {region:16s} {m}x{n}x{k}: mm {mm:7.1f}  addmm {addmm:7.1f} ({mm / addmm:.3f}x)  "
                      f"mm+add {two:7.1f}  in place {inplace:7.1f} ({mm / inplace:.3f}x)  "
                      f"err {err:.1e} / {err_two:.1e} / {err_in:.1e}", flush=True)
    with open(os.path.join(args.out, "cublas_epilogue.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
