"""fused_moe's "grouped" implementation (torch._grouped_mm + two small Triton kernels) against a float64 loop over
experts, and its choice against the "triton" one.

The grouped GEMMs run on CPU in torch (bf16, f16, f32), the Triton kernels (SiLU*up, the weighted sum) under the
interpreter; on a CUDA machine the `gpu` test runs the CUTLASS path. Relative errors ||out - ref|| / ||ref|| against
fused_moe_reference on float64 copies: float32 <= 1e-5 (measured ~3e-7), bf16 <= 1e-2 (measured ~4e-3: gate/up, h
and y are each rounded to bf16).
"""

import pytest
import torch

from dlblas_compiler.library import moe_gemm
from dlblas_compiler.library.moe_gemm import (
    default_config,
    fused_moe,
    fused_moe_reference,
    grouped_mm_fast,
    grouped_unsupported,
)

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
GROUPED = {"IMPL": "grouped"}


@pytest.fixture
def grouped_calls(monkeypatch):
    """Counts the calls of torch._grouped_mm (so a test knows which path ran)."""
    calls, real = [], torch._grouped_mm

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_grouped_mm", counted)
    return calls


def moe_inputs(T, H, inter, E, k, dtype, experts, dropped=0, device="cpu"):
    """x, w_gate_up, w_down, ids (distinct experts per token drawn from `experts`; the first `dropped` tokens' last
    slot -1, with a NaN weight that must not be read), weights; unit-scale outputs."""
    experts = torch.tensor(experts)
    x = torch.randn(T, H)
    w_gate_up = torch.randn(E, 2 * inter, H) / H**0.5
    w_down = torch.randn(E, H, inter) / inter**0.5
    ids = torch.stack([experts[torch.randperm(len(experts))[:k]] for _ in range(T)])
    weights = torch.rand(T, k) + 0.1
    ids[:dropped, -1], weights[:dropped, -1] = -1, float("nan")
    x, w_gate_up, w_down = (t.to(device, dtype) for t in (x, w_gate_up, w_down))
    return x, w_gate_up, w_down, ids.to(device), weights.to(device)


def reference(x, w_gate_up, w_down, ids, weights, w_up=None):
    """fused_moe_reference in float64 (dropped slots' weights zeroed: the loop never reads them either)."""
    weights = weights.double().masked_fill(ids < 0, 0.0)
    up = None if w_up is None else w_up.double()
    return fused_moe_reference(x.double(), w_gate_up.double(), w_down.double(), ids, weights, w_up=up)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("separate_up", [False, True], ids=["w_gate_up", "w_up"])
def test_grouped_matches_reference(dtype, separate_up, poisoned, grouped_calls):
    # T = 37 (prime); experts 2 and 5 (the last) get no tokens; 5 tokens drop their second slot
    x, w_gate_up, w_down, ids, weights = moe_inputs(37, 64, 96, 6, 2, dtype, [0, 1, 3, 4], dropped=5)
    if separate_up:  # views of w_gate_up: strided, the up view at an offset
        args = (x, w_gate_up[:, :96], w_down, ids, weights)
        kwargs = {"w_up": w_gate_up[:, 96:]}
    else:
        args, kwargs = (x, w_gate_up, w_down, ids, weights), {}
    out = torch.full_like(x, float("nan"))
    assert fused_moe(*args, **kwargs, out=out, config=GROUPED) is out
    assert len(grouped_calls) == (3 if separate_up else 2)
    assert out.dtype == dtype and rel_err(out, reference(x, w_gate_up, w_down, ids, weights)) <= TOL[dtype]


@pytest.mark.parametrize("dropped", [0, 1])
def test_grouped_one_token(dropped, poisoned, grouped_calls):
    x, w_gate_up, w_down, ids, weights = moe_inputs(1, 32, 48, 4, 2, torch.float32, range(4), dropped=dropped)
    out = fused_moe(x, w_gate_up, w_down, ids, weights, config=GROUPED)
    assert grouped_calls and rel_err(out, reference(x, w_gate_up, w_down, ids, weights)) <= TOL[torch.float32]


