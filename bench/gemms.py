"""Every fused GEMM kernel of a compiled decoder layer against cuBLAS on the same GEMM shape (issue 19's goal).

    python bench/gemms.py --out OUT [--layers llama3_8b,qwen25_7b,...] [--tokens 2048] [--tune quick]
                          [--ablate] [--sweep]

For each decoder layer of bench/blocks.HF_LAYERS (published HF configurations, random weights) and token count,
the layer is compiled (`--tune`), called once (which tunes), and each region the GEMM template lowered is timed
with its tuned config, and `torch.matmul` of operands of the same shape ([M, K] x [K, N·streams], the dual
gate/up GEMM as one [M, K] x [K, 2I] product) beside it. Both are captured in a CUDA graph and replayed
(do_bench median, L2 cleared before each replay), so host launch overhead does not count. `ratio` is cuBLAS time
over kernel time: above 1 the fused kernel (which also does the region's norm, rotary, activation, residual and
layout stores) beats the bare cuBLAS GEMM. `impl` says what the compiled layer runs for that region (its kernel,
or the reference (cuBLAS and torch ops) where that measured faster).

`--ablate`: the norm→QKV→RoPE region of Llama-3-8B built up one piece at a time (bare GEMM; + norm prologue;
+ head split and [B, H, S, D] stores; + rotary; all), each compiled alone, same timing: where the time goes.
`--sweep`: also time a fixed list of configs on each region (the best is recorded), and the tuned config again
right before and after them (`kernel_us_in_sweep`: `kernel_us` is timed before the sweep's compiles, on a card in
another state, bench/NOTES.md 168); `--sweep-tiles 256x128,...`
only those tiles of it; `--sweep-splits`: also its persistent configs with the last wave split 2, 4 or 8 ways over K
(those the region's space accepts: where the split parts still fill one wave, bench/NOTES.md 138); `--sweep-ws`: only
its persistent configs, each with its warp-specialized (Gluon) twins (WS=1; WS=2 with the TMA epilogue, where the
region's space offers it), on the regions that have one (NOTES 144, 170).
`--sweep-outside '[{"BLOCK_M": 256, "BLOCK_N": 64}, ...]'` (with `--sweep`): these configs instead of the fixed
list, outside the tuner's space or not (each a K-loop config, persistent through TMA with 8 warps, `OUTSIDE_BASE`,
overridden by the given values; the region's NORM_PASS kept), launched without the space's check and their
violations recorded: to measure a tile before the space offers it.
`--with-op dl.rotary`: only the regions with that op.
`--ln`: also the user pattern LayerNorm→Linear(bias)→GELU (Phi-2's MLP dims) lowered to one generated GEMM kernel.
Writes OUT/gemms.json (appended per layer, so a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from blocks import BLOCKS, HF_LAYERS, _randn  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.models import RMSNorm, randomize_, rope_cos_sin, rotate_half  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.runtime.steps import RegionStep  # noqa: E402

SWEEP = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=1, GROUP_M=8, num_warps=w, num_stages=s, TMA=1, MM=0, NORM_PASS=p,
              PERSISTENT=pers, WS=0)
         for bm, bn, bk, w, s in [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4)]
         for pers in (0, 1) for p in (0, 1)]  # fmt: skip


TILES: set[str] = set()  # (--sweep-tiles)
OUTSIDE_BASE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=3, TMA=1, MM=0,
                    PERSISTENT=1, WS=0)
OUTSIDE: list[dict] = []  # (--sweep-outside)


def graph_of(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph (after a warm call)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def graph_time_us(fn) -> float:
    """do_bench median (µs) of one CUDA-graph replay of fn, L2 cleared before each replay."""
    return triton.testing.do_bench(graph_of(fn).replay, warmup=25, rep=200) * 1e3


def region_inputs(cm, args, kwargs) -> list[tuple[RegionStep, list]]:
    """Each GEMM-template region of the compiled module with the inputs it saw (the program rerun step by step)."""
    spec = cm._spec()
    flat = spec.captured.flatten(args, kwargs)
    env = spec.executor._env([flat[i] for i in spec.imported.arg_positions])
    prog = spec.executor
    found = []
    for s in prog.steps:
        if isinstance(s, RegionStep) and s.kernel is not None and "streams" in s.kernel.shape_key:  # GEMM template
            found.append((s, s.inputs(env)))
        s(env)
    return found


def operands(step: RegionStep, tensors: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The GEMM's A ([M, K]) and weight ([N·streams, K]) among the region's inputs, by the kernel's shape key."""
    key = step.kernel.shape_key
    m, n, k, ns = key["M"], key["N"], key["K"], key["streams"]
    a = next(t for t in tensors if isinstance(t, torch.Tensor) and t.shape[-1] == k and t.numel() == m * k)
    w = next(t for t in tensors if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == k and t.shape[0] >= n * ns)
    return a.reshape(m, k), w[: n * ns]


