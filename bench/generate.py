"""LLM generation on the GPU: a Llama-3-8B-shaped LlamaForCausalLM (random weights, no download), bf16, greedy,
HF's static KV cache, each mode in its own process.

    python bench/generate.py --out OUT --batch 1 --prompt 128 --new 256 --modes eager,inductor,ours [--layers 32]

Modes: eager; inductor (torch.compile default); max-autotune; reduce-overhead (HF's recommended static-cache
setup: `model.forward = torch.compile(model.forward, mode="reduce-overhead")`); hf-auto (plain generate(): with a
static cache on a GPU it compiles the decode step itself, torch.compile mode "reduce-overhead", prefill eager; every
other mode passes `disable_compile=True` so that "eager" is eager and a compiled forward is not compiled again);
ours (`model.forward = dc.compile(model.forward, backend="triton", tune="quick")`, with `keep_traces=True`
under --keep-traces); ours-warm (ours again in a new process, the tuning cache, and with --keep-traces dynamo's
saved traces, now filled); ours-unchained (ours with `chained_launches=False`: the generated
kernels launched without programmatic dependent launch); fp32 (the float32 model's first-step logits, the reference of
the relative errors). Per mode: the first generate() call's time (cold compile included), prefill ms (a generate
of one token), decode ms/token ((time of N tokens - time of one) / (N - 1), medians of 3), peak GPU memory,
first-step logits relative error against float32, and the number of leading tokens equal to eager's. The floor
of a decode step: weights plus the keys and values read per token, over the copy bandwidth measured in the same
process. A mode that fails records why. Results go to OUT/generate.json, one row per (batch, prompt, mode).
Decode rates of modes in different processes carry each process's host speed: bench/decode_ab.py compares modes
within one process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

H, I, HQ, HK, D, VOCAB = 4096, 14336, 32, 8, 128, 128256


def build(layers: int, dtype, device="cuda"):
    """The Llama-3-8B-shaped model with `layers` layers (`instantiate`)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=H, intermediate_size=I, num_attention_heads=HQ, num_key_value_heads=HK, head_dim=D,
                      num_hidden_layers=layers, vocab_size=VOCAB, rms_norm_eps=1e-5, rope_theta=500000.0,
                      max_position_embeddings=8192)  # fmt: skip
    return instantiate(cfg, dtype, device)


