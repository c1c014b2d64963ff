"""One benchmark run: correctness first, then GPU time and call time of every mode, per block and M.

    python bench/run.py --out OUT [--blocks a,b] [--tokens 1,16,128,2048] [--modes ...] [--tune quick]

Modes: eager, inductor (torch.compile default), max-autotune (with CUDA graphs), max-autotune-no-cudagraphs,
ours (dlblas_compiler, tuned, CUDA graphs), ours-nocg (same kernels, no CUDA graphs).
GPU time: the call captured in a CUDA graph and replayed, L2 cleared before each replay (do_bench median):
what the GPU spends. Call time: one Python call as a user makes it (do_bench median). All modes of a block
and M are compiled first, then each mode's call is run once untimed as a round would (the card leaves the idle
of compiling), then timed in `--rounds` rounds (order rotating); figures are medians over rounds.
Paired call time (`--paired N`): then N turns of one call of each mode, call by call (a random order each turn,
`profiler.paired`), each timed as do_bench times one; the modes' calls share the GPU's state, which drifts between
do_bench blocks (the power limiter's clock).
Every mode's output is compared with a float64 reference (relative error ‖out−ref‖/‖ref‖). Each block and M
runs in its own process (one crash costs one pair); results are appended to OUT/results.json pair by pair,
so a run cut short keeps what it measured. nvidia-smi samples the SM clock and power of each pair's process into
OUT/smi_<block>_<M>.csv (bench/smi.py); each row keeps their summary per round (`smi_rounds`) and over the paired
calls (`smi_paired`), so a timing can be matched to its clock. Each process first measures the GPU's ceilings
(bench/ceilings.py: copy bandwidth, bf16 matmul rate), records them in its run's meta and computes the floors from
them; each row keeps the bytes and flops of its floor, and for our modes what ran each region (kernel or reference).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS, floor_us  # noqa: E402
from ceilings import measure as measure_ceilings  # noqa: E402
from smi import Smi  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402
from dlblas_compiler.tuning import profiler  # noqa: E402

MODES = ["eager", "inductor", "max-autotune", "max-autotune-no-cudagraphs", "ours", "ours-nocg"]


def leaves(out):
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def do_bench(fn) -> float:
    from triton.testing import do_bench as tb

    return tb(fn, warmup=25, rep=100, return_mode="median") * 1e3  # µs


def paired(fns: list, calls: int) -> list[list[float]]:
    """`calls` calls of each of `fns` in turn, one call at a time (`profiler.paired`): per fn its calls' µs, in turn
    order."""
    return [[t * 1e6 for t in ts] for ts in profiler.paired(fns, calls)]


def graphed(fn):
    """`fn` captured in a CUDA graph (after two warm-up calls on a side stream): its GPU time is the replay's."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def gpu_time(fn) -> float:
    g = graphed(fn)
    t = do_bench(g.replay)
    del g
    return t


def make_fn(mode: str, mod, args, kwargs, tune: str):
    """(callable, compile seconds, compiled object). Inductor modes coexist: dynamo guards on the backend."""
    t0 = time.perf_counter()
    if mode == "eager":
        return (lambda: mod(*args, **kwargs)), 0.0, None
    if mode.startswith("ours"):
        cm = dc.compile(mod, backend="triton", tune=tune, cuda_graphs=(mode == "ours"))
        cm(*args, **kwargs)
        torch.cuda.synchronize()
        return (lambda: cm(*args, **kwargs)), time.perf_counter() - t0, cm
    cmode = None if mode == "inductor" else mode
    fn = torch.compile(mod, mode=cmode, dynamic=False)
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    return (lambda: fn(*args, **kwargs)), time.perf_counter() - t0, fn


