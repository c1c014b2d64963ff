"""Decode per token (and prefill) of several modes in ONE process, their generate() calls interleaved:
bench/generate.py runs each mode in its own process, and on a shared host the host's speed drifts between processes
by more than the modes differ (BENCHMARKS.md, thirtieth session: a decode step's host time moved 1.65 -> 2.65 ms
between two processes of the same tree in one device call). Here every mode has its own copy of the model
(bench/generate.py's Llama-3-8B-shaped `LlamaForCausalLM`, or with --model a *ForCausalLM of another published
configuration; random weights, bf16, greedy, static cache), is compiled and warmed, and then each round times every
mode back to back (the order turning each round): generate() of one token and of N. Decode ms per token =
(t_N - t_1) / (N - 1); prefill ms = t_1 (the prompt's forward and one sampling step; hf-auto's prefill is eager's,
as generate() compiles only its decode step). A drift of the host then falls on every mode of a round alike; the
ratios are taken within rounds.

    python bench/decode_ab.py --out OUT [--modes ours,hf-auto,eager] [--rounds 5] [--new 128] [--prompt 128]
                              [--model llama3_8b|qwen3_8b|...]

Modes: ours (`dc.compile(model.forward, backend="triton", tune=--tune)`), ours-unchained (ours
with `chained_launches=False`), ours-no-inplace (ours with `DLBLAS_GEMM_IN_PLACE=0` around its calls: no GEMM region
adds its product into a dead residual in place, MM=2, bench/NOTES.md 179), hf-auto (plain generate(): with a static
cache on a GPU it compiles the decode step itself, torch.compile mode "reduce-overhead"), inductor
(`torch.compile(model.forward)`), eager. Results: OUT/decode_ab.json (per mode: the first call's seconds, each
round's decode ms per token and prefill ms; per round the ratios of each mode to the first; medians; ours' report
of a decode step). `--trace` (GPU): then, per mode, a torch.profiler trace of generate() of 9 tokens minus one of 1
token (8 decode steps): wall and GPU busy ms, and the largest kernels grouped by name with layer numbers blanked
(our kernels are named per region: gemm_4, attention_130), so what a token's time above the floor is made of,
for each mode, is read from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


# the vocabularies of the published configurations (bench/blocks.py HF_LAYERS keeps their layers' dims)
VOCABS = {"qwen25_7b": 152064, "qwen3_8b": 151936, "gemma_7b": 256000, "llama32_3b": 128256, "phi3_mini": 32064,
          "mistral_nemo_12b": 131072}  # fmt: skip


def build_model(name: str, layers: int, dtype, device: str, sliding_window: int | None = None):
    """`llama3_8b`: bench/generate.py's model; another name: a *ForCausalLM of that published configuration
    (bench/blocks.py HF_LAYERS, its vocabulary from VOCABS), made in `dtype` on the device, random weights;
    `sliding_window` (Phi-3-mini's published one is 2047, Mistral-7B-v0.1's 4096) for the families that take one."""
    from generate import build, instantiate

    if name == "llama3_8b":
        if sliding_window:
            raise SystemExit("--sliding-window needs a --model whose family has sliding windows (phi3_mini, ...)")
        return build(layers, dtype, device)
    from blocks import HF_LAYERS
    from transformers import AutoConfig

    model_type, fields = HF_LAYERS[name]
    cfg = AutoConfig.for_model(model_type, num_hidden_layers=layers, vocab_size=VOCABS[name],
                               max_position_embeddings=8192, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                               **fields)  # fmt: skip
    if sliding_window:
        cfg.sliding_window = sliding_window
    return instantiate(cfg, dtype, device)


def make(mode: str, model_name: str, layers: int, tune: str, device: str, sliding_window: int | None = None):
    """The model of `mode` and the generate() keywords it runs with. `ours-int-keyed` is ours with every int input
    in the specialization key (the tree before NOTES 111: a sliding-window cache's counter made every decode token
    a new specialization, run without a CUDA graph)."""
    import torch

    import dlblas_compiler as dc

    torch.manual_seed(0)
    model = build_model(model_name, layers, torch.bfloat16, device, sliding_window)
    gen = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
    if mode != "hf-auto":  # (generate() would otherwise torch.compile the decode step itself)
        gen["disable_compile"] = True
    if mode in ("ours", "ours-int-keyed", "ours-unchained", "ours-no-inplace"):
        model.forward = dc.compile(model.forward, backend="triton" if device == "cuda" else "reference", tune=tune,
                                   chained_launches=mode != "ours-unchained")  # fmt: skip
    elif mode == "inductor":
        model.forward = torch.compile(model.forward)
    elif mode not in ("eager", "hf-auto"):
        raise SystemExit(f"unknown mode {mode!r}")
    return model, gen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="ours,hf-auto,eager")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--model", default="llama3_8b", help="llama3_8b, or a published configuration: " + ", ".join(VOCABS))
    ap.add_argument("--tune", default="quick")
    ap.add_argument("--sliding-window", type=int, default=None, help="the config's sliding window (phi3_mini: 2047)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the script's flow on a tiny model (tests)")
    ap.add_argument("--trace", action="store_true", help="add each mode's profiler summary of 8 decode steps (GPU)")
    args = ap.parse_args(argv)
    import torch

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    modes = args.modes.split(",")
    ids = torch.randint(3, 1000, (1, args.prompt), generator=torch.Generator().manual_seed(1)).to(args.device)
    runs, doc = {}, {"model": args.model, "sliding_window": args.sliding_window, "modes": modes, "prompt": args.prompt, "new": args.new, "layers": args.layers, "tune": args.tune,
                     "first_call_s": {}, "rounds": []}  # fmt: skip
    if cuda:
        doc["gpu"] = torch.cuda.get_device_name()
        doc["versions"] = {"torch": torch.__version__, "triton": __import__("triton").__version__,
                           "transformers": __import__("transformers").__version__}  # fmt: skip

    from dlblas_compiler import api
    from dlblas_compiler.codegen.gemm.cublas import IN_PLACE_ENV

    unread_ints = api.unread_ints

    def generate(mode: str, n: int) -> float:
        model, gen = runs[mode]
        api.unread_ints = (lambda gm: frozenset()) if mode == "ours-int-keyed" else unread_ints  # (graphs made now)
        old = os.environ.pop(IN_PLACE_ENV, None)  # (read where a region's kernel is made: during the call)
        if mode == "ours-no-inplace":
            os.environ[IN_PLACE_ENV] = "0"
        try:
            sync()
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen)
            sync()
            return time.perf_counter() - t0
        finally:
            api.unread_ints = unread_ints
            os.environ.pop(IN_PLACE_ENV, None)
            if old is not None:
                os.environ[IN_PLACE_ENV] = old

    for mode in modes:  # compile and warm each (the first call: compile, tuning, capture), then once more, and a
        runs[mode] = make(mode, args.model, args.layers, args.tune, args.device, args.sliding_window)  # generate() of one token (ours'
        doc["first_call_s"][mode] = round(generate(mode, args.new), 3)  # first one took 1.6 s in a round at
        generate(mode, args.new)  # prompt 2048, BENCHMARKS.md thirty-first session)
        if mode in ("ours", "ours-no-inplace"):  # what the last call (a decode step) ran: regions, kernels, what
            doc[f"{mode.replace('-', '_')}_decode_report"] = str(runs[mode][0].forward.report())  # stayed in torch
        generate(mode, 1)
        print(f"{mode}: first call {doc['first_call_s'][mode]} s", flush=True)
    for r in range(args.rounds):
        order = modes if r % 2 == 0 else modes[::-1]
        per, pre = {}, {}
        for mode in order:
            one, many = generate(mode, 1), generate(mode, args.new)
            per[mode] = round((many - one) / (args.new - 1) * 1e3, 4)
            pre[mode] = round(one * 1e3, 3)
        ratios = {m: round(per[m] / per[modes[0]], 4) for m in modes[1:]}  # (> 1: the first mode is faster)
        prefill_ratios = {m: round(pre[m] / pre[modes[0]], 4) for m in modes[1:]}
        doc["rounds"].append({"order": order, "decode_ms_per_token": per, "ratio_to_first": ratios,
                              "prefill_ms": pre, "prefill_ratio_to_first": prefill_ratios})  # fmt: skip
        print(json.dumps(doc["rounds"][-1]), flush=True)
    if args.trace and cuda:
        import re

        from generate import traced

        def family(name: str) -> str:  # gemm_4 -> gemm_#, triton_poi_fused_add_3 -> triton_poi_fused_add_#
            return re.sub(r"_\d+(?=\b|_)", "_#", name)[:100]

        doc["trace_decode_8"] = {m: traced(lambda m=m: generate(m, 9), lambda m=m: generate(m, 1), family) for m in modes}
        print(json.dumps(doc["trace_decode_8"]), flush=True)
    # how many specializations each of ours' modes made (compiles and instances, every graph): one a token where
    # the decode step is not served by one program
    doc["specializations"] = {m: sum(c.compile_count + c.instances for c in runs[m][0].forward.compilations)
                              for m in modes if m.startswith("ours")}  # fmt: skip
    doc["median_decode_ms_per_token"] = {m: statistics.median(r["decode_ms_per_token"][m] for r in doc["rounds"])
                                         for m in modes}  # fmt: skip
    doc["median_ratio_to_first"] = {m: statistics.median(r["ratio_to_first"][m] for r in doc["rounds"])
                                    for m in modes[1:]}  # fmt: skip
    doc["median_prefill_ms"] = {m: statistics.median(r["prefill_ms"][m] for r in doc["rounds"]) for m in modes}
    doc["median_prefill_ratio_to_first"] = {m: statistics.median(r["prefill_ratio_to_first"][m] for r in doc["rounds"])
                                            for m in modes[1:]}  # fmt: skip
    print(json.dumps({k: doc[k] for k in ("first_call_s", "specializations", "median_decode_ms_per_token", "median_ratio_to_first",
                                          "median_prefill_ms", "median_prefill_ratio_to_first")}))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_ab.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
