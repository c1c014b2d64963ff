"""Two source trees of dlblas_compiler timed against each other in one run: a change that should not move speed
(a restructuring) is checked by timing the code before and after it, on the same GPU, minutes apart.

    python bench/compare_trees.py --old .old --new . --tokens 1,128,2048 --tune none,quick --rounds 3 --out OUT

Each (tree, M, tune) runs in its own process with that tree first on sys.path (the model and inputs come from
the new tree's bench/blocks.py, so both compile the identical module); the processes alternate old/new for
`--rounds` rounds and each figure is the median over rounds. GPU time: the compiled call without CUDA graphs,
captured in a CUDA graph and replayed (do_bench median, L2 cleared); call time: one Python call with the
compiled module's own CUDA graph, as a user makes it, right after its first call and again 3 s later; enqueue time:
the host's time for one such call, starting with the GPU idle (the median of 300); `--gpu-only` times the GPU time
alone (no second compile, call timings or 3 s wait: about half of a process). Both trees
share one tuning cache, old first: kernels whose source did not change get the same configs, so search luck does not
count as a regression.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

WORKER = r"""
import json, sys, time, torch
sys.path.insert(0, {tree!r}); sys.path.insert(1, {bench!r})
import dlblas_compiler as dc
from blocks import BLOCKS
from triton.testing import do_bench
mod, args, kwargs, nbytes, flops = BLOCKS[{block!r}]({m}, torch.bfloat16, "cuda")
with torch.no_grad():
    t0 = time.perf_counter()
    plain = dc.compile(mod, backend="triton", tune={tune!r}, cuda_graphs=False)
    plain(*args, **kwargs)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            plain(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plain(*args, **kwargs)
    gpu_us = do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3
    impls = {{}}
    for k in (plain.report().kernels if hasattr(plain.report(), "kernels") else []):
        impls[getattr(k, "region", "?")] = getattr(k, "impl", "?")
    if {gpu_only!r}:
        print("RESULT " + json.dumps(dict(gpu_us=gpu_us, compile_s=compile_s, impls=impls)))
        sys.exit(0)
    graphed = dc.compile(mod, backend="triton", tune={tune!r})
    graphed(*args, **kwargs)
    call_us = do_bench(lambda: graphed(*args, **kwargs), warmup=25, rep=100, return_mode="median") * 1e3
    time.sleep(3)  # (work the first calls left behind, compiles and threads, done: the call time again)
    call_later_us = do_bench(lambda: graphed(*args, **kwargs), warmup=25, rep=100, return_mode="median") * 1e3
    enqueue = []  # the host's time to make one call, the GPU idle when it starts (nothing to wait for)
    for _ in range(300):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graphed(*args, **kwargs)
        enqueue.append(time.perf_counter() - t0)
    enqueue_us = sorted(enqueue)[len(enqueue) // 2] * 1e6
    note = getattr(graphed._spec().executor, "graph_note", "")
print("RESULT " + json.dumps(dict(gpu_us=gpu_us, call_us=call_us, call_later_us=call_later_us, enqueue_us=enqueue_us,
                                  compile_s=compile_s,
                                  impls=impls, graph_note=note)))
"""


def run_one(tree: str, block: str, m: int, tune: str, gpu_only: bool = False) -> dict:
    code = WORKER.format(tree=os.path.abspath(tree), bench=HERE, block=block, m=m, tune=tune, gpu_only=gpu_only)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=".")
    ap.add_argument("--block", default="decoder_layer")
    ap.add_argument("--tokens", default="1,128,2048")
    ap.add_argument("--tune", default="none,quick")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu-only", action="store_true",
                    help="time only the replayed call's GPU time (no call or enqueue times: about half a process)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for tune in args.tune.split(","):
        for m in (int(t) for t in args.tokens.split(",")):
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for r in range(args.rounds):
                for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    runs[name].append(run_one(getattr(args, name), args.block, m, tune, args.gpu_only))
            row = {"block": args.block, "M": m, "tune": tune}
            for name, results in runs.items():
                ok = [x for x in results if "error" not in x]
                timed = [x for x in ok if x.get("call_us") is not None]  # (none with --gpu-only)
                row[name] = {
                    "gpu_us": statistics.median(x["gpu_us"] for x in ok) if ok else None,
                    "call_us": statistics.median(x["call_us"] for x in timed) if timed else None,
                    "gpu_us_rounds": [x.get("gpu_us") for x in results],
                    "errors": [x["error"] for x in results if "error" in x],
                    "impls": ok[-1]["impls"] if ok else {},
                    "call_us_rounds": [x.get("call_us") for x in results],
                    "call_later_us_rounds": [x.get("call_later_us") for x in results],
                    "enqueue_us": statistics.median(x["enqueue_us"] for x in timed) if timed else None,
                    "enqueue_us_rounds": [x.get("enqueue_us") for x in results],
                    "graph_notes": [x.get("graph_note") for x in results],
                    # (the first call's seconds, tuning included: a tree's first round tunes what its cache lacks)
                    "compile_s_rounds": [x.get("compile_s") for x in results],
                }
            if row["old"]["gpu_us"] and row["new"]["gpu_us"]:
                row["new_over_old_gpu"] = row["new"]["gpu_us"] / row["old"]["gpu_us"]
                if row["old"]["call_us"] and row["new"]["call_us"]:
                    row["new_over_old_call"] = row["new"]["call_us"] / row["old"]["call_us"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(args.out, "compare_trees.json"), "w") as f:
                json.dump({"gpu": _gpu(), **_versions(), "rows": rows}, f, indent=1)
    print("\nblock M tune: old GPU µs -> new GPU µs (ratio); call µs old -> new")
    for row in rows:
        o, n = row["old"], row["new"]
        print(f"{row['block']} M={row['M']} tune={row['tune']}: {o['gpu_us']} -> {n['gpu_us']} "
              f"({row.get('new_over_old_gpu', float('nan')):.3f}); call {o['call_us']} -> {n['call_us']}; "
              f"enqueue {o['enqueue_us']} -> {n['enqueue_us']}")
    return 0


def _versions() -> dict:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__}


def _gpu() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    sys.exit(main())
