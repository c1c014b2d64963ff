"""Turn bench/run.py results into markdown tables and PNG plots.

    python bench/report.py RESULTS.json [RESULTS2.json ...] --md OUT.md --plots DIR

One table per block: for each M, the floor and every mode's GPU time and call time (µs), then our
speedups over eager and over the best Inductor mode. Rows come from the last run that measured them;
every row of a table comes from one run (one process on one GPU), so ratios are same-run ratios.
"""

from __future__ import annotations

import argparse
import json
import os

BASELINES = ["eager", "inductor", "max-autotune-no-cudagraphs", "max-autotune"]
INDUCTOR = ["inductor", "max-autotune-no-cudagraphs", "max-autotune"]


def load(paths: list[str]) -> dict[tuple[str, int], dict]:
    """(block, M) -> {"meta": ..., "modes": {mode: row}}, the last run that measured the pair wins."""
    table: dict[tuple[str, int], dict] = {}
    for path in paths:
        for run in json.load(open(path))["runs"]:
            by_pair: dict[tuple[str, int], dict] = {}
            for row in run["rows"]:
                by_pair.setdefault((row["block"], row["M"]), {})[row["mode"]] = row
            for pair, modes in by_pair.items():
                table[pair] = {"meta": run["meta"], "modes": modes, "source": os.path.basename(path)}
    return table


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def gpu_of(modes: dict, mode: str) -> float | None:
    """GPU time; modes that replay their own CUDA graph have that of the same kernels without it."""
    other = {"ours": "ours-nocg", "max-autotune": "max-autotune-no-cudagraphs"}.get(mode, mode)
    return modes.get(other, {}).get("gpu_us")


def markdown(table: dict) -> str:
    out = []
    blocks = sorted({b for b, _ in table}, key=lambda b: list(dict.fromkeys(b for b, _ in table)).index(b))
    for block in blocks:
        ms = sorted(m for b, m in table if b == block)
        first = table[(block, ms[0])]
        meta = first["meta"]
        out.append(f"### {block}\n")
        sources = ", ".join(f"`{s}`" for s in dict.fromkeys(table[(block, m)]["source"] for m in ms))
        out.append(f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['dtype']}, ours tuned `{meta['tune']}`, "
                   f"{meta['date']} (sources in `bench/results/`, by M: {sources})\n")  # fmt: skip
        cols = [m for m in BASELINES + ["ours"] if any(m in table[(block, x)]["modes"] for x in ms)]
        out.append("| M | floor | " + " | ".join(f"{c} GPU / call" for c in cols) + " | ours vs eager (GPU) | ours vs best Inductor (GPU / call) | ours rel. err |")
        out.append("|" + "---|" * (len(cols) + 5))
        for m in ms:
            modes = table[(block, m)]["modes"]
            cells = []
            for c in cols:
                row = modes.get(c, {})
                if "error" in row:
                    cells.append("error")
                else:
                    cells.append(f"{_fmt(gpu_of(modes, c))} / {_fmt(row.get('call_us'))}")
            floor = next(iter(modes.values()))["floor_us"]
            ours_gpu, ours_call = gpu_of(modes, "ours"), modes.get("ours", {}).get("call_us")
            eager_gpu = gpu_of(modes, "eager")
            ind_gpu = [g for c in INDUCTOR if (g := gpu_of(modes, c)) is not None]
            ind_call = [r["call_us"] for c in INDUCTOR if (r := modes.get(c)) and "call_us" in r]
            vs_eager = f"{eager_gpu / ours_gpu:.2f}x" if ours_gpu and eager_gpu else "–"
            vs_ind = (f"{min(ind_gpu) / ours_gpu:.2f}x / {min(ind_call) / ours_call:.2f}x"
                      if ours_gpu and ind_gpu and ours_call and ind_call else "–")  # fmt: skip
            err = modes.get("ours", modes.get("ours-nocg", {})).get("rel_err")
            out.append(f"| {m} | {_fmt(floor)} | " + " | ".join(cells) + f" | {vs_eager} | {vs_ind} | {err:.1e} |" if err is not None
                       else f"| {m} | {_fmt(floor)} | " + " | ".join(cells) + f" | {vs_eager} | {vs_ind} | – |")  # fmt: skip
        out.append("")
    return "\n".join(out)


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
    p = argparse.ArgumentParser()
    p.add_argument("results", nargs="+")
    p.add_argument("--md", default=None)
    p.add_argument("--plots", default=None)
    a = p.parse_args(argv)
    table = load(a.results)
    text = markdown(table)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    else:
        print(text)
    if a.plots:
        print("\n".join(plots(table, a.plots)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
