"""Differential fuzzer: random modules compiled with each backend and compared with eager.

    python scripts/fuzz.py --count 2000 --seed 1

Prints the graphs run, the failures (each shrunk and saved as a regression under
tests/fuzz/regressions/, which tests/fuzz/test_fuzz.py replays) and what the backends did.
Backends: reference and interpret, and triton when CUDA is available (or --backends).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.generator import REGRESSIONS, check, default_backends, random_spec, save_regression, shrink  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200, help="graphs to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default=",".join(default_backends()))
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                    help="one dtype (default: fp32 and fp16 at random, and bf16 with CUDA)")  # fmt: skip
    ap.add_argument("--max-ops", type=int, default=7)
    ap.add_argument("--save-dir", type=Path, default=REGRESSIONS)
    ap.add_argument("--no-shrink", action="store_true")
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    rng = random.Random(args.seed)
    stats: Counter = Counter()
    kernels: dict[str, Counter] = {b: Counter() for b in backends}
    saved: list[str] = []
    t0 = time.time()
    while stats["run"] < args.count:
        spec = random_spec(rng, args.dtype, args.max_ops)
        results = check(spec, backends)
        if results is None:
            stats["out of range"] += 1
            continue
        stats["run"] += 1
        for r in results:
            kernels[r.backend].update(r.kernels)
            stats[f"{r.backend} fallback warnings"] += r.fallbacks
        bad = next((r for r in results if r.failure), None)
        if bad is not None:
            stats["failures"] += 1
            small = spec if args.no_shrink else shrink(spec, bad, backends)
            path = save_regression(small, bad, args.save_dir)
            saved.append(f"{path} ({bad.backend} {bad.failure}: {bad.message})")
            print(f"[{stats['run']}] FAIL {bad.backend} {bad.failure}: {bad.message}\n    saved {path}", flush=True)
        if stats["run"] % 50 == 0:
            print(f"[{stats['run']}] {stats['failures']} failures, {time.time() - t0:.0f} s", flush=True)
    print(f"graphs run: {stats['run']} (seed {args.seed}, backends {', '.join(backends)}; "
          f"{stats['out of range']} redrawn: out of range in float64)")  # fmt: skip
    for b in backends:
        by_pattern = ", ".join(f"{p} {n}" for p, n in sorted(kernels[b].items())) or "none"
        print(f"  {b}: kernels launched: {by_pattern}; fallback warnings: {stats[f'{b} fallback warnings']}")
    print(f"failures: {stats['failures']}")
    for s in saved:
        print(f"  {s}")
    return 1 if stats["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
