"""Write the generated table of docs/architectures.md: every Hugging Face architecture of tests/e2e/test_hf_models.py
(tiny random configs, 2 layers) compiled with `dc.compile(backend="interpret")` on the CPU, its output compared
with eager's, and its report's regions, kernels and what stayed outside a region.

    .venv/bin/python scripts/architectures.py          # rewrites the table between the markers in the doc
    .venv/bin/python scripts/architectures.py --check  # exits 1 if the doc's table differs from a fresh run
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import warnings
from collections import Counter

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dlblas_compiler as dc  # noqa: E402
from dlblas_compiler.numerics import rel_error  # noqa: E402
from tests.e2e.test_hf_models import MODELS, MORE_REGIONS, _ids, causal_lm, main_output, run_kwargs  # noqa: E402

DOC = ROOT / "docs" / "architectures.md"
BEGIN, END = "<!-- begin: scripts/architectures.py -->", "<!-- end: scripts/architectures.py -->"
NAMES = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma", "gemma2": "Gemma2",
    "phi3": "Phi-3", "phi": "Phi", "gpt2": "GPT-2", "gpt_neox": "GPT-NeoX", "opt": "OPT", "falcon": "Falcon",
    "falcon-gqa": "Falcon (new decoder, GQA)", "stablelm": "StableLM", "bert": "BERT", "t5_encoder": "T5 encoder",
    "mixtral": "Mixtral", "deepseek_v2": "DeepSeek-V2", "deepseek_v3": "DeepSeek-V3", "gemma3": "Gemma3",
    "cohere": "Cohere (Command-R)", "granite": "Granite", "olmo2": "OLMo2", "starcoder2": "StarCoder2",
    "qwen3_moe": "Qwen3-MoE", "gpt_bigcode": "GPT-BigCode (StarCoder)", "bloom": "BLOOM (eager attention, ALiBi)",
}  # fmt: skip


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def row(name: str) -> str:
    model, ids = causal_lm(name), _ids()
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, ref = (main_output(name, m(ids, **run_kwargs(name))) for m in (cm, model))
        err = rel_error(out, ref)
    rep = cm.report()
    regions = Counter(rep.patterns)
    kernels = sum(1 for impl in rep.impls().values() if impl == "kernel")
    rows = Counter(" ".join(o.removeprefix("dl.") for o in r.ops) for r in rep.regions if r.pattern == "row")
    outside = Counter({op.removeprefix("dl."): n for op, n in rep.unfused.items()})
    torch_calls = Counter(f.name for f in rep.fallbacks)
    cells = [
        NAMES.get(name, name),
        _bound(err),
        " / ".join(str(regions.get(p, 0)) for p in ("gemm", "attention", "row")),
        str(kernels),
        "; ".join(f"{ops} ×{n}" if n > 1 else ops for ops, n in rows.items()) or "-",
        _counts(outside) or "-",
        str(sum(torch_calls.values())),
    ]
    return "| " + " | ".join(cells) + " |"


def table() -> str:
    head = [
        "| model | rel. error vs eager | regions: gemm / attention / row | kernels | row kernels (ops in each) "
        "| dl ops outside regions (torch reference per call) | torch calls (integer / boolean ops) |",
        "|---|---|---|---|---|---|---|",
    ]
    names = [*MODELS, *MORE_REGIONS]
    return "\n".join([*head, *(row(n) for n in names)])


def _bound(err: float) -> str:
    """The relative error as the power of ten at or above it (`≤ 1e-06`): its digits vary between machines and torch
    builds, and the table must compare equal (`--check`) wherever it is regenerated."""
    return "0" if err == 0 else f"≤ 1e{math.ceil(math.log10(err)):03d}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the doc instead of writing it")
    args = ap.parse_args()
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = f"{text[:start]}\n{table()}\n{text[end:]}"
    if args.check:
        same = new == text
        print("docs/architectures.md is up to date" if same else "docs/architectures.md differs from a fresh run")
        return 0 if same else 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
