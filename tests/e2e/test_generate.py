"""LLM generation through `torch.compile(model.forward, backend="dlblas")`: greedy tokens equal eager's for five
decoder families with HF's static and dynamic KV caches, with and without a left-padded batch (and three more
families with a padded batch); the static cache
is updated in place (no copy of the cache per token); many sequence lengths do not grow memory."""

import warnings

import pytest
import torch
import transformers

from dlblas_compiler import dynamo
from dlblas_compiler.models import randomize_
from dlblas_compiler.dialects import TorchCallOp
from dlblas_compiler.runtime.inplace import InPlaceIndexCopy, WriteInput
from dlblas_compiler.runtime.steps import RegionStep, TorchStep
from ..hf import family_compiles

BASE = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_hidden_layers=2, vocab_size=128,
            max_position_embeddings=256, num_key_value_heads=2)  # fmt: skip
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"head_dim": 16}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"head_dim": 16}),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, {"head_dim": 16}),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, {"pad_token_id": 0, "eos_token_id": None}),
}


# decoders with other parts: per-head q/k norms (Qwen3), sliding-window layers and logit soft-capping (Gemma-2),
# sliding-window layers with per-head q/k norms (Gemma-3), norms after the attention and MLP and over the whole
# q and k projections (OLMo-2), one LayerNorm feeding a parallel attention and MLP with a logit scale (Cohere),
# partial rotary and a parallel residual (GPT-NeoX, which takes no k/v head count), latent attention and routed
# experts (DeepSeek-V3), routed SiLU experts captured as one dl.moe per layer (Qwen3-MoE)
MORE_FAMILIES = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, {"head_dim": 16, "sliding_window": 4}),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, {"head_dim": 16, "sliding_window": 4}),
    "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM, {}),
    "cohere": (transformers.CohereConfig, transformers.CohereForCausalLM, {"pad_token_id": 0}),
    "gpt_neox": (transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM, {"num_key_value_heads": None}),
    # multi-head latent attention: the cache holds each head's keys, filled piece by piece through views; value
    # heads wider than the query's and keys' (V3's are narrower: 128 against 192)
    "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM, {
        "num_key_value_heads": 4, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 32, "n_group": 1, "topk_group": 1}),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, {
        "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}),
}


def causal_lm(name: str):
    config_cls, model_cls, extra = {**FAMILIES, **MORE_FAMILIES}[name]
    cfg = config_cls(**{**BASE, **extra})
    cfg._attn_implementation = "sdpa"
    return randomize_(model_cls(cfg), 0).eval()


def _generate(model, ids, mask, cache: str, new: int, options: dict):
    kw = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        ref = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="dlblas", options=options)
        out = model.generate(ids, **kw)
    return out, ref


def _batch(padded: bool):
    ids = torch.randint(1, 128, (2 if padded else 1, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("padded", [False, True], ids=["batch1", "padded2"])
@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_tokens_equal_eager(name, cache, padded, fresh_dynamo):
    """Greedy tokens equal eager's (five families, both caches, batch 1 and a padded batch of 2); the decode step's
    regions run generated kernels, and with the static cache the k/v writes are in the QKV GEMMs."""
    ids, mask = _batch(padded)
    out, ref = _generate(causal_lm(name), ids, mask, cache, 4, {"backend": "interpret"})
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())
    decode = dynamo.COMPILATIONS[1]  # the first decode step's graph: its regions run the generated kernels
    assert set(decode.report().impls().values()) == {"kernel"}
    if cache == "static":  # every layer's QKV GEMM stores its k and v into the caller's caches
        program = decode._spec().executor
        assert len(cache_writes(program)) == 2 * BASE["num_hidden_layers"]
        assert not [s for s in program.steps if isinstance(s, InPlaceIndexCopy)]


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(MORE_FAMILIES))
def test_greedy_tokens_equal_eager_in_more_families(name, cache, fresh_dynamo):
    """The same on decoders no issue names, with a left-padded batch of 2 (the harder case)."""
    ids, mask = _batch(True)
    out, ref = _generate(causal_lm(name), ids, mask, cache, 4, {"backend": "interpret"})
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())


