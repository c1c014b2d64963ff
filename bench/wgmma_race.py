"""The wgmma register race (bench/NOTES.md 167), measured: a tile scaled by the norm weight in registers inside the
K loop, launched again and again on the same inputs, and what the safe ways of applying a norm in the K loop cost.

    python bench/wgmma_race.py [--out FILE] [--repeats N]

Part 1 (`races`): Llama-3-8B's norm + QKV + RoPE region (bench/blocks.py's norm_qkv_rope) at 2048 and 128 tokens,
each config launched `--repeats` times on the same inputs: the share of outputs off by more than 5% of the RMS from
the float32 reference (the worst launch), how many launches differ bit for bit from the first, and the config's
time (CUDA-graph replay). The configs: the norm weight applied to A in the K loop with tiles of 64 and 128 rows
(Triton makes the product a wgmma reading A from registers: what the search space now excludes), with 32 rows
(a synchronous mma: allowed), and the row pass (NORM_PASS) that quick tuning picks, loaded by TMA or by pointer.
The launcher's refusal of such binaries (`launcher.wgmma_register_race`) is switched off here to run them.

Part 2 (`k_loop`): stand-alone K loops of the same GEMM (M = 2048, N = 6144, K = 4096, 128x256x64 tiles, 8 warps,
3 stages, TMA), timed and checked the same way:
  plain   x already normalized (what the row pass leaves the GEMM);
  rs      the norm weight applied to A in registers (the race);
  carry   the same, the scaled tile carried into the next K step (a loop argument: Triton then stores it to shared
          memory and waits for each step's wgmma, pendings = 0: no race, no overlap of MMA and scaling);
  stats   x raw and the sum of squares gathered from the A tile, 1/rms applied to the accumulator after the loop
          (the norm weight folded into W: FlashNorm's route, A read from shared memory by wgmma).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from dlblas_compiler.codegen import launcher  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.runtime.program import RegionStep  # noqa: E402


def _cfg(bm, bn, w, s, tma, norm_pass):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=w, num_stages=s, TMA=tma, MM=0,
                NORM_PASS=norm_pass, PERSISTENT=0, WS=0)


CONFIGS = {  # name: config (the norm weight in the K loop unless NORM_PASS)
    "wgmma-rs tma 128x256": _cfg(128, 256, 8, 3, 1, 0),
    "wgmma-rs ptr 128x256": _cfg(128, 256, 8, 3, 0, 0),
    "wgmma-rs tma 64x128": _cfg(64, 128, 4, 3, 1, 0),
    "wgmma-rs ptr 64x128": _cfg(64, 128, 4, 3, 0, 0),
    "mma tma 32x128": _cfg(32, 128, 4, 3, 1, 0),
    "mma ptr 32x128": _cfg(32, 128, 4, 3, 0, 0),
    "row pass tma 128x256": _cfg(128, 256, 8, 3, 1, 1),
    "row pass ptr 128x256": _cfg(128, 256, 8, 3, 0, 1),
}


def _check(run, ref: list[torch.Tensor], repeats: int) -> dict:
    """Launch `run` `repeats` times: the worst share of outputs off by 5% of the RMS, launches unlike the first."""
    first, worst, differ = None, 0.0, 0
    for _ in range(repeats):
        outs = [o.clone() for o in run()]
        torch.cuda.synchronize()
        for o, r in zip(outs, ref, strict=True):
            rms = r.float().pow(2).mean().sqrt()
            bad = 1.0 if not torch.isfinite(o).all() else ((o.float() - r.float()).abs() > 0.05 * rms).float().mean()
            worst = max(worst, float(bad))
        if first is None:
            first = outs
        else:
            differ += any(not torch.equal(a, b) for a, b in zip(outs, first, strict=True))
    return {"worst_bad_share": worst, "launches_unlike_first": differ, "launches": repeats}


def races(repeats: int) -> list[dict]:
    rows = []
    for m in (2048, 128):
        mod, args, kwargs, _, _ = BLOCKS["norm_qkv_rope"](m, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="none", cuda_graphs=False)
        with torch.no_grad():
            cm(*args, **kwargs)
            prog = cm._spec().executor
            env = prog._env(list(args))
            for s in prog.steps:
                if isinstance(s, RegionStep) and s.kernel is not None and s.choice.pattern == "gemm":
                    step, tensors = s, s.inputs(env)
                    break
                s(env)
            ref = step.reference([t.float() if t.is_floating_point() else t for t in tensors])
            compile_configs(step.kernel, step.compiled, tensors, list(CONFIGS.values()))
            for name, cfg in CONFIGS.items():
                row = {"m": m, "config": name, **cfg, "in_space": step.kernel.space.is_valid(cfg)}
                def run(cfg=cfg, step=step, tensors=tensors):
                    return step.launch(tensors, cfg)

                try:
                    row.update(_check(run, ref, repeats))
                    row["us"] = 1e3 * triton.testing.do_bench_cudagraph(run, rep=200)
                except Exception as e:  # noqa: BLE001 - reported in the row
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(json.dumps(row), flush=True)
                rows.append(row)
        del cm, mod
        torch.cuda.empty_cache()
    return rows


@triton.jit
def _gemm(x_ptr, w_ptr, g_ptr, o_ptr, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          MODE: tl.constexpr):
    """o = x @ w^T (MODE 0, plain), with the gain g on x's columns applied to A in the loop (1: rs, 2: carry), or
    with each row's 1/rms gathered in the loop and applied to the accumulator (3: stats)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    ss = tl.zeros((BM, BK), dtype=tl.float32)
    if MODE == 2:
        a = a_desc.load([pid_m * BM, 0])
        a = (a.to(tl.float32) * tl.load(g_ptr + rk).to(tl.float32)[None, :]).to(a.dtype)
        for k0 in range(0, K, BK):
            acc = tl.dot(a, b_desc.load([pid_n * BN, k0]).T, acc)
            kn = (k0 + BK) % K
            an = a_desc.load([pid_m * BM, kn])
            a = (an.to(tl.float32) * tl.load(g_ptr + kn + rk).to(tl.float32)[None, :]).to(an.dtype)
    else:
        for k0 in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k0])
            if MODE == 1:
                a = (a.to(tl.float32) * tl.load(g_ptr + k0 + rk).to(tl.float32)[None, :]).to(a.dtype)
            if MODE == 3:
                ss += a.to(tl.float32) * a.to(tl.float32)
            acc = tl.dot(a, b_desc.load([pid_n * BN, k0]).T, acc)
    if MODE == 3:
        acc = acc * tl.rsqrt(tl.sum(ss, axis=1) / K + 1e-5)[:, None]
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(o_ptr.dtype.element_ty))


