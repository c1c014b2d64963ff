"""An experiment for issue 19: would the gate/up GEMM with its GLU run faster as ONE product over a weight whose
gate and up rows interleave (row 2j = gate row j, row 2j + 1 = up row j) than as two accumulators?

    python bench/interleaved_glu.py --out OUT [--tokens 2048,128]

Three small TMA kernels written alike (grouped tile order, one tile per program, fp32 accumulators, bf16 out):
  plain        Y = x @ W^T over all 2I columns, stored (the bare product in one accumulator: the speed to reach)
  dual         gate and up tiles in two accumulators of BLOCK_N columns each (what the GEMM template does now)
  interleaved  one accumulator of 2 * BLOCK_N columns over the interleaved weight, split into gate and up in
               registers (adjacent columns: the split moves no data), then silu(gate) * up
  strided      the same tile from the weight as it is, through a 3-D TMA descriptor [I, 2, K] (no interleaved copy)
Each config of each kernel is checked against torch (silu(x @ Wg^T) * (x @ Wu^T), float32 reference) and timed
(CUDA-graph replay, L2 cleared); cuBLAS's x @ W^T of the same operands beside them. Writes OUT/interleaved_glu.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# (name, hidden, intermediate) of bench/blocks.HF_LAYERS
SHAPES = [("llama3_8b", 4096, 14336), ("qwen25_7b", 3584, 18944), ("gemma_7b", 3072, 24576),
          ("llama32_3b", 3072, 8192), ("mistral_nemo_12b", 5120, 14336)]  # fmt: skip


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (pid % group) % size_m, (pid % group) // size_m


@triton.jit
def plain_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k0]), b_desc.load([pid_n * BLOCK_N, k0]).T, acc)
    y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


@triton.jit
def dual_kernel(x_ptr, w_ptr, y_ptr, M, N_OUT, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr):
    """w: [gate; up] ([2I, K]); y: [M, N_OUT]."""
    pid_m, pid_n = _tile_ids(M, N_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    g_desc = tl.make_tensor_descriptor(w_ptr, shape=[N_OUT, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    u_desc = tl.make_tensor_descriptor(w_ptr + N_OUT * K, shape=[N_OUT, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N_OUT], strides=[N_OUT, 1], block_shape=[BLOCK_M, BLOCK_N])
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k0])
        acc_g = tl.dot(a, g_desc.load([pid_n * BLOCK_N, k0]).T, acc_g)
        acc_u = tl.dot(a, u_desc.load([pid_n * BLOCK_N, k0]).T, acc_u)
    g = acc_g.to(tl.bfloat16).to(tl.float32)
    u = acc_u.to(tl.bfloat16).to(tl.float32)
    y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], (g * tl.sigmoid(g) * u).to(tl.bfloat16))


@triton.jit
def interleaved_kernel(x_ptr, w_ptr, y_ptr, M, N_OUT, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """w: gate and up rows interleaved ([2I, K]); each tile computes 2 * BLOCK_N product columns = BLOCK_N outputs."""
    pid_m, pid_n = _tile_ids(M, N_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[2 * N_OUT, K], strides=[K, 1], block_shape=[2 * BLOCK_N, BLOCK_K])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N_OUT], strides=[N_OUT, 1], block_shape=[BLOCK_M, BLOCK_N])
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k0]), b_desc.load([pid_n * 2 * BLOCK_N, k0]).T, acc)
    acc_g, acc_u = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
    g = acc_g.to(tl.bfloat16).to(tl.float32)
    u = acc_u.to(tl.bfloat16).to(tl.float32)
    y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], (g * tl.sigmoid(g) * u).to(tl.bfloat16))


@triton.jit
def strided_kernel(x_ptr, w_ptr, y_ptr, M, N_OUT, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """w: [gate; up] as they are ([2I, K]), read through a 3-D descriptor [N_OUT, 2, K] (strides K, N_OUT * K, 1) whose
    [BLOCK_N, 2, BLOCK_K] boxes hold gate row j and up row j in turn: the interleaved tile without an interleaved
    copy of the weight."""
    pid_m, pid_n = _tile_ids(M, N_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N_OUT, 2, K], strides=[K, N_OUT * K, 1],
                                       block_shape=[BLOCK_N, 2, BLOCK_K])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N_OUT], strides=[N_OUT, 1], block_shape=[BLOCK_M, BLOCK_N])
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b = tl.reshape(b_desc.load([pid_n * BLOCK_N, 0, k0]), [2 * BLOCK_N, BLOCK_K])
        acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k0]), b.T, acc)
    acc_g, acc_u = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
    g = acc_g.to(tl.bfloat16).to(tl.float32)
    u = acc_u.to(tl.bfloat16).to(tl.float32)
    y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], (g * tl.sigmoid(g) * u).to(tl.bfloat16))


CONFIGS = [(bm, bn, 64, w, s) for bm, bn in [(128, 128), (128, 64)] for w in (8,) for s in (3, 4)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="2048,128")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    args = ap.parse_args()
    from gemms import graph_time_us

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    rows = []
    for name, hidden, inter in [s for s in SHAPES if s[0] in args.shapes.split(",")]:
        for m in [int(t) for t in args.tokens.split(",")]:
            gen = torch.Generator("cuda").manual_seed(0)
            x = torch.randn(m, hidden, device="cuda", generator=gen).bfloat16()
            w = (torch.randn(2 * inter, hidden, device="cuda", generator=gen) / hidden**0.5).bfloat16()
            wi = w.view(2, inter, hidden).transpose(0, 1).reshape(2 * inter, hidden).contiguous()
            gate, up = (x.float() @ w.float().T).split(inter, dim=1)
            ref = torch.nn.functional.silu(gate.bfloat16().float()) * up.bfloat16().float()
            y = torch.empty(m, inter, device="cuda", dtype=torch.bfloat16)
            y2 = torch.empty(m, 2 * inter, device="cuda", dtype=torch.bfloat16)
            row = {"layer": name, "M": m, "I": inter, "K": hidden,
                   "cublas_us": graph_time_us(functools.partial(torch.mm, x, w.T, out=y2))}  # fmt: skip
            for bm, bn, bk, warps, stages in CONFIGS:
                cfg = f"{bm}x{bn}x{bk}/w{warps}/s{stages}"
                kw = dict(BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
                tiles = (triton.cdiv(m, bm) * triton.cdiv(inter, bn),)
                runs = {
                    "plain": functools.partial(plain_kernel[tiles], x, w, y2, m, 2 * inter, hidden, BLOCK_M=bm,
                                               BLOCK_N=2 * bn, **kw),
                    "dual": functools.partial(dual_kernel[tiles], x, w, y, m, inter, hidden, BLOCK_M=bm, BLOCK_N=bn, **kw),
                    "interleaved": functools.partial(interleaved_kernel[tiles], x, wi, y, m, inter, hidden, BLOCK_M=bm,
                                                     BLOCK_N=bn, **kw),
                    "strided": functools.partial(strided_kernel[tiles], x, w, y, m, inter, hidden, BLOCK_M=bm,
                                                 BLOCK_N=bn, **kw),
                }  # fmt: skip
                for kind, fn in runs.items():
                    try:
                        fn()
                        torch.cuda.synchronize()
                        err = None
                        if kind != "plain":
                            err = ((y.float() - ref).norm() / ref.norm()).item()
                            y.zero_()
                        us = graph_time_us(fn)
                    except Exception as e:  # (a config that does not fit shared memory)
                        us, err = None, f"{type(e).__name__}: {str(e)[:120]}"
                    row[f"{kind} {cfg}"] = {"us": us, "rel_err": err}
            best = {k: min((v["us"] for c, v in row.items() if c.startswith(k + " ") and v["us"]), default=None)
                    for k in ("plain", "dual", "interleaved", "strided")}  # fmt: skip
            row["best"] = best
            print(name, m, f"cuBLAS {row['cublas_us']:.1f}", {k: v and round(v, 1) for k, v in best.items()},
                  {c: (v["us"] and round(v["us"], 1), v["rel_err"] if not isinstance(v["rel_err"], float) else f"{v['rel_err']:.1e}")
                   for c, v in row.items() if isinstance(v, dict) and "us" in v}, flush=True)  # fmt: skip
            rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "interleaved_glu.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
