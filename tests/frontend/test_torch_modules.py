"""torch.nn's attention and transformer modules compile to generated kernels and give eager's values
(frontend/torch_modules.py): in eval under no_grad eager runs their native fast paths, which a trace had kept as
opaque calls (no kernel ran), and nn.TransformerEncoder pads a nested result with zeros."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import transformer

import dlblas_compiler as dc
from dlblas_compiler.models import randomize_
from dlblas_compiler.numerics import rel_error

E, HEADS, FF = 64, 4, 128  # (heads of 16: the attention template takes multiples of 16)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _pad(*ends, length=9):
    """A key padding mask (True = padding) whose row b pads from position ends[b] on."""
    pad = torch.zeros(len(ends), length, dtype=torch.bool)
    for b, end in enumerate(ends):
        pad[b, end:] = True
    return pad


def _compiled(model, *args, backend="interpret", **kwargs):
    with torch.no_grad():
        ref = model(*args, **kwargs)
        cm = dc.compile(model, backend=backend, strict=True)
        out = cm(*args, **kwargs)
    return cm, out, ref


def _no_opaque_attention(cm):
    report = cm.report()
    assert "attention" in report.patterns or "row" in report.patterns, report
    assert "multi_head_attention" not in report.text() and "transformer_encoder_layer" not in report.text(), report


class SelfAttention(nn.Module):
    def __init__(self, batch_first=True, need_weights=False, average=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=batch_first)
        self.need_weights, self.average = need_weights, average

    def forward(self, x, pad=None, mask=None):
        return self.attn(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=self.need_weights,
                         average_attn_weights=self.average)  # fmt: skip


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_multihead_attention_runs_kernels_with_eagers_values(need_weights, average):
    """Its fast path off while capturing, dynamo traces torch's functional form (a copy: dynamo keeps the original
    as one call): the projections are GEMM kernels, the attention an attention kernel (or, where the weights are
    returned, the scores' softmax a row kernel), with a key padding mask and an attention mask."""
    model = randomize_(SelfAttention(need_weights=need_weights, average=average)).eval()
    x, pad = _x(3, 9, E), _pad(9, 6, 2)
    for kwargs in ({}, {"pad": pad}, {"mask": nn.Transformer.generate_square_subsequent_mask(9)}):
        cm, (out, weights), (ref, ref_weights) = _compiled(model, x, **kwargs)
        _no_opaque_attention(cm)
        assert rel_error(out, ref) <= 1e-5 and (weights is None) == (ref_weights is None)
        assert weights is None or rel_error(weights, ref_weights) <= 1e-5


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_with_padding_gives_eagers_padded_rows(batch_first, norm_first):
    """In eval with a padding mask, eager runs a post-norm encoder's layers on a nested tensor of the real tokens
    and pads the result with zeros (the final norm then makes each padded row the norm of zeros); a pre-norm or
    sequence-first encoder, or padding not at the end of every sequence, runs dense. Each case compiles to kernels
    and equals eager, padded rows included: padding at the end, in the middle, an additive float mask, a whole
    sequence of padding, and a causal attention mask (whose causality is a hint the capture does not read from its
    values)."""
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    model = randomize_(nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(E), enable_nested_tensor=True)).eval()
    x = _x(3, 9, E)
    x = x if batch_first else x.transpose(0, 1).contiguous()
    middle = _pad(9, 6, 2)
    middle[0, 4] = True
    whole = _pad(9, 6, 0)
    cases = {
        "end": {"src_key_padding_mask": _pad(9, 6, 2)},
        "middle": {"src_key_padding_mask": middle},
        "float": {"src_key_padding_mask": torch.zeros(3, 9).masked_fill(_pad(9, 6, 2), float("-inf"))},
        "causal": {"mask": nn.Transformer.generate_square_subsequent_mask(9)},
    }
    if not (batch_first and norm_first):  # (eager's native layer gives NaN: docs/bad-inputs.md)
        cases["whole sequence"] = {"src_key_padding_mask": whole}
    for name, kwargs in cases.items():
        cm, out, ref = _compiled(model, x, **kwargs)
        _no_opaque_attention(cm)
        assert torch.isfinite(ref).all() and torch.isfinite(out).all(), name
        assert rel_error(out, ref) <= 1e-5, (name, rel_error(out, ref))
    if batch_first and not norm_first:  # (eager nests: each padded row is the final norm of zeros, one value)
        pad = _pad(9, 6, 2)
        _, out, ref = _compiled(model, x, src_key_padding_mask=pad)
        assert torch.allclose(out[pad], ref[pad], atol=1e-6)
        assert torch.allclose(ref[pad], ref[pad][:1].expand_as(ref[pad]))


def test_transformer_with_masks_runs_kernels_with_eagers_values():
    """nn.Transformer: encoder and decoder, a causal target mask, padding on the source and the memory."""
    model = randomize_(nn.Transformer(E, HEADS, 2, 2, FF, dropout=0.0, batch_first=True, activation="gelu")).eval()
    src, tgt, pad = _x(3, 9, E), _x(3, 5, E, seed=1), _pad(9, 6, 2)
    cm, out, ref = _compiled(model, src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
                             src_key_padding_mask=pad, memory_key_padding_mask=pad)  # fmt: skip
    _no_opaque_attention(cm)
    assert cm.report().patterns.count("attention") == 6 and rel_error(out, ref) <= 1e-5


def test_capture_leaves_torch_as_it_was():
    """What the capture changes it puts back: the fast path switch, torch's functions, and dynamo's list of
    functions it keeps whole (so torch.compile of the same module keeps F.multi_head_attention_forward as one call)."""
    from torch._dynamo import trace_rules

    model = randomize_(SelfAttention()).eval()
    before = (torch.backends.mha.get_fastpath_enabled(), F.multi_head_attention_forward, F._check_key_padding_mask,
              transformer._detect_is_causal_mask)  # fmt: skip
    _compiled(model, _x(2, 5, E), _pad(5, 3, length=5))
    after = (torch.backends.mha.get_fastpath_enabled(), F.multi_head_attention_forward, F._check_key_padding_mask,
             transformer._detect_is_causal_mask)  # fmt: skip
    assert after == before and F.multi_head_attention_forward in trace_rules.get_torch_obj_rule_map()