def time_regions(cm, args, kwargs, sweep: bool, with_op: str = "") -> list[dict]:
    rows = []
    with torch.no_grad():
        for step, tensors in region_inputs(cm, args, kwargs):
            if with_op and with_op not in {o.name for o in step.kernel.region.body_ops}:
                continue
            if sweep and any(cfg["WS"] for cfg in SWEEP) and f"{step.kernel.name}_ws(" not in step.kernel.source:
                continue  # (--sweep-ws: the regions with a warp-specialized kernel)
            c = step.choice
            key = step.kernel.shape_key
            a, w = operands(step, tensors)
            out = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
            cublas = graph_time_us(lambda: torch.matmul(a, w.t(), out=out))
            kernel = graph_time_us(lambda: step.launch(tensors, c.config))
            flops = 2.0 * a.shape[0] * a.shape[1] * w.shape[0]
            row = {"region": c.region, "ops": [o.name for o in step.kernel.region.body_ops],
                   "impl": c.impl, "config": c.config, "M": key["M"], "N": key["N"] * key["streams"], "K": key["K"],
                   "kernel_us": kernel, "cublas_us": cublas, "ratio": cublas / kernel,
                   "kernel_tflops": flops / kernel / 1e6, "cublas_tflops": flops / cublas / 1e6}  # fmt: skip
            if sweep:
                best, row["sweep"] = (kernel, c.config), []
                want = [o.float() for o in step.launch(tensors, c.config)]
                valid = [cfg for cfg in SWEEP if step.kernel.space.is_valid(cfg)
                         and (not TILES or f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}" in TILES)]
                valid += [{**OUTSIDE_BASE, "NORM_PASS": c.config["NORM_PASS"], **o} for o in OUTSIDE]
                compile_configs(step.kernel, step.compiled, tensors, valid)  # (in parallel, before timing)
                # the tuned config again, before and after the sweep: `kernel_us` was timed before the compiles, on a
                # card in another state (at its power limit a long GEMM's time moves ~6%, bench/NOTES.md 168)
                tuned = functools.partial(step.launch, tensors, c.config)
                row["kernel_us_in_sweep"] = [graph_time_us(tuned)]
                for cfg in valid:
                    try:
                        got = step.launch(tensors, cfg)
                        err = max(((g.float() - r).norm() / r.norm().clamp_min(1e-30)).item() for g, r in zip(got, want))
                        t = graph_time_us(lambda: step.launch(tensors, cfg))
                    except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                        print(f"    sweep {cfg}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        continue
                    outside = step.kernel.space.violations(cfg)
                    row["sweep"].append((cfg, t, err))
                    row.setdefault("sweep_outside", []).append(outside)  # (the space's violations, in step)
                    print(f"    sweep {t:8.1f} µs (rel. diff from the tuned config's output {err:.1e}) {cfg}"
                          f"{'  outside the space: ' + '; '.join(outside) if outside else ''}", flush=True)
                    best = min(best, (t, cfg), key=lambda b: b[0])
                row["kernel_us_in_sweep"].append(graph_time_us(tuned))
                print(f"    tuned config in the sweep's conditions: {row['kernel_us_in_sweep'][0]:8.1f} µs before, "
                      f"{row['kernel_us_in_sweep'][1]:8.1f} after", flush=True)
                row["sweep_best_us"], row["sweep_best_config"] = best
            print(f"  {c.region:10s} {c.impl:9s} M={row['M']} N={row['N']} K={row['K']}: kernel {kernel:8.1f} µs "
                  f"({row['kernel_tflops']:.0f} TFLOP/s), cuBLAS {cublas:8.1f} µs: {row['ratio']:.2f}x  {c.config}", flush=True)  # fmt: skip
            rows.append(row)
    return rows


def rotate_pairs(t):
    """GPT-J's rotary layout: the pairs (2j, 2j + 1) of each head."""
    return torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).flatten(-2)


class QKVPiece(nn.Module):
    """Llama-3-8B's norm→QKV→RoPE with pieces switched off (for --ablate)."""

    H, HQ, HK, D = 4096, 32, 8, 128

    def __init__(self, norm: bool, heads: bool, rope: bool, pairs: bool = False):
        super().__init__()
        self.use_norm, self.heads, self.rope, self.pairs = norm, heads, rope, pairs
        self.norm = RMSNorm(self.H, 1e-5)
        self.qkv = nn.Linear(self.H, (self.HQ + 2 * self.HK) * self.D, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        y = self.qkv(self.norm(x) if self.use_norm else x)
        if not self.heads:
            return y
        q, k, v = y.split([self.HQ * self.D, self.HK * self.D, self.HK * self.D], dim=-1)
        q = q.view(b, s, self.HQ, self.D).transpose(1, 2)
        k = k.view(b, s, self.HK, self.D).transpose(1, 2)
        v = v.view(b, s, self.HK, self.D).transpose(1, 2)
        if self.rope:
            c, sn = cos[None, None], sin[None, None]
            turn = rotate_pairs if self.pairs else rotate_half
            q, k = q * c + turn(q) * sn, k * c + turn(k) * sn
        return q, k, v


def ablate(m: int, tune: str, sweep: bool) -> list[dict]:
    rows = []
    for name, flags in [("gemm", (False, False, False)), ("norm+gemm", (True, False, False)),
                        ("gemm+heads", (False, True, False)), ("gemm+heads+rope", (False, True, True)),
                        ("norm+gemm+heads+rope", (True, True, True)),
                        ("gemm+heads+rope(pairs)", (False, True, True, True))]:  # fmt: skip
        mod = randomize_(QKVPiece(*flags)).to("cuda", torch.bfloat16).eval()
        x = _randn(1, m, QKVPiece.H, dtype=torch.bfloat16, device="cuda", seed=1)
        cos, sin = rope_cos_sin(m, QKVPiece.D, 500000.0, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune=tune, cuda_graphs=False, prefer_kernels=True)
        with torch.no_grad():
            cm(x, cos, sin)
        print(f"ablate {name} M={m}", flush=True)
        for r in time_regions(cm, (x, cos, sin), {}, sweep):
            rows.append({"piece": name, **r})
    return rows


class LNLinearGelu(nn.Module):
    """LayerNorm → Linear(bias) → GELU (a GPT-2 / Phi-2 MLP up-projection), for the user pattern of --ln."""

    def __init__(self, h: int, n: int):
        super().__init__()
        self.ln, self.proj = nn.LayerNorm(h), nn.Linear(h, n)

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(self.ln(x)), approximate="tanh")


def ln_linear_gelu(m: int, tune: str, h: int = 2560, n: int = 10240) -> list[dict]:
    """The user pattern LayerNorm→Linear(bias)→GELU registered with the GEMM template (Phi-2's MLP dims): its one
    generated kernel against cuBLAS, and the call against eager, with the error of each against float64."""
    from dlblas_compiler import P
    from dlblas_compiler.numerics import rel_error

    dc.register_fusion_pattern("ln_linear_gelu", lambda x, w, b, W, bias: P.gelu(P.linear(P.layer_norm(x, w, b), W, bias)),
                               "gemm", priority=200)  # fmt: skip
    try:
        mod = randomize_(LNLinearGelu(h, n)).to("cuda", torch.bfloat16).eval()
        x = _randn(1, m, h, dtype=torch.bfloat16, device="cuda", seed=1)
        cm = dc.compile(mod, backend="triton", tune=tune, cuda_graphs=False)
        with torch.no_grad():
            out, eager = cm(x), mod(x)
            ref = copy.deepcopy(mod).double()(x.double())
            rows = time_regions(cm, (x,), {}, False)
            eager_us = graph_time_us(lambda: mod(x))
            ours_us = graph_time_us(lambda: cm(x))
    finally:
        dc.unregister_fusion_pattern("ln_linear_gelu")
    for r in rows:
        r.update(layer=f"ln_linear_gelu {h}->{n}", rel_err=rel_error(out, ref), eager_rel_err=rel_error(eager, ref),
                 eager_us=eager_us, ours_us=ours_us)  # fmt: skip
        print(f"  LayerNorm→Linear→GELU: ours {ours_us:.1f} µs, eager {eager_us:.1f} µs; rel. err {r['rel_err']:.2e} "
              f"(eager {r['eager_rel_err']:.2e})", flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b,gemma_7b,llama32_3b,mistral_nemo_12b")
    ap.add_argument("--tokens", default="2048")
    ap.add_argument("--tune", default="quick")
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--ln", action="store_true", help="also the user pattern LayerNorm→Linear(bias)→GELU")
    ap.add_argument("--with-op", default="", help="time only the regions with this op (e.g. dl.rotary)")
    ap.add_argument("--sweep-tiles", default="", help="sweep only these tiles (e.g. 256x128,128x256)")
    ap.add_argument("--sweep-outside", default="", help="JSON list: K-loop configs outside the space (see above)")
    ap.add_argument("--sweep-splits", action="store_true", help="also the persistent configs with the last wave split")
    ap.add_argument("--sweep-ws", action="store_true",
                    help="sweep the persistent configs and their warp-specialized (Gluon) twins, on the regions that have them")
    a = ap.parse_args()
    TILES.update(t for t in a.sweep_tiles.split(",") if t)
    if a.sweep_outside:
        OUTSIDE.extend(json.loads(a.sweep_outside))
        SWEEP.clear()  # (only the given configs, beside the tuned one)
    if a.sweep_ws:  # the persistent configs, each with its warp-specialized twin, and deeper rings for the twins
        persistent = [c for c in SWEEP if c["PERSISTENT"]]
        deeper = [{**c, "num_stages": 5} for c in persistent if (c["BLOCK_N"], c["num_stages"]) == (128, 4)]
        deeper += [{**c, "BLOCK_K": 32, "num_stages": 5} for c in persistent if (c["BLOCK_N"], c["num_stages"]) == (256, 3)]
        # (each config's WS=1 and WS=2 twins timed one after the other: a long GEMM's time drifts 3-6% over a sweep)
        SWEEP[:] = persistent + [{**c, "WS": ws} for c in persistent + deeper for ws in (1, 2)]
    if a.sweep_splits:
        SWEEP.extend({**c, "SPLIT_K": sk} for c in list(SWEEP) if c["PERSISTENT"] for sk in (2, 4, 8))
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "gemms.json")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "tune": a.tune, "layers": [], "ablate": []}  # fmt: skip

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    tokens = [int(t) for t in a.tokens.split(",")]
    if a.ablate:
        for m in tokens:
            res["ablate"] += ablate(m, a.tune, a.sweep)
            save()
    if a.ln:
        for m in tokens:
            res["layers"] += ln_linear_gelu(m, a.tune)
            save()
    for name in [n for n in a.layers.split(",") if n]:
        assert name in HF_LAYERS, f"unknown layer {name}: {', '.join(HF_LAYERS)}"
        for m in tokens:
            t0 = time.time()
            mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](m, torch.bfloat16, "cuda")
            cm = dc.compile(mod, backend="triton", tune=a.tune, cuda_graphs=False)
            with torch.no_grad():
                cm(*args, **kwargs)
            print(f"{name} M={m}: compiled and tuned in {time.time() - t0:.1f} s", flush=True)
            for r in time_regions(cm, args, kwargs, a.sweep, a.with_op):
                res["layers"].append({"layer": name, **r})
            save()
            del cm, mod
            torch.cuda.empty_cache()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
