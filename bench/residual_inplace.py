"""What cuBLAS adding a GEMM's product into a residual nothing reads afterwards (the GEMM template's MM=2) brings to a
stack of decoder layers, where every o-proj after the first and every down has such a residual.

    python bench/residual_inplace.py --out OUT [--layers llama3_8b,qwen25_7b] [--tokens 128,2048] [--depth 4]

For each published HF configuration (bench/blocks.HF_LAYERS, random weights) and token count: the model's decoder
stack of `depth` layers (embeddings and head left out: `model.model(inputs_embeds=x)`), compiled twice with quick
tuning, with MM=2 offered (the tree) and without it (`DLBLAS_GEMM_IN_PLACE=0`: those regions keep the source and
space they had before it). Each call replays the program's CUDA graph; the two are timed call by call in turn
(`run.paired`; eager apart), and each region's choice and each program's CUDA-graph decision are recorded
(`--force-graphs`: replayed even where that decision dropped the graph). `--profile`:
also each compiled call's kernels (bench/profile_kernels.trace: per kernel name its time per call, the kernel sum,
the span and the largest gaps, from a profile of 5 calls each after an L2 clear). Writes OUT/residual_inplace.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import HF_LAYERS, _randn  # noqa: E402
from profile_kernels import flush_signature, trace  # noqa: E402
from run import paired  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen.gemm.cublas import IN_PLACE_ENV  # noqa: E402
from dlblas_compiler.models import randomize_  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402
from dlblas_compiler.runtime.steps import RegionStep  # noqa: E402


def stack(name: str, depth: int, dtype, device):
    """The decoder stack of a HF_LAYERS configuration with `depth` layers, random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields = HF_LAYERS[name]
    cfg = AutoConfig.for_model(model_type, num_hidden_layers=depth, vocab_size=256, max_position_embeddings=8192,
                                pad_token_id=None, bos_token_id=None, eos_token_id=None, **fields)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return randomize_(model.model.to_empty(device=device)).to(dtype=dtype).eval(), fields["hidden_size"]


def compiled(model, x, in_place: bool):
    """Our compile of `model` (quick tuning, CUDA graphs) with MM=2 offered or not; its first call tunes."""
    old = os.environ.get(IN_PLACE_ENV)
    os.environ[IN_PLACE_ENV] = "1" if in_place else "0"
    try:
        cm = dc.compile(model, backend="triton", tune="quick", cuda_graphs=True)
        with torch.no_grad():
            cm(inputs_embeds=x, use_cache=False)
            cm(inputs_embeds=x, use_cache=False)
    finally:
        if old is None:
            os.environ.pop(IN_PLACE_ENV)
        else:
            os.environ[IN_PLACE_ENV] = old
    torch.cuda.synchronize()
    return cm


def choices(cm) -> list[dict]:
    out = []
    for s in cm._spec().executor.steps:
        if isinstance(s, RegionStep) and s.kernel is not None and "streams" in s.kernel.shape_key:
            c = s.choice
            out.append({"region": c.region, "impl": c.impl, "config": c.config, "time_us": (c.time or 0) * 1e6,
                        "overwrites": list(s.kernel.overwrites), "ops": [o.name for o in s.kernel.region.body_ops]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b")
    ap.add_argument("--tokens", default="128,2048")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--force-graphs", action="store_true",
                    help="replay both programs' CUDA graphs even where their keep-or-drop timing dropped one")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "residual_inplace.json")
    rows = []
    for name in args.layers.split(","):
        model, h = stack(name, args.depth, torch.bfloat16, "cuda")
        for m in map(int, args.tokens.split(",")):
            x = _randn(1, m, h, dtype=torch.bfloat16, device="cuda", seed=1)
            with torch.no_grad():
                ref = model.double()(inputs_embeds=x.double(), use_cache=False).last_hidden_state
                model.to(torch.bfloat16)
                eager_out = model(inputs_embeds=x, use_cache=False).last_hidden_state
            cms = {"in place": compiled(model, x, True), "without": compiled(model, x, False)}
            graphs = {k: {"cuda_graphs": cm._spec().executor.cuda_graphs, "note": cm._spec().executor.graph_note}
                      for k, cm in cms.items()}  # fmt: skip
            if args.force_graphs:  # (the decision is recorded above; at 2048 tokens it is within its timing's noise)
                for cm in cms.values():
                    program = cm._spec().executor
                    program.cuda_graphs, program.graphs_pay = True, True
            errs = {"eager": rel_error(eager_out, ref)}
            fns = {"eager": lambda model=model, x=x: model(inputs_embeds=x, use_cache=False)}
            with torch.no_grad():
                for k, cm in cms.items():
                    errs[k] = rel_error(cm(inputs_embeds=x, use_cache=False).last_hidden_state, ref)
                    fns[k] = lambda cm=cm, x=x: cm(inputs_embeds=x, use_cache=False)
                # (the two compiled calls alone in turn: with a third, host-bound call in the rotation, the call
                # after it would wait for the host inside its events in 2 of 3 turns, the other in 1 of 3)
                times = dict(zip(cms, paired([fns[k] for k in cms], args.calls), strict=True))
                times["eager"] = paired([fns["eager"]], max(5, args.calls // 10))[0]
            med = {k: statistics.median(t) for k, t in times.items()}
            row = {"layer": name, "depth": args.depth, "M": m, "call_us": med, "rel_error_vs_float64": errs,
                   "choices": {k: choices(cm) for k, cm in cms.items()}, "gpu": torch.cuda.get_device_name(),
                   "torch": torch.__version__}  # fmt: skip
            row["graphs"], row["forced_graphs"] = graphs, args.force_graphs
            if args.profile:
                flush = flush_signature()
                with torch.no_grad():
                    row["kernels"] = {k: trace(fns[k], 5, flush) for k in cms}
                for k, r in row["kernels"].items():
                    print(f"  {k}: kernel sum {r['kernel_sum']:.1f} µs, span {r['span']:.1f}, "
                          f"{r['kernels_per_call']} kernels; gaps {r['largest_gaps']}", flush=True)
                    for kname, us in sorted(r["per_kernel"].items(), key=lambda kv: -kv[1])[:14]:
                        print(f"      {us:8.1f} µs  {kname}")
            rows.append(row)
            ran = [c["region"] for c in row["choices"]["in place"] if (c["config"] or {}).get("MM") == 2]
            print(f"{name} x{args.depth} M={m}: in place {med['in place']:.1f} µs, without {med['without']:.1f} "
                  f"({med['without'] / med['in place']:.3f}x), eager {med['eager']:.1f}; MM=2 ran on {ran}; "
                  f"errors {', '.join(f'{k} {v:.1e}' for k, v in errs.items())}; graphs {row['graphs']}", flush=True)
            for k in ("in place", "without"):
                for c in row["choices"][k]:
                    if c["overwrites"] or "dl.add" in c["ops"]:
                        print(f"  {k:8s} {c['region']:8s} {c['impl']:9s} {c['time_us']:8.1f} µs {c['config']}")
            with open(path, "w") as f:
                json.dump(rows, f, indent=1)
            del cms
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