def bench_one(
    block: str, m: int, modes: list[str], tune: str, dtype, rounds: int, ceilings: dict | None = None,
    save: Callable[[list[dict]], None] | None = None, paired_calls: int = 0, smi: Smi | None = None,
) -> list[dict]:
    """Compile and check every mode, then time them all in `rounds` rounds (the order rotating each round),
    so that drift of the GPU's state over the run lands on every mode alike; each figure is the median over
    rounds, and the rounds' values are kept. With `paired_calls`, the modes' calls are then also timed in turn,
    call by call (`paired`): `call_us_paired` (the median) and `call_us_paired_calls` (each call, in turn order).
    `save(rows)` runs before the compiled modes and their CUDA graphs
    are released (a process that dies in that teardown has written its rows). With `smi` (nvidia-smi sampling),
    each row keeps the clock and power of its rounds' call timings (`smi_rounds`) and of the paired calls
    (`smi_paired`, all modes together)."""
    gpu = torch.cuda.get_device_name()
    mod, args, kwargs, nbytes, flops = BLOCKS[block](m, dtype, "cuda")
    floor = floor_us(gpu, nbytes, flops, ceilings)
    with torch.no_grad():
        ref_mod = copy.deepcopy(mod).double()
        dargs = pytree.tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, (args, kwargs))
        ref = leaves(ref_mod(*dargs[0], **dargs[1]))
        del ref_mod
    rows, timed = [], []
    torch._dynamo.reset()
    # our modes first: their first call moves concatenated parameters into one buffer (`Options.share_weights`),
    # and a mode captured before that (eager's graph here, max-autotune's CUDA graphs) would replay on the old,
    # freed storage (bench/NOTES.md 116: an illegal memory access on a Qwen2.5-7B layer)
    for mode in sorted(modes, key=lambda md: not md.startswith("ours")):
        row = {"block": block, "M": m, "mode": mode, "floor_us": floor, "bytes": nbytes, "flops": flops, "gpu": gpu}
        rows.append(row)
        try:
            with torch.no_grad():
                fn, compile_s, obj = make_fn(mode, mod, args, kwargs, tune)
                out = leaves(fn())
                row["rel_err"] = max(rel_error(o, r) for o, r in zip(out, ref))
                row["compile_s"] = compile_s
                # max-autotune and ours replay their own CUDA graphs: their GPU time is that of the same
                # kernels without them (the -no-cudagraphs / -nocg mode)
                graph = graphed(fn) if mode not in ("max-autotune", "ours") else None
                if mode.startswith("ours"):  # what ran each region: our kernel or its torch reference
                    rep = obj.report()
                    ops = {getattr(r, "kernel", None): list(r.ops) for r in rep.regions}
                    keep = ("name", "pattern", "impl", "config", "time", "default_time", "reference_time", "reason")
                    row["kernels"] = [{k: v for k, v in d.items() if k in keep} | {"ops": ops.get(d["name"], [])}
                                      for d in (k.to_dict() for k in rep.kernels)]  # fmt: skip
                    if mode == "ours":
                        row["graph_note"] = obj._spec().executor.graph_note or "no CUDA graph"
                        t0 = time.perf_counter()
                        warm = dc.compile(mod, backend="triton", tune=tune)
                        warm(*args, **kwargs)
                        torch.cuda.synchronize()
                        row["warm_compile_s"] = time.perf_counter() - t0
                        del warm
            timed.append((row, fn, graph, obj))
        except Exception as e:  # noqa: BLE001 - one failing mode must not end the run
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
    try:
        with torch.no_grad():
            # an untimed pass of every mode first: the card idles while the modes compile, and the mode timed first
            # after that (ours, in round 0) ran at 1.8-2.0 GHz and 150-190 W, 6-15% faster than in round 1 at the
            # power limit (bench/NOTES.md 183); the rounds now start with the card at its steady state
            with smi.phase("heat") if smi else contextlib.nullcontext():
                for _, fn, _, _ in timed:
                    do_bench(fn)
            for r in range(rounds):
                for row, fn, graph, _ in timed[r % max(1, len(timed)) :] + timed[: r % max(1, len(timed))]:
                    with smi.phase(f"{row['mode']}/{r}") if smi else contextlib.nullcontext():
                        row.setdefault("call_us_rounds", []).append(do_bench(fn))
                    if graph is not None:
                        row.setdefault("gpu_us_rounds", []).append(do_bench(graph.replay))
            if paired_calls and timed:
                with smi.phase("paired") if smi else contextlib.nullcontext():
                    calls_of = paired([fn for _, fn, _, _ in timed], paired_calls)
                for (row, *_), calls in zip(timed, calls_of, strict=True):
                    row["call_us_paired"] = statistics.median(calls)
                    row["call_us_paired_calls"] = [round(c, 2) for c in calls]
    except Exception as e:  # noqa: BLE001 - keep the rounds measured so far
        rows[0]["timing_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.print_exc()
    phases = smi.stop() if smi else {}
    for row in rows:
        if phases:
            row["smi_rounds"] = [phases.get(f"{row['mode']}/{r}", {}) for r in range(rounds)]
            row["smi_paired"] = phases.get("paired", {})
        for key in ("call_us", "gpu_us"):
            if row.get(f"{key}_rounds"):
                row[key] = statistics.median(row[f"{key}_rounds"])
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                          if k not in ("kernels", "call_us_paired_calls")}), flush=True)  # fmt: skip
    if save is not None:
        save(rows)
    del timed, mod, args, kwargs
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_out")
    p.add_argument("--blocks", default=",".join(BLOCKS))
    p.add_argument("--tokens", default="1,16,128,2048")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--tune", default="quick")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds over all modes (medians reported)")
    p.add_argument("--paired", type=int, default=100,
                   help="then time the modes' calls in turn, call by call, this many each (0: not)")
    p.add_argument("--one", action="store_true", help="run the given blocks and M in this process")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    pairs = [(b, int(m)) for b in a.blocks.split(",") for m in a.tokens.split(",")]
    if len(pairs) > 1 and not a.one:  # each block and M in its own process: a crash costs one pair (seen once:
        failed = []  # a process died while timing, and every later block of that run went unmeasured)
        for b, m in pairs:
            args = ["--one", "--out", a.out, "--blocks", b, "--tokens", str(m), "--modes", a.modes, "--tune", a.tune,
                    "--dtype", a.dtype, "--rounds", str(a.rounds), "--paired", str(a.paired)]  # fmt: skip
            rc = subprocess.run([sys.executable, os.path.abspath(__file__), *args]).returncode
            if rc:
                failed.append(f"{b} M={m} (exit {rc})")
        if failed:
            print("failed: " + ", ".join(failed), flush=True)
        return 1 if failed else 0
    path = os.path.join(a.out, "results.json")
    results = json.load(open(path)) if os.path.exists(path) else {"runs": []}
    import transformers
    import triton

    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "dtype": a.dtype,
        "tune": a.tune,
        "rounds": a.rounds,
        "paired": a.paired,
    }
    try:  # the ceilings of this card, measured in this process: the floors below divide by them
        meta["ceilings"] = measure_ceilings()
    except Exception as e:  # noqa: BLE001 - a run without ceilings falls back to bench/ceilings.FIXED, and says so
        meta["ceilings_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(meta), flush=True)
    run = {"meta": meta, "rows": []}
    results["runs"].append(run)
    def save(rows: list[dict]) -> None:
        run["rows"] += rows
        with open(path, "w") as f:
            json.dump(results, f, indent=1)

    for block, m in pairs:
        smi = Smi(os.path.join(a.out, f"smi_{block}_{m}.csv"))
        bench_one(block, m, a.modes.split(","), a.tune, getattr(torch, a.dtype), a.rounds, meta.get("ceilings"), save,
                  a.paired, smi)
    return 0


if __name__ == "__main__":
    sys.exit(main())