def k_loop(repeats: int) -> list[dict]:
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    m, n, k = 2048, 6144, 4096
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    g = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).bfloat16()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    x64, w64, g64 = x.double(), w.double(), g.double()
    refs = {0: x64 @ w64.T, 1: (x64 * g64) @ w64.T,
            3: (x64 * torch.rsqrt(x64.pow(2).mean(1, keepdim=True) + 1e-5)) @ w64.T}  # fmt: skip
    refs[2] = refs[1]
    grid = (m // 128, n // 256)
    rows = []
    for mode, name in enumerate(("plain", "rs", "carry", "stats")):
        def run(mode=mode):
            _gemm[grid](x, w, g, out, m, n, k, 128, 256, 64, mode, num_warps=8, num_stages=3)
            return [out]
        row = {"kernel": name, **_check(run, [refs[mode].bfloat16()], repeats),
               "us": 1e3 * triton.testing.do_bench_cudagraph(run, rep=200)}
        row["tflops"] = 2 * m * n * k / row["us"] * 1e-6  # (µs: TFLOP/s)
        print(json.dumps(row), flush=True)
        rows.append(row)
    a, b = x, w.T
    us = 1e3 * triton.testing.do_bench_cudagraph(lambda: torch.matmul(a, b), rep=200)
    rows.append({"kernel": "cuBLAS torch.matmul", "us": us, "tflops": 2 * m * n * k / us * 1e-6})
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    launcher.REFUSE_WGMMA_RACE = False  # (run them: this measures the race the launcher refuses)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "races": races(a.repeats), "k_loop": k_loop(a.repeats)}  # fmt: skip
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
