"""Small reference models used by the demo, the tests and the benchmarks.

`LlamaBlock` is a hand-written Llama-style decoder layer (RMSNorm, q/k/v projections, rotary,
attention by SDPA or by explicit softmax(QK^T)V, o-proj, residual, RMSNorm, SwiGLU MLP), written the
way model code usually is, so the compiler's pattern recognition sees realistic spellings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BlockConfig:
    hidden: int = 64
    intermediate: int = 160
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    eps: float = 1e-6
    rope_theta: float = 10000.0
    attention: str = "sdpa"  # or "explicit"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(seq: int, head_dim: int, theta: float = 10000.0, dtype=torch.float32, device=None):
    """cos, sin of shape [seq, head_dim] in the half-split (NeoX / HF) layout."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class LlamaBlock(nn.Module):
    """forward(x [B, S, H], cos [S, D], sin [S, D]) -> [B, S, H]; causal attention."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.head_dim
        self.input_norm = RMSNorm(h, cfg.eps)
        self.q_proj = nn.Linear(h, cfg.heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.heads * d, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, h, bias=False)

    def attention(self, q, k, v):
        cfg = self.cfg
        if cfg.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        groups = cfg.heads // cfg.kv_heads
        b, hk, s, d = k.shape
        k = k[:, :, None, :, :].expand(b, hk, groups, s, d).reshape(b, hk * groups, s, d)
        v = v[:, :, None, :, :].expand(b, hk, groups, s, d).reshape(b, hk * groups, s, d)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        mask = torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
        scores = scores + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, s, _ = x.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        c, sn = cos.unsqueeze(0).unsqueeze(0), sin.unsqueeze(0).unsqueeze(0)
        q = q * c + rotate_half(q) * sn
        k = k * c + rotate_half(k) * sn
        attn = self.attention(q, k, v)
        attn = attn.transpose(1, 2).reshape(b, s, cfg.heads * cfg.head_dim)
        x = x + self.o_proj(attn)
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def llama_block_inputs(cfg: BlockConfig, batch: int, seq: int, dtype=torch.float32, device=None, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(batch, seq, cfg.hidden, generator=g).to(dtype=dtype, device=device)
    cos, sin = rope_cos_sin(seq, cfg.head_dim, cfg.rope_theta, dtype, device)
    return x, cos, sin


def randomize_(model: nn.Module, seed: int = 0, scale: float = 0.5, device: str | torch.device = "cpu") -> nn.Module:
    """Fill every parameter with random values (norm weights around 1) so no test runs on ones/zeros. The values
    are drawn on `device` (a CUDA generator fills an 8B-parameter model in seconds; the CPU's takes a minute)."""
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, device=device)
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * r)
            else:
                p.copy_(r * scale / math.sqrt(p.shape[-1]) if p.dim() > 1 else r * 0.1)
    return model
