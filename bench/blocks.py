"""The blocks the benchmarks time, at Llama-3-8B dims, with their roofline floor.

Each `make_<block>(M, dtype, device)` returns (module, args, kwargs, bytes, flops): bytes are the fewest
a kernel must move (inputs read once, outputs written once), flops the useful arithmetic.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from dlblas_compiler.models import RMSNorm, randomize_, rope_cos_sin, rotate_half

try:
    from ceilings import fixed
except ImportError:  # imported as bench.blocks (dlblas-compiler tune bench.blocks:make_layer)
    from bench.ceilings import fixed

H, I, HQ, HK, D = 4096, 14336, 32, 8, 128
EPS = 1e-5


class AddRMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(H, EPS)

    def forward(self, x, residual):
        s = x + residual
        return self.norm(s), s


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class NormQKVRope(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(H, EPS)
        self.q_proj = nn.Linear(H, HQ * D, bias=False)
        self.k_proj = nn.Linear(H, HK * D, bias=False)
        self.v_proj = nn.Linear(H, HK * D, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.norm(x)
        q = self.q_proj(h).view(b, s, HQ, D).transpose(1, 2)
        k = self.k_proj(h).view(b, s, HK, D).transpose(1, 2)
        v = self.v_proj(h).view(b, s, HK, D).transpose(1, 2)
        c, sn = cos[None, None], sin[None, None]
        return q * c + rotate_half(q) * sn, k * c + rotate_half(k) * sn, v


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class NanoGPTBlock(nn.Module):
    """nanoGPT's transformer block as its model.py writes it without flash attention: LayerNorm, one q/k/v linear
    with bias, the scores' future keys set to -inf through a causal buffer (`masked_fill`), softmax, the output
    projection and a GELU MLP, both with residuals. GPT-2 medium's dims (1024 wide, 16 heads of 64)."""

    def __init__(self, d: int = 1024, heads: int = 16, block_size: int = 4096):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def attn(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


def make_nanogpt_block(m, dtype, device):
    d, heads = 1024, 16
    mod = randomize_(NanoGPTBlock(d, heads, max(m, 16))).to(device=device, dtype=dtype).eval()
    x = _randn(1, m, d, dtype=dtype, device=device, seed=1)
    weights = 12 * d * d + 13 * d
    e = dtype.itemsize
    flops = 2 * m * 12 * d * d + 4 * heads * m * m * (d // heads) / 2  # (causal attention: half the products)
    return mod, (x,), {}, (weights + 2 * m * d + m * m) * e, flops


def _randn(*shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def make_add_rmsnorm(m, dtype, device):
    mod = randomize_(AddRMSNorm()).to(device=device, dtype=dtype).eval()
    x, r = _randn(1, m, H, dtype=dtype, device=device, seed=1), _randn(1, m, H, dtype=dtype, device=device, seed=2)
    e = dtype.itemsize
    return mod, (x, r), {}, (4 * m * H + H) * e, 4 * m * H


def make_swiglu(m, dtype, device):
    mod = randomize_(SwiGLU()).to(device=device, dtype=dtype).eval()
    x = _randn(1, m, H, dtype=dtype, device=device, seed=1)
    e = dtype.itemsize
    return mod, (x,), {}, (3 * H * I + 2 * m * H + 0) * e, 2 * m * H * I * 3


def make_norm_qkv_rope(m, dtype, device):
    mod = randomize_(NormQKVRope()).to(device=device, dtype=dtype).eval()
    x = _randn(1, m, H, dtype=dtype, device=device, seed=1)
    cos, sin = rope_cos_sin(m, D, 500000.0, dtype, device)
    n = (HQ + 2 * HK) * D
    e = dtype.itemsize
    return mod, (x, cos, sin), {}, (H * n + m * H + m * n + 2 * m * D) * e, 2 * m * H * n


def make_attention(m, dtype, device):
    q = _randn(1, HQ, m, D, dtype=dtype, device=device, seed=1)
    k = _randn(1, HK, m, D, dtype=dtype, device=device, seed=2)
    v = _randn(1, HK, m, D, dtype=dtype, device=device, seed=3)
    e = dtype.itemsize
    return Attention(), (q, k, v), {}, (2 * HQ * m * D + 2 * HK * m * D) * e, 4 * HQ * m * m * D / 2


def hf_llama_config(layers: int = 1):
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        hidden_size=H, intermediate_size=I, num_attention_heads=HQ, num_key_value_heads=HK, head_dim=D,
        num_hidden_layers=layers, vocab_size=128256, rms_norm_eps=EPS, rope_theta=500000.0, max_position_embeddings=8192,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    return cfg


def make_layer(m, dtype, device):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = hf_llama_config()
    with torch.device(device):
        layer = LlamaDecoderLayer(cfg, 0)
    layer = randomize_(layer).to(dtype=dtype).eval()
    x = _randn(1, m, H, dtype=dtype, device=device, seed=1)
    cos, sin = LlamaRotaryEmbedding(cfg, device=device)(x, torch.arange(m, device=device)[None])
    n_qkv = (HQ + 2 * HK) * D
    weights = H * n_qkv + HQ * D * H + 3 * H * I + 2 * H
    e = dtype.itemsize
    flops = 2 * m * (H * n_qkv + HQ * D * H + 3 * H * I) + 4 * HQ * m * m * D / 2
    return layer, (x,), {"position_embeddings": (cos, sin), "attention_mask": None}, (weights + 2 * m * H) * e, flops


def make_model(m, dtype, device, layers: int = 2):
    from transformers import LlamaForCausalLM

    cfg = hf_llama_config(layers)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model = randomize_(model, scale=0.3).to(dtype=dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, m), generator=torch.Generator().manual_seed(1)).to(device)
    n_qkv = (HQ + 2 * HK) * D
    per_layer = H * n_qkv + HQ * D * H + 3 * H * I + 2 * H
    weights = layers * per_layer + cfg.vocab_size * H + H + m * H  # layers, lm_head, final norm, m embedding rows
    e = dtype.itemsize
    flops = layers * 2 * m * (H * n_qkv + HQ * D * H + 3 * H * I) + 2 * m * H * cfg.vocab_size
    flops += layers * 4 * HQ * m * m * D / 2  # causal attention
    return model, (ids,), {"use_cache": False}, weights * e + m * cfg.vocab_size * e, flops


# Published Hugging Face configurations of popular models (dims only; weights are random): the decoder layers
# of issue 19's GEMM goals. name -> (model_type, config fields).
HF_LAYERS = {
    "llama3_8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0)),
    "qwen25_7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                                num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1000000.0)),
    "gemma_7b": ("gemma", dict(hidden_size=3072, intermediate_size=24576, num_attention_heads=16,
                               num_key_value_heads=16, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                               hidden_activation="gelu_pytorch_tanh")),
    "llama32_3b": ("llama", dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                                 num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0)),
    "mistral_nemo_12b": ("mistral", dict(hidden_size=5120, intermediate_size=14336, num_attention_heads=32,
                                         num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                                         rope_theta=1000000.0)),
    "phi3_mini": ("phi3", dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=32,
                               num_key_value_heads=32, rms_norm_eps=1e-5, rope_theta=10000.0)),
    "qwen3_8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0)),
    # LayerNorm models: the norm joins the GEMM after it (a few rows normalized in its K loop, NOTES 150).
    # StableLM-2-1.6B: Llama's layout with LayerNorms, q/k/v biases and a quarter of each head rotated
    "stablelm2_1_6b": ("stablelm", dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                                        num_key_value_heads=32, partial_rotary_factor=0.25, layer_norm_eps=1e-5,
                                        rope_theta=10000.0, use_qkv_bias=True)),
    # Phi-2: one LayerNorm read by the attention and the MLP in parallel, 80-dim heads (32 rotated), a GELU MLP
    "phi2": ("phi", dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=32, num_key_value_heads=32,
                         partial_rotary_factor=0.4, layer_norm_eps=1e-5, rope_theta=10000.0)),
    # DeepSeek-V3's first (dense) layer: multi-head latent attention (q through a rank-1536 projection, keys and
    # values expanded from a rank-512 latent, 64 rotary dims per head rotated as pairs), a dense SwiGLU MLP
    "deepseek_v3_dense": ("deepseek_v3", dict(hidden_size=7168, intermediate_size=18432, num_attention_heads=128,
                                              num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                                              qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                              first_k_dense_replace=3, rms_norm_eps=1e-6, rope_theta=10000.0)),
}  # fmt: skip