def test_heads_whose_width_is_not_a_power_of_two_rotate_in_the_qkv_gemm(fresh_dynamo):
    """Phi-3 with heads of 48 columns (Phi-3-mini's are 96), static cache, a left-padded batch: greedy tokens equal
    eager's, and every layer's rotary and k/v cache writes run in its QKV GEMM (they were row kernels and a torch
    index_copy after it: on an H200 Phi-3-mini decoded 0.89-0.93x as fast as hf-auto, bench/NOTES.md 104)."""
    config_cls, model_cls, extra = FAMILIES["phi3"]
    cfg = config_cls(**{**BASE, **extra, "hidden_size": 192})
    cfg._attn_implementation = "sdpa"
    model = randomize_(model_cls(cfg), 0).eval()
    assert cfg.hidden_size // cfg.num_attention_heads == 48
    ids, mask = _batch(True)
    out, ref = _generate(model, ids, mask, "static", 4, {"backend": "interpret"})
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())
    decode = dynamo.COMPILATIONS[1]
    assert set(decode.report().impls().values()) == {"kernel"}
    program = decode._spec().executor
    assert len(cache_writes(program)) == 2 * BASE["num_hidden_layers"]
    assert not [s for s in program.steps if isinstance(s, InPlaceIndexCopy)]
    regions = [s.kernel.region_ir for s in program.steps if isinstance(s, RegionStep) and s.kernel is not None]
    assert sum(r.count("dl.rotary") for r in regions if "dl.linear" in r) == 2 * BASE["num_hidden_layers"]


def _static_decode():
    """Greedy tokens of a tiny Llama with a static cache on `interpret` equal eager's; the decode step's graph
    (a CompiledModule) and its program."""
    ids, mask = _batch(False)
    out, ref = _generate(causal_lm("llama"), ids, mask, "static", 3, {"backend": "interpret"})
    assert torch.equal(out, ref)
    decode = dynamo.COMPILATIONS[-1]
    return decode, decode._spec().executor


def test_static_cache_is_updated_in_place(fresh_dynamo):
    """Each decode step writes the new keys and values into the caller's cache tensors, straight from each layer's
    QKV GEMM (its epilogue stores k and v at the cache positions), instead of a functional copy of the whole cache
    and a copy back."""
    decode, program = _static_decode()
    writes = cache_writes(program)
    assert len(writes) == 2 * BASE["num_hidden_layers"] == len(set(writes))  # keys and values of each layer
    regions = [s for s in program.steps if isinstance(s, RegionStep) and any(s.ins[i] in program.inputs
                                                                               for i, _ in s.writes)]
    assert len(regions) == BASE["num_hidden_layers"] and all(s.choice.impl == "kernel" for s in regions)
    assert not [s for s in program.steps if isinstance(s, InPlaceIndexCopy)]  # (none runs apart)
    assert decode.specializations == 1  # every decode step has one signature
    # the cache's length counters (`cumulative_length.add_(n)`) are incremented in place too: no copy of each
    # counter before its add_, no copy back after the program; every written input is captured at its address
    assert not [s for s in program.steps if isinstance(s, WriteInput)]
    inplace = program.recipe.builder.inplace
    counters = {arg for op, args in inplace.items() if isinstance(op, TorchCallOp) for arg in args}
    assert len(counters) == BASE["num_hidden_layers"]
    assert all(op.callee.data == "torch.Tensor.add_" for op in inplace if isinstance(op, TorchCallOp))
    assert set(program.static_inputs) == _written_inputs(program) == set(writes) | counters


def cache_writes(program) -> list[int]:
    """The program's inputs (by position) its steps write in place at indexed positions: index_copy_ steps and
    regions whose kernel stores into an input."""
    found = [program.inputs.index(s.dest) for s in program.steps if isinstance(s, InPlaceIndexCopy)]
    for s in program.steps:
        if isinstance(s, RegionStep):
            found += [program.inputs.index(s.ins[i]) for i, in_place in s.writes  # (not a residual it writes over)
                      if in_place and s.ins[i] in program.inputs]
    return found


