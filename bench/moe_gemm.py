"""fused_moe's two implementations against the torch loop over experts and the GEMM floor (issue 21).

    python bench/moe_gemm.py --out OUT [--quick]                      # one CUDA GPU, bf16; under 3 minutes on H100
    TRITON_INTERPRET=1 python bench/moe_gemm.py --out OUT --smoke     # CPU, float32, tiny shapes: checks the paths

Writes OUT/moe_gemm.json and OUT/moe_gemm.md and prints the markdown tables. Layers: Mixtral-like (E=8, H=4096,
I=14336, top-2) and DeepSeek-like (E=64, H=2048, I=1408, top-6), weights randn / sqrt(fan_in) (~unit-variance
activations), routing the renormalized top-k of a softmax over random logits, at 4096 and 128 tokens (--tokens).
Rows:
  torch loop   fused_moe_reference in bf16: per expert torch.where (a host sync), three cuBLAS GEMMs, index_add_
  triton       fused_moe with IMPL=triton and the default tiles
  grouped      fused_moe with IMPL=grouped (torch._grouped_mm; the `ran` column says if it fell back to triton)
  floor        the routed FLOPs at the bf16 matmul rate measured in this run (torch.matmul, 8192^3)
ms: CUDA events around each call, the median of --iters calls after --warmup. TFLOP/s: routed FLOPs (kept pairs *
(2*H*2I + 2*I*H)) / ms. vs loop: the loop's ms / the row's (above 1 is faster). rel err: ||out - ref|| / ||ref||
against fused_moe_reference on float32 copies of the same inputs (TF32 off). `default` is the IMPL that
default_config picks at that shape. Then, at the largest token count, a sweep of the triton path's tile config: the
default and the --sweep first configs one SPACE step from it (one parameter moved to the next choice down or up),
to see whether the default is far from the best (each the median of max(10, iters / 2) calls); a config that fails
to compile or launch is recorded with its error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ep_moe import LAYERS, SMOKE_LAYERS  # noqa: E402  (the same two layers as the expert-parallel bench)

from dlblas_compiler.library.moe_gemm import (  # noqa: E402
    SPACE,
    default_config,
    fused_moe,
    fused_moe_reference,
    grouped_unsupported,
)

TOKENS, SMOKE_TOKENS = (4096, 128), (64, 8)
# the sweep moves one parameter at a time, in this order (both GEMMs' tiles first)
SWEEP_ORDER = ("BLOCK_M", "BLOCK_N", "DOWN_BLOCK_N", "BLOCK_K", "DOWN_BLOCK_K", "num_stages", "DOWN_num_stages",
               "num_warps", "DOWN_num_warps", "GROUP_M", "DOWN_GROUP_M")  # fmt: skip
BUDGET_S = 165.0  # the sweep is skipped past this (the whole run must stay under 3 minutes on an H100)


def _time_ms(fn: Callable[[], Any], iters: int, warmup: int, cuda: bool) -> float:
    """The median time of fn() in ms: CUDA events around each call on a GPU, the wall clock on CPU."""
    for _ in range(warmup):
        fn()
    if not cuda:
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _inputs(shape: dict[str, int], T: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    E, H, inter, k = shape["E"], shape["H"], shape["I"], shape["k"]
    x = torch.randn(T, H, device=device, dtype=dtype)
    w_gate_up = (torch.randn(E, 2 * inter, H, device=device) / H**0.5).to(dtype)
    w_down = (torch.randn(E, H, inter, device=device) / inter**0.5).to(dtype)
    weights, ids = torch.softmax(torch.randn(T, E, device=device), -1).topk(k, -1)
    return x, w_gate_up, w_down, ids, weights / weights.sum(-1, keepdim=True)


def _neighbors(default: dict[str, Any], count: int) -> list[tuple[str, dict[str, Any]]]:
    """(what changed, config) for the configs one SPACE step from `default`, in SWEEP_ORDER; the first `count`."""
    out = []
    for name in SWEEP_ORDER:
        choices = SPACE[name]
        i = choices.index(default[name]) if default[name] in choices else None
        for j in () if i is None else (i - 1, i + 1):
            if 0 <= j < len(choices):
                out.append((f"{name}={choices[j]}", {**default, name: choices[j]}))
    return out[:count]


def _shape_rows(
    name: str, shape: dict[str, int], T: int, args: argparse.Namespace, matmul_tflops: float, deadline: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    dtype, device = (torch.float32, "cpu") if args.smoke else (torch.bfloat16, "cuda")
    cuda = device == "cuda"
    x, w_gate_up, w_down, ids, weights = args_ = _inputs(shape, T, dtype, device)
    E, H, inter = shape["E"], shape["H"], shape["I"]
    pairs = int((ids >= 0).sum())
    flops = pairs * (2 * H * 2 * inter + 2 * inter * H)
    ref = fused_moe_reference(x.float(), w_gate_up.float(), w_down.float(), ids, weights.float())
    default = default_config(T * shape["k"], E, dtype, device)
    common = {"layer": name, "tokens": T, "rows_per_expert": round(pairs / E, 1), "gflop": flops / 1e9,
              "default": default["IMPL"]}  # fmt: skip

    def row(variant: str, fn: Callable[[], torch.Tensor], iters: int, **extra: Any) -> dict[str, Any]:
        r: dict[str, Any] = {**common, "variant": variant, **extra}
        try:
            r["rel_err"] = _rel_err(fn(), ref)
            r["ms"] = _time_ms(fn, iters, args.warmup, cuda)
            r["tflops"] = flops / r["ms"] / 1e9
        except Exception as e:  # a config that does not compile or launch (shared memory, ...) is a result too
            r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print(json.dumps(r), flush=True)
        return r

    why_not = grouped_unsupported(x, (w_gate_up, w_down))
    rows = [
        row("torch loop", lambda: fused_moe_reference(*args_), args.iters),
        row("triton", lambda: fused_moe(*args_, config={"IMPL": "triton"}), args.iters),
        row("grouped", lambda: fused_moe(*args_, config={"IMPL": "grouped"}), args.iters,
            ran="grouped" if why_not is None else f"triton ({why_not})"),
        {**common, "variant": "floor", "ms": flops / matmul_tflops / 1e9, "tflops": matmul_tflops},
    ]  # fmt: skip
    loop_ms = rows[0].get("ms")
    for r in rows:
        if loop_ms and r.get("ms"):
            r["vs_loop"] = loop_ms / r["ms"]

    sweep: list[dict[str, Any]] = []
    if T == max(args.tokens) and args.sweep:
        tiles = {**default, "IMPL": "triton"}
        for change, cfg in [("default", tiles), *_neighbors(tiles, args.sweep)]:
            if time.perf_counter() > deadline:
                sweep.append({**common, "variant": change, "error": "skipped: over the time budget"})
                continue
            sweep.append(row(change, lambda cfg=cfg: fused_moe(*args_, config=cfg), args.sweep_iters))
        base = sweep[0].get("ms")
        for r in sweep:
            if base and r.get("ms"):
                r["vs_default"] = base / r["ms"]
    return rows, sweep


def _matmul_tflops(args: argparse.Namespace) -> float:
    n, dtype, device = (256, torch.float32, "cpu") if args.smoke else (8192, torch.bfloat16, "cuda")
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    ms = _time_ms(lambda: torch.matmul(a, b), max(args.iters, 2), args.warmup, device == "cuda")
    return 2 * n**3 / ms / 1e9


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _markdown(env: dict[str, Any], rows: list[dict[str, Any]], sweep: list[dict[str, Any]]) -> str:
    out = [
        f"# fused_moe on {env['device']} ({env['dtype']}; torch {env['torch']}, triton {env['triton']}; "
        f"matmul {env['matmul_tflops']:.0f} TFLOP/s)",
        "",
        "| layer | tokens | rows/expert | variant | ms | TFLOP/s | vs loop | rel err | default | ran |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['layer']} | {r['tokens']} | {r['rows_per_expert']} | {r['variant']} | {_fmt(r.get('ms'), '.3f')} "
            f"| {_fmt(r.get('tflops'), '.3g')} | {_fmt(r.get('vs_loop'), '.2f')} | {_fmt(r.get('rel_err'), '.1e')} "
            f"| {r['default']} | {r.get('ran', r.get('error', ''))} |"
        )
    if sweep:
        out += [
            "",
            "Triton tile sweep (IMPL=triton; one parameter moved from the default):",
            "",
            "| layer | tokens | config | ms | TFLOP/s | vs default | rel err | error |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sweep:
            out.append(
                f"| {r['layer']} | {r['tokens']} | {r['variant']} | {_fmt(r.get('ms'), '.3f')} "
                f"| {_fmt(r.get('tflops'), '.3g')} | {_fmt(r.get('vs_default'), '.2f')} "
                f"| {_fmt(r.get('rel_err'), '.1e')} | {r.get('error', '')} |"
            )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--quick", action="store_true", help="fewer iterations, a 6-config sweep")
    parser.add_argument("--smoke", action="store_true", help="CPU, float32, tiny shapes (set TRITON_INTERPRET=1)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per row (20; quick 10; smoke 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (3; smoke 1)")
    parser.add_argument("--sweep", type=int, default=None, help="tile configs besides the default (12; quick 6)")
    parser.add_argument("--tokens", default=None, help="token counts, comma-separated (4096,128; smoke 64,8)")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("bench/moe_gemm.py needs a CUDA GPU (or --smoke)")
    args.iters = args.iters or (2 if args.smoke else 10 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    args.sweep = args.sweep if args.sweep is not None else (2 if args.smoke else 6 if args.quick else 12)
    args.sweep_iters = max(2, args.iters // 2) if args.smoke else max(10, args.iters // 2)
    args.tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else SMOKE_TOKENS if args.smoke else TOKENS
    deadline = time.perf_counter() + BUDGET_S
    torch.manual_seed(0)

    matmul_tflops = _matmul_tflops(args)
    rows, sweep = [], []
    for name, shape in (SMOKE_LAYERS if args.smoke else LAYERS).items():
        for T in args.tokens:
            shape_rows, shape_sweep = _shape_rows(name, shape, T, args, matmul_tflops, deadline)
            rows += shape_rows
            sweep += shape_sweep
        if not args.smoke:
            torch.cuda.empty_cache()
    env = {
        "device": "CPU (smoke: interpreter, tiny shapes)" if args.smoke else torch.cuda.get_device_name(),
        "capability": None if args.smoke else ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "dtype": "float32" if args.smoke else "bfloat16",
        "matmul_tflops": matmul_tflops,
        "iters": args.iters,
        "warmup": args.warmup,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_gemm.json").write_text(json.dumps({"env": env, "rows": rows, "sweep": sweep}, indent=1))
    table = _markdown(env, rows, sweep)
    (out / "moe_gemm.md").write_text(table)
    print(table)
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