def instantiate(cfg, dtype, device="cuda"):
    """The *ForCausalLM of a HF config made directly in `dtype` on the device (SDPA attention), its parameters drawn
    there (`randomize_`: norm weights around 1, matrices with std 0.3/sqrt(fan-in), the same draws for every dtype)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dlblas_compiler.models import randomize_

    cfg._attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(default)
    return randomize_(model, seed=0, scale=0.3, device=device).to(dtype).eval()


def run_mode(mode: str, args) -> dict:
    import torch

    import dlblas_compiler as dc

    torch.manual_seed(0)
    dtype = torch.float32 if mode == "fp32" else torch.bfloat16
    model = build(args.layers, dtype)
    ids = torch.randint(0, VOCAB, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1)).cuda()
    row: dict = {"mode": mode, "batch": args.batch, "prompt": args.prompt, "new": args.new, "layers": args.layers}
    gen = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
    if mode != "hf-auto":  # (generate() would otherwise torch.compile the decode step itself)
        gen["disable_compile"] = True
    if mode == "fp32":
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=1, min_new_tokens=1, output_logits=True, return_dict_in_generate=True, **gen)
        torch.save(out.logits[0].float().cpu(), os.path.join(args.scratch, f"logits-{args.batch}-{args.prompt}-fp32.pt"))
        return row
    if mode in ("inductor", "max-autotune", "reduce-overhead"):
        model.forward = torch.compile(model.forward, mode=None if mode == "inductor" else mode)
    elif mode.startswith("ours"):
        chained = mode != "ours-unchained"
        model.forward = dc.compile(model.forward, backend="triton", tune=args.tune, chained_launches=chained,
                                   keep_traces=args.keep_traces)  # fmt: skip
        row["keep_traces"] = args.keep_traces

    def generate(n: int, **kw):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen, **kw)
        torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    calls: list[float] = []  # the first forward calls of the first generate(): compile, tuning, capture
    inner = model.forward

    @functools.wraps(inner)
    def timed(*a, **k):
        if len(calls) >= 4:
            return inner(*a, **k)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = inner(*a, **k)
        torch.cuda.synchronize()
        calls.append(time.perf_counter() - t0)
        return out

    model.forward = timed
    torch.cuda.reset_peak_memory_stats()
    with Phases(enabled=mode.startswith("ours")) as phases:
        if args.profile_first:  # where the first call's time goes (compile, tuning: Triton compiles, timing)
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
        first, row["first_call_s"] = generate(args.new, output_logits=True, return_dict_in_generate=True)
        if args.profile_first:
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(80)
            row["first_call_profile"] = text.getvalue().splitlines()[:100]
    row["first_forward_calls_s"] = calls
    if phases.enabled:
        row["first_call_phases_s"] = phases.summary(row["first_call_s"])
    torch.save(first.sequences.cpu(), os.path.join(args.scratch, f"tokens-{args.batch}-{args.prompt}-{mode}.pt"))
    torch.save(first.logits[0].float().cpu(), os.path.join(args.scratch, f"logits-{args.batch}-{args.prompt}-{mode}.pt"))
    one = [generate(1)[1] for _ in range(3)]
    many = [generate(args.new)[1] for _ in range(3)]
    row["prefill_ms"] = statistics.median(one) * 1e3
    row["decode_ms_per_token"] = (statistics.median(many) - statistics.median(one)) / (args.new - 1) * 1e3
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.profile:  # where the host's time per token goes (the GPU waits for it: generate() syncs each token)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        generate(33)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        row["host_profile_33_tokens"] = text.getvalue().splitlines()[:60]
    if args.trace:  # the GPU's view of a prefill and of decode steps: busy time against wall time, top kernels
        row["trace_prefill"] = traced(lambda: generate(1))
        row["trace_decode_8"] = traced(lambda: generate(9), lambda: generate(1))
    if mode.startswith("ours"):
        comps = [c for c in inner.compilations if c.compile_count]  # (a graph dynamo made and never called: none)
        row["graphs_never_called"] = len(inner.compilations) - len(comps)
        if hasattr(inner, "counts"):  # (keep_traces: calls served by kept traces, files loaded, traces made)
            row["keep_traces_counts"] = dict(inner.counts)
        row["graphs"] = [{"compiles": c.compile_count, "regions": c.report().impls(),
                          "compile_s": [round(s.compile_seconds, 2) for s in c._specs.values()],
                          "tuned": sum(1 for k in c._spec().executor.choices if k.trials and not k.from_cache),
                          "trials": sum(k.trials or 0 for k in c._spec().executor.choices if not k.from_cache),
                          # (what each search chose, and the times behind it: which configs a tree picks)
                          "searched": [k.to_dict() for k in c._spec().executor.choices if k.trials and not k.from_cache],
                          "graph_note": c._spec().executor.graph_note} for c in comps]  # fmt: skip
    return row


class Phases:
    """Where the first generate() call's time goes in our modes: wall seconds inside the compiler's own phases
    (compile = capture through import to the program; direct runs, tuning inside them; CUDA-graph capture and the
    keep-or-drop timing) and dynamo's tracing (its own compile-time counters). The rest is Triton's compiles and
    loads outside tuning, and HF's generate loop."""

    def __init__(self, enabled: bool):
        self.enabled, self.seconds, self._patches, self._depth = enabled, {}, [], 0

    def _wrap(self, owner, attr: str, phase: str, nested: bool = False) -> None:
        """Time `owner.attr` as `phase`: the outermost phase gets the time (a run inside a capture is the
        capture's); a `nested` phase (tuning, inside a run) is timed on its own and not summed."""
        import torch

        inner = getattr(owner, attr)

        def timed(*a, **k):
            if self._depth and not nested:
                return inner(*a, **k)
            self._depth += not nested
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self._depth -= not nested
                torch.cuda.synchronize()
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)
        self._patches.append((owner, attr, inner))

    def __enter__(self):
        if self.enabled:
            from torch._dynamo.utils import compilation_time_metrics

            # dynamo's own time: its frame compiles (bytecode tracing, guards; our backend only wraps the graph
            # there, the compile runs at the first call), from the counters torch keeps
            self._dynamo = lambda: sum(compilation_time_metrics.get("_compile.compile_inner", []))
            self._dynamo_before = self._dynamo()
            from dlblas_compiler import api
            from dlblas_compiler.runtime import graphs, program, selection

            self._wrap(api.CompiledModule, "_specialize", "compile")
            self._wrap(api.TracedForward, "_trace", "dynamo tracing and saving (keep_traces)")
            self._wrap(api.TracedForward, "_load", "loading saved traces (keep_traces)")
            self._wrap(program.Program, "run", "direct runs (tuning included)")
            # (a first call's tuning: the regions tuned where the program reaches them, the others after it, together)
            self._wrap(selection.Together, "defer", "tuning (inside direct runs)", nested=True)
            self._wrap(selection.Together, "tune", "tuning (inside direct runs)", nested=True)
            # (inside tuning: the compile batches the searches wait for, and the candidates' and selections' timings;
            # the rest of tuning is the searches' own Python, output checks and the references' runs)
            from dlblas_compiler.tuning import profiler

            self._wrap(selection, "build", "tuning: compile batches", nested=True)
            self._wrap(profiler, "benchmark", "tuning: timings", nested=True)
            self._wrap(selection, "benchmark", "tuning: timings", nested=True)
            self._wrap(graphs.CudaGraph, "capture", "graph capture")
            self._wrap(graphs.CudaGraph, "pays", "graph keep-or-drop timing")
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, inner in reversed(self._patches):
            setattr(owner, attr, inner)

    def summary(self, total: float) -> dict:
        out = {k: round(v, 2) for k, v in self.seconds.items()}
        inside = sum(v for k, v in self.seconds.items() if not k.startswith("tuning"))
        dynamo = self._dynamo() - self._dynamo_before
        out["dynamo tracing"] = round(dynamo, 2)
        out["other (Triton outside tuning, HF)"] = round(total - inside - dynamo, 2)
        return out


