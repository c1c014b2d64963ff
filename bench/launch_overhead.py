"""Host time of one kernel launch, by path: a jitted Triton function called as `fn[grid](...)` (Triton's launcher:
argument binding, specialization key, cache lookup), the same compiled kernel launched through its `run` with the
arguments already bound, and a torch elementwise op, for a kernel with as many arguments as a generated GEMM
(30 runtime arguments, 15 constexprs). Host µs per launch over many back-to-back launches (the GPU work is tiny).

    python bench/launch_overhead.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl


@triton.jit
def many_args(x_ptr, y_ptr, p2, p3, p4, p5, p6, p7, p8, p9, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4,
              b5, b6, b7, b8, b9, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
              C4: tl.constexpr, C5: tl.constexpr, C6: tl.constexpr, C7: tl.constexpr, C8: tl.constexpr,
              C9: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
              BLOCK: tl.constexpr):  # fmt: skip
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < a0
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) + C0, mask=m)


def per_launch(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)
    ptrs = [torch.empty(256, device="cuda") for _ in range(8)]
    ints = [4096, 7, 128, 1024, 3, 5, 64, 4096 * 3, 2, 9] + [4096 * k + 3 for k in range(10)]
    consts = {f"C{i}": i + 1 for i in range(10)} | {f"D{i}": bool(i % 2) for i in range(4)} | {"BLOCK": 1024}
    grid = (4,)
    full = [x, y, *ptrs, *ints]

    def jitted():
        many_args[grid](*full, **consts)

    kernel = many_args.run(*full, grid=grid, warmup=False, **consts)
    bound = [*full, *consts.values()]
    dev = torch.cuda.current_device()
    from triton.runtime import driver

    def direct():
        stream = driver.active.get_current_stream(dev)
        kernel.run(4, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *bound)

    direct()
    torch.cuda.synchronize()
    assert torch.allclose(y, x + 1)
    from dlblas_compiler.codegen.launcher import Launcher

    fast = Launcher(many_args)

    def ours():
        fast[grid](*full, **consts)

    ours()
    rows = {
        "triton fn[grid](...) µs": per_launch(jitted),
        "dlblas Launcher[grid](...) µs": per_launch(ours),
        "CompiledKernel.run, arguments bound µs": per_launch(direct),
        "torch x.add_(1) µs": per_launch(lambda: y.add_(1)),
        "torch.empty(1024) µs": per_launch(lambda: torch.empty(1024, device="cuda")),
    }
    rows = {k: round(v, 2) for k, v in rows.items()}
    print(json.dumps(rows), flush=True)
    with open(os.path.join(args.out, "launch_overhead.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
