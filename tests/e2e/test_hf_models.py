"""Hugging Face causal LMs end to end on CPU, built from small random configs (no download).

Each model is compiled both ways (`dc.compile` and `torch.compile(backend="dlblas")`) with the reference
and interpret backends: logits equal eager, and every decoder layer fuses to the kernels `REGIONS` lists. Greedy
`generate()` through the dynamo backend with a KV cache gives eager's tokens.
"""

import warnings
from collections import Counter

import pytest
import torch
import transformers

import dlblas_compiler as dc
from dlblas_compiler import dynamo
from dlblas_compiler.models import randomize_
from dlblas_compiler.numerics import rel_error

from ..hf import family_compiles, llama_config

SEQ = 7
BASE = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_hidden_layers=2, vocab_size=128,
            max_position_embeddings=256)  # fmt: skip

# per layer: norm+QKV+rotary, attention, o-proj+residual, norm+gate/up+SiLU, down+residual; then final norm+lm_head.
# The rotary embedding's cos and sin are one row kernel (with the cat(freqs, freqs) before them). Phi: the LayerNorm is
# the prologue of the GEMM after it (forty-fifth session, bench/NOTES.md 150; before, a row kernel), the MLP's GELU
# rides in the QKV GEMM's epilogue slot (attention and MLP read the same normed input), one residual GEMM adds both.
LLAMA_LIKE = Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2})
# GPT-2: LayerNorms are the prologues of the GEMMs after them (the position embedding's add a row kernel); per layer
# c_attn (+ bias and the head split), attention, c_proj + residual, c_fc + GELU, c_proj + residual: the Conv1D
# addmm's are linears.
# Falcon: cos/sin is a row kernel, the LayerNorm(s) the GEMMs' prologues; q/k/v share one GEMM (with the MLP's
# up-projection and GELU where attention and MLP read one norm), the down-projection adds both residuals; multi-query attention (1 k/v
# head) and grouped attention (k/v broadcast per group, rotary applied after) run as GQA. Multi-query: the q, k and
# v heads sliced from the fused projection's [.., heads + 2, D] view are slices of its columns (`algebraic`), so
# the q/k rotary rides in the GEMM; the new decoder architecture interleaves q, k and v per group (slices of a
# middle dim of the view): its weight's rows are ordered by slice once (`algebraic`), so the same holds there.
REGIONS = {
    "llama": LLAMA_LIKE,
    "qwen2": LLAMA_LIKE,
    "mistral": LLAMA_LIKE,
    "phi": Counter({"row": 1, "gemm": 3 * 2 + 1, "attention": 2}),
    "gpt2": Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2}),
    "falcon": Counter({"row": 1, "gemm": 3 * 2 + 1, "attention": 2}),
    "falcon-gqa": Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2}),
}
MODELS = list(REGIONS)