def _written_inputs(program) -> set[int]:
    """The program's inputs it writes: cache updates in place, torch methods on inputs in place (the counters),
    and values copied into inputs by its last steps."""
    copies = {program.inputs.index(s.dest) for s in program.steps if isinstance(s, WriteInput)}
    inplace = program.recipe.builder.inplace
    methods = {arg for op, args in inplace.items() if isinstance(op, TorchCallOp) for arg in args}
    return set(cache_writes(program)) | copies | methods


def test_decode_attention_reads_the_cache_without_repeating_heads(fresh_dynamo, monkeypatch):
    """On a GPU with a mask, HF repeats each key/value head (`repeat_kv`: expand + reshape) before SDPA; the decode
    step must read the cache's own heads (GQA in the kernel), not a 4x copy made every token (1.2 ms/token at a
    2048-token cache on an H100 before). Forced here on the CPU, where HF would pass `enable_gqa` itself."""
    import transformers.integrations.sdpa_attention as sdpa_attention

    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", lambda *a, **k: False)
    decode, program = _static_decode()
    assert not [s for s in program.steps if "broadcast" in repr(s)]
    ir = decode.ir("final")
    assert "dl.broadcast" not in ir and ir.count("enable_gqa = true") == BASE["num_hidden_layers"]


def test_many_lengths_share_weights_and_keep_few_specializations(fresh_dynamo):
    """The dynamic cache grows every token: each length is a specialization of the graph dynamo hands over.
    Only the first two lengths of each power-of-two bucket are compiled; the others are instantiated from
    their shape family. They share the weights the compiler derives (q/k/v and gate/up concatenated) and at
    most `max_specializations` stay built, so memory does not grow with the number of lengths."""
    model = causal_lm("llama")
    ids, mask = _batch(False)
    out, ref = _generate(model, ids, mask, "dynamic", 22, {"backend": "reference", "max_specializations": 4})
    assert torch.equal(out, ref)
    grown = dynamo.COMPILATIONS[-1]  # the graph with a dynamic cache length: past lengths 8 .. 27
    assert grown.compile_count == family_compiles(range(8, 28)) == 6
    assert grown.compile_count + grown.instances == 20 and grown.specializations == 4
    compiled = sum(c.compile_count for c in dynamo.COMPILATIONS)
    weights = [{id(w) for _, w in s.executor.weights.weights} for s in grown._specs.values()]
    assert weights[0] and all(w == weights[0] for w in weights)  # one set of derived weights for all
    # later generate() calls compile nothing: instances are dropped first, the compiles they need stay (the
    # second call compiles one length, 8, which dynamo now hands to this graph, not to the first decode graph)
    counts = []
    for _ in range(2):
        with torch.no_grad():
            again = model.generate(ids, attention_mask=mask, max_new_tokens=22, min_new_tokens=22, do_sample=False, pad_token_id=0)
        assert torch.equal(again, ref)
        counts.append(sum(c.compile_count for c in dynamo.COMPILATIONS) - compiled)
    assert counts == [1, 1]


def _recording_graphs(monkeypatch) -> list:
    """Programs run with CUDA graphs on the CPU: the graph replaced by a stub that records each program it captures
    (the list returned) and replays by running the program's steps."""
    from dlblas_compiler.runtime import program

    captured = []

    class Recorder:
        def __init__(self, run, static, in_place=(), handout=True, checked=False):
            self.run, self.note = run, ""

        def capture(self, inputs):
            captured.append(self.run.__self__)
            return True

        def pays(self, inputs):
            return False

    call = program.Program.__call__

    def with_graphs(self, inputs):
        self.cuda_graphs = self.cuda_graphs or self.graphs_pay is None
        return call(self, inputs)

    monkeypatch.setattr(program, "CudaGraph", Recorder)
    monkeypatch.setattr(program.Program, "__call__", with_graphs)
    return captured


