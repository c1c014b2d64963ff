"""Shape families (`passes.families`, `Options.shape_families`): the first two lengths of a power-of-two bucket
are compiled, every other length of it is instantiated from the first IR without capture, import, passes or
tuning, and its outputs equal eager's. Sizes that are not affine, masks that change with the length and
lengths outside the bucket are compiled in full."""

import logging

import pytest
import torch
import torch.nn.functional as F
import transformers

import dlblas_compiler as dc
from dlblas_compiler.models import randomize_

from .test_generate import BASE, causal_lm


def _run(cm, model, lengths, make):
    with torch.no_grad():
        for n in lengths:
            x = make(n)
            got, want = cm(x), model(x)
            got, want = (got.logits, want.logits) if hasattr(want, "logits") else (got, want)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"length {n}")


def _ids(n: int) -> torch.Tensor:
    return torch.randint(1, 128, (1, n), generator=torch.Generator().manual_seed(n))


class _LM(torch.nn.Module):
    """A causal LM forward without a cache (dc.compile's capture of HF's forward takes keyword arguments)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, use_cache=False).logits


def _compiled(model: torch.nn.Module, **options):
    """dc.compile of the model's bound forward: dynamo captures it, and from the second length on hands over a
    graph whose sizes are symbolic, its size arithmetic in the graph (HF models go through dynamo; a module
    exported with static shapes gets no shape family: `frontend.sizes_unseen`)."""
    return dc.compile(model.forward, **options)


def _counts(f) -> tuple[int, int]:
    """Full compiles and instances over the graphs dynamo handed over."""
    return sum(c.compile_count for c in f.compilations), sum(c.instances for c in f.compilations)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_twenty_prompt_lengths_compile_twice_per_bucket(backend, fresh_dynamo):
    """20 prompt lengths over two buckets (9-16 and 17-28): dynamo's first graph takes 9; its symbolic graph is
    compiled at 10, 11, 17 and 18 and instantiates the other 15 lengths; outputs equal eager's; at most
    `max_specializations` programs stay built, all sharing one set of derived weights."""
    model = _LM(causal_lm("llama"))
    f = _compiled(model, backend=backend, max_specializations=4)
    lengths = [9, 10, *range(11, 17), 17, 18, *range(19, 29)]
    _run(f, model, lengths if backend == "reference" else lengths[:4] + lengths[8:12], _ids)
    assert _counts(f) == ((5, 15) if backend == "reference" else (5, 3))
    cm = f.compilations[-1]
    assert cm.specializations == 4
    weights = [{id(w) for _, w in s.executor.weights.weights} for s in cm._specs.values()]
    assert weights[0] and all(w == weights[0] for w in weights)
    if backend == "interpret":  # the instances run the generated kernels, the same sources as the compiles
        assert set(cm.report().impls().values()) == {"kernel"}
        # each layer's copy of a changed region runs one lowering (made once per instance) on its own values
        instance = next(s for s in cm._specs.values() if s.family is not None)
        steps = [st for st in instance.executor.steps if getattr(st, "kernel", None) is not None]
        assert len({id(st.kernel) for st in steps}) < len(steps)
        assert len({tuple(st.outs) for st in steps}) == len(steps)
    assert any("instantiated from the shape family" in n for n in cm.report().notes)


def test_a_size_computed_in_python_with_no_line_forms_no_family():
    """`x[:, : x.shape[1] // 2]`: 5 at lengths 10 and 11, 6 at 12. The graph holds the size arithmetic
    (symbolic trace): a floor division is not affine, so no family is formed and every length is compiled,
    each with eager's answer (a family would have kept 5)."""
    model = _Half()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [10, 11, 12, 13], lambda n: torch.randn(2, n))
    assert (cm.compile_count, cm.instances) == (4, 0)
    assert any("no shape family" in n and "floordiv of sizes is not affine" in n for n in cm.report().notes)


