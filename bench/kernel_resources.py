"""Registers, spilled bytes and shared memory of a layer's generated GEMM kernels for sm90, without a GPU.

    python bench/kernel_resources.py [--layer llama3_8b] [--tokens 4] [--with-op dl.rotary] [--configs '[{...}]']

The decoder layer of bench/blocks.HF_LAYERS (published dims, random weights, `--tokens` tokens: the regions are those
of that many rows — up to 4, Qwen3's per-head norm is a row kernel apart) is compiled for the interpreter on the CPU; then each GEMM region's kernel is built for sm90 (Hopper) by the compile workers, as a
tuning batch builds it (`codegen/compile_pool`), once per config: by default the configs the M = 2048 sweeps time
(128x128 and 128x256 tiles, 3 and 4 stages, one tile a program and persistent, TMA, the norm as a pass), and the
resource usage of each binary is read with Triton's own cuobjdump. A STACK above 0 is registers spilled to local
memory: the 128x256 QKV kernel's rotary spilled 280-384 bytes a thread before its cos/sin table was read once per
tile (bench/NOTES.md 131). Compiling takes a few seconds a config; the interpreter's first call ~1 minute.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen import compile_pool  # noqa: E402
from dlblas_compiler.codegen.kernel import _Warmup  # noqa: E402
from dlblas_compiler.runtime.steps import RegionStep  # noqa: E402

CONFIGS = [dict(BLOCK_M=128, BLOCK_N=bn, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=s, TMA=1, MM=0,
                NORM_PASS=1, PERSISTENT=p, WS=0) for bn in (128, 256) for s in (3, 4) for p in (0, 1)]  # fmt: skip


def usage(cubin: str) -> dict:
    """REG, STACK, SHARED... of a cubin's kernel, as cuobjdump reports them."""
    text = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", cubin], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def regions(layer: str, tokens: int, with_op: str) -> list[tuple[RegionStep, list]]:
    """(step, inputs) of each GEMM region of the layer, the program stepped along between regions (interpreter)."""
    mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](tokens, torch.bfloat16, "cpu")
    cm = dc.compile(mod, backend="interpret", tune="none", cuda_graphs=False)
    found = []
    with torch.no_grad():
        cm(*args, **kwargs)
        spec = cm._spec()
        prog = spec.executor
        env = prog._env([spec.captured.flatten(args, kwargs)[i] for i in spec.imported.arg_positions])
        for s in prog.steps:
            if (isinstance(s, RegionStep) and s.kernel is not None and "streams" in s.kernel.shape_key
                    and (not with_op or with_op in {o.name for o in s.kernel.region.body_ops})):
                found.append((s, s.inputs(env)))
            s(env)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="llama3_8b")
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--with-op", default="", help="only the regions with this op (e.g. dl.rotary)")
    ap.add_argument("--configs", default="", help="a JSON list of configs (default: the M = 2048 sweep's)")
    a = ap.parse_args()
    configs = json.loads(a.configs) if a.configs else CONFIGS
    found = regions(a.layer, a.tokens, a.with_op)
    knobs.cache.dir = tempfile.mkdtemp(prefix="kernel-resources-")
    os.environ.setdefault(compile_pool.WORKERS_ENV, "2")
    driver.set_active(compile_pool.Sm90Driver())
    try:
        for step, tensors in found:
            fn = step.kernel.compiled(False)
            ops = "+".join(dict.fromkeys(o.name.removeprefix("dl.") for o in step.kernel.region.body_ops
                                         if o.name not in ("dl.slice", "dl.reshape", "dl.permute")))  # fmt: skip
            print(f"{step.choice.region} ({ops}):")
            for c in configs:
                before = set(os.listdir(knobs.cache.dir))
                compile_pool.prebuild(functools.partial(step.kernel.launch, _Warmup(fn), tensors, c))
                new = [d for d in set(os.listdir(knobs.cache.dir)) - before
                       if any(f.endswith(".cubin") for f in os.listdir(os.path.join(knobs.cache.dir, d)))]  # fmt: skip
                tile = f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}, {c['num_warps']} warps, {c['num_stages']} stages" + (
                    ", persistent" if c.get("PERSISTENT") else "")  # fmt: skip
                if len(new) != 1:
                    print(f"  {tile}: not built (invalid for this region, or failed)")
                    continue
                d = os.path.join(knobs.cache.dir, new[0])
                cubin = os.path.join(d, next(f for f in os.listdir(d) if f.endswith(".cubin")))
                u = usage(cubin)
                with open(cubin.removesuffix(".cubin") + ".json") as f:
                    shared = json.load(f)["shared"]  # (the launch's dynamic shared memory, as Triton records it)
                print(f"  {tile}: {u.get('REG')} registers, {u.get('STACK')} bytes of stack (spills), "
                      f"{shared // 1024} KiB of shared memory")  # fmt: skip
    finally:
        compile_pool.shutdown()


if __name__ == "__main__":
    main()
