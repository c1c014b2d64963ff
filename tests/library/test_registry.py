"""The operator registry: signature matching, rejection messages, choice (priority, timing on clones, caching)."""

import pytest
import torch

from dlblas_compiler import tuning
from dlblas_compiler.library import (
    KernelUnsupported,
    OpMatchError,
    Optional,
    Scalar,
    Sig,
    Tensor,
    choice_key,
    divisible,
    get_op,
    in_range,
    list_ops,
    match_impls,
    register_op,
    same_dtype,
    select_impl,
    where,
)
from dlblas_compiler.library import registry as reg

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def registry(monkeypatch, tmp_path):
    """An empty registry (no built-in kernels), an empty choice memo, and the tuning cache in a fresh directory."""
    monkeypatch.setattr(reg, "_REGISTRY", {})
    monkeypatch.setattr(reg, "_CHOICES", {})
    monkeypatch.setattr(reg, "BUILTIN_MODULES", [])
    monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path))
    from dlblas_compiler import tuning

    return tuning.default_cache()


def norm_triton(x, w, eps):
    return x * w


def norm_torch(x, w, eps):
    return x * w


def register_norms():
    register_op(
        "rms_norm",
        norm_triton,
        Sig(
            Tensor("M", "K", dtypes=("f16", "bf16", "f32"), device=("cuda", "cpu")),
            Tensor("K"),
            Scalar(float),
            constraints=[divisible("K", 16), in_range("M", 1, None)],
            token=("M",),
        ),
        description="the kernel",
        impl_name="triton",
    )
    register_op(
        "rms_norm",
        norm_torch,
        Sig(Tensor("M", "K", dtypes=("f64",)), Tensor("K"), Scalar(float)),
        description="the fallback",
        impl_name="torch",
    )


def reasons(name, args):
    with pytest.raises(OpMatchError) as info:
        get_op(name, args)
    return str(info.value).splitlines()


def test_rejection_lists_each_candidate_and_why(registry):
    register_norms()
    x, w = torch.randn(8, 4095), torch.randn(4095)
    assert reasons("rms_norm", (x, w, 1e-6)) == [
        "no implementation of 'rms_norm' accepts (f32[8, 4095] cpu, f32[4095] cpu, 1e-06):",
        "  rms_norm/triton: arg 0 dim 1 is K=4095, but K must be divisible by 16",
        "  rms_norm/torch: arg 0 dtype is f32, expected one of f64",
    ]


def test_same_symbol_means_same_size(registry):
    register_norms()
    lines = reasons("rms_norm", (torch.randn(8, 32), torch.randn(64), 1e-6))
    assert lines[1] == "  rms_norm/triton: arg 1 dim 0 is K=64, but arg 0 dim 1 is K=32"


def test_dtype_device_rank_scalar_and_arity_rejections(registry):
    register_op("f", norm_triton, Sig(Tensor("M", "K", dtypes=("f16",), device=("cuda",)), Scalar(int)))
    x16 = torch.randn(4, 4, dtype=torch.float16)
    assert reasons("f", (x16, 3))[1] == "  f/norm_triton: arg 0 is on cpu, expected cuda"
    register_op("g", norm_triton, Sig(Tensor("M", "K", dtypes=("f16",)), Scalar(int)))
    assert reasons("g", (x16.float(), 3))[1] == "  g/norm_triton: arg 0 dtype is f32, expected one of f16"
    assert reasons("g", (x16[0], 3))[1] == "  g/norm_triton: arg 0 has rank 1, expected 2 [M, K]"
    assert reasons("g", (3, 3))[1] == "  g/norm_triton: arg 0 is int, expected a tensor [M, K]"
    assert reasons("g", (x16, True))[1] == "  g/norm_triton: arg 1 is bool, expected int"
    assert reasons("g", (x16,))[1] == "  g/norm_triton: missing arg 1 (int)"
    assert reasons("g", (x16, 1, 2))[1] == "  g/norm_triton: takes at most 2 arguments, got 3"
    assert reasons("nope", ())[0].startswith("no op named 'nope'; registered ops: f, g")