def test_a_capture_that_hides_its_sizes_forms_no_family():
    """dc.compile of an HF model exports it through dynamo with static shapes: integers computed from the sizes
    are constants in its graph, whose lines two compiles cannot establish; each length is compiled."""
    model = _LM(causal_lm("llama"))
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 11], _ids)
    assert (cm.compile_count, cm.instances) == (3, 0)
    assert any("no shape family" in n and "static shapes" in n for n in cm.report().notes)


class _Heads(torch.nn.Module):
    """Attention as hand-written models spell it: the head width `C // heads` and the scale `D ** -0.5` are
    arithmetic on sizes that do not change with the length."""

    def forward(self, x):
        b, t, c = x.shape
        h = x.view(b, t, 4, c // 4).transpose(1, 2)
        att = (h @ h.transpose(-2, -1)) * h.size(-1) ** -0.5
        return (att.softmax(-1) @ h).transpose(1, 2).reshape(b, t, c)


def test_arithmetic_on_sizes_that_do_not_move_keeps_the_family():
    """A floor division or power of sizes equal at both compiles (the hidden size, the head width) is a constant of
    the family: each of its inputs is affine in the sizes and equal at two points of the family's line, so equal
    along all of it. 11 and 12 are instances with eager's answers (before, every length was compiled)."""
    model = _Heads()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 11, 12], lambda n: torch.randn(2, n, 32))
    assert (cm.compile_count, cm.instances) == (2, 2)


class _Half(torch.nn.Module):
    def forward(self, x):
        return x[:, : x.shape[1] // 2] * 2


class _AllButLast(torch.nn.Module):
    def forward(self, x):
        return x[:, : x.shape[1] - 1] * 2


def test_a_size_computed_in_python_on_a_line_forms_a_family():
    """`x[:, : x.shape[1] - 1]` is affine in the length: 10 and 11 form a family and 12, 13 are instances with
    eager's answers."""
    model = _AllButLast()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [10, 11, 12, 13], lambda n: torch.randn(2, n))
    assert (cm.compile_count, cm.instances) == (2, 2)


def test_shape_families_off_compiles_every_length(fresh_dynamo):
    model = _LM(causal_lm("qwen2"))
    f = _compiled(model, backend="reference", shape_families=False)
    _run(f, model, [9, 10, 11, 12], _ids)
    assert _counts(f) == (4, 0)


def test_a_sliding_window_mask_past_the_window(fresh_dynamo):
    """Mistral with a 20-token window: at 17 to 20 tokens the mask is causal, at 25 it is not. In dynamo's
    symbolic graph the mask is computed from the length, not a constant: every instance builds it at its own
    length, and 25 (an instance too) gets eager's answer. (A mask the import finds causal from its constant
    values is re-checked per instance, `runtime.families.masks_hold`; such constants only come from captures
    with static sizes, which form no family now.)"""
    cfg = transformers.MistralConfig(**BASE, head_dim=16, sliding_window=20)
    cfg._attn_implementation = "sdpa"
    model = _LM(randomize_(transformers.MistralForCausalLM(cfg), 0).eval())
    f = _compiled(model, backend="reference")
    _run(f, model, [17, 18, 19, 20, 25], _ids)
    assert _counts(f) == (3, 2)


class _Outer(torch.nn.Module):
    """Flattens an outer product of the tokens: a size (n * n) that is not affine in the length."""

    def forward(self, x):
        return (x.unsqueeze(-1) * x.unsqueeze(-2)).reshape(x.shape[0], -1).sigmoid()


def test_a_size_that_is_not_affine_drops_the_family(caplog):
    """Lengths 5 and 6 give sizes 25 and 36 that fit a line; at 7 the line says 47, the reshape's verifier
    refuses 7 x 7 -> 47: the family is dropped and 7 is compiled in full, with the right answer; no family is
    formed in that bucket again (8 is compiled too)."""
    model = _Outer()
    cm = dc.compile(model, backend="reference")
    with caplog.at_level(logging.INFO, logger="dlblas_compiler.compile"):
        _run(cm, model, [5, 6, 7, 8], lambda n: torch.randn(2, n))
    assert (cm.compile_count, cm.instances) == (4, 0)
    assert caplog.text.count("dropped") == 1 and caplog.text.count("form a shape family") == 1


