"""The two ceilings a roofline floor divides by, measured on the GPU at hand.

    python bench/ceilings.py [OUT]        # writes OUT/ceilings.json (OUT defaults to $OUT, else ".")

* copy_bytes_per_s: a device-to-device copy of 1 GiB, bytes read plus bytes written over the time
  (`triton.testing.do_bench` median, which clears L2 before each copy);
* bf16_matmul_flops: `torch.matmul` of two random 8192x8192 bf16 matrices, 2*M*N*K over the best of several
  timed products (CUDA events, after warm-up; random data, never zeros).

Every benchmark script records these in its own JSON (`ceilings`), measured in the same process as its
numbers, so a floor is traceable to the card it ran on. FIXED holds the constants the floors used before the
ceilings were measured with each run: they have no raw measurement behind them (see BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import sys
import time

# (bytes/s, flop/s) by GPU name substring; unmeasured constants, used only where a run measured nothing
FIXED = {"H100": (3.0e12, 709e12), "H200": (4.25e12, 687e12)}


def fixed(gpu_name: str) -> tuple[float, float]:
    return next((v for k, v in FIXED.items() if k in gpu_name), FIXED["H100"])


def measure(copy_bytes: int = 1 << 30, n: int = 8192, products: int = 10) -> dict:
    """{"copy_bytes_per_s", "bf16_matmul_flops", "gpu", "method", "date"} on the current CUDA device."""
    import torch
    from triton.testing import do_bench

    src = torch.randint(0, 255, (copy_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e-3
    del src, dst

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    times = []
    for _ in range(products):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.matmul(a, b, out=c)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e-3)
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "copy_bytes_per_s": 2 * copy_bytes / copy_s,
        "bf16_matmul_flops": 2 * n**3 / min(times),
        "gpu": torch.cuda.get_device_name(),
        "method": f"copy of {copy_bytes} bytes (read+write, do_bench median); torch.matmul bf16 {n}^3, "
        f"best of {products} (random data)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    c = measure()
    with open(os.path.join(out, "ceilings.json"), "w") as f:
        json.dump(c, f, indent=1)
    print(f"ceilings ({c['gpu']}): copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
