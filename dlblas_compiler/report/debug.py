"""The debug folder (`dump_ir="dir/"` or `DLBLAS_DEBUG_DIR=dir`), in the spirit of `TORCH_COMPILE_DEBUG`:

    dir/<graph index>-<model class>/            one per compiled module (each graph dynamo hands over)
        <specialization index>-<signature>/     one per input signature compiled
            ir/NN-<stage>.mlir                  the IR after every pass (written by `passes.run_pipeline`)
            kernels/<kernel>.py                 every generated kernel's source (written by `lower_module`)
            tuning.json                         what runs each region: config, times, trials, from the cache
            report.txt, report.json, report.html

Indices count up from what the folder already holds, so nothing is overwritten across compiles or runs.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import Report

_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64", "int32": "i32"}


def numbered_folder(root: str, name: str) -> str:
    """A new folder `root/<n>-<name>`, n one past the highest index already there."""
    os.makedirs(root, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:80]
    taken = [int(m.group(1)) for e in os.listdir(root) if (m := re.match(r"(\d+)-", e))]
    index = max(taken, default=-1) + 1
    while True:
        path = os.path.join(root, f"{index}-{name}")
        try:
            os.makedirs(path)
            return path
        except FileExistsError:  # (another compile took it meanwhile)
            index += 1


def tensor_text(t: torch.Tensor) -> str:
    """`f32[1,8,64]`."""
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{_DTYPES.get(dtype, dtype)}[{','.join(map(str, t.shape))}]"


def signature_text(args: tuple, kwargs: dict, limit: int = 4) -> str:
    """The call's input tensors (parameters passed as inputs, as dynamo does, left out): `f32[1,8,64], f32[8,16]`,
    the first `limit` of them, then how many more."""
    tensors = [v for v in pytree.tree_leaves((args, kwargs))
               if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]  # fmt: skip
    text = ", ".join(tensor_text(t) for t in tensors[:limit])
    if len(tensors) > limit:
        text += f" (+{len(tensors) - limit} more)"
    return text or "no tensors"


def folder_name(signature: str) -> str:
    """A signature as a short folder name: `f32[1,8,64], f32[8,16]` -> `f32_1x8x64-f32_8x16`."""
    name = re.sub(r"\[([^\]]*)\]", lambda m: "_" + m.group(1).replace(",", "x"), signature)
    name = re.sub(r"[^A-Za-z0-9_x+]+", "-", name.replace(", ", "-")).strip("-")
    return name[:60] or "call"


def write_specialization(folder: str, report: Report) -> None:
    """The files a specialization's folder gets after its first call: the kernel choices and the report."""
    choices: list[dict[str, Any]] = [c.to_dict() for c in report.kernels]
    with open(os.path.join(folder, "tuning.json"), "w") as f:
        json.dump(choices, f, indent=1)
    with open(os.path.join(folder, "report.txt"), "w") as f:
        f.write(report.text(detail=True) + "\n")
    with open(os.path.join(folder, "report.json"), "w") as f:
        f.write(report.to_json(indent=1))
    report.write_html(os.path.join(folder, "report.html"))
