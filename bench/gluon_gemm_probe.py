"""A warp-specialized persistent GEMM written in Gluon (Triton's lower-level dialect), against cuBLAS on the decoder
layers' shapes at M = 2048: does a producer warp feeding the MMA warpgroups close the main loop's gap that Nsight
Compute shows between our Triton kernels (50-88% SM throughput) and cuBLAS's warp-specialized cooperative kernels
(89-94%)? (bench/NOTES.md 142, 143.)

    python bench/gluon_gemm_probe.py --out OUT          # on an sm90 GPU: each variant's time, error and cuBLAS's
    python bench/gluon_gemm_probe.py --offline          # without a GPU: build each variant for sm90, print resources

C[M, N] = A[M, K] @ W[N, K]^T in bf16 with fp32 accumulation. One program per SM loops over the output tiles
(grouped along M). Two partitions share a ring of STAGES shared-memory buffers for the A and W tiles, each with a
"ready" and an "empty" mbarrier: a one-warp loader issues the TMA copies of every tile's K steps as buffers free up,
running ahead across tile boundaries; the default partition (the kernel's 8 warps: two warpgroups, 64 rows each)
issues the wgmma of each K step asynchronously, keeps one in flight, frees the buffers of the step before, and at the
end of a tile converts the accumulator to bf16 and stores it through shared memory with a TMA store. No epilogue
beyond the cast: this probes the main loop only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {  # (N, K) of each GEMM at M = 2048 (the layer's regions as plain GEMMs)
    "llama3_8b qkv": (6144, 4096), "llama3_8b o": (4096, 4096), "llama3_8b gate/up": (28672, 4096),
    "llama3_8b down": (4096, 14336), "qwen25_7b qkv": (4608, 3584), "qwen25_7b o": (3584, 3584),
}  # fmt: skip
# BM, BN, BK, STAGES (within 227 KB of shared memory with the output tile's buffer)
VARIANTS = [(128, 256, 64, 3), (128, 256, 32, 5), (128, 128, 64, 4), (128, 128, 64, 5)]
WARPS, MAXNREG = 8, 168  # (8 MMA warps + a loader warpgroup: 12 x 32 x 168 <= 64K registers)


@gluon.jit
def _tile_offsets(t, num_m, num_n, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr):
    """Tile t's first row and column, tiles taken GROUP_M rows of tiles at a time (W's tiles reused from L2)."""
    group = GROUP_M * num_n
    first_m = (t // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (t % group) % size_m
    pid_n = (t % group) // size_m
    return pid_m * BM, pid_n * BN


@gluon.jit
def _loader(a_desc, w_desc, a_bufs, w_bufs, ready, empty, num_m, num_n, steps, BM: gl.constexpr, BN: gl.constexpr,
            BK: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """The loader warp: for every K step of every tile of this program, wait until the step's buffers are free,
    then copy the A and W tiles into them; the copies signal `ready` when they land."""
    it = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(t, num_m, num_n, BM, BN, GROUP_M)
        for kk in range(steps):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # (a new barrier's phase 1 counts as complete)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [off_n, kk * BK], ready.index(s), w_bufs.index(s))
            it += 1


@gluon.jit
def _mma(c_desc, a_bufs, w_bufs, c_smem, ready, empty, num_m, num_n, steps, BM: gl.constexpr, BN: gl.constexpr,
         BK: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    """The MMA warpgroups: each K step's wgmma issued once its tiles are ready, one left in flight, the step
    before it freed; after a tile's last step, the bf16 tile stored through shared memory by TMA."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BN, 16])  # (64 rows a warpgroup)
    it = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(t, num_m, num_n, BM, BN, GROUP_M)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        for kk in range(steps):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            a_buf, w_buf = a_bufs.index(s), w_bufs.index(s)
            acc = warpgroup_mma(a_buf, w_buf.permute((1, 0)), acc, use_acc=kk > 0, is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_buf, w_buf))
            if kk > 0:  # the step before has finished reading its buffers
                mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
        tma.store_wait(pendings=0)  # (the previous tile's store has left c_smem)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def ws_gemm(a_desc, w_desc, c_desc, M, N, K, STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    num_m, num_n, steps = gl.cdiv(M, BM), gl.cdiv(N, BN), gl.cdiv(K, BK)  # (both partitions walk the same tiles)
    gl.warp_specialize([
        (_mma, (c_desc, a_bufs, w_bufs, c_smem, ready, empty, num_m, num_n, steps, BM, BN, BK, STAGES, GROUP_M,
                num_warps)),
        (_loader, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, num_m, num_n, steps, BM, BN, BK, STAGES, GROUP_M)),
    ], [1], [40])  # (the loader: one warp, 40 registers)  # fmt: skip


