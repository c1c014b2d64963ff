"""The tables of BENCHMARKS.md, generated from the raw JSON in bench/results/: the only writer of those tables.

    python bench/report.py --write           # regenerate every marked section of BENCHMARKS.md
    python bench/report.py --check           # exit 1 if a section differs from what its JSON gives, or if
                                             # BENCHMARKS.md has a table outside the marked sections
    python bench/report.py --section NAME    # print one section (names: --list)
    python bench/report.py --plots DIR       # speedup plots of the block sections
    python bench/report.py RESULTS.json ... [--md OUT.md] [--plots DIR]   # block tables of new run.py results

BENCHMARKS.md holds prose and marked sections, each regenerated from the files SECTIONS names for it:

    <!-- report:NAME begin -->
    ...generated: a table, then a line naming the card, the versions, the ceilings measured in that run
    (or that none were) and the raw file(s)...
    <!-- report:NAME end -->

A new kind of result gets a renderer (a function of the loaded JSON that returns markdown) and an entry in
SECTIONS; `generation_table` renders bench/generate.py's `*-generate.json` that way. Block tables name what
ran each region of ours (our Triton kernel, or the region's torch reference: cuBLAS for a GEMM region, SDPA
for attention) from the `kernels` each "ours" row of bench/run.py records.
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ceilings import fixed  # noqa: E402 - stdlib only: this module needs no torch

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(os.path.dirname(HERE), "BENCHMARKS.md")

BASELINES = ["eager", "inductor", "max-autotune-no-cudagraphs", "max-autotune"]
INDUCTOR = ["inductor", "max-autotune-no-cudagraphs", "max-autotune"]
H200 = "2026-11-26-h200-"

# which files each block table reads (the last file that measured a block and M wins)
BLOCK_SOURCES = {
    "norm_qkv_rope": [H200 + "s4-blocks-a.json", H200 + "s4-blocks-b.json", H200 + "s4-blocks-c.json"],
    "swiglu_mlp": [H200 + "s4-blocks-c.json"],
    "add_rmsnorm": [H200 + "blocks.json"],
    "attention": [H200 + "blocks.json"],
    "decoder_layer": [H200 + "s4-decoder-a.json", H200 + "s4-decoder-b.json"],
    "llama_2layer": [H200 + "s4-llama2layer.json"],
}

# region names of ours by kernel name (the compiled plan numbers its kernels; `cm.report()` lists each
# region's ops), abbreviated in the tables
REGIONS = {
    "norm_qkv_rope": {"gemm_0": "QKV"},
    "swiglu_mlp": {"gemm_0": "gate/up", "gemm_1": "down"},
    "add_rmsnorm": {"row_0": "add+norm"},
    "attention": {"attention_0": "attn"},
    "decoder_layer": {"gemm_0": "QKV", "attention_4": "attn", "gemm_1": "o-proj", "gemm_2": "gate/up",
                      "gemm_3": "down"},
    "llama_2layer": {"gemm_0": "QKV", "gemm_4": "QKV", "attention_9": "attn", "attention_10": "attn",
                     "gemm_1": "o-proj", "gemm_5": "o-proj", "gemm_2": "gate/up", "gemm_6": "gate/up",
                     "gemm_3": "down", "gemm_7": "down", "gemm_8": "lm_head", "row_11": "rows", "row_12": "rows",
                     "row_13": "rows"},
}  # fmt: skip
REGION_LEGEND = (
    "QKV = RMSNorm → QKV GEMM → RoPE; attn = causal GQA attention; o-proj = o-proj GEMM + residual add; "
    "gate/up = RMSNorm → gate/up GEMM → SiLU·up (or, in swiglu_mlp, without the norm); down = down GEMM "
    "(+ residual add in the layer); add+norm = add + RMSNorm; lm_head = final RMSNorm → lm_head GEMM; rows = "
    "small row kernels (rotary cos/sin tables)"
)
IMPL_LEGEND = (
    "*ours ran*: what executed each region of ours. Triton = our generated kernel; cuBLAS = the region's torch "
    "reference (its GEMM in cuBLAS, any epilogue ops in torch), kept because the tuner timed it faster; SDPA = "
    "torch's `scaled_dot_product_attention` (cuDNN or flash backend, torch's choice), kept the same way; torch "
    "= the region's torch ops; † = no candidate config passed the tuner's reference check (reason in the JSON)."
)


# ---------------------------------------------------------------------------------------------- helpers


def _load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def _num(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "–"


def ceilings_text(ceilings: dict | None) -> str:
    if not ceilings:
        return "ceilings not measured in this run"
    return (f"ceilings measured in this run: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"bf16 matmul {ceilings['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")  # fmt: skip


def floor_text(gpu: str, ceilings: dict | None) -> str:
    if ceilings:
        return "floors from the ceilings measured in the same run"
    bw, fl = fixed(gpu)
    return f"floors from the fixed, unmeasured {bw / 1e12:.2f} TB/s and {fl / 1e12:.0f} TFLOP/s of bench/ceilings.py"


def source_line(entries: list[tuple[str, dict, str]], floors: bool = False) -> str:
    """'Source: card · versions · run · date · ceilings · raw: files' for (file, env, what-it-gave) entries;
    files with the same card, versions and ceilings share one line. env keys: gpu, torch, triton,
    transformers, versions (a dict), run (a phrase), date, ceilings."""
    groups: dict[str, list[str]] = {}
    for name, env, what in entries:
        versions = dict(env.get("versions") or {})
        for k in ("torch", "triton", "transformers", "nccl"):
            if env.get(k):
                versions.setdefault(k, env[k])
        parts = [env.get("gpu") or "card not recorded in the file"]
        if versions:
            parts.append(", ".join(f"{k} {v}" for k, v in versions.items()))
        if env.get("run"):
            parts.append(env["run"])
        if env.get("date"):
            parts.append(str(env["date"])[:10])
        parts.append(ceilings_text(env.get("ceilings")))
        if floors:
            parts.append(floor_text(env.get("gpu") or "", env.get("ceilings")))
        file = f"`bench/results/{name}`" + (f" ({what})" if what else "")
        files = groups.setdefault(" · ".join(parts), [])
        if file not in files:
            files.append(file)
    return "\n\n".join(f"*Source:* {head} · raw: {', '.join(files)}" for head, files in groups.items())


# ----------------------------------------------------------------------------------------- block tables


def load_runs(paths: list[str], block: str | None = None, merge: bool = False) -> dict[tuple[str, int], dict]:
    """(block, M) -> {"meta", "modes": {mode: row}, "source"}; the last run that measured the pair wins, or with
    `merge` each mode comes from the last run that measured it (runs that split the modes between them)."""
    table: dict[tuple[str, int], dict] = {}
    for path in paths:
        with open(path if os.path.isabs(path) or os.path.exists(path) else os.path.join(RESULTS, path)) as f:
            runs = json.load(f)["runs"]
        for run in runs:
            by_pair: dict[tuple[str, int], dict] = {}
            for row in run["rows"]:
                if block is None or row["block"] == block:
                    by_pair.setdefault((row["block"], row["M"]), {})[row["mode"]] = row
            for pair, modes in by_pair.items():
                if merge and pair in table:
                    table[pair]["modes"].update(modes)
                    continue
                table[pair] = {"meta": run["meta"], "modes": modes, "source": os.path.basename(path)}
    return table


def gpu_of(modes: dict, mode: str) -> float | None:
    """GPU time; modes that replay their own CUDA graph have that of the same kernels without it."""
    other = {"ours": "ours-nocg", "max-autotune": "max-autotune-no-cudagraphs"}.get(mode, mode)
    return modes.get(other, {}).get("gpu_us")


def call_of(modes: dict, mode: str) -> float | None:
    return modes.get(mode, {}).get("call_us")


def best_inductor(modes: dict, metric: str) -> float | None:
    ts = [t for c in INDUCTOR if c in modes and (t := (gpu_of if metric == "gpu" else call_of)(modes, c))]
    return min(ts) if ts else None


def impl_label(k: dict) -> str:
    """Triton / cuBLAS / SDPA / torch (with † when no candidate passed the check) for one kernel record."""
    if k["impl"] == "kernel":
        mm = (k.get("config") or {}).get("MM")
        return "cuBLAS adding into the residual" if mm == 2 else "cuBLAS + Triton epilogue" if mm else "Triton"
    kind = k.get("pattern") or k["name"].rsplit("_", 1)[0]
    lib = {"gemm": "cuBLAS", "attention": "SDPA"}.get(kind, "torch")
    return lib + ("†" if "candidate configs failed" in (k.get("reason") or "") else "")


def region_name(block: str, k: dict) -> str:
    if k["name"] in REGIONS.get(block, {}):
        return REGIONS[block][k["name"]]
    ops = [o.removeprefix("dl.") for o in k.get("ops", []) if o not in ("dl.reshape", "dl.permute", "dl.slice")]
    return "+".join(dict.fromkeys(ops)) or k["name"]


def impl_cell(block: str, kernels: list[dict]) -> str:
    """'Triton: QKV ×2, gate/up ×2; cuBLAS: o-proj ×2' — which implementation ran which region."""
    if not kernels:
        return "–"
    by_impl: dict[str, dict[str, int]] = {}
    for k in kernels:
        names = by_impl.setdefault(impl_label(k), {})
        names[region_name(block, k)] = names.get(region_name(block, k), 0) + 1
    if len(kernels) == 1:
        return next(iter(by_impl))
    return "; ".join(f"{impl}: " + ", ".join(n + (f" ×{c}" if c > 1 else "") for n, c in names.items())
                     for impl, names in by_impl.items())  # fmt: skip


def ours_ran(block: str, modes: dict) -> str:
    a, b = modes.get("ours", {}).get("kernels"), modes.get("ours-nocg", {}).get("kernels")
    if a and b and impl_cell(block, a) != impl_cell(block, b):
        return f"ours: {impl_cell(block, a)} / ours-nocg: {impl_cell(block, b)}"
    return impl_cell(block, a or b or [])


def block_markdown(table: dict, heading: bool = True) -> str:
    """One table per block: per M the floor, every mode's GPU / call time (µs), our speedups, our rel. err and
    what ran each region of ours; under it the source line of each file."""
    out = []
    for block in dict.fromkeys(b for b, _ in table):
        ms = sorted(m for b, m in table if b == block)
        if heading:
            out.append(f"### {block}\n")
        cols = [m for m in BASELINES + ["ours"] if any(m in table[(block, x)]["modes"] for x in ms)]
        out.append("| M | floor | " + " | ".join(f"{c} GPU / call" for c in cols) + " | ours vs eager (GPU) | "
                   "ours vs best Inductor (GPU / call) | ours rel. err | ours ran |")  # fmt: skip
        out.append("|" + "---|" * (len(cols) + 6))
        for m in ms:
            modes = table[(block, m)]["modes"]
            cells = ["error" if "error" in modes.get(c, {}) else f"{_fmt(gpu_of(modes, c))} / {_fmt(call_of(modes, c))}"
                     for c in cols]
            floor = next(iter(modes.values()))["floor_us"]
            ours_gpu, ours_call = gpu_of(modes, "ours"), call_of(modes, "ours")
            vs_ind = (f"{_ratio(best_inductor(modes, 'gpu'), ours_gpu)} / "
                      f"{_ratio(best_inductor(modes, 'call'), ours_call)}")
            err = modes.get("ours", modes.get("ours-nocg", {})).get("rel_err")
            err_s = "–" if err is None else f"{err:.1e}"
            vs_eager = _ratio(gpu_of(modes, "eager"), ours_gpu)
            out.append(f"| {m} | {_fmt(floor)} | " + " | ".join(cells)
                       + f" | {vs_eager} | {vs_ind} | {err_s} | {ours_ran(block, modes)} |")  # fmt: skip
        out.append("")
        spread = rounds_spread({m: table[(block, m)]["modes"] for m in ms}, cols)
        if spread:
            out += [spread, ""]
        by_file: dict[str, list[int]] = {}
        for m in ms:
            by_file.setdefault(table[(block, m)]["source"], []).append(m)
        entries = []
        for name, fms in by_file.items():
            meta = dict(table[(block, fms[0])]["meta"])
            rounds = meta.get("rounds") or 1
            meta["run"] = (f"{meta.get('dtype')}, ours tuned `{meta.get('tune')}`, "
                           + (f"{rounds} rounds (medians)" if rounds > 1 else "one round"))  # fmt: skip
            entries.append((name, meta, "M = " + ", ".join(map(str, fms))))
        out.append(source_line(entries, floors=True))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


SPREAD = 0.05  # rounds whose slowest is this much above the fastest are listed under the table


def rounds_spread(by_m: dict[int, dict], cols: list[str]) -> str:
    """'*Rounds apart by more than 5%:* …' for each M and mode whose timing rounds (each a median) spread that much:
    the medians in the table are then uncertain by about as much. '' if none."""
    found = []
    for m, modes in by_m.items():
        for c in cols:
            for kind, key in (("GPU", "gpu_us_rounds"), ("call", "call_us_rounds")):
                rounds = modes.get(c, {}).get(key) or []
                if len(rounds) > 1 and min(rounds) > 0 and max(rounds) / min(rounds) - 1 > SPREAD:
                    found.append(f"M = {m} {c} {kind} {min(rounds):.0f}–{max(rounds):.0f} µs")
    return f"*Rounds apart by more than {SPREAD:.0%}:* " + "; ".join(found) + "." if found else ""


def block_section(block: str) -> str:
    return block_markdown(load_runs(BLOCK_SOURCES[block], block), heading=False)


def all_blocks() -> dict[tuple[str, int], dict]:
    table: dict = {}
    for block, files in BLOCK_SOURCES.items():
        table.update(load_runs(files, block))
    return table


def legend_section() -> str:
    return f"{IMPL_LEGEND} Regions: {REGION_LEGEND}.\n"


def vs_eager_section() -> str:
    """Speedup of ours over eager PyTorch per block and M, GPU time / call time."""
    table = all_blocks()
    ms = sorted({m for _, m in table})
    out = ["| block | " + " | ".join(f"M = {m} (GPU / call)" for m in ms) + " |", "|" + "---|" * (len(ms) + 1)]
    for block in BLOCK_SOURCES:
        cells = []
        for m in ms:
            modes = table.get((block, m), {}).get("modes", {})
            gpu = _ratio(gpu_of(modes, "eager"), gpu_of(modes, "ours"))
            cells.append(f"{gpu} / {_ratio(call_of(modes, 'eager'), call_of(modes, 'ours'))}")
        out.append(f"| {block} | " + " | ".join(cells) + " |")
    out += ["", "*Source:* the block tables above (same files, same rows)."]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ goals


def _pick(table, block, ms, fn) -> list:
    return [fn(table[(block, m)]["modes"]) for m in ms]


def _ours_floor(table, block, ms, limit):
    g = _pick(table, block, ms, lambda md: gpu_of(md, "ours"))
    f = _pick(table, block, ms, lambda md: next(iter(md.values()))["floor_us"])
    r = [a / b for a, b in zip(g, f)]
    text = (" / ".join(_fmt(x) for x in g) + " µs vs floor " + " / ".join(_fmt(x) for x in f) + ": "
            + " / ".join(f"{x:.2f}x" for x in r))  # fmt: skip
    return text, all(x <= limit for x in r)


def _vs_inductor(table, block, ms, metric, limits):
    ours = _pick(table, block, ms, lambda md: (gpu_of if metric == "gpu" else call_of)(md, "ours"))
    ind = _pick(table, block, ms, lambda md: best_inductor(md, metric))
    r = [i / o for i, o in zip(ind, ours)]
    text = ", ".join(f"M = {m}: {x:.2f}x ({_fmt(o)} vs {_fmt(i)} µs)" for m, x, o, i in zip(ms, r, ours, ind))
    return text, all(x >= lim for x, lim in zip(r, limits))


def _bandwidth(table, block, m, share):
    md = table[(block, m)]["modes"]
    g, f = gpu_of(md, "ours"), next(iter(md.values()))["floor_us"]
    meta = table[(block, m)]["meta"]
    bw = (meta.get("ceilings") or {}).get("copy_bytes_per_s") or fixed(meta["gpu"])[0]
    return f"{_fmt(g)} µs vs floor {_fmt(f)}: {f / g:.0%} of {bw / 1e12:.2f} TB/s", f / g >= share


def _warm(table, block):
    ms = sorted(m for b, m in table if b == block)
    w = _pick(table, block, ms, lambda md: md.get("ours", {}).get("warm_compile_s"))
    text = ", ".join(f"M = {m}: {x:.2f} s" for m, x in zip(ms, w) if x is not None)
    return text, all(x <= 1.0 for x in w if x is not None)


GOALS = [  # (goal, measure, its arguments after the table); measure returns (measured text, met)
    ("RMSNorm→QKV→RoPE GPU time ≤ 1.3x floor at M ≤ 128", _ours_floor, "norm_qkv_rope", [1, 16, 128], 1.3),
    ("… ≤ 1.1x floor at M = 2048", _ours_floor, "norm_qkv_rope", [2048], 1.1),
    ("… call time ≥ 1.5x faster than best Inductor at M ≤ 128", _vs_inductor, "norm_qkv_rope", [1, 16, 128], "call",
     [1.5] * 3),
    ("SwiGLU MLP GPU time ≤ 1.1x floor at every M", _ours_floor, "swiglu_mlp", [1, 16, 128, 2048], 1.1),
    ("add+RMSNorm ≥ 80% of copy bandwidth at M = 2048", _bandwidth, "add_rmsnorm", 2048, 0.8),
    ("add+RMSNorm GPU time no slower than best Inductor at any M", _vs_inductor, "add_rmsnorm", [1, 16, 128, 2048],
     "gpu", [1.0] * 4),
    ("decoder layer GPU time ≤ 1.15x floor at M ≤ 16", _ours_floor, "decoder_layer", [1, 16], 1.15),
    ("decoder layer GPU time ≥ 1.3x faster than best Inductor at 128, ≥ 1.05x at 2048", _vs_inductor, "decoder_layer",
     [128, 2048], "gpu", [1.3, 1.05]),
    ("decoder layer call time ≥ 1.2x faster than best Inductor at M ≤ 128", _vs_inductor, "decoder_layer", [1, 16, 128],
     "call", [1.2] * 3),
    ("2-layer model GPU time ≤ 1.15x floor at M ≤ 16", _ours_floor, "llama_2layer", [1, 16], 1.15),
    ("2-layer model GPU time ≥ 1.3x faster than best Inductor at 128, ≥ 1.05x at 2048", _vs_inductor, "llama_2layer",
     [128, 2048], "gpu", [1.3, 1.05]),
    ("2-layer model call time ≥ 1.2x faster than best Inductor at M ≤ 128", _vs_inductor, "llama_2layer", [1, 16, 128],
     "call", [1.2] * 3),
    ("warm (cache hit) compile of a decoder layer ≤ 1 s", _warm, "decoder_layer"),
]


def goals_section() -> str:
    """Issue 7's goals, each measured from the rows of the block tables."""
    table = all_blocks()
    out = ["| goal | measured | met |", "|---|---|---|"]
    for goal, fn, *args in GOALS:
        text, met = fn(table, *args)
        out.append(f"| {goal} | {text} | {'**yes**' if met else 'no'} |")
    out.append("| cold compile of a layer without tuning ≤ 5 s | no raw record in bench/results "
               "(every kept run tuned) | not measured |")
    out += ["", "*Source:* the block tables above (same files, same rows); ratios > 1 mean ours is faster."]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------- decoder layer regions

DECODER_RUNS = [
    ("first", [H200 + "final.json"]),
    ("re-run", [H200 + "decoder-rerun.json"]),
    ("third", [H200 + "s3-decoder-final.json"]),
    ("fourth", [H200 + "s4-decoder-a.json", H200 + "s4-decoder-b.json"]),
]
DECODER_REGIONS = ["gemm_0", "attention_4", "gemm_1", "gemm_2", "gemm_3"]


def _config_note(cfg: dict) -> str:
    notes = []
    if cfg.get("BLOCK_M") == 1:
        notes.append("one-row")
    if cfg.get("SPLIT_K", 1) > 1:
        notes.append(f"split-K {cfg['SPLIT_K']}")
    if cfg.get("TMA"):
        notes.append("TMA")
    return f" ({', '.join(notes)})" if notes else ""


def region_cell(k: dict | None) -> str:
    if k is None:
        return "–"
    if k["impl"] == "kernel":
        return f"{k['time'] * 1e6:.1f}{_config_note(k.get('config', {}))}"
    lib = impl_label(k)
    if lib.endswith("†"):
        return f"{lib} (no candidate passed)"
    return f"{lib} {k['reference_time'] * 1e6:.1f} (ours {k['time'] * 1e6:.1f})"


def regions_section() -> str:
    """The decoder layer per region as the tuner timed it (do_bench median, cold L2), per session."""
    names = {"gemm_0": "norm+QKV+RoPE", "attention_4": "attention", "gemm_1": "o-proj+residual",
             "gemm_2": "norm+gate/up+SiLU·up", "gemm_3": "down+residual"}  # fmt: skip
    out = ["| session | M | " + " | ".join(names[r] for r in DECODER_REGIONS) + " | layer GPU time | floor |",
           "|" + "---|" * (len(DECODER_REGIONS) + 4)]  # fmt: skip
    entries = []
    for label, files in DECODER_RUNS:
        table = load_runs(files, "decoder_layer")
        for m in sorted(m for _, m in table):
            modes = table[("decoder_layer", m)]["modes"]
            ks = {k["name"]: k for k in modes.get("ours", modes.get("ours-nocg", {})).get("kernels", [])}
            floor = next(iter(modes.values()))["floor_us"]
            out.append(f"| {label} | {m} | " + " | ".join(region_cell(ks.get(r)) for r in DECODER_REGIONS)
                       + f" | {_fmt(gpu_of(modes, 'ours'))} | {_fmt(floor)} |")  # fmt: skip
        for name in files:
            meta = next(v["meta"] for v in table.values() if v["source"] == name)
            ms = sorted(m for (_, m), v in table.items() if v["source"] == name)
            entries.append((name, meta, f"{label}, M = {', '.join(map(str, ms))}"))
    out += ["", source_line(entries)]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------- sweeps

SWEEP_REGIONS = {
    ("norm_qkv_rope", 0): "norm+QKV+RoPE", ("swiglu_mlp", 0): "gate/up+SiLU·up (dual GEMM)", ("swiglu_mlp", 1): "down",
    ("decoder_layer", 0): "norm+QKV+RoPE", ("decoder_layer", 1): "o-proj+residual",
    ("decoder_layer", 2): "norm+gate/up+SiLU·up", ("decoder_layer", 3): "down+residual",
}  # fmt: skip


def _config(cfg: dict) -> str:
    s = f"{cfg.get('BLOCK_M')}×{cfg.get('BLOCK_N')}×{cfg.get('BLOCK_K')}"
    if cfg.get("SPLIT_K", 1) > 1:
        s += f", split-K {cfg['SPLIT_K']}"
    s += f", {cfg.get('num_warps')} warps, {cfg.get('num_stages')} stages"
    return s + (", TMA" if cfg.get("TMA") else "")


