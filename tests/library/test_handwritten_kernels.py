"""Library kernels against their torch references: topk_gating, fused_moe, fp8_gemm.

On CPU the Triton kernels run under the interpreter (fp32/fp16 only: its bf16 tl.dot is wrong). No TRITON_INTERPRET
is needed, and none would be reliable here: triton 3.6 fixes interpreted-vs-compiled when a function is decorated
(triton.language's own helpers at `import triton`, which other test modules may do first), so kernels.common.launch
runs CPU launches through interpreted twins instead. On a CUDA machine the same tests run compiled, and the `gpu`
tests add bf16 and fp8.
"""

import pytest
import torch

from dlblas_compiler.library import (
    KernelUnsupported,
    OpMatchError,
    expert_capacity,
    fp8_gemm,
    fp8_gemm_reference,
    fused_moe,
    fused_moe_reference,
    get_op,
    moe_align_block_size,
    quantize_fp8,
    topk_gating,
    topk_gating_reference,
)
from dlblas_compiler.library.gating import _TopKGating

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty / empty_like return NaN-filled floats (-7777 ints): any element a kernel leaves unwritten, or
    reads before writing, shows up in the result."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan") if t.is_floating_point() else -7777)

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# ----------------------------------------------------------------------------------------------------- topk_gating


@pytest.mark.parametrize(
    "T,E,k,renormalize,index_dtype",
    [(37, 8, 2, True, torch.int64), (37, 16, 4, False, torch.int32), (5, 6, 6, True, torch.int64)],
)
def test_topk_gating_matches_reference(T, E, k, renormalize, index_dtype, poisoned):
    logits = torch.randn(E, T, device=DEVICE).T  # strided view: the kernel takes any strides
    out = topk_gating(logits, k, renormalize=renormalize, index_dtype=index_dtype)
    ref = topk_gating_reference(logits, k, renormalize=renormalize, index_dtype=index_dtype)
    assert out.ids.dtype == index_dtype and torch.equal(out.ids, ref.ids)
    assert out.weights.dtype == logits.dtype
    torch.testing.assert_close(out.weights, ref.weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.aux_loss, ref.aux_loss, rtol=1e-5, atol=1e-6)
    if renormalize:
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(T, device=DEVICE))


def test_topk_gating_fp16_logits():
    logits = torch.randn(37, 8, device=DEVICE).half()
    out, ref = topk_gating(logits, 2), topk_gating_reference(logits, 2)
    assert torch.equal(out.ids, ref.ids) and out.weights.dtype == torch.float16
    torch.testing.assert_close(out.weights, ref.weights, rtol=1e-3, atol=1e-3)


def test_aux_loss_value():
    T, E, k = 37, 8, 2
    logits = torch.randn(T, E, device=DEVICE)
    out = topk_gating(logits, k)
    probs = torch.softmax(logits.double(), -1)
    chosen = probs.topk(k, -1).indices.tolist()
    expected = E * sum(
        (sum(e in row for row in chosen) / T) * probs[:, e].mean().item() for e in range(E)
    )  # E * sum_e (fraction of tokens routed to e) * (mean probability of e)
    assert out.aux_loss.item() == pytest.approx(expected, rel=1e-5)
    balanced = 10 * torch.eye(E, device=DEVICE)  # token t prefers expert t: every f_e = P_e = 1/E
    assert topk_gating(balanced, 1).aux_loss.item() == pytest.approx(1.0, rel=1e-6)


def _capacity_by_loop(ids: list[list[int]], E: int, capacity: int) -> list[list[int]]:
    taken = [0] * E
    kept = []
    for row in ids:  # token order
        kept.append([])
        for e in row:
            kept[-1].append(e if taken[e] < capacity else -1)
            taken[e] += 1
    return kept


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0])
def test_capacity_drops_late_tokens(capacity_factor, poisoned):
    T, E, k = 24, 4, 2
    logits = torch.randn(T, E, device=DEVICE)
    logits[:, 0] += 3.0  # expert 0 is everyone's favourite ...
    logits[:, 3] -= 20.0  # ... and expert 3 receives no token
    out = topk_gating(logits, k, capacity_factor=capacity_factor)
    free = topk_gating(logits, k)
    capacity = expert_capacity(T, k, E, capacity_factor)
    assert capacity == {0.5: 6, 1.0: 12}[capacity_factor]
    assert out.ids.tolist() == _capacity_by_loop(free.ids.tolist(), E, capacity)
    dropped = out.ids == -1
    assert dropped.any() and not (out.ids == 3).any()
    assert (out.weights[dropped] == 0).all()
    torch.testing.assert_close(out.weights[~dropped], free.weights[~dropped])  # renormalized before dropping
    torch.testing.assert_close(out.aux_loss, free.aux_loss)  # the loss counts routing before capacity
    ref = topk_gating_reference(logits, k, capacity_factor=capacity_factor)
    assert torch.equal(out.ids, ref.ids)
    torch.testing.assert_close(out.weights, ref.weights, rtol=1e-5, atol=1e-6)