@pytest.mark.parametrize("window", [4, 16], ids=["full", "fills"])
def test_a_sliding_window_caches_int_counter_leaves_one_decode_program(window, fresh_dynamo, monkeypatch):
    """HF's static cache keeps a sliding-window layer's length as a Python int: dynamo passes it as an int input
    and the graph returns it plus one, a new value every token. No op reads it (`importer.unread_ints`) and the
    returned int is computed per call (`importer.SymLeaf`), so each decode graph is one specialization, compiled
    once and captured once: 30 tokens, a window that is full from the prompt on (4) or fills during decoding (16;
    two decode graphs), a left-padded batch, tokens equal eager's. (Each token was a compile, then an instance run
    without a CUDA graph: Mistral-7B-v0.1, Phi-3-mini, Gemma-2 and -3, Qwen2 with sliding windows.)"""
    captured = _recording_graphs(monkeypatch)
    config_cls, model_cls, extra = FAMILIES["mistral"]
    cfg = config_cls(**{**BASE, **extra, "sliding_window": window})
    cfg._attn_implementation = "sdpa"
    model = randomize_(model_cls(cfg), 0).eval()
    ids, mask = _batch(True)
    out, ref = _generate(model, ids, mask, "static", 30, {"backend": "reference"})
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())
    decode = dynamo.COMPILATIONS[1:]  # the decode graphs (before and after the window fills)
    assert len(decode) == (1 if window == 4 else 2)
    leaves = [leaf for c in decode for s in c._specs.values() for kind, leaf in s.imported.out_leaves if kind == "sym"]
    assert leaves and all(str(leaf.expr) == "a0 + 1" for leaf in leaves)
    assert all(c.compile_count == 1 and c.instances == 0 and len(c._specs) == 1 for c in decode)
    assert all(c._unread for c in decode)
    programs = [c._spec().executor for c in decode]
    assert all(captured.count(p) == 1 for p in programs)
    # the full window's `index = torch.tensor([-1], device=...)` (read by `new_keys[:, :, index] = k`) is made once:
    # made at every call, its copy from the host failed the CUDA-graph capture on a GPU
    index = [s for p in programs for s in p.steps if isinstance(s, TorchStep) and s.name.startswith("index")]
    assert index and all(s.once for s in index)


def test_only_the_ints_no_op_reads_leave_the_key(fresh_dynamo):
    """`unread_ints`: an int input that only reaches the outputs as a polynomial is left out of the key (one
    specialization for every value, each call's output computed from its own int); one that an op reads, that
    sizes a tensor or that reaches an output through floor division keeps its specializations."""
    import torch._dynamo

    from dlblas_compiler.frontend.importer import unread_ints

    def step(x, n, m, k):
        return x * m + 1, n + 1, 2 * n * n, k // 2, torch.arange(k, dtype=x.dtype)

    compiled = torch.compile(step, backend="dlblas", options={"backend": "reference"}, dynamic=True)
    x = torch.randn(4, 8)
    for n, m, k in [(3, 2, 6), (4, 3, 7), (5, 3, 9), (9, 2, 6)]:
        with torch.no_grad():
            got = compiled(x, n, m, k)
        want = step(x, n, m, k)
        assert [type(g) for g in got] == [type(w) for w in want]
        assert all(torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w for g, w in zip(got, want))
    (cm,) = dynamo.COMPILATIONS
    placeholders = [node.name for node in cm.model.graph.nodes if node.op == "placeholder"]
    assert [placeholders[i] for i in sorted(unread_ints(cm.model))] == ["l_n_"]
    # (m and k are read: their values key the specializations; n's three values do not)
    assert {(s.imported.out_leaves[1][0]) for s in cm._specs.values()} == {"sym"}
    assert len(cm._specs) == len({(m, k) for _, m, k in [(3, 2, 6), (4, 3, 7), (5, 3, 9), (9, 2, 6)]})