def test_symbolic_range_literal_dims_ellipsis_optional(registry):
    sig = Sig(
        Tensor(..., "E", 4),
        Scalar(int, sym="k"),
        Optional(Tensor("E")),
        Scalar(bool, default=True),
        constraints=[in_range("k", 1, "E")],
        token=("T",),
    )
    register_op("route", norm_triton, sig)
    x = torch.randn(2, 3, 8, 4)
    binding = sig.bind((x, 2))
    assert binding.sizes == {"E": 8, "k": 2} and binding.token_dims == {(0, 0), (0, 1)}
    sig.bind((x, 2, None, False))
    sig.bind((x, 2, torch.randn(8)))
    assert reasons("route", (x, 9))[1] == "  route/norm_triton: arg 1 is k=9, but k must be in [1, E=8]"
    assert reasons("route", (torch.randn(8, 5), 2))[1] == "  route/norm_triton: arg 0 dim 1 is 5, expected 4"
    assert reasons("route", (x, 2, torch.randn(7)))[1] == (
        "  route/norm_triton: arg 2 dim 0 is E=7, but arg 0 dim 2 is E=8"
    )
    assert reasons("route", (x, 2, None, 1))[1] == "  route/norm_triton: arg 3 is int, expected bool"


def test_same_dtype_where_contiguous_and_mixed_devices(registry):
    sig = Sig(
        Tensor("M", "K", contiguous=True),
        Tensor(...),
        constraints=[same_dtype(0, 1), where(lambda s, a: a[1].numel() in (1, s["M"]), "arg 1 with 1 or M elements")],
    )
    register_op("h", norm_triton, sig)
    x = torch.randn(4, 6)
    sig.bind((x, torch.randn(4)))
    assert reasons("h", (x.T, torch.randn(4)))[1] == "  h/norm_triton: arg 0 is not contiguous"
    assert reasons("h", (x, torch.randn(4).half()))[1] == "  h/norm_triton: arg 1 dtype is f16, but arg 0 dtype is f32"
    assert reasons("h", (x, torch.randn(3)))[1] == "  h/norm_triton: requires arg 1 with 1 or M elements"
    meta = torch.empty(4, device="meta")
    assert reasons("h", (x, meta))[1] == "  h/norm_triton: arg 1 is on meta, but arg 0 is on cpu"


def test_bad_signatures_are_refused():
    with pytest.raises(ValueError, match="required arguments must come before optional ones"):
        Sig(Optional(Tensor("M")), Tensor("M"))
    with pytest.raises(ValueError, match="unknown dtype names"):
        Tensor("M", dtypes=("float32",))
    with pytest.raises(ValueError, match="at most one"):
        Tensor(..., "M", ...)


def test_priority_order_without_timing_off_cuda(registry):
    register_norms()
    register_op("rms_norm", norm_torch, Sig(Tensor("M", "K"), Tensor("K"), Scalar(float)), impl_name="any")
    args = (torch.randn(4, 32), torch.randn(32), 1e-6)
    if DEVICE == "cpu":
        assert select_impl("rms_norm", args).name == "triton"  # first registered; nothing timed on CPU
    assert [i.name for i, _ in match_impls("rms_norm", args)] == ["triton", "any"]
    assert get_op("rms_norm", (args[0].double(), args[1].double(), 1e-6)) is norm_torch


def test_timing_uses_clones_picks_fastest_and_caches(registry):
    calls = []

    def slow(x, w):
        calls.append(("slow", x, w))
        x.add_(1.0)  # mutates its arguments: must only ever see clones
        return x

    def fast(x, w):
        calls.append(("fast", x, w))
        w.zero_()
        return w

    def unsupported(x, w):
        raise KernelUnsupported("not here")

    def timer(thunk):
        thunk()
        return {"slow": 2.0, "fast": 1.0}[calls[-1][0]]

    sig = Sig(Tensor("T", "H"), Tensor("H"), token=("T",))
    register_op("op", slow, sig, impl_name="slow")
    register_op("op", unsupported, sig, impl_name="unsupported")
    register_op("op", fast, sig, impl_name="fast")
    x, w = torch.randn(33, 16, device=DEVICE), torch.randn(16, device=DEVICE)
    x0, w0 = x.clone(), w.clone()
    assert get_op("op", (x, w), timer=timer) is fast
    assert torch.equal(x, x0) and torch.equal(w, w0)
    assert [c[0] for c in calls] == ["slow", "fast"]
    ptrs = {t.data_ptr() for c in calls for t in c[1:]}  # (calls keeps the clones alive: no address reuse)
    assert len(ptrs) == 4 and not ptrs & {x.data_ptr(), w.data_ptr()}  # each candidate got its own clones
    key = choice_key("op", (x, w), match_impls("op", (x, w)))
    assert key.shape == (("arg0", (64, 16)), ("arg1", (16,))) and key.candidates == ("slow", "unsupported", "fast")
    stored = registry.get(key.cache_key(tuning))
    assert stored.config == {"impl": "fast", "times_ms": {"slow": 2.0, "fast": 1.0}}
    assert (stored.time, stored.default_time, stored.trials) == (1e-3, 2e-3, 2)

    # the same bucket (T=33, 60 and 64 all round up to 64) is answered from memory, then from the persistent cache
    assert get_op("op", (torch.randn(60, 16, device=DEVICE), w), timer=timer) is fast
    reg._CHOICES.clear()
    assert get_op("op", (torch.randn(64, 16, device=DEVICE), w), timer=timer) is fast
    assert len(calls) == 2
    other = (torch.randn(33, 32, device=DEVICE), torch.randn(32, device=DEVICE))
    assert choice_key("op", other, match_impls("op", other)) != key  # H is not a token dim: exact