def test_capacity_scan_over_several_token_blocks(poisoned):
    T, E, k = 100, 256, 2  # the capacity kernel scans 32 tokens at a time at E=256
    logits = torch.randn(T, E, device=DEVICE)
    logits[:, :4] += 4.0  # most tokens want experts 0-3; capacity is ceil(200 / 256) = 1
    out, free = topk_gating(logits, k, capacity_factor=1.0), topk_gating(logits, k)
    assert out.ids.tolist() == _capacity_by_loop(free.ids.tolist(), E, 1)
    assert (out.ids == -1).sum() > T // 2


@pytest.mark.parametrize("renormalize,capacity_factor", [(True, None), (False, None), (True, 0.6), (False, 0.6)])
def test_topk_gating_gradcheck_float64(renormalize, capacity_factor):
    logits = torch.randn(7, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)

    def route(x):  # the torch forward path, so that gradcheck checks the backward kernel in float64
        _, weights, aux = _TopKGating.apply(x, 2, capacity_factor, renormalize, torch.int64, False)
        return weights, aux

    assert torch.autograd.gradcheck(route, (logits,))


@pytest.mark.parametrize("renormalize,capacity_factor", [(True, None), (False, 0.75)])
def test_topk_gating_triton_gradients_match_reference(renormalize, capacity_factor):
    T, E, k = 21, 8, 3
    logits = torch.randn(T, E, device=DEVICE)
    d_weights, d_aux = torch.randn(T, k, device=DEVICE), 0.37
    grads = []
    for fn in (topk_gating, topk_gating_reference):
        x = logits.clone().requires_grad_(True)
        out = fn(x, k, capacity_factor=capacity_factor, renormalize=renormalize)
        ((out.weights * d_weights).sum() + d_aux * out.aux_loss).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (the interpreter's NaN math)
@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_gating_rows_of_nan_probabilities(renormalize, poisoned):
    """A NaN or +inf logit, or a row of -inf, makes the row's softmax NaN. The kernel returned id E (or past it)
    there, neither an expert nor -1, and fused_moe then dropped the token (0 where eager's MoE gives NaN). NaN ranks
    above every number, as in torch.topk: k distinct experts (torch.topk picks an order of its own among the
    tied NaNs; the kernel keeps "lowest index first": 0, ..., k-1), NaN weights as in the reference."""
    T, E, k = 6, 5, 2
    logits = torch.randn(T, E, device=DEVICE)
    logits[1, 3] = float("nan")
    logits[2, 0] = float("inf")
    logits[4] = float("-inf")
    out = topk_gating(logits, k, renormalize=renormalize)
    ref = topk_gating_reference(logits, k, renormalize=renormalize)
    bad = torch.tensor([False, True, True, False, True, False], device=DEVICE)
    assert out.ids[bad].tolist() == [[0, 1]] * 3
    assert out.weights[bad].isnan().all() and ref.weights[bad].isnan().all()
    assert torch.equal(out.ids[~bad], ref.ids[~bad])
    torch.testing.assert_close(out.weights[~bad], ref.weights[~bad], rtol=1e-5, atol=1e-6)
    assert out.aux_loss.isnan() and ref.aux_loss.isnan()
    # the MoE output of those tokens is NaN, as the float64 reference's on the reference's routing
    x, w_gate_up, w_down, _, _ = moe_inputs(T, 16, 8, E, k, torch.float32)
    y = fused_moe(x, w_gate_up, w_down, out.ids, out.weights)
    y_ref = moe_reference(x, w_gate_up, w_down, ref.ids, ref.weights)
    assert y[bad].isnan().all() and y_ref[bad].isnan().all()
    assert rel_err(y[~bad], y_ref[~bad]) <= 1e-4


def test_topk_gating_backward_with_no_tokens():
    """T = 0: the backward divided by T**2 (ZeroDivisionError); now an empty gradient, as the reference's."""
    for fn in (topk_gating, topk_gating_reference):
        logits = torch.randn(0, 4, device=DEVICE, requires_grad=True)
        out = fn(logits, 2)
        (out.weights.sum() + out.aux_loss).backward()
        assert logits.grad is not None and logits.grad.shape == (0, 4)


def test_topk_gating_rejects_bad_arguments():
    logits = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"k=9 must be in \[1, E=8\]"):
        topk_gating(logits, 9)
    with pytest.raises(ValueError, match="capacity_factor=0 must be > 0"):
        topk_gating(logits, 2, capacity_factor=0)