def sweeps_section() -> str:
    """Exhaustive sweeps of single GEMM regions (bench/tuning_study.py): every config compiled, checked
    against the region's reference and timed once."""
    out = ["| sweep | region | M | configs (failed) | best µs | best config | weight TB/s at best | "
           "best µs by BLOCK_M | default µs |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for name in (H200 + "s3-sweeps.json", H200 + "s4-sweeps.json"):
        doc = _load(name)
        if "sweeps" in doc:
            items = [(k.split(": ", 1)[0], k.split(": ", 1)[1], v) for k, v in doc["sweeps"].items() if "space" in v]
        else:
            items = [(outer, k, v) for outer, group in doc.items() for k, v in group.items() if "space" in v]
        for group, key, v in items:
            block, idx, m = re.match(r"(\w+)\[(\d+)\] M=(\d+)", key).groups()
            region = SWEEP_REGIONS.get((block, int(idx)), f"{block}[{idx}]")
            tbps = f"{v['weight_TBps_at_best']:.2f}" if int(m) <= 16 else "—"
            by_m = ", ".join(f"{bm}: {t:.1f}" for bm, t in v.get("best_us_by_BLOCK_M", {}).items())
            out.append(f"| {group} | {region} | {m} | {v['space']} ({v['failed']}) | {v['exhaustive_best_us']:.1f} | "
                       f"{_config(v['best_config'])} | {tbps} | {by_m} | {v['default_us']:.1f} |")  # fmt: skip
        entries.append((name, doc.get("meta", {}), ""))
    out += ["", source_line(entries)]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- profiles

PROFILES = H200 + "s4-profiles.json"
S3_PROFILE = (H200 + "s3-sweeps.json", "profile decoder_layer M=2048 (kernel µs per call, direct vs graph)")


def kernel_alias(name: str) -> str:
    """A short, stable name for a profiled kernel (profiles cut names at 80 or 90 characters)."""
    for key, alias in (("CUDAFunctor_add", "torch add"), ("gpu_kernel_impl_nocast", "torch copy (elementwise_kernel)"),
                       ("splitKreduce", "cuBLAS splitKreduce"), ("flash_fwd_kernel", "flash SDPA (pytorch_flash)"),
                       ("cudnn_generated", "cuDNN SDPA"), ("Memset", "memset")):  # fmt: skip
        if key in name:
            return alias
    if name.startswith("nvjet"):
        return f"cuBLAS {name[:34]}"
    return name[:60]


def _per_kernel(d: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, t in d.items():
        out[kernel_alias(n)] = out.get(kernel_alias(n), 0.0) + t
    return out


def profile_columns(m: int, ours: bool) -> list[tuple[str, dict, dict, dict, dict]]:
    """(label, direct per-kernel, replay per-kernel, direct summary, replay summary) per profile of M."""
    cols = []
    if ours and m == 2048:
        s3 = _load(S3_PROFILE[0])["sweeps"][S3_PROFILE[1]]
        cols.append(("third session, back-to-back calls", _per_kernel(s3["direct"]), _per_kernel(s3["graph"]), {}, {}))
    for label, entry in _load(PROFILES).items():
        e = entry.get(f"M={m}")
        if e is None:
            continue
        for mode in ("ours",) if ours else ("max-autotune-no-cudagraphs",):
            d, g = e.get(f"{mode}/direct"), e.get(f"{mode}/graph")
            if d and g:
                cols.append((f"fourth session: {label}", _per_kernel(d["per_kernel"]), _per_kernel(g["per_kernel"]),
                             d, g))  # fmt: skip
    return cols


def profile_table(m: int, ours: bool) -> str:
    cols = profile_columns(m, ours)
    names = list(dict.fromkeys(n for c in cols for n in sorted(c[1], key=lambda k: -c[1][k])))
    out = ["| kernel (µs per call: direct → replay) | " + " | ".join(c[0] for c in cols) + " |",
           "|" + "---|" * (len(cols) + 1)]

    def cell(a, b):
        return "–" if a is None or b is None else f"{a:.1f} → {b:.1f} ({(b / a - 1) * 100:+.1f}%)"

    for n in names:
        out.append(f"| {n} | " + " | ".join(cell(c[1].get(n), c[2].get(n)) for c in cols) + " |")
    sums = [(c[3].get("kernel_sum", sum(c[1].values())), c[4].get("kernel_sum", sum(c[2].values()))) for c in cols]
    out.append("| **kernel sum** (median over calls; where no calls were kept, the sum of the means) | "
               + " | ".join(cell(*s) for s in sums) + " |")  # fmt: skip
    for key, label in (("span", "span (first start → last end)"), ("do_bench_median", "do_bench median (L2 cleared)"),
                       ("loop_per_call", "back-to-back loop, per call")):  # fmt: skip
        out.append(f"| {label} | " + " | ".join(cell(c[3].get(key), c[4].get(key)) for c in cols) + " |")
    return "\n".join(out) + "\n"


def profile_section(m: int) -> str:
    """Per-kernel GPU time of the decoder layer launched directly and replayed from a CUDA graph, ours and
    Inductor (bench/profile_kernels.py traces)."""
    doc = _load(PROFILES)
    env = next(e for entry in doc.values() for e in entry.values() if isinstance(e, dict) and "gpu" in e)
    entries = []
    if m == 2048:
        s3 = _load(S3_PROFILE[0])
        entries.append((S3_PROFILE[0], s3["meta"], f"key “{S3_PROFILE[1]}”"))
    entries.append((PROFILES, {"gpu": env["gpu"]}, ""))
    out = ["**ours**", "", profile_table(m, True), "**Inductor (max-autotune-no-cudagraphs)**", "",
           profile_table(m, False), source_line(entries)]  # fmt: skip
    return "\n".join(out) + "\n"


def smi_section(name: str = H200 + "s4-smi-during-profiles.csv") -> str:
    """What nvidia-smi read while the fourth session's profiles ran (a CSV sampled every 250 ms)."""
    import csv

    with open(os.path.join(RESULTS, name)) as f:
        rows = list(csv.reader(f))[1:]
    s = [(int(r[1].split()[0]), float(r[3].split()[0])) for r in rows]  # SM MHz, W
    busy = [x for x in s if x[1] > 300]
    low = [x for x in busy if x[0] < 1900]
    top = max(s, key=lambda x: x[1])
    rest = [x[0] for x in busy if x[0] >= 1900]
    return (f"nvidia-smi sampled {len(s)} times: {len(busy)} samples above 300 W, {len(low)} of them with the SM "
            f"clock at {min(x[0] for x in low)}–{max(x[0] for x in low)} MHz and the rest at {min(rest)}–{max(rest)} "
            f"MHz; the highest power read was {top[1]:.0f} W (one sample, at {top[0]} MHz). "
            f"Raw: `bench/results/{name}`; the profile JSON has no timestamps, so no sample can be matched to a direct "
            f"or a replay phase.\n")  # fmt: skip


# ----------------------------------------------------------------------------------------- tuning study


def tuning_study_section() -> str:
    name = H200 + "tuning-study.json"
    doc = _load(name)
    pols = ["random@10%", "random@20%", "random@40%", "bayes@10%", "bayes@20%", "bayes@40%"]
    out = ["| M | valid configs | exhaustive best | " + " | ".join(p.replace("@", " ") + " mean (worst)" for p in pols)
           + " |", "|" + "---|" * (len(pols) + 3)]  # fmt: skip
    for key, v in doc.items():
        cells = [f"{v['policies'][p]['mean']:.3f} ({v['policies'][p]['worst']:.3f})" for p in pols]
        out.append(f"| {key.removeprefix('M=')} | {v['space']} | {v['exhaustive_best_us']:.1f} µs | "
                   + " | ".join(cells) + " |")  # fmt: skip
    out += ["", source_line([(name, {}, "the file records neither card nor versions")])]
    return "\n".join(out) + "\n"


QUICK_S16 = [("2026-11-27-h100-s16-tuning-study-a-qkv.json", "a", "K-loop tiles", "the default"),
             ("2026-11-27-h100-s16-tuning-study-a-gateup.json", "a", "K-loop tiles", "the default"),
             ("2026-11-27-h100-s16-tuning-study-b-gateup-mm.json", "b", "cuBLAS product + epilogue (MM)",
              "the default, 6 MM starts")]


def quick_tuning_section() -> str:
    """bench/tuning_study.py --narrow ... --real-quick 2: a timed subspace's best against the tuner's quick search,
    over that table and for real over the whole space (with and without the sweeps' seeds)."""
    out = ["| run | region | subspace timed | configs (whole space) | subspace best µs | quick over the table: "
           "seeded / default alone | quick over the whole space without the sweeps' seeds: starts | "
           "the same, 2 searches | quick over the whole space, seeded |", "|" + "---|" * 9]  # fmt: skip
    entries = []
    for name, run, sub, starts in QUICK_S16:
        doc = _load(name)
        env = doc.get("_run", {})
        for key, v in doc.items():
            if key.startswith("_"):
                continue
            block, idx, _m = re.match(r"(\w+)\[(\d+)\] M=(\d+)", key).groups()
            region = {0: "norm+QKV+RoPE", 2: "norm+gate/up+GLU"}.get(int(idx), f"region {idx}")
            p = v["policies"]  # (run a named two entries as the script first did)
            alone = p.get("quick, default alone") or p["quick, no seeds"]
            unseeded = p.get("quick over the whole space, no sweep seeds") or p["quick over the whole space, no seeds"]
            table = f"{p['quick']['worst']:.3f} / {alone['worst']:.3f}"
            whole = ", ".join(f"{r:.3f}" for r in unseeded["ratios"])
            seeded = ", ".join(f"{r:.3f}" for r in p["quick over the whole space"]["ratios"])
            out.append(f"| {run} | {block.removeprefix('layer_')} {region} (M = {_m}) | {sub} | {v['space']} "
                       f"({v['whole_space']}) | {v['exhaustive_best_us']:.1f} | {table} | {starts} | {whole} | "
                       f"{seeded} |")
        entries.append((name, {"gpu": env.get("card"), "torch": env.get("torch"), "triton": env.get("triton"),
                               "run": f"run {run}", "date": name[:10]}, ""))  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def whole_space_replay_section(replayed: str, parts: list[str]) -> str:
    """bench/replay_tuning.py over an exhaustive search split into `parts` (tuning_study.py --part I/N): the
    whole space's best against the tuner's quick search replayed over it (best / exhaustive, worst of the seeds)."""
    doc = _load(replayed)
    labels = ["quick", "quick, no climb", "quick, no sweep seeds", "quick, no sweep seeds, no climb",
              "quick, default alone", "quick, default alone, no climb"]  # fmt: skip
    out = ["| region | configs timed (failed) | exhaustive best µs | " + " | ".join(labels) + " |",
           "|" + "---|" * (3 + len(labels))]
    for key, v in doc.items():
        block, idx, m = re.match(r"(\w+)\[(\d+)\] M=(\d+)", key).groups()
        region = {0: "norm+QKV+RoPE", 2: "norm+gate/up+GLU"}.get(int(idx), f"region {idx}")
        cells = [f"{v['policies'][lab]['worst']:.3f}" for lab in labels]
        out.append(f"| {block.removeprefix('layer_')} {region} (M = {m}) | {v['configs']} ({v['failed']}) | "
                   f"{v['best_us']:.1f} | " + " | ".join(cells) + " |")
    env = _load(parts[0]).get("_run", {})
    entries = [(name, {"gpu": env.get("card"), "torch": env.get("torch"), "triton": env.get("triton"),
                       "date": name[:10]}, "") for name in [*parts, replayed]]  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


# -------------------------------------------------------------------------------------- library kernels


def library_table(doc: dict, kernels: set[str] | None = None) -> str:
    """bench/gpu_kernels.py rows: GPU time (CUDA-graph replay) and its speedups first, call time and its
    speedups apart, each labelled."""
    out = ["| kernel | case | floor µs | ours GPU µs | baselines GPU µs | ours speedup (GPU time) | ours call µs | "
           "baselines call µs | ours speedup (call time) | rel err |", "|" + "---|" * 10]  # fmt: skip
    for r in doc["rows"]:
        if kernels and r["kernel"] not in kernels:
            continue
        g, bg = r.get("ours_gpu_us"), r.get("baselines_gpu_us") or {}
        c, bc = r.get("ours_us"), r.get("baselines_us") or {}
        out.append(
            f"| {r['kernel']} | {r['shape']} | {_fmt(r.get('floor_us'))} | {_fmt(g) if g else 'not measured'} | "
            + (", ".join(f"{k} {_fmt(v)}" for k, v in bg.items()) or "not measured") + " | "
            + (", ".join(f"{k} {_ratio(v, g)}" for k, v in bg.items()) if g else "–") + f" | {_fmt(c)} | "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in bc.items()) + " | "
            + ", ".join(f"{k} {_ratio(v, c)}" for k, v in bc.items()) + f" | {r['rel_err']:.2e} |"
        )  # fmt: skip
    return "\n".join(out) + "\n"


def library_section(name: str, kernels: set[str] | None = None) -> str:
    doc = _load(name)
    env = dict(doc["env"])
    return library_table(doc, kernels) + "\n" + source_line([(name, env, "")], floors=True) + "\n"


# ---------------------------------------------------------------------------------------------- EP MoE


def ep_moe_table(doc: dict) -> str:
    rows = [r for r in doc["rows"] if "variant" in r]
    best1 = {}
    for r in rows:
        if r["world"] == 1 and r["tokens_per_s"] > best1.get(r["layer"], {}).get("tokens_per_s", 0):
            best1[r["layer"]] = r
    keys = ["route_ms", *(["plan_ms"] if any("plan_ms" in r for r in rows) else []), "dispatch_ms", "compute_ms",
            "combine_ms", *(["dispatch_GB_per_s"] if any("dispatch_GB_per_s" in r for r in rows) else [])]
    names = {"dispatch_GB_per_s": "dispatch GB/s"}
    columns = ["layer", "GPUs", "variant", "rel err", "tokens/s", "vs best 1-GPU variant", "ms",
               *(names.get(k, k.replace("_ms", " ms")) for k in keys)]
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        b = best1.get(r["layer"])
        vs = ("" if b is None else "best" if r is b
              else f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x of {b['variant']}")
        phases = " | ".join(f"{r[k]:.2f}" if k.endswith("_ms") and k in r else f"{r[k]:.0f}" if k in r else ""
                            for k in keys)
        out.append(f"| {r['layer']} | {r['world']} | {r['variant']} | {r['rel_err']:.1e} | {r['tokens_per_s']:,.0f} | "
                   f"{vs} | {r['ms']:.2f} | {phases} |")  # fmt: skip
    for p in (r for r in doc["rows"] if "probe" in r):
        if "dispatch_us" in p:
            out += ["", f"{p['probe']} on {p['world']} ranks, {p['tokens']} tokens a rank (H={p['H']}, top-"
                        f"{p['top_k']} of {p['experts']} experts, bf16; {p['rows_per_token']:.2f} rows leave a token): "
                        f"dispatch {p['dispatch_us']:.0f} µs, combine {p['combine_us']:.0f} µs."]  # fmt: skip
            continue
        out += ["", f"{p['probe']} on {p['world']} ranks: {p['MB_per_rank']:.1f} MB leave each rank in "
                    f"{p['ms']:.3f} ms = {p['GB_per_s']:.1f} GB/s per rank "
                    f"(peer access: {p['peer_access']})."]  # fmt: skip
    return "\n".join(out) + "\n"


def ep_moe_section(name: str = "2026-11-26-h200x2-ep-moe.json") -> str:
    doc = _load(name)
    e = doc["env"]
    gpus = max((r["world"] for r in doc["rows"]), default=1)
    env = {"gpu": f"{gpus}× {e['device']}", "torch": e["torch"], "nccl": e.get("nccl"), "date": e["date"],
           "ceilings": e.get("ceilings")}
    return ep_moe_table(doc) + "\n" + source_line([(name, env, "")]) + "\n"


def moe_gemm_section(name: str, sweep: bool = True) -> str:
    """bench/moe_gemm.py's table (one GPU: the loop over experts, fused_moe's two paths, the GEMM floor), and its
    tile sweep of the triton path."""
    doc = _load(name)
    e = doc["env"]
    out = ["| layer | tokens | rows/expert | variant | ms | TFLOP/s | vs loop | rel err | default path |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
        out.append(f"| {r['layer']} | {r['tokens']} | {r['rows_per_expert']:g} | {r['variant']} | {r['ms']:.3f} | "
                   f"{r['tflops']:.0f} | {r['vs_loop']:.2f}x | {err} | {r['default']} |")  # fmt: skip
    if sweep and doc.get("sweep"):
        out += ["", "The triton path's tiles, one parameter moved from the default:", "",
                "| layer | tokens | config | ms | vs default |", "|---|---|---|---|---|"]
        for r in doc["sweep"]:
            failed = str(r.get("error", "")).split(",")[0].split(": ", 1)[-1]  # e.g. "out of resource: shared memory"
            cells = f"{r['ms']:.3f} | {r['vs_default']:.2f}x" if r.get("ms") else f"failed ({failed}) | "
            out.append(f"| {r['layer']} | {r['tokens']} | {r['variant']} | {cells} |")
    env = {"gpu": e["device"], "torch": e["torch"], "triton": e["triton"], "date": e["date"],
           "run": f"bf16 matmul {e['matmul_tflops']:.0f} TFLOP/s measured in the run (the floor's rate)"}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


# -------------------------------------------------------------------------------------------- generation


def generation_table(doc: dict) -> str:
    """bench/generate.py results: rows of {mode, batch, prompt, new, layers, first_call_s, prefill_ms,
    decode_ms_per_token, peak_gib, logits_rel_err, tokens_equal_eager, floor_ms_per_token, error, graphs} under a
    top level {gpu, versions, ceilings}; the source line names the card, versions and ceilings of the file. For
    ours, *what ran* counts the regions of each compiled graph (prefill, decode) by implementation, with the
    decode graph's replay time."""
    out = ["| mode | batch | prompt | new | layers | first call s | prefill ms | decode ms/token | floor ms/token | "
           "decode / floor | peak GiB | logits rel. err | leading tokens = eager | what ran |",
           "|" + "---|" * 14]  # fmt: skip
    for r in doc["rows"]:
        head = "| " + " | ".join("–" if r.get(k) is None else str(r[k]) for k in
                                 ("mode", "batch", "prompt", "new", "layers")) + " | "  # fmt: skip
        if r.get("error"):
            last = str(r["error"]).strip().splitlines()[-1]
            why = last if last.startswith("timed out") or re.match(r"^\w+(Error|Exception)\b", last) else (
                "the process ended without a result (its stderr's tail is in the JSON)")
            out.append(head + f"error: {why[:160].replace('|', '/')} |" + " |" * 8)
            continue
        dec, floor, eq = r.get("decode_ms_per_token"), r.get("floor_ms_per_token"), r.get("tokens_equal_eager")
        cells = [_num(r.get("first_call_s"), ".1f"), _num(r.get("prefill_ms"), ".2f"), _num(dec, ".3f"),
                 _num(floor, ".3f"), _ratio(dec, floor), _num(r.get("peak_gib"), ".2f"),
                 _num(r.get("logits_rel_err"), ".1e"), "–" if eq is None else f"{eq} of {r.get('new')}",
                 _generation_impls(r)]  # fmt: skip
        out.append(head + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _generation_impls(row: dict) -> str:
    """What ran in each graph of ours: regions by implementation (kernel = our Triton; reference = cuBLAS or
    SDPA through torch), and the decode graph's replay time."""
    parts = []
    for g in row.get("graphs", []):
        counts = collections.Counter(g.get("regions", {}).values())
        text = ", ".join(f"{n} {'Triton' if k == 'kernel' else 'torch (cuBLAS/SDPA)' if k == 'reference' else k}"
                         for k, n in sorted(counts.items()))  # fmt: skip
        note = g.get("graph_note") or ""
        replay = re.search(r"replay (\d+) µs", note)
        parts.append(text + (f"; CUDA graph replay {replay[1]} µs" if replay else ""))
    return " / ".join(parts) if parts else ("torch" if row.get("mode") != "fp32" else "float32 reference")


def generation_section(name: str, old: str | None = None, label: str = "") -> str:
    """One run's table; `old`: the rows of an older tree's run in the same device call, appended with their mode
    marked "(label)"."""
    doc = _load(name)
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions"), "ceilings": doc.get("ceilings")}
    sources = [(name, env, "")]
    if old is not None:
        prior = _load(old)
        doc = {**doc, "rows": doc["rows"] + [{**r, "mode": f"{r['mode']} ({label})"} for r in prior["rows"]]}
        sources.append((old, env, label))
    return generation_table(doc) + "\n" + source_line(sources) + "\n"


def first_call_phases_section(name: str) -> str:
    """bench/generate.py's split of our modes' first generate() call: seconds in the compiler's phases, dynamo's
    tracing (its own counters) and the rest."""
    doc = _load(name)
    rows = [r for r in doc["rows"] if r.get("first_call_phases_s")]
    keys = list(dict.fromkeys(k for r in rows for k in r["first_call_phases_s"]))
    out = ["| mode | first call s | " + " | ".join(f"{k} s" for k in keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for r in rows:
        ph = r["first_call_phases_s"]
        out.append(f"| {r['mode']} | {r['first_call_s']:.1f} | " + " | ".join(_num(ph.get(k), ".2f") for k in keys) + " |")
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions"), "ceilings": doc.get("ceilings")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def cold_tuning_section(name: str) -> str:
    """bench/cold_tuning.py: a layer's cold quick tuning per token count, its Triton compiles by thread."""
    doc = _load(name)
    out = ["| block | M | call s (cold) | regions tuned | trials | compiles in the pool | their seconds, summed | "
           "compiles on the calling thread |", "|" + "---|" * 8]  # fmt: skip
    for r in doc["rows"]:
        out.append(f"| {r['block']} | {r['M']} | {r['wall_s']:.1f} | {r['regions_tuned']} | {r['trials']} | "
                   f"{r['pool_compiles']} | {r['pool_compile_s_summed']:.1f} | {r['main_thread_compiles']} |")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def _cold_tuning_table(runs: list[tuple[str, str]], header: list[str], row) -> str:
    """bench/cold_tuning.py runs side by side: per (file, label) one line per token count, `row(r)` its cells after
    the run's label, block and token count."""
    out = ["| " + " | ".join(["run", "block", "M", *header]) + " |", "|" + "---|" * (len(header) + 3)]
    env = {}
    for name, label in runs:
        doc = _load(name)
        env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton")}
        out += [f"| {label} | {r['block']} | {r['M']} | " + " | ".join(row(r)) + " |" for r in doc["rows"]]
    return "\n".join(out) + "\n\n" + source_line([(name, env, "") for name, _ in runs]) + "\n"


def cold_tuning_ab_section(runs: list[tuple[str, str]]) -> str:
    """bench/cold_tuning.py A/B: per (file, label) a layer's cold quick tuning per token count, how many compiles ran
    at once while any ran, and the tuner's own times of what it chose (regions kept on their reference counted at
    the kernel's time: the quality of the search, not the layer)."""

    def row(r: dict) -> list[str]:
        t = r.get("timeline", {})
        return [f"{r['wall_s']:.1f}", str(r["trials"]), str(r["pool_compiles"]), f"{r['pool_compile_s_summed']:.1f}",
                f"{t.get('compiles busy s', 0):.1f}", f"{t.get('compiles running at once (mean while busy)', 0):.1f}",
                f"{sum(us for _, us in r['chosen'].values()):.0f}" if "chosen" in r else "–"]  # fmt: skip

    return _cold_tuning_table(runs, ["call s (cold)", "trials", "compiles", "their seconds, summed",
                                     "seconds with a compile running", "compiles at once",
                                     "chosen kernels' times, summed µs"], row)  # fmt: skip


def cold_tuning_workers_section(runs: list[tuple[str, str]]) -> str:
    """bench/cold_tuning.py A/B of where compiles run (compile workers or threads): per (file, label) a layer's cold
    quick tuning per token count, the calling thread's wait for batches of compiles, its time timing candidates,
    and the tuner's own times of what it chose (the quality of the search)."""

    def row(r: dict) -> list[str]:
        t = r["timeline"]
        return [f"{r['wall_s']:.1f}", str(r["regions_tuned"]), str(r["trials"]), f"{t['submitting compiles']:.1f}",
                f"{t['timing candidates']:.1f}", f"{sum(us for _, us in r['chosen'].values()):.0f}"]  # fmt: skip

    return _cold_tuning_table(runs, ["call s (cold)", "regions tuned", "trials", "waiting for batches to compile, s",
                                     "timing candidates, s", "chosen kernels' times, summed µs"], row)  # fmt: skip


def cold_tuning_together_section(runs: list[tuple[str, str]]) -> str:
    """bench/cold_tuning.py, regions tuned together (`runtime.selection.Together`) or one after another, or with
    the first candidates compiled ahead (the tree before): per (file, label) a layer's cold quick tuning per token
    count, the tuned layer's GPU time replayed from a CUDA graph where measured (what the choices are worth), the
    trials, the compile workers' batches and the seconds spent in them."""

    def row(r: dict) -> list[str]:
        w = r["compile_workers"]
        replayed = r.get("layer_us_replayed")
        return [r.get("variant", "").removeprefix("ct-") or "–", f"{r['wall_s']:.1f}",
                f"{replayed:.1f}" if replayed else "–", str(r["trials"]), str(int(w["batches"])),
                str(int(w["compiles"])), f"{w['wall_s']:.1f}",
                f"{sum(us for _, us in r['chosen'].values()):.0f}"]  # fmt: skip

    return _cold_tuning_table(runs, ["process", "call s (cold)", "layer µs (replayed)", "trials", "compile batches",
                                     "compiles", "in the batches, s", "chosen kernels' times, summed µs"], row)  # fmt: skip


def cold_generate_ab_section(runs: list[tuple[str, str]], decode: bool = False, split: bool = False) -> str:
    """bench/generate.py --modes ours with fresh caches, per (file, label): the first generate() call, its phases,
    and the regions tuned and trials run in it (both graphs: prefill and decode). `decode`: also the mode, dynamo's
    tracing with keep_traces' saving, the decode rate and the decode graph's replay (runs of 256 new tokens; runs of
    8 tokens are too short for a decode rate). `split`: also tuning's compile batches and timings (from the
    twenty-ninth session's generate.py) and the prefill graph's replay."""
    keys = ["compile", "tuning (inside direct runs)", "dynamo tracing"]
    head = ["run", "mode"] if decode else ["run"]
    tail = ["regions tuned", "trials", "prefill ms"] + (["decode ms/token", "decode graph replay µs"] if decode else [])
    if split:
        tail += ["tuning: compile batches s", "tuning: timings s", "prefill graph replay µs"]
    names = [*keys[:2], "dynamo tracing (keep_traces: with the saving; warm: the loading)" if decode else keys[2]]
    out = ["| " + " | ".join([*head, "first generate() s", *(f"{k} s" for k in names), *tail]) + " |",
           "|" + "---|" * (len(head) + len(keys) + len(tail) + 1)]  # fmt: skip
    env = {}
    for name, label in runs:
        doc = _load(name)
        env = {"gpu": doc.get("gpu"), "versions": doc.get("versions"), "ceilings": doc.get("ceilings")}
        for r in doc["rows"]:
            ph, gs = r["first_call_phases_s"], r["graphs"]
            if decode:  # (with keep_traces dynamo's tracing is timed with the saving, or replaced by the loading)
                ph = {**ph, "dynamo tracing": ph.get("dynamo tracing") or ph.get("dynamo tracing and saving (keep_traces)")
                      or ph.get("loading saved traces (keep_traces)")}  # fmt: skip
            cells = [label, r["mode"]] if decode else [label]
            cells += [f"{r['first_call_s']:.1f}", *(_num(ph.get(k), ".1f") for k in keys),
                      str(sum(g["tuned"] for g in gs)), str(sum(g["trials"] for g in gs)), f"{r['prefill_ms']:.1f}"]
            if decode:
                replay = re.search(r"replay (\d+) µs", gs[-1].get("graph_note", "")) if gs else None
                cells += [f"{r['decode_ms_per_token']:.2f}", replay.group(1) if replay else "–"]
            if split:
                first = re.search(r"replay (\d+) µs", gs[0].get("graph_note", "")) if len(gs) > 1 else None
                cells += [_num(ph.get("tuning: compile batches"), ".1f"), _num(ph.get("tuning: timings"), ".1f"),
                          first.group(1) if first else "–"]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n\n" + source_line([(name, env, "") for name, _ in runs]) + "\n"


def generation_runs_section(runs: list[tuple[str, str]]) -> str:
    """Several bench/generate.py files of one device call, per (file, label): their rows in one table, each mode
    marked "(label)"."""
    rows, sources = [], []
    for name, label in runs:
        doc = _load(name)
        rows += [{**r, "mode": f"{r['mode']} ({label})"} for r in doc["rows"]]
        sources.append((name, {"gpu": doc.get("gpu"), "versions": doc.get("versions"), "ceilings": doc.get("ceilings")},
                        label))  # fmt: skip
    return generation_table({"rows": rows}) + "\n" + source_line(sources) + "\n"


def decode_ab_section(name: str) -> str:
    """bench/decode_ab.py: the modes of one process, each round timing every mode in turn (the order turning): decode
    ms per token per mode, and each mode's ratio to the first mode within the round (> 1: the first is faster); then,
    where the run recorded them, the prefill ms (generate() of one token) and their ratios the same way."""
    doc = _load(name)
    modes = doc["modes"]

    def table(unit: str, values: str, ratios: str, medians: str, median_ratios: str, tag: str = "") -> list[str]:
        out = ["| round | order | " + " | ".join(f"{m} {unit}" for m in modes) + " | "
               + " | ".join(f"{m} / {modes[0]}{tag}" for m in modes[1:]) + " |", "|" + "---|" * (2 * len(modes) + 1)]
        for i, r in enumerate(doc["rounds"], 1):
            out.append(f"| {i} | {', '.join(r['order'])} | " + " | ".join(f"{r[values][m]:.2f}" for m in modes) + " | "
                       + " | ".join(f"{r[ratios][m]:.3f}" for m in modes[1:]) + " |")  # fmt: skip
        out.append("| median | | " + " | ".join(f"{doc[medians][m]:.2f}" for m in modes) + " | "
                   + " | ".join(f"{doc[median_ratios][m]:.3f}" for m in modes[1:]) + " |")  # fmt: skip
        return out

    out = table("ms/token", "decode_ms_per_token", "ratio_to_first", "median_decode_ms_per_token", "median_ratio_to_first")
    if "median_prefill_ms" in doc:  # (from the thirty-first session: each round's generate() of one token too)
        out += ["", *table("prefill ms", "prefill_ms", "prefill_ratio_to_first", "median_prefill_ms",
                           "median_prefill_ratio_to_first", " (prefill)")]  # fmt: skip
    first = ", ".join(f"{m} {doc['first_call_s'][m]:.1f} s" for m in modes)
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions")}
    window = f", sliding window {doc['sliding_window']}" if doc.get("sliding_window") else ""
    what = (f"{doc.get('model', 'llama3_8b')}{window}, prompt {doc['prompt']}, {doc['new']} new tokens, {doc['layers']} "
            f"layers, tune {doc['tune']}; first calls: {first}")
    if doc.get("specializations"):  # (from the thirty-third session)
        what += "; specializations made: " + ", ".join(f"{m} {n}" for m, n in doc["specializations"].items())
    return "\n".join(out) + "\n\n" + source_line([(name, env, what)]) + "\n"


def decode_trace_section(name: str, top: int = 8) -> str:
    """bench/decode_ab.py --trace: per mode, the GPU's kernels over 8 decode steps (generate() of 9 tokens minus
    generate() of 1, torch.profiler; names with their layer numbers blanked): launches, µs per launch and ms in all
    for the `top` largest, and the wall and GPU-busy ms of the span (the profiler slows the host's side)."""
    doc = _load(name)
    out = ["| mode | kernel | launches | µs per launch | ms in all |", "|---|---|---|---|---|"]
    spans = []
    for mode, t in doc["trace_decode_8"].items():
        for kernel, (count, ms) in list(t["top_kernels_ms"].items())[:top]:
            label = kernel if len(kernel) <= 60 else kernel[:57] + "..."
            out.append(f"| {mode} | `{label}` | {count} | {ms / count * 1e3:.1f} | {ms:.2f} |")
        spans.append(f"{mode}: wall {t['wall_ms']:.1f} ms, GPU busy {t['gpu_busy_ms']:.1f} ms, {t['events']} events")
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions")}
    window = f", sliding window {doc['sliding_window']}" if doc.get("sliding_window") else ""
    what = f"{doc.get('model', 'llama3_8b')}{window}, prompt {doc['prompt']}, 8 decode steps traced; " + "; ".join(spans)
    return "\n".join(out) + "\n\n" + source_line([(name, env, what)]) + "\n"


def timing_study_section(name: str) -> str:
    """bench/tuner_timing.py (bench/NOTES.md 108; run 6 by its first form, before `ours` existed): sampled one-row
    configs of each GEMM region of a decoder layer at M = 1, each timed by the tuner's measure (`ours`, where
    recorded), by do_bench as called (L2 cleared by writing it: `dirty`), with L2 cleared by reading (`clean`), and
    back to back in a CUDA graph over distinct weight copies (`graph`: how the model's decode graph runs it). Per
    region: the tuned config's times, and the graph time of the config each measure ranks first."""
    doc = _load(name)
    how = [k for k in ("ours", "dirty", "clean") if k in doc[0]["rows"][0]]
    out = ["| layer | region | N × K | configs | tuned: " + " / ".join(how + ["graph"]) + " µs | "
           + " | ".join(f"graph µs of the best by {k}" for k in how) + " | best graph µs (TB/s) |",
           "|---|---|---|---|---|" + "---|" * len(how) + "---|"]  # fmt: skip
    for r in doc:
        rows, tuned = r["rows"], r["rows"][0]
        best = {k: min(rows, key=lambda x, k=k: x[k])["chain"] for k in how}
        g = min(x["chain"] for x in rows)
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['N']} × {r['K']} | {len(rows)} | "
                   + " / ".join(f"{tuned[k]:.1f}" for k in how + ["chain"]) + " | "
                   + " | ".join(f"{best[k]:.1f}" for k in how) + f" | {g:.1f} ({r['weight_MB'] / g:.2f}) |")  # fmt: skip
    return "\n".join(out) + "\n\n*Source:* NVIDIA H200 · torch 2.11.0+cu130, triton 3.6.0 · raw: `bench/results/" + name + "`\n"


def warm_start_section(name: str) -> str:
    """bench/generate.py rows of a cold process and the warm processes after it (with and without keep_traces):
    the first generate() call and where it went (dynamo's tracing, or loading the kept traces; our compile; the
    direct runs; CUDA-graph capture and its keep-or-drop timing; the rest), and the tokens equal to eager's."""
    keys = [("dynamo tracing and saving (keep_traces)", "tracing and saving"), ("dynamo tracing", "dynamo tracing"),
            ("loading saved traces (keep_traces)", "loading kept traces"), ("compile", "our compile"),
            ("direct runs (tuning included)", "direct runs (tuning in them)")]  # fmt: skip
    out = ["| mode | kept (keep_traces) | first generate() s | " + " | ".join(f"{label} s" for _, label in keys)
           + " | graph capture and timing s | other s | leading tokens = eager |", "|" + "---|" * (len(keys) + 6)]
    doc = _load(name)
    for r in doc["rows"]:
        ph = r.get("first_call_phases_s")
        if ph is None:
            continue
        graph = ph.get("graph capture", 0) + ph.get("graph keep-or-drop timing", 0)
        kept = r.get("kept") or ("yes" if r.get("keep_traces") else "no")  # (from session 27: what was kept)
        out.append(f"| {r['mode']} | {kept} | {r['first_call_s']:.1f} | "
                   + " | ".join(_num(ph.get(k) or None, ".2f") for k, _ in keys)
                   + f" | {graph:.2f} | {ph.get('other (Triton outside tuning, HF)', 0):.2f} | "
                   f"{r.get('tokens_equal_eager', '–')} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions"), "ceilings": doc.get("ceilings")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def generation_trace_table(doc: dict) -> str:
    """The GPU's view of each mode (bench/generate.py --trace): a prefill (generate of one token) and 8 decode
    steps (generate(9) minus generate(1)) under torch.profiler: wall time (profiler overhead included), GPU busy
    time (kernels, copies, memsets) and events, then the largest kernels of the decode steps."""
    out = ["| mode | batch | prompt | prefill wall ms | prefill GPU busy ms | prefill events | 8 decode steps wall ms | "
           "8 decode steps GPU busy ms | decode events | largest decode kernels (calls, ms) |",
           "|" + "---|" * 10]  # fmt: skip
    for r in doc["rows"]:
        p, d = r.get("trace_prefill"), r.get("trace_decode_8")
        if not p or not d:
            continue
        top = "; ".join(f"{k[:48]} ({c}, {t:.2f})" for k, (c, t) in list(d["top_kernels_ms"].items())[:4])
        out.append(f"| {r['mode']} | {r['batch']} | {r['prompt']} | {p['wall_ms']:.1f} | {p['gpu_busy_ms']:.1f} | "
                   f"{p['events']} | {d['wall_ms']:.1f} | {d['gpu_busy_ms']:.1f} | {d['events']} | {top} |")  # fmt: skip
    return "\n".join(out) + "\n"


def generation_trace_section(name: str, old: str | None = None, label: str = "") -> str:
    doc = _load(name)
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions"), "ceilings": doc.get("ceilings")}
    sources = [(name, env, "")]
    if old is not None:
        doc = {**doc, "rows": doc["rows"] + [{**r, "mode": f"{r['mode']} ({label})"} for r in _load(old)["rows"]]}
        sources.append((old, env, label))
    return generation_trace_table(doc) + "\n" + source_line(sources) + "\n"


def decode_attention_section(name: str, old: str, label: str) -> str:
    """bench/decode_attention.py from two trees in one device call: per case (cache slots L, valid slots), each
    tree's fastest config and default config (µs per call in a CUDA graph), torch's SDPA, and the floor."""
    new_doc, old_doc = _load(name), _load(old)
    out = ["| L | valid | ours: best config | µs | ours: default | µs | "
           f"{label}: best | µs | {label}: default | µs | SDPA µs | floor µs |", "|" + "---|" * 12]  # fmt: skip
    short = lambda c: c.replace("BLOCK_N=", "BN ").replace(",SPLITS=", ", splits ").replace(",num_stages=", ", stages ").replace(",num_warps=", ", warps ")  # noqa: E731
    for r, o in zip(new_doc["rows"], old_doc["rows"], strict=True):
        out.append(f"| {r['L']} | {r['valid']} | {short(r['best'])} | {r['best_us']:.2f} | {short(r['default'])} | "
                   f"{r['default_us']:.2f} | {short(o['best'])} | {o['best_us']:.2f} | {short(o['default'])} | "
                   f"{o['default_us']:.2f} | {r['sdpa_us']:.2f} | {r['floor_us']:.2f} |")  # fmt: skip
    env = {"gpu": new_doc.get("gpu"), "torch": new_doc.get("torch"), "triton": new_doc.get("triton")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, ""), (old, env, label)]) + "\n"


def decode_host_section(entries: list[tuple[str, str]]) -> str:
    """bench/decode_host.py rows (file, label): per decode token, host ms inside model.forward, inside our
    compiled module, inside the graph replay, the GPU's time in the forward and its idle time between forwards
    (– where a row has none: eager, or ours without CUDA graphs)."""
    out = ["| run | decode ms/token | host ms in model.forward | host ms in ours | host ms in replay | "
           "GPU ms in forward | GPU idle ms between forwards |", "|" + "---|" * 7]  # fmt: skip
    sources = []
    cell = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
    for name, label in entries:
        doc = _load(name)
        r = doc["row"]
        out.append(f"| {label} | {r['decode_ms_per_token']:.2f} | {cell(r['host_ms_in_forward'], '.3f')} | "
                   f"{cell(r['host_ms_in_ours'], '.3f')} | {cell(r['host_ms_in_replay'], '.3f')} | "
                   f"{cell(r['gpu_ms_in_forward'], '.2f')} | {cell(r['gpu_idle_ms_between_forwards'], '.3f')} |")  # fmt: skip
        sources.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch")}, label))
    return "\n".join(out) + "\n\n" + source_line(sources) + "\n"


def host_parts_section(name: str) -> str:
    """bench/decode_host.py's parts of our host time per decode token (medians): the program's call (the replay
    included), the derived weights' version check, the call key's alias pattern, the write-back of inputs."""
    doc = _load(name)
    r = doc["row"]
    keys = ["ours", "replay", "program", "weights_check", "alias_pattern", "write_back"]
    out = ["| " + " | ".join(f"host ms in {k.replace('_', ' ')}" for k in keys) + " |", "|" + "---|" * len(keys),
           "| " + " | ".join(f"{r['host_ms_in_' + k]:.3f}" for k in keys) + " |"]
    return "\n".join(out) + "\n\n" + source_line([(name, {"gpu": doc.get("gpu"), "torch": doc.get("torch")}, "")]) + "\n"


def launch_overhead_section(entries: list[tuple[str, str]]) -> str:
    """bench/launch_overhead.py rows (file, label): host µs per launch by path, one column per run."""
    docs = [(_load(name), label, name) for name, label in entries]
    keys = list(dict.fromkeys(k for doc, _, _ in docs for k in doc["rows"]))
    out = ["| launch path | " + " | ".join(label for _, label, _ in docs) + " |", "|" + "---|" * (len(docs) + 1)]
    for k in keys:
        out.append(f"| {k} | " + " | ".join(f"{doc['rows'][k]:.1f}" if k in doc["rows"] else "–" for doc, _, _ in docs) + " |")
    sources = [(name, {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton")}, label)
               for doc, label, name in docs]  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(sources) + "\n"


def lengths_table(doc: dict) -> str:
    """bench/lengths.py results: per mode, each new prompt length's first, second and third call (ms; for ours the
    full compiles and shape-family instances the first call took), then the dynamic-cache generate()."""
    rows = [r for r in doc["rows"] if not r.get("error")]
    prompted = [r for r in rows if r.get("prompts")]
    out = []
    if prompted:
        out = ["| prompt | " + " | ".join(f"{r['mode']} 1st / 2nd / 3rd ms" for r in prompted) + " | ours: compiled or instance |",
               "|" + "---|" * (len(prompted) + 2)]  # fmt: skip
        ours = next((r for r in prompted if r["mode"] == "ours"), None)
        for i, p in enumerate(prompted[0]["prompts"]):
            cells = [" / ".join(f"{r['prompts'][i][k]:.0f}" for k in ("first_ms", "second_ms", "third_ms")) for r in prompted]
            how = "–" if ours is None else "instance" if ours["prompts"][i].get("instances") else "compiled"
            out.append(f"| {p['prompt']} | " + " | ".join(cells) + f" | {how} |")
        out.append("")
    out += ["| mode | dynamic cache: first generate() s | second s | ms/token | peak GiB | leading tokens = eager | "
            "ours: compiles + instances (first call; second; the timed calls' compiles) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        d = r.get("dynamic") or {}
        if not d:
            continue
        eq = d.get("tokens_equal_eager")
        cnt = f"{d['compiles']} + {d['instances']}" if "compiles" in d else "–"
        if "second_compiles" in d:
            cnt += f"; {d['second_compiles']} + {d['second_instances']}; {d['timed_compiles']}"
        second = f"{d['second_ms'] / 1e3:.1f}" if "second_ms" in d else "–"
        out.append(f"| {r['mode']} | {d['first_ms'] / 1e3:.1f} | {second} | {d['ms_per_token']:.1f} | {d['peak_gib']:.2f} | "
                   f"{'–' if eq is None else str(eq) + ' of ' + str(d.get('new'))} | {cnt} |")  # fmt: skip
    for r in doc["rows"]:
        if r.get("error"):
            out.append(f"\n{r['mode']}: {r['error']}")
    return "\n".join(out) + "\n"


def lengths_section(name: str, old: str | None = None, label: str = "") -> str:
    """One lengths.py run; with `old`, the rows of a run of an older tree in the same device call appended
    (their mode named `ours (label)`)."""
    doc = _load(name)
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions")}
    sources = [(name, env, "")]
    if old is not None:
        before = _load(old)
        doc = {**doc, "rows": doc["rows"] + [{**r, "mode": f"{r['mode']} ({label})"} for r in before["rows"]]}
        sources.append((old, {"gpu": before.get("gpu"), "versions": before.get("versions")}, label))
    return lengths_table(doc) + "\n" + source_line(sources) + "\n"


def replay_section(name: str) -> str:
    """Direct launches against CUDA-graph replay of the decoder layer (bench/profile_kernels.py): timings, kernel
    sums of separate traces and of one interleaved trace, the largest kernels' interleaved times, and the SM clock
    nvidia-smi read in each timing phase."""
    doc = _load(name)
    out = ["| mode | do_bench direct / replay µs | loop direct / replay µs | kernel sum, separate traces µs | "
           "kernel sum, interleaved µs | largest kernels interleaved, direct → replay µs | launch shapes | "
           "SM MHz (median) direct / replay timings |", "|" + "---|" * 8]  # fmt: skip
    for mode in ("ours", "max-autotune-no-cudagraphs"):
        d, g, il = doc[f"{mode}/direct"], doc[f"{mode}/graph"], doc[f"{mode}/interleaved"]
        pd, pg = il["direct"]["per_kernel"], il["graph"]["per_kernel"]
        top = "; ".join(f"{k[:36]} {pd[k]:.1f} → {pg.get(k, 0):.1f}" for k in sorted(pd, key=lambda k: -pd[k])[:3])
        same = all(il["direct"]["launches"][k] == il["graph"]["launches"].get(k) for k in il["direct"]["launches"])
        smi = doc.get("smi", {})
        clocks = " / ".join(str(smi.get(f"{mode}/{how} timings", {}).get("sm_mhz_median", "–")) for how in ("direct", "graph"))
        out.append(f"| {mode} | {d['do_bench_median']:.1f} / {g['do_bench_median']:.1f} | {d['loop_per_call']:.1f} / "
                   f"{g['loop_per_call']:.1f} | {d['kernel_sum']:.1f} / {g['kernel_sum']:.1f} | "
                   f"{il['direct']['kernel_sum']:.1f} / {il['graph']['kernel_sum']:.1f} | {top} | "
                   f"{'identical' if same else 'differ'} | {clocks} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "ceilings": doc.get("ceilings")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"block {doc.get('block')}, M={doc.get('M')}")]) + "\n"


def _kernel_kind(name: str) -> str:
    """A traced kernel's kind for `fusion_bound_section`: a GEMM (our generated GEMM regions with their fused
    prologues and epilogues, cuBLAS's `nvjet`/`cutlass` kernels, Inductor's Triton GEMM templates), the attention
    (cuDNN's or a flash kernel), or another op (norms, pointwise, copies)."""
    if name.startswith("gemm_") or name.startswith(("nvjet", "cutlass", "sm90_xmma", "triton_tem")):
        return "GEMM"
    if name.startswith("cudnn") or "flash" in name and not name.startswith("triton_"):
        return "attention"
    return "other"


def fusion_bound_section(name: str, goal: float) -> str:
    """bench/profile_kernels.py of a layer, ours against max-autotune (no CUDA graphs of its own; both replayed from a
    graph by the script): each mode's kernels of one replayed call grouped by kind (`_kernel_kind`), then the bound
    the goal sets on our GEMM regions: our call if our GEMM regions (each a GEMM with its fused norm scaling,
    rotary, SiLU·mul or residual) took exactly torch's GEMM kernels' time, and the most our GEMM regions may take for
    torch's sum / ours to reach `goal` (as a ratio to torch's bare GEMM kernels)."""
    doc = _load(name)
    modes = [("ours", doc["ours/graph"]), ("max-autotune", doc["max-autotune-no-cudagraphs/graph"])]
    out = ["| mode | kernel | kind | µs a call |", "|---|---|---|---|"]
    sums = {}
    for mode, r in modes:
        kinds = collections.Counter()
        for k, us in sorted(r["per_kernel"].items(), key=lambda kv: -kv[1]):
            kinds[_kernel_kind(k)] += us
            out.append(f"| {mode} | `{k[:60]}` | {_kernel_kind(k)} | {us:.1f} |")
        sums[mode] = (kinds, r["kernel_sum"])
        out.append(f"| {mode} | **sum** | GEMM {kinds['GEMM']:.1f}, attention {kinds['attention']:.1f}, "
                   f"other {kinds['other']:.1f} | **{r['kernel_sum']:.1f}** |")
    (ok, ot), (tk, tt) = sums["ours"], sums["max-autotune"]
    bound = ot - ok["GEMM"] + tk["GEMM"]
    allowed = tt / goal - (ot - ok["GEMM"])
    out += ["", f"*Bound:* torch's kernels sum to {tt:.1f} µs and ours to {ot:.1f} ({tt / ot:.3f}x). Our GEMM regions "
            f"take {ok['GEMM']:.1f} µs where torch's GEMM kernels take {tk['GEMM']:.1f} and its ops that our "
            f"regions fuse and norms {tk['other']:.1f}. Were our GEMM regions, fusions included, exactly as fast as "
            f"torch's bare GEMM kernels, ours would sum to {bound:.1f} µs: {tt / bound:.3f}x. For {goal}x our GEMM "
            f"regions may take at most {allowed:.1f} µs, {tk['GEMM'] / allowed:.3f}x of torch's GEMM time "
            f"(now {tk['GEMM'] / ok['GEMM']:.3f}x)."]
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "ceilings": doc.get("ceilings")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"block {doc.get('block')}, M={doc.get('M')}, "
                                                         "kernel times of one graph-replayed call")]) + "\n"


def replay_ab_section(name: str, labels: dict[str, str] | None = None, kernels: int = 4) -> str:
    """bench/replay_ab.py: each mode's decode graph replayed in alternating blocks in one process: µs a replay
    (median of the blocks, their range), the ratio to the first mode (median of the blocks' ratios), the first
    replay's logits against the first mode's, and the `kernels` largest kernel families of a profiled replay (under
    PDL a kernel's span includes its wait). `labels` names what each mode ran where the tree has changed since."""
    doc = _load(name)
    modes, labels = doc["modes"], labels or {}
    out = ["| mode | what ran | µs a replay (median) | blocks' range µs | / " + modes[0] + " | logits max abs diff | "
           "largest kernels: launches, µs a replay |", "|" + "---|" * 7]  # fmt: skip
    for m in modes:
        blocks = doc["us_per_replay"][m]
        ratio = f"{doc['median_ratio_to_first'][m]:.4f}" if m != modes[0] else "1"
        diff = f"{doc['logits_max_abs_diff_to_first'][m]:.3g}" if m != modes[0] else "–"
        top = "; ".join(f"`{k[:24]}` {n}, {us:.0f}" for k, (n, us) in list(doc["kernels_us_per_replay"][m].items())[:kernels])
        out.append(f"| {m} | {labels.get(m, '')} | {doc['median_us_per_replay'][m]:.1f} | {min(blocks):.1f}–{max(blocks):.1f} | "
                   f"{ratio} | {diff} | {top} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "versions": doc.get("versions")}
    what = f"{doc['model']}, {doc['layers']} layers, prompt {doc['prompt']}, {doc['blocks']} blocks of {doc['reps']} replays"
    return "\n".join(out) + "\n\n" + source_line([(name, env, what)]) + "\n"


GEMM_REGION = {"gemm_0": "norm+QKV+RoPE", "gemm_1": "o-proj+residual", "gemm_2": "norm+gate/up+GLU", "gemm_3": "down+residual"}


def gemm_ran(r: dict) -> str:
    """What the compiled layer runs for a region: its kernel (K loop, or cuBLAS + the kernel as epilogue) or
    the reference; the timed kernel is the tuned config either way."""
    c = r["config"]
    kern = ("cuBLAS adding into the residual in place (no kernel)" if c.get("MM") == 2 else
            "cuBLAS + epilogue kernel" if c.get("MM") else f"our K loop{' (TMA)' if c.get('TMA') else ''}")
    if c.get("PERSISTENT"):
        kern += ", persistent" + (", warp-specialized" if c.get("WS") else "")
    if c.get("NORM_PASS"):
        kern += " after a norm pass"
    return kern if r["impl"] == "kernel" else f"reference (cuBLAS, torch ops); timed: {kern}"


def _date(doc: dict, name: str) -> str | None:
    """A result file's date: its own, else the one its name begins with (`2026-12-02-h200-...`)."""
    return doc.get("date") or (name[:10] if re.match(r"\d{4}-\d{2}-\d{2}-", name) else None)


def gemms_section(name: str) -> str:
    """bench/gemms.py: every fused GEMM kernel of each layer against cuBLAS on the same GEMM shape."""
    doc = _load(name)
    out = ["| layer | region | M × N × K | runs | kernel µs | cuBLAS µs | cuBLAS / kernel | kernel TFLOP/s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in doc["layers"]:
        region = GEMM_REGION.get(r["region"], r["region"])
        out.append(f"| {r['layer']} | {region} | {r['M']} × {r['N']} × {r['K']} | {gemm_ran(r)} | {r['kernel_us']:.1f} | "
                   f"{r['cublas_us']:.1f} | {r['ratio']:.2f}x | {r['kernel_tflops']:.0f} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"tune={doc.get('tune')}, triton {doc.get('triton')}")]) + "\n"


def persistent_sweep_section(name: str) -> str:
    """bench/gemms.py --sweep with persistent variants: per region, the fastest config of each loop form (one tile
    per program, persistent, persistent and warp-specialized) among those whose output matched the tuned config's
    (rel. difference ≤ 1e-2), and how many configs of each form gave wrong or non-finite outputs."""
    doc = _load(name)
    forms = [("one tile per program", (0, 0)), ("persistent", (1, 0)), ("persistent, warp-specialized", (1, 1))]
    out = ["| layer | region | cuBLAS µs | " + " | ".join(f"{f} µs (wrong)" for f, _ in forms) + " |",
           "|---|---|---|" + "---|" * len(forms)]
    for r in doc["layers"]:
        cells = []
        for _, key in forms:
            runs = [(t, e) for c, t, e in r.get("sweep", []) if (c.get("PERSISTENT", 0), c.get("WS", 0)) == key]
            good = [t for t, e in runs if e == e and e <= 1e-2]  # (NaN != NaN)
            cells.append(f"{min(good):.1f} ({len(runs) - len(good)} of {len(runs)})" if good else "–")
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['cublas_us']:.1f} | "
                   + " | ".join(cells) + " |")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"triton {doc.get('triton')}")]) + "\n"


def default_tile_section(old: str, new: str) -> str:
    """bench/gemms.py --tune none on two trees in one run: each region's default config (the untuned tile) before
    and after a change of the default, against cuBLAS on the same GEMM shape."""
    tile = lambda r: (f"{r['config']['BLOCK_M']}×{r['config']['BLOCK_N']}×{r['config']['BLOCK_K']}, "  # noqa: E731
                      f"{r['config']['num_warps']} warps, {r['config']['num_stages']} stages")
    return _before_after(old, new, "tile", tile, 2)


def _before_after(old: str, new: str, label: str, describe, digits: int) -> str:
    """bench/gemms.py run on two trees in one call: each region before and after, `describe(row)` saying what ran
    (the `label` column), against cuBLAS on the same GEMM shape."""
    a, b = _load(old), _load(new)
    out = [f"| layer | region | M × N × K | {label} before | µs before | {label} after | µs after | after / before | "
           "cuBLAS µs | cuBLAS / after |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r, q in zip(a["layers"], b["layers"]):
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['M']} × {r['N']} × {r['K']} | "
                   f"{describe(r)} | {r['kernel_us']:.1f} | {describe(q)} | {q['kernel_us']:.1f} | "
                   f"{q['kernel_us'] / r['kernel_us']:.{digits}f} | {q['cublas_us']:.1f} | {q['ratio']:.2f}x |")  # fmt: skip
    env = {"gpu": b.get("gpu"), "torch": b.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, f"after, tune={b.get('tune')}, triton {b.get('triton')}")]) + "\n"


