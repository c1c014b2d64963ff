"""LayerNorm layers (bench/blocks.HF_LAYERS: StableLM-2-1.6B, Phi-2) compiled against float64 with eager's error
beside them, at a few rows (the GEMM's K loop normalizes its A tiles: NORM_PASS 0) and more (a row pass), and how
each LayerNorm region ran (bench/NOTES.md 150). Fails if ours is over 1.5x eager's error.

    OUT=DIR python bench/ln_check.py        # MS=1,5,16,40 TUNES=none,quick; DEV=cpu runs the interpreter
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import BLOCKS  # noqa: E402

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402

DEV = os.environ.get("DEV", "cuda")
BACKEND = "triton" if DEV == "cuda" else "interpret"


def first(out):
    return out[0] if isinstance(out, tuple) else out


def check(name: str, m: int, tune: str) -> dict:
    mod, args, kwargs, _, _ = BLOCKS[f"layer_{name}"](m, torch.bfloat16, DEV)
    with torch.no_grad():
        cos_sin = tuple(t.double() for t in kwargs["position_embeddings"])
        ref = first(copy.deepcopy(mod).double()(args[0].double(), position_embeddings=cos_sin, attention_mask=None))
        eager = first(mod(*args, **kwargs))
        cm = dc.compile(mod, backend=BACKEND, tune=tune)
        cm(*args, **kwargs)
        out = first(cm(*args, **kwargs))  # (the second call: the program as it then runs)
    steps = [s for s in cm._spec().executor.steps if getattr(s, "kernel", None) is not None]
    ln = [(s.kernel.name, s.choice.impl, s.choice.config.get("NORM_PASS"), s.choice.config.get("BLOCK_M"))
          for s in steps if "dl.layer_norm" in s.kernel.region_ir]  # fmt: skip
    return dict(layer=name, M=m, tune=tune, ours_err=rel_error(out, ref), eager_err=rel_error(eager, ref),
                ln_regions=ln, kernels=len(steps))  # fmt: skip


def main() -> None:
    rows = []
    for name in ("stablelm2_1_6b", "phi2"):
        for m in (int(v) for v in os.environ.get("MS", "1,5,16,40").split(",")):
            for tune in os.environ.get("TUNES", "none,quick").split(","):
                rows.append(check(name, m, tune))
                print(json.dumps(rows[-1]), flush=True)
                assert rows[-1]["ours_err"] <= 1.5 * rows[-1]["eager_err"] + 1e-3, rows[-1]
    import triton

    doc = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
    with open(os.path.join(os.environ.get("OUT", "."), "ln_check.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
