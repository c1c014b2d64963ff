"""How well do the search policies do? Exhaustive grid vs random vs Bayesian (optuna TPE) on a GEMM region.

    python bench/tuning_study.py --out OUT [--tokens 16,2048] [--seeds 3] [--block norm_qkv_rope] [--region 0]

For the norm+QKV+RoPE region of Llama-3-8B (RMSNorm prologue, rotary epilogue) at each token count: every
valid config is timed once (the exhaustive best), then random and Bayesian search run with budgets of 10%,
20% and 40% of the space over the *same* measured times (a lookup, so the comparison is about the
policies, not timing noise). Reports, per policy and budget, the best time found over the exhaustive best
(mean and worst over seeds). Goal of issue 5: Bayesian within 3% using at most 20% of the evaluations.
The tuner's quick mode (its budget and patience) runs over the same table twice: from the default and the
seeds, and from the default alone. Where the whole space is too large to time (thousands of configs at
M = 2048), `--narrow` times a subspace and `--real-quick N` runs the quick search for real over the whole space:
N times as a card without the sweeps' seeds builds it (the default and the variants' own starts: a shape no
sweep has seen, issue 19's goal: within 5%), once with them; each against the subspace's best.
`--block`/`--region` pick another block and its n-th GEMM region (e.g. swiglu_mlp 1: down projection);
`--narrow k=v1/v2,...` restricts the space. Each result also holds the best time per BLOCK_M (BLOCK_M 1:
one-row CUDA-core tiles, tensor cores from 16) and the weight bandwidth of the best config.
`--smoke` runs a tiny shape under the Triton interpreter with a narrowed space (checks the script).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.runtime.program import RegionStep  # noqa: E402
from dlblas_compiler.tuning import POLICIES, SearchSpace, make_objective  # noqa: E402
from dlblas_compiler.tuning.tuner import TUNE_MODES  # noqa: E402


def region(block_model, args, backend: str, index: int = 0, kwargs=None):
    """The `index`-th GEMM region of the compiled block and its inputs."""
    cm = dc.compile(block_model, backend=backend, tune="none", cuda_graphs=False)
    with torch.no_grad():
        cm(*args, **(kwargs or {}))
        spec = cm._spec()
        flat = spec.captured.flatten(args, kwargs or {})
        prog = spec.executor
        env = prog._env([flat[i] for i in spec.imported.arg_positions])
        for step in prog.steps:
            if isinstance(step, RegionStep) and step.kernel is not None and step.choice.pattern == "gemm":
                if index == 0:
                    return step, step.inputs(env)
                index -= 1
            step(env)
    raise RuntimeError("no such GEMM region")


def _compile_part(block: str, index: int, m: int, keys: list[tuple]) -> int:
    """Worker: build the same region and launch each config once, so Triton's disk cache holds the binaries
    (compiling ~400 configs one by one would take most of the run). Returns the number that failed."""
    from blocks import BLOCKS

    mod, args, kwargs, _, _ = BLOCKS[block](m, torch.bfloat16, "cuda")
    step, tensors = region(mod, args, "triton", index, kwargs)
    failed = 0
    for key in keys:
        try:
            step.launch(tensors, dict(zip(step.kernel.space.names, key)))
        except Exception:  # noqa: BLE001 - counted; the timing pass records it as a failed trial
            failed += 1
    torch.cuda.synchronize()
    return failed


def precompile(block: str, index: int, m: int, space, jobs: int, part: tuple[int, int] | None = None) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    keys = [space.key(c) for c in (part_configs(space, part) if part else space.configs())]
    parts = [keys[i::jobs] for i in range(jobs)]
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        failed = sum(pool.map(_compile_part, [block] * jobs, [index] * jobs, [m] * jobs, parts))
    print(f"M={m}: compiled {len(keys)} configs in {jobs} processes ({failed} failed)", flush=True)


def objective(step: RegionStep, tensors: list, device: str):
    """config -> seconds for the region's kernel, each output checked against its reference first."""
    with torch.no_grad():
        ref = step.reference(tensors)
    return make_objective(lambda cfg: (lambda: step.launch(tensors, cfg)), ref, device=device)


def space_record(space, no_sweeps=None) -> dict:
    """What a replay needs to rebuild the search over a saved table (`bench/replay_tuning.py`): the parameters
    and their choices in order, the default, and the starts with and without the sweeps' seeds."""
    return {"params": {n: list(c) for n, c in space.params.items()}, "default": space.default(),
            "starts": space.starts(), "starts_no_sweeps": (no_sweeps or space).starts()}  # fmt: skip