def rotary_table_section(old: str, new: str) -> str:
    """A `.dbg` driver over bench/gemms.py on two trees in one run (thirty-ninth session): Llama-3-8B's QKV pieces
    at M = 2048 (tune none, the fixed sweep) and the tuned layer's rotary region, before and after the rotary's
    cos/sin table was read once per tile for every head (NOTES 131)."""
    a, b = _load(old), _load(new)
    out = ["| piece | fastest swept µs before | after | after / before | cuBLAS µs |", "|---|---|---|---|---|"]
    for r, q in zip(a["ablate"], b["ablate"]):
        out.append(f"| {r['piece']} | {r['sweep_best_us']:.1f} | {q['sweep_best_us']:.1f} | "
                   f"{q['sweep_best_us'] / r['sweep_best_us']:.3f} | {q['cublas_us']:.1f} |")  # fmt: skip
    for r, q in zip(a["layers"], b["layers"]):
        out.append(f"| {r['layer']} layer, tuned (`quick`): before {gemm_ran(r)}, after {gemm_ran(q)} | "
                   f"{r['kernel_us']:.1f} | {q['kernel_us']:.1f} | {q['kernel_us'] / r['kernel_us']:.3f} | {q['cublas_us']:.1f} |")  # fmt: skip
    env = {"gpu": b.get("gpu"), "run": "torch 2.11.0+cu130, triton 3.6.0 (the device image; not recorded in the files)"}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, "after")]) + "\n"


def gemm_loop_probe_section(name: str) -> str:
    """bench/gemm_loop_probe.py: a plain bf16 GEMM at M = 2048 in each loop structure and tile, as a fraction of
    cuBLAS's throughput on the same shape (cuBLAS µs / ours µs), the fastest of each shape in bold."""
    doc = _load(name)
    cub = {r["shape"]: r["us"] for r in doc["rows"] if r["variant"] == "cuBLAS"}
    shapes = list(cub)
    runs: dict[tuple, dict] = {}
    for r in doc["rows"]:
        if r["variant"] != "cuBLAS":
            runs.setdefault((tuple(r["tile"]), r["variant"]), {})[r["shape"]] = r.get("us")
    best = {s: min(v[s] for v in runs.values() if v.get(s)) for s in shapes}
    out = ["| tile (M×N×K, warps, stages) | loop | " + " | ".join(shapes) + " |", "|---|---|" + "---|" * len(shapes),
           "| cuBLAS (`torch.matmul`), µs | | " + " | ".join(f"{cub[s]:.1f}" for s in shapes) + " |"]
    for (tile, variant), us in runs.items():
        ratios = {s: f"{cub[s] / us[s]:.3f}" for s in shapes if us.get(s)}
        cells = [f"**{ratios[s]}**" if us[s] == best[s] else ratios[s] if s in ratios else "–" for s in shapes]
        out.append(f"| {tile[0]}×{tile[1]}×{tile[2]}, {tile[3]}, {tile[4]} | {variant} | " + " | ".join(cells) + " |")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton")}
    what = "do_bench medians, cold L2; shapes M × N × K in the file"
    return "\n".join(out) + "\n\n" + source_line([(name, env, what)]) + "\n"


def sweep_ab_section(old: str, new: str) -> str:
    """A `.dbg` driver over bench/gemms.py's fixed sweep (tune none) on two trees in one run: each swept config of a
    region before and after, and cuBLAS on the same GEMM shape."""
    a, b = _load(old), _load(new)
    out = ["| region | M × N × K | config | µs before | µs after | after / before |", "|---|---|---|---|---|---|"]
    for r, q in zip(a["qkv"], b["qkv"]):
        for (cfg, t0, _), (cfg1, t1, _) in zip(r["sweep"], q["sweep"]):
            assert cfg == cfg1, (cfg, cfg1)
            kind = "persistent" if cfg["PERSISTENT"] else "one tile a program"
            kind += ", norm pass" if cfg["NORM_PASS"] else ""
            out.append(f"| {GEMM_REGION.get(r['region'], r['region'])} | {r['M']} × {r['N']} × {r['K']} | "
                       f"{_config(cfg)}, {kind} | {t0:.1f} | {t1:.1f} | {t1 / t0:.3f} |")  # fmt: skip
        out.append(f"| cuBLAS (`torch.matmul`) | | | {r['cublas_us']:.1f} | {q['cublas_us']:.1f} | |")
    env = {"gpu": b.get("gpu"), "run": "torch 2.11.0+cu130, triton 3.6.0 (the device image; not recorded in the files)"}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, "after")]) + "\n"


def split_twins_section(name: str) -> str:
    """bench/gemms.py --tune none --sweep --sweep-splits: each persistent config of the fixed sweep that has split
    twins (its last wave split 2, 4 or 8 ways over K, where the parts still make one wave: NOTES 138) against itself
    unsplit, and cuBLAS on the same GEMM shape."""
    doc = _load(name)
    out = ["| layer | region | M × N × K | config (persistent) | unsplit µs | split: µs (split / unsplit) | cuBLAS µs |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["layers"]:
        whole = {json.dumps({**c, "SPLIT_K": 1}, sort_keys=True): t for c, t, _ in r["sweep"] if c["PERSISTENT"] and c["SPLIT_K"] == 1}
        twins = collections.defaultdict(list)
        for c, t, _ in r["sweep"]:
            if c["PERSISTENT"] and c["SPLIT_K"] > 1:
                twins[json.dumps({**c, "SPLIT_K": 1}, sort_keys=True)].append((c["SPLIT_K"], t))
        for key, parts in twins.items():
            t0 = whole[key]
            cells = ", ".join(f"{sk}: {t:.1f} ({t / t0:.3f})" for sk, t in sorted(parts))
            cfg = json.loads(key)
            norm = ", norm pass" if cfg["NORM_PASS"] else ""
            out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['M']} × {r['N']} × {r['K']} | "
                       f"{_config(cfg)}{norm} | {t0:.1f} | {cells} | {r['cublas_us']:.1f} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"tune={doc.get('tune')}, triton {doc.get('triton')}")]) + "\n"


def _rounds(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    """Rows measured in several rounds, grouped by `keys` in first-seen order (their cells show "a / b")."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def tuner_power_section(name: str) -> str:
    """bench/tuner_power.py: each GEMM region's candidates timed by the tuner before item 146 (`spun`: an idle spin
    before every call), by quick and full tuning after it, and replayed from a CUDA graph; two rounds, "a / b"."""
    doc = _load(name)
    rows = _rounds(doc["rows"], "layer", "region", "candidate")
    pair = lambda rs, k: " / ".join(f"{r[k]:.1f}" for r in rs)  # noqa: E731
    ratio = lambda rs, k: " / ".join(f"{r[k] / r['graph_us']:.2f}" for r in rs)  # noqa: E731
    out = ["| layer | region | candidate | before: spun µs | quick µs | full µs | graph replay µs | spun / graph "
           "| quick / graph | full / graph |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (layer, region, cand), rs in rows.items():
        out.append(f"| {layer} | {GEMM_REGION.get(region, region)} | {cand} | {pair(rs, 'spun_us')} | {pair(rs, 'quick_us')} "
                   f"| {pair(rs, 'full_us')} | {pair(rs, 'graph_us')} | {ratio(rs, 'spun_us')} | {ratio(rs, 'quick_us')} "
                   f"| {ratio(rs, 'full_us')} |")  # fmt: skip
    out.append("")
    for key in ("spun", "quick", "full"):
        r = sorted(x[f"{key}_us"] / x["graph_us"] for x in doc["rows"])
        out.append(f"*{key} / graph over all {len(r)} rows:* median {statistics.median(r):.3f}, {r[0]:.3f}–{r[-1]:.3f}.")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M = {doc['tokens']}, triton {doc.get('triton')}")]) + "\n"


def tuner_clocks_section(name: str) -> str:
    """.dbg clocks run (the tuner before item 146): for the long GEMMs, each measure's time with the SM clock and
    power nvidia-smi read over its window; two rounds, "a / b"."""
    doc = _load(name)
    rows = _rounds([r for r in doc["rows"] if r["region"] in ("gemm_2", "gemm_3")], "layer", "region", "candidate")

    def cell(rs: list[dict], k: str) -> str:
        return " / ".join(f"{r[k + '_us']:.0f} @ {r[k + '_smi'].get('sm_mhz') or 0:.0f}" for r in rs)

    out = ["| layer | region | candidate | spun (the tuner before) µs @ MHz | direct µs @ MHz | graph replay µs @ MHz "
           "| gap-sized spin µs @ MHz |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for (layer, region, cand), rs in rows.items():
        out.append(f"| {layer} | {GEMM_REGION.get(region, region)} | {cand} | {cell(rs, 'spun')} | {cell(rs, 'direct')} "
                   f"| {cell(rs, 'graph')} | {cell(rs, 'gap_spin')} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M = {doc['tokens']}")]) + "\n"


def layer_ab_section(name: str) -> str:
    """One process: a layer compiled twice (two tuning caches) beside torch.compile default and max-autotune,
    call time (do_bench median) in five alternating rounds."""
    doc = _load(name)
    out = ["| layer | ours, cache a µs | ours, cache b µs | inductor µs | max-autotune µs | a / b | best torch / a "
           "| best torch / b | rel. err a, b, inductor |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    def rng(r: dict, k: str) -> str:
        return f"{r['median'][k]:.1f} ({min(r['times'][k]):.0f}–{max(r['times'][k]):.0f})"

    for r in doc:
        m, e = r["median"], r["rel_err_vs_eager"]
        best = min(m["inductor"], m["max-autotune"])
        out.append(f"| {r['layer']} | {rng(r, 'old')} | {rng(r, 'new')} | {rng(r, 'inductor')} | {rng(r, 'max-autotune')} "
                   f"| {m['old'] / m['new']:.3f} | {best / m['old']:.3f}x | {best / m['new']:.3f}x "
                   f"| {e['old']:.1e}, {e['new']:.1e}, {e['inductor']:.1e} |")  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line([(name, {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "date": "2026-12-02"},
                                                      "M = 2048, bf16, tuned quick, triton 3.6.0")]) + "\n"  # fmt: skip


def heat_section(name: str) -> str:
    """A long GEMM's candidates timed as quick tuning does, after 200 ms of heat, and replayed from a CUDA graph
    for 200 ms and for 500 ms after 500 ms of warm-up (the card settled at its power limit); two rounds, "a / b"."""
    doc = _load(name)
    rows = _rounds(doc["rows"], "region", "candidate")
    keys = ("quick", "heated", "graph", "long_graph")
    out = ["| region | candidate | quick µs | heated µs | graph µs | long graph µs | quick / long | heated / long "
           "| graph / long |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (region, cand), rs in rows.items():
        times = " | ".join(" / ".join(f"{r[k + '_us']:.1f}" for r in rs) for k in keys)
        ratios = " | ".join(" / ".join(f"{r[k + '_us'] / r['long_graph_us']:.2f}" for r in rs) for k in keys[:3])
        out.append(f"| {GEMM_REGION.get(region, region)} | {cand} | {times} | {ratios} |")
    out.append("")
    for k in keys[:3]:
        r = sorted(x[f"{k}_us"] / x["long_graph_us"] for x in doc["rows"])
        out.append(f"*{k} / long graph over {len(r)} rows:* median {statistics.median(r):.3f}, {r[0]:.3f}–{r[-1]:.3f}.")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"{doc['layer']}, M = {doc['tokens']}")]) + "\n"


def ws_twins_section(*names: str) -> str:
    """bench/gemms.py --tune none --sweep --sweep-ws, one or more runs: each persistent config of the fixed sweep
    against its warp-specialized twin (the Gluon kernel, `codegen/gemm/warp_specialized.py`: the same tiles and
    stages), the twin's deeper rings, and cuBLAS on the same GEMM shape (NOTES 144). Every twin's output is checked
    against the region's tuned config (the largest relative difference is listed)."""
    out = ["| run | layer | region | M × N × K | config (persistent) | Triton µs | WS µs (WS / Triton) | cuBLAS µs |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    worst = 0.0
    for run, name in enumerate(names):
        doc = _load(name)
        entries.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"),
                               "date": _date(doc, name)}, f"run {'abcdef'[run]}"))  # fmt: skip
        for r in doc["layers"]:
            plain = {json.dumps({**c, "WS": 0}, sort_keys=True): t for c, t, _ in r["sweep"] if not c.get("WS")}
            for c, t, e in r["sweep"]:
                if not c.get("WS"):
                    continue
                worst = max(worst, e)
                t0 = plain.get(json.dumps({**c, "WS": 0}, sort_keys=True))
                base = f"{t0:.1f}" if t0 is not None else "(not swept)"
                ratio = f" ({t / t0:.3f})" if t0 is not None else ""
                norm = ", norm pass" if c["NORM_PASS"] else ""
                out.append(f"| {'abcdef'[run]} | {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | "
                           f"{r['M']} × {r['N']} × {r['K']} | {_config(c)}{norm} | {base} | {t:.1f}{ratio} | "
                           f"{r['cublas_us']:.1f} |")  # fmt: skip
    out.append("")
    out.append(f"*Outputs:* every WS config's output against the tuned config's: largest relative difference {worst:.1e}.")
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def gluon_probe_section(name: str) -> str:
    """bench/gluon_gemm_probe.py: the plain warp-specialized Gluon GEMM (no epilogue beyond the cast, stored by TMA)
    of each variant against cuBLAS (`torch.matmul`), both timed by `triton.testing.do_bench` (not CUDA graphs)."""
    doc = _load(name)
    out = ["| shape | M × N × K | BM × BN × BK, stages | Gluon µs | cuBLAS µs | cuBLAS / Gluon | rel. error |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["rows"]:
        for v in r["variants"]:
            bm, bn, bk, st = v["variant"]
            out.append(f"| {r['shape']} | {r['M']} × {r['N']} × {r['K']} | {bm} × {bn} × {bk}, {st} | {v['us']:.1f} | "
                       f"{r['cublas_us']:.1f} | {r['cublas_us'] / v['us']:.3f}x | {v['rel_err']:.1e} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "do_bench medians")]) + "\n"


def loop_forms_ab_section(old: str, new: str) -> str:
    """bench/gemms.py --tune none --sweep on two trees in one run: per region, the fastest swept config of each loop
    form (one tile a program; persistent) before and after, and cuBLAS on the same GEMM shape."""
    a, b = _load(old), _load(new)
    out = ["| layer | region | M × N × K | one tile a program: µs before → after | persistent: µs before → after "
           "(after / before) | cuBLAS µs | cuBLAS / best after |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r, q in zip(a["layers"], b["layers"]):
        assert (r["layer"], r["region"]) == (q["layer"], q["region"])
        (one0, per0), (one1, per1) = [[min(t for c, t, _ in d["sweep"] if c["PERSISTENT"] == p) for p in (0, 1)] for d in (r, q)]
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['M']} × {r['N']} × {r['K']} | "
                   f"{one0:.1f} → {one1:.1f} | {per0:.1f} → {per1:.1f} ({per1 / per0:.3f}) | "
                   f"{q['cublas_us']:.1f} | {q['cublas_us'] / min(one1, per1):.2f}x |")  # fmt: skip
    env = {"gpu": b.get("gpu"), "torch": b.get("torch"), "triton": b.get("triton")}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, "after")]) + "\n"


