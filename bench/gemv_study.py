"""Decode (M = 1) GEMM regions against cuBLAS, timed as the decode graph runs them, over a wide set of configs:
does the GEMM template's space hold a kernel at >= 90% of copy bandwidth (issue 19's decode goal), and does the
quick search find it? (bench/NOTES.md 115)

    python bench/gemv_study.py --out OUT [--layers phi3_mini,llama3_8b] [--configs 40]

For each GEMM region of the layer at M = 1 (compiled with quick tuning): the tuned config, the default and up to
`--configs` configs drawn from two families — one-row CUDA-core tiles (BLOCK_M = 1: BLOCK_N 16-64, BLOCK_K
128-512, split-K 1-4, 4/8 warps, 2 stages: more compile to the same code, NOTES 152) and 16-row tensor-core
tiles (BLOCK_M = 16, pointer or TMA loads, 3-8 stages, split-K 1-4) — each timed back to back in a CUDA graph over 16 distinct copies of the weight
(`tuner_timing.chain_us`: one layer's weights after another's, as the decode graph runs them) and by the tuner's
own measure (`tuning.benchmark`); cuBLAS (`torch.matmul` of the same operands) is chained the same way. Prints per
region the tuned, best-per-family and cuBLAS times with their share of the copy bandwidth (OUT/ceilings.json when
bench/device.sh measured it); writes OUT/gemv_study.json ({gpu, torch, triton, regions: [{layer, region, N, K,
weight_MB, cublas_us, copy_bytes_per_s, tuned, rows: [{config, family, us, tuner_us}]}]}).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from gemms import operands, region_inputs  # noqa: E402
from tuner_timing import chain_us  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.tuning import benchmark  # noqa: E402


def family(c: dict) -> str:
    if c.get("MM"):
        return "cublas-product"
    if c["BLOCK_M"] == 1:
        return "one-row"
    return "tc16-tma" if c["TMA"] else "tc16-ptr"


def candidates(space, has_norm: bool, n: int, seed: int = 0) -> list[dict]:
    """Up to n distinct configs of the two families that the space's rules accept (stages over the space's 5
    checked as 5: deeper pipelines are what this study asks about)."""
    rng, found = random.Random(seed), []
    one_row = dict(BLOCK_M=[1], BLOCK_N=[16, 32, 64], BLOCK_K=[128, 256, 512], SPLIT_K=[1, 2, 4], num_warps=[4, 8],
                   num_stages=[2], TMA=[0])  # (one stage count: NOTES 152)  # fmt: skip
    tc = dict(BLOCK_M=[16], BLOCK_N=[32, 64, 128, 256], BLOCK_K=[64, 128], SPLIT_K=[1, 2, 4], num_warps=[4, 8],
              num_stages=[3, 4, 5, 6, 8], TMA=[0, 1])  # fmt: skip
    for fam in [one_row, tc] * (n // 2 + 1):
        for _ in range(300):
            c = {k: rng.choice(v) for k, v in fam.items()}
            c.update(GROUP_M=1, MM=0, PERSISTENT=0, NORM_PASS=0, WS=0)
            for norm_pass in (0, 1):
                c["NORM_PASS"] = norm_pass
                if space.is_valid({**c, "num_stages": min(5, c["num_stages"])}):
                    break
            else:
                continue
            if c not in found:
                found.append(c)
                break
        if len(found) >= n:
            break
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="phi3_mini,llama3_8b")
    ap.add_argument("--configs", type=int, default=40)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    copy_bw = None
    ceil = os.path.join(a.out, "ceilings.json")
    if os.path.exists(ceil):
        copy_bw = json.load(open(ceil))["copy_bytes_per_s"]
    flush = torch.ones(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    import triton

    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "regions": []}
    for name in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](1, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        with torch.no_grad():
            cm(*args, **kwargs)
            for step, tensors in region_inputs(cm, args, kwargs):
                x, w = operands(step, tensors)
                w_index = next(i for i, t in enumerate(tensors)
                               if isinstance(t, torch.Tensor) and t.data_ptr() == w.data_ptr())  # fmt: skip
                full_w = tensors[w_index]
                space = step.kernel.space
                tuned, default = step.choice.config, space.default()
                has_norm = "NORM_PASS" in tuned
                configs = [tuned] + [default] * (default != tuned)
                configs += [c for c in candidates(space, has_norm, a.configs) if c not in configs]
                compile_configs(step.kernel, step.compiled, tensors, configs)
                rows = []
                for c in configs:
                    try:
                        us = chain_us(lambda t, c=c, s=step: s.launch(t, c), tensors, w_index, flush)
                        tuner = benchmark(lambda c=c, s=step, t=tensors: s.launch(t, c), warmup_ms=10, rep_ms=40) * 1e6
                        rows.append({"config": c, "family": family(c), "us": us, "tuner_us": tuner})
                    except Exception as e:  # noqa: BLE001 - a config that does not compile or run is left out
                        print(f"  {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)

                def mm(t, n=w.shape[0], out=out):
                    torch.matmul(t[0], t[1][:n].t(), out=out)

                cublas = chain_us(mm, [x, full_w], 1, flush)
                nbytes = w.numel() * w.element_size()

                def share(us, nbytes=nbytes):
                    tbs = nbytes / us / 1e6
                    return f"{tbs:.2f} TB/s" + (f" {tbs / (copy_bw / 1e12):.0%}" if copy_bw else "")

                best = {}
                for r in rows:
                    if r["family"] not in best or r["us"] < best[r["family"]]["us"]:
                        best[r["family"]] = r
                print(f"{name} {step.choice.region} N={w.shape[0]} K={w.shape[1]} {nbytes / 1e6:.0f} MB: tuned "
                      f"{rows[0]['us']:.1f} µs ({share(rows[0]['us'])}) cuBLAS {cublas:.1f} ({share(cublas)})",
                      flush=True)  # fmt: skip
                for f, r in sorted(best.items(), key=lambda kv: kv[1]["us"]):
                    print(f"    best {f}: {r['us']:.1f} µs ({share(r['us'])}) {r['config']}", flush=True)
                res["regions"].append({"layer": name, "region": step.choice.region, "N": w.shape[0],
                                       "K": w.shape[1], "weight_MB": nbytes / 1e6, "cublas_us": cublas,
                                       "copy_bytes_per_s": copy_bw, "tuned": tuned, "rows": rows})  # fmt: skip
                with open(os.path.join(a.out, "gemv_study.json"), "w") as f:
                    json.dump(res, f, indent=1, default=str)
        del cm, mod
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
