"""The split-KV decode attention kernel (query length <= 16): every split count and key tile on lengths that
are not multiples of the tile, with GQA, a static cache's valid-length mask, additive masks with fully masked
rows, and causal; compared with a float64 reference on fresh random inputs."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.codegen.attention import DECODE_ROWS
from dlblas_compiler.numerics import rel_error
from dlblas_compiler.runtime.steps import RegionStep


class Attend(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=True)


def _inputs(b, hq, hk, s, l_, d, mask_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for h, n in ((hq, s), (hk, l_), (hk, l_)))
    valid = torch.tensor([l_ - 3 - 7 * i for i in range(b)])  # a static cache filled to different lengths
    keep = torch.arange(l_)[None, :] < valid[:, None]
    keep = keep[:, None, None, :].expand(b, 1, s, l_).clone()
    if mask_kind == "bool":
        return q, k, v, keep
    if mask_kind == "rows":  # an additive mask with one fully masked row
        keep[0, 0, 0, :] = False
    return q, k, v, torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "rows"])
@pytest.mark.parametrize("shape", [(2, 8, 2, 1, 77, 16), (1, 4, 4, 4, 300, 32), (2, 6, 2, 3, 129, 64)],
                         ids=["gqa4-s1-l77", "mha-s4-l300", "gqa3-s3-l129"])  # fmt: skip
def test_every_split_and_tile_equals_the_reference(shape, mask_kind):
    b, hq, hk, s, l_, d = shape
    assert s <= DECODE_ROWS
    q, k, v, mask = _inputs(b, hq, hk, s, l_, d, mask_kind)
    model = Attend(causal=False)
    cm = dc.compile(model, backend="interpret", strict=True)
    with torch.no_grad():
        cm(q, k, v, mask)
    (step,) = [x for x in cm._spec().executor.steps if isinstance(x, RegionStep)]
    assert "SPLITS" in step.kernel.source and "ws_ptr" in step.kernel.source
    truth = model(q.double(), k.double(), v.double(), mask if mask.dtype == torch.bool else mask.double())
    space = step.kernel.space
    for splits in (1, 2, 4, 8):
        for bn in (16, 64):
            config = dict(space.default(), SPLITS=splits, BLOCK_N=bn)
            if not space.is_valid(config):
                continue
            (out,) = step.launch([q, k, v, mask], config)
            assert torch.equal(out.isnan(), truth.isnan()), config
            keep = ~truth.isnan()
            assert rel_error(out[keep], truth[keep].float()) <= 1e-5, config


def test_causal_decode_rows_are_top_left_aligned():
    b, hq, hk, s, l_, d = 1, 4, 2, 5, 40, 16
    q, k, v, _ = _inputs(b, hq, hk, s, l_, d, "bool", seed=3)
    model = Attend(causal=True)

    class NoMask(nn.Module):
        def forward(self, q, k, v):
            return model(q, k, v, None)

    cm = dc.compile(NoMask(), backend="interpret", strict=True)
    with torch.no_grad():
        out = cm(q, k, v)
    truth = NoMask()(q.double(), k.double(), v.double())
    assert rel_error(out, truth.float()) <= 1e-5


def test_split_count_follows_the_gpu_and_the_length(monkeypatch):
    """The default splits the keys until batch x KV heads x splits fills about one wave of the GPU, each split
    at least 96 keys: a short cache is not split, a long one is, and a larger batch splits less."""
    from dlblas_compiler.codegen import attention, device

    def default(b, hk, l_):
        q, k, v, mask = _inputs(b, hk * 4, hk, 1, l_, 16, "bool")
        cm = dc.compile(Attend(False), backend="interpret")
        with torch.no_grad():
            cm(q, k, v, mask)
        (step,) = [x for x in cm._spec().executor.steps if isinstance(x, RegionStep)]
        return step.kernel.space.default()["SPLITS"]

    assert default(1, 2, 150) == 1
    long = default(1, 2, 8192)
    assert long > 1 and 1 * 2 * long <= device.sm_count() and 8192 // long >= 96
    monkeypatch.setattr(device, "sm_count", lambda: 4)  # (a small GPU: the batch fills it)
    assert default(1, 2, 8192) == 2 and default(2, 2, 8192) == 1
    assert math.log2(long).is_integer() and attention.DECODE_PARAMS["SPLITS"][-1] >= long


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
@pytest.mark.parametrize("s", [2, 24], ids=["decode", "prefill"])
@pytest.mark.parametrize("case", ["nan key", "inf key", "nan value"])
def test_a_non_finite_key_the_mask_drops_spreads_as_in_eager(case, s, mask_kind):
    """A key the mask drops is dropped as eager's math drops it, by adding -inf: a NaN or +inf score there (NaN +
    -inf, inf - inf) turns the row NaN, and a NaN value reaches it through 0 * v — in the decode and the prefill
    kernels, where the key's tile is read (another row keeps that key). Under is_causal a future key leaves no trace,
    as eager skips it. NaN positions against eager's (torch's CPU math), values where finite."""
    b, hq, hk, l_, d = 1, 4, 2, 24, 16
    q, k, v, _ = _inputs(b, hq, hk, s, l_, d, "bool")
    keep = torch.ones(b, 1, s, l_, dtype=torch.bool)
    keep[..., : s - 1, 5] = False  # key 5: dropped for every row but the last, so its tile is read
    if case == "nan key":
        k[0, 1, 5, 3] = float("nan")
    elif case == "inf key":
        k[0, 0, 5] = float("inf")
    else:
        v[0, 1, 5, 7] = float("nan")
    mask = keep if mask_kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    want = Attend(causal=False)(q, k, v, mask)
    assert torch.isnan(want[:, :, : s - 1]).any()  # (eager: the dropped key reaches the other rows too)
    with torch.no_grad():
        got = dc.compile(Attend(causal=False), backend="interpret", strict=True)(q, k, v, mask)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = torch.isfinite(want)
    assert rel_error(got[finite], want[finite]) < 1e-5
    # is_causal, no mask: a NaN key in the future of every row but the last leaves those rows finite, as in eager
    k[0, :, l_ - 1] = float("nan")
    causal = Attend(causal=True)
    want = causal(q, k, v, None)
    with torch.no_grad():
        got = dc.compile(causal, backend="interpret", strict=True)(q, k, v, None)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
