"""How close can a Triton 3.6 GEMM come to cuBLAS on the decoder layers' shapes at M = 2048, and which loop
structure gets it there? A plain bf16 GEMM (no epilogue: what our template's K loop and stores do) as one persistent
TMA kernel whose structure the constexprs choose, each timed with triton.testing.do_bench against torch.matmul of the
same operands, its output checked against an fp32 product:

  one tile a program               PERSISTENT=0
  persistent, desc per tile        the device-side TMA descriptors made inside the tile loop (as the template does;
                                   Triton hoists them: the PTX is the same as with them made once)
  persistent, desc hoisted         made once before the loop
  flatten / WS                     `tl.range(..., flatten=True)` (the next tile's loads issued during this tile's
                                   epilogue) / `warp_specialize=True` (Hopper: applied only with 4 warps)
  TMA store                        the output tile stored through a descriptor instead of pointer stores

    python bench/gemm_loop_probe.py OUT.json      (on a GPU)
    python bench/gemm_loop_probe.py --offline     (build every variant for sm90 without a GPU; shared memory)

bench/NOTES.md 135 has the first run's findings (H200): the persistent loop as the template runs it is 0.92-0.93x
cuBLAS on Llama-3-8B's QKV, flatten 0.95x; Qwen2.5-7B's QKV (N = 4608) 0.77-0.84x for every variant, its tiles
filling 2.2 waves of the SMs.
"""

import functools
import json
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _tile_ids(tile, num_m, num_n, GROUP_M: tl.constexpr):
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % size_m
    pid_n = (tile % group) // size_m
    return pid_m, pid_n


@triton.jit
def probe(a_ptr, b_ptr, c_ptr, M, N, K,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
          PERSISTENT: tl.constexpr, DESC_PER_TILE: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr,
          TMA_STORE: tl.constexpr, STAGES: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    tiles = num_m * num_n
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    if PERSISTENT:
        start, step = tl.program_id(0), NUM_SMS
    else:
        start, step = tl.program_id(0), tiles
    for tile in tl.range(start, tiles, step, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_ids(tile, num_m, num_n, GROUP_M)
        if DESC_PER_TILE:
            a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
            b_d = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        else:
            a_d = a_desc
            b_d = b_desc
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in tl.range(0, k_tiles, num_stages=STAGES):
            a = a_d.load([pid_m * BM, kk * BK])
            b = b_d.load([pid_n * BN, kk * BK])
            acc = tl.dot(a, b.T, acc)
        c = acc.to(tl.bfloat16)
        if TMA_STORE:
            c_desc.store([pid_m * BM, pid_n * BN], c)
        else:
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            tl.store(c_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], c, mask=(rm < M)[:, None] & (rn < N)[None, :])


VARIANTS = {  # name: (PERSISTENT, DESC_PER_TILE, FLATTEN, WS, TMA_STORE)
    "one-tile": (0, 0, 0, 0, 0),
    "persistent, desc per tile (ours)": (1, 1, 0, 0, 0),
    "persistent, desc hoisted": (1, 0, 0, 0, 0),
    "persistent, hoisted, TMA store": (1, 0, 0, 0, 1),
    "persistent, flatten": (1, 0, 1, 0, 0),
    "persistent, flatten, TMA store": (1, 0, 1, 0, 1),
    "persistent, WS": (1, 0, 0, 1, 0),
    "persistent, WS, TMA store": (1, 0, 0, 1, 1),
    "persistent, flatten+WS, TMA store": (1, 0, 1, 1, 1),
}
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4)]
SHAPES = {  # (M, N, K) at 2048 tokens
    "llama3_8b qkv": (2048, 6144, 4096), "llama3_8b o": (2048, 4096, 4096),
    "llama3_8b gate/up": (2048, 28672, 4096), "llama3_8b down": (2048, 4096, 14336),
    "qwen25_7b qkv": (2048, 4608, 3584),
}


def consts(tile, variant, sms):
    bm, bn, bk, warps, stages = tile
    p, dpt, fl, ws, st = VARIANTS[variant]
    return dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, NUM_SMS=sms, PERSISTENT=p, DESC_PER_TILE=dpt, FLATTEN=fl, WS=ws,
                TMA_STORE=st, STAGES=stages), warps


def offline():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
    for tile in TILES:
        for v in VARIANTS:
            c, warps = consts(tile, v, 132)
            t0 = time.time()
            try:
                k = triton.compile(ASTSource(probe, {**sig, **{n: "constexpr" for n in c}}, c),
                                   target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
                print(f"{tile} {v}: built, {k.metadata.shared} bytes of shared memory, {time.time() - t0:.1f} s", flush=True)
            except Exception as e:
                print(f"{tile} {v}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


def _run(a, b, c, grid, consts_, warps):
    """A launch of the probe kernel with these operands and constexprs (bound here, not by a loop's closure)."""
    return lambda: probe[grid](a, b, c, a.shape[0], b.shape[0], a.shape[1], **consts_, num_warps=warps)


def online(out):
    from triton.testing import do_bench

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    for sname, (m, n, k) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
        ref = a.float() @ b.float().T
        t_cublas = do_bench(functools.partial(torch.matmul, a, b.T), warmup=25, rep=100)
        res["rows"].append({"shape": sname, "variant": "cuBLAS", "us": t_cublas * 1e3})
        print(f"{sname}: cuBLAS {t_cublas * 1e3:.1f} us", flush=True)
        for tile in TILES:
            for v in VARIANTS:
                if tile[4] == 4 and tile[1] == 256 and VARIANTS[v][4]:
                    continue  # (a TMA-stored 128x256 tile does not fit next to 4 stages)
                consts_, warps = consts(tile, v, sms)
                c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                tiles = triton.cdiv(m, tile[0]) * triton.cdiv(n, tile[1])
                fn = _run(a, b, c, (min(sms, tiles) if consts_["PERSISTENT"] else tiles,), consts_, warps)
                try:
                    err = 0.0
                    for _ in range(2):  # (twice: a race would show as a different output)
                        fn()
                        torch.cuda.synchronize()
                        err = max(err, ((c.float() - ref).abs().max() / ref.abs().max()).item())
                    t = do_bench(fn, warmup=25, rep=100)
                    row = {"shape": sname, "tile": tile, "variant": v, "us": t * 1e3, "err": err,
                           "vs_cublas": t_cublas / t}  # fmt: skip
                    print(f"  {tile} {v}: {t * 1e3:.1f} us ({t_cublas / t:.3f}x cuBLAS) err {err:.1e}", flush=True)
                except Exception as e:  # noqa: BLE001 - a variant that does not build or launch is recorded
                    row = {"shape": sname, "tile": tile, "variant": v, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    print(f"  {tile} {v}: ERROR {row['error']}", flush=True)
                res["rows"].append(row)
                with open(out, "w") as f:
                    json.dump(res, f, indent=1)


if __name__ == "__main__":
    offline() if sys.argv[1] == "--offline" else online(sys.argv[1])
