"""Per-kernel GPU time of our compiled block, launched directly and replayed in a CUDA graph (torch.profiler).

    python bench/profile_kernels.py --out OUT [--block decoder_layer] [--tokens 2048] [--calls 5]

Writes OUT/profile_<block>_<M>.json: for each kernel name, the mean duration (µs) per call in both ways,
and prints them side by side (what differs when the same launches run inside a graph).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from blocks import BLOCKS  # noqa: E402


def kernel_times(fn, calls: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:80]] += e.device_time / calls
    return dict(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="profile_out")
    p.add_argument("--block", default="decoder_layer")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--calls", type=int, default=5)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    mod, args, kwargs, _, _ = BLOCKS[a.block](a.tokens, torch.bfloat16, "cuda")
    with torch.no_grad():
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        direct = lambda: cm(*args, **kwargs)  # noqa: E731
        direct()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            direct()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            direct()
        res = {"direct": kernel_times(direct, a.calls), "graph": kernel_times(g.replay, a.calls)}
    with open(os.path.join(a.out, f"profile_{a.block}_{a.tokens}.json"), "w") as f:
        json.dump(res, f, indent=1)
    names = sorted(set(res["direct"]) | set(res["graph"]), key=lambda n: -res["direct"].get(n, 0))
    print(f"{'kernel':80s} {'direct µs':>10s} {'graph µs':>10s}")
    for n in names:
        print(f"{n:80s} {res['direct'].get(n, 0):10.1f} {res['graph'].get(n, 0):10.1f}")
    print(f"{'total':80s} {sum(res['direct'].values()):10.1f} {sum(res['graph'].values()):10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
