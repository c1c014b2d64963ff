"""Check generated kernels config by config on the GPU: every output against an fp32 reference of its region.

    python bench/check_configs.py [BLOCK:M,...]

For each block and M, each listed config of each region's kernel is launched on the same inputs and every
output is compared with the region's reference computed in float32 (relative error, and the share of
elements off by more than 5% of the output's RMS; a non-finite output counts as all off), each config
launched REPEATS times: a config-dependent error points at the kernel, not at rounding, and runs of one config
that differ at a race. Lines of configs with more than 0.1% of elements off start with WRONG.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from blocks import BLOCKS  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402
from dlblas_compiler.runtime.program import RegionStep  # noqa: E402

GEMM = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=w, num_stages=s, TMA=t, MM=0, NORM_PASS=p,
             PERSISTENT=pers, WS=0)
        for t in (0, 1) for p in (0, 1) for pers in (0, 1)
        for bm, bn, w, s in [(64, 128, 4, 3), (64, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 8, 4),
                             (128, 256, 8, 3), (128, 256, 8, 4)]]  # fmt: skip
REPEATS = 3  # each config launched this many times on the same inputs: a race shows as runs that differ
ATTN = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
        for bm, bn, w, s in [(32, 128, 4, 2), (64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 4, 2), (128, 128, 8, 3)]]  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    cases = [("norm_qkv_rope", 2048), ("norm_qkv_rope", 128), ("swiglu_mlp", 2048), ("attention", 128), ("attention", 2048)]
    if len(sys.argv) > 1:
        cases = [(b, int(m)) for b, m in (c.split(":") for c in sys.argv[1].split(","))]
    for block, m in cases:
        if block == "llama_block":  # the small block of the GPU tests, in fp16
            from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_

            cfg = BlockConfig()
            mod = randomize_(LlamaBlock(cfg)).to("cuda", torch.float16).eval()
            args, kwargs = llama_block_inputs(cfg, 1, m, torch.float16, "cuda"), {}
        else:
            mod, args, kwargs, _, _ = BLOCKS[block](m, torch.bfloat16, "cuda")
        cm = dc.compile(mod, backend="triton", tune="none", cuda_graphs=False)
        with torch.no_grad():
            cm(*args, **kwargs)
            prog = cm._spec().executor
            env_inputs = []
            # rerun the program step by step to capture each region's inputs
            env = prog._env(list(args))
            for s in prog.steps:
                if isinstance(s, RegionStep) and s.kernel is not None:
                    env_inputs.append((s, [env[i] for i in s.ins]))
                s(env)
            for step, tensors in env_inputs:
                ref = step.reference([t.float() if t.is_floating_point() else t for t in tensors])
                configs = [step.choice.config]
                if block != "llama_block":
                    configs = GEMM if step.choice.pattern == "gemm" else ATTN if step.choice.pattern == "attention" else configs
                configs = [c for c in configs if step.kernel.space.is_valid(c)]
                compile_configs(step.kernel, step.compiled, tensors, configs)  # (in parallel)
                for cfg in configs:
                    errs, worst = [], 0.0
                    for _ in range(REPEATS):
                        try:
                            outs = step.launch(tensors, cfg)
                        except Exception as e:  # noqa: BLE001 - reported, not fatal
                            errs = [f"failed: {type(e).__name__}: {str(e)[:120]}"]
                            break
                        for o, r in zip(outs, ref):
                            rms = r.float().pow(2).mean().sqrt()
                            bad = ((o.float() - r.float()).abs() > 0.05 * rms).float().mean().item()
                            bad = 1.0 if not torch.isfinite(o).all() else bad
                            worst = max(worst, bad)
                            errs.append(f"{rel_error(o, r):.1e}/{bad:.1%}")
                    keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA", "NORM_PASS", "PERSISTENT")
                    short = " ".join(f"{k}={cfg[k]}" for k in keys if k in cfg)
                    flag = "WRONG " if worst > 1e-3 else ""
                    print(f"{flag}{block:14s} M={m:5d} {step.choice.region:12s} {short} " + " ".join(errs), flush=True)
        del cm, mod
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
