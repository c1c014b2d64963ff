"""Where a split-K GEMM's time goes at 128 tokens (bench/NOTES.md 176): o-proj and down of two layers.

    python bench/split_tail.py OUT          # timings: OUT/tail.json
    ncu --clock-control none --nvtx --nvtx-include "prof/" --set full -o REP python bench/split_tail.py OUT --ncu

The split-K tail (`EpilogueEmitter._split_k`, `_reduce_partials`) is replaced before compiling by a variant, to
time what each stage costs by leaving it out (timing only where marked *: those give wrong sums):
  full       the tree
  relaxed    the counter's reset a relaxed exchange (not acq_rel)
  unroll     the partials read in a static_range (all issued together)
  pipe2/3    the partials read in a pipelined loop (`tl.range(num_stages=...)`: async copies into shared memory)
  own_pipe2  pipe2, the program's own part taken from its registers (a masked read), in the same order
  noreads*   the last program adds no partial (acc = its own part), the counter kept
  nosync*    partial sums stored, no counter: part SPLIT_K-1 runs the epilogue on its own part
  nostore*   no partial store, no counter: part SPLIT_K-1 runs the epilogue on its own part
each at 128x128 tiles (8 warps, 4 stages, TMA) split 2, 4 and 8 ways (and 64x128 with 4 warps); the tree (`full`) also
unsplit, in 64-row tiles and as quick tuning's cuBLAS-product config, and cuBLAS's bare product. Each is timed from a
CUDA graph after a dirty L2 clear (do_bench's), a clean one and none (bench/l2_clear.timed), its output compared
with the unsplit tile's (`err`) and with `full`'s at the same config bit for bit (`same`). `--ncu`: each variant's
4-way split and the tree's unsplit tile launched once in an NVTX range "prof" (Llama-3-8B only), for Nsight Compute.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402
from gemms import operands, region_inputs  # noqa: E402
from l2_clear import timed  # noqa: E402
from run import graphed  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.codegen.gemm import epilogue as E  # noqa: E402
from dlblas_compiler.codegen.kernel import compile_configs  # noqa: E402

ORIG_SPLIT, ORIG_REDUCE = E.EpilogueEmitter._split_k, E.EpilogueEmitter._reduce_partials


class Rewrite:
    """A Writer whose lines pass through f first (a line f maps to None is dropped)."""

    def __init__(self, w, f):
        self.w, self.f = w, f

    def __call__(self, line=""):
        line = self.f(line)
        if line is not None:
            self.w(line)

    def __getattr__(self, k):
        return getattr(self.w, k)


def set_variant(v: str) -> None:
    """Make EpilogueEmitter emit variant v's split-K tail (see the module docstring)."""
    C = E.EpilogueEmitter
    C._split_k, C._reduce_partials = ORIG_SPLIT, ORIG_REDUCE
    if v == "relaxed":
        C._reduce_partials = lambda self, w: ORIG_REDUCE(
            self, Rewrite(w, lambda s: s.replace(", 0)", ', 0, sem="relaxed")') if "atomic_xchg" in s else s)
        )
    elif v == "unroll":
        C._reduce_partials = lambda self, w: ORIG_REDUCE(
            self, Rewrite(w, lambda s: s.replace("range(SPLIT_K)", "tl.static_range(SPLIT_K)"))
        )
    elif v.startswith(("own", "pipe")):
        stages = v.rsplit("pipe", 1)[1] if "pipe" in v else ""

        def red(self, w):
            ns = len(self.plan.streams)
            own = v.startswith("own")
            for s in range(ns):
                if own:
                    w(f"own{s} = acc{s}")
                w(f"acc{s} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
            w(f"for j in tl.range(0, SPLIT_K, num_stages={stages}):" if stages else "for j in range(SPLIT_K):")
            w.indent()
            for s in range(ns):
                addr = f"ws_ptr + ((j * slots + slot) * {ns} + {s}) * BLOCK_M * BLOCK_N + offs"
                if own:
                    w(f'part = tl.load({addr}, mask=(offs >= 0) & (j != pid_k), other=0.0, cache_modifier=".cg")')
                    w(f"acc{s} += tl.where(j == pid_k, own{s}, part)")
                else:
                    w(f'acc{s} += tl.load({addr}, cache_modifier=".cg")')
            w.dedent()
            w('tl.atomic_xchg(cnt_ptr + slot, 0, sem="relaxed")')

        C._reduce_partials = red
    elif v == "noreads":

        def red(self, w):
            w("tl.atomic_xchg(cnt_ptr + slot, 0)")

        C._reduce_partials = red
    elif v in ("nosync", "nostore"):

        def split(self, w):
            w("if SPLIT_K > 1:")
            w.indent()
            if v == "nosync":
                w("slots = num_m * num_n - slot0")
                w("slot = pid - slot0")
                w("offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
                w("tl.store(ws_ptr + (pid_k * slots + slot) * BLOCK_M * BLOCK_N + offs, acc0)")
            w("last = pid_k == SPLIT_K - 1")
            w.dedent()
            w("else:")
            w("    last = True")

        C._split_k = split
        C._reduce_partials = lambda self, w: w("pass")


BASE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=4, TMA=1, MM=0,
            NORM_PASS=0, PERSISTENT=0, WS=0)  # fmt: skip
SMALL = [dict(BASE, BLOCK_M=64, BLOCK_N=bn, num_warps=4, num_stages=st, TMA=tma, SPLIT_K=sk) for bn, st, tma, sk in
         [(64, 4, 1, 1), (64, 6, 1, 1), (64, 4, 0, 1), (128, 4, 1, 1), (64, 4, 1, 2), (64, 6, 1, 2)]]  # fmt: skip
MMREF = dict(BASE, BLOCK_M=16, BLOCK_N=256, BLOCK_K=32, num_stages=2, TMA=0, MM=1)  # (quick tuning's o-proj at 128)
VARIANTS = ["full", "relaxed", "unroll", "noreads", "nosync", "nostore", "pipe2", "pipe3", "own_pipe2"]
# (not `own`: its own part kept beside the accumulator in a loop that is not pipelined spills 40 B a thread, offline)


def configs(v: str, ncu: bool = False) -> list[dict]:
    if ncu:
        return [dict(BASE, SPLIT_K=4)] + ([BASE] if v == "full" else [])
    if v == "full":
        return [dict(BASE, SPLIT_K=s) for s in (1, 2, 4, 8)] + SMALL + [MMREF]
    return [dict(BASE, SPLIT_K=s) for s in (2, 4, 8)] + [dict(BASE, BLOCK_M=64, num_warps=4, SPLIT_K=s) for s in (2, 4)]


def profiled(fn) -> None:
    """One call of fn in the NVTX range Nsight Compute is told to profile."""
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def time_variant(layer: str, v: str, mod, args, kwargs, ncu: bool, full: dict, res: list, cublas_done: set) -> None:
    """Compile the layer with variant v's tail; time (or, with ncu, launch once) its o-proj and down regions."""
    set_variant(v)
    cm = dc.compile(mod, backend="triton", tune="none", cuda_graphs=False)
    with torch.no_grad():
        cm(*args, **kwargs)
        for step, tensors in region_inputs(cm, args, kwargs):
            key = step.kernel.shape_key
            if "dl.add" not in {o.name for o in step.kernel.region.body_ops} or key["streams"] != 1:
                continue
            region = "o-proj" if key["K"] < 2 * key["N"] else "down"
            shape = {k: key[k] for k in ("M", "N", "K")}
            cfgs = configs(v, ncu)
            compile_configs(step.kernel, step.compiled, tensors, cfgs)
            want = [o.float() for o in step.launch(tensors, BASE)]
            for c in cfgs:
                got = step.launch(tensors, c)
                same_config = (layer, region, tuple(sorted(c.items())))
                if v == "full":
                    full[same_config] = [o.clone() for o in got]
                ref = full.get(same_config)
                same = None if ref is None else all(torch.equal(g, r) for g, r in zip(got, ref, strict=True))
                err = max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(got, want, strict=True))
                name = f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} T{c['TMA']} M{c['MM']}"
                if ncu:
                    print(f"PROFILED {layer} {region} {v} {name} SK{c['SPLIT_K']}", flush=True)
                    profiled(lambda s=step, t=tensors, c=c: s.launch(t, c))
                    continue
                g = graphed(lambda s=step, t=tensors, c=c: s.launch(t, c))
                t = timed(g.replay)
                del g
                res.append(dict(layer=layer, region=region, variant=v, split=c["SPLIT_K"], config=c, us=t, err=err,
                                same_bits_as_full=same, **shape))  # fmt: skip
                print(f"{layer} {region:6s} {v:9s} {name} SK{c['SPLIT_K']}  " + "  ".join(f"{k} {t[k]:6.1f}" for k in t)
                      + f"  err {err:.1e} same {same}", flush=True)  # fmt: skip
            if (layer, region) in cublas_done:
                continue
            cublas_done.add((layer, region))
            a, w = operands(step, tensors)
            o = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
            product = lambda a=a, w=w, o=o: torch.matmul(a, w.t(), out=o)  # noqa: E731
            if ncu:
                print(f"PROFILED {layer} {region} cuBLAS", flush=True)
                profiled(product)
                continue
            g = graphed(product)
            t = timed(g.replay)
            del g
            res.append(dict(layer=layer, region=region, variant="cublas", split=0, us=t, **shape))
            print(f"{layer} {region:6s} cuBLAS      " + "  ".join(f"{k} {t[k]:6.1f}" for k in t), flush=True)
    torch._dynamo.reset()


def main() -> None:
    out, ncu = sys.argv[1], "--ncu" in sys.argv
    os.makedirs(out, exist_ok=True)
    res, full, cublas_done = [], {}, set()
    for layer in ["llama3_8b"] if ncu else ["llama3_8b", "qwen25_7b"]:
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](128, torch.bfloat16, "cuda")
        for v in VARIANTS:
            if not ncu or v in ("full", "noreads", "nosync", "nostore"):
                time_variant(layer, v, mod, args, kwargs, ncu, full, res, cublas_done)
        if not ncu:
            with open(os.path.join(out, "tail.json"), "w") as f:
                json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                               rows=res), f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
