"""Decode attention as a decode step runs it (inside a CUDA graph): our split-KV kernel at each config of a grid
against torch's SDPA, at Llama-3-8B's heads (32 query and 8 KV heads, D = 128, bf16), one query token per
sequence, a boolean mask over a static cache of L slots of which the first `valid` are attended to.

    python bench/decode_attention.py --out OUT [--tag new] [--cases 384:130,384:384,1024:600,4096:256,4096:4096]

Per case (L:valid): the time per call of each config of our kernel and of `F.scaled_dot_product_attention`
(enable_gqa, the same mask), each from a CUDA graph of 50 back-to-back calls (median of 7 replays, L2 warm as in
a decode step, where the layer's K/V were just written), the config the default picks, and the floor: the valid
K/V bytes at the copy bandwidth of bench/ceilings.py. Every config's output is checked against SDPA's in float32
first. Writes OUT/decode_attention_<tag>.json. Run it from two source trees to compare kernels in one device call.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

HQ, HK, D, CALLS, REPLAYS = 32, 8, 128, 50, 7
GRID = {"BLOCK_N": [32, 64], "SPLITS": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3], "num_warps": [4]}


class Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def per_call_us(fn) -> float:
    """µs per call of `fn` from a CUDA graph of CALLS calls (median of REPLAYS replays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="new")
    ap.add_argument("--cases", default="384:130,384:384,1024:600,4096:256,4096:4096")
    args = ap.parse_args()

    from ceilings import measure

    import dlblas_compiler as dc
    from dlblas_compiler.runtime.steps import RegionStep

    copy_tbs = measure(products=1)["copy_bytes_per_s"] / 1e12
    gen = torch.Generator("cuda").manual_seed(0)
    rows = []
    for case in args.cases.split(","):
        length, valid = map(int, case.split(":"))
        q = torch.randn(1, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, HK, length, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, HK, length, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        mask = torch.zeros(1, 1, 1, length, dtype=torch.bool, device="cuda")
        mask[..., :valid] = True
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
        cm = dc.compile(Attention(), backend="triton", tune="none", cuda_graphs=False)
        with torch.no_grad():
            cm(q, k, v, mask)
            step = next(s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None)
            default = dict(step.choice.config)
            space = step.kernel.space
            configs = {}
            for values in itertools.product(*GRID.values()):
                config = {**default, **dict(zip(GRID, values, strict=True))}
                if not space.is_valid(config):
                    continue
                step.choice.impl, step.choice.config = "kernel", config
                out = cm(q, k, v, mask)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                key = ",".join(f"{n}={config[n]}" for n in GRID)
                configs[key] = {"us": round(per_call_us(functools.partial(cm, q, k, v, mask)), 2), "rel_err": err}
            sdpa = per_call_us(
                functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True))
        best = min(configs, key=lambda c: configs[c]["us"])
        floor_us = 2 * HK * valid * D * 2 / (copy_tbs * 1e12) * 1e6
        dkey = ",".join(f"{n}={default[n]}" for n in GRID)
        row = {"L": length, "valid": valid, "sdpa_us": round(sdpa, 2), "best": best, "best_us": configs[best]["us"],
               "default": dkey, "default_us": configs.get(dkey, {}).get("us"), "floor_us": round(floor_us, 2),
               "worst_rel_err": max(c["rel_err"] for c in configs.values()), "configs": configs}  # fmt: skip
        rows.append(row)
        print(f"L={length} valid={valid}: best {row['best_us']} µs ({best}), default {row['default_us']} µs ({dkey}), "
              f"SDPA {row['sdpa_us']} µs, floor {row['floor_us']} µs, worst rel. err {row['worst_rel_err']:.2e}",
              flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"decode_attention_{args.tag}.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "copy_tb_per_s": copy_tbs,
                   "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