def ncu_section(*names: str) -> str:
    """Nsight Compute over bench/profile_regions.py (`--clock-control none`, one launch per config): each profiled
    launch's kernels in order, with the config or cuBLAS that launched them, their duration, SM and DRAM
    throughput (% of peak), registers a thread and grid. From the profiler's text report, kept gzipped."""
    import ast
    import gzip

    out = ["| layer | region | launch | kernel | grid × threads | µs | SM % | DRAM % | registers |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for name in names:
        with gzip.open(os.path.join(RESULTS, name), "rt") as f:
            text = f.read()
        layer = re.search(r"s41-ncu-(\w+)\.txt", name).group(1)
        launches = [m.groups() for m in re.finditer(r"^PROFILED (\S+) (kernel (\{.*\})|cuBLAS.*)$", text, re.M)]
        kernels = []  # (name, grid, threads, metrics)
        for block in re.split(r"\n  (?=\S+ \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context)", text)[1:]:
            head = re.match(r"(\S+) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)", block)
            metric = lambda label: re.search(rf"^    {re.escape(label)}\s+\S*\s+([\d.,]+)\s*$", block, re.M)  # noqa: E731
            kernels.append((head.group(1), int(head.group(2)) * int(head.group(3)), int(head.group(5)),
                            {k: float(metric(k).group(1).replace(",", "")) for k in
                             ("Duration", "Compute (SM) Throughput", "DRAM Throughput", "Registers Per Thread")}))  # fmt: skip
        # each launch's kernels, in order: a norm pass first where the config runs one (`row_norm`), then cuBLAS's
        # product for MM, then ours; a cuBLAS launch is one kernel
        i = 0
        for region, _, cfg in launches:
            if cfg:
                c = ast.literal_eval(cfg)  # (the printed dict of a config)
                count = (kernels[i][0] == "row_norm") + (2 if c["MM"] else 1)
                label = _config(c) + (", MM" if c["MM"] else "") + (", persistent" if c["PERSISTENT"] else "")
            else:
                count, label = 1, "cuBLAS (`torch.matmul`)"
            for k, grid, threads, m in kernels[i:i + count]:
                out.append(f"| {layer} | {GEMM_REGION.get(region, region)} | {label} | {k[:40]} | {grid} × {threads} | "
                           f"{m['Duration']:.1f} | {m['Compute (SM) Throughput']:.0f} | {m['DRAM Throughput']:.0f} | "
                           f"{m['Registers Per Thread']:.0f} |")  # fmt: skip
            i += count
        assert i == len(kernels), (name, i, len(kernels))
        entries.append((name, {"gpu": "NVIDIA H200", "run": "torch 2.11.0+cu130, triton 3.6.0, Nsight Compute 2025.3.1"}, layer))
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def attention_ab_section(old: str, new: str) -> str:
    """The same `.dbg` driver's attention cases (tune none, our kernel forced): each case's kernel from a CUDA graph,
    L2 cleared, before and after, and its relative error against fp32 eager on the same inputs."""
    a, b = _load(old), _load(new)
    out = ["| case | queries × keys | µs before | µs after | after / before | rel. err before / after |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for r, q in zip(a["attention"], b["attention"]):
        t0, t1 = r["regions"][0][1], q["regions"][0][1]
        out.append(f"| {r['case']} | {r['sq']} × {r['sk']} | {t0:.1f} | {t1:.1f} | {t1 / t0:.3f} | "
                   f"{r['rel_err']:.1e} / {q['rel_err']:.1e} |")  # fmt: skip
    env = {"gpu": b.get("gpu"), "run": "torch 2.11.0+cu130, triton 3.6.0 (the device image; not recorded in the files)"}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, "after")]) + "\n"


def gemms_ab_section(old: str, new: str) -> str:
    """bench/gemms.py on two trees in one run: each region's tuned kernel (what ran) before and after."""
    return _before_after(old, new, "ran", gemm_ran, 3)


def rotary_pieces_section(name: str) -> str:
    """bench/gemms.py --ablate --sweep --tune none: Llama-3-8B's norm→QKV→RoPE built up one piece at a time, each
    piece's fastest config of the fixed sweep (and its default), against cuBLAS on the same GEMM shape."""
    doc = _load(name)
    out = ["| piece | default config µs | fastest swept config µs | its tile | cuBLAS µs |", "|---|---|---|---|---|"]
    for r in doc["ablate"]:
        c = r["sweep_best_config"]
        out.append(f"| {r['piece']} | {r['kernel_us']:.1f} | {r['sweep_best_us']:.1f} | {c['BLOCK_M']}×{c['BLOCK_N']}, "
                   f"{c['num_stages']} stages{', persistent' if c.get('PERSISTENT') else ''} | {r['cublas_us']:.1f} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M=2048, tune={doc.get('tune')}, triton {doc.get('triton')}")]) + "\n"


def rotary_pairs_section(name: str, pairs: str = "pairs (rows gathered)") -> str:
    """bench/rotary_pairs.py: the QKV+RoPE kernel as generated (halves) against its edit rotating adjacent pairs
    with W's rows in pair order (gathered by pointer; `--tma-only`: through a 4-D TMA descriptor), per config."""
    doc = _load(name)
    out = [f"| tile | stages | persistent | TMA | halves µs | {pairs} µs | pairs / halves | pairs rel. diff |",
           "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        c, pairs = r["config"], r.get("pairs_us")
        out.append(f"| {c['BLOCK_M']}×{c['BLOCK_N']} | {c['num_stages']} | {c['PERSISTENT']} | {c['TMA']} | "
                   f"{r['halves_us']:.1f} | {_num(pairs, '.1f')} | {_ratio(pairs, r['halves_us'])} | "
                   f"{_num(r.get('pairs_rel_diff'), '.1e')} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M={doc.get('M')}")]) + "\n"


def rotary_split_section(old: str, new: str) -> str:
    """bench/gemms.py --sweep --with-op dl.rotary on two trees in one run: the QKV+RoPE region's fastest swept
    config before and after a change of the rotary epilogue."""
    a, b = _load(old), _load(new)
    out = ["| layer | M | fastest before µs | fastest after µs | after / before |", "|---|---|---|---|---|"]
    for r, q in zip(a["layers"], b["layers"]):
        out.append(f"| {r['layer']} | {r['M']} | {r['sweep_best_us']:.1f} | {q['sweep_best_us']:.1f} | "
                   f"{q['sweep_best_us'] / r['sweep_best_us']:.2f} |")
    env = {"gpu": b.get("gpu"), "torch": b.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, "after (x split alone)")]) + "\n"


def interleaved_glu_section(*names: str) -> str:
    """bench/interleaved_glu.py: the gate/up GEMM with its GLU as standalone TMA kernels alike but for the K loop
    (two accumulators; one over an interleaved copy of the weight; one over the weight as it is through a 3-D
    descriptor), each kind's fastest config, beside the plain product of the same width and cuBLAS."""
    out = ["| run | layer | M | I | K | cuBLAS µs | plain µs | dual µs | interleaved µs | strided µs | "
           "interleaved / dual | strided / dual |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for run, name in zip("abcdefgh", names):
        doc = _load(name)
        for r in doc["rows"]:
            b = r["best"]
            out.append(f"| {run} | {r['layer']} | {r['M']} | {r['I']} | {r['K']} | {r['cublas_us']:.1f} | "
                       f"{_num(b.get('plain'), '.1f')} | {_num(b.get('dual'), '.1f')} | {_num(b.get('interleaved'), '.1f')} | "
                       f"{_num(b.get('strided'), '.1f')} | {_ratio(b.get('interleaved'), b.get('dual'))} | "
                       f"{_ratio(b.get('strided'), b.get('dual'))} |")  # fmt: skip
        entries.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch")}, f"run {run}, triton {doc.get('triton')}"))
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def layer_section(name: str, block: str) -> str:
    """One results file's table for one block (bench/run.py), without the block's heading."""
    return block_markdown(load_runs([name], block), heading=False)


def attention_dims_section(*runs: tuple[str, str]) -> str:
    """bench/attention_dims.py: our attention kernel (quick-tuned, launched alone) against torch's SDPA as the
    compiled region's reference runs it (torch's pick) and each SDPA backend forced, per (run label, file)."""
    out = ["| run | tree | model | queries | keys | heads q/kv | head dims q·k / v | ours µs | ours config | SDPA µs "
           "| cuDNN µs | flash µs | efficient µs | ours time / SDPA time | ours rel. err |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for label, name in runs:
        doc = _load(name)
        for r in doc["rows"]:
            if "error" in r:
                out.append(f"| {label} | {doc['tag']} | {r['case']} | | | | | failed: {r['error'][:60]} | | | | | | | |")
                continue
            cfg = r.get("config")
            cfg = (f"{cfg['BLOCK_M']}×{cfg['BLOCK_N']}, {cfg['num_warps']}w, {cfg['num_stages']}s" if cfg and "BLOCK_M" in cfg
                   else f"{cfg['SPLITS']} splits × {cfg['BLOCK_N']}, {cfg['num_warps']}w, {cfg['num_stages']}s" if cfg
                   else "not taken (SDPA)")  # fmt: skip

            def sdpa(key: str, r=r) -> str:
                return _num(r.get(f"{key}_us"), ".1f") if f"{key}_us" in r else "refused"

            out.append(f"| {label} | {doc['tag']} | {r['model']} | {r['S']} | {r['L']} | {r['HQ']}/{r['HK']} | "
                       f"{r['D']} / {r['DV']} | {_num(r.get('ours_us'), '.1f')} | {cfg} | {r['sdpa_us']:.1f} | "
                       f"{sdpa('cudnn')} | {sdpa('flash')} | {sdpa('efficient')} | {_ratio(r.get('ours_us'), r['sdpa_us'])} | "
                       f"{_num(r.get('ours_err'), '.1e')} |")  # fmt: skip
        entries.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"),
                               "date": doc.get("date")}, f"run {label}, {doc['tag']}"))  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def mask_tiles_section(*runs: tuple[str, str]) -> str:
    """bench/mask_tiles.py: masked prefill attention, best of every config of the kernel's space, per (tree label,
    file): overall, and per value of the tree's choice of how dropped tiles are skipped (MASK_RANGE, MASK_BLOCKS),
    beside our causal kernel on the same work without a mask tensor and torch's SDPA with the mask and `is_causal`."""
    out = ["| tree | mask | ours, best µs | its config | the choice at 0, best µs | at 1, best µs "
           "| configs wrong / failed | our causal kernel µs | SDPA with the mask µs | SDPA is_causal µs |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for label, name in runs:
        doc = _load(name)
        for c in doc["cases"]:
            knob = next((k for k in ("mask_blocks", "mask_range") if f"best_{k}_0" in c), None)
            at = [c.get(f"best_{knob}_{v}") if knob else None for v in (0, 1)]
            best = c.get("best_masked") or min((b for b in at if b), key=lambda b: b["us"])
            cfg = best["config"]
            text = f"{cfg['BLOCK_M']}×{cfg['BLOCK_N']}, {cfg['num_warps']}w, {cfg['num_stages']}s" + (
                f", {knob.upper()} {cfg[knob.upper()]}" if knob else "")
            causal = c.get("best_causal")
            out.append(f"| {label} | {c['case']} | {best['us']:.1f} | {text} | "
                       + " | ".join(f"{b['us']:.1f}" if b else "–" for b in at)
                       + f" | {len(c['wrong'])} / {len(c['failed'])} | {_num(causal and causal['us'], '.1f')} | "
                       f"{c['sdpa_masked_us']:.1f} | {_num(c.get('sdpa_causal_us'), '.1f')} |")  # fmt: skip
        entries.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"),
                               "date": doc.get("date")}, label))  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def mask_kernels_section(*runs: tuple[str, str]) -> str:
    """bench/mask_tiles.py with the host's launch path hidden (seventy-sixth session on): per (run label, file) and
    mask, the best config's GPU time, the same config timed by `do_bench` (the host's launch path included), and its
    three kernels' mean GPU time by the profiler (no L2 clear), beside our causal kernel and torch's SDPA."""
    out = ["| run | mask | ours, best µs (GPU) | its config | same, do_bench µs (host included) | classify µs | lists µs "
           "| attention µs | our causal kernel µs (GPU) | its profiled µs | SDPA with the mask µs | SDPA is_causal µs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for label, name in runs:
        doc = _load(name)
        for c in doc["cases"]:
            best, cfg = c["best_masked"], c["best_masked"]["config"]
            k = c.get("best_masked_kernels") or {}
            part = {p: next((v for n, v in k.items() if n.endswith(p)), None) for p in ("_blocks", "_lists")}
            main = next((v for n, v in k.items() if not n.endswith(("_blocks", "_lists"))), None)
            hidden = "best_masked_do_bench_us" in c  # (a run before: every time is do_bench's, the host included)
            causal = c.get("best_causal") if hidden else None
            ck = c.get("best_causal_kernels") or {}
            out.append(f"| {label} | {c['case']} | {_num(best['us'] if hidden else None, '.1f')} | {cfg['BLOCK_M']}×"
                       f"{cfg['BLOCK_N']}, {cfg['num_warps']}w, {cfg['num_stages']}s | "
                       f"{_num(c['best_masked_do_bench_us'] if hidden else best['us'], '.1f')} | "
                       f"{_num(part['_blocks'], '.1f')} | {_num(part['_lists'], '.1f')} | {_num(main, '.1f')} | "
                       f"{_num(causal and causal['us'], '.1f')} | {_num(sum(ck.values()) if ck else None, '.1f')} | "
                       f"{c['sdpa_masked_us']:.1f} | {_num(c.get('sdpa_causal_us'), '.1f')} |")  # fmt: skip
        entries.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"),
                               "date": doc.get("date")}, label))  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def attention_sweep_section(name: str) -> str:
    """bench/attention_dims.py --sweep: the prefill kernel at 16 configs, inside its search space then or not."""
    doc = _load(name)
    sweeps = doc["sweeps"]
    out = ["| config | " + " | ".join(f"{s['case'].split(':')[0]} µs" for s in sweeps) + " |",
           "|---|" + "---|" * len(sweeps)]  # fmt: skip
    for i, row in enumerate(sweeps[0]["configs"]):
        c = row["config"]
        cells = []
        for s in sweeps:
            x = s["configs"][i]
            mark = "" if x["in_space"] else " *"
            cells.append(f"{x['us']:.1f}{mark}" if "us" in x else "out of shared memory" + mark)
        out.append(f"| {c['BLOCK_M']}×{c['BLOCK_N']}, {c['num_warps']} warps, {c['num_stages']} stages | "
                   + " | ".join(cells) + " |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "date": doc.get("date")}
    return ("\n".join(out) + "\n\n* outside the search space of the tree measured (cfc7cf8)\n\n"
            + source_line([(name, env, "S = L = 2048, causal, bf16")]) + "\n")


def dual_sweep_section(old: str, new: str) -> str:
    """bench/gemms.py --tune none --sweep --with-op dl.glu on two trees in one run: each gate/up region's default
    config and the fixed sweep's configs it accepts, before and after a change of the dual GEMM's K loop."""
    a, b = _load(old), _load(new)
    out = ["| layer | M × N × K | default before µs | default after µs | after / before | fastest swept before µs | "
           "fastest swept after µs | after / before | swept configs faster after | cuBLAS µs | cuBLAS / fastest after |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r, q in zip(a["layers"], b["layers"]):
        faster = sum(y[1] < x[1] for x, y in zip(r["sweep"], q["sweep"]))
        out.append(f"| {r['layer']} | {r['M']} × {r['N']} × {r['K']} | {r['kernel_us']:.1f} | {q['kernel_us']:.1f} | "
                   f"{q['kernel_us'] / r['kernel_us']:.3f} | {r['sweep_best_us']:.1f} | {q['sweep_best_us']:.1f} | "
                   f"{q['sweep_best_us'] / r['sweep_best_us']:.3f} | {faster} of {len(q['sweep'])} | {q['cublas_us']:.1f} | "
                   f"{q['cublas_us'] / q['sweep_best_us']:.2f}x |")  # fmt: skip
    env = {"gpu": b.get("gpu"), "torch": b.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(old, env, "before"), (new, env, f"after, tune={b.get('tune')}, triton {b.get('triton')}")]) + "\n"


def tile_sweep_section(name: str) -> str:
    """bench/gemms.py --tune none --sweep --sweep-tiles ...: each region's default config and the fastest swept
    config of each tile shape, against cuBLAS on the same GEMM shape."""
    doc = _load(name)
    tiles = sorted({f"{c['BLOCK_M']}×{c['BLOCK_N']}" for r in doc["layers"] for c, _, _ in r.get("sweep", [])},
                   key=lambda t: tuple(-int(x) for x in t.split("×")))  # fmt: skip
    out = ["| layer | region | M × N × K | default µs | " + " | ".join(f"fastest {t} µs" for t in tiles) + " | cuBLAS µs |",
           "|---|---|---|---|" + "---|" * len(tiles) + "---|"]
    for r in doc["layers"]:
        best = {t: min((us for c, us, _ in r.get("sweep", []) if f"{c['BLOCK_M']}×{c['BLOCK_N']}" == t and
                        isinstance(us, float)), default=None) for t in tiles}  # fmt: skip
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['M']} × {r['N']} × {r['K']} | "
                   f"{r['kernel_us']:.1f} | " + " | ".join(_num(best[t], ".1f") for t in tiles) + f" | {r['cublas_us']:.1f} |")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"tune={doc.get('tune')}, triton {doc.get('triton')}")]) + "\n"


def split_sweep_section(name: str, copy_bytes_per_s: float) -> str:
    """bench/gemms.py --tokens 128 --sweep --sweep-outside (split-K configs, one program per tile part): per region
    the weight-streaming floor (its bytes once at the copy bandwidth measured in the same session), cuBLAS's bare
    product, the tuned choice, and the fastest swept K loop at each SPLIT_K (bench/NOTES.md 175)."""
    doc = _load(name)
    splits = sorted({c["SPLIT_K"] for r in doc["layers"] for c, _, _ in r.get("sweep", [])})
    head = " | ".join(f"fastest split {k} µs" for k in splits)
    out = [f"| layer | region | M × N × K | floor µs | cuBLAS µs | tuned µs (what) | {head} | fastest µs / cuBLAS µs |",
           "|" + "---|" * (7 + len(splits))]
    for r in doc["layers"]:
        best = {k: min((us for c, us, _ in r["sweep"] if c["SPLIT_K"] == k and isinstance(us, float)), default=None)
                for k in splits}  # fmt: skip
        floor = r["N"] * r["K"] * 2 / copy_bytes_per_s * 1e6  # (bf16 weight)
        what = _config_words(r["config"]) + ("; cuBLAS ran" if r["impl"] == "reference" else "")
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['M']} × {r['N']} × {r['K']} "
                   f"| {floor:.1f} | {r['cublas_us']:.1f} | {r['kernel_us']:.1f} ({what}) | "
                   + " | ".join(_num(best[k], ".1f") for k in splits)
                   + f" | {min(v for v in best.values() if v) / r['cublas_us']:.2f} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    src = f"tune={doc.get('tune')}, triton {doc.get('triton')}; floor at {copy_bytes_per_s / 1e12:.2f} TB/s"
    return "\n".join(out) + "\n\n" + source_line([(name, env, src)]) + "\n"


def split_tail_section(stages: str, variants: str, ncu: str) -> str:
    """bench/split_tail.py at 128 tokens: what each stage of the split-K tail costs (timings of variants that leave a
    stage out: the last three give wrong sums), the tail's rewrites (bit-equal to the tree), and Nsight Compute's view
    of the 4-way split, its stages left out, and cuBLAS's kernels on the same operands (bench/NOTES.md 176). µs after
    a clean L2 clear (a read), dirty (do_bench's zero-fill) in parentheses."""
    a, b, n = _load(stages), _load(variants), _load(ncu)

    def cell(rows: list[dict], **key) -> str:
        r = next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)
        return "–" if r is None else f"{r['us']['clean']:.1f} ({r['us']['dirty']:.1f})"

    names = ["full", "relaxed", "unroll", "noreads", "nosync", "nostore"]
    out = ["Each stage left out (128×128 tiles, 8 warps, 4 stages, TMA; * wrong sums, timing only):", "",
           "| layer | region | split | " + " | ".join(v + ("*" if v in names[3:] else "") for v in names)
           + " | cuBLAS |", "|" + "---|" * (4 + len(names))]  # fmt: skip
    keys = sorted({(r["layer"], r["region"]) for r in a["rows"]}, key=lambda k: (k[0], k[1] != "o-proj"))
    for layer, region in keys:
        rows = [r for r in a["rows"] if (r["layer"], r["region"]) == (layer, region)]
        for k in (1, 2, 4, 8):
            cells = [cell(rows, variant=v, split=k) for v in names]
            out.append(f"| {layer} | {region} | {k} | " + " | ".join(cells) + f" | {cell(rows, variant='cublas')} |")
    forms = ["full", "pipe2", "pipe3", "own_pipe2"]
    out += ["", "The partials' reads rewritten (the same sums in the same order):", "",
            "| layer | region | tile, split | " + " | ".join(forms) + " | bits equal to full |",
            "|" + "---|" * (4 + len(forms))]
    for layer, region in keys:
        rows = [r for r in b["rows"] if (r["layer"], r["region"]) == (layer, region) and r.get("config")]
        seen = []
        for r in rows:
            c = r["config"]
            tile = (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["SPLIT_K"])
            if r["variant"] != "pipe2" or tile in seen:
                continue
            seen.append(tile)
            same = [x for x in rows if x["variant"] in forms[1:] and x["config"] == c]
            cells = [cell([x for x in rows if x["config"] == c], variant=v) for v in forms]
            equal = "yes" if same and all(x.get("same_bits_as_full") for x in same) else "–"
            out.append(f"| {layer} | {region} | {tile[0]}×{tile[1]} w{tile[2]}, {tile[3]} | " + " | ".join(cells)
                       + f" | {equal} |")  # fmt: skip
    out += ["", f"Nsight Compute ({n['tool']}; {n['script']}):", "",
            "| launch | kernel | duration | DRAM throughput | grid | warp-stall samples after the last HGMMA |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for k in n["kernels"]:
        tail = k.get("samples_after_last_hgmma")
        after = f"{tail} of {k['stall_samples']} ({tail / k['stall_samples']:.0%})" if tail is not None else "–"
        out.append(f"| {k['launch']} | `{k['kernel'][:44]}` | {k['duration_us']} | {k['dram_pct']} | {k['grid']} "
                   f"| {after} |")
    env = {"gpu": a.get("gpu"), "torch": a.get("torch")}
    files = [(stages, env, f"triton {a.get('triton')}"), (variants, env, "the rewrites, 64-row tiles"),
             (ncu, env, "ncu")]
    return "\n".join(out) + "\n\n" + source_line(files) + "\n"


def stages_m128_section(name: str) -> str:
    """bench/gemms.py --tokens 128 --sweep --sweep-outside: K-loop configs in 64- and 128-row tiles with 4-10 stages
    (outside the space's num_stages <= 5) against quick tuning's choice (cuBLAS's product with the kernel as its
    epilogue, MM) timed in the same sweep, and cuBLAS's bare product (bench/NOTES.md 177)."""
    doc = _load(name)
    out = ["| layer | region | cuBLAS µs | tuned µs (what) | fastest swept K loop µs (config) | / tuned | second |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["layers"]:
        tuned = r["kernel_us_in_sweep"][0]
        best = sorted((x for x in r["sweep"] if isinstance(x[1], float) and x[2] < 1e-2), key=lambda x: x[1])
        words = [f"{c['BLOCK_M']}×{c['BLOCK_N']}×{c['BLOCK_K']}, {c['num_stages']} stages, split {c['SPLIT_K']}"
                 for c, _, _ in best[:2]]  # fmt: skip
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['cublas_us']:.1f} | {tuned:.1f} "
                   f"({_config_words(r['config'])}) | {best[0][1]:.1f} ({words[0]}) | {best[0][1] / tuned:.3f} | "
                   f"{best[1][1] / tuned:.3f} ({words[1]}) |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch")}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M=128, tune={doc.get('tune')}, triton "
                                                              f"{doc.get('triton')}; configs whose output differs "
                                                              "by more than 1e-2 (tiles of part of a rotary head) "
                                                              "left out")]) + "\n"  # fmt: skip


def flashnorm_section(before: str, after: str, rms: str, before_kernels: str) -> str:
    """bench/flashnorm.py at 2048 tokens (the norm's gain folded into W, its statistics applied in the epilogue,
    against the row pass), before and after the statistics pass read whole rows, and bench/row_rms.py's geometries
    of that pass (bench/NOTES.md 178). `before_kernels`: the first run's pass kernels, profiled in a later call."""
    early = {(k["layer"], k["region"], k["config"]["NORM_PASS"]): k["kernels"] for k in _load(before_kernels)}
    out = ["| tree | layer | region | row pass µs (its pass kernel) | statistics µs (its pass kernel) "
           "| layer call time, FlashNorm / row pass | folded weights (a second copy) |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for tag, name in (("before", before), ("after", after)):
        doc = _load(name)
        entries.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch")}, f"{tag}: tune={doc.get('tune')}"))
        for lay in doc["layers"]:
            m = lay["modes"]
            call = m["row pass"]["call_us_paired"] / m["flashnorm"]["call_us_paired"]
            for f in m["flashnorm"]["norm_pass_flipped"]:
                npass = f["config"]["NORM_PASS"]
                k = f.get("kernels") or {
                    n: {key: v[1] for key, v in early.get((lay["layer"], f["region"], p), {}).items()}
                    for n, p in (("tuned", npass), ("flipped", 1 - npass))}  # fmt: skip
                passes = {n: next((v for key, v in ks.items() if key.startswith("row_")), None) for n, ks in k.items()}
                order = ("tuned", "flipped") if npass else ("flipped", "tuned")  # (the row pass's first)
                row, stat = (f[f"{n}_us"] for n in order)
                prow, pstat = (passes.get(n) for n in order)
                folded = [x for x in m["flashnorm"]["regions"] if "dl.rms_norm" in x["ops"]]
                mem = sum(x["N"] * x["K"] * 2 for x in folded) / 1e6  # (bf16: the linears the norms feed)
                out.append(f"| {tag} | {lay['layer']} | {GEMM_REGION.get(f['region'], f['region'])} | {row:.1f} "
                           f"({_num(prow, '.1f')}) | {stat:.1f} ({_num(pstat, '.1f')}) | {1 / call:.3f} | "
                           f"{mem:.0f} MB |")  # fmt: skip
    r = _load(rms)
    out += ["", "The statistics pass alone (rs within 1.3e-7 relative of torch's in fp32, every form and shape):", "",
            "| M × K | steps of 4 rows × 1024 columns, 4 warps µs | whole rows, 8 warps µs | whole rows, 4 warps µs "
            "| row pass (reads and writes) µs |", "|---|---|---|---|---|"]  # fmt: skip
    for x in r["rows"]:
        out.append(f"| {x['M']} × {x['K']} | {x['steps']:.1f} | {x['whole_w8']:.1f} | {x['whole_w4']:.1f} "
                   f"| {x['row_norm']:.1f} |")
    entries.append((rms, {"gpu": r.get("gpu"), "torch": r.get("torch")}, "CUDA-graph replays, L2 cleared (dirty)"))
    entries.append((before_kernels, {"gpu": r.get("gpu"), "torch": r.get("torch")}, "before: the pass kernels"))
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def cublas_addmm_section(name: str) -> str:
    """bench/cublas_epilogue.py: cuBLAS's product of o-proj and down against torch.addmm with the residual as C,
    written into a new tensor (torch copies the residual there first) or into the residual itself (out=residual), and
    against the product followed by an add; per token count, each time over the bare product's (bench/NOTES.md 179)."""
    doc = _load(name)
    out = ["| M | region | addmm into a new tensor / mm | mm + add / mm | addmm in place / mm | layers |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    groups: dict[tuple, list[dict]] = {}
    for r in doc["rows"]:
        groups.setdefault((r["M"], r["region"].split("+")[0]), []).append(r)

    def span(rows: list[dict], key: str) -> str:
        v = [r[key] / r["mm_us"] for r in rows]
        return f"{min(v):.3f}–{max(v):.3f}"

    for (m, region), rows in sorted(groups.items()):
        out.append(f"| {m} | {region} | {span(rows, 'addmm_us')} | {span(rows, 'mm_then_add_us')} | "
                   f"{span(rows, 'addmm_inplace_us')} | {len(rows)} |")  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line([(name, {"gpu": doc.get("gpu"), "torch": doc.get("torch")},
                                                  "CUDA-graph replays, L2 cleared, five layers' shapes")]) + "\n"


def residual_inplace_section(*names: str) -> str:
    """bench/residual_inplace.py: a stack of decoder layers compiled with MM=2 offered and without it, their calls
    timed in turn (CUDA-graph replays), the kernels' sum from a profile, and which regions ran MM=2."""
    out = ["| run | layer × depth | M | call µs, MM=2 offered | call µs, without | speedup | eager call µs | kernel sum "
           "µs (offered / without) | regions on MM=2 | graphs kept (offered / without) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = []
    for tag, name in names:
        rows = _load(name)
        for r in rows:
            c, k = r["call_us"], r.get("kernels") or {}
            sums = " / ".join(f"{k[x]['kernel_sum']:.1f}" for x in ("in place", "without")) if k else "–"
            ran = sum((x["config"] or {}).get("MM") == 2 for x in r["choices"]["in place"])
            kept = " / ".join(str(r["graphs"][x]["cuda_graphs"]) for x in ("in place", "without"))
            out.append(f"| {tag} | {r['layer']} × {r['depth']} | {r['M']} | "
                       f"{c['in place']:.1f} | {c['without']:.1f} | {c['without'] / c['in place']:.3f}x | {c['eager']:.0f} | {sums} | "
                       f"{ran} | {kept} |")  # fmt: skip
        entries.append((name, {"gpu": rows[0].get("gpu"), "torch": rows[0].get("torch")}, f"run {tag}"))
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def decode_gemms_section(name: str, ceilings: str) -> str:
    """bench/gemms.py --tokens 1: each GEMM region at one row (decode) against cuBLAS on the same shape, as
    bandwidth on the weight (its bytes read once) against the copy bandwidth measured in the same run."""
    doc, ceil = _load(name), _load(ceilings)
    copy = ceil["copy_bytes_per_s"]
    out = ["| layer | region | N × K | weight MB | kernel µs | kernel TB/s | of copy BW | cuBLAS µs | cuBLAS TB/s | "
           "cuBLAS / kernel |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["layers"]:
        mb = r["N"] * r["K"] * 2 / 1e6  # bf16 (N: the weight's rows, both halves of gate/up)
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['N']} × {r['K']} | {mb:.1f} | "
                   f"{r['kernel_us']:.1f} | {mb / r['kernel_us']:.2f} | {mb / r['kernel_us'] * 1e12 / copy:.0%} | "
                   f"{r['cublas_us']:.1f} | {mb / r['cublas_us']:.2f} | {r['ratio']:.2f}x |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "ceilings": ceil}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M=1, tune={doc.get('tune')}, triton {doc.get('triton')}")]) + "\n"



