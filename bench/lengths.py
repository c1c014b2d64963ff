"""New lengths on the GPU: the first call of each new prompt length, and generate() with Hugging Face's default
(dynamic) cache, each mode in its own process. The model is generate.py's Llama-3-8B-shaped LlamaForCausalLM
(random weights, bf16, greedy).

    python bench/lengths.py --out OUT [--layers 32] [--modes eager,inductor,ours] [--prompts 2048,2000,...]

prompts: each prompt length in turn is prefilled (generate() of one token) into one static cache of a fixed size
(--cache, so only the prompt length changes): the first call's time, the second's (ours captures its CUDA graph
and times it against direct calls there) and the third's (ms), and for ours the full compiles and shape-family
instances the first call took (`CompiledModule.compile_count`, `.instances`).
dynamic: generate() of --new tokens after a --prompt-token prompt with the default DynamicCache (a new cache
length every token): the first call's time, the second's, then ms per token on a third and fourth call
((t(new) - t(1)) / (new - 1)).
Modes: eager; inductor (torch.compile default: dynamo marks the length dynamic on the second length and compiles
once more); ours (dc.compile(model.forward, backend="triton", tune="quick"): the first two lengths of a
power-of-two bucket are compiled, the others instantiated). Peak GPU memory per mode. Results: OUT/lengths.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from generate import VOCAB, build  # noqa: E402


def run_mode(mode: str, args) -> dict:
    import torch
    from transformers import StaticCache

    import dlblas_compiler as dc

    model = build(args.layers, torch.bfloat16)
    if mode == "inductor":
        model.forward = torch.compile(model.forward)
    elif mode == "ours":
        model.forward = dc.compile(model.forward, backend="triton", tune=args.tune)
    row: dict = {"mode": mode, "layers": args.layers, "cache": args.cache, "prompts": [], "dynamic": {}}

    def counts():
        comps = getattr(model.forward, "compilations", [])
        return sum(c.compile_count for c in comps), sum(c.instances for c in comps)

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn()
        torch.cuda.synchronize()
        return out, (time.perf_counter() - t0) * 1e3

    parts = args.parts.split(",")
    cache = StaticCache(config=model.config, max_cache_len=args.cache)
    gen = dict(do_sample=False, pad_token_id=0, disable_compile=True)
    for n in (int(p) for p in args.prompts.split(",") if "prompts" in parts):
        ids = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)).cuda()

        def prefill(ids=ids):
            cache.reset()
            return model.generate(ids, max_new_tokens=1, min_new_tokens=1, past_key_values=cache, **gen)

        before = counts()
        _, first = timed(prefill)
        after = counts()
        _, second = timed(prefill)
        _, third = timed(prefill)
        entry = {"prompt": n, "first_ms": first, "second_ms": second, "third_ms": third}
        if mode == "ours":
            entry["compiles"], entry["instances"] = after[0] - before[0], after[1] - before[1]
        row["prompts"].append(entry)
        print(json.dumps(entry), flush=True)
    row["peak_gib_prompts"] = torch.cuda.max_memory_allocated() / 2**30
    cache = None  # (its memory goes before the dynamic-cache part)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, VOCAB, (1, args.prompt), generator=torch.Generator().manual_seed(1)).cuda()

    def generate(k):
        return lambda: model.generate(ids, max_new_tokens=k, min_new_tokens=k, **gen)

    if "dynamic" not in parts:
        return row
    before = counts()
    out, row["dynamic"]["first_ms"] = timed(generate(args.new))
    after = counts()
    # the second call may still compile: dynamo hands the first decode length to its dynamic graph now
    _, row["dynamic"]["second_ms"] = timed(generate(args.new))
    second = counts()
    _, one = timed(generate(1))
    if args.profile:  # where the host's time per token goes (a new cache length every token)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    _, many = timed(generate(args.new))
    if args.profile:
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumtime").print_stats(60)
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
        row["dynamic"]["host_profile"] = text.getvalue().splitlines()
    row["dynamic"].update(prompt=args.prompt, new=args.new, ms_per_token=(many - one) / (args.new - 1),
                          peak_gib=torch.cuda.max_memory_allocated() / 2**30)  # fmt: skip
    if mode == "ours":
        row["dynamic"]["compiles"], row["dynamic"]["instances"] = after[0] - before[0], after[1] - before[1]
        row["dynamic"]["second_compiles"], row["dynamic"]["second_instances"] = second[0] - after[0], second[1] - after[1]
        third = counts()
        row["dynamic"]["timed_compiles"] = third[0] - second[0]  # (in the calls timed per token: should be 0)
    torch.save(out.cpu(), os.path.join(args.out, f"lengths-tokens-{mode}.pt"))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompts", default="2048,2000,1900,1500,1100,1024,1000,900,800")
    ap.add_argument("--cache", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--tune", default="quick")
    ap.add_argument("--modes", default="eager,inductor,ours")
    ap.add_argument("--parts", default="prompts,dynamic")
    ap.add_argument("--profile", action="store_true", help="add a cProfile of the second dynamic-cache generate()")
    ap.add_argument("--timeout", type=int, default=400, help="seconds per mode")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # (a child process: run this one mode)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.mode:
        try:
            row = run_mode(args.mode, args)
        except Exception as e:  # noqa: BLE001 - a failing mode is a result
            traceback.print_exc()
            row = {"mode": args.mode, "error": f"{type(e).__name__}: {str(e)[:600]}"}
        print("ROW " + json.dumps(row), flush=True)
        return 0
    import torch

    path = os.path.join(args.out, "lengths.json")
    doc = {"gpu": torch.cuda.get_device_name(), "rows": [],
           "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__,
                        "transformers": __import__("transformers").__version__}}  # fmt: skip
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--mode", mode, *sum((["--" + k, str(getattr(args, k))] for k in
               ("out", "layers", "prompts", "cache", "prompt", "new", "tune", "parts")), [])]  # fmt: skip
        cmd += ["--profile"] if args.profile else []
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")), None)
            row = json.loads(line[4:]) if line else {"mode": mode, "error": proc.stderr[-800:]}
        except subprocess.TimeoutExpired as e:
            row = {"mode": mode, "error": f"timed out after {args.timeout} s", "partial": str(e.stdout)[-1500:]}
        row["process_s"] = time.time() - t0
        doc["rows"].append(row)
        json.dump(doc, open(path, "w"), indent=1)
        print(json.dumps(row), flush=True)
    eager = os.path.join(args.out, "lengths-tokens-eager.pt")
    for row in doc["rows"]:  # (greedy tokens of the dynamic-cache generate() against eager's)
        mine = os.path.join(args.out, f"lengths-tokens-{row['mode']}.pt")
        if os.path.exists(eager) and os.path.exists(mine) and "dynamic" in row:
            same = (torch.load(eager) == torch.load(mine)).all(0)[args.prompt:]
            row["dynamic"]["tokens_equal_eager"] = int(same.long().cumprod(0).sum().item())
    json.dump(doc, open(path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
