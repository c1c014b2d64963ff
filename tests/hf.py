"""Hugging Face modules built from small random configs (no download)."""

import torch
from transformers import LlamaConfig

from dlblas_compiler.models import randomize_


def llama_config(**kw) -> LlamaConfig:
    cfg = dict(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=2, vocab_size=128, max_position_embeddings=256, rms_norm_eps=1e-6,
    )  # fmt: skip
    cfg.update(kw)
    c = LlamaConfig(**cfg)
    c._attn_implementation = "sdpa"
    return c


def llama_layer_and_inputs(tokens: int = 8, dtype=torch.float32, seed: int = 0, **kw):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = llama_config(**kw)
    layer = randomize_(LlamaDecoderLayer(cfg, 0), seed).to(dtype).eval()
    x = torch.randn(1, tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    pos = torch.arange(tokens)[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(x, pos)
    return layer, (x,), {"position_embeddings": (cos, sin), "attention_mask": None}


def family_compiles(lengths) -> int:
    """Full compiles expected for a decode graph called once per cache length (past length P, mask length P + 1):
    shape families (`Options.shape_families`) compile the first two lengths whose sizes share their power-of-two
    buckets and instantiate the rest."""
    from collections import Counter

    from dlblas_compiler.tuning.cache import bucket

    groups = Counter((bucket(p), bucket(p + 1)) for p in lengths)
    return sum(min(2, n) for n in groups.values())