def test_grouped_and_triton_agree(grouped_calls):
    x, w_gate_up, w_down, ids, weights = moe_inputs(45, 64, 32, 5, 3, torch.float32, [0, 2, 3, 4], dropped=7)
    w_down = w_down.transpose(1, 2).contiguous().transpose(1, 2)  # column-major: the other stride case
    args = (x, w_gate_up, w_down, ids, weights)
    grouped = fused_moe(*args, config=GROUPED)
    assert len(grouped_calls) == 2
    triton_ = fused_moe(*args, config={"IMPL": "triton"})
    assert len(grouped_calls) == 2
    assert rel_err(grouped, triton_.double()) <= TOL[torch.float32]
    assert rel_err(grouped, reference(*args)) <= TOL[torch.float32]


@pytest.mark.parametrize("impl", ["grouped", "triton"])
def test_strided_tokens_and_weights(impl):
    """x every other column of a wider tensor, the routing weights a column slice of a wider [T, 2k]: both paths
    read them by their strides."""
    x, w_gate_up, w_down, ids, weights = moe_inputs(19, 32, 48, 4, 2, torch.float32, range(4), dropped=3)
    wide_x = torch.stack([x, torch.full_like(x, float("nan"))], 2).reshape(19, -1)
    wide_w = torch.cat([weights, torch.full_like(weights, float("nan"))], 1)
    out = fused_moe(wide_x[:, ::2], w_gate_up, w_down, ids, wide_w[:, :2], config={"IMPL": impl})
    assert rel_err(out, reference(x, w_gate_up, w_down, ids, weights)) <= TOL[torch.float32]


def test_tiles_without_impl_choose_the_triton_path(monkeypatch, grouped_calls):
    """A config of tiles and no IMPL where the default would be grouped: the tiles are the triton path's."""
    monkeypatch.setattr(moe_gemm, "grouped_mm_fast", lambda dtype, device: True)
    monkeypatch.setattr(moe_gemm, "GROUPED_MIN_ROWS", 1)
    x, w_gate_up, w_down, ids, weights = moe_inputs(8, 32, 48, 4, 2, torch.float32, range(4))
    fused_moe(x, w_gate_up, w_down, ids, weights)
    assert len(grouped_calls) == 2  # the default here: grouped
    fused_moe(x, w_gate_up, w_down, ids, weights, config={"BLOCK_M": 16})
    assert len(grouped_calls) == 2


def test_default_impl(monkeypatch):
    # on CPU (and wherever grouped_mm_fast says no) the default is always triton
    assert default_config(8 * 4096, 8, torch.bfloat16, "cpu")["IMPL"] == "triton"
    assert default_config(8 * 4096, 8, torch.bfloat16)["IMPL"] == "triton"
    monkeypatch.setattr(moe_gemm, "grouped_mm_fast", lambda dtype, device: True)
    rows = moe_gemm.GROUPED_MIN_ROWS
    assert default_config(8 * rows, 8, torch.bfloat16, "cuda")["IMPL"] == "grouped"
    assert default_config(8 * rows - 1, 8, torch.bfloat16, "cuda")["IMPL"] == "triton"
    assert set(moe_gemm.SPACE["IMPL"]) == {"triton", "grouped"}
    with pytest.raises(ValueError, match="IMPL='cutlass'"):
        fused_moe(*moe_inputs(3, 16, 16, 2, 1, torch.float32, [0, 1]), config={"IMPL": "cutlass"})


def test_grouped_mm_fast(monkeypatch):
    """The CUTLASS path (no host sync): CUDA, bf16, compute capability 9.x or 10.x."""
    assert not grouped_mm_fast(torch.bfloat16, "cpu") and not grouped_mm_fast(torch.bfloat16, None)
    for capability, dtype, fast in [((9, 0), torch.bfloat16, True), ((10, 0), torch.bfloat16, True),
                                    ((8, 0), torch.bfloat16, False), ((9, 0), torch.float16, False),
                                    ((9, 0), torch.float32, False)]:  # fmt: skip
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert grouped_mm_fast(dtype, "cuda") == fast, (capability, dtype)