def gemv_ahead_section(name: str, ceilings: str) -> str:
    """bench/gemv_study.py --ahead (in 6f29384..308bc7c, reverted with the variant): each one-row tile of a decode
    GEMM region timed with its plain K loop (2 stages) and with the next weight tile loaded ahead (3 stages), chained
    in a CUDA graph over distinct weight copies: the best of each and the ratio of each pair."""
    doc, ceil = _load(name), _load(ceilings)
    copy = ceil["copy_bytes_per_s"]
    out = ["| layer | region | weight MB | plain best µs | of copy BW | ahead best µs | of copy BW | pairs | "
           "ahead / plain: median (range) |", "|" + "---|" * 9]  # fmt: skip
    for r in doc["regions"]:
        pairs: dict[str, dict[bool, float]] = {}
        for row in r["rows"]:
            c = row["config"]
            pairs.setdefault(json.dumps({**c, "num_stages": 0}, sort_keys=True), {})[c["num_stages"] > 2] = row["us"]
        ratios = sorted(p[True] / p[False] for p in pairs.values() if len(p) == 2)
        plain = min(x["us"] for x in r["rows"] if x["config"]["num_stages"] == 2)
        ahead = min(x["us"] for x in r["rows"] if x["config"]["num_stages"] > 2)
        mb = r["weight_MB"]
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {mb:.0f} | {plain:.1f} | "
                   f"{mb / plain * 1e12 / copy:.0%} | {ahead:.1f} | {mb / ahead * 1e12 / copy:.0%} | {len(ratios)} | "
                   f"{ratios[len(ratios) // 2]:.3f} ({ratios[0]:.3f}–{ratios[-1]:.3f}) |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "ceilings": ceil}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "bf16, M = 1, layers compiled with quick tuning")]) + "\n"


def gemv_study_section(name: str, ceilings: str) -> str:
    """bench/gemv_study.py: each GEMM region at one row (decode), tuned config, the best of the study's configs
    and cuBLAS on the same operands, all chained in a CUDA graph over distinct weight copies (as the decode graph
    runs them), as bandwidth on the weight against the copy bandwidth measured in the same call; and the chained
    time of the config the tuner's own measure ranks first among the study's."""
    doc, ceil = _load(name), _load(ceilings)
    copy = ceil["copy_bytes_per_s"]
    out = ["| layer | region | N × K | weight MB | tuned µs | of copy BW | best of study µs | its variant | "
           "cuBLAS µs | cuBLAS of copy BW | cuBLAS / tuned | tuner measure's first choice µs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    totals = [0.0, 0.0, 0.0]
    for r in doc["regions"]:
        rows = r["rows"]
        tuned, best = rows[0], min(rows, key=lambda x: x["us"])
        pick = min(rows, key=lambda x: x["tuner_us"])
        mb = r["weight_MB"]
        totals = [totals[0] + tuned["us"], totals[1] + best["us"], totals[2] + r["cublas_us"]]
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['N']} × {r['K']} | {mb:.0f} | "
                   f"{tuned['us']:.1f} | {mb / tuned['us'] * 1e12 / copy:.0%} | {best['us']:.1f} | {best['family']} | "
                   f"{r['cublas_us']:.1f} | {mb / r['cublas_us'] * 1e12 / copy:.0%} | {r['cublas_us'] / tuned['us']:.2f}x | "
                   f"{pick['us']:.1f} |")  # fmt: skip
    out.append(f"| all | sum | | | {totals[0]:.1f} | | {totals[1]:.1f} | | {totals[2]:.1f} | | "
               f"{totals[2] / totals[0]:.2f}x | |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "ceilings": ceil}
    n = sum(len(r["rows"]) for r in doc["regions"])
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M=1, fresh quick tuning, {n} configs timed")]) + "\n"


def _short_config(c: dict) -> str:
    """A GEMM config in a few characters: tile, stages, and how the product is made (MM: cuBLAS + the epilogue
    kernel; TMA or pointer K loop; p: persistent)."""
    how = "MM" if c.get("MM") else ("TMA" if c.get("TMA") else "ptr")
    return f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} s{c['num_stages']} {how}{' p' if c.get('PERSISTENT') else ''}"


def tuner_ab_section(name: str) -> str:
    """bench/tuner_ab.py: a layer tuned (quick, from an empty cache) several times by each variant of the tuner, all
    compilations replayed in one process in alternating rounds (call time). Where the run timed the regions, each
    GEMM region's tuned kernel against cuBLAS on its shape (graph replays, right after its tuning)."""
    doc = _load(name)
    timed = all(r.get("regions") for lay in doc["layers"] for r in lay["runs"])
    head = "| layer | variant | tuning | layer µs (range) | confirmation rounds: chose other than the search |"
    if timed:
        head += " QKV | o-proj | gate/up | down | GEMMs µs, ours / cuBLAS | cuBLAS / ours, sum |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    sums: dict[str, list[float]] = {}
    per_region: dict[tuple[str, str], list[float]] = {}
    for lay in doc["layers"]:
        for r in sorted(lay["runs"], key=lambda r: (r["variant"], r["rep"])):
            finals = r.get("finalists", {})
            changed = sum(f[0][1] != min(x[1] for x in f) for f in finals.values())
            row = (f"| {lay['layer']} | {r['variant']} | {r['rep']} | {r['median_us']:.1f} ({min(r['call_us']):.0f}–"
                   f"{max(r['call_us']):.0f}) | {f'{changed} of {len(finals)}' if finals else '–'} |")  # fmt: skip
            if timed:
                by = {x["region"]: x for x in r["regions"]}
                for g in ("gemm_0", "gemm_1", "gemm_2", "gemm_3"):
                    x = by[g]
                    row += f" {x['ratio']:.2f}{'†' if x['impl'] != 'kernel' else ''} |"
                    per_region.setdefault((r["variant"], g), []).append(x["ratio"])
                ours, cub = sum(x["kernel_us"] for x in r["regions"]), sum(x["cublas_us"] for x in r["regions"])
                sums.setdefault(r["variant"], []).append(cub / ours)
                row += f" {ours:.0f} / {cub:.0f} | {cub / ours:.3f} |"
            out.append(row)
    out.append("")
    for lay in doc["layers"]:
        meds = lay["median_us"]
        first = next(iter(meds))
        line = f"*{lay['layer']}, median of each variant's tunings:* " + ", ".join(
            f"{v} {t:.1f} µs ({t / meds[first]:.3f})" for v, t in meds.items())  # fmt: skip
        if timed:
            gemms = {v: statistics.mean(sum(x["kernel_us"] for x in r["regions"]) for r in lay["runs"] if r["variant"] == v)
                     for v in meds}  # fmt: skip
            line += "; the four GEMM kernels' sum, mean of the tunings: " + ", ".join(
                f"{v} {t:.1f} µs ({t / gemms[first]:.3f})" for v, t in gemms.items())  # fmt: skip
        out.append(line + ".")
    if timed:
        out.append("")
        for v, ratios in sums.items():
            regions = ", ".join(f"{GEMM_REGION[g].split('+')[1] if g in ('gemm_0', 'gemm_2') else GEMM_REGION[g].split('+')[0]} "
                                f"{statistics.mean(x):.3f} ({min(x):.2f}–{max(x):.2f}; {sum(t >= 0.97 for t in x)} ≥ 0.97)"
                                for (vv, g), x in per_region.items() if vv == v)  # fmt: skip
            out.append(f"*{v}, cuBLAS / ours over {len(ratios)} tunings:* the four GEMMs' sum {statistics.mean(ratios):.3f} "
                       f"({min(ratios):.3f}–{max(ratios):.3f}); per region, mean (range; at or above 0.97x): {regions}.")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M = {doc['tokens']}, bf16, quick tuning")]) + "\n"


def in_layer_section(name: str) -> str:
    """bench/in_layer.py: each GEMM region's candidate configs timed as the search times them (iso), as the
    confirmation round does (held), as a graph replay (graph), and by the whole layer's call time with the candidate
    in the region (three rounds in turn: the median and range)."""
    doc = _load(name)
    out = ["| layer | region | candidate | iso µs | held µs | graph µs | layer µs (range) |", "|" + "---|" * 7]
    for lay in doc["layers"]:
        for reg in lay["regions"]:
            for r in reg["rows"]:
                cand = "reference (cuBLAS, torch ops)" if r["config"] == "reference" else _short_config(json.loads(r["config"]))
                if r["config"] == reg["tuned"]:
                    cand += " (tuned)"
                out.append(f"| {lay['layer']} | {GEMM_REGION.get(reg['region'], reg['region'])} | {cand} | {r['iso_us']:.1f} "
                           f"| {r['held_us']:.1f} | {r['graph_us']:.1f} | {r['layer_us']:.0f} ({min(r['layer_all_us']):.0f}–"
                           f"{max(r['layer_all_us']):.0f}) |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M = {doc['tokens']}, bf16")]) + "\n"


def search_heat_section(*names: str) -> str:
    """bench/search_heat.py: per quick tuning of a layer (each with the warm-up it ran: 25 ms, or blocks until the
    clock stopped falling, SETTLE_MAX_MS / SETTLE_BLOCK_MS, NOTES 148), per search whose fastest candidates were
    held (≥ 300 µs): each candidate's search time over its held time (below 1: the search read it fast), and those
    timed after ≥ 0.2 s with the GPU idle."""
    out = ["| run | layer | warm-up before each timing | first call s | search time a long candidate, ms | GEMM M × N × K "
           "(streams) | held | search / held: median (min) | after ≥ 0.2 s idle: median (n) |", "|" + "---|" * 9]
    envs = []
    for run, name in zip("abcdefgh", names):
        doc = _load(name)
        blocks = {400.0: "blocks of 20 ms, ≤ 400 ms", 300.0: "blocks of 10 ms, ≤ 300 ms", 0.0: "25 ms"}
        for lay in doc["layers"]:
            long = [r for r in lay["rows"] if 100 <= r["search_us"] < 1e9]
            per = statistics.mean(r["t1"] - r["t0"] for r in long) * 1e3
            jobs: dict[str, list[dict]] = {}
            for r in lay["rows"]:
                if "held_us" in r and r["held_us"] >= 300:
                    jobs.setdefault(r["job"], []).append(r)
            for job, rows in jobs.items():
                shape = ast.literal_eval(job[job.index("{"):])
                ratios = [r["search_over_held"] for r in rows]
                idle = [r["search_over_held"] for r in rows if r["gap_s"] >= 0.2]
                out.append(f"| {run} | {lay['layer']} | {blocks[lay.get('settle_max_ms', 0.0)]} | {lay['first_call_s']:.1f} "
                           f"| {per:.0f} | {shape['M']} × {shape['N']} × {shape['K']} ({shape['streams']}) | {len(rows)} "
                           f"| {statistics.median(ratios):.3f} ({min(ratios):.3f}) | "
                           + (f"{statistics.median(idle):.3f} ({len(idle)})" if idle else "–") + " |")  # fmt: skip
        envs.append((name, {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"),
                            "date": _date(doc, name)}, f"run {run}, M = {doc['tokens']}, bf16"))  # fmt: skip
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def ln_check_section(name: str) -> str:
    """bench/ln_check.py: the LayerNorm prologue on the GPU (NOTES 150): each LayerNorm layer compiled (tune none) against
    float64, eager's error beside it, and how its LayerNorm regions ran (the K loop normalizing: NORM_PASS 0)."""
    doc = _load(name)
    rows = doc["rows"] if isinstance(doc, dict) else doc  # (the forty-fifth session's file: the rows alone)
    out = ["| layer | M | kernels | LayerNorm regions: norm | ours rel. err | eager rel. err |", "|" + "---|" * 6]
    for r in rows:
        how = ", ".join(f"{k}: {'row pass' if p else 'in the K loop'}" for k, _, p, _ in r["ln_regions"])
        out.append(f"| {r['layer']} | {r['M']} | {r['kernels']} | {how} | {r['ours_err']:.2e} | {r['eager_err']:.2e} |")
    if isinstance(doc, dict):
        env = {k: doc.get(k) for k in ("gpu", "torch", "triton")}
    else:
        env = {"gpu": "NVIDIA H200", "run": "torch 2.11.0+cu130, triton 3.6.0 (the device call's card and image; not "
               "recorded in the file)"}  # fmt: skip
    env["date"] = _date(doc if isinstance(doc, dict) else {}, name)
    return "\n".join(out) + "\n\n" + source_line([(name, env, "bf16, tune none")]) + "\n"


def tree_ab_section(*names: str) -> str:
    """bench/compare_trees.py: the tree before and after a change, each (tree, M, tune) in its own process, rounds
    alternating: GPU time of the compiled call replayed from a CUDA graph (median over rounds), and the kernels."""
    def ran(impls: dict) -> str:  # (each region: our generated kernel, or its reference: cuBLAS, SDPA, torch ops)
        kinds = collections.Counter("our kernels" if v == "kernel" else f"reference ({v})" for v in impls.values())
        return ", ".join(f"{n} {k}" for k, n in kinds.items())

    out = ["| run | block | M | tune | regions before / after: what ran | GPU µs before (rounds) | after (rounds) | after / before |",
           "|" + "---|" * 8]  # fmt: skip
    envs = []
    for run, name in zip("abcdefgh", names):
        doc = _load(name)
        for r in doc["rows"]:
            o, n = r["old"], r["new"]
            rounds = lambda x: ", ".join(f"{v:.1f}" for v in x["gpu_us_rounds"] if v)  # noqa: E731
            out.append(f"| {run} | {r['block']} | {r['M']} | {r['tune']} | {ran(o['impls'])} / {ran(n['impls'])} | "
                       f"{o['gpu_us']:.1f} ({rounds(o)}) | {n['gpu_us']:.1f} ({rounds(n)}) | {r['new_over_old_gpu']:.3f} |")
        env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "date": _date(doc, name)}
        if not doc.get("torch"):
            env["run"] = "torch 2.11.0+cu130, triton 3.6.0 (the device image; not recorded in the file)"
        envs.append((name, env, f"run {run}, bf16"))
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def graph_copies_section(name: str) -> str:
    """bench/graph_copies.py: a compiled layer's call time with the CUDA graph reading its input in place and handing
    out its output buffers (A) against copying the input in and cloning the outputs (B), alternating rounds."""
    doc = _load(name)
    out = ["| layer | M | A: input in place, outputs handed out, µs (rounds) | B: input copied, outputs cloned, µs (rounds) "
           "| A / B | keep-or-drop timing (back to back) |", "|" + "---|" * 6]  # fmt: skip
    for r in doc["rows"]:
        rounds = lambda x: ", ".join(f"{v:.1f}" for v in x)  # noqa: E731
        out.append(f"| {r['block'].removeprefix('layer_')} | {doc['M']} | {r['A_med']:.1f} ({rounds(r['A'])}) "
                   f"| {r['B_med']:.1f} ({rounds(r['B'])}) | {r['A_med'] / r['B_med']:.3f} | {r['note']} |")
    env = {k: doc.get(k) for k in ("gpu", "torch", "triton", "date")}
    env["run"] = f"bf16, ours tuned `{doc['tune']}`, {len(doc['rows'][0]['A'])} rounds per way (medians)"
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def _goal_runs(runs, row, tree_in_source: bool = False) -> tuple[list[str], list]:
    """The table rows (`row(label, tree, block, m, modes)`) and source entries of bench/run.py results, per (run
    label, tree, file) in `runs`: one row per layer and M."""
    out, envs = [], []
    for label, tree, name in runs:
        table = load_runs([name])
        for (block, m), t in table.items():
            out.append(row(label, tree, block, m, t["modes"]))
        meta = dict(next(iter(table.values()))["meta"])
        meta["run"] = (f"run {label}{f' ({tree})' if tree_in_source else ''}: {meta.get('dtype')}, ours tuned "
                       f"`{meta.get('tune')}`, {meta.get('rounds')} rounds (medians)")
        envs.append((name, meta, f"run {label}"))
    return out, envs


def _goal_cells(ratio: float | None, block: str, modes: dict, goal: float = 1.1) -> str:
    return f"| {_num(ratio, '.3f')}x | {'met' if ratio and ratio >= goal else 'missed'} | {ours_ran(block, modes)} |"


def call_goal_section(*runs: tuple[str, str, str]) -> str:
    """bench/run.py's call times against issue 19's goal at few tokens (ours ≥ 1.1x the best torch.compile mode's
    call), per (run label, tree, file): one row per layer and M, the modes each run timed."""
    def row(label, tree, block, m, modes):
        ours, best = call_of(modes, "ours"), best_inductor(modes, "call")
        calls = " | ".join(_fmt(x) for x in (ours, call_of(modes, "max-autotune"), call_of(modes, "inductor")))
        return (f"| {label} | {tree} | {block.removeprefix('layer_')} | {m} | {_fmt(floor_of(modes))} | {calls} "
                + _goal_cells(best / ours if ours and best else None, block, modes))

    rows, envs = _goal_runs(runs, row)
    out = ["| run | tree | layer | M | floor µs | ours call µs | max-autotune call µs | inductor call µs "
           "| best torch mode / ours | goal ≥ 1.1x | ours ran |", "|" + "---|" * 11, *rows]
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def call_rounds_goal_section(*runs: tuple[str, str, str]) -> str:
    """As `call_goal_section` against max-autotune, with each round's call: where a torch mode's call is bound by
    the host, its rounds differ by far more than its kernels could."""
    def row(label, tree, block, m, modes):
        cells = [f"{_fmt(call_of(modes, mode))} ({_round_list(modes.get(mode, {}), 'call_us_rounds')})"
                 for mode in ("ours", "max-autotune")]
        ours, best = call_of(modes, "ours"), call_of(modes, "max-autotune")
        return (f"| {label} | {block.removeprefix('layer_')} | {m} | {_fmt(floor_of(modes))} | {' | '.join(cells)} "
                + _goal_cells(best / ours if ours and best else None, block, modes))

    rows, envs = _goal_runs(runs, row, tree_in_source=True)
    out = ["| run | layer | M | floor µs | ours call µs (rounds) | max-autotune call µs (rounds) "
           "| max-autotune / ours | goal ≥ 1.1x | ours ran |", "|" + "---|" * 9, *rows]
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def best_mode_goal_section(goal: float, *runs: tuple[str, str, str], kernels: bool = False) -> str:
    """bench/run.py's call times against issue 19's goal for a layer (ours ≥ `goal` x the best torch.compile mode's
    call): Inductor's default and max-autotune modes with each round's call, per (run label, tree, file). With
    `kernels`, also Inductor's kernels alone (its default mode's kernels replayed in a CUDA graph: what its call would
    take without host work) over our call."""
    def row(label, tree, block, m, modes):
        cells = [f"{_fmt(call_of(modes, mode))} ({_round_list(modes.get(mode, {}), 'call_us_rounds')})"
                 for mode in ("ours", "inductor", "max-autotune")]
        ours, best = call_of(modes, "ours"), best_inductor(modes, "call")
        extra = ""
        if kernels:
            g = gpu_of(modes, "inductor")
            extra = f" | {_fmt(g)} | {_num(g / ours if g and ours else None, '.3f')}x"
        return (f"| {label} | {block.removeprefix('layer_')} | {m} | {_fmt(floor_of(modes))} | {' | '.join(cells)}"
                + extra + " " + _goal_cells(best / ours if ours and best else None, block, modes, goal))

    rows, envs = _goal_runs(runs, row, tree_in_source=True)
    extra = " | inductor's kernels µs (graph) | inductor's kernels / ours" if kernels else ""
    out = ["| run | layer | M | floor µs | ours call µs (rounds) | inductor call µs (rounds) | max-autotune call µs "
           f"(rounds){extra} | best torch mode / ours | goal ≥ {goal}x | ours ran |",
           "|" + "---|" * (12 if kernels else 10), *rows]
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def paired_goal_section(goal: float, *runs: tuple[str, str, str]) -> str:
    """bench/run.py's paired call times (`--paired`: the modes' calls in turn, call by call) against issue 19's goal
    for a layer: per mode the median call, the round-based medians beside them; the ratio of the best torch mode's
    median to ours, and the median of the per-turn ratios (that mode's call over ours in the same turn)."""
    def row(label, tree, block, m, modes):
        paired = {md: modes.get(md, {}).get("call_us_paired") for md in ("ours", *INDUCTOR)}
        torch_modes = [md for md in INDUCTOR if paired.get(md)]
        best = min(torch_modes, key=lambda md: paired[md]) if torch_modes else None
        ours = paired.get("ours")
        turns = None
        if best and ours:
            a, b = modes[best]["call_us_paired_calls"], modes["ours"]["call_us_paired_calls"]
            turns = statistics.median(x / y for x, y in zip(a, b, strict=True))
        cells = [f"{_fmt(paired.get(md))} ({_fmt(call_of(modes, md))})" for md in ("ours", "inductor", "max-autotune")]
        return (f"| {label} | {block.removeprefix('layer_')} | {m} | {_fmt(floor_of(modes))} | {' | '.join(cells)} "
                f"| {best or '–'} | {_num(turns, '.3f')}x "
                + _goal_cells(paired[best] / ours if best and ours else None, block, modes, goal))

    rows, envs = _goal_runs(runs, row, tree_in_source=True)
    out = ["| run | layer | M | floor µs | ours call µs paired (rounds) | inductor call µs paired (rounds) "
           "| max-autotune call µs paired (rounds) | best torch mode | per-turn ratio (median) "
           f"| best torch mode / ours | goal ≥ {goal}x | ours ran |", "|" + "---|" * 12, *rows]
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def _paired_after(rows: list[dict]) -> list[list[str | None]]:
    """Per row with paired calls (in the file's row order, the order bench/run.py timed them in), the mode whose call
    came just before each of its calls, rebuilt from profiler.paired's seeded turn order (`profiler.turn_orders`,
    whose sequence this repeats without importing torch; tests/test_bench_report.py holds the two equal)."""
    import random

    n, turns = len(rows), len(rows[0]["call_us_paired_calls"])
    rng = random.Random(0)
    flat = [i for _ in range(turns) for i in rng.sample(range(n), n)]
    after: list[list[str | None]] = [[] for _ in rows]
    for k, i in enumerate(flat):
        after[i].append(rows[flat[k - 1]]["mode"] if k else None)
    return after


def paired_after_section(*names: str) -> str:
    """bench/run.py's paired calls split by the mode whose call came just before (`profiler.paired` does not wait for
    the GPU between calls, so a call after one that left the GPU idle also times its own host work): per layer, M
    and mode, the round-based median and the paired calls' median after each mode."""
    out, envs = [], []
    for name in names:
        doc = _load(name)
        for run in doc["runs"]:
            groups: dict = {}
            for r in run["rows"]:
                if r.get("call_us_paired_calls"):
                    groups.setdefault((r["block"], r["M"]), []).append(r)
            for (block, m), rows in groups.items():
                modes = [r["mode"] for r in rows]
                for r, after in zip(rows, _paired_after(rows), strict=True):
                    cells = []
                    for prev in modes:
                        ts = [t for t, a in zip(r["call_us_paired_calls"], after, strict=True) if a == prev]
                        cells.append(_fmt(statistics.median(ts)) if ts else "–")
                    out.append(f"| {block.removeprefix('layer_')} | {m} | {r['mode']} "
                               f"| {_fmt(statistics.median(r['call_us_rounds']))} | {_fmt(r['call_us_paired'])} "
                               f"| {' | '.join(cells)} |")
            envs.append((name, run["meta"], "paired calls by predecessor"))
    head = ["| layer | M | mode | call µs (rounds) | paired median µs | after ours | after inductor "
            "| after max-autotune |", "|" + "---|" * 8]
    merged: dict[str, tuple[str, dict, str]] = {name: (name, env, what) for name, env, what in envs}
    return "\n".join(head + out) + "\n\n" + source_line(list(merged.values())) + "\n"


def epilogue_ab_section(name: str) -> str:
    """The QKV region's epilogue with a runtime branch per output (the tree's form) against a branch-free one whose
    persistent loop flattens (a patch measured in the fifty-sixth session, not kept: bench/NOTES.md 162), each layer
    compiled both ways in one process, the same configs graph-replayed in turn (medians of the rounds)."""
    doc = _load(name)
    out = ["| layer | tile × stages | persistent | branches µs | branch-free µs | branch-free / branches "
           "| cuBLAS µs | outputs bit-equal |", "|" + "---|" * 8]
    for r in doc["rows"]:
        c = r["config"]
        persistent = "yes" if c["PERSISTENT"] else "no"
        out.append(f"| {r['layer']} | {c['BLOCK_M']}×{c['BLOCK_N']} × {c['num_stages']} | {persistent} "
                   f"| {r['branches_us']:.1f} | {r['branch_free_us']:.1f} | {r['ratio']:.3f} | {r['cublas_us']:.1f} "
                   f"| {'yes' if r['bit_equal'] else 'no'} |")  # fmt: skip
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": "3.6.0"}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "M=2048, bf16, TMA, 8 warps, NORM_PASS 1")]) + "\n"


def narrow_rows_section(*names: str) -> str:
    """bench/narrow_rows.py: row kernels over narrow last dims, µs per call from a CUDA graph at the template's old
    default (at most 16 rows a program), its new one (about 2048 elements a program, bench/NOTES.md 185), the best of
    the script's small grid and quick tuning's pick, against eager, Inductor (default mode) and the copy-bandwidth
    floor; one row per case and file."""
    out = ["| case | card | rows × N | old default µs | new default µs | best of grid µs (config) | quick µs | "
           "Inductor µs | eager µs | floor µs | Inductor / new |", "|" + "---|" * 11]  # fmt: skip
    entries = []
    for name in names:
        doc = _load(name)
        card = doc["gpu"].removeprefix("NVIDIA ").split(" ")[0]
        for r in doc["rows"]:
            out.append(f"| {r['case']} | {card} | {r['rows']} × {r['N']} | {r['old_us']:.1f} | {r['new_us']:.1f} | "
                       f"{r['best_us']:.1f} ({r['best']}) | {r['quick_us']:.1f} | {r['inductor_us']:.1f} | "
                       f"{r['eager_us']:.1f} | {r['floor_us']:.1f} | {r['inductor_us'] / r['new_us']:.2f}x |")
        env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": doc["triton"],
               "run": f"copy {doc['copy_tb_per_s']:.2f} TB/s measured by the script"}
        entries.append((name, env, ""))
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def gemv_ab_section(name: str) -> str:
    """One-row (decode) GEMM kernels with x's slice exchanged through shared memory each K step (the tree's form,
    "slice") against x loaded straight into the weight tile's layout ("rows": a patch measured in the fifty-sixth
    session, not kept: bench/NOTES.md 163): each layer tuned and called in each form, the layers' calls in turn
    (median of the rounds), and each region at each form's tuned config (graph replays, median of 3)."""
    doc = _load(name)
    out = ["| layer | region | N × K | config of | slice µs | rows µs | rows / slice |", "|" + "---|" * 7]
    for e in doc["layers"]:
        med = e["median_us"]
        out.append(f"| {e['layer']} | whole layer (call) | | each its own | {med['slice']:.1f} | {med['rows']:.1f} "
                   f"| {med['rows'] / med['slice']:.3f} |")  # fmt: skip
        for r in e["regions"]:
            sh = r["shape"]
            for by, t in r["us"].items():
                out.append(f"| {e['layer']} | {GEMM_REGION.get(r['region'], r['region'])} "
                           f"| {sh['N'] * sh['streams']} × {sh['K']} | {by.removeprefix('config of ')} "
                           f"| {t['slice']:.1f} | {t['rows']:.1f} | {t['rows'] / t['slice']:.3f} |")  # fmt: skip
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": doc["triton"]}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M={doc['tokens']}, bf16, quick tuning")]) + "\n"


def _ab_source(name: str, doc: dict, what: str) -> str:
    """The source line of an A/B driver's file (card and torch from it; Triton is the device image's 3.6.0, which
    those files do not record)."""
    return source_line([(name, {"gpu": doc["gpu"], "torch": doc["torch"], "triton": "3.6.0"}, what)])


def span_ab_section(name: str) -> str:
    """The QKV region's per-output branch tested on the tile's column vector reduced across warps (the tree before,
    "reduced") or on the tile's column span as scalars ("scalar", kept: bench/NOTES.md 166), each layer's rotary
    region compiled both ways in one process, the same configs graph-replayed in turn (medians of 3 rounds). MM:
    cuBLAS's product, the kernel its epilogue pass; the K-loop configs compile to the same PTX either way."""
    doc = _load(name)
    out = ["| layer | tile, warps | product | persistent | reduced µs | scalar µs | scalar / reduced "
           "| outputs bit-equal |", "|" + "---|" * 8]
    for r in doc["rows"]:
        c = r["config"]
        product = "cuBLAS (MM)" if c["MM"] else "K loop (TMA)"
        out.append(f"| {r['layer']} | {c['BLOCK_M']}×{c['BLOCK_N']}, {c['num_warps']} | {product} "
                   f"| {'yes' if c['PERSISTENT'] else 'no'} | {r['reduced_us']:.1f} | {r['scalar_us']:.1f} "
                   f"| {r['scalar_us'] / r['reduced_us']:.3f} | {'yes' if r['bit_equal'] else 'no'} |")  # fmt: skip
    return "\n".join(out) + "\n\n" + _ab_source(name, doc, "M=2048, bf16, NORM_PASS 1, tune none") + "\n"