class _Mean(torch.nn.Module):
    """Divides by the length plus one as a Python number: a float constant that changes with it. (A sum divided
    by the length alone is a mean, `spellings`, and its instances are exact.)"""

    def forward(self, x):
        return x.sum(1) / (x.shape[1] + 1)


def test_a_float_that_moves_with_the_length_forms_no_family():
    model = _Mean()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [5, 6, 7], lambda n: torch.randn(2, n, 4))
    assert (cm.compile_count, cm.instances) == (3, 0)


class _MeanOverLength(torch.nn.Module):
    def forward(self, x):
        return x.sum(1) / x.shape[1]


def test_a_sum_over_the_length_divided_by_it_is_a_mean_of_a_family():
    """sum / n with n the summed length is a mean (`spellings`): no float moves, the third length is an instance
    and equals eager."""
    model = _MeanOverLength()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [5, 6, 7], lambda n: torch.randn(2, n, 4))
    assert (cm.compile_count, cm.instances) == (2, 1)


def test_lengths_outside_the_bucket_are_compiled(fresh_dynamo):
    """After dynamo's first graph (5): 6 and 7 (bucket 8) form a family; 9 (bucket 16) is compiled, as is 10;
    11 is instantiated from those, and 8 from the first family."""
    model = _LM(causal_lm("gemma"))
    f = _compiled(model, backend="reference")
    _run(f, model, [5, 6, 7, 9, 10, 11, 8], _ids)
    assert _counts(f) == (5, 2)


def test_prompt_lengths_into_a_static_cache_write_each_layers_cache(fresh_dynamo):
    """Prompts of new lengths prefilled into one static cache (generate() of 3 tokens each, interpret): the
    instances' in-place cache writes are one write per layer's k and v, each into its own layer's cache (each
    layer's copy of the write runs the first one's step on its own cache), and the tokens are eager's."""
    from transformers import StaticCache

    from .test_generate import cache_writes

    model, ref = causal_lm("llama"), causal_lm("llama")
    model.forward = dc.compile(model.forward, backend="interpret")
    gen = dict(do_sample=False, pad_token_id=0, disable_compile=True, max_new_tokens=3, min_new_tokens=3)
    cache = StaticCache(config=model.config, max_cache_len=64)
    with torch.no_grad():
        for n in (20, 23, 21, 22, 25):
            ids = _ids(n)
            cache.reset()
            assert torch.equal(model.generate(ids, past_key_values=cache, **gen),
                               ref.generate(ids, cache_implementation="static", **gen)), n  # fmt: skip
    instances = [s for cm in model.forward.compilations for s in cm._specs.values() if s.family is not None]
    assert len(instances) == 2
    for s in instances:
        writes = cache_writes(s.executor)
        assert len(writes) == 2 * BASE["num_hidden_layers"] == len(set(writes))


@pytest.mark.gpu
def test_on_the_gpu_instances_run_the_kernels_and_memory_stays_flat(fresh_dynamo):
    """bf16 on CUDA with CUDA graphs: 20 prompt lengths (buckets 16 and 32) against eager within bf16's
    tolerance (float64 reference error); five compiles (dynamo's first graph, then two per bucket); with 4
    programs kept, GPU memory after the last length is what it was after the fourth."""
    from dlblas_compiler.numerics import rel_error, tolerance

    model = _LM(causal_lm("llama")).to("cuda", torch.bfloat16)
    ref = _LM(causal_lm("llama")).to("cuda", torch.float64)
    cm = _compiled(model, backend="triton", max_specializations=4)
    lengths = [9, 10, *range(11, 17), 17, 18, *range(19, 29)]
    with torch.no_grad():
        for i, n in enumerate(lengths):
            ids = _ids(n).cuda()
            for _ in range(3):  # (the third call replays a CUDA graph where that pays)
                got = cm(ids)
            assert rel_error(got, ref(ids)) < 4 * tolerance(torch.bfloat16), n
            if i == 3:
                torch.cuda.synchronize()
                early = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    assert _counts(cm) == (5, 15)
    assert torch.cuda.memory_allocated() <= early + (1 << 20)
    assert set(cm.report().impls().values()) <= {"kernel", "reference"} and "kernel" in cm.report().impls().values()


