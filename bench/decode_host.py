"""Where a decode step's wall time goes in generate(): the GPU's time inside our forward against the host's time
around it, per token, on the 32-layer Llama-3-8B-shaped model of bench/generate.py (static cache, bf16, greedy).

    python bench/decode_host.py --out OUT [--prompt 128] [--new 64] [--tune none] [--cache static|dynamic]
                                [--cuda-graphs 1|0] [--eager]

For each decode token of one generate(): host ms inside `model.forward` (dynamo's guards, our call: its key,
weights check, input copies, the graph replay's launch, output clones), inside our compiled module (the function
dynamo calls, `CompiledModule.guarded`), inside the CUDA-graph replay; GPU ms between CUDA events recorded at the forward's entry and exit (the decode graph);
the GPU's idle ms from one forward's exit event to the next one's entry event (HF's loop, whose stopping check
waits for the GPU, plus our host time before the replay). Medians over the decode tokens, and a cProfile of a
generate() of --new tokens (cumulative and internal time). `--cuda-graphs 0` runs every call's steps directly (each
kernel launched from the host, as for a length never captured), `--cache dynamic` uses HF's default cache (a new
length every token), `--eager` times the model without compiling it. Results: OUT/decode_host[-TAG].json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tune", default="none")
    ap.add_argument("--cache", default="static", choices=["static", "dynamic"])
    ap.add_argument("--cuda-graphs", type=int, default=1)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    import torch
    from generate import build

    import dlblas_compiler as dc
    from dlblas_compiler import api
    from dlblas_compiler.runtime import graphs

    model = build(args.layers, torch.bfloat16)
    ids = torch.randint(0, 1000, (1, args.prompt), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    gen = dict(do_sample=False, pad_token_id=0, disable_compile=True)
    if args.cache == "static":
        gen["cache_implementation"] = "static"
    if args.eager:
        eager_forward = model.forward

        def compiled(*a, **k):
            return eager_forward(*a, **k)

        compiled.compilations = []
    else:
        compiled = dc.compile(model.forward, backend="triton", tune=args.tune, cuda_graphs=bool(args.cuda_graphs))

    spans: dict[str, list[float]] = {"forward": [], "ours": [], "replay": [], "program": [], "weights_check": [],
                                     "alias_pattern": [], "write_back": []}
    events: list[tuple] = []
    on = [False]

    def timing(fn, key):
        def timed(*a, **k):
            if not on[0]:
                return fn(*a, **k)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spans[key].append((time.perf_counter() - t0) * 1e3)

        return timed

    def forward(*a, **k):
        if not on[0]:
            return compiled(*a, **k)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        out = compiled(*a, **k)
        e1.record()
        t1 = time.perf_counter()
        events.append((t0, t1, e0, e1))
        spans["forward"].append((t1 - t0) * 1e3)
        return out

    entry = "guarded" if hasattr(api.CompiledModule, "guarded") else "forward"  # (dynamo's entry; older trees: forward)
    setattr(api.CompiledModule, entry, timing(getattr(api.CompiledModule, entry), "ours"))
    graphs.CudaGraph.replay = timing(graphs.CudaGraph.replay, "replay")
    # the parts of our host time: the program's call (the replay included), the weights' version check, the call
    # key's alias pattern, the write-back of in-place updated inputs
    from dlblas_compiler.runtime import program as program_mod
    from dlblas_compiler.runtime import weights as weights_mod

    program_mod.Program.__call__ = timing(program_mod.Program.__call__, "program")
    weights_mod.DerivedWeights.changed = timing(weights_mod.DerivedWeights.changed, "weights_check")
    api._alias_pattern = timing(api._alias_pattern, "alias_pattern")
    api.Specialization._write_back = timing(api.Specialization._write_back, "write_back")
    model.forward = forward

    def generate(n: int):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(3):  # compile, capture, settle
        generate(args.new)
    one = statistics.median(generate(1) for _ in range(3))
    many = statistics.median(generate(args.new) for _ in range(3))
    on[0] = True
    generate(args.new)
    on[0] = False
    torch.cuda.synchronize()
    decode = events[1:]  # (the first forward is the prefill)
    gpu = [e0.elapsed_time(e1) for _, _, e0, e1 in decode]
    idle = [decode[i][3].elapsed_time(decode[i + 1][2]) for i in range(len(decode) - 1)]
    host_between = [(decode[i + 1][0] - decode[i][1]) * 1e3 for i in range(len(decode) - 1)]
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    row = {
        "prompt": args.prompt, "new": args.new, "layers": args.layers, "tune": args.tune, "cache": args.cache,
        "cuda_graphs": args.cuda_graphs, "mode": "eager" if args.eager else "ours",
        "decode_ms_per_token": round((many - one) / (args.new - 1), 3),
        "host_ms_in_forward": med(spans["forward"][1:]), "host_ms_in_ours": med(spans["ours"][1:]),
        "host_ms_in_replay": med(spans["replay"]) if spans["replay"] else None,
        **{f"host_ms_in_{k}": med(spans[k][1:]) for k in ("program", "weights_check", "alias_pattern", "write_back")},
        "gpu_ms_in_forward": med(gpu), "gpu_idle_ms_between_forwards": med(idle),
        "host_ms_between_forwards": med(host_between),
        "graph_notes": [c._spec().executor.graph_note for c in compiled.compilations],
    }  # fmt: skip
    print(json.dumps(row), flush=True)
    prof = cProfile.Profile()
    prof.enable()
    generate(args.new)  # (the length already compiled: a new one would profile its compile)
    prof.disable()
    for key, sort, n in (("profile_cumulative", "cumulative", 70), ("profile_internal", "tottime", 40)):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(sort).print_stats(n)
        row[key] = text.getvalue().splitlines()
    with open(os.path.join(args.out, f"decode_host{'-' + args.tag if args.tag else ''}.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "row": row}, f, indent=1)


if __name__ == "__main__":
    main()