def mm_pass_section(name: str) -> str:
    """Where the QKV region's time goes under a cuBLAS-product (MM) config (torch.profiler, 20 launches, each after
    an L2 clear: per-kernel mean µs), beside the same region graph-replayed and cuBLAS's bare product of its
    operands; "partners" is the tree's MM rotary (each column's partner read back from the product), "registers"
    the in-register rotation of the K-loop path tried for MM (not kept, bench/NOTES.md 166). The pass moves the
    product's bytes in and the outputs' out; its bandwidth is those bytes over its kernel time."""
    doc = _load(name)
    out = ["| layer | tile, warps | region µs (partners) | region µs (registers) | registers / partners "
           "| bare cuBLAS µs | cuBLAS in region µs | norm pass µs | MM pass µs | MM pass TB/s |",
           "|" + "---|" * 10]
    for e in doc["rows"]:
        for r in e["configs"]:
            c, k = r["config"], r["kernels"]["partner"]
            cublas = sum(v for n, v in k.items() if n.startswith(("nvjet", "sm90_", "cutlass")))
            norm = sum(v for n, v in k.items() if n.startswith("row_norm"))
            ours = sum(v for n, v in k.items() if n.startswith("gemm_"))
            us, tbs = r["us"], 2 * r["out_bytes"] / ours / 1e6  # (the product read, the outputs written)
            out.append(f"| {e['layer']} | {c['BLOCK_M']}×{c['BLOCK_N']}, {c['num_warps']} | {us['partner']:.1f} "
                       f"| {us['registers']:.1f} | {us['registers'] / us['partner']:.3f} | {e['matmul_us']:.1f} "
                       f"| {cublas:.1f} | {norm:.1f} | {ours:.1f} | {tbs:.2f} |")  # fmt: skip
    return "\n".join(out) + "\n\n" + _ab_source(name, doc, "M=2048, bf16, NORM_PASS 1, tune none") + "\n"


def wgmma_race_section(name: str) -> str:
    """bench/wgmma_race.py: each QKV config launched 10 times on the same inputs (the worst share of outputs off by 5%
    of the RMS from the float32 reference, launches not bit-equal to the first, the CUDA-graph replay time), then the
    stand-alone K loops of the same GEMM (bench/NOTES.md 167)."""
    doc = _load(name)
    out = ["| tokens | config (norm weight in the K loop unless row pass) | in the space | worst share off "
           "| launches unlike the first | µs |", "|" + "---|" * 6]
    for r in doc["races"]:
        out.append(f"| {r['m']} | {r['config']} | {'yes' if r['in_space'] else 'no'} | {r['worst_bad_share']:.2%} "
                   f"| {r['launches_unlike_first']} of {r['launches'] - 1} | {r['us']:.1f} |")
    out += ["", "| K loop (2048×6144×4096, 128×256×64, 8 warps, 3 stages, TMA) | worst share off "
            "| launches unlike the first | µs | TFLOP/s |", "|" + "---|" * 5]
    for r in doc["k_loop"]:
        off = f"{r['worst_bad_share']:.2%}" if "worst_bad_share" in r else "—"
        unlike = f"{r['launches_unlike_first']} of {r['launches'] - 1}" if "launches" in r else "—"
        out.append(f"| {r['kernel']} | {off} | {unlike} | {r['us']:.1f} | {r['tflops']:.0f} |")
    return "\n".join(out) + "\n\n" + _ab_source(name, doc, "Llama-3-8B's norm+QKV+RoPE, bf16, tune none") + "\n"


def ws_forms_section(name: str) -> str:
    """bench/ws_forms.py: three warp-specialized GEMM forms stand-alone (C = A @ W^T + R, bf16, M = 2048), each
    form's time per shape and cuBLAS's bare product timed beside it (bench/NOTES.md 168)."""
    doc = _load(name)
    forms = list(dict.fromkeys(r["form"] for r in doc["rows"]))
    shapes = list(dict.fromkeys((r["shape"], r["N"], r["K"]) for r in doc["rows"]))
    at = {(r["shape"], r["form"]): r for r in doc["rows"]}
    out = ["| shape | N × K | " + " | ".join(f"{f} µs (cuBLAS / it)" for f in forms) + " |",
           "|---|---|" + "---|" * len(forms)]
    for shape, n, k in shapes:
        cells = []
        for f in forms:
            r = at.get((shape, f))
            cells.append(f"{r['us']:.1f} ({r['cublas_us'] / r['us']:.3f}x)" if r else "–")
        out.append(f"| {shape} | {n} × {k} | " + " | ".join(cells) + " |")
    worst = max(r["rel_err"] for r in doc["rows"])
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    return ("\n".join(out) + f"\n\nEvery output within {worst:.1e} (relative, Frobenius) of float64."
            + (f" Failed: {', '.join(f['form'] for f in doc['failed'])}." if doc.get("failed") else "")
            + "\n\n" + source_line([(name, env, f"triton {doc.get('triton')}")]) + "\n")


def ws_sweep_section(name: str) -> str:
    """bench/gemms.py --sweep with the ping-pong form in the template (a patch not in the tree, bench/NOTES.md
    168): per region with a warp-specialized kernel, the quick-tuned choice and the fastest swept config of each
    form (persistent Triton loop, cooperative Gluon WS=1, ping-pong WS=2: in that patch, and in its result file, WS=2
    meant ping-pong; in the tree since the sixtieth session WS=2 is the TMA epilogue, NOTES 170)."""
    doc = _load(name)
    forms = [("persistent (Triton)", 0), ("cooperative WS", 1), ("ping-pong WS", 2)]
    out = ["| layer | region | cuBLAS µs | tuned µs (what) | " + " | ".join(f"{f} µs (tile, stages)" for f, _ in forms)
           + " | ping-pong / best other |", "|---|---|---|---|" + "---|" * len(forms) + "---|"]
    for r in doc["layers"]:
        best = {}
        for c, t, e in r.get("sweep", []):
            if e == e and e <= 1e-2 and (c.get("WS", 0) not in best or t < best[c.get("WS", 0)][0]):
                best[c.get("WS", 0)] = (t, f"{c['BLOCK_M']}x{c['BLOCK_N']}, {c['num_stages']}")
        if not best:
            continue
        c = r["config"]
        what = "MM" if c.get("MM") else f"{c['BLOCK_M']}x{c['BLOCK_N']} WS{c.get('WS', 0)}"
        cells = [f"{best[k][0]:.1f} ({best[k][1]})" if k in best else "–" for _, k in forms]
        other = min(best[k][0] for k in best if k != 2)
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['cublas_us']:.1f} | "
                   f"{r['kernel_us']:.1f} ({what}) | " + " | ".join(cells) + f" | {best[2][0] / other:.3f} |")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    src = source_line([(name, env, f"tune={doc.get('tune')}, triton {doc.get('triton')}")])
    return "\n".join(out) + "\n\n" + src + "\n"


def _ws_forms(r: dict) -> tuple[dict, dict]:
    """A bench/gemms.py --sweep-ws region's sweep by WS form: the fastest config of each form whose output matched
    the tuned one ({WS: (µs, "tile, stages")}), and each config's times by form ({config less WS: {WS: µs}})."""
    best, by = {}, {}
    for c, t, e in r.get("sweep", []):
        if not (e == e and e <= 1e-2):  # (NaN != NaN)
            continue
        ws = c.get("WS", 0)
        if ws not in best or t < best[ws][0]:
            best[ws] = (t, f"{c['BLOCK_M']}x{c['BLOCK_N']}, {c['num_stages']}")
        key = tuple(sorted((k, v) for k, v in c.items() if k != "WS"))
        by.setdefault(key, {})[ws] = t
    return best, by


def _ws_sweep_runs(names: tuple[str, ...], rows) -> tuple[list[str], list]:
    """The table rows (`rows(label, r)`, a line or None, per layer entry) and source entries of bench/gemms.py
    --sweep-ws results, runs labelled a, b, ... in the order of `names`."""
    out, envs = [], []
    for label, name in zip("abcdefgh"[: len(names)], names, strict=True):
        doc = _load(name)
        out += [line for r in doc["layers"] if (line := rows(label, r)) is not None]
        env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
        envs.append((name, env, f"run {label}: tune={doc.get('tune')}, triton {doc.get('triton')}"))
    return out, envs


def ws_epilogue_section(*names: str) -> str:
    """bench/gemms.py --sweep --sweep-ws with the TMA epilogue in the tree (WS=2, bench/NOTES.md 170): per region with
    a warp-specialized kernel, quick tuning's choice, the fastest swept config of each form (the persistent Triton
    loop, WS=1 with the pointer epilogue, WS=2 with the TMA epilogue) and the range of WS=2 / WS=1 over the configs
    timed both ways."""
    forms = [("persistent (Triton)", 0), ("WS=1", 1), ("WS=2", 2)]
    head = " | ".join(f"{f} µs (tile, stages)" for f, _ in forms)
    out = [f"| run | layer | region | cuBLAS µs | tuned µs (what) | {head} | WS=2 / WS=1, same config (min–max, n) "
           "| cuBLAS / best WS=2 |", "|" + "---|" * 10]

    def row(label: str, r: dict) -> str | None:
        best, by = _ws_forms(r)
        if 2 not in best:
            return None
        ratios = [v[2] / v[1] for v in by.values() if 1 in v and 2 in v]
        c = r["config"]
        cells = [f"{best[k][0]:.1f} ({best[k][1]})" if k in best else "–" for _, k in forms]
        region = GEMM_REGION.get(r["region"], r["region"])
        return (f"| {label} | {r['layer']} | {region} | {r['cublas_us']:.1f} "
                f"| {r['kernel_us']:.1f} ({_config_words(c)}{_runs_other(r['impl'])}) | " + " | ".join(cells)
                + f" | {min(ratios):.3f}–{max(ratios):.3f} ({len(ratios)}) | {r['cublas_us'] / best[2][0]:.3f} |")

    rows, envs = _ws_sweep_runs(names, row)
    return "\n".join(out + rows) + "\n\n" + source_line(envs) + "\n"


def ws_qkv_section(*names: str) -> str:
    """bench/gemms.py --sweep --sweep-ws --with-op dl.rotary with the QKV regions in the warp-specialized kernel
    (bench/NOTES.md 172): per QKV region, quick tuning's choice, the fastest swept persistent Triton loop, WS=1 config
    and (the runs of bench/patches/s61-qkv-tma-store.patch and s62-qkv-acc-layout.patch) WS=2 config, and the ranges
    of WS=1 / the Triton loop and WS=2 / WS=1 over the configs timed both ways."""
    out = ["| run | layer | cuBLAS µs | tuned µs (what) | persistent (Triton) µs (tile, stages) "
           "| WS=1 µs (tile, stages) | WS=2 µs (tile, stages) | WS=1 / Triton, same config (min–max, n) "
           "| WS=2 / WS=1, same config (min–max, n) | cuBLAS / best WS=1 | cuBLAS / tuned |", "|" + "---|" * 11]

    def span(by: dict, a: int, b: int) -> str:
        ratios = [v[a] / v[b] for v in by.values() if a in v and b in v]
        return f"{min(ratios):.3f}–{max(ratios):.3f} ({len(ratios)})" if ratios else "–"

    def row(label: str, r: dict) -> str | None:
        best, by = _ws_forms(r)
        if 1 not in best:
            return None
        cells = [f"{best[k][0]:.1f} ({best[k][1]})" if k in best else "–" for k in (0, 1, 2)]
        return (f"| {label} | {r['layer']} | {r['cublas_us']:.1f} "
                f"| {r['kernel_us']:.1f} ({_config_words(r['config'])}{_runs_other(r['impl'])}) | "
                + " | ".join(cells) + f" | {span(by, 1, 0)} | {span(by, 2, 1)} "
                f"| {r['cublas_us'] / best[1][0]:.3f} | {r['cublas_us'] / r['kernel_us']:.3f} |")

    rows, envs = _ws_sweep_runs(names, row)
    return "\n".join(out + rows) + "\n\n" + source_line(envs) + "\n"


def finalists_section(name: str) -> str:
    """bench/finalists.py: each layer quick-tuned into an empty cache (no CUDA graphs, no in-context round), then per
    GEMM region its choice, the confirmation round's finalists and the fastest trial of each variant family captured
    in CUDA graphs and timed in blocks (do_bench, two rounds) and paired (call by call in turn): how far the choice
    is from the fastest candidate by each measure, and how fast the search read the choice (bench/NOTES.md 171)."""
    doc = _load(name)
    out = ["| layer | tuning | region | trials | chosen (family) | chosen / fastest, blocks | chosen / fastest, paired "
           "(fastest's family) | search µs / paired µs, chosen |", "|" + "---|" * 8]
    for run in doc["runs"]:
        for r in run["regions"]:
            rows = r["rows"]
            chosen = next(x for x in rows if x["chosen"])
            blocks = min(x["blocks_us"] for x in rows)
            fastest = min(rows, key=lambda x: x["paired_ratio"])
            out.append(f"| {run['layer']} | {run['rep'] + 1} | {GEMM_REGION.get(r['region'], r['region'])} "
                       f"| {r['trials']} | {_config_words(chosen['config'])} ({chosen['family']}) "
                       f"| {chosen['blocks_us'] / blocks:.3f} | {r['chosen_over_fastest']:.3f} ({fastest['family']}) "
                       f"| {chosen['search_us'] / chosen['paired_us']:.3f} |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    src = source_line([(name, env, f"{doc.get('tokens')} tokens, triton {doc.get('triton')}")])
    return "\n".join(out) + "\n\n" + src + "\n"


def tuner_gap_section(name: str) -> str:
    """bench/gemms.py --sweep with the tuned config re-timed right before and after the sweep (`kernel_us_in_sweep`):
    per region, quick tuning's choice against the fastest swept config whose output matched it, both timed in the
    same conditions (bench/NOTES.md 169)."""
    doc = _load(name)
    out = ["| layer | region | cuBLAS µs | tuned: what | µs before the compiles | µs in the sweep (before / after) "
           "| fastest swept µs (what) | fastest / tuned in the sweep | cuBLAS / fastest |", "|" + "---|" * 9]
    for r in doc["layers"]:
        good = [(t, c) for c, t, e in r.get("sweep", []) if e == e and e <= 1e-2]  # (NaN != NaN)
        if not good or "kernel_us_in_sweep" not in r:
            continue
        t, c = min(good, key=lambda g: g[0])
        before, after = r["kernel_us_in_sweep"]
        out.append(f"| {r['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {r['cublas_us']:.1f} "
                   f"| {_config_words(r['config'])}{_runs_other(r['impl'])} "
                   f"| {r['kernel_us']:.1f} | {before:.1f} / {after:.1f} "
                   f"| {t:.1f} ({_config_words(c)}) | {t / ((before + after) / 2):.3f} | {r['cublas_us'] / t:.3f} |")
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "date": _date(doc, name)}
    src = source_line([(name, env, f"tune={doc.get('tune')}, triton {doc.get('triton')}")])
    return "\n".join(out) + "\n\n" + src + "\n"


def _runs_other(impl: str) -> str:
    return "" if impl == "kernel" else f" (the layer runs {impl})"


def _config_words(c: dict) -> str:
    """A GEMM config in a few words: cuBLAS's product (MM) with its epilogue tile, or the K loop's tile, stages and
    form (persistent, warp-specialized) and whether the norm is a row pass."""
    if c.get("MM"):
        return f"MM, epilogue {c['BLOCK_M']}×{c['BLOCK_N']}"
    form = f"WS={c['WS']} " if c.get("WS") else "persistent " if c.get("PERSISTENT") else ""
    form += f"{c['BLOCK_M']}×{c['BLOCK_N']}"
    return form + f", {c['num_stages']} stages" + (f", split {c['SPLIT_K']}" if c.get("SPLIT_K", 1) > 1 else "")


def tuner_clear_ab_section(name: str) -> str:
    """Quick tuning with the L2 cleared by a zero-fill before each timed call (dirty lines, as do_bench and the tuner
    do), by a read instead (clean), and with the zero-fill again (dirty2: the search's own noise), each in a fresh
    tuning cache; the three compiled layers' calls then timed in turn (profiler.paired, 200 calls each) after each
    kind of clear, and the regions whose chosen config differs between the tunings (bench/NOTES.md 166)."""
    doc = _load(name)
    out = ["| layer | tuned dirty µs (timed dirty / clean) | tuned clean / tuned dirty (timed dirty / clean) "
           "| tuned dirty2 / tuned dirty (timed dirty / clean) | regions whose config differs |", "|" + "---|" * 5]
    for e in doc["layers"]:
        p, forms = e["paired_us"], list(e["choices"])
        cells = [f"{p['dirty_ratio_to_dirty'][f]:.4f} / {p['clean_ratio_to_dirty'][f]:.4f}" for f in forms[1:]]
        diffs = []
        for region in e["choices"][forms[0]]:
            configs = [{"impl": e["choices"][f][region]["impl"], **(e["choices"][f][region]["config"] or {})}
                       for f in forms]  # (each tuning's choice for the region)
            keys = [k for k in dict.fromkeys(k for c in configs for k in c) if len({c.get(k) for c in configs}) > 1]
            if keys:
                diffs.append(f"{GEMM_REGION.get(region, region)}: " + ", ".join(
                    f"{f} " + "/".join(f"{k}={c.get(k)}" for k in keys) for f, c in zip(forms, configs, strict=True)))
        what = "; ".join(diffs) or "none"
        out.append(f"| {e['layer']} | {p['dirty']['dirty']:.1f} / {p['clean']['dirty']:.1f} | " + " | ".join(cells)
                   + f" | {what} |")
    return "\n".join(out) + "\n\n" + _ab_source(name, doc, f"M={doc['tokens']}, bf16, quick tuning") + "\n"


def in_layer_vary_section(name: str) -> str:
    """bench/in_layer.py: each GEMM region's candidates (with `--vary`: its tuned config with one parameter changed)
    timed alone (the tuner's search measure, its confirmation round, a graph replay) and in the layer (the layer's
    call with that candidate in the region, the candidates in turn, median of the rounds); * marks the tuned one."""
    doc = _load(name)
    keys = ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "NORM_PASS")
    out = ["| layer | region | candidate | alone (search) µs | alone (held) µs | graph µs | layer call µs |",
           "|" + "---|" * 7]
    for e in doc["layers"]:
        for reg in e["regions"]:
            for r in reg["rows"]:
                if r["config"] == "reference":
                    what = "reference (cuBLAS and torch ops)"
                else:
                    c = json.loads(r["config"])
                    what = ("* " if r["config"] == reg["tuned"] else "") + " ".join(f"{k} {c[k]}" for k in keys)
                out.append(f"| {e['layer']} | {GEMM_REGION.get(reg['region'], reg['region'])} | {what} "
                           f"| {r['iso_us']:.1f} | {r['held_us']:.1f} | {r['graph_us']:.1f} | {r['layer_us']:.1f} |")
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": doc["triton"], "date": doc["date"]}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M={doc['tokens']}, bf16, quick tuning")]) + "\n"


def l2_clear_section(name: str) -> str:
    """bench/l2_clear.py: calls timed after a zero-fill of 256 MB (do_bench's L2 clear: L2 left dirty), after a read
    of 256 MB (L2 clean), and after nothing; the layers' calls and each GEMM region's graph replay, with the fraction
    of the copy bandwidth measured in the same run that the region's weight bytes reach."""
    doc = _load(name)
    copy = doc["ceilings"]["copy_bytes_per_s"]
    out = ["| layer | call or region | weight MB | dirty µs | clean µs | warm µs "
           "| of copy BW: dirty | clean | warm |", "|" + "---|" * 9]
    for e in doc["layers"]:
        for mode, t in e["modes"].items():
            out.append(f"| {e['layer']} | {mode} (layer call) | | {t['dirty']:.1f} | {t['clean']:.1f} "
                       f"| {t['warm']:.1f} | | | |")
        for r in e["regions"]:
            t, mb = r["us"], r["weight_bytes"] / 1e6
            bw = [f"{r['weight_bytes'] / (t[c] * 1e-6) / copy:.0%}" for c in ("dirty", "clean", "warm")]
            out.append(f"| {e['layer']} | {GEMM_REGION.get(r['region'], r['region'])} | {mb:.1f} | {t['dirty']:.1f} "
                       f"| {t['clean']:.1f} | {t['warm']:.1f} | {' | '.join(bw)} |")
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": doc["triton"], "ceilings": doc["ceilings"]}
    return "\n".join(out) + "\n\n" + source_line([(name, env, f"M={doc['tokens']}, bf16, quick tuning")]) + "\n"


def kernel_times_section(*names: str) -> str:
    """bench/profile_kernels.py: per kernel the mean time per call in a trace of the graph-replayed call (each call
    after an L2 clear), the kernels of one source summed (o-proj and down share one), with the call's span."""
    out = ["| layer | M | kernel (launch shape) | µs per call | call span µs | graph call µs (do_bench) |",
           "|" + "---|" * 6]
    entries = []
    for name in names:
        doc = _load(name)
        g = doc["ours/graph"]
        for k, us in sorted(g["per_kernel"].items(), key=lambda kv: -kv[1]):
            shape = "; ".join(g["launches"].get(k, []))
            out.append(f"| {doc['block'].removeprefix('layer_')} | {doc['M']} | {k} ({shape}) | {us:.1f} "
                       f"| {g['span']:.1f} | {g['do_bench_median']:.1f} |")
        entries.append((name, {"gpu": doc["gpu"], "torch": doc["torch"], "ceilings": doc["ceilings"]}, ""))
    return "\n".join(out) + "\n\n" + source_line(entries) + "\n"


def region_ab_section(name: str, labels: dict[str, str], env: dict) -> str:
    """bench/region_ab.py: the whole layer with one region's config forced, the variants' calls paired (median µs,
    and the median of each turn's ratio to the tuned layer). `env`: the run's card and versions (the script's file
    holds the results only)."""
    doc = _load(name)
    out = ["| layer | variant | call µs (paired median) | per-turn ratio to the tuned layer | rel. error vs the first call (bf16) |",
           "|---|---|---|---|---|"]
    for layer, r in doc.items():
        for v, us in r["median_us"].items():
            out.append(f"| {layer} | {labels.get(v, v)} | {us:.1f} | {r['per_turn_vs_tuned'][v]:.3f} "
                       f"| {r['rel_err'][v]:.1e} |")
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def in_context_ab_section(name: str, env: dict) -> str:
    """bench/in_context_ab.py: each layer tuned afresh with the near-tie round on (`runtime.in_context`); per layer
    the regions whose choice the round changed (from what measured fastest alone to what it kept), and where it
    changed one, the layer with those regions put back against the layer as the round left it, paired."""
    doc = _load(name)

    def what(impl: str, config: dict | None) -> str:
        if impl != "kernel":
            return "the reference (cuBLAS)"
        c = config or {}
        kind = ("cuBLAS product + our epilogue" if c.get("MM") else
                "our warp-specialized (Gluon) K loop" if c.get("WS") else "our K loop")
        return (f"{kind} {c.get('BLOCK_M')}×{c.get('BLOCK_N')}, {c.get('num_stages')} stages"
                + (", persistent" if c.get("PERSISTENT") else ""))

    out = ["| layer | region changed: measured fastest alone → kept in the program | alone µs (paired) "
           "| in context µs (paired) | per-turn ratio |", "|---|---|---|---|---|"]
    for layer, r in doc.items():
        changes = []
        for names, (impl, config) in r["changed"]:
            now = r["chosen"][names[0]]
            changes.append(f"{', '.join(names)}: {what(impl, config)} → {what(now[0], now[1])}")
        out.append(f"| {layer} | {'; '.join(changes) or 'none'} | {_fmt(r.get('alone_us'))} "
                   f"| {_fmt(r.get('in_context_us'))} | {_num(r.get('per_turn_ratio'), '.4f')} |")
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


# bench/region_ab.py's variants, as its tables name them
REGION_AB_LABELS = {
    "tuned": "as tuned", "qkv_mm16x128": "QKV: cuBLAS product + our rotary epilogue, 16×128 tiles",
    "qkv_mm32x128": "QKV: cuBLAS product + epilogue, 32×128", "qkv_mm64x128": "QKV: cuBLAS product + epilogue, 64×128",
    "gu_kloop": "gate/up: our TMA K loop (128×128)",
    "gu_mm16x128": "gate/up: cuBLAS product + our SiLU·mul epilogue (16×128)",
    "gu_ws3": "gate/up: our warp-specialized (Gluon) K loop, 128×128 a stream, 3 stages",
    "gu_ws4": "gate/up: our warp-specialized (Gluon) K loop, 128×128 a stream, 4 stages"}


