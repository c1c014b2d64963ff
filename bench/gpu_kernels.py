"""GPU checks and timings of the library kernels: topk_gating, fused_moe, fp8_gemm.

    python bench/gpu_kernels.py OUTDIR      # writes OUTDIR/gpu_kernels.json and OUTDIR/gpu_kernels.md

Each case checks the kernel against a float64 reference (relative error ||out - ref|| / ||ref||; fused_moe on its
first 256 tokens) and times it (triton.testing.do_bench, median, in microseconds) against, in the same run on the
same GPU:
  topk_gating  torch eager (topk_gating_reference) and torch.compile of it; forward, and forward + backward;
  fused_moe    torch eager (the loop over experts, as in HF Mixtral) and the same loop with its expert body
               (the SwiGLU MLP) torch.compile'd with dynamic shapes: Dynamo graph-breaks at the data-dependent
               routing, so compiling the whole loop compiles nothing more;
  fp8_gemm     torch._scaled_mm (cuBLASLt fp8), bf16 cuBLAS (x @ w.T) and eager dequantize + matmul.
A failing case is recorded with its error and the run goes on; cases past a time budget are skipped.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

BUDGET_S = 165.0
REF_TOKENS = 256


def _us(fn: Callable[[], Any], grad_to_none: list[torch.Tensor] | None = None) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, grad_to_none=grad_to_none, return_mode="median")) * 1e3


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


class _Runner:
    """Runs cases under a time budget and collects one row per case."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.gpu = torch.cuda.get_device_name()
        self.deadline = time.perf_counter() + BUDGET_S

    def case(self, kernel: str, case: str, dtype: torch.dtype, fn: Callable[[], dict[str, Any]]) -> None:
        dtype_s = str(dtype).removeprefix("torch.")
        row: dict[str, Any] = {"kernel": kernel, "case": case, "dtype": dtype_s, "gpu": self.gpu}
        start = time.perf_counter()
        if start > self.deadline:
            row["error"] = "skipped: over the time budget"
        else:
            try:
                row.update(fn())
                ours, base = row.get("ours_us"), row.get("baselines_us", {})
                row["speedup"] = {name: round(t / ours, 3) for name, t in base.items() if ours and t}
            except Exception as e:  # one failing case must not stop the run
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
        row["wall_s"] = round(time.perf_counter() - start, 1)
        torch.cuda.empty_cache()
        self.rows.append(row)
        print(json.dumps(row), flush=True)


# ----------------------------------------------------------------------------------------------------- topk_gating


def _topk_case(T: int, E: int, k: int, dtype: torch.dtype, capacity: float | None, backward: bool) -> dict[str, Any]:
    from dlblas_compiler.kernels import topk_gating, topk_gating_reference

    logits = torch.randn(T, E, device="cuda", dtype=dtype)
    out, ref = topk_gating(logits, k, capacity), topk_gating_reference(logits.double(), k, capacity)
    result: dict[str, Any] = {
        "shape": f"T={T} E={E} k={k} capacity_factor={capacity}" + (" fwd+bwd" if backward else ""),
        "rel_err": _rel_err(out.weights, ref.weights),
        "aux_loss_rel_err": abs(out.aux_loss.item() - ref.aux_loss.item()) / ref.aux_loss.item(),
    }
    probs = torch.softmax(logits.double(), -1)  # bf16 logits tie often: check the choice is *a* top-k
    kept = out.ids >= 0
    chosen = probs.gather(1, out.ids.clamp(min=0).long())
    result["topk_choice_err"] = (chosen - probs.topk(k, -1).values)[kept].abs().max().item()
    compiled = torch.compile(topk_gating_reference)
    impls = {"ours": topk_gating, "eager": topk_gating_reference, "torch.compile": compiled}
    if not backward:
        times = {name: _us(lambda f=f: f(logits, k, capacity)) for name, f in impls.items()}
    else:
        x = logits.clone().requires_grad_(True)
        d_w = torch.randn(T, k, device="cuda", dtype=dtype)

        def step(f: Callable[..., Any]) -> None:
            r = f(x, k, capacity)
            ((r.weights * d_w).sum() + r.aux_loss).backward()

        times = {name: _us(lambda f=f: step(f), grad_to_none=[x]) for name, f in impls.items()}
    result["ours_us"] = times.pop("ours")
    result["baselines_us"] = times
    return result


