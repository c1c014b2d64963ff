"""What eager's SDPA gives on attention rows whose every key is masked out, per kernel, dtype and mask spelling
(docs/bad-inputs.md; bench/NOTES.md 184). GPU only: python3 bench/sdpa_masked_rows.py (from the repository root).

Per line: the distance (norm) of the masked rows' output from 0, from the mean of v over all keys, from the value of
key 0; and the largest difference on the other batch's rows from torch's math kernel in fp32. Then an fp32 HF Llama
(the tests' padded batch) under bf16 autocast against itself in fp32, with the math kernel only and by default."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dlblas_compiler.numerics import rel_error  # noqa: E402
from tests.e2e.test_everyday_inputs import _padded_llama  # noqa: E402

BACKENDS = (None, SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
            SDPBackend.FLASH_ATTENTION)  # None: eager's own choice


def sdpa(q, k, v, m, backend):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def kernels() -> None:
    torch.manual_seed(0)
    B, H, L, D = 2, 4, 7, 64
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype) for _ in range(3))
        keep = torch.ones(L, L, dtype=torch.bool, device="cuda").tril().expand(B, 1, L, L).clone()
        keep[1, :, :, :3] = False  # left padding: rows 0..2 of batch 1 see no key
        fmask = torch.zeros(keep.shape, dtype=dtype, device="cuda").masked_fill(~keep, torch.finfo(dtype).min)
        imask = torch.zeros(keep.shape, dtype=dtype, device="cuda").masked_fill(~keep, float("-inf"))
        meanv = v[1].float().mean(-2)  # per head, the mean of v over all keys
        for mname, m in (("bool", keep), ("finfo.min", fmask), ("-inf", imask)):
            exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                   attn_mask=m if m.dtype == torch.bool else m.float())
            for be in BACKENDS:
                try:
                    o = sdpa(q, k, v, m, be)
                except RuntimeError as e:
                    print(f"{str(dtype):15s} {mname:9s} {str(be):30s} unsupported: {str(e).splitlines()[0][:80]}")
                    continue
                rows = o[1, :, :3].float()
                print(f"{str(dtype):15s} {mname:9s} {str(be):30s} finite={bool(torch.isfinite(rows).all())} "
                      f"|rows|max={rows.abs().max().item():.4f} vs0 dist={rows.norm().item():.4f} "
                      f"vs meanV(all keys) dist={(rows - meanv[:, None, :]).norm().item():.4f} "
                      f"vs v[key 0] dist={(rows - v[1, :, :1].float()).norm().item():.4f} "
                      f"realrows vs math: {(o[0].float() - exact[0]).abs().max().item():.2e}")


def llama() -> None:
    model, ids, mask = _padded_llama()
    model, ids, mask = model.cuda(), ids.cuda(), mask.cuda()
    with torch.no_grad():
        ref32 = model(ids, attention_mask=mask).logits
        with torch.autocast("cuda", dtype=torch.bfloat16):
            refa = model(ids, attention_mask=mask).logits
            with sdpa_kernel([SDPBackend.MATH]):
                refm = model(ids, attention_mask=mask).logits
    real = mask.bool()
    print("fp32 eager vs autocast eager, padded rows rel:", rel_error(refa[1, :3].float(), ref32[1, :3]),
          "real:", rel_error(refa[real].float(), ref32[real]))
    print("autocast math-only vs autocast default, padded rows rel:",
          rel_error(refm[1, :3].float(), refa[1, :3].float()))
    print("autocast math-only vs fp32, padded rows rel:", rel_error(refm[1, :3].float(), ref32[1, :3]))
    print("model config attn impl:", model.config._attn_implementation)


if __name__ == "__main__":
    kernels()
    llama()
