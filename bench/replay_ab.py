"""The decode step's CUDA graph of several compilations of one model, replayed in alternating blocks in ONE process:
what a change inside the graph (a kernel's code, its launch attributes) moves, apart from the host. A token's time
carries the host's drift between processes and rounds (BENCHMARKS.md, thirty-sixth session: ±4%, larger than a
1% change); a graph's replay does not, and blocks of the modes in turn put any drift of the card on all of them.

    python bench/replay_ab.py --out OUT [--modes plain,chained] [--blocks 12] [--reps 50]
                              [--prompt 128] [--layers 32] [--model llama3_8b|qwen3_8b|...]

Modes (each its own copy of the model, the same random weights): plain (`dc.compile(model.forward,
chained_launches=False)`) and chained (`chained_launches=True`: programmatic dependent launch). The kernels' sources
and so their tuning are the same in both.
Each mode runs generate() (prefill, then decode steps: the decode program's graph captured), then its decode graph
is found among the CUDA graphs made and replayed `reps` times a block, its small static inputs (the caches' length
counters) put back before each block so every block writes the same cache positions. Results: OUT/replay_ab.json
(per mode, each block's µs per replay; medians; the first replay's logits against the first mode's: max abs
difference).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _profile(g, saved, replays: int = 5) -> dict:
    """A torch.profiler trace of `replays` replays: each kernel family's summed time a replay (µs; layer numbers
    blanked: gemm_4 -> gemm_#), with its launches a replay. Under PDL a kernel's span starts when its programs are
    scheduled, before the one it waits for has ended: its time then includes the wait."""
    import re

    import torch
    from torch.profiler import ProfilerActivity, profile

    for t, v in saved:
        t.copy_(v)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.graph.replay()
        torch.cuda.synchronize()
    fams: dict[str, list] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            f = fams.setdefault(re.sub(r"_\d+(?=\b|_)", "_#", e.name)[:80], [0, 0.0])
            f[0] += 1
            f[1] += e.device_time
    top = sorted(fams.items(), key=lambda kv: -kv[1][1])[:10]
    return {k: [n // replays, round(t / replays, 1)] for k, (n, t) in top}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="plain,chained")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--model", default="llama3_8b")
    ap.add_argument("--tune", default="quick")
    args = ap.parse_args(argv)
    import torch

    import dlblas_compiler as dc
    from dlblas_compiler.runtime.graphs import CudaGraph
    from decode_ab import build_model

    modes = args.modes.split(",")
    # (each mode's model is compiled through dynamo: the same code object, two entries each, prefill and decode)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(modes))
    ids = torch.randint(3, 1000, (1, args.prompt), generator=torch.Generator().manual_seed(1)).cuda()
    doc = {"model": args.model, "layers": args.layers, "prompt": args.prompt, "modes": modes, "blocks": args.blocks,
           "reps": args.reps, "gpu": torch.cuda.get_device_name(),
           "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__}}  # fmt: skip
    graphs, models, seen = {}, {}, set()
    for mode in modes:
        if mode not in ("plain", "chained"):
            raise SystemExit(f"unknown mode {mode!r}")
        torch.manual_seed(0)
        model = build_model(args.model, args.layers, torch.bfloat16, "cuda")
        model.forward = dc.compile(model.forward, backend="triton", tune=args.tune,
                                   chained_launches=mode == "chained")  # fmt: skip
        # the cache holds the prompt, this generate()'s tokens, then each block's replays from its end and a margin
        # (sized to this call's tokens alone, the replays wrote past its end: torch's index_copy_ asserted on
        # Qwen3-8B, whose cache writes are not in our kernels, where ours write nothing out of range)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=args.reps + 8, min_new_tokens=args.reps + 8, do_sample=False,
                           cache_implementation="static", max_cache_len=args.prompt + 2 * args.reps + 16,
                           pad_token_id=0, disable_compile=True)  # fmt: skip
        torch.cuda.synchronize()
        made = [g for g in gc.get_objects() if type(g) is CudaGraph and g.graph is not None and id(g) not in seen]
        seen.update(id(g) for g in made)
        decode = [g for g in made if any(t.dtype == torch.long and t.dim() == 2 and t.shape == (1, 1) for t in g.static_in)]
        if len(decode) != 1:
            raise SystemExit(f"{mode}: {len(decode)} decode graphs among the {len(made)} made")
        graphs[mode], models[mode] = decode[0], model
        print(f"{mode}: decode graph found ({len(decode[0].static_in)} inputs)", flush=True)

    def counters(g: CudaGraph) -> list:
        return [(g.static_in[i], g.static_in[i].clone()) for i in g.static if g.static_in[i].numel() <= 4096]

    saved = {m: counters(graphs[m]) for m in modes}
    logits = {}
    for m in modes:  # one replay from the saved state: each mode's logits
        graphs[m].graph.replay()
        torch.cuda.synchronize()
        logits[m] = next(o for o in graphs[m].static_out if o.dim() == 3).float().clone()
        for t, v in saved[m]:
            t.copy_(v)
    doc["logits_max_abs_diff_to_first"] = {m: float((logits[m] - logits[modes[0]]).abs().max()) for m in modes[1:]}
    per = {m: [] for m in modes}
    for b in range(args.blocks):
        for m in modes if b % 2 == 0 else modes[::-1]:
            for t, v in saved[m]:
                t.copy_(v)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(args.reps):
                graphs[m].graph.replay()
            end.record()
            end.synchronize()
            per[m].append(round(start.elapsed_time(end) * 1e3 / args.reps, 1))
        print(json.dumps({m: per[m][-1] for m in modes}), flush=True)
    doc["kernels_us_per_replay"] = {m: _profile(graphs[m], saved[m]) for m in modes}
    doc["us_per_replay"] = per
    doc["median_us_per_replay"] = {m: statistics.median(per[m]) for m in modes}
    doc["median_ratio_to_first"] = {m: round(statistics.median(a / b for a, b in zip(per[m], per[modes[0]])), 4)
                                    for m in modes[1:]}  # fmt: skip
    print(json.dumps({k: doc[k] for k in ("median_us_per_replay", "median_ratio_to_first",
                                          "logits_max_abs_diff_to_first")}))  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "replay_ab.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