# More architectures, compiled once (dc.compile, interpret backend: the generated kernels). Rows beyond the rotary
# embedding's cos and sin (1): Gemma's embedding scale (Qwen3's per-head q/k RMSNorms and the rotary after them ride
# in the QKV GEMM's epilogue, as Llama's rotary does); Gemma2's post-attention and
# post-MLP norms and its soft-capped logits; OPT's embedding sum (its LayerNorms, GPT-NeoX's, StableLM's,
# Starcoder2's and GPT-BigCode's are the prologues of the GEMMs after them: bench/NOTES.md 150); BERT's LayerNorms
# (after the residual adds) and the embedding sums; Mixtral's router softmax and top-k run inside dl.moe (library kernels), its
# attention as Llama's. docs/architectures.md (scripts/architectures.py) lists each model's regions and what stays out.
MORE_REGIONS = {
    "qwen3": LLAMA_LIKE,
    "gemma": Counter({"row": 2, "gemm": 4 * 2 + 1, "attention": 2}),
    "gemma2": Counter({"row": 6, "gemm": 4 * 2 + 1, "attention": 2}),
    "phi3": LLAMA_LIKE,
    "gpt_neox": Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2}),  # (q/k slices and rotary in the QKV GEMM)
    "opt": Counter({"row": 2, "gemm": 4 * 2 + 1, "attention": 2}),
    "stablelm": Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2}),
    "bert": Counter({"row": 5, "gemm": 4 * 2 + 1, "attention": 2}),
    "t5_encoder": Counter({"row": 3, "gemm": 4 * 2, "attention": 2}),  # (the mask's where(mask, 0, min) a row)
    "mixtral": Counter({"row": 5, "gemm": 2 * 2 + 1, "attention": 2}),
    # multi-head latent attention: q and kv through low-rank projections with their own RMSNorms, k and v expanded
    # from the latent per head (the key states filled piece by piece through views: a concatenation), the rotary on
    # a slice of each head; the query's and key's concatenations (of the unrotated and the rotated dims) are row
    # kernels, one each per layer, as are the two that widen cos and sin for the rotary; layer 1's MoE routes by
    # torch ops (group-limited top-k in V3) over GEMM regions; V3's sums of the routing weights (keepdim) are row
    # kernels (before the seventieth session, with a region's rows taken from its results alone, torch calls), and
    # so are the routing's masked_fill's of scores and weights (torch calls before the seventy-second session)
    "deepseek_v2": Counter({"row": 19, "gemm": 12, "attention": 2}),
    "deepseek_v3": Counter({"row": 20, "gemm": 14, "attention": 2}),
    # (forty-third session: architectures no test named, each checked against eager first with a left-padded batch)
    # Gemma3: Gemma2's four norms a layer plus Qwen3's q/k norms, local and global rotary tables
    "gemma3": Counter({"row": 6, "gemm": 4 * 2 + 1, "attention": 2}),
    # Cohere: LayerNorm without bias, interleaved rotary pairs, attention and MLP in parallel from one norm
    "cohere": Counter({"row": 7, "gemm": 3 * 2 + 1, "attention": 2}),
    # Granite: the embedding, residual, attention and logits scaled by constants
    "granite": Counter({"row": 6, "gemm": 4 * 2 + 1, "attention": 2}),
    # OLMo2: norms after attention and MLP (not before), q/k RMSNorms over all heads' columns
    "olmo2": Counter({"row": 13, "gemm": 4 * 2 + 1, "attention": 2}),
    # Starcoder2: LayerNorm with bias, biases on every projection, a GELU MLP, a sliding window
    "starcoder2": Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2}),
    # Qwen3-MoE: Qwen3's attention, its routed MoE MLP captured as dl.moe (library kernels) in both layers, as Mixtral's
    "qwen3_moe": Counter({"row": 5, "gemm": 2 * 2 + 1, "attention": 2}),
    # GPT-BigCode (StarCoder): multi-query attention, learned positions, LayerNorm, GELU
    "gpt_bigcode": Counter({"row": 1, "gemm": 4 * 2 + 1, "attention": 2}),
    # BLOOM: ALiBi in HF's eager attention (baddbmm of the bias and the scaled scores): no attention region, the
    # scores and softmax run as GEMM and row kernels (its LayerNorms the GEMMs' prologues)
    "bloom": Counter({"row": 5, "gemm": 4 * 2 + 1}),
}
EAGER_ATTENTION = ("bloom",)  # (HF has no SDPA path for it)
ENCODERS = ("bert", "t5_encoder")  # outputs last_hidden_state; the others are causal LMs (logits)


def causal_lm(name: str) -> torch.nn.Module:
    """The model `name` (a key of REGIONS or MORE_REGIONS) from a tiny random config: 2 layers, hidden 64."""
    if name in MORE_REGIONS:
        cfg, cls = _more_config(name)
    elif name == "llama":
        cfg, cls = llama_config(), transformers.LlamaForCausalLM
    elif name == "qwen2":  # bias in q/k/v
        cfg, cls = transformers.Qwen2Config(**BASE, num_key_value_heads=2), transformers.Qwen2ForCausalLM
    elif name == "mistral":  # GQA (4 query heads share 1 kv head) and a sliding window shorter than the sequence
        cfg = transformers.MistralConfig(**BASE, num_key_value_heads=1, head_dim=16, sliding_window=4)
        cls = transformers.MistralForCausalLM
    elif name == "phi":  # partial rotary, GELU MLP, LayerNorm, attention and MLP in parallel
        cfg = transformers.PhiConfig(**BASE, num_key_value_heads=4, partial_rotary_factor=0.5)
        cls = transformers.PhiForCausalLM
    elif name == "gpt2":  # Conv1D projections (torch.addmm, weights [in, out]), GELU-tanh spelled out, LayerNorm
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, bos_token_id=0,
                                      eos_token_id=0)  # fmt: skip
        cls = transformers.GPT2LMHeadModel
    else:  # falcon: x @ W.T projections, rotary; multi-query (one k/v head) or the new decoder architecture (GQA)
        heads = dict(new_decoder_architecture=True, num_kv_heads=2) if name == "falcon-gqa" else dict(multi_query=True)
        shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
        cfg = transformers.FalconConfig(**shape, **heads)
        cls = transformers.FalconForCausalLM
    cfg._attn_implementation = "eager" if name in EAGER_ATTENTION else "sdpa"
    model = randomize_(cls(cfg)).eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = 0
    return model


