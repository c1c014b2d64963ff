"""Which timing of a GEMM region's config predicts the layer's time? (bench/NOTES.md 147.)

    python bench/in_layer.py --out OUT --configs tuner_ab.json [--layers qwen25_7b,llama3_8b] [--tokens 2048]
    python bench/in_layer.py --out OUT --vary '{"NORM_PASS": [0, 1]}' --tokens 1   (the tuned config with each value)

For each layer (bench/blocks.HF_LAYERS, compiled with quick tuning) and each GEMM region, the candidates are the
configs the tuner chose for that region in the tuner A/B (`--configs`: a bench/tuner_ab.py result, every variant
and repetition) and the region's reference (cuBLAS and torch ops). Each candidate is timed four ways:
* `iso`: `tuning.benchmark` as quick tuning calls it (the tuner's search);
* `held`: the confirmation round's measure (`profiler.confirm`: every candidate of the region in turn, three rounds);
* `graph`: the region's call replayed from a CUDA graph (do_bench, L2 cleared), as bench/gemms.py times it;
* `layer`: the whole layer's call time (its CUDA graph captured again with the candidate in the region, the other
  regions as tuned), the candidates taken in turn, three rounds, the median.
`--vary` instead of (or beside) `--configs`: each region's candidates are its tuned config with each listed value of
a parameter (those the region's space accepts); regions where that gives no other config are left out.
Writes OUT/in_layer.json: per layer and region, each candidate's four times (µs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from gemms import graph_time_us, region_inputs  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.tuning import TUNE_MODES, benchmark, profiler  # noqa: E402

REFERENCE = "reference"


def candidates(doc: dict, layer: str) -> dict[str, list[dict]]:
    """region -> the distinct configs the A/B's tunings chose for it (impl and config as tuner_ab recorded them)."""
    out: dict[str, list[dict]] = {}
    for entry in doc["layers"]:
        if entry["layer"] != layer:
            continue
        for run in entry["runs"]:
            for region, cfg in run["configs"].items():
                cfg = {k: v for k, v in cfg.items() if k != "impl"}
                if cfg not in out.setdefault(region, []):
                    out[region].append(cfg)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="")
    ap.add_argument("--vary", default="", help='JSON: {"PARAM": [values]}, the tuned config with each value')
    ap.add_argument("--layers", default="qwen25_7b,llama3_8b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    doc = {"layers": []}
    if a.configs:
        with open(a.configs) as fh:
            doc = json.load(fh)
    vary = json.loads(a.vary) if a.vary else {}
    quick = TUNE_MODES["quick"]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tokens": a.tokens, "layers": []}  # fmt: skip
    for name in a.layers.split(","):
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](a.tokens, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="quick")
        call = functools.partial(cm, *args, **kwargs)
        with torch.no_grad():
            call()
            call()
            prog = cm._spec().executor
            found = region_inputs(cm, args, kwargs)
            regions = []
            for step, tensors in found:
                region = step.choice.region
                tuned = (step.choice.impl, dict(step.choice.config))
                configs = candidates(doc, name).get(region, [])
                if tuned[1] not in configs:
                    configs.insert(0, tuned[1])
                for key, values in vary.items():
                    configs += [c for c in ({**tuned[1], key: v} for v in values) if c not in configs]
                configs = [c for c in configs if step.kernel.space.is_valid(c)]
                if vary and len(configs) < 2:
                    continue
                labels = [json.dumps(c, sort_keys=True) for c in configs] + [REFERENCE]
                own = step.private(tensors, every=True)
                runs = [functools.partial(step.launch, own, c) for c in configs]
                runs.append(functools.partial(step.reference, tensors))
                rows = {lab: {"config": lab, "shape": dict(step.kernel.shape_key)} for lab in labels}
                for lab, run in zip(labels, runs):
                    rows[lab]["iso_us"] = benchmark(run, None, quick.warmup_ms, quick.rep_ms) * 1e6
                held = profiler.confirm(lambda r: r, runs)
                for lab, t in zip(labels, held):
                    rows[lab]["held_us"] = t * 1e6
                for lab, run in zip(labels, runs):
                    rows[lab]["graph_us"] = graph_time_us(run)
                layer_us: dict[str, list[float]] = {lab: [] for lab in labels}
                for rnd in range(a.rounds):
                    for lab, cfg in zip(labels, configs + [None]) if rnd % 2 == 0 else list(zip(labels, configs + [None]))[::-1]:
                        if cfg is None:
                            step.choice.impl = "reference"
                        else:
                            step.choice.impl, step.choice.config = "kernel", cfg
                        prog.graph = None  # captured again with this choice
                        call()
                        layer_us[lab].append(triton.testing.do_bench(call, warmup=25, rep=200) * 1e3)
                step.choice.impl, step.choice.config = tuned
                prog.graph = None
                for lab in labels:
                    rows[lab]["layer_us"] = statistics.median(layer_us[lab])
                    rows[lab]["layer_all_us"] = layer_us[lab]
                regions.append({"region": region, "tuned": json.dumps(tuned[1], sort_keys=True), "impl": tuned[0],
                                "rows": list(rows.values())})  # fmt: skip
                print(f"{name} {region} {dict(step.kernel.shape_key)} (tuned impl {tuned[0]})", flush=True)
                for r in rows.values():
                    short = "reference" if r["config"] == REFERENCE else " ".join(
                        f"{k}={v}" for k, v in json.loads(r["config"]).items()
                        if k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "TMA", "MM", "PERSISTENT", *vary))  # fmt: skip
                    print(f"  iso {r['iso_us']:7.1f} held {r['held_us']:7.1f} graph {r['graph_us']:7.1f} "
                          f"layer {r['layer_us']:7.1f}  {short}", flush=True)  # fmt: skip
        res["layers"].append({"layer": name, "regions": regions})
        with open(os.path.join(a.out, "in_layer.json"), "w") as fh:
            json.dump(res, fh, indent=1)
        del cm, mod, prog, found
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