def test_a_length_called_once_per_generate_is_not_captured(fresh_dynamo, monkeypatch):
    """A program is captured as a CUDA graph from its second call in a row: the dynamic cache's lengths, each
    called once per generate(), are not (a capture and its keep-or-drop timing cost ~100 direct calls), even
    when an instance from the last generate() is still built. (On the CPU, with the graph replaced by a stub that
    records what it captures.)"""
    captured = _recording_graphs(monkeypatch)
    model = causal_lm("llama")
    ids, mask = _batch(False)
    out, ref = _generate(model, ids, mask, "dynamic", 12, {"backend": "reference", "max_specializations": 8})
    with torch.no_grad():
        for _ in range(2):
            again = model.generate(ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
            assert torch.equal(again, ref)
    grown = dynamo.COMPILATIONS[-1]
    assert grown.instances > 8 and not [p for p in captured if any(s.executor is p for s in grown._specs.values())]
    assert len(captured) <= 2  # (the prefill's program and the first decode step's: each in a graph of its own)


def test_the_dc_compile_path_for_a_causal_lm(fresh_dynamo):
    """`model.forward = dc.compile(model.forward, ...)`: dynamo captures, each graph a CompiledModule."""
    import dlblas_compiler as dc

    model = causal_lm("qwen2")
    ids, mask = _batch(True)
    kw = dict(attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0,
              cache_implementation="static")  # fmt: skip
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.forward = dc.compile(model.forward, backend="interpret")
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref)
    assert len(model.forward.compilations) == 2 and "gemm" in model.forward.report().patterns


def test_generate_does_not_hand_the_compiled_decode_step_to_inductor(fresh_dynamo):
    """generate() compiles the decode step itself for static caches on a GPU (torch.compile of the model's
    __call__, which would trace through our forward and run its own backend). dc.compile turns that off for the
    model: here the auto-compile is forced on the CPU, and the decode graphs still reach this compiler."""
    import dlblas_compiler as dc

    model = causal_lm("llama")
    ids, mask = _batch(False)
    model.generation_config.compile_config = transformers.CompileConfig(backend="eager", mode=None)
    model.generation_config.compile_config._compile_all_devices = True
    kw = dict(attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0,
              cache_implementation="static")  # fmt: skip
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.forward = dc.compile(model.forward, backend="interpret")
        assert model.generation_config.disable_compile
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref)
    assert len(model.forward.compilations) == 2  # the prefill and the decode graph, both here


def _twice_on_the_gpu(model, new: int) -> tuple[list, torch.Tensor]:
    """Greedy generate() of `new` tokens on a left-padded batch with the static cache: two calls after
    `dc.compile(model.forward, backend="triton")`, and eager's tokens."""
    import dlblas_compiler as dc

    ids, mask = (t.cuda() for t in _batch(True))
    kw = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
              cache_implementation="static", disable_compile=True)  # fmt: skip
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.forward = dc.compile(model.forward, backend="triton")
        return [model.generate(ids, **kw) for _ in range(2)], ref