def test_dynamic_cache_instances_copy_no_torch_call(fresh_dynamo):
    """Each decode token of HF's dynamic cache is a new length, hence an instance: the torch calls whose sizes move
    (the mask's aranges and comparisons) are not copied; an instance runs the first compile's step for each,
    except where the call's constants move or it keeps its first values (an input-free call, whose first values
    would be another length's), and the tokens are eager's (interpret)."""
    from dlblas_compiler.dialects import TorchCallOp
    from dlblas_compiler.runtime.steps import TorchStep

    model, ref = causal_lm("llama"), causal_lm("llama")
    model.forward = dc.compile(model.forward, backend="interpret")
    gen = dict(do_sample=False, pad_token_id=0, max_new_tokens=8, min_new_tokens=8)
    ids = _ids(9)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **gen), ref.generate(ids, **gen))
    instances = [s for cm in model.forward.compilations for s in cm._specs.values() if s.family is not None]
    assert instances
    for s in instances:
        first, made = s.family.program.steps, s.family.program.recipe.made
        ops, changed = s.family.shapes._changed()  # (the ops whose sizes move, and those reading their values)
        calls = [op for i in changed if isinstance(op := ops[i], TorchCallOp) and op in made]
        kept = [op for op in calls if s.executor.steps[made[op]] is first[made[op]]]
        assert calls and isinstance(first[made[calls[0]]], TorchStep)
        assert kept, "every changed torch call's step was built again"
        assert len(kept) < len(calls)  # (the moving ones, the mask's aranges, are not: a stale one changes tokens)


class _Pieces(torch.nn.Module):
    """Pieces along the length whose sizes are not affine in it: chunk's and tensor_split's ceil(n / 2) rows,
    split's ceil(n / 4) pieces."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        parts = {"chunk": x.chunk(2, 1), "tensor_split": x.tensor_split(2, 1), "split": x.split(4, 1)}[self.how]
        return torch.cat(parts[::-1], 1) * 2


@pytest.mark.parametrize("how", ["chunk", "tensor_split", "split"])
def test_pieces_of_sizes_not_affine_in_the_length_form_no_family(how):
    """chunk(2) cuts 9 and 10 rows after row 5, 11 after row 6; split(4) cuts 9 and 10 rows into 3 pieces, 13 into
    4: two compiles fit a line that is wrong at the third length (before, 11's halves came out swapped at the wrong
    row, with no error). The converter records what it computed from the length (`Imported.size_decisions`), and
    pieces of lengths that differ form no family: every length is compiled, with eager's answer."""
    model = _Pieces(how)
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 11, 12, 13], lambda n: torch.randn(2, n, 3))
    assert (cm.compile_count, cm.instances) == (5, 0)


_CLIPPED = {
    "first 6": lambda h: h[:, :6],
    "2 to 6": lambda h: h[:, 2:6],
    "all but the last 6": lambda h: h[:, :-6],
    "cat of a tail past 6": lambda h: torch.cat([h, h[:, 6:]], 1),
    "tensor_split at 2 and 6": lambda h: h.tensor_split([2, 6], 1)[1],
    "computed start that wraps": lambda h: h[:, h.shape[1] - 12 :],
}