# ------------------------------------------------------------------------------------------------------- fused_moe


def moe_inputs(T, H, inter, E, k, dtype, experts=None):
    """x, w_gate_up, w_down, ids (distinct experts per token, drawn from `experts`), weights; unit-scale outputs."""
    experts = torch.tensor(experts if experts is not None else range(E))
    x = torch.randn(T, H, device=DEVICE)
    w_gate_up = torch.randn(E, 2 * inter, H, device=DEVICE) / H**0.5
    w_down = torch.randn(E, H, inter, device=DEVICE) / inter**0.5
    ids = torch.stack([experts[torch.randperm(len(experts))[:k]] for _ in range(T)]).to(DEVICE)
    weights = torch.rand(T, k, device=DEVICE)
    return [t.to(dtype) if t.is_floating_point() else t for t in (x, w_gate_up, w_down, ids, weights)]


def moe_reference(x, w_gate_up, w_down, ids, weights, w_up=None):
    f64 = [t.double() if t is not None and t.is_floating_point() else t for t in (x, w_gate_up, w_down, ids, weights)]
    return fused_moe_reference(*f64, w_up=None if w_up is None else w_up.double())


TOL = {torch.float32: 1e-4, torch.float16: 5e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("experts", [None, [0, 1, 3]], ids=["all-experts", "expert-2-idle"])
def test_fused_moe_matches_loop_reference(dtype, experts, poisoned):
    args = moe_inputs(33, 64, 96, 4, 2, dtype, experts)
    out = torch.full_like(args[0], float("nan"))
    assert fused_moe(*args, out=out) is out
    assert out.dtype == dtype and rel_err(out, moe_reference(*args)) <= TOL[dtype]


def test_fused_moe_separate_gate_and_up_and_small_tiles(poisoned):
    x, w_gate_up, w_down, ids, weights = moe_inputs(19, 64, 48, 4, 2, torch.float32)
    gate, up = w_gate_up[:, :48].contiguous(), w_gate_up[:, 48:].contiguous()
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, DOWN_BLOCK_N=32, DOWN_BLOCK_K=32)  # ragged N, K tiles
    out = fused_moe(x, gate, w_down, ids, weights, w_up=up, config=cfg)
    assert rel_err(out, moe_reference(x, w_gate_up, w_down, ids, weights)) <= TOL[torch.float32]


def test_fused_moe_skips_dropped_slots(poisoned):
    x, w_gate_up, w_down, _, _ = moe_inputs(29, 64, 32, 4, 2, torch.float32)
    logits = torch.randn(29, 4, device=DEVICE)
    logits[:, 1] += 2.0
    ids, weights, _ = topk_gating(logits, 2, capacity_factor=0.75)
    assert (ids == -1).any()
    out = fused_moe(x, w_gate_up, w_down, ids, weights)
    assert rel_err(out, moe_reference(x, w_gate_up, w_down, ids, weights)) <= TOL[torch.float32]


def test_fused_moe_refuses_what_its_kernels_do_not_take():
    """Direct calls that get_op would not route to the kernels: float64 (computed through tf32 dots: NaN and
    garbage), mixed dtypes and float ids (errors from inside the interpreter) raise OpMatchError naming the
    argument, as the registry does for a candidate that does not match."""
    x, w_gate_up, w_down, ids, weights = moe_inputs(5, 16, 8, 3, 2, torch.float32)
    f64 = [t.double() for t in (x, w_gate_up, w_down)]
    with pytest.raises(OpMatchError, match=r"fused_moe: arg 0 \(x\) dtype is f64, expected one of f16, bf16, f32"):
        fused_moe(*f64, ids, weights.double())
    with pytest.raises(OpMatchError, match=r"arg 1 \(w_gate_up\) dtype is f32, but arg 0 \(x\) dtype is f16"):
        fused_moe(x.half(), w_gate_up, w_down, ids, weights)
    with pytest.raises(OpMatchError, match=r"arg 3 \(topk_ids\) dtype is f32, expected one of i32, i64"):
        fused_moe(x, w_gate_up, w_down, ids.float(), weights)
    with pytest.raises(OpMatchError, match=r"arg 6 \(out\) dtype is f16, but arg 0 \(x\) dtype is f32"):
        fused_moe(x, w_gate_up, w_down, ids, weights, out=torch.empty(5, 16, dtype=torch.float16, device=DEVICE))
    assert get_op("fused_moe", (*f64, ids, weights.double())) is fused_moe_reference  # where get_op sends float64