def descriptors(a: torch.Tensor, w: torch.Tensor, c: torch.Tensor, bm: int, bn: int, bk: int) -> tuple:
    def desc(t, block):
        return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

    return desc(a, [bm, bk]), desc(w, [bn, bk]), desc(c, [bm, bn])


def prepare(a, w, c, variant, sms: int):
    """The launch of `variant` on these operands: a function that launches it (descriptors made once)."""
    bm, bn, bk, stages = variant
    m, k = a.shape
    n = w.shape[0]
    assert m > 0 and n > 0 and k > 0, "empty operands: the partitions' step counting assumes at least one K step"
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    args = (*descriptors(a, w, c, bm, bn, bk), m, n, k)
    kw = dict(STAGES=stages, GROUP_M=8, num_warps=WARPS, maxnreg=MAXNREG)

    def run(warmup_only: bool = False):
        return ws_gemm.warmup(*args, **kw, grid=grid) if warmup_only else ws_gemm[grid](*args, **kw)

    return run


def offline() -> None:
    """Build each variant for sm90 without a GPU (the compile workers' driver) and print its resources."""
    from triton.runtime.driver import driver

    from dlblas_compiler.codegen import compile_pool

    driver.set_active(compile_pool.Sm90Driver())
    a = torch.empty(2048, 4096, dtype=torch.bfloat16)
    w = torch.empty(6144, 4096, dtype=torch.bfloat16)
    c = torch.empty(2048, 6144, dtype=torch.bfloat16)
    for v in VARIANTS:
        try:
            k = prepare(a, w, c, v, 132)(warmup_only=True)
        except Exception as e:  # noqa: BLE001 - a variant that does not build is reported
            print(f"{v}: does not build: {type(e).__name__}: {str(e)[:400]}", flush=True)
            continue
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            use = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], capture_output=True,
                                 text=True, check=True).stdout  # fmt: skip
        regs, stack = re.search(r"REG:(\d+)", use).group(1), re.search(r"STACK:(\d+)", use).group(1)
        ws = "ttg.warp_specialize" in k.asm["ttgir"]
        print(f"{v}: {regs} registers, {stack} bytes of stack, {k.metadata.shared} bytes of shared memory, "
              f"warp-specialized: {ws}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--offline", action="store_true")
    a = ap.parse_args()
    if a.offline:
        offline()
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        x = torch.randn(2048, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        ref = x.float() @ w.float().t()
        c = torch.empty(2048, n, device="cuda", dtype=torch.bfloat16)
        cublas = triton.testing.do_bench(lambda x=x, w=w, c=c: torch.matmul(x, w.t(), out=c), warmup=25, rep=200) * 1e3
        row = {"shape": name, "M": 2048, "N": n, "K": k, "cublas_us": cublas, "variants": []}
        for v in VARIANTS:
            try:
                c.zero_()
                run = prepare(x, w, c, v, sms)
                run()
                torch.cuda.synchronize()
                err = ((c.float() - ref).norm() / ref.norm()).item()
                t = triton.testing.do_bench(run, warmup=25, rep=200) * 1e3
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported
                print(f"{name} {v}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            if not err <= 1e-2:  # (a race or a wrong index shows here, not in the time)
                print(f"{name} {v}: WRONG, rel. err {err:.2e}: left out", flush=True)
                continue
            row["variants"].append({"variant": v, "us": t, "rel_err": err})
            print(f"{name:18s} {str(v):20s} {t:8.1f} µs  cuBLAS {cublas:8.1f} µs: {cublas / t:.3f}x  "
                  f"rel. err {err:.1e}", flush=True)
        res["rows"].append(row)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "gluon-gemm-probe.json"), "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