def test_grouped_falls_back_to_triton(monkeypatch):
    # H = 66 floats: rows of 264 bytes, not a multiple of 16: torch._grouped_mm would refuse them
    x, w_gate_up, w_down, ids, weights = moe_inputs(13, 66, 32, 4, 2, torch.float32, range(4), dropped=2)
    assert "multiples of 4 elements" in grouped_unsupported(x, (w_gate_up, w_down))
    monkeypatch.setattr(torch, "_grouped_mm", None)  # fails if called
    out = fused_moe(x, w_gate_up, w_down, ids, weights, config=GROUPED)
    assert rel_err(out, reference(x, w_gate_up, w_down, ids, weights)) <= TOL[torch.float32]
    # no unit stride in a weight's last two dims
    x, w_gate_up, w_down, ids, weights = moe_inputs(5, 32, 32, 4, 2, torch.float32, range(4))
    assert "unit stride" in grouped_unsupported(x, (w_gate_up[:, :, ::2], w_down))
    # float16 and f32 are CPU-only; on CUDA only bf16 on sm90/sm100 avoids a host sync
    assert grouped_unsupported(x.double(), (w_gate_up.double(), w_down.double())) is not None
    monkeypatch.delattr(torch, "_grouped_mm")
    assert grouped_unsupported(x, (w_gate_up, w_down)) == "this torch has no _grouped_mm"
    out = fused_moe(x, w_gate_up, w_down, ids, weights, config=GROUPED)
    assert rel_err(out, reference(x, w_gate_up, w_down, ids, weights)) <= TOL[torch.float32]


@pytest.mark.gpu
def test_gpu_grouped_bf16():
    if not grouped_mm_fast(torch.bfloat16, "cuda"):
        pytest.skip("torch._grouped_mm's CUTLASS path needs compute capability 9.x or 10.x")
    args = moe_inputs(300, 256, 384, 8, 2, torch.bfloat16, [0, 1, 2, 4, 5, 6], dropped=20, device="cuda")
    ref = reference(*args)
    grouped = fused_moe(*args, config=GROUPED)
    assert rel_err(grouped, ref) <= TOL[torch.bfloat16]
    assert rel_err(fused_moe(*args, config={"IMPL": "triton"}), ref) <= TOL[torch.bfloat16]
    x, w_gate_up, w_down, ids, weights = args
    assert rel_err(fused_moe(x, w_gate_up[:, :384], w_down, ids, weights, w_up=w_gate_up[:, 384:], config=GROUPED),
                   ref) <= TOL[torch.bfloat16]  # fmt: skip
    assert default_config(8 * moe_gemm.GROUPED_MIN_ROWS, 8, torch.bfloat16, "cuda")["IMPL"] == "grouped"


@pytest.mark.parametrize("impl", ["triton", "grouped"])
def test_an_expert_id_outside_the_experts_is_a_dropped_slot(impl):
    """An id >= E (or < -1) read past the weights (about 2e34 on that token's row, no error); it is now a dropped
    slot, as -1 is and as the reference skips it."""
    x, w_gate_up, w_down, ids, weights = moe_inputs(5, 16, 8, 4, 2, torch.float32, range(4))
    ids[0, 0], ids[2, 1] = 4, -7
    out = fused_moe(x, w_gate_up, w_down, ids, weights, config={"IMPL": impl})
    assert torch.isfinite(out).all()
    assert rel_err(out, reference(x, w_gate_up, w_down, ids, weights)) < TOL[torch.float32]


@pytest.mark.parametrize("impl", ["grouped", "triton"])
def test_transposed_x_and_out(impl, poisoned, grouped_calls):
    """x a transposed view ([T, H] with strides (1, T)) and out= one too: the output used to take x's strides
    (empty_like) and the sum kernel wrote it as if row-major (errors ~1e38); both paths now honour out's strides
    and return a row-major tensor of their own."""
    x, w_gate_up, w_down, ids, weights = moe_inputs(13, 32, 48, 4, 2, torch.float32, range(4), dropped=2)
    ref = reference(x, w_gate_up, w_down, ids, weights)
    xt = x.t().contiguous().t()
    out = fused_moe(xt, w_gate_up, w_down, ids, weights, config={"IMPL": impl})
    assert out.is_contiguous() and rel_err(out, ref) <= TOL[torch.float32]
    given = torch.full((32, 13), float("nan")).t()
    assert fused_moe(xt, w_gate_up, w_down, ids, weights, out=given, config={"IMPL": impl}) is given
    assert rel_err(given, ref) <= TOL[torch.float32]
    assert len(grouped_calls) == (4 if impl == "grouped" else 0)  # the path asked for ran