def hf_layer_dims(name: str) -> dict:
    """hidden, intermediate, q heads, kv heads, head dim of a HF_LAYERS entry."""
    _, f = HF_LAYERS[name]
    hq = f["num_attention_heads"]
    return {"H": f["hidden_size"], "I": f["intermediate_size"], "HQ": hq, "HK": f["num_key_value_heads"],
            "D": f.get("head_dim", f["hidden_size"] // hq)}  # fmt: skip


def make_hf_layer(name: str, m: int, dtype, device):
    """One decoder layer of a published HF configuration, random weights, called as its model calls it
    (position embeddings from the model's rotary module, no mask: SDPA's causal path)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields = HF_LAYERS[name]
    cfg = AutoConfig.for_model(model_type, num_hidden_layers=1, vocab_size=256, max_position_embeddings=8192,
                                pad_token_id=None, bos_token_id=None, eos_token_id=None, **fields)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    layer = randomize_(layer.to_empty(device=device)).to(dtype=dtype).eval()
    rotary = type(rotary)(cfg, device=device)
    h, hq = fields["hidden_size"], fields["num_attention_heads"]
    dh = fields.get("head_dim", h // hq)
    dqk = fields.get("qk_nope_head_dim", 0) + fields.get("qk_rope_head_dim", 0) or dh  # (latent attention's dims)
    dv = fields.get("v_head_dim", dh)
    x = _randn(1, m, h, dtype=dtype, device=device, seed=1)
    cos, sin = rotary(x, torch.arange(m, device=device)[None])
    weights = sum(p.numel() for p in layer.parameters())
    matrices = sum(p.numel() for p in layer.parameters() if p.dim() == 2)
    flops = 2 * m * matrices + 2 * hq * m * m * (dqk + dv) / 2  # (the GEMMs; causal attention's two products)
    e = dtype.itemsize
    return layer, (x,), {"position_embeddings": (cos, sin), "attention_mask": None}, (weights + 2 * m * h) * e, flops


BLOCKS = {
    "add_rmsnorm": make_add_rmsnorm,
    "swiglu_mlp": make_swiglu,
    "norm_qkv_rope": make_norm_qkv_rope,
    "attention": make_attention,
    "decoder_layer": make_layer,
    "llama_2layer": make_model,
    "nanogpt_block": make_nanogpt_block,
    **{f"layer_{n}": (lambda n: lambda m, dtype, device: make_hf_layer(n, m, dtype, device))(n) for n in HF_LAYERS},
}


def floor_us(gpu_name: str, nbytes: float, flops: float, ceilings: dict | None = None) -> float:
    """max(bytes / copy bandwidth, flops / bf16 matmul rate) in µs: with `ceilings` (bench/ceilings.measure(),
    measured in the same run) where given, else the fixed, unmeasured constants of bench/ceilings.FIXED."""
    if ceilings:
        bw, fl = ceilings["copy_bytes_per_s"], ceilings["bf16_matmul_flops"]
    else:
        bw, fl = fixed(gpu_name)
    return max(nbytes / bw, flops / fl) * 1e6


__all__ = ["BLOCKS", "floor_us", "math"]