def _more_config(name: str) -> tuple:
    t, kv = transformers, dict(num_key_value_heads=2)
    if name == "qwen3":  # q/k RMSNorm per head before the rotary
        return t.Qwen3Config(**BASE, **kv, head_dim=16), t.Qwen3ForCausalLM
    if name == "gemma":  # (1 + w) RMSNorm, GeGLU-tanh, scaled embedding
        return t.GemmaConfig(**BASE, **kv, head_dim=16), t.GemmaForCausalLM
    if name == "gemma2":  # post-norms, attention and final-logit soft-capping, a sliding window
        return t.Gemma2Config(**BASE, **kv, head_dim=16, sliding_window=4), t.Gemma2ForCausalLM
    if name == "phi3":  # fused qkv_proj and gate_up_proj weights
        return t.Phi3Config(**BASE, **kv, pad_token_id=0, eos_token_id=0, bos_token_id=0), t.Phi3ForCausalLM
    if name == "gpt_neox":  # fused interleaved-per-head qkv, partial rotary (25%), parallel attention and MLP
        return t.GPTNeoXConfig(**BASE, rotary_pct=0.25), t.GPTNeoXForCausalLM
    if name == "opt":  # learned positions, ReLU MLP, LayerNorm, biases everywhere
        shape = dict(hidden_size=64, ffn_dim=160, num_attention_heads=4, num_hidden_layers=2, vocab_size=128)
        return t.OPTConfig(**shape, max_position_embeddings=256, word_embed_proj_dim=64), t.OPTForCausalLM
    if name == "stablelm":  # LayerNorm, partial rotary (25%), SwiGLU
        return t.StableLmConfig(**BASE, **kv, partial_rotary_factor=0.25), t.StableLmForCausalLM
    if name == "bert":  # encoder: bidirectional attention with a padding mask, post-LayerNorm, GELU
        shape = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_hidden_layers=2, vocab_size=128)
        return t.BertConfig(**shape, max_position_embeddings=256), t.BertModel
    if name == "t5_encoder":  # relative position bias added to unscaled scores, RMSNorm without mean, ReLU MLP
        shape = dict(d_model=64, d_ff=160, d_kv=16, num_heads=4, num_layers=2, vocab_size=128)
        return t.T5Config(**shape), t.T5EncoderModel
    if name.startswith("deepseek"):  # V2: its rotary table in complex numbers, scaled; V3: a q projection of low rank
        mla = dict(num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                   n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                   v_head_dim=16)  # fmt: skip
        if name == "deepseek_v2":
            return t.DeepseekV2Config(**BASE, **mla, q_lora_rank=None), t.DeepseekV2ForCausalLM
        mla["v_head_dim"] = 32  # value heads wider than q/k's 16, as V3's are narrower (128 against 192)
        return t.DeepseekV3Config(**BASE, **mla, q_lora_rank=24, n_group=1, topk_group=1), t.DeepseekV3ForCausalLM
    if name == "gemma3":
        return t.Gemma3TextConfig(**BASE, **kv, head_dim=16, sliding_window=4), t.Gemma3ForCausalLM
    if name == "cohere":
        return t.CohereConfig(**BASE, **kv, pad_token_id=0, bos_token_id=0, eos_token_id=0), t.CohereForCausalLM
    if name == "granite":
        scales = dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=4.0)
        return t.GraniteConfig(**BASE, **kv, **scales), t.GraniteForCausalLM
    if name == "olmo2":
        return t.Olmo2Config(**BASE, **kv, pad_token_id=0, eos_token_id=0), t.Olmo2ForCausalLM
    if name == "starcoder2":
        return t.Starcoder2Config(**BASE, **kv, sliding_window=4, bos_token_id=0, eos_token_id=0), t.Starcoder2ForCausalLM
    if name == "qwen3_moe":
        moe = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
        return t.Qwen3MoeConfig(**BASE, **kv, head_dim=16, **moe), t.Qwen3MoeForCausalLM
    if name == "gpt_bigcode":
        shape = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, bos_token_id=0, eos_token_id=0)
        return t.GPTBigCodeConfig(**shape, multi_query=True), t.GPTBigCodeForCausalLM
    if name == "bloom":
        return t.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=128), t.BloomForCausalLM
    # mixtral: sparse MoE MLP captured as dl.moe (topk_gating + fused_moe)
    return t.MixtralConfig(**BASE, **kv, num_local_experts=4, num_experts_per_tok=2), t.MixtralForCausalLM


def run_kwargs(name: str) -> dict:
    """Keyword arguments of a compiled call: causal LMs without a cache (a DynamicCache is no exportable output)."""
    return {} if name in ENCODERS else {"use_cache": False}


def main_output(name: str, out) -> torch.Tensor:
    return out.last_hidden_state if name in ENCODERS else out.logits


def _ids(seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(1))


def _regions(cm) -> Counter:
    return Counter(cm.report().patterns)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize("name", MODELS)
