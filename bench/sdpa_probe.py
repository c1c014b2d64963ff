"""Which SDPA kernel torch runs, and how fast, for a head shape in the layouts a decoder layer hands it.

    python3 bench/sdpa_probe.py            # DeepSeek-V3 (192/128) and Llama-3-8B (128) heads, 2048 tokens
"""

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench


def kernels(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:90] for e in p.events() if e.device_type.name == "CUDA"})


def case(name, hq, hk, dqk, dv, s=2048):
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    # as a layer makes them: q/k/v come out of GEMMs as [b, s, heads, d] and are transposed to [b, heads, s, d]
    q_bshd = torch.randn(1, s, hq, dqk, device=dev, dtype=dt, generator=g)
    kv = torch.randn(1, s, hk, dqk + dv, device=dev, dtype=dt, generator=g)  # k and v side by side (DeepSeek)
    k_view, v_view = kv[..., :dqk].transpose(1, 2), kv[..., dqk:].transpose(1, 2)
    q_view = q_bshd.transpose(1, 2)
    qc, kc, vc = q_view.contiguous(), k_view.contiguous(), v_view.contiguous()
    gqa = hq != hk
    variants = {
        "contiguous q k v": (qc, kc, vc),
        "contiguous q k, v a view": (qc, kc, v_view),
        "all views": (q_view, k_view, v_view),
    }
    for label, (q, k, v) in variants.items():
        def run(q=q, k=k, v=v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        try:
            us = do_bench(run, warmup=25, rep=200) * 1e3
            names = kernels(run)
            print(f"{name:10s} {label:26s} {us:8.1f} us  {names}")
        except Exception as e:  # noqa: BLE001
            print(f"{name:10s} {label:26s} failed: {type(e).__name__}: {str(e)[:200]}")
    copy_us = do_bench(lambda: (v_view.contiguous(), q_view.contiguous(), k_view.contiguous()), rep=100) * 1e3
    print(f"{name:10s} copying q, k, v to contiguous: {copy_us:.1f} us")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    case("deepseek", 128, 128, 192, 128)
    case("llama", 32, 8, 128, 128)
