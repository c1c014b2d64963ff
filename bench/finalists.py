"""Does the quick search rank its finalists as a CUDA-graph replay ranks them? (issue 19's tuner flips, bench/NOTES.md
146-148, 159, 169-171.)

    python bench/finalists.py --out OUT [--layers llama3_8b,qwen25_7b,gemma_7b] [--tokens 2048] [--reps 2]
                              [--turns 40]

Each layer is compiled and quick-tuned `--reps` times, each time into an empty tuning cache (no CUDA graphs, so no
in-context round: the search and its confirmation round alone decide). For every GEMM-template region the search's
trials are recorded (config, search µs), and its confirmation round's finalists (config, search µs, confirmed µs).
Then the candidates — the finalists, and the fastest trial of each variant family the search timed (WS 0/1/2, MM,
persistent or not) — are each captured in a CUDA graph of the region's launch and timed two ways:
* `blocks`: `triton.testing.do_bench` of each replay (L2 cleared before each, 25 ms warm-up, 200 ms), the candidates in
  turn, two rounds (the order reversed in the second): how bench/gemms.py's sweep times a config;
* `paired`: `profiler.paired` over the replays, one call of each candidate per turn, `--turns` turns (all under the
  same state of the card): each candidate's median per-turn ratio to the tuned choice.
Per region it prints whether the choice is the replays' fastest, and by how much it is not. Writes
OUT/finalists.json (appended per layer and repetition).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from gemms import graph_of, region_inputs  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.runtime import selection  # noqa: E402
from dlblas_compiler.tuning import profiler  # noqa: E402


def family(c: dict) -> str:
    """A config's variant family: the kernel the search's starts set apart."""
    if c.get("MM"):
        return "MM"
    if c.get("WS"):
        return f"WS={c['WS']}"
    return "persistent" if c.get("PERSISTENT") else "tiles"


def tuned_layer(name: str, tokens: int, cache_dir: str):
    """The layer compiled and quick-tuned into an empty cache, and each search's outcome by (kernel, shape)."""
    os.makedirs(cache_dir, exist_ok=True)
    os.environ["DLBLAS_CACHE_DIR"] = cache_dir
    outcomes = {}
    tune = selection.tune

    def recorded(job, *a, **kw):
        out = tune(job, *a, **kw)
        outcomes[(job.name, json.dumps(dict(job.shape), sort_keys=True, default=str))] = out
        return out

    selection.tune = recorded
    try:
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](tokens, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="quick", cuda_graphs=False)
        with torch.no_grad():
            cm(*args, **kwargs)
    finally:
        selection.tune = tune
    return cm, args, kwargs, outcomes


def study_region(step, tensors, out, turns: int) -> dict:
    c = step.choice
    trials = [(t.config, t.time) for t in out.result.trials if t.time is not None] if out.result else []
    best_of: dict[str, tuple[dict, float]] = {}
    for cfg, s in trials:
        f = family(cfg)
        if f not in best_of or s < best_of[f][1]:
            best_of[f] = (cfg, s)
    cands: list[dict] = [c.config]
    for cfg, _, _ in out.finalists:
        if cfg not in cands:
            cands.append(cfg)
    for cfg, _ in best_of.values():
        if cfg not in cands:
            cands.append(cfg)
    graphs = [graph_of(lambda cfg=cfg: step.launch(tensors, cfg)) for cfg in cands]
    blocks: list[list[float]] = [[] for _ in cands]
    for rnd in range(2):
        order = range(len(cands)) if rnd == 0 else reversed(range(len(cands)))
        for i in order:
            blocks[i].append(triton.testing.do_bench(graphs[i].replay, warmup=25, rep=200) * 1e3)
    pair = profiler.paired([g.replay for g in graphs], turns)
    ratios = [statistics.median(t / t0 for t, t0 in zip(ts, pair[0], strict=True)) for ts in pair]
    search = {json.dumps(cfg, sort_keys=True): s for cfg, s in trials}
    confirmed = {json.dumps(cfg, sort_keys=True): t for cfg, _, t in out.finalists}
    rows = []
    for i, cfg in enumerate(cands):
        k = json.dumps(cfg, sort_keys=True)
        rows.append({"config": cfg, "family": family(cfg), "chosen": i == 0,
                     "search_us": search.get(k, float("nan")) * 1e6,
                     "confirmed_us": confirmed.get(k, float("nan")) * 1e6,
                     "blocks_us": statistics.median(blocks[i]), "paired_us": statistics.median(pair[i]) * 1e6,
                     "paired_ratio": ratios[i]})  # fmt: skip
    fastest = min(rows, key=lambda r: r["paired_ratio"])
    return {"region": c.region, "impl": c.impl, "shape": dict(step.kernel.shape_key), "trials": len(trials),
            "families": {f: s * 1e6 for f, (_, s) in best_of.items()}, "rows": rows,
            "chosen_over_fastest": 1.0 / fastest["paired_ratio"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b,gemma_7b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--turns", type=int, default=40)
    a = ap.parse_args()
    caches = tempfile.mkdtemp(prefix="finalists-")
    os.makedirs(a.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tokens": a.tokens, "runs": []}  # fmt: skip
    for name in a.layers.split(","):
        for rep in range(a.reps):
            t0 = time.time()
            cm, args, kwargs, outcomes = tuned_layer(name, a.tokens, os.path.join(caches, f"{name}-{rep}"))
            print(f"{name} rep {rep}: tuned in {time.time() - t0:.1f} s", flush=True)
            regions = []
            with torch.no_grad():
                for step, tensors in region_inputs(cm, args, kwargs):
                    shape = json.dumps(dict(step.kernel.shape_key), sort_keys=True, default=str)
                    key = (step.kernel.tuning_key[0], shape)
                    out = outcomes.get(key)
                    if out is None or out.result is None:
                        continue
                    r = study_region(step, tensors, out, a.turns)
                    regions.append(r)
                    print(f"  {r['region']:8s} {r['impl']:9s} {r['trials']} trials; chosen/fastest replay "
                          f"{r['chosen_over_fastest']:.3f}; family bests (search µs) "
                          + ", ".join(f"{f} {s:.1f}" for f, s in sorted(r["families"].items(), key=lambda x: x[1])),
                          flush=True)  # fmt: skip
                    for row in r["rows"]:
                        print(f"    {'*' if row['chosen'] else ' '} {row['family']:10s} search {row['search_us']:7.1f} "
                              f"confirmed {row['confirmed_us']:7.1f} blocks {row['blocks_us']:7.1f} paired "
                              f"{row['paired_us']:7.1f} ({row['paired_ratio']:.3f})  {row['config']}",
                          flush=True)  # fmt: skip
            res["runs"].append({"layer": name, "rep": rep, "regions": regions})
            with open(os.path.join(a.out, "finalists.json"), "w") as fh:
                json.dump(res, fh, indent=1, default=str)
            del cm
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