def kernel_energy_section(name: str, labels: dict[str, str]) -> str:
    """bench/kernel_energy.py: each GEMM region's tuned launch and cuBLAS's bare product of its shape, replayed back
    to back for a second in turn (three rounds each): µs a call, nvidia-smi's median power and SM clock, energy a
    call, and the work done per SM clock (FLOP / (µs x MHz x SMs)) as a share of the tensor cores' dense bf16 peak
    per clock (4096 FLOP a clock an SM on sm90)."""
    doc = _load(name)
    out = ["| region | M×N×K | ran | µs a call | power W | SM MHz | mJ a call | tensor-core busy per clock |",
           "|---|---|---|---|---|---|---|---|"]
    for r in doc["regions"]:
        for way, rows in r["rows"].items():
            us = statistics.median(x["us"] for x in rows)
            w = statistics.median(x["power_w_median"] for x in rows)
            mhz = statistics.median(x["sm_mhz_median"] for x in rows)
            mj = statistics.median(x["mj_per_call"] for x in rows)
            busy = r["flops"] / (us * 1e-6) / (mhz * 1e6) / 132 / 4096
            ran = labels.get(r["region"], r["region"]) if way == "ours" else "cuBLAS, the bare product"
            out.append(f"| {r['layer']} {r['region']} | {r['M']}×{r['N']}×{r['K']} | {ran} | {us:.1f} | {w:.0f} "
                       f"| {mhz:.0f} | {mj:.1f} | {busy:.1%} |")
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": doc.get("triton", "3.6.0"),  # (the first run's file
           "date": doc.get("date", "2026-12-03"),  # holds neither; its tree's Triton, its day)
           "run": f"call 1 of the fifty-second session, bf16, {doc['tokens']} tokens, 1 s phases"}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def outside_sweep_section(name: str) -> str:
    """bench/gemms.py --sweep-outside: K-loop configs beyond the tuner's space (256-row tiles, GROUP_M 16) beside
    ones inside it, each region's tuned launch and cuBLAS's product of its shape, do_bench in a CUDA graph."""
    doc = _load(name)
    out = ["| layer | region | N×K | tuned: ran, µs | cuBLAS µs | 128×128 s3 / s4 | same, GROUP_M 16 | 256×64 s3 / s4 "
           "| 256×128 s3 (GROUP_M 8 / 16) |", "|" + "---|" * 9]
    for r in doc["layers"]:
        t = {(c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], c["GROUP_M"]): (us, err) for c, us, err in r["sweep"]}

        def cell(*keys, t=t):
            return " / ".join(f"{t[k][0]:.1f}" + (" (wrong)" if t[k][1] > 0.1 else "") if k in t else "—" for k in keys)
        c = r["config"]
        ran = "cuBLAS + our epilogue" if c["MM"] else f"K loop {c['BLOCK_M']}×{c['BLOCK_N']} s{c['num_stages']}"
        if r["impl"] != "kernel":
            ran = f"torch (its product and add; our tuned {ran})"
        out.append(f"| {r['layer']} | {r['region']} | {r['N']}×{r['K']} | {ran}, {r['kernel_us']:.1f} "
                   f"| {r['cublas_us']:.1f} | {cell((128, 128, 3, 8), (128, 128, 4, 8))} "
                   f"| {cell((128, 128, 3, 16), (128, 128, 4, 16))} | {cell((256, 64, 3, 8), (256, 64, 4, 8))} "
                   f"| {cell((256, 128, 3, 8), (256, 128, 3, 16))} |")
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": doc["triton"], "date": doc["date"],
           "run": "call 1 of the fifty-second session, bf16, M = 2048, tuned `quick` (from the carried cache)"}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def store_ab_section(name: str) -> str:
    """bench/store_ab.py (commit 5a1beba): the GEMM epilogue's output stored by pointer, through a tensor
    descriptor, and through one in two halves of the tile, on the same configs, paired (median µs a call; per-turn
    ratio to the pointer store)."""
    doc = _load(name)
    out = ["| layer | region | config | by pointer µs | descriptor µs (per-turn ratio) | two halves µs (ratio) |",
           "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        c = r["config"]
        tuned = " (tuned)" if c == r["tuned"] else ""
        med, rat = r["median"], r["ratio_per_turn"]
        out.append(f"| {r['layer']} | {r['region']} | {c['BLOCK_M']}×{c['BLOCK_N']}, {c['num_stages']} stages, "
                   f"{'persistent' if c['PERSISTENT'] else 'a tile a program'}{tuned} | {med[0]:.1f} "
                   f"| {med[1]:.1f} ({rat[0]:.3f}) | {med[2]:.1f} ({rat[1]:.3f}) |")
    env = {"gpu": doc["gpu"], "torch": doc["torch"], "triton": "3.6.0", "date": "2026-12-03",
           "run": "call 2 of the fifty-second session, bf16, M = 2048, 40 paired turns"}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def sdpa_backends_section(name: str) -> str:
    """bench/sdpa_backends.py: each SDPA backend torch has on a layer's prefill attention (causal, one sequence),
    grouped key/value heads as given or repeated to the query's first (do_bench µs, L2 cleared)."""
    doc = _load(name)
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in doc["rows"]:
        row = cells.setdefault((r["layer"], r["heads"]), {})
        if "error" in r:
            row[f"{r['backend']}/{r['kv']}"] = "no kernel"
        else:
            row[f"{r['backend']}/{r['kv']}"] = f"{r['us']:.1f} ({r['tflops']:.0f})"
            if "repeat_us" in r:
                row["repeat"] = f"{r['repeat_us']:.1f}"
    cols = ["default/grouped", "cudnn/grouped", "flash/grouped", "cudnn/repeated", "efficient/repeated", "repeat"]
    out = ["| layer | q/kv heads × dim | torch's default µs (TFLOP/s) | cuDNN | flash | cuDNN, kv heads repeated "
           "| memory-efficient, repeated | the repeat alone µs |", "|" + "---|" * 8]
    for (layer, heads), row in cells.items():
        if "flash/grouped" not in row:  # (as many kv heads as q heads: nothing repeated)
            continue
        out.append(f"| {layer} | {heads} | " + " | ".join(row.get(c, "—") for c in cols) + " |")
    meta = doc["meta"]
    env = {"gpu": meta["gpu"], "torch": meta["torch"], "versions": {"cuDNN": meta["cudnn"]}, "date": "2026-12-03",
           "run": "call 2 of the fifty-third session, bf16, 2048 tokens, causal"}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def confirm_rounds_section(name: str) -> str:
    """The confirmation round's finalists of a quick tuning, timed three ways in one process (.dbg's probe over the
    tuner): the calls in turn one at a time (`paired`, commit b17feb2), the block round as landed (`in_turn`), then
    paired again (median µs). The tuner kept the first paired round's pick (marked)."""
    doc = _load(name)
    out = ["| layer | region (M, N, K, streams) | config | paired µs | blocks µs | paired again µs |",
           "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        s, c = r["shape"], r["config"]
        region = (f"attention S={s['S']}, {s['H']} heads" if r["kernel"] == "attention"
                  else f"{s['M']}, {s['N']}, {s['K']}, {s['streams']}")  # fmt: skip
        if r["kernel"] == "attention":
            what = f"{c['BLOCK_M']}×{c['BLOCK_N']}, {c['num_warps']} warps, {c['num_stages']} stages"
        elif c["MM"]:
            what = f"cuBLAS + epilogue {c['BLOCK_M']}×{c['BLOCK_N']}, {c['num_warps']} warps"
        else:
            what = (f"K loop {c['BLOCK_M']}×{c['BLOCK_N']}×{c['BLOCK_K']}, {c['num_stages']} stages"
                    + (", persistent" if c["PERSISTENT"] else "") + (", WS" if c["WS"] else ""))  # fmt: skip
        mark = "**" if r["chosen"] else ""
        out.append(f"| {r['layer']} | {region} | {mark}{what}{mark} | {r['paired_us']:.1f} | {r['blocks_us']:.1f} "
                   f"| {r['paired2_us']:.1f} |")
    env = {k: doc[k] for k in ("gpu", "torch", "triton", "date")}
    env["run"] = "call 2 of the fifty-third session, bf16, M = 2048, quick tuning from an empty cache"
    return "\n".join(out) + "\n\n" + source_line([(name, env, "")]) + "\n"


def kernel_goal_section(label: str, name: str) -> str:
    """bench/run.py with Inductor's max-autotune kernels captured in a CUDA graph and replayed (their GPU time, no
    host in it) against our call as a user makes it (host, input copy and graph launch included): a floor for the
    ratio that no host's speed moves in torch's favour."""
    def row(label, tree, block, m, modes):
        o, i = modes.get("ours", {}), modes.get("max-autotune-no-cudagraphs", {})
        ratio = i.get("gpu_us") / o.get("call_us") if o.get("call_us") and i.get("gpu_us") else None
        return (f"| {label} | {block.removeprefix('layer_')} | {m} | {_fmt(floor_of(modes))} "
                f"| {_fmt(o.get('call_us'))} ({_round_list(o, 'call_us_rounds')}) "
                f"| {_fmt(i.get('gpu_us'))} ({_round_list(i, 'gpu_us_rounds')}) | {_num(ratio, '.3f')}x "
                f"| {ours_ran(block, modes)} |")

    rows, envs = _goal_runs([(label, "", name)], row)
    out = ["| run | layer | M | floor µs | ours call µs (rounds) | max-autotune kernels GPU µs (rounds) "
           "| max-autotune GPU / ours call | ours ran |", "|" + "---|" * 8, *rows]
    return "\n".join(out) + "\n\n" + source_line(envs) + "\n"


def floor_of(modes: dict) -> float:
    return next(iter(modes.values()))["floor_us"]


def _round_list(x: dict, key: str) -> str:
    return ", ".join(f"{v:.1f}" for v in x.get(key, []))


def host_ab_section(name: str) -> str:
    """bench/compare_trees.py with call and enqueue times: the tree before and after a change of the call path
    (GPU time of the replayed call, call time as do_bench gives it, the host's time to make one call)."""
    doc = _load(name)
    out = ["| block | M | tune | tree | GPU µs (rounds) | call µs (rounds) | call 3 s later µs (rounds) "
           "| enqueue µs (rounds) |", "|" + "---|" * 8]  # fmt: skip
    for r in doc["rows"]:
        for tree in ("old", "new"):
            x = r[tree]
            cells = [", ".join(f"{v:.1f}" for v in x[k]) for k in ("gpu_us_rounds", "call_us_rounds",
                                                                    "call_later_us_rounds", "enqueue_us_rounds")]
            out.append(f"| {r['block']} | {r['M']} | {r['tune']} | {'before' if tree == 'old' else 'after'} | "
                       + " | ".join(cells) + " |")  # fmt: skip
    env = {"gpu": doc.get("gpu"), "torch": doc.get("torch"), "triton": doc.get("triton"), "date": _date(doc, name)}
    return "\n".join(out) + "\n\n" + source_line([(name, env, "bf16, each tree and round its own process")]) + "\n"


# ---------------------------------------------------------------------------------------------- sections

SECTIONS = {
    "call-goal-s48": functools.partial(
        call_rounds_goal_section, ("a", "3802c48", "2026-12-02-h200-s48-layers-m128-a.json"),
        ("c", "3f8f09c", "2026-12-02-h200-s48-layers-m1-c.json"), ("d", "3f8f09c", "2026-12-02-h200-s48-layers-m1-d.json")),
    "kernel-goal-s48": functools.partial(kernel_goal_section, "e", "2026-12-02-h200-s48-layers-m1-e.json"),
    "tree-ab-s48": functools.partial(tree_ab_section, "2026-12-02-h200-s48-ab-rs-in-loop.json"),
    "tree-ab-s49": functools.partial(tree_ab_section, "2026-12-02-h200-s49-ab-ssq.json",
                                     "2026-12-02-h200-s49-ab-heads-order-m2048.json",
                                     "2026-12-02-h200-s49-ab-heads-order-m128.json"),
    "best-goal-s49": functools.partial(best_mode_goal_section, 1.05,
                                       ("a", "heads in eager's order", "2026-12-02-h200-s49-layers-m2048.json")),
    "graph-copies-s50": functools.partial(graph_copies_section, "2026-12-03-h200-s50-ab-graph-copies.json"),
    "best-goal-s50": functools.partial(best_mode_goal_section, 1.05,
                                       ("a", "keep-or-drop timed back to back", "2026-12-03-h200-s50-layers-m2048-a.json"),
                                       ("b", "and the graph's input copy and output clone gone",
                                        "2026-12-03-h200-s50-layers-m2048-b.json")),
    "kernel-energy-s52": functools.partial(kernel_energy_section, "2026-12-03-h200-s52-kernel-energy-llama3_8b.json", {
        "gemm_0": "norm pass + our K loop with the rotary", "gemm_1": "cuBLAS + our residual epilogue",
        "gemm_2": "norm pass + our dual K loop with SiLU·mul", "gemm_3": "cuBLAS + our residual epilogue"}),
    "outside-sweep-s52": functools.partial(outside_sweep_section, "2026-12-03-h200-s52-gemms-outside-space.json"),
    "store-ab-s52": functools.partial(store_ab_section, "2026-12-03-h200-s52-store-ab.json"),
    "ws-twins-s55": functools.partial(ws_twins_section, "2026-12-03-h200-s55-ws-sweep-glu.json"),
    "region-ab-s55-ws": functools.partial(region_ab_section, "2026-12-03-h200-s55-region-ab-ws.json", REGION_AB_LABELS,
        {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-03",
         "run": "call 4 of the fifty-fifth session: bf16, 2048 tokens, ours tuned `quick` from an empty cache, "
                "80 paired turns"}),
    "gemms-quick-s55": functools.partial(gemms_section, "2026-12-03-h200-s55-gemms-quick.json"),
    "decode-gemms-s55": functools.partial(decode_gemms_section, "2026-12-03-h200-s55-gemms-m1.json",
                                          "2026-12-03-h200-s55-ceilings.json"),
    "fusion-bound-s55": functools.partial(fusion_bound_section, "2026-12-03-h200-s55-profile-llama3_8b-m2048.json", 1.05),
    "paired-goal-s55-m2048": functools.partial(paired_goal_section, 1.05,
                                               ("a", "the one-accumulator WS dual GEMM in the space",
                                                "2026-12-03-h200-s55-layer-llama3_8b-m2048-paired.json")),
    "epilogue-ab-s56": functools.partial(epilogue_ab_section, "2026-12-03-h200-s56-epilogue-ab.json"),
    "kernel-times-s56-m1": functools.partial(kernel_times_section,
                                             "2026-12-03-h200-s56-profile-mistral_nemo_12b-m1.json",
                                             "2026-12-03-h200-s56-profile-gemma_7b-m1.json"),
    "in-layer-s56-m1": functools.partial(in_layer_vary_section, "2026-12-03-h200-s56-in-layer-m1.json"),
    "gemv-ab-s56": functools.partial(gemv_ab_section, "2026-12-03-h200-s56-gemv-ab.json"),
    "l2-clear-s56": functools.partial(l2_clear_section, "2026-12-03-h200-s56-l2-clear-m1.json"),
    "best-mode-goal-s56-m1": functools.partial(best_mode_goal_section, 1.1,
                                               ("a", "84d6fdc", "2026-12-03-h200-s56-layers-m1.json")),
    "span-ab-s57": functools.partial(span_ab_section, "2026-12-03-h200-s57-span-ab.json"),
    "mm-pass-s57": functools.partial(mm_pass_section, "2026-12-03-h200-s57-mm-pass.json"),
    "tuner-clear-ab-s57-m1": functools.partial(tuner_clear_ab_section, "2026-12-03-h200-s57-tuner-clear-ab-m1.json"),
    "gemms-quick-s57": functools.partial(gemms_section, "2026-12-03-h200-s57-gemms-quick.json"),
    "wgmma-race-s58": functools.partial(wgmma_race_section, "2026-12-04-h200-s58-wgmma-race.json"),
    "ws-forms-s59": functools.partial(ws_forms_section, "2026-12-04-h200-s59-ws-forms.json"),
    "ws-sweep-s59": functools.partial(ws_sweep_section, "2026-12-04-h200-s59-pingpong-template.json"),
    "tuner-gap-s59": functools.partial(tuner_gap_section, "2026-12-04-h200-s59-gemms-sweep.json"),
    "ws-forms-s60": functools.partial(ws_forms_section, "2026-12-04-h200-s60-ws-forms.json"),
    "gemms-quick-s60": functools.partial(gemms_section, "2026-12-04-h200-s60-gemms-quick.json"),
    "ws-tma-s60": functools.partial(ws_epilogue_section, "2026-12-04-h200-s60-gemms-ws-sweep-a.json",
                                    "2026-12-04-h200-s60-gemms-ws-sweep-b.json",
                                    "2026-12-04-h200-s60-gemms-ws-sweep-c.json"),
    "ws-qkv-acc-layout-s62": functools.partial(ws_qkv_section, "2026-12-04-h200-s62-qkv-acc-layout-sweep.json"),
    "split-tail-s63": functools.partial(split_tail_section, "2026-12-04-h200-s63-split-tail.json",
                                        "2026-12-04-h200-s63-split-tail-variants.json",
                                        "2026-12-04-h200-s63-split-tail-ncu.json"),
    "stages-m128-s63": functools.partial(stages_m128_section, "2026-12-04-h200-s63-m128-stages-sweep.json"),
    "flashnorm-s63": functools.partial(flashnorm_section, "2026-12-04-h200-s63-flashnorm.json",
                                       "2026-12-04-h200-s63-flashnorm-after.json", "2026-12-04-h200-s63-row-rms.json",
                                       "2026-12-04-h200-s63-norm-pass-kernels.json"),
    "paired-goal-s67-m2048": functools.partial(paired_goal_section, 1.05,
                                               ("a", "4958801, random paired order",
                                                "2026-12-05-h200-s67-layers-m2048-paired.json")),
    "best-mode-goal-s67-m2048-rounds": functools.partial(best_mode_goal_section, 1.05,
                                                         ("a", "4958801, 2048 tokens, round-based calls",
                                                          "2026-12-05-h200-s67-layers-m2048-paired.json")),
    "block-nanogpt-h100-s74": functools.partial(layer_section, "2026-12-06-h100-s74-nanogpt.json", "nanogpt_block"),
    "block-nanogpt-h200-s74": functools.partial(layer_section, "2026-12-06-h200-s74-nanogpt.json", "nanogpt_block"),
    "block-nanogpt-ab-old-h200-s74": functools.partial(layer_section, "2026-12-06-h200-s74-nanogpt-ab-old.json",
                                                       "nanogpt_block"),
    "block-nanogpt-ab-new-h200-s74": functools.partial(layer_section, "2026-12-06-h200-s74-nanogpt-ab-new.json",
                                                       "nanogpt_block"),
    "mask-tiles-s75": functools.partial(
        mask_tiles_section, ("MASK_RANGE (s74)", "2026-12-06-h100-s75-mask-range.json"),
        ("lists, one program a block of rows", "2026-12-06-h100-s75-mask-tiles.json"),
        ("lists, one program a tile", "2026-12-06-h100-s75-mask-tiles-parallel.json"),
        ("lists only (as committed), another run", "2026-12-06-h100-s75-mask-tiles-final.json")),
    "mask-kernels-s76": functools.partial(
        mask_kernels_section, ("a (do_bench)", "2026-12-06-h100-s76-mask-tiles-repeat.json"),
        ("b (host hidden)", "2026-12-06-h100-s76-mask-tiles-gpu-time.json")),
    "block-nanogpt-h100-s76": functools.partial(layer_section, "2026-12-06-h100-s76-nanogpt.json", "nanogpt_block"),
    "block-nanogpt-mask-range-h100-s75": functools.partial(
        layer_section, "2026-12-06-h100-s75-nanogpt-mask-range.json", "nanogpt_block"),
    "block-nanogpt-lists-h100-s75": functools.partial(
        layer_section, "2026-12-06-h100-s75-nanogpt-mask-blocks-parallel.json", "nanogpt_block"),
    "best-mode-goal-s71-gemma-m1": functools.partial(
        best_mode_goal_section, 1.1, ("a", "4d65314, 1 token, round-based calls", "2026-12-05-h100-s71-gemma-m1.json")),
    "kernel-times-s71-gemma-m1": functools.partial(kernel_times_section, "2026-12-05-h100-s71-profile-gemma-m1.json"),
    "gemv-study-s71-gemma": functools.partial(gemv_study_section, "2026-12-05-h100-s71-gemv-study-gemma.json",
                                              "2026-12-05-h100-s71-ceilings.json"),
    "narrow-rows-s71": functools.partial(narrow_rows_section, "2026-12-05-h100-s71-narrow-rows.json",
                                         "2026-12-05-h200-s71-narrow-rows-aligned.json"),
    "decode-ab-s71-llama-p2048": functools.partial(decode_ab_section, "2026-12-05-h100-s71-decode-ab-prompt2048.json"),
    "best-mode-goal-s68-m1-m128-rounds": functools.partial(
        best_mode_goal_section, 1.1,
        ("a", "b46bc8e, 1 and 128 tokens, round-based calls", "2026-12-05-h200-s68-layers-m1-m128-a.json"),
        ("b", "b46bc8e, 1 and 128 tokens, round-based calls", "2026-12-05-h200-s68-layers-m1-m128-b.json")),
    "paired-goal-s68-m1-m128": functools.partial(
        paired_goal_section, 1.1,
        ("a", "b46bc8e, random paired order", "2026-12-05-h200-s68-layers-m1-m128-a.json"),
        ("b", "b46bc8e, random paired order", "2026-12-05-h200-s68-layers-m1-m128-b.json")),
    "paired-after-s68": functools.partial(paired_after_section, "2026-12-05-h200-s68-layers-m1-m128-a.json",
                                          "2026-12-05-h200-s68-layers-m1-m128-b.json",
                                          "2026-12-05-h200-s67-layers-m2048-paired.json"),
    "best-mode-goal-s61-m2048-rounds": functools.partial(best_mode_goal_section, 1.05,
                                                         ("a", "6ef4fba, 2048 tokens, round-based calls",
                                                          "2026-12-04-h200-s61-layers-m2048-paired.json")),
    "cublas-addmm-s64": functools.partial(cublas_addmm_section, "2026-12-04-h200-s64-cublas-addmm-inplace.json"),
    "gemms-m128-s64": functools.partial(gemms_section, "2026-12-04-h200-s64-gemms-m128-b.json"),
    "residual-inplace-s64": functools.partial(residual_inplace_section,
                                              ("call 7", "2026-12-04-h200-s64-residual-inplace-d.json")),
    "split-sweep-s62-m128": functools.partial(split_sweep_section, "2026-12-04-h200-s62-m128-splitk-sweep.json",
                                              4.24e12),
    "best-mode-goal-s62-small": functools.partial(best_mode_goal_section, 1.1,
                                                  ("a", "6002d67, 1 token", "2026-12-04-h200-s62-layers-m1.json"),
                                                  ("b", "6002d67, 128 tokens", "2026-12-04-h200-s62-layers-m128.json"),
                                                  kernels=True),
    "finalists-s61": functools.partial(finalists_section, "2026-12-04-h200-s61-finalists.json"),
    "ws-qkv-s61": functools.partial(ws_qkv_section, "2026-12-04-h200-s61-qkv-ws-sweep-a.json",
                                    "2026-12-04-h200-s61-qkv-ws-sweep-b.json",
                                    "2026-12-04-h200-s61-qkv-tma-store-sweep.json"),
    "paired-goal-s61-m2048": functools.partial(paired_goal_section, 1.05,
                                               ("a", "6ef4fba (QKV in the WS kernel)",
                                                "2026-12-04-h200-s61-layers-m2048-paired.json")),
    "paired-goal-s60-m2048": functools.partial(paired_goal_section, 1.05,
                                               ("a", "0badd03 (WS=2 in the space)",
                                                "2026-12-04-h200-s60-layers-m2048-paired-a.json"),
                                               ("b", "0badd03 (WS=2 in the space)",
                                                "2026-12-04-h200-s60-layers-m2048-paired-b.json")),
    "region-ab-s59-qwen-gu": functools.partial(region_ab_section, "2026-12-04-h200-s59-region-ab-qwen-gu.json",
                                               REGION_AB_LABELS,
        {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-04",
         "run": "call 8 of the fifty-ninth session: bf16, 2048 tokens, tuned `quick` with CUDA graphs (the near-tie "
                "round on); quick tuning chose the same gate/up config as the forced variant, so this pair is an A/A "
                "of two compiled copies, 80 paired turns"}),
    "paired-goal-s55-small": functools.partial(paired_goal_section, 1.1,
                                               ("a", "128 tokens", "2026-12-03-h200-s55-layers-m128.json"),
                                               ("b", "1 token", "2026-12-03-h200-s55-layers-m1.json")),
    "in-context-ab-s54": functools.partial(in_context_ab_section, "2026-12-03-h200-s54-in-context-ab.json", {
        "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-03",
        "run": "call 4 of the fifty-fourth session: bf16, 2048 tokens, each layer tuned `quick` from an empty cache, "
               "100 paired turns"}),
    "region-ab-s54-chained": functools.partial(region_ab_section, "2026-12-03-h200-s54-region-ab-chained.json",
                                         REGION_AB_LABELS,
        {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-03",
         "run": "call 1 of the fifty-fourth session: bf16, ours tuned `quick`, with programmatic dependent launch, "
                "80 paired turns"}),
    "region-ab-s54-unchained": functools.partial(region_ab_section, "2026-12-03-h200-s54-region-ab-unchained.json",
                                         REGION_AB_LABELS,
        {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-03",
         "run": "call 1 of the fifty-fourth session: bf16, the same tuning, every variant without programmatic "
                "dependent launch (`CHAINED=0`), 80 paired turns"}),
    "paired-goal-s54": functools.partial(paired_goal_section, 1.05,
                                         ("a", "the near-tie round on",
                                          "2026-12-03-h200-s54-layer-mistral-m2048-paired.json")),
    "sdpa-backends-s53": functools.partial(sdpa_backends_section, "2026-12-03-h200-s53-sdpa-backends.json"),
    "confirm-rounds-s53": functools.partial(confirm_rounds_section, "2026-12-03-h200-s53-confirm-rounds.json"),
    "paired-goal-s53": functools.partial(paired_goal_section, 1.1,
                                         ("a", "the compile workers fixed", "2026-12-03-h200-s53-layers-m1-m128.json")),
    "region-ab-s51": functools.partial(region_ab_section, "2026-12-03-h200-s51-region-ab.json",
                                         REGION_AB_LABELS,
        {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-03",
         "run": "call 2 of the fifty-first session: bf16, ours tuned `quick`, 80 paired turns"}),
    "paired-goal-s51": functools.partial(paired_goal_section, 1.05,
                                         ("a", "the tree at the session's start",
                                          "2026-12-03-h200-s51-layers-m2048-paired-a.json"),
                                         ("b", "inputs from 64 KiB read in place",
                                          "2026-12-03-h200-s51-layers-m2048-paired-b.json")),
    "replay-ab-s47-early": functools.partial(replay_ab_section, "2026-12-02-h200-s47-replay-ab-early.json", {
        "chained": "PDL, each kernel waiting first (the tree as committed)",
        "early": "PDL, decode GEMMs loading their first weight tile before the wait (6f29384, reverted): NOTES 152"}),
    "gemv-ahead-s47": functools.partial(gemv_ahead_section, "2026-12-02-h200-s47-gemv-ahead.json",
                                        "2026-12-02-h200-s47-ceilings-b.json"),
    "tree-ab-s47": functools.partial(tree_ab_section, "2026-12-02-h200-s47-ab-ahead.json",
                                     "2026-12-02-h200-s47-ab-one-stage-llama32_3b.json",
                                     "2026-12-02-h200-s47-ab-one-stage-qwen25_7b.json"),
    "call-goal-s46": functools.partial(
        call_goal_section, ("b", "before (2e497fe)", "2026-12-02-h200-s46-layers-m1-m128-b.json"),
        ("c", "after (NOTES 151)", "2026-12-02-h200-s46-layers-m1-c.json"),
        ("d", "after (NOTES 151)", "2026-12-02-h200-s46-layers-m1-d.json")),
    "host-ab-s46": functools.partial(host_ab_section, "2026-12-02-h200-s46-host-ab.json"),
    "ln-check-s45": functools.partial(ln_check_section, "2026-12-02-h200-s45-ln-check.json"),
    "ln-ab-s45": functools.partial(tree_ab_section, "2026-12-02-h200-s45-ln-ab-a.json",
                                   "2026-12-02-h200-s45-ln-ab-b.json"),
    "search-heat-s45": functools.partial(search_heat_section, "2026-12-02-h200-s45-search-heat-a.json",
                                         "2026-12-02-h200-s45-search-heat-b.json"),
    "tuner-ab-s44-a": functools.partial(tuner_ab_section, "2026-12-02-h200-s44-tuner-ab-a.json"),
    "tuner-ab-s44-b": functools.partial(tuner_ab_section, "2026-12-02-h200-s44-tuner-ab-b.json"),
    "tuner-ab-s44-c": functools.partial(tuner_ab_section, "2026-12-02-h200-s44-tuner-ab-c.json"),
    "in-layer-s44": functools.partial(in_layer_section, "2026-12-02-h200-s44-in-layer.json"),
    "tuner-clocks-s43": functools.partial(tuner_clocks_section, "2026-12-02-h200-s43-tuner-clocks.json"),
    "tuner-power-s43": functools.partial(tuner_power_section, "2026-12-02-h200-s43-tuner-power.json"),
    "gemms-quick-s43-a": functools.partial(gemms_section, "2026-12-02-h200-s43-gemms-quick-a.json"),
    "gemms-quick-s43-b": functools.partial(gemms_section, "2026-12-02-h200-s43-gemms-quick-b.json"),
    "layer-llama3-8b-s43": functools.partial(layer_section, "2026-12-02-h200-s43-layers-m2048.json", "layer_llama3_8b"),
    "layer-qwen25-7b-s43": functools.partial(layer_section, "2026-12-02-h200-s43-layers-m2048.json", "layer_qwen25_7b"),
    "layer-ab-s43": functools.partial(layer_ab_section, "2026-12-02-h200-s43-layer-ab.json"),
    "heat-s43": functools.partial(heat_section, "2026-12-02-h200-s43-heat.json"),
    "warm-start-s27": functools.partial(warm_start_section, "2026-11-28-h200-s27-generate.json"),
    "generation-s27": functools.partial(generation_section, "2026-11-28-h200-s27-generate.json"),
    "warm-start-s26": functools.partial(warm_start_section, "2026-11-28-h200-s26-generate-keep-traces.json"),
    **{f"warm-start-s26-256-{x}": functools.partial(warm_start_section, f"2026-11-28-h200-s26-generate-256-{x}.json")
       for x in "ab"},
    **{f"generation-s26-256-{x}": functools.partial(generation_section, f"2026-11-28-h200-s26-generate-256-{x}.json")
       for x in "ab"},
    **{f"block-{b}": functools.partial(block_section, b) for b in BLOCK_SOURCES},
    "impl-legend": legend_section,
    "goals": goals_section,
    "vs-eager": vs_eager_section,
    "decoder-regions": regions_section,
    "sweeps": sweeps_section,
    "profile-1": functools.partial(profile_section, 1),
    "profile-2048": functools.partial(profile_section, 2048),
    "smi-s4": smi_section,
    "tuning-study": tuning_study_section,
    "quick-tuning-s16": quick_tuning_section,
    "quick-tuning-s18": functools.partial(
        whole_space_replay_section, "2026-11-27-h100-s18-replay-tuning-gateup.json",
                                          [f"2026-11-27-h100-s18-tuning-study-gateup-part{i}of4.json" for i in range(4)]),
    "library-tuned": functools.partial(library_section, H200 + "library-tuned.json"),
    "library-untuned": functools.partial(library_section, H200 + "library-untuned.json",
                                         {"matmul", "apply_rotary_pos_emb", "partial_rotary_emb"}),
    "ep-moe": ep_moe_section,
    "ep-moe-s27": functools.partial(ep_moe_section, "2026-11-28-h200x4-s27-ep-moe.json"),
    "ep-moe-s36": functools.partial(ep_moe_section, "2026-11-29-h200x2-s36-ep-moe.json"),
    **{f"ep-moe-s9-{x}": functools.partial(ep_moe_section, f"2026-11-26-h100x4-s9-ep-moe-{x}.json")
       for x in ("a", "c-before", "c-after", "d-after", "e-128-tokens", "f-128-tokens-padded",
                 "g-4096-tokens-padded")},
    **{f"ep-moe-s17-{x}": functools.partial(ep_moe_section, f"2026-11-27-h100x4-s17-ep-moe-{x}.json")
       for x in ("a-4096", "b-128", "c-4096-graphs", "d-128-graphs", "e-probes", "f-4096-dedup", "g-128-dedup",
                 "i-4096-final", "j-128-final")},
    **{f"ep-moe-s19-{x}": functools.partial(ep_moe_section, f"2026-11-27-h100x4-s19-ep-moe-{x}.json")
       for x in ("old", "new")},
    **{f"ep-moe-s18-{x}": functools.partial(ep_moe_section, f"2026-11-27-h100x4-s18-ep-moe-{x}.json")
       for x in ("a-overlap",)},
    "moe-gemm-s17": functools.partial(moe_gemm_section, "2026-11-27-h100-s17-moe-gemm.json"),
    "moe-gemm-s20-two-acc": functools.partial(moe_gemm_section, "2026-11-28-h100-s20-moe-gemm-two-acc.json"),
    "moe-gemm-s20-one-acc": functools.partial(moe_gemm_section, "2026-11-28-h100-s20-moe-gemm-one-acc.json"),
    "moe-gemm-s17-tokens": functools.partial(moe_gemm_section, "2026-11-27-h100-s17-moe-gemm-tokens.json", False),
    **{f"generation-{x}": functools.partial(generation_section, f"2026-11-26-h100-s6-generate-{x}.json")
       for x in "cdefg"},
    **{f"generation-s7-{x}": functools.partial(generation_section, f"2026-11-26-h100-s7-generate-{x}.json")
       for x in "abcde"},
    **{f"generation-trace-s7-{x}": functools.partial(generation_trace_section, f"2026-11-26-h100-s7-generate-{x}.json")
       for x in "abcd"},
    **{f"generation-s9-{x}": functools.partial(generation_section, f"2026-11-26-h100-s9-generate-{x}.json")
       for x in "ab"},
    "generation-trace-s9-a": functools.partial(generation_trace_section, "2026-11-26-h100-s9-generate-a.json"),
    **{f"lengths-s10-{x}": functools.partial(lengths_section, f"2026-11-27-h100-s10-lengths-{x}.json")
       for x in ("a", "warm", "b")},
    "lengths-s11-a": functools.partial(lengths_section, "2026-11-27-h100-s11-lengths-a.json",
                                       "2026-11-27-h100-s11-lengths-a-old.json", "tree of 8fafe21"),
    "lengths-s11-b": functools.partial(lengths_section, "2026-11-27-h100-s11-lengths-b.json",
                                       "2026-11-27-h100-s11-lengths-b-old.json", "tree of 8fafe21"),
    "lengths-s11-c": functools.partial(lengths_section, "2026-11-27-h100-s11-lengths-c.json"),
    **{f"generation-s10-ab-{x}": functools.partial(generation_section, f"2026-11-27-h100-s10-generate-ab-{x}.json")
       for x in ("before", "after")},
    "generation-s10-64-tokens": functools.partial(generation_section, "2026-11-27-h100-s10-generate-64-tokens.json"),
    **{f"generation-s12-{x}": functools.partial(generation_section, f"2026-11-27-h100-s12-generate-{x}.json")
       for x in ("a", "b", "cold", "b8")},
    "generation-s12-c": functools.partial(generation_section, "2026-11-27-h100-s12-generate-c.json",
                                          "2026-11-27-h100-s12-generate-c-old.json", "tree of 77c4fad"),
    "generation-trace-s12-c": functools.partial(generation_trace_section, "2026-11-27-h100-s12-generate-c.json",
                                                "2026-11-27-h100-s12-generate-c-old.json", "tree of 77c4fad"),
    "generation-s13-a": functools.partial(generation_section, "2026-11-27-h100-s13-generate-a.json",
                                          "2026-11-27-h100-s13-generate-a-old.json", "tree of 86e9852"),
    "generation-trace-s13-a": functools.partial(generation_trace_section, "2026-11-27-h100-s13-generate-a.json",
                                                "2026-11-27-h100-s13-generate-a-old.json", "tree of 86e9852"),
    "generation-s13-p2048": functools.partial(generation_section, "2026-11-27-h100-s13-generate-p2048.json"),
    **{f"generation-s13-{x}": functools.partial(generation_section, f"2026-11-27-h100-s13-generate-{x}-graph-timing.json",
                                                f"2026-11-27-h100-s13-generate-{x}.json", "do_bench timing")
       for x in "de"},
    "decode-attention-s13": functools.partial(decode_attention_section, "2026-11-27-h100-s13-decode-attention.json",
                                              "2026-11-27-h100-s13-decode-attention-old.json", "tree of 86e9852"),
    "generation-s14-a": functools.partial(generation_section, "2026-11-27-h100-s14-generate-a.json",
                                          "2026-11-27-h100-s14-generate-a-old.json", "tree of 9a595c8"),
    "generation-trace-s14-a": functools.partial(generation_trace_section, "2026-11-27-h100-s14-generate-a.json",
                                                "2026-11-27-h100-s14-generate-a-old.json", "tree of 9a595c8"),
    "generation-s14-e": functools.partial(generation_section, "2026-11-27-h100-s14-generate-e.json"),
    "generation-s19-a": functools.partial(generation_section, "2026-11-27-h100-s19-generate-a.json"),
    "generation-s19-cold-tuning": functools.partial(cold_tuning_section, "2026-11-27-h100-s19-cold-tuning.json"),
    "cold-tuning-s24-a": functools.partial(cold_tuning_ab_section, [("2026-11-28-h200-s24-cold-tuning-a.json", "a: 75efddd")]),
    **{f"cold-tuning-s24-{x}": functools.partial(cold_tuning_ab_section, [
        (f"2026-11-28-h200-s24-cold-tuning-{x}-{tree}-layer_{b}.json", f"{x}: {label}")
        for b in ("llama3_8b", "qwen25_7b") for tree, label in (("new", "side by side"), ("old", "75efddd"))])
       for x in "bc"},
    "cold-tuning-s28": functools.partial(cold_tuning_together_section, [
        ("2026-11-28-h200-s28-cold-tuning-a-ahead-layer_llama3_8b.json", "a: first candidates ahead (before)"),
        ("2026-11-28-h200-s28-cold-tuning-a-together-layer_llama3_8b.json", "a: together"),
        ("2026-11-28-h200-s28-cold-tuning-a-one-by-one-layer_llama3_8b.json", "a: one by one"),
        ("2026-11-28-h200-s28-cold-tuning-b-together-layer_llama3_8b.json", "b: together"),
        ("2026-11-28-h200-s28-cold-tuning-b-one-by-one-layer_llama3_8b.json", "b: one by one"),
        ("2026-11-28-h200-s28-cold-tuning-b-one-by-one-layer_qwen25_7b.json", "b: one by one"),
        ("2026-11-28-h200-s28-cold-tuning-b-together-layer_qwen25_7b.json", "b: together"),
        ("2026-11-28-h200-s28-cold-tuning-c-together-layer_qwen25_7b-m1.json", "c: together"),
        ("2026-11-28-h200-s28-cold-tuning-c-one-by-one-layer_qwen25_7b-m1.json", "c: one by one")]),
    "generate-cold-s30": functools.partial(cold_generate_ab_section, [
        ("2026-11-29-h200-s30-generate-1-tma-on.json", "1: HEAD (bd893c0)"),
        ("2026-11-29-h200-s30-generate-1-tma-off.json", "1: HEAD, DLBLAS_GEMM_TMA=0"),
        ("2026-11-29-h200-s30-generate-1-edacf42.json", "1: edacf42"),
        ("2026-11-29-h200-s30-generate-1-tma-on-2.json", "1: HEAD again"),
        ("2026-11-29-h200-s30-generate-2-ours-a.json", "2: select fix (04ceace)"),
        ("2026-11-29-h200-s30-generate-2-ours-b.json", "2: select fix, again"),
        ("2026-11-29-h200-s30-generate-3-ours.json", "3: select fix, after the GPU tests")], decode=True, split=True),
    "generation-s30-hf-auto": functools.partial(generation_runs_section, [
        ("2026-11-29-h200-s30-generate-2-ours-a.json", "run 2, first"),
        ("2026-11-29-h200-s30-generate-2-hf-auto.json", "run 2, second"),
        ("2026-11-29-h200-s30-generate-2-ours-b.json", "run 2, third"),
        ("2026-11-29-h200-s30-generate-3-ours.json", "run 3, first"),
        ("2026-11-29-h200-s30-generate-3-hf-auto.json", "run 3, second")]),
    "decode-ab-s30": functools.partial(decode_ab_section, "2026-11-29-h200-s30-decode-ab.json"),
    "decode-ab-s31-llama-p2048": functools.partial(decode_ab_section, "2026-11-29-h200-s31-decode-ab-llama-p2048.json"),
    "decode-ab-s31-qwen3-p2048": functools.partial(decode_ab_section, "2026-11-29-h200-s31-decode-ab-qwen3-p2048.json"),
    "decode-ab-s31-phi3-p128": functools.partial(decode_ab_section, "2026-11-29-h200-s31-decode-ab-phi3-p128.json"),
    "decode-ab-s32-phi3-p128": functools.partial(decode_ab_section, "2026-11-29-h200-s32-decode-ab-phi3-p128.json"),
    "decode-ab-s32-llama-p128": functools.partial(decode_ab_section, "2026-11-29-h200-s32-decode-ab-llama-p128.json"),
    "decode-gemms-s32": functools.partial(decode_gemms_section, "2026-11-29-h200-s32-gemms-m1.json",
                                          "2026-11-29-h200-s32-ceilings.json"),
    "decode-trace-s32-phi3": functools.partial(decode_trace_section, "2026-11-29-h200-s32-decode-ab-trace-phi3-p128.json"),
    "decode-trace-s32-llama": functools.partial(decode_trace_section, "2026-11-29-h200-s32-decode-ab-trace-llama-p128.json"),
    "decode-ab-s32-llama-p128-gpu-timing": functools.partial(
        decode_ab_section, "2026-11-29-h200-s32-decode-ab-trace-llama-p128-gputiming.json"),
    "decode-trace-s32-llama-gpu-timing": functools.partial(
        decode_trace_section, "2026-11-29-h200-s32-decode-ab-trace-llama-p128-gputiming.json"),
    "decode-ab-s33-phi3-sliding": functools.partial(decode_ab_section, "2026-11-29-h200-s33-decode-ab-phi3-sliding-p128.json"),
    "decode-ab-s33-phi3-sliding-trace": functools.partial(
        decode_ab_section, "2026-11-29-h200-s33-decode-ab-trace-phi3-sliding-p128.json"),
    "decode-trace-s33-phi3-sliding": functools.partial(
        decode_trace_section, "2026-11-29-h200-s33-decode-ab-trace-phi3-sliding-p128.json"),
    "decode-ab-s35-llama-p128-before": functools.partial(
        decode_ab_section, "2026-11-29-h200-s35-decode-ab-trace-llama-p128-before.json"),
    "decode-trace-s35-llama-before": functools.partial(
        decode_trace_section, "2026-11-29-h200-s35-decode-ab-trace-llama-p128-before.json", 10),
    "decode-ab-s35-phi3-p128": functools.partial(decode_ab_section, "2026-11-29-h200-s35-decode-ab-phi3-p128.json"),
    "decode-ab-s36-stacked-trace": functools.partial(
        decode_ab_section, "2026-11-29-h200-s36-decode-ab-trace-stacked.json"),
    "decode-trace-s36-stacked": functools.partial(
        decode_trace_section, "2026-11-29-h200-s36-decode-ab-trace-stacked.json", 10),
    "decode-ab-s36-stacked": functools.partial(decode_ab_section, "2026-11-29-h200-s36-decode-ab-stacked.json"),
    "replay-ab-s37-prefetch-all": functools.partial(replay_ab_section, "2026-12-01-h200-s37-replay-ab-prefetch-all.json", {
        "plain": "no PDL", "chained": "PDL, each GEMM's whole weight slab prefetched into L2 before its wait, "
        "every kernel releasing the next at its start", "chained-noprefetch": "PDL as the tree before (item 47)"}),
    "replay-ab-s37-prefetch-shares": functools.partial(
        replay_ab_section, "2026-12-01-h200-s37-replay-ab-prefetch-shares.json", {
            "plain": "no PDL", "chained-noprefetch": "PDL, GEMMs releasing the next kernel after their K loop",
            "chained@0.25": "and each GEMM prefetching at most 1/4 of L2", "chained@0.5": "... at most 1/2 of L2",
            "chained@1.0": "... at most all of L2"}),
    "replay-ab-s37-chained": functools.partial(replay_ab_section, "2026-12-01-h200-s37-replay-ab-chained.json", {
        "plain": "`chained_launches=False`", "chained": "`chained_launches=True` (now the default): NOTES 124"}),
    "decode-ab-s37-chained": functools.partial(decode_ab_section, "2026-12-01-h200-s37-decode-ab-chained.json"),
    "gemm-loop-probe-s40": functools.partial(gemm_loop_probe_section, "2026-12-01-h200-s40-gemm-loop-probe.json"),
    "qwen3-qkv-s40": functools.partial(sweep_ab_section, "2026-12-01-h200-s40-qwen3-attention-old.json",
                                       "2026-12-01-h200-s40-qwen3-attention-new.json"),
    "split-twins-s41": functools.partial(split_twins_section, "2026-12-01-h200-s41-gemms-split-sweep.json"),
    "loop-forms-s41": functools.partial(loop_forms_ab_section, "2026-12-01-h200-s41-flatten-old.json",
                                        "2026-12-01-h200-s41-flatten-new.json"),
    "layer-llama32-3b-s41": functools.partial(layer_section, "2026-12-01-h200-s41-layers-m2048.json", "layer_llama32_3b"),
    "layer-qwen25-7b-s41": functools.partial(layer_section, "2026-12-01-h200-s41-layers-m2048.json", "layer_qwen25_7b"),
    "ncu-s41": functools.partial(ncu_section, "2026-12-01-h200-s41-ncu-qwen25_7b.txt.gz",
                                 "2026-12-01-h200-s41-ncu-llama3_8b.txt.gz"),
    "gluon-probe-s42": functools.partial(gluon_probe_section, "2026-12-02-h200-s42-gluon-probe.json"),
    "ws-twins-s42": functools.partial(ws_twins_section, "2026-12-02-h200-s42-ws-sweep-a.json",
                                      "2026-12-02-h200-s42-ws-sweep-c.json"),
    "gemms-quick-s42": functools.partial(gemms_section, "2026-12-02-h200-s42-gemms-quick.json"),
    "gemms-m1-s42": functools.partial(gemms_section, "2026-12-02-h200-s42-gemms-m1.json"),
    "attention-masked-s40": functools.partial(attention_ab_section, "2026-12-01-h200-s40-qwen3-attention-old.json",
                                              "2026-12-01-h200-s40-qwen3-attention-new.json"),
    "rotary-table-s39": functools.partial(rotary_table_section, "2026-12-01-h200-s39-qkv-table-a-old.json",
                                          "2026-12-01-h200-s39-qkv-table-a-new.json"),
    "gemms-s39-rotary-ab": functools.partial(gemms_ab_section, "2026-12-01-h200-s39-gemms-rotary-old.json",
                                             "2026-12-01-h200-s39-gemms-rotary-new.json"),
    "replay-ab-s39-table": functools.partial(replay_ab_section, "2026-12-01-h200-s39-replay-table.json", {
        "before": "cos and sin loaded per column (the tree before)",
        "after": "a table shared by every head read once per tile (NOTES 131)"}),
    "block-layer-llama3_8b-m1-128-h200-s39": functools.partial(
        layer_section, "2026-12-01-h200-s39-layers-m1-m128.json", "layer_llama3_8b"),
    "block-layer-qwen25_7b-m1-128-h200-s39": functools.partial(
        layer_section, "2026-12-01-h200-s39-layers-m1-m128.json", "layer_qwen25_7b"),
    "replay-ab-s38-qwen3-chained": functools.partial(replay_ab_section, "2026-12-01-h200-s38-replay-ab-qwen3-chained.json", {
        "plain": "`chained_launches=False`", "chained": "`chained_launches=True` (the default)"}),
    "replay-ab-s38-qwen3-norm-rotary": functools.partial(
        replay_ab_section, "2026-12-01-h200-s38-replay-ab-qwen3-norm-rotary.json", {
            "before": "the tree before: per-head norm and rotary as two row kernels each for q and k",
            "after": "the norm and its rotary in one row kernel (NOTES 127)"}),
    "decode-ab-s38-trace": functools.partial(decode_ab_section, "2026-12-01-h200-s38-decode-ab-trace.json"),
    "replay-ab-s38-qwen3-cache-write": functools.partial(
        replay_ab_section, "2026-12-01-h200-s38-replay-ab-qwen3-cache-write.json", {
            "before": "norm and rotary in one row kernel, k's cache write in torch (`index_copy_`)",
            "after": "k's cache write in its row kernel too (NOTES 128)"}),
    "decode-ab-s35-llama-p128-guards": functools.partial(
        decode_ab_section, "2026-11-29-h200-s35-decode-ab-trace-llama-p128-guards.json"),
    "decode-trace-s35-llama-guards": functools.partial(
        decode_trace_section, "2026-11-29-h200-s35-decode-ab-trace-llama-p128-guards.json", 10),
    "gemv-study-s34": functools.partial(gemv_study_section, "2026-11-29-h200-s34-gemv-study.json",
                                        "2026-11-29-h200-s34-ceilings.json"),
    "timing-study-s32": functools.partial(timing_study_section, "2026-11-29-h200-s32-timing-study.json"),
    "timing-study-s32-gpu-timing": functools.partial(timing_study_section,
                                                     "2026-11-29-h200-s32-timing-study-llama-gputiming.json"),
    "generate-cold-s29": functools.partial(cold_generate_ab_section, [
        ("2026-11-28-h200-s29-generate-cold-1-racing.json", "1: racing (b39c104's tuning)"),
        ("2026-11-28-h200-s29-generate-cold-1-small-share.json", "1: small share (edacf42)"),
        ("2026-11-28-h200-s29-generate-cold-1-before-small-share.json", "1: before small share (443c673)"),
        ("2026-11-28-h200-s29-generate-cold-1-racing-2.json", "1: racing, again"),
        ("2026-11-28-h200-s29-generate-cold-2-racing.json", "2: racing (b39c104), after the GPU tests"),
        ("2026-11-28-h200-s29-generate-cold-4-new.json", "4: this session's end (e833adf), after the GPU tests"),
        ("2026-11-28-h200-s29-generate-cold-4-before.json", "4: edacf42"),
        ("2026-11-28-h200-s29-generate-cold-5-before.json", "5: edacf42"),
        ("2026-11-28-h200-s29-generate-cold-5-new.json", "5: this session's end (e833adf)")], decode=True, split=True),
    "generate-cold-s28": functools.partial(cold_generate_ab_section, [
        ("2026-11-28-h200-s28-generate-cold-ahead.json", "a: first candidates ahead (before)"),
        ("2026-11-28-h200-s28-generate-cold-together.json", "a: together"),
        ("2026-11-28-h200-s28-generate-kept.json", "d: together, keep_traces")], decode=True),
    "cold-tuning-s27": functools.partial(cold_tuning_workers_section, [
        ("2026-11-28-h200-s27-cold-tuning-off-layer_llama3_8b.json", "without compiling ahead"),
        ("2026-11-28-h200-s27-cold-tuning-on-layer_llama3_8b.json", "first rounds compiled ahead"),
        ("2026-11-28-h200-s27-cold-tuning-off-layer_qwen25_7b.json", "without compiling ahead")]),
    "cold-tuning-s25-a": functools.partial(cold_tuning_workers_section, [
        (f"2026-11-28-h200-s25-cold-tuning-a-{w}-layer_{b}.json", label)
        for b, ws in (("llama3_8b", ("w16", "w0")), ("qwen25_7b", ("w16",)))
        for w in ws for label in [{"w16": "a: 16 workers", "w0": "a: threads (none)"}[w]]]),
    "cold-tuning-s25-b": functools.partial(cold_tuning_workers_section, [
        ("2026-11-28-h200-s25-cold-tuning-b-b16-layer_llama3_8b.json", "b: workers, batches of 16"),
        ("2026-11-28-h200-s25-cold-tuning-b-b8-layer_llama3_8b.json", "b: workers, batches of 8"),
        ("2026-11-28-h200-s25-cold-tuning-b-b16-layer_qwen25_7b.json", "b: workers, batches of 16"),
        ("2026-11-28-h200-s25-cold-tuning-b-w0-layer_qwen25_7b.json", "b: threads, batches of 8")]),
    "generate-cold-s25": functools.partial(cold_generate_ab_section, [
        ("2026-11-28-h200-s25-generate-cold-w16.json", "16 compile workers"),
        ("2026-11-28-h200-s25-generate-cold-w0.json", "threads (DLBLAS_COMPILE_WORKERS=0)")]),
    "generation-s19-a-phases": functools.partial(first_call_phases_section, "2026-11-27-h100-s19-generate-a.json"),
    "generation-s14-p2048": functools.partial(generation_section, "2026-11-27-h100-s14-generate-p2048.json"),
    "generation-trace-s14-e": functools.partial(generation_trace_section, "2026-11-27-h100-s14-generate-e.json"),
    "launch-overhead-s14": functools.partial(launch_overhead_section, [
        ("2026-11-27-h100-s14-launch-overhead-b.json", "run b (no Launcher yet)"),
        ("2026-11-27-h100-s14-launch-overhead-c.json", "run c (first key)"),
        ("2026-11-27-h100-s14-launch-overhead-d.json", "run d (final key)")]),
    "decode-host-s14": functools.partial(decode_host_section, [
        ("2026-11-27-h100-s14-decode-host-b-direct.json", "b: ours, static, no CUDA graph, 38ff7fb (before the Launcher)"),
        ("2026-11-27-h100-s14-decode-host-b-eager-static.json", "b: eager, static"),
        ("2026-11-27-h100-s14-decode-host-b-dynamic.json", "b: ours, dynamic, 38ff7fb"),
        ("2026-11-27-h100-s14-decode-host-b-eager-dynamic.json", "b: eager, dynamic"),
        ("2026-11-27-h100-s14-decode-host-c-direct.json", "c: ours, static, no CUDA graph, first Launcher"),
        ("2026-11-27-h100-s14-decode-host-c-direct-rerun.json", "c: the same, a second process"),
        ("2026-11-27-h100-s14-decode-host-c-dynamic.json", "c: ours, dynamic, first Launcher"),
        ("2026-11-27-h100-s14-decode-host-c-dynamic-rerun.json", "c: the same, a second process"),
        ("2026-11-27-h100-s14-decode-host-c-eager-dynamic.json", "c: eager, dynamic"),
        ("2026-11-27-h100-s14-decode-host-d-direct.json", "d: ours, static, no CUDA graph, final Launcher"),
        ("2026-11-27-h100-s14-decode-host-d-old-direct.json", "d: the same, 38ff7fb (before the Launcher)"),
        ("2026-11-27-h100-s14-decode-host-d-dynamic.json", "d: ours, dynamic, final Launcher"),
        ("2026-11-27-h100-s14-decode-host-d-old-dynamic.json", "d: the same, 38ff7fb"),
        ("2026-11-27-h100-s14-decode-host-d-eager-dynamic.json", "d: eager, dynamic")]),
    "decode-host-s19": functools.partial(decode_host_section, [
        ("2026-11-27-h100-s19-decode-host-static.json", "ours, static"),
        ("2026-11-27-h100-s19-decode-host-dynamic.json", "ours, dynamic"),
        ("2026-11-27-h100-s19-decode-host-eager-dynamic.json", "eager, dynamic")]),
    "decode-host-s19-parts": functools.partial(host_parts_section, "2026-11-27-h100-s19-decode-host-static.json"),
    "decode-host-s13": functools.partial(decode_host_section, [
        ("2026-11-27-h100-s13-decode-host-old.json", "86e9852 (run b)"),
        ("2026-11-27-h100-s13-decode-host.json", "this session (run c)")]),
    "replay-s7": functools.partial(replay_section, "2026-11-26-h100-s7-profile-decoder-2048.json"),
    "block-decoder_layer-h100-s7": lambda: block_markdown(load_runs(
        ["2026-11-26-h100-s7-decoder-a.json", "2026-11-26-h100-s7-decoder-b.json"], "decoder_layer", merge=True),
        heading=False) + "\nRun a measured eager, inductor, max-autotune and ours (call times, eager's GPU time); run b, right "
        "after on the same machine, the -no-cudagraphs / -nocg modes whose GPU times stand for ours and max-autotune: "
        "`bench/results/2026-11-26-h100-s7-decoder-a.json`, `-b.json`.\n",
    "gemms-s8-a": functools.partial(gemms_section, "2026-11-26-h100-s8-gemms-a.json"),
    "gemms-s8-e": functools.partial(gemms_section, "2026-11-26-h100-s8-gemms-e.json"),
    "gemms-s8-f": functools.partial(gemms_section, "2026-11-26-h100-s8-gemms-f.json"),
    "gemms-s8-g": functools.partial(gemms_section, "2026-11-26-h100-s8-gemms-g.json"),
    "gemms-s15-sweep": functools.partial(persistent_sweep_section, "2026-11-27-h100-s15-gemms-a-sweep.json"),
    "gemms-s15-b": functools.partial(gemms_section, "2026-11-27-h100-s15-gemms-b.json"),
    "gemms-s15-c": functools.partial(gemms_section, "2026-11-27-h100-s15-gemms-c.json"),
    "gemms-s19-default": functools.partial(default_tile_section, "2026-11-27-h100-s19-gemms-default-old.json",
                                           "2026-11-27-h100-s19-gemms-default-new.json"),
    "gemms-s19-rotary-pairs": functools.partial(rotary_pairs_section, "2026-11-27-h100-s19-rotary-pairs.json"),
    "interleaved-glu-s20": functools.partial(interleaved_glu_section, "2026-11-28-h100-s20-interleaved-glu.json",
                                             "2026-11-28-h100-s20-interleaved-glu-b.json"),
    "gemms-s20-dual": functools.partial(dual_sweep_section, "2026-11-28-h100-s20-gemms-dual-old.json",
                                        "2026-11-28-h100-s20-gemms-dual-new.json"),
    "gemms-s20-rotary-pairs-tma": functools.partial(rotary_pairs_section, "2026-11-28-h100-s20-rotary-pairs-tma.json",
                                                    "pairs (4-D TMA descriptor)"),
    "gemms-s20-bm256": functools.partial(tile_sweep_section, "2026-11-28-h100-s20-gemms-bm256.json"),
    "gemms-s20-m1": functools.partial(decode_gemms_section, "2026-11-28-h100-s20-gemms-m1.json",
                                      "2026-11-28-h100-s20-ceilings-m1.json"),
    "gemms-s20-dual-small": functools.partial(default_tile_section, "2026-11-28-h100-s20-gemms-dual-small-old.json",
                                              "2026-11-28-h100-s20-gemms-dual-small-new.json"),
    "block-layer-nemo-h100-s20": functools.partial(layer_section, "2026-11-28-h100-s20-layer-qwen-nemo.json", "layer_mistral_nemo_12b"),
    "block-layer-llama3_8b-h100-s20": functools.partial(layer_section, "2026-11-28-h100-s20-layer-llama3_8b.json", "layer_llama3_8b"),
    "block-layer-deepseek_v3-h100-s21": functools.partial(layer_section, "2026-11-28-h100-s21-layer-deepseek_v3_dense.json", "layer_deepseek_v3_dense"),
    "attention-dims-s22": functools.partial(
        attention_dims_section, ("a", "2026-11-28-h100-s22-attention-dims-a-new.json"),
        ("a", "2026-11-28-h100-s22-attention-dims-a-old.json")),
    "attention-dims-s22-space": functools.partial(
        attention_dims_section, ("d", "2026-11-28-h100-s22-attention-dims-d-space-new.json"),
        ("d", "2026-11-28-h100-s22-attention-dims-d-space-old.json"),
        ("f", "2026-11-28-h100-s22-attention-dims-f-final.json")),
    "attention-sweep-s22": functools.partial(attention_sweep_section, "2026-11-28-h100-s22-attention-sweep.json"),
    "block-layer-deepseek_v3-h100-s22": functools.partial(layer_section, "2026-11-28-h100-s22-layer-deepseek_v3_dense-new.json", "layer_deepseek_v3_dense"),
    "block-layer-deepseek_v3-old-h100-s22": functools.partial(layer_section, "2026-11-28-h100-s22-layer-deepseek_v3_dense-old.json", "layer_deepseek_v3_dense"),
    "block-layer-deepseek_v3-h200-s23-a": functools.partial(layer_section, "2026-11-28-h200-s23-layer-deepseek_v3_dense-a.json", "layer_deepseek_v3_dense"),
    "block-layer-deepseek_v3-h200-s23-e-new": functools.partial(layer_section, "2026-11-28-h200-s23-layer-deepseek_v3_dense-e-new.json", "layer_deepseek_v3_dense"),
    "block-layer-deepseek_v3-h200-s23-e-old": functools.partial(layer_section, "2026-11-28-h200-s23-layer-deepseek_v3_dense-e-old.json", "layer_deepseek_v3_dense"),
    "block-layer-deepseek_v3-small-h100-s21": functools.partial(layer_section, "2026-11-28-h100-s21-layer-deepseek_v3_dense-m1-128.json", "layer_deepseek_v3_dense"),
    "gemms-s19-rotary-pieces": functools.partial(rotary_pieces_section,
                                                 "2026-11-27-h100-s19-gemms-rotary-b-ablate-pairs.json"),
    "gemms-s19-rotary-split": functools.partial(rotary_split_section, "2026-11-27-h100-s19-gemms-rotary-a-old.json",
                                                "2026-11-27-h100-s19-gemms-rotary-a-split-x-only.json"),
    "block-layer-llama3_8b-h100-s8-b": functools.partial(layer_section, "2026-11-26-h100-s8-layer-llama3_8b-b.json", "layer_llama3_8b"),
    "gemms-s9-qwen3": functools.partial(gemms_section, "2026-11-26-h100-s9-gemms-qwen3.json"),
    "block-layer-qwen3_8b-h100-s9": functools.partial(layer_section, "2026-11-26-h100-s9-layer-qwen3_8b.json", "layer_qwen3_8b"),
    "block-layer-qwen3_8b-m1-h100-s9": functools.partial(layer_section, "2026-11-26-h100-s9-layer-qwen3_8b-m1-a-norm-apart.json", "layer_qwen3_8b"),
    "block-layer-llama3_8b-h100-s8": functools.partial(layer_section, "2026-11-26-h100-s8-layer-llama3_8b.json", "layer_llama3_8b"),
}  # fmt: skip

MARK = re.compile(r"^<!-- report:(?P<name>[\w-]+) (?P<end>begin|end) -->$")


def split_doc(text: str) -> list[tuple[str | None, str]]:
    """[(None, prose) | (name, generated body)] in order; raises ValueError on unbalanced markers."""
    parts: list[tuple[str | None, str]] = []
    buf: list[str] = []
    current = None
    for line in text.splitlines(keepends=True):
        m = MARK.match(line.rstrip("\n"))
        if m and m["end"] == "begin":
            if current is not None:
                raise ValueError(f"section {m['name']} begins inside section {current}")
            parts.append((None, "".join(buf) + line))
            buf, current = [], m["name"]
        elif m:
            if m["name"] != current:
                raise ValueError(f"end of section {m['name']} where {current} is open")
            parts.append((current, "".join(buf)))
            buf, current = [line], None
        else:
            buf.append(line)
    if current is not None:
        raise ValueError(f"section {current} is not closed")
    parts.append((None, "".join(buf)))
    return parts


def render(name: str) -> str:
    if name not in SECTIONS:
        raise KeyError(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")
    return "\n" + SECTIONS[name]().rstrip("\n") + "\n\n"


def regenerate(text: str) -> str:
    return "".join(body if name is None else render(name) for name, body in split_doc(text))


def problems(text: str) -> list[str]:
    """What --check reports: sections that differ from their JSON, and tables outside any section."""
    out = []
    for name, body in split_doc(text):
        if name is None:
            for line in body.splitlines():
                if line.lstrip().startswith("|"):
                    out.append(f"a table outside the generated sections (only bench/report.py writes tables): "
                               f"{line[:80]}")
                    break
        elif body != render(name):
            out.append(f"section {name} differs from what its JSON gives (run: python bench/report.py --write)")
    return out


# ------------------------------------------------------------------------------------------------- plots


def _time(md: dict, mode: str, metric: str) -> float | None:
    return gpu_of(md, mode) if metric == "gpu" else md.get(mode, {}).get("call_us")


def plots(table: dict, out_dir: str) -> list[str]:
    """speedup_gpu.png and speedup_call.png: ours over eager and over the best Inductor mode, per block."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    blocks = list(dict.fromkeys(b for b, _ in table))
    for metric, what in (("gpu", "GPU time"), ("call", "call time")):
        fig, axes = plt.subplots(1, len(blocks), figsize=(4.2 * len(blocks), 3.6), squeeze=False)
        for ax, block in zip(axes[0], blocks):
            ms = sorted(m for b, m in table if b == block)
            for label, modes in (("eager", ["eager"]), ("best Inductor", INDUCTOR)):
                ys = []
                for m in ms:
                    md = table[(block, m)]["modes"]
                    ours = _time(md, "ours", metric)
                    base = [t for c in modes if (t := _time(md, c, metric))]
                    ys.append(min(base) / ours if ours and base else float("nan"))
                ax.plot(ms, ys, marker="o", label=f"vs {label}")
            ax.axhline(1.0, color="gray", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ms, [str(m) for m in ms])
            ax.set_title(block)
            ax.set_xlabel("tokens (M)")
            ax.set_ylabel(f"speedup of ours ({what})")
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"speedup_{metric}.png")
        fig.savefig(path, dpi=110)
        paths.append(path)
        plt.close(fig)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="*", help="bench/run.py JSON files: print (or --md) their block tables")
    p.add_argument("--doc", default=DOC, help="the markdown file with marked sections (default BENCHMARKS.md)")
    p.add_argument("--write", action="store_true", help="regenerate every marked section of --doc")
    p.add_argument("--check", action="store_true", help="exit 1 if --doc differs from what the JSON gives")
    p.add_argument("--section", help="print one section")
    p.add_argument("--list", action="store_true", help="list the section names")
    p.add_argument("--md", default=None)
    p.add_argument("--plots", default=None)
    a = p.parse_args(argv)
    if a.list:
        print("\n".join(SECTIONS))
        return 0
    if a.section:
        print(SECTIONS[a.section]())
        return 0
    if a.write or a.check:
        with open(a.doc) as f:
            text = f.read()
        if a.check:
            found = problems(text)
            print("\n".join(found) if found else f"{a.doc}: every table matches bench/results/")
            return 1 if found else 0
        new = regenerate(text)
        if new != text:
            with open(a.doc, "w") as f:
                f.write(new)
        print(f"{a.doc}: {sum(1 for n, _ in split_doc(new) if n)} sections written")
    if a.results:
        text = block_markdown(load_runs(a.results))
        if a.md:
            with open(a.md, "w") as f:
                f.write(text)
        else:
            print(text)
    if a.plots:
        print("\n".join(plots(load_runs(a.results) if a.results else all_blocks(), a.plots)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