# ------------------------------------------------------------------------------------------------------- fused_moe


def _expert_mlp(xs: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.silu(xs @ gate.T) * (xs @ up.T)) @ down.T


_compiled_mlp = torch.compile(_expert_mlp, dynamic=True)


def _moe_loop(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    mlp: Callable[..., torch.Tensor] = _expert_mlp,
) -> torch.Tensor:
    """fused_moe_reference's loop with an exchangeable expert body."""
    inter = w_gate_up.shape[1] // 2
    out = torch.zeros_like(x)
    for e in range(w_gate_up.shape[0]):
        tok, slot = torch.where(ids == e)
        if tok.numel():
            y = mlp(x[tok], w_gate_up[e, :inter], w_gate_up[e, inter:], w_down[e])
            out.index_add_(0, tok, y * weights[tok, slot, None].to(x.dtype))
    return out


_WEIGHTS: dict[tuple[int, int, int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _moe_weights(E: int, H: int, inter: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    key = (E, H, inter, dtype)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()  # one model's weights at a time
        w_gate_up = torch.randn(E, 2 * inter, H, device="cuda", dtype=dtype) / H**0.5
        w_down = torch.randn(E, H, inter, device="cuda", dtype=dtype) / inter**0.5
        _WEIGHTS[key] = (w_gate_up, w_down)
    return _WEIGHTS[key]


def _moe_case(T: int, E: int, H: int, inter: int, k: int, dtype: torch.dtype, compile_: bool) -> dict[str, Any]:
    from dlblas_compiler.kernels import fused_moe, fused_moe_reference

    w_gate_up, w_down = _moe_weights(E, H, inter, dtype)
    x = torch.randn(T, H, device="cuda", dtype=dtype)
    probs = torch.softmax(torch.randn(T, E, device="cuda"), -1)
    weights, ids = probs.topk(k, -1)
    weights = weights / weights.sum(-1, keepdim=True)
    args = (x, w_gate_up, w_down, ids, weights)
    n = min(T, REF_TOKENS)
    ref = fused_moe_reference(
        x[:n].double(), w_gate_up.double(), w_down.double(), ids[:n], weights[:n].double()
    )  # float64 on the first n tokens (each token's output depends only on itself)
    out, eager = fused_moe(*args), _moe_loop(*args)
    result: dict[str, Any] = {
        "shape": f"T={T} E={E} H={H} I={inter} k={k}",
        "rel_err": _rel_err(out[:n], ref),
        "baseline_rel_err": {"eager": _rel_err(eager[:n], ref)},
        "ours_us": _us(lambda: fused_moe(*args)),
        "baselines_us": {"eager": _us(lambda: _moe_loop(*args))},
    }
    if compile_:
        _moe_loop(*args, mlp=_compiled_mlp)
        result["baselines_us"]["torch.compile"] = _us(lambda: _moe_loop(*args, mlp=_compiled_mlp))
    return result


# -------------------------------------------------------------------------------------------------------- fp8_gemm


def _fp8_case(M: int, N: int, K: int, per_row: bool, out_dtype: torch.dtype, fast_accum: bool) -> dict[str, Any]:
    from dlblas_compiler.kernels import fp8_gemm, fp8_gemm_reference, quantize_fp8

    a = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda") / K**0.5
    (qa, sa), (qw, sw) = quantize_fp8(a, per_row), quantize_fp8(w, per_row)
    ref = fp8_gemm_reference(qa, qw, sa, sw, out_dtype=torch.float64)
    ours = fp8_gemm(qa, qw, sa, sw, out_dtype, fast_accum)
    result: dict[str, Any] = {
        "shape": f"M={M} N={N} K={K} {'per-row' if per_row else 'per-tensor'} scales"
        + (" fast_accum" if fast_accum else ""),
        "rel_err": _rel_err(ours, ref),
        "baseline_rel_err": {},
        "ours_us": _us(lambda: fp8_gemm(qa, qw, sa, sw, out_dtype, fast_accum)),
        "baselines_us": {},
    }
    scales = (sa[:, None], sw[None, :]) if per_row else (sa, sw)
    try:
        scaled = torch._scaled_mm(qa, qw.t(), *scales, out_dtype=out_dtype, use_fast_accum=fast_accum)
        result["baseline_rel_err"]["torch._scaled_mm"] = _rel_err(scaled, ref)
        result["baselines_us"]["torch._scaled_mm"] = _us(
            lambda: torch._scaled_mm(qa, qw.t(), *scales, out_dtype=out_dtype, use_fast_accum=fast_accum)
        )
    except RuntimeError as e:  # e.g. row-wise scales with a non-bf16 output
        result["baseline_rel_err"]["torch._scaled_mm"] = f"{type(e).__name__}: {str(e)[:200]}"
    a16, w16 = a.bfloat16(), w.bfloat16()
    result["baselines_us"]["cublas_bf16"] = _us(lambda: a16 @ w16.T)
    result["baselines_us"]["eager_dequant"] = _us(lambda: fp8_gemm_reference(qa, qw, sa, sw, out_dtype))
    return result


# ------------------------------------------------------------------------------------------------------------- run


def _markdown(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["kernel", "case", "dtype", "ours µs", "baselines µs", "speedup", "rel err", "note"]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        base = ", ".join(f"{k} {v:.1f}" for k, v in r.get("baselines_us", {}).items())
        speed = ", ".join(f"{k} {v:.2f}x" for k, v in r.get("speedup", {}).items())
        ours = f"{r['ours_us']:.1f}" if "ours_us" in r else ""
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else ""
        note = r.get("error", "")[:120]
        cells = [r["kernel"], r.get("shape", r["case"]), r["dtype"], ours, base, speed, err, note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(out_dir: str | Path) -> list[dict[str, Any]]:
    """Run every case on the current CUDA GPU; write gpu_kernels.json and gpu_kernels.md under out_dir."""
    import triton

    if not torch.cuda.is_available():
        raise RuntimeError("bench/gpu_kernels.py needs a CUDA GPU")
    torch.manual_seed(0)
    runner = _Runner()
    bf16, fp16 = torch.bfloat16, torch.float16
    for backward in (False, True):
        runner.case("topk_gating", "T4096-E64-k6", bf16, lambda b=backward: _topk_case(4096, 64, 6, bf16, None, b))
    runner.case("topk_gating", "T4096-E64-k6-cap1.25", bf16, lambda: _topk_case(4096, 64, 6, bf16, 1.25, False))
    runner.case("topk_gating", "T4096-E64-k6", fp16, lambda: _topk_case(4096, 64, 6, fp16, None, False))
    for T in (16, 512, 4096):
        runner.case("fused_moe", f"mixtral-T{T}", bf16, lambda T=T: _moe_case(T, 8, 4096, 14336, 2, bf16, True))
    runner.case("fused_moe", "mixtral-T512", fp16, lambda: _moe_case(512, 8, 4096, 14336, 2, fp16, False))
    runner.case("fused_moe", "deepseek-T4096", bf16, lambda: _moe_case(4096, 64, 2048, 1408, 6, bf16, True))
    _WEIGHTS.clear()
    for M in (16, 2048):
        for per_row in (False, True):
            runner.case("fp8_gemm", f"M{M}", bf16, lambda M=M, p=per_row: _fp8_case(M, 4096, 4096, p, bf16, False))
    runner.case("fp8_gemm", "M2048-fast", bf16, lambda: _fp8_case(2048, 4096, 4096, True, bf16, True))
    runner.case("fp8_gemm", "M2048-fp16", fp16, lambda: _fp8_case(2048, 4096, 4096, False, fp16, False))

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "gpu": runner.gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (out / "gpu_kernels.json").write_text(json.dumps({"env": env, "rows": runner.rows}, indent=1))
    header = f"# Library kernels on {env['gpu']} (torch {env['torch']}, triton {env['triton']}, {env['date']})"
    (out / "gpu_kernels.md").write_text(_markdown(runner.rows, header))
    return runner.rows


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/gpu_kernels.py OUTDIR")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    run(sys.argv[1])