def test_dc_compile_logits_equal_eager(name, backend):
    model, ids = causal_lm(name), _ids()
    cm = dc.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")  # no region fell back to its reference
        out = cm(ids, use_cache=False)  # a DynamicCache output is not an exportable value: no cache here
        ref = model(ids, use_cache=False)
    assert rel_error(out.logits, ref.logits) <= 1e-5
    assert _regions(cm) == REGIONS[name]


@pytest.mark.parametrize("name", list(MORE_REGIONS))
def test_more_architectures_equal_eager_on_interpret(name):
    """Once each (dc.compile, interpret): outputs within 1e-5 relative error of eager's, no region fell back."""
    model, ids = causal_lm(name), _ids()
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = main_output(name, cm(ids, **run_kwargs(name)))
        ref = main_output(name, model(ids, **run_kwargs(name)))
    assert rel_error(out, ref) <= 1e-5
    assert _regions(cm) == MORE_REGIONS[name]
    assert set(cm.report().impls().values()) == {"kernel"}


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_logits_equal_eager(name, backend, fresh_dynamo):
    model, ids = causal_lm(name), _ids()
    fast = torch.compile(model, backend="dlblas", options={"backend": backend})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = fast(ids)  # with the default cache: its updates run as torch calls inside the graph
        ref = model(ids)
    assert rel_error(out.logits, ref.logits) <= 1e-5
    (cm,) = dynamo.COMPILATIONS  # the whole forward is one graph
    assert _regions(cm) == REGIONS[name]


def test_generate_with_kv_cache_matches_eager(fresh_dynamo):
    """32 greedy tokens with the default DynamicCache. Dynamo compiles three graphs: the prefill, the first
    decode step, then (the cache length having changed again) one graph with a dynamic cache length that
    serves every later step. Each graph is specialized per concrete length, but of the last graph's 30 lengths
    only the first two of each power-of-two bucket are compiled (9): the others are instantiated from their
    shape family (tuning, on a GPU, is keyed by the same buckets, so it is not redone); the graph keeps its 16
    most recent (`max_specializations`)."""
    model, ids = causal_lm("llama"), _ids()
    kwargs = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, use_cache=True)
    with torch.no_grad():
        ref = model.generate(ids, **kwargs)
        model.forward = torch.compile(model.forward, backend="dlblas", options={"backend": "reference"})
        out = model.generate(ids, **kwargs)
    assert out.shape == (1, SEQ + 32)
    assert torch.equal(out, ref)
    assert [cm.compile_count for cm in dynamo.COMPILATIONS] == [1, 1, family_compiles(range(SEQ + 1, SEQ + 31))]
    assert dynamo.COMPILATIONS[2].compile_count + dynamo.COMPILATIONS[2].instances == 30
    assert [cm.specializations for cm in dynamo.COMPILATIONS] == [1, 1, 16]


# Architectures no issue names (tiny random configs): each compiles on interpret with logits equal to eager's and
# every region run by a generated kernel (those with region counts and a row in docs/architectures.md are in
# MORE_REGIONS). GPT-J and CodeGen have no SDPA path in transformers: eager attention (its softmax(q k^T) v is
# recognized for GPT-J; CodeGen's runs as its ops' kernels).
def _other(name: str):
    t, base = transformers, BASE
    small = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128)
    return {
        "falcon-classic": lambda: (t.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                  vocab_size=128, multi_query=False), t.FalconForCausalLM),
        "falcon-alibi": lambda: (t.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                vocab_size=128, multi_query=False, alibi=True), t.FalconForCausalLM),
        "gptj": lambda: (t.GPTJConfig(**small, rotary_dim=8, n_positions=256), t.GPTJForCausalLM),
        "codegen": lambda: (t.CodeGenConfig(**small, rotary_dim=8, n_positions=256, n_ctx=256), t.CodeGenForCausalLM),
        "persimmon": lambda: (t.PersimmonConfig(**base), t.PersimmonForCausalLM),
        "olmo": lambda: (t.OlmoConfig(**base), t.OlmoForCausalLM),
    }[name]()  # fmt: skip


@pytest.mark.parametrize("name", ["falcon-classic", "falcon-alibi", "gptj", "codegen", "persimmon", "olmo"])
def test_architectures_no_issue_names_equal_eager_on_interpret(name):
    cfg, cls = _other(name)
    cfg._attn_implementation = "eager" if name in ("gptj", "codegen") else "sdpa"
    model, ids = randomize_(cls(cfg)).eval(), _ids()
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out, ref = cm(ids, use_cache=False).logits, model(ids, use_cache=False).logits
    assert rel_error(out, ref) <= 1e-5
    assert cm.report().patterns and set(cm.report().impls().values()) == {"kernel"}
