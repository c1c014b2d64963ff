"""Row kernels over narrow last dims (1 to 128 elements), the rows per program of the template's default before
and after bench/NOTES.md 185, against eager and Inductor (bf16).

    python bench/narrow_rows.py --out OUT

Per case: one region of the row template, compiled untuned; its kernel timed at each config of a small grid (rows
per program from the old default, at most 16 rows, up to the new bound of about 2048 elements; 1, 4 and 8 warps),
at the old default, at the new default and at quick tuning's choice; eager's and Inductor's (default mode) call of
the same function. Each time is per call from a CUDA graph of 50 back-to-back calls (median of 7 replays; the
inputs are larger than L2), timed as bench/decode_attention.py times its kernels. The floor is the kernel's bytes
at the copy bandwidth of bench/ceilings.py. Every config's outputs are checked against eager in float32 first.
Writes OUT/narrow_rows.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from decode_attention import per_call_us  # noqa: E402  (µs per call from a CUDA graph of back-to-back calls)


class Gate(torch.nn.Module):
    """A gate with one element a row (Mamba2's dt and D terms, a `[..., 1]` router score)."""

    def forward(self, g, x):
        return torch.sigmoid(g) * x + g


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x.float(), -1).to(x.dtype)


class Share(torch.nn.Module):
    """Each element's share of its row's sum (a normalization over a small state dimension)."""

    def forward(self, x):
        return x / x.float().abs().sum(-1, keepdim=True).to(x.dtype)


# (name, module, input shapes): about 16M elements an input, so the kernels stream well past L2
CASES = [
    ("gate_n1", Gate, [(1 << 24, 1), (1 << 24, 1)]),
    ("softmax_n8", Softmax, [(1 << 21, 8)]),
    ("share_n16", Share, [(1 << 20, 16)]),
    ("softmax_n64", Softmax, [(1 << 18, 64)]),
    ("softmax_n128", Softmax, [(1 << 17, 128)]),
]


def row_step(cm):
    from dlblas_compiler.runtime.steps import RegionStep

    steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None]
    assert len(steps) == 1, [s.kernel.name for s in steps]
    return steps[0]


def grid(space, n: int, rows: int) -> list[dict]:
    """Rows per program from the old default up to the new bound, by factors of 4, with 1, 4 and 8 warps where the
    space allows them; the old and new defaults whatever the space's constraints say (a default is not checked
    against them: the old one for a last dim of one ran 4 warps over 16 elements)."""
    block_n = triton.next_power_of_2(n)
    old = max(1, min(16, 2048 // block_n))
    new = space.default()["BLOCK_M"]
    bms = sorted({*range_pow4(old, max(space.params["BLOCK_M"])), new})
    configs = [{"BLOCK_M": bm, "num_warps": w} for bm in bms for w in (1, 4, 8)]
    defaults = [{"BLOCK_M": old, "num_warps": space.default()["num_warps"]}, space.default()]  # (checked or not)
    seen, out = set(), []
    for c in defaults + configs:
        key = (c["BLOCK_M"], c["num_warps"])
        if key not in seen and (c in defaults or space.is_valid(c)):
            seen.add(key)
            out.append(c)
    return out


def range_pow4(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 4
    return out + ([hi] if out[-1] != hi else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from ceilings import measure

    import dlblas_compiler as dc

    copy_tbs = measure(products=1)["copy_bytes_per_s"] / 1e12
    gen = torch.Generator("cuda").manual_seed(0)
    rows_out = []
    for name, cls, shapes in CASES:
        xs = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen) for s in shapes]
        model = cls()
        ref = model(*[x.float() for x in xs])
        n, nrows = shapes[0][-1], shapes[0][0]
        with torch.no_grad():
            cm = dc.compile(model, backend="triton", tune="none", cuda_graphs=False, strict=True)
            cm(*xs)
            step = row_step(cm)
            space, default = step.kernel.space, dict(step.choice.config)
            old = {"BLOCK_M": max(1, min(16, 2048 // triton.next_power_of_2(n))), "num_warps": default["num_warps"]}
            configs = {}
            for config in grid(space, n, nrows):
                step.choice.impl, step.choice.config = "kernel", {**default, **config}
                out = cm(*xs)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, (name, config, err)
                key = f"BLOCK_M={config['BLOCK_M']},num_warps={config['num_warps']}"
                configs[key] = {"us": round(per_call_us(functools.partial(cm, *xs)), 2), "rel_err": err}
            step.choice.config = default
            tuned = dc.compile(model, backend="triton", tune="quick", cuda_graphs=False, strict=True)
            tuned(*xs)
            tstep = row_step(tuned)
            tuned_us = per_call_us(functools.partial(tuned, *xs))
            eager_us = per_call_us(functools.partial(model, *xs))
            ind = torch.compile(model)
            ind(*xs)
            inductor_us = per_call_us(functools.partial(ind, *xs))
        key = lambda c: f"BLOCK_M={c['BLOCK_M']},num_warps={c['num_warps']}"  # noqa: E731
        best = min(configs, key=lambda c: configs[c]["us"])
        row = {"case": name, "rows": nrows, "N": n, "floor_us": round(step.kernel.bytes / (copy_tbs * 1e12) * 1e6, 2),
               "old_default": key(old), "old_us": configs[key(old)]["us"],
               "new_default": key(default), "new_us": configs[key(default)]["us"],
               "best": best, "best_us": configs[best]["us"],
               "quick": key(tstep.choice.config) if tstep.choice.impl == "kernel" else tstep.choice.impl,
               "quick_us": round(tuned_us, 2), "eager_us": round(eager_us, 2), "inductor_us": round(inductor_us, 2),
               "configs": configs}  # fmt: skip
        rows_out.append(row)
        print(f"{name}: old {row['old_us']} µs ({row['old_default']}), new {row['new_us']} ({row['new_default']}), "
              f"best {row['best_us']} ({best}), quick {row['quick_us']} ({row['quick']}), eager {row['eager_us']}, "
              f"Inductor {row['inductor_us']}, floor {row['floor_us']}", flush=True)  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "narrow_rows.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "copy_tb_per_s": copy_tbs, "rows": rows_out}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