@pytest.mark.gpu
def test_generate_on_the_gpu_with_the_decode_step_in_a_cuda_graph(fresh_dynamo):
    """On the GPU (triton backend): a padded batch, greedy tokens equal eager's in two generate() calls, the
    decode step captured as a CUDA graph (or measured not to pay) with the cache tensors and counters it
    writes captured at their addresses."""
    model = causal_lm("llama").cuda()
    outs, ref = _twice_on_the_gpu(model, 8)
    assert all(torch.equal(o, ref) for o in outs)
    program = model.forward.compilations[-1]._spec().executor
    assert program.graph is not None or "CUDA graph replay" in program.graph_note
    assert _written_inputs(program) == set(program.static_inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mistral", "phi3"])
def test_a_sliding_window_decode_replays_one_graph_on_the_gpu(name, fresh_dynamo):
    """On the GPU: a sliding-window static cache (its counter a Python int that dynamo passes in and the graph
    returns plus one) decodes with one specialization per decode graph, replayed from its CUDA graph token after
    token (or measured not to pay), greedy tokens equal eager's in two generate() calls with a padded batch; the
    window (12) fills during decoding, so the decode graph changes once."""
    config_cls, model_cls, extra = FAMILIES[name]
    cfg = config_cls(**{**BASE, **extra, "sliding_window": 12})
    cfg._attn_implementation = "sdpa"
    model = randomize_(model_cls(cfg), 0).eval().cuda()
    outs, ref = _twice_on_the_gpu(model, 12)
    assert all(torch.equal(o, ref) for o in outs), ([o.tolist() for o in outs], ref.tolist())
    decode = model.forward.compilations[1:]
    assert decode and all(c.compile_count == 1 and c.instances == 0 for c in decode)
    for c in decode:
        program = c._spec().executor
        assert program.graph is not None or "CUDA graph replay" in program.graph_note


@pytest.mark.gpu
def test_the_prefill_moves_host_counters_first_and_is_captured(fresh_dynamo):
    """HF's static cache keeps each layer's length counter on the host until the prefill moves it to the GPU
    (`.to(device)` in the forward): a copy from the host inside the program waited for the GPU at every layer
    and made the prefill impossible to capture. The program moves such inputs before it starts, so the
    prefill of a repeated prompt length is captured (or measured not to pay) and its tokens stay eager's."""
    import warnings as w

    import dlblas_compiler as dc

    model = causal_lm("llama").cuda()
    ids, mask = (t.cuda() for t in _batch(False))
    kw = dict(attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0,
              cache_implementation="static", disable_compile=True)  # fmt: skip
    with torch.no_grad(), w.catch_warnings():
        w.filterwarnings("error", message="dlblas_compiler")  # (a failed capture warns)
        ref = model.generate(ids, **kw)
        model.forward = dc.compile(model.forward, backend="triton")
        outs = [model.generate(ids, **kw) for _ in range(3)]
    assert all(torch.equal(o, ref) for o in outs)
    prefill = model.forward.compilations[0]._spec().executor
    assert prefill.moves and all(dev.type == "cuda" for _, dev in prefill.moves)
    assert prefill.graph is not None or "CUDA graph replay" in prefill.graph_note


@pytest.mark.gpu
def test_deepseek_v3_on_the_gpu(fresh_dynamo):
    """DeepSeek-V3 (latent attention, the pairs rotary in the q GEMM's epilogue, key states filled through views,
    routed experts) on the triton backend: bf16 logits as close to the float32 model's as eager's bf16 run, no
    region fallen back (untuned, lone GEMMs run on cuBLAS); and in float32 greedy tokens equal eager's with the
    static cache and a padded batch."""
    import dlblas_compiler as dc
    from dlblas_compiler.numerics import rel_error, tolerance

    model = causal_lm("deepseek_v3").cuda()
    ids, mask = (t.cuda() for t in _batch(True))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")  # no region falls back to its reference
        ref = model(ids, attention_mask=mask, use_cache=False).logits
        half = causal_lm("deepseek_v3").cuda().to(torch.bfloat16)
        eager = half(ids, attention_mask=mask, use_cache=False).logits
        cm = dc.compile(half, backend="triton")
        out = cm(ids, attention_mask=mask, use_cache=False).logits
    # (no further from float32 than eager's own bf16 run: a near tie in the routing may pick another expert)
    assert rel_error(out.float(), ref) <= max(tolerance(torch.bfloat16), 2 * rel_error(eager.float(), ref))
    untuned = {c.region: c.reason for c in cm.report().kernels if c.impl != "kernel"}  # (lone GEMMs: cuBLAS)
    assert all("lone GEMM" in why for why in untuned.values()), untuned
    kw = dict(attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
              cache_implementation="static", disable_compile=True)  # fmt: skip
    with torch.no_grad():
        eager = model.generate(ids, **kw)
        # (the backend function itself: the device runs the tree from PYTHONPATH, without the package's entry point)
        model.forward = torch.compile(model.forward, backend=dynamo.dlblas_backend)
        tokens = model.generate(ids, **kw)
    assert torch.equal(tokens, eager), (tokens.tolist(), eager.tolist())