def traced(body, baseline=None, name=lambda n: n[:100]) -> dict:
    """torch.profiler over `body()` (minus `baseline()`'s events when given: the decode steps of a generate()
    beyond its prefill): wall ms, GPU busy ms (kernels, copies, memsets), event count, the 12 largest kernels
    (events grouped by `name(event name)`: [count, ms])."""
    import torch
    from profile_kernels import profiled

    def measure(fn):
        body()  # (warm)
        wall = []

        def timed():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)

        return profiled(timed), wall[0]

    evs, wall = measure(body)
    per: dict[str, list] = {}
    for e in evs:
        per.setdefault(name(e["name"]), [0, 0.0])
        per[name(e["name"])][0] += 1
        per[name(e["name"])][1] += (e["end"] - e["start"]) / 1e3
    busy, n = sum(e["end"] - e["start"] for e in evs) / 1e3, len(evs)
    if baseline is not None:
        base, base_wall = measure(baseline)
        busy -= sum(e["end"] - e["start"] for e in base) / 1e3
        wall, n = wall - base_wall, n - len(base)
        for e in base:
            per[name(e["name"])][1] -= (e["end"] - e["start"]) / 1e3
            per[name(e["name"])][0] -= 1
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:12]
    return {"wall_ms": round(wall, 2), "gpu_busy_ms": round(busy, 2), "events": n,
            "top_kernels_ms": {k: [c, round(t, 3)] for k, (c, t) in top}}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tune", default="quick")
    ap.add_argument("--profile", action="store_true", help="add a cProfile of generate(33) to each row")
    ap.add_argument("--profile-first", action="store_true", help="add a cProfile of the first generate() to each row")
    ap.add_argument("--trace", action="store_true", help="add torch.profiler summaries of a prefill and 8 decode steps")
    ap.add_argument("--keep-traces", action="store_true", help="ours: dc.compile(..., keep_traces=True), so that a "
                    "new process (ours-warm) loads dynamo's traces instead of tracing")  # fmt: skip
    ap.add_argument("--scratch", help="where the tokens and logits each mode saves go (default: OUT)")
    ap.add_argument("--modes", default="fp32,eager,ours,ours-warm")
    ap.add_argument("--timeout", default="540", help="seconds per mode (one number, or one per mode: 120,150,320)")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # (a child process: run this one mode)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    args.scratch = args.scratch or args.out
    os.makedirs(args.scratch, exist_ok=True)
    if args.mode:
        try:
            row = run_mode(args.mode, args)
        except Exception as e:  # noqa: BLE001 - a failing mode is a result
            traceback.print_exc()
            row = {"mode": args.mode, "batch": args.batch, "prompt": args.prompt, "error": f"{type(e).__name__}: {str(e)[:600]}",
                   "traceback": traceback.format_exc().splitlines()[-24:]}  # fmt: skip
        print("ROW " + json.dumps(row), flush=True)
        return 0
    import torch

    path = os.path.join(args.out, "generate.json")
    doc = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    doc["gpu"] = torch.cuda.get_device_name()
    doc["versions"] = {"torch": torch.__version__, "triton": __import__("triton").__version__,
                       "transformers": __import__("transformers").__version__}  # fmt: skip
    from ceilings import measure

    ceilings = measure()  # (copy bandwidth and the bf16 matmul rate of this card, in this process)
    bw = ceilings["copy_bytes_per_s"]
    kv_bytes = lambda L: args.layers * 2 * args.batch * HK * L * D * 2  # noqa: E731  (bf16 keys and values)
    weights = (args.layers * (H * (HQ + 2 * HK) * D + HQ * D * H + 3 * H * I + 2 * H) + 2 * VOCAB * H + H) * 2
    mean_len = args.prompt + args.new / 2
    doc["ceilings"] = ceilings
    floor = {"batch": args.batch, "prompt": args.prompt, "floor_ms_per_token": (weights + kv_bytes(mean_len)) / bw * 1e3,
             "weights_gb": weights / 1e9, "copy_tb_per_s": bw / 1e12}  # fmt: skip
    print(json.dumps(floor), flush=True)
    modes = args.modes.split(",")
    timeouts = [int(t) for t in str(args.timeout).split(",")]
    timeouts += [timeouts[-1]] * (len(modes) - len(timeouts))
    for mode, timeout in zip(modes, timeouts):
        cmd = [sys.executable, __file__, "--mode", mode, *sum((["--" + k, str(getattr(args, k))] for k in
               ("out", "scratch", "batch", "prompt", "new", "layers", "tune")), [])]  # fmt: skip
        cmd += ["--profile"] if args.profile else []
        cmd += ["--profile-first"] if args.profile_first else []
        cmd += ["--trace"] if args.trace else []
        cmd += ["--keep-traces"] if args.keep_traces else []
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")), None)
            row = json.loads(line[4:]) if line else {"mode": mode, "error": proc.stderr[-800:]}
        except subprocess.TimeoutExpired:
            row = {"mode": mode, "batch": args.batch, "prompt": args.prompt, "error": f"timed out after {timeout} s"}
        row["process_s"] = time.time() - t0
        row.update({k: v for k, v in floor.items() if k not in row})
        _compare(row, args)
        doc["rows"] = [r for r in doc["rows"] if (r.get("mode"), r.get("batch"), r.get("prompt")) != (mode, args.batch, args.prompt)]
        doc["rows"].append(row)
        json.dump(doc, open(path, "w"), indent=1)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "graphs"}), flush=True)
    return 0


def _compare(row: dict, args) -> None:
    """Logits error against float32 and tokens equal to eager's, where those files exist."""
    import torch

    def load(kind, mode):
        p = os.path.join(args.scratch, f"{kind}-{args.batch}-{args.prompt}-{mode}.pt")
        return torch.load(p) if os.path.exists(p) else None

    mode = row["mode"]
    ref, mine = load("logits", "fp32"), load("logits", mode)
    if ref is not None and mine is not None:
        row["logits_rel_err"] = ((mine - ref).norm() / ref.norm()).item()
    eager, toks = load("tokens", "eager"), load("tokens", mode)
    if eager is not None and toks is not None:
        same = (eager == toks).all(0)[args.prompt:]
        row["tokens_equal_eager"] = int(same.long().cumprod(0).sum().item())


if __name__ == "__main__":
    sys.exit(main())
