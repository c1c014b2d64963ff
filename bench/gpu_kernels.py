"""GPU checks and timings of the library kernels: topk_gating, fused_moe, fp8_gemm, and the kernels of issue #6
(matmul, rms_norm, add_rms_norm, silu_and_mul, rotary, ffn, flash_attention_v2, fused_rotary_and_fa).

    python bench/gpu_kernels.py OUTDIR      # writes OUTDIR/gpu_kernels.json and OUTDIR/gpu_kernels.md
    python bench/gpu_kernels.py OUTDIR --only matmul,attention --budget 300
    python bench/gpu_kernels.py OUTDIR --smoke   # CPU: the issue-#6 cases at tiny sizes under the Triton
                                                 # interpreter, fp32, one untimed-quality call each (checks the paths)

Each case checks the kernel against a float64 reference (relative error ||out - ref|| / ||ref||; fused_moe on its
first 256 tokens) and times it (triton.testing.do_bench, median, in microseconds) against, in the same run on the
same GPU:
  topk_gating  torch eager (topk_gating_reference) and torch.compile of it; forward, and forward + backward;
  fused_moe    torch eager (the loop over experts, as in HF Mixtral) and the same loop with its expert body
               (the SwiGLU MLP) torch.compile'd with dynamic shapes: Dynamo graph-breaks at the data-dependent
               routing, so compiling the whole loop compiles nothing more;
  fp8_gemm     torch._scaled_mm (cuBLASLt fp8), bf16 cuBLAS (x @ w.T) and eager dequantize + matmul.
  issue #6     at Llama-3-8B dims (H=4096, I=14336, 32 q / 8 kv heads, D=128; M=2048 tokens), each against torch
               eager (the op's torch reference: cuBLAS, F.scaled_dot_product_attention, ...) and torch.compile of
               it; matmul (4096^3 and 2048x14336x4096) one row per implementation (tiled = the GEMM template,
               persistent) against cuBLAS; flash attention also against SDPA forced to its flash backend;
               fused_rotary_and_fa also against the compiled (rotary row kernels + attention template) candidate.
               Every row carries floor_us, the roofline floor max(bytes / bandwidth, flops / peak) with the
               bandwidth and peak of bench/blocks.py (H100: 3.0 TB/s, 709 TFLOP/s).
A failing case is recorded with its error and the run goes on; cases past a time budget are skipped.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch

BUDGET_S = 420.0
REF_TOKENS = 256
GROUPS = ("topk_gating", "fused_moe", "fp8_gemm", "matmul", "norms", "rotary", "ffn", "attention")


def _us(fn: Callable[[], Any], grad_to_none: list[torch.Tensor] | None = None) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, grad_to_none=grad_to_none, return_mode="median")) * 1e3


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


class _Runner:
    """Runs cases under a time budget and collects one row per case."""

    def __init__(self, budget_s: float = BUDGET_S) -> None:
        self.rows: list[dict[str, Any]] = []
        self.gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)"
        self.deadline = time.perf_counter() + budget_s

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
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.rows.append(row)
        print(json.dumps(row), flush=True)


# ----------------------------------------------------------------------------------------------------- topk_gating


def _topk_case(T: int, E: int, k: int, dtype: torch.dtype, capacity: float | None, backward: bool) -> dict[str, Any]:
    from dlblas_compiler.library import topk_gating, topk_gating_reference

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
    from dlblas_compiler.library import fused_moe, fused_moe_reference

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
    from dlblas_compiler.library import fp8_gemm, fp8_gemm_reference, quantize_fp8

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


# ---------------------------------------------------------------------------------------------- issue #6 kernels

H, INTER, HQ, HK, HEAD_D = 4096, 14336, 32, 8, 128  # Llama-3-8B
_SMOKE = {"on": False}  # --smoke: CPU, tiny sizes, fp32, wall-clock of one call instead of do_bench


def _dev() -> str:
    return "cpu" if _SMOKE["on"] else "cuda"


def _time_us(fn: Callable[[], Any]) -> float:
    if not _SMOKE["on"]:
        return _us(fn)
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def _gpu_us(fn: Callable[[], Any]) -> float | None:
    """GPU time of one call (bench/run.py's gpu_time: CUDA-graph replay, L2 cleared); None if it cannot be
    captured."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import gpu_time

    try:
        return gpu_time(fn)
    except Exception:  # noqa: BLE001 - e.g. a host sync inside the call
        torch.cuda.synchronize()
        return None


def _floor_us(gpu: str, nbytes: float, flops: float) -> float:
    """The roofline floor with bench/blocks.py's bandwidth and peak for this GPU (H100 when unknown)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from blocks import floor_us

    return floor_us(gpu, nbytes, flops)


def _first(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _worst_err(out: Any, ref: Any) -> float:
    return max(_rel_err(o, r) for o, r in zip(_first(out), _first(ref), strict=True))


def _rand(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=_dev()) * scale).to(dtype)


def _lib_case(
    shape: str,
    ours: Callable[..., Any],
    args: tuple,
    reference: Callable[..., Any],
    nbytes: float,
    flops: float,
    others: dict[str, Callable[..., Any]] | None = None,
    compile_ref: bool = True,
) -> dict[str, Any]:
    """Check `ours(*args)` against `reference` on float64 copies of the args; time it, torch eager (`reference`),
    torch.compile of `reference` and the `others` on the same args; the roofline floor of (nbytes, flops)."""
    ref = reference(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
    result: dict[str, Any] = {"shape": shape, "rel_err": _worst_err(ours(*args), ref), "baseline_rel_err": {}}
    impls: dict[str, Callable[..., Any]] = {"eager": reference, **(others or {})}
    if compile_ref and not _SMOKE["on"]:
        impls["torch.compile"] = torch.compile(reference)
    for name, fn in impls.items():
        result["baseline_rel_err"][name] = _worst_err(fn(*args), ref)
    result["ours_us"] = _time_us(lambda: ours(*args))
    result["baselines_us"] = {name: _time_us(lambda fn=fn: fn(*args)) for name, fn in impls.items()}
    if not _SMOKE["on"]:  # GPU time: the call replayed from a CUDA graph (no Python in the number)
        result["ours_gpu_us"] = _gpu_us(lambda: ours(*args))
        result["baselines_gpu_us"] = {name: _gpu_us(lambda fn=fn: fn(*args)) for name, fn in impls.items()}
    gpu = "H100" if _SMOKE["on"] else torch.cuda.get_device_name()
    result["floor_us"] = round(_floor_us(gpu, nbytes, flops), 2)
    if result["ours_us"]:
        result["floor_fraction"] = round(result["floor_us"] / result["ours_us"], 3)
    return result


def _matmul_case(M: int, N: int, K: int, impl: str, dtype: torch.dtype) -> dict[str, Any]:
    from dlblas_compiler.library import get_op, list_ops, matmul_reference

    a, w = _rand(M, K, dtype=dtype), _rand(N, K, dtype=dtype, scale=K**-0.5)
    b = w.t()  # an nn.Linear weight's transpose: what every implementation accepts
    fn = next(i.fn for i in list_ops()["matmul"] if i.name == impl)
    e = a.element_size()
    result = _lib_case(f"M={M} N={N} K={K} ({impl})", fn, (a, b), matmul_reference, (M * K + K * N + M * N) * e,
                       2.0 * M * N * K)  # fmt: skip
    result["get_op_choice"] = next(i.name for i in list_ops()["matmul"] if i.fn is get_op("matmul", (a, b)))
    return result


def _norm_cases(runner: _Runner, dtype: torch.dtype, M: int, h: int, inter: int) -> None:
    from dlblas_compiler import kernels as K

    e = torch.empty((), dtype=dtype).element_size()
    x, r = _rand(M, h, dtype=dtype), _rand(M, h, dtype=dtype)
    w = 1 + _rand(h, dtype=dtype, scale=0.1)
    runner.case("rms_norm", f"M{M}", dtype, lambda: _lib_case(
        f"M={M} H={h}", K.rms_norm, (x, w, 1e-5), K.rms_norm_reference, (2 * M * h + h) * e, 4.0 * M * h))
    runner.case("add_rms_norm", f"M{M}", dtype, lambda: _lib_case(
        f"M={M} H={h}", K.add_rms_norm, (x, r, w, 1e-5), K.add_rms_norm_reference, (4 * M * h + h) * e, 5.0 * M * h))
    g = _rand(M, 2 * inter, dtype=dtype)
    runner.case("silu_and_mul", f"M{M}", dtype, lambda: _lib_case(
        f"M={M} I={inter}", K.silu_and_mul, (g,), K.silu_and_mul_reference, 3 * M * inter * e, 6.0 * M * inter))
    # fmt: skip


def _rotary_cases(runner: _Runner, dtype: torch.dtype, T: int, hq: int, hk: int, d: int) -> None:
    from dlblas_compiler import kernels as K

    e = torch.empty((), dtype=dtype).element_size()
    q, k = _rand(T, hq, d, dtype=dtype), _rand(T, hk, d, dtype=dtype)
    ang = _rand(T, d // 2, dtype=torch.float32, scale=3.0)
    for interleaved, r in ((False, d), (True, d), (False, d // 2)):
        rep = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat([t, t], -1))
        cos, sin = rep(ang[:, : r // 2].cos()).to(dtype), rep(ang[:, : r // 2].sin()).to(dtype)
        name = "apply_rotary_pos_emb" if r == d else "partial_rotary_emb"
        layout = "interleaved" if interleaved else "half-split"
        shape = f"T={T} Hq={hq} Hk={hk} D={d} R={r} {layout}"
        nbytes, flops = (2 * T * (hq + hk) * d + 2 * T * r) * e, 6.0 * T * (hq + hk) * d
        case = partial(_lib_case, shape, getattr(K, name), (q, k, cos, sin, interleaved),
                       K.apply_rotary_pos_emb_reference, nbytes, flops)  # fmt: skip
        runner.case(name, f"T{T}-{layout}-R{r}", dtype, case)


def _ffn_cases(runner: _Runner, dtype: torch.dtype, M: int, h: int, inter: int) -> None:
    from dlblas_compiler import kernels as K

    e = torch.empty((), dtype=dtype).element_size()
    x, nw = _rand(M, h, dtype=dtype), 1 + _rand(h, dtype=dtype, scale=0.1)
    wgu = _rand(2 * inter, h, dtype=dtype, scale=h**-0.5)
    wd = _rand(h, inter, dtype=dtype, scale=inter**-0.5)
    gu_flops, gu_bytes = 2.0 * M * h * 2 * inter, (M * h + 2 * inter * h + h + M * inter) * e
    runner.case("ffn", f"M{M}-norm-gate-up", dtype, lambda: _lib_case(
        f"M={M} H={h} I={inter} rmsnorm+gate/up+silu*up", K.ffn, (x, nw, wgu), K.ffn_reference, gu_bytes, gu_flops))
    runner.case("ffn", f"M{M}-mlp", dtype, lambda: _lib_case(
        f"M={M} H={h} I={inter} + down", K.ffn, (x, nw, wgu, wd), K.ffn_reference,
        gu_bytes + (h * inter + M * h - M * inter) * e, gu_flops + 2.0 * M * inter * h))  # fmt: skip


def _sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def _attention_cases(runner: _Runner, dtype: torch.dtype, B: int, S: int, hq: int, hk: int, dims: tuple) -> None:
    from dlblas_compiler import kernels as K

    e = torch.empty((), dtype=dtype).element_size()
    flash = {} if _SMOKE["on"] else {"sdpa_flash": _sdpa_flash}
    for d in dims:
        q, k, v = _rand(B, hq, S, d, dtype=dtype), _rand(B, hk, S, d, dtype=dtype), _rand(B, hk, S, d, dtype=dtype)
        ang = _rand(S, d // 2, dtype=torch.float32, scale=3.0)
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1).to(dtype), torch.cat([ang.sin(), ang.sin()], -1).to(dtype)
        nbytes = (2 * B * hq * S * d + 2 * B * hk * S * d) * e
        for causal in (True, False) if d == dims[-1] else (True,):
            flops = 4.0 * B * hq * S * S * d / (2 if causal else 1)
            tag = f"B{B}-S{S}-D{d}-{'causal' if causal else 'full'}"
            shape = f"B={B} Hq={hq} Hk={hk} S={S} D={d} {'causal' if causal else 'non-causal'}"
            case = partial(_lib_case, shape, K.flash_attention_v2, (q, k, v, causal), K.flash_attention_v2_reference,
                           nbytes, flops, flash)  # fmt: skip
            runner.case("flash_attention_v2", tag, dtype, case)
            if causal:
                case = partial(_lib_case, shape, K.fused_rotary_and_fa, (q, k, v, cos, sin, True),
                               K.fused_rotary_and_fa_reference, nbytes + 2 * S * d * e, flops,
                               {"compiled(rotary+fa)": K.fused_rotary_and_fa_compiled})  # fmt: skip
                runner.case("fused_rotary_and_fa", tag, dtype, case)


def _issue6_cases(runner: _Runner, groups: set[str]) -> None:
    """The issue-#6 kernels at Llama-3-8B dims (tiny ones under --smoke)."""
    smoke = _SMOKE["on"]
    dtype = torch.float32 if smoke else torch.bfloat16  # the interpreter's bf16 tl.dot is wrong
    M, h, inter, hq, hk, d, S = (8, 64, 48, 4, 2, 16, 20) if smoke else (2048, H, INTER, HQ, HK, HEAD_D, 2048)
    if "matmul" in groups:
        shapes = [(37, 40, 48)] if smoke else [(4096, 4096, 4096), (2048, 14336, 4096)]
        for m, n, k in shapes:
            for impl in ("tiled", "persistent"):
                runner.case("matmul", f"{m}x{n}x{k}-{impl}", dtype, lambda m=m, n=n, k=k, i=impl: _matmul_case(
                    m, n, k, i, dtype))  # fmt: skip
    if "norms" in groups:
        _norm_cases(runner, dtype, M, h, inter)
    if "rotary" in groups:
        _rotary_cases(runner, dtype, M, hq, hk, d)
    if "ffn" in groups:
        _ffn_cases(runner, dtype, M, h, inter)
    if "attention" in groups:
        _attention_cases(runner, dtype, 1, S, hq, hk, (64,) if smoke else (64, HEAD_D))


# ------------------------------------------------------------------------------------------------------------- run


def _markdown(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["kernel", "case", "dtype", "ours µs", "floor µs", "baselines µs", "speedup", "GPU µs: ours / baselines",
               "rel err", "note"]  # fmt: skip
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        base = ", ".join(f"{k} {v:.1f}" for k, v in r.get("baselines_us", {}).items())
        speed = ", ".join(f"{k} {v:.2f}x" for k, v in r.get("speedup", {}).items())
        ours = f"{r['ours_us']:.1f}" if "ours_us" in r else ""
        floor = f"{r['floor_us']:.1f}" if "floor_us" in r else ""
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else ""
        note = r.get("error", "")[:120] or (f"get_op picks {r['get_op_choice']}" if "get_op_choice" in r else "")
        gpu = ""
        if r.get("ours_gpu_us") is not None:
            gbase = ", ".join(f"{k} {v:.1f}" for k, v in r.get("baselines_gpu_us", {}).items() if v is not None)
            gpu = f"{r['ours_gpu_us']:.1f} / {gbase}"
        cells = [r["kernel"], r.get("shape", r["case"]), r["dtype"], ours, floor, base, speed, gpu, err, note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(
    out_dir: str | Path, only: set[str] | None = None, budget_s: float = BUDGET_S, smoke: bool = False
) -> list[dict[str, Any]]:
    """Run every case (of the `only` groups, see GROUPS) on the current CUDA GPU; write gpu_kernels.json and
    gpu_kernels.md under out_dir. `smoke`: the issue-#6 cases at tiny sizes on the CPU (Triton interpreter)."""
    import triton

    groups = set(GROUPS) if only is None else set(only)
    if unknown := groups - set(GROUPS):
        raise ValueError(f"unknown groups {sorted(unknown)}; known: {', '.join(GROUPS)}")
    _SMOKE["on"] = smoke
    if smoke:
        groups -= {"topk_gating", "fused_moe", "fp8_gemm"}
    elif not torch.cuda.is_available():
        raise RuntimeError("bench/gpu_kernels.py needs a CUDA GPU (or --smoke)")
    torch.manual_seed(0)
    runner = _Runner(budget_s)
    bf16, fp16 = torch.bfloat16, torch.float16
    if "topk_gating" in groups:
        for backward in (False, True):
            runner.case("topk_gating", "T4096-E64-k6", bf16, lambda b=backward: _topk_case(4096, 64, 6, bf16, None, b))
        runner.case("topk_gating", "T4096-E64-k6-cap1.25", bf16, lambda: _topk_case(4096, 64, 6, bf16, 1.25, False))
        runner.case("topk_gating", "T4096-E64-k6", fp16, lambda: _topk_case(4096, 64, 6, fp16, None, False))
    if "fused_moe" in groups:
        for T in (16, 512, 4096):
            runner.case("fused_moe", f"mixtral-T{T}", bf16, lambda T=T: _moe_case(T, 8, 4096, 14336, 2, bf16, True))
        runner.case("fused_moe", "mixtral-T512", fp16, lambda: _moe_case(512, 8, 4096, 14336, 2, fp16, False))
        runner.case("fused_moe", "deepseek-T4096", bf16, lambda: _moe_case(4096, 64, 2048, 1408, 6, bf16, True))
        _WEIGHTS.clear()
    if "fp8_gemm" in groups:
        for M in (16, 2048):
            for per_row in (False, True):
                runner.case("fp8_gemm", f"M{M}", bf16, lambda M=M, p=per_row: _fp8_case(M, 4096, 4096, p, bf16, False))
        runner.case("fp8_gemm", "M2048-fast", bf16, lambda: _fp8_case(2048, 4096, 4096, True, bf16, True))
        runner.case("fp8_gemm", "M2048-fp16", fp16, lambda: _fp8_case(2048, 4096, 4096, False, fp16, False))
    _issue6_cases(runner, groups)

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
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="where gpu_kernels.json and gpu_kernels.md are written")
    parser.add_argument("--only", help=f"comma-separated groups of cases (default all): {','.join(GROUPS)}")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds; later cases are skipped")
    parser.add_argument("--smoke", action="store_true", help="CPU: the issue-#6 cases at tiny sizes, fp32")
    opts = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    only = None if opts.only is None else {g.strip() for g in opts.only.split(",") if g.strip()}
    rows = run(opts.out_dir, only, opts.budget, opts.smoke)
    sys.exit(1 if opts.smoke and any("error" in r for r in rows) else 0)
