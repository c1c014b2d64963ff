"""What a CUDA-graph replay's copies cost a compiled layer's call, A/B in one process.

    python bench/graph_copies.py --out OUT [--blocks layer_llama3_8b,layer_qwen25_7b] [--tokens 2048] [--rounds 5]

A: the graph reads a large input where the caller's tensor is and hands out its own output buffers (what
`runtime.graphs.CudaGraph` does while the caller passes one input tensor and drops each output before the next
call, as do_bench does). B: the input copied into the graph's buffer and the outputs cloned before they are
returned (the tree before bench/NOTES.md 155). One compiled layer (quick tuning); per round each way is captured
afresh and timed by do_bench (L2 cleared before each call), the order alternating between rounds. Writes
OUT/graph_copies.json (per block: each round's µs and the medians).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlblas_compiler as dc  # noqa: E402
from blocks import BLOCKS  # noqa: E402


def ab(block: str, m: int, rounds: int) -> dict:
    from triton.testing import do_bench

    mod, args, kwargs, _, _ = BLOCKS[block](m, torch.bfloat16, "cuda")
    with torch.no_grad():
        cm = dc.compile(mod, backend="triton", tune="quick")
        for _ in range(3):
            cm(*args, **kwargs)
        program = cm._spec().executor
        res = {"block": block, "M": m, "note": program.graph_note, "A": [], "B": []}
        for r in range(rounds):
            for way in "AB" if r % 2 == 0 else "BA":
                program.graph = None  # (captured again on the next call, the way's way)
                program.copy_inputs, program.handout = way == "B", way == "A"
                for _ in range(2):
                    cm(*args, **kwargs)
                res.setdefault(f"in_place_{way}", list(program.graph.in_place) if program.graph else None)
                res[way].append(do_bench(lambda: cm(*args, **kwargs), warmup=25, rep=100) * 1e3)
    res["A_med"], res["B_med"] = statistics.median(res["A"]), statistics.median(res["B"])
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="graph_copies_out")
    p.add_argument("--blocks", default="layer_llama3_8b,layer_qwen25_7b")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    import triton

    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "M": a.tokens, "tune": "quick", "rows": []}  # fmt: skip
    os.makedirs(a.out, exist_ok=True)
    for block in a.blocks.split(","):
        doc["rows"].append(ab(block, a.tokens, a.rounds))
        print(json.dumps(doc["rows"][-1]), flush=True)
        torch.cuda.empty_cache()
        with open(os.path.join(a.out, "graph_copies.json"), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