def test_moe_align_block_size(poisoned):
    ids = torch.tensor([[2, 0], [0, -1], [2, 0], [0, 2]], device=DEVICE)
    sorted_pairs, block_expert = moe_align_block_size(ids, num_experts=4, block_m=2)
    pad = ids.numel()
    # expert 0: pairs 1, 2, 5, 6 (token order); expert 2: pairs 0, 4, 7 + padding; experts 1, 3: no blocks;
    # cdiv(8 pairs + 4 experts * (2 - 1), 2) = 6 blocks bound the padded size
    assert block_expert.tolist() == [0, 0, 2, 2, -1, -1]
    assert sorted_pairs[:8].tolist() == [1, 2, 5, 6, 0, 4, 7, pad]
    assert (sorted_pairs[8:] == pad).all() and sorted_pairs.numel() == 2 * block_expert.numel()


# --------------------------------------------------------------------------------------------------------- fp8_gemm


def test_quantize_fp8_round_trip():
    x = torch.randn(32, 64) * torch.logspace(-2, 2, 32)[:, None]  # rows of very different ranges
    for per_row in (False, True):
        q, scale = quantize_fp8(x, per_row=per_row)
        assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert scale.shape == ((32,) if per_row else ())
        deq = q.float() * (scale[:, None] if per_row else scale)
        assert rel_err(deq, x) < 0.04  # e4m3 keeps 3 mantissa bits: ~2^-4 relative rounding
    rows = (deq - x).norm(dim=1) / x.norm(dim=1)
    assert rows.max() < 0.06  # per-row scales keep even the small rows accurate


def test_fp8_gemm_reference():
    a, w = torch.randn(16, 64), torch.randn(48, 64)
    (qa, sa), (qw, sw) = quantize_fp8(a, per_row=True), quantize_fp8(w)
    ref = fp8_gemm_reference(qa, qw, sa, sw, out_dtype=torch.float64)
    manual = (qa.double() * sa.double()[:, None]) @ (qw.double() * sw.double()).T
    torch.testing.assert_close(ref, manual)
    assert rel_err(ref, a.double() @ w.double().T) < 0.05
    assert fp8_gemm_reference(qa, qw, sa, sw).dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a CUDA GPU")
def test_fp8_gemm_unsupported_on_cpu():
    qa, sa = quantize_fp8(torch.randn(16, 64))
    with pytest.raises(KernelUnsupported, match=r"compute capability >= 8\.9.*no float8 arithmetic"):
        fp8_gemm(qa, qa, sa, sa)


# ------------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_bf16_kernels():
    logits = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16)
    out, ref = topk_gating(logits, 6), topk_gating_reference(logits, 6)
    probs = torch.softmax(logits.float(), -1)  # bf16 logits tie often: check the choice is *a* top-k
    torch.testing.assert_close(probs.gather(1, out.ids), probs.topk(6, -1).values)
    torch.testing.assert_close(out.weights, ref.weights, rtol=1e-2, atol=1e-3)
    args = moe_inputs(300, 256, 384, 8, 2, torch.bfloat16)
    assert rel_err(fused_moe(*args), moe_reference(*args)) <= 1e-2


@pytest.mark.gpu
def test_gpu_fp8_gemm():
    if torch.cuda.get_device_capability() < (8, 9):
        q, s = quantize_fp8(torch.randn(16, 64, device="cuda"))
        with pytest.raises(KernelUnsupported, match="compute capability"):
            fp8_gemm(q, q, s, s)
        return
    for m, per_row in ((16, True), (300, False)):
        a, w = torch.randn(m, 512, device="cuda"), torch.randn(320, 512, device="cuda")
        (qa, sa), (qw, sw) = quantize_fp8(a, per_row), quantize_fp8(w, per_row)
        out = fp8_gemm(qa, qw, sa, sw, out_dtype=torch.bfloat16)
        assert rel_err(out, fp8_gemm_reference(qa, qw, sa, sw, out_dtype=torch.float64)) <= 1e-2