class _Clipped(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.proj, self.how = torch.nn.Linear(8, 8), how

    def forward(self, x):
        return _CLIPPED[self.how](self.proj(x)).sum(1)


@pytest.mark.parametrize("how", list(_CLIPPED))
def test_slice_bounds_eager_clips_or_wraps_form_no_family(how):
    """`h[:, :6]` of 5 rows is clipped to 5, of 6 rows is 6: the two compiles' ends fit the line `n`, which took 7 rows
    at 7 (a silent wrong answer; likewise a start computed from the length that wraps while negative). Such a bound
    is recorded where the import meets it (`converters.slice_decisions`): compiles that clipped form no family, and a
    family formed by two that did not is right where its instances do not clip either (past them, its slice fails
    the family's checks)."""
    model = _Clipped(how).eval()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 12, 13, 14] if "wraps" in how else [5, 6, 7, 8], lambda n: torch.randn(2, n, 8))
    if how == "first 6":  # (5 rows clip, 6 take all: every length compiled; before, 7 and 8 were instances)
        assert (cm.compile_count, cm.instances) == (4, 0)


def test_slice_bounds_from_the_end_inside_the_length_keep_the_family():
    model = _Clipped("all but the last 6").eval()  # (9 to 12 rows: never clipped)
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 11, 12], lambda n: torch.randn(2, n, 8))
    assert (cm.compile_count, cm.instances) == (2, 2)


class _SplitHidden(torch.nn.Module):
    def forward(self, x):
        q, k = x.split(4, dim=2)  # (nanoGPT's qkv.split(n_embd, dim=2): the pieces' sizes do not move)
        return q * k.sigmoid()


def test_pieces_along_a_dim_that_does_not_move_keep_the_family():
    model = _SplitHidden()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 11, 12], lambda n: torch.randn(2, n, 8))
    assert (cm.compile_count, cm.instances) == (2, 2)


class _IntArgument(torch.nn.Module):
    def forward(self, x, k: int):
        y = x * 2 if k > 10 else x
        return y[:, : k // 3] + k % 3


def test_an_int_argument_symbolic_trace_ran_python_on_forms_no_family():
    """symbolic_trace takes an int argument as a constant and runs the Python code on it (`if k > 10`, `k // 3`,
    `k % 3`): its graph holds the results, which two compiles cannot place on a line (before, k = 11 to 13 were
    instances of the line through 9 and 10, taking the branch of k <= 10). Every value is compiled."""
    model = _IntArgument()
    cm = dc.compile(model, backend="reference")
    x = torch.randn(2, 8)
    with torch.no_grad():
        for k in (9, 10, 11, 12, 13):
            torch.testing.assert_close(cm(x, k), model(x, k), rtol=0, atol=0, msg=f"k = {k}")
    assert (cm.compile_count, cm.instances) == (5, 0)
    assert any("int argument" in n for n in cm.report().notes)


class _Positions(torch.nn.Module):
    """A decode step over a cache passed as a tensor: the new tokens' positions `arange(p, p + t)[None]` (a learned
    position table) and the causal mask of the new rows over the cache and them, from the same positions."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, past):
        p, t = past.shape[1], x.shape[1]
        h = self.proj(x + self.emb(torch.arange(p, p + t)[None]))
        k = torch.cat([past, h], 1)
        future = torch.arange(p + t)[None, :] > torch.arange(p, p + t)[:, None]
        return (h @ k.transpose(1, 2)).masked_fill(future, float("-inf")).softmax(-1) @ k


def test_values_made_from_a_moved_arange_are_made_again_in_an_instance():
    """`arange(p, p + t)` has the same size at every cache length p, its constants move; the calls after it
    (`[None]`, the comparison) read no input, so the first program runs them once and keeps their values. An
    instance now builds again every such call reading a value the new sizes compute anew (before, cache lengths
    11 to 13 read the positions of 9: wrong rows, no error)."""
    model = _Positions().eval()
    cm = dc.compile(model, backend="reference")
    with torch.no_grad():
        for p in (9, 10, 11, 12, 13):
            x, past = torch.randn(1, 2, 8), torch.randn(1, p, 8)
            torch.testing.assert_close(cm(x, past), model(x, past), rtol=1e-5, atol=1e-5, msg=f"cache of {p}")
    assert (cm.compile_count, cm.instances) == (2, 3)


class _Pooled(torch.nn.Module):
    def forward(self, x):
        return x.unfold(1, 3, 2).sum(-1) * 2  # (n - 3) // 2 + 1 windows: 4 at 9 and 10 tokens, 5 at 11


def test_a_torch_call_whose_sizes_are_not_affine_drops_the_family(caplog):
    """The windows of an unfold are a torch call to the IR, opaque: its result has 4 rows at 9 and 10 tokens, so
    the family's line keeps 4, and 11 tokens have 5 (before, the kernels read 4 rows: a wrong answer of the wrong
    shape). An instance first runs each torch call whose operands' sizes move on meta tensors
    (`runtime.families.calls_hold`); at 11 the unfold returns 5 rows, so the family is dropped and 11 and the
    lengths after it are compiled, with eager's answers (interpret: the generated kernels)."""
    model = _Pooled()
    cm = dc.compile(model, backend="interpret")
    with caplog.at_level(logging.INFO, logger="dlblas_compiler.compile"):
        _run(cm, model, [9, 10, 11, 12], lambda n: torch.randn(2, n, 4))
    assert (cm.compile_count, cm.instances) == (4, 0)
    assert "dropped: the torch call" in caplog.text and "returns sizes" in caplog.text