def time_part(step: RegionStep, tensors: list, space, part: tuple[int, int], no_sweeps=None,
              device: str = "cuda") -> dict:
    """Time every `part[1]`-th config of the space from the `part[0]`-th (an exhaustive search split over device
    calls; `bench/replay_tuning.py` merges the parts and replays the policies over the whole table)."""
    timed = objective(step, tensors, device)
    table = []
    for cfg in part_configs(space, part):
        try:
            t = timed(cfg) * 1e6
        except Exception:  # noqa: BLE001 - a failing config: null, a failed trial in every replay
            t = None
        table.append([list(space.key(cfg)), t])
    return {"part": list(part), "space": space.size(), "names": list(space.names), "table": table,
            **space_record(space, no_sweeps)}  # fmt: skip


def part_configs(space, part: tuple[int, int]) -> list[dict]:
    i, n = part
    return [c for j, c in enumerate(space.configs()) if j % n == i]


def study(step: RegionStep, tensors: list, space, device: str, seeds: int, full=None, real_quick: int = 0,
          no_sweeps=None) -> dict:
    timed = objective(step, tensors, device)
    table: dict[tuple, float] = {}
    for cfg in space.configs():  # the exhaustive pass
        try:
            table[space.key(cfg)] = timed(cfg)
        except Exception:  # noqa: BLE001 - a failing config is a failed trial for every policy
            table[space.key(cfg)] = float("inf")
    best = min(table.values())

    def lookup(cfg):
        t = table[space.key(cfg)]
        if t == float("inf"):
            raise RuntimeError("config failed in the exhaustive pass")
        return t

    failed = sum(t == float("inf") for t in table.values())  # raised, or output off the reference
    best_cfg = min(table, key=table.get)
    by_bm: dict[int, float] = {}
    for key, t in table.items():
        bm = dict(zip(space.names, key))["BLOCK_M"]
        by_bm[bm] = min(by_bm.get(bm, float("inf")), t * 1e6)
    k = step.kernel
    weight_bytes = k.shape_key["N"] * k.shape_key["streams"] * k.shape_key["K"] * tensors[0].element_size()
    out = {"space": space.size(), "exhaustive_best_us": best * 1e6, "best_config": dict(zip(space.names, best_cfg)),
           "best_us_by_BLOCK_M": by_bm, "default_us": table.get(space.key(space.default()), float("nan")) * 1e6,
           "weight_TBps_at_best": weight_bytes / best / 1e12, "failed": failed, "policies": {}}  # fmt: skip
    for name in ("random", "bayes"):
        for frac in (0.1, 0.2, 0.4):
            budget = max(2, int(frac * space.size()))
            ratios = [POLICIES[name](space, lookup, budget, None, seed, None).best_time / best for seed in range(seeds)]
            out["policies"][f"{name}@{int(frac * 100)}%"] = {"budget": budget, "mean": statistics.mean(ratios), "worst": max(ratios)}
    # The tuner's quick mode as it runs in a compile (its policy, budget and patience), starting from the
    # default and the seeds, and from the default alone: a shape no sweep has seen (issue 19: within 5%).
    quick = TUNE_MODES["quick"]
    budget = quick.budget(space.count(quick.sizes_that_matter()))
    unseeded = SearchSpace(space.params, space.constraints, space.default(), ())
    for name, sp in (("quick", space), ("quick, default alone", unseeded)):
        ratios = [POLICIES[quick.policy](sp, lookup, budget, quick.patience, seed, None).best_time / best
                  for seed in range(seeds)]
        out["policies"][name] = {"budget": budget, "mean": statistics.mean(ratios), "worst": max(ratios)}
    if full is not None and real_quick:
        # With a narrowed table: the quick search run for real over the whole space (its own budget there),
        # each config timed as the table's were (and once: a memo over the table), against the table's best.
        def memo(cfg):
            key = full.key(cfg)
            if key not in table:
                try:
                    table[key] = timed(cfg)
                except Exception:  # noqa: BLE001
                    table[key] = float("inf")
            return lookup(cfg)

        budget = quick.budget(full.count(quick.sizes_that_matter()))
        runs = [("quick over the whole space, no sweep seeds", no_sweeps or full, s) for s in range(real_quick)]
        runs.append(("quick over the whole space", full, 0))
        for name, sp, seed in runs:
            r = POLICIES[quick.policy](sp, memo, budget, quick.patience, seed, None)
            found = out["policies"].setdefault(name, {"budget": budget, "ratios": [], "configs": []})
            found["ratios"].append(r.best_time / best)
            found["configs"].append(r.best_config)
        for v in out["policies"].values():
            if "ratios" in v:
                v["mean"], v["worst"] = statistics.mean(v["ratios"]), max(v["ratios"])
        out["whole_space"] = full.size()
    # every timed config (µs; null: failed), so other policies can be replayed over this run's times offline
    out["names"] = list(space.names)
    # (the real quick search's configs outside a narrowed space are timed too: kept apart, "whole_space_table")
    inside = {k: t for k, t in table.items() if space.is_valid(dict(zip(space.names, k)))}
    out["table"] = [[list(k), None if t == float("inf") else t * 1e6] for k, t in inside.items()]
    if len(inside) < len(table):
        out["whole_space_table"] = [[list(k), None if t == float("inf") else t * 1e6] for k, t in table.items()
                                    if k not in inside]  # fmt: skip
    out.update(space_record(space, no_sweeps))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="tuning_out")
    p.add_argument("--tokens", default="16,2048")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--block", default="norm_qkv_rope")
    p.add_argument("--region", type=int, default=0, help="which GEMM region of the block (0 = first)")
    p.add_argument("--narrow", default="", help="k=v1/v2,... restricts the space, e.g. num_stages=3/4,GROUP_M=1")
    p.add_argument("--real-quick", type=int, default=0,
                   help="with --narrow: run the quick search for real over the whole space with this many seeds")
    p.add_argument("--part", default="", help="I/N: time only every N-th config from the I-th (merge the parts "
                   "with bench/replay_tuning.py); no policies run")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="processes compiling configs first")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    results = {}
    if a.smoke:
        from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_

        cfg = BlockConfig()
        step, tensors = region(randomize_(LlamaBlock(cfg)).eval(), llama_block_inputs(cfg, 1, 5), "interpret")
        space = step.kernel.space.narrow(BLOCK_K=[32, 64], num_stages=[2, 3], GROUP_M=1)
        if a.part:
            results["smoke"] = time_part(step, tensors, space, tuple(int(x) for x in a.part.split("/")), device="cpu")
        else:
            results["smoke"] = study(step, tensors, space, "cpu", a.seeds)
    else:
        from blocks import BLOCKS

        narrow = {k: [int(x) for x in v.split("/")] for k, v in (kv.split("=") for kv in a.narrow.split(",") if kv)}
        for m in [int(t) for t in a.tokens.split(",")]:
            mod, args, kwargs, _, _ = BLOCKS[a.block](m, torch.bfloat16, "cuda")
            # the space as a card without the sweeps' seeds builds it (the variants' starts only)
            with mock.patch.object(importlib.import_module("dlblas_compiler.codegen.gemm.space"), "SEEDED_ON", -1):
                no_sweeps = region(mod, args, "triton", a.region, kwargs)[0].kernel.space
            step, tensors = region(mod, args, "triton", a.region, kwargs)
            space = step.kernel.space.narrow(**narrow) if narrow else step.kernel.space
            part = tuple(int(x) for x in a.part.split("/")) if a.part else None
            if a.jobs > 1:
                precompile(a.block, a.region, m, space, a.jobs, part)
            if part:
                results[f"{a.block}[{a.region}] M={m}"] = time_part(step, tensors, space, part, no_sweeps)
                continue
            full = step.kernel.space if narrow and a.real_quick else None
            results[f"{a.block}[{a.region}] M={m}"] = study(step, tensors, space, "cuda", a.seeds, full, a.real_quick,
                                                            no_sweeps)
    if torch.cuda.is_available():  # the card and versions, for the report's source line
        import triton

        results["_run"] = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    suffix = "_part{}of{}".format(*a.part.split("/")) if a.part else ""
    with open(os.path.join(a.out, f"tuning_study_{a.block}_{a.region}{suffix}.json"), "w") as f:
        json.dump(results, f, indent=1)
    for key, r in results.items():
        if key.startswith("_"):
            continue
        if "part" in r:
            print(f"{key}: part {r['part']}: timed {len(r['table'])} of {r['space']} configs")
            continue
        print(f"{key}: {r['space']} valid configs ({r['failed']} failed), exhaustive best {r['exhaustive_best_us']:.1f} µs "
              f"({r['weight_TBps_at_best']:.2f} TB/s of weight), default {r['default_us']:.1f} µs, {r['best_config']}")
        print("  best per BLOCK_M: " + ", ".join(f"{bm}: {t:.1f}" for bm, t in sorted(r["best_us_by_BLOCK_M"].items())))
        for pol, v in r["policies"].items():
            print(f"  {pol:12s} budget {v['budget']:4d}: best/exhaustive mean {v['mean']:.3f} worst {v['worst']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