def test_choices_stay_in_memory_without_tuning(registry, monkeypatch):
    monkeypatch.setattr(reg, "_tuning", lambda: None)
    timed = []
    register_op("op", lambda x: x, Sig(Tensor("M")), impl_name="a")
    register_op("op", lambda x: x, Sig(Tensor("M")), impl_name="b")
    for _ in range(2):
        assert select_impl("op", (torch.randn(3),), timer=lambda thunk: timed.append(1) or len(timed)).name == "a"
    assert len(timed) == 2 and len(registry) == 0


def test_bench_callable_is_what_gets_timed(registry):
    timed = []
    sig = Sig(Tensor("M"))
    register_op("op", lambda x: x, sig, impl_name="a", bench=lambda x: timed.append("a"))
    register_op("op", lambda x: x, sig, impl_name="b", bench=lambda x: timed.append("b"))
    select_impl("op", (torch.randn(3),), timer=lambda thunk: thunk() or 1.0)
    assert timed == ["a", "b"]


def test_every_candidate_unsupported(registry):
    def nope(x):
        raise KernelUnsupported("no fp8 here")

    register_op("op", nope, Sig(Tensor("M")), impl_name="a")
    register_op("op", nope, Sig(Tensor("M")), impl_name="b")
    with pytest.raises(OpMatchError, match="op/a: no fp8 here"):
        get_op("op", (torch.randn(3),), timer=lambda thunk: thunk() or 1.0)


def test_list_ops_and_replacement(registry):
    register_norms()
    register_op("rms_norm", norm_torch, Sig(Tensor("K")), description="replaced", impl_name="torch")
    ops = list_ops()
    assert list(ops) == ["rms_norm"]
    assert [(i.name, i.description) for i in ops["rms_norm"]] == [("triton", "the kernel"), ("torch", "replaced")]
    assert str(ops["rms_norm"][0]) == (
        "rms_norm/triton(Tensor[M, K] f16|bf16|f32 on cuda|cpu, Tensor[K], float) where K % 16 == 0, "
        "M in [1, inf]: the kernel"
    )


def test_builtin_library_three_ways():
    from dlblas_compiler import library as kernels
    from dlblas_compiler.library.gating import topk_gating

    ops = list_ops()
    for name in ("topk_gating", "fused_moe", "fp8_gemm"):
        assert [i.name for i in ops[name]] == ["triton", "torch"] and all(i.description for i in ops[name])
    assert ops["fused_moe"][0].space is not None
    logits = torch.randn(9, 8, device=DEVICE)
    op = get_op("topk_gating", (logits, 2))
    assert topk_gating is kernels.topk_gating
    assert op is topk_gating if DEVICE == "cpu" else op in (topk_gating, kernels.topk_gating_reference)
    a, b, c = op(logits, 2), topk_gating(logits, 2), kernels.topk_gating(logits, 2)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.weights, c.weights)
    with pytest.raises(OpMatchError) as info:
        get_op("topk_gating", (logits, 9))
    assert "topk_gating/triton: arg 1 is k=9, but k must be in [1, E=8]" in str(info.value)


def test_builtin_fp8_falls_back_to_torch_off_hopper():
    q = torch.zeros(16, 32, dtype=torch.float8_e4m3fn)
    args = (q, q, torch.ones(()), torch.ones(16))
    impls = match_impls("fp8_gemm", args)
    assert [i.name for i, _ in impls] == ["torch"]
    with pytest.raises(OpMatchError) as info:
        get_op("fp8_gemm", (q, q, torch.ones(3), torch.ones(16)))
    assert "  fp8_gemm/triton: arg 0 is on cpu, expected cuda" in str(info.value)
    assert "  fp8_gemm/torch: requires a_scale with 1 or M elements" in str(info.value)