_SIZE_ARITHMETIC = {  # integers made from the length n of y that are not affine in it
    "n * n": lambda x, y: x[:, : y.shape[0] * y.shape[0]],
    "numel // 3": lambda x, y: x[:, : y.numel() // 3],
    "stride // 3": lambda x, y: x[:, : y.reshape(1, -1).stride(0) // 3],
    "n >> 1": lambda x, y: x[:, : y.shape[0] >> 1],
    "abs(n - 12)": lambda x, y: x[:, : abs(y.shape[0] - 12) + 1],
}


class _Sized(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x, y):
        return _SIZE_ARITHMETIC[self.how](x, y) * 2


@pytest.mark.parametrize("capture", ["module", "forward"])
@pytest.mark.parametrize("how", list(_SIZE_ARITHMETIC))
def test_integer_arithmetic_on_sizes_that_is_not_affine_forms_no_family(how, capture, fresh_dynamo):
    """Each of these fits a line through lengths 9 and 10 and leaves it later (before, `n * n` passed as a size
    times a constant, numel and strides were not seen as sizes at all, and a symbolic trace's `>>` and `abs`, whose
    nodes carry no example value, were neither accepted nor refused): no family, eager's answer at every length."""
    model = _Sized(how)
    cm = dc.compile(model if capture == "module" else model.forward, backend="reference")
    x = torch.randn(2, 300)
    with torch.no_grad():
        for n in range(9, 15):
            y = torch.randn(n)
            torch.testing.assert_close(cm(x, y), model(x, y), rtol=0, atol=0, msg=f"{how} at {n}")
    compiles = [cm] if capture == "module" else cm.compilations
    assert sum(c.instances for c in compiles) == 0


class _PlainLayerNorm(torch.nn.Module):
    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],))


def test_a_layer_norm_without_weight_over_the_length_forms_no_family():
    """The missing weight and bias are made as parameters of the row's width; over a width that moves, the
    first compile's would be read at every length (before: a shape error at the third, on the reference backend)."""
    model = _PlainLayerNorm()
    cm = dc.compile(model, backend="reference")
    _run(cm, model, [9, 10, 11, 12], lambda n: torch.randn(2, n))
    assert cm.instances == 0
