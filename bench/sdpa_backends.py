"""Each SDPA backend torch has, timed on the attention of issue 19's layers at prefill (causal, one sequence).

    python3 bench/sdpa_backends.py --out OUT [--layers llama3_8b,qwen25_7b] [--tokens 2048]

For each layer's head shape: the backend torch picks by default, then each backend forced (flash, memory-efficient,
cuDNN), with grouped keys as given (`enable_gqa`) and with the key/value heads repeated to the query's first (the
repeat timed on its own too). Each output's error against a float32 math reference, and the CUDA kernels that ran.
Times are do_bench medians with L2 cleared; TFLOP/s counts the causal half of the scores.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
from blocks import hf_layer_dims  # noqa: E402

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}  # fmt: skip


def kernels(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:80] for e in p.events() if e.device_type.name == "CUDA"})


def measure(layer: str, s: int) -> list[dict]:
    d = hf_layer_dims(layer)
    hq, hk, dh = d["HQ"], d["HK"], d["D"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, h, s, dh, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hk, hk))
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=hq != hk)
    flops = 4 * s * s * dh * hq / 2
    rep = hq // hk
    repeat_us = do_bench(lambda: (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)), rep=100) * 1e3
    kx, vx = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    rows = []
    for name, backend in BACKENDS.items():
        for heads, (kk, vv) in (("grouped", (k, v)), ("repeated", (kx, vx))):
            if heads == "repeated" and rep == 1:
                continue

            def run(kk=kk, vv=vv, backend=backend):
                if backend is None:
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=kk.shape[1] != hq)
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=kk.shape[1] != hq)

            row = {"layer": layer, "tokens": s, "heads": f"{hq}/{hk}x{dh}", "backend": name, "kv": heads}
            try:
                out = run()
                row["rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
                row["us"] = do_bench(run, warmup=25, rep=200) * 1e3
                row["tflops"] = flops / row["us"] / 1e6
                row["kernels"] = kernels(run)
                if heads == "repeated":
                    row["repeat_us"] = repeat_us
            except Exception as e:  # noqa: BLE001 (a backend that does not take the shape is a row too)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            print(json.dumps({k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in row.items()}),
                  flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="llama3_8b,qwen25_7b,gemma_7b,mistral_nemo_12b,llama32_3b")
    ap.add_argument("--tokens", type=int, default=2048)
    a = ap.parse_args()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    print(json.dumps(meta), flush=True)
    rows = [r for layer in a.layers.split(",") for r in measure(layer, a.tokens)]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sdpa_backends.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
