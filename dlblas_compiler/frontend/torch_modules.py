"""torch.nn's own attention and transformer modules, traced through their Python paths.

In eval under no_grad, `nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and `nn.TransformerEncoder` take native
fast paths (`torch._native_multi_head_attention`, `torch._transformer_encoder_layer_fwd`, nested tensors), which a
trace keeps as opaque calls, and symbolic_trace keeps every torch.nn module but Sequential as one opaque call: such a
model ran no generated kernel. While the frontend captures a model (`torch_modules_traced`):

* the fast path is off, so the modules' Python paths are traced: linears, `F.scaled_dot_product_attention` (or the
  scores' matmul and softmax where the attention weights are returned), norms and activations, the same values
  (dynamo keeps `F.multi_head_attention_forward` whole, as one call, so a copy of it that dynamo traces through
  stands in for it);
* a model holding `nn.MultiheadAttention` is captured by dynamo, which traces into it (`torch_attention_in`);
* `_detect_is_causal_mask`, which reads a mask's values to tell whether it is causal (a hint for the attention
  kernel: the mask is applied either way), keeps the caller's `is_causal`: reading values is data-dependent and
  stopped the capture of every `nn.TransformerEncoder(x, mask=causal)`;
* an `nn.TransformerEncoder` that eager would run on a nested tensor (fast path on, `enable_nested_tensor`, eval, a
  padding mask and no attention mask, batched input, no autocast) gives eager's padded rows: eager runs the layers
  on the real tokens only and pads the result with zeros (before the final norm, so a padded row is the norm of
  zeros), where the dense path computes a value there. It does so only where the padding is at the end of each
  sequence; elsewhere, as eager (whose `mask_check` then keeps the dense path), every row is computed. The real
  tokens' values are the same on both paths.

Eager's choice between the paths reads `torch.backends.mha.get_fastpath_enabled()` at each call; a compiled module
reads it when it captures.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.nn.modules import transformer as _transformer


def torch_attention_in(model: torch.nn.Module) -> str | None:
    """The name of the first `nn.MultiheadAttention` class in `model`, if any: such a model is captured by dynamo,
    which traces into it (symbolic_trace keeps torch.nn's modules whole, and inside them the functional
    `F.multi_head_attention_forward` as one call)."""
    return next((type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)), None)


def _traced_copy(fn: types.FunctionType) -> types.FunctionType:
    """The same function as another object: dynamo keeps `F.multi_head_attention_forward` in its graph as one call
    (a function on its list of torch functions), and traces through a copy."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return copy


def _check_key_padding_mask(key_padding_mask: torch.Tensor, src_len: int, bsz: int) -> None:
    """torch's check of a key padding mask's shape, with a message dynamo can trace (torch's closes over the mask)."""
    shape = tuple(key_padding_mask.shape)
    if shape[:2] != (bsz, src_len):
        raise AssertionError(f"Expected key_padding_mask of shape {(bsz, src_len)}, but got {shape}")


def _hinted_causal(mask=None, is_causal=None, size=None) -> bool:
    """`_detect_is_causal_mask` without reading the mask: the caller's hint alone (the mask is applied anyway)."""
    return is_causal is True


def _padded_as_nested(encoder: torch.nn.TransformerEncoder):
    """`encoder`'s forward with eager's nested-tensor padding: rows of the padding (at the end of every sequence)
    are the final norm of zeros (zeros without one); the dense forward's values everywhere else."""
    dense = type(encoder).forward.__get__(encoder)

    def forward(src, mask=None, src_key_padding_mask=None, is_causal=None):
        out = dense(src, mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        if src_key_padding_mask is None or mask is not None or src.dim() != 3 or torch.is_autocast_enabled():
            return out  # (eager's dense path too)
        pad = src_key_padding_mask if src_key_padding_mask.dtype == torch.bool else src_key_padding_mask != 0
        keep = ~pad
        rows = pad if encoder.layers[0].self_attn.batch_first else pad.transpose(0, 1)
        zero = out.new_zeros(1, 1, out.shape[-1])
        fill = encoder.norm(zero) if encoder.norm is not None else zero
        padded = torch.where(rows[..., None], fill, out)
        if not getattr(encoder, "mask_check", True):
            return padded
        at_end = ~(keep[:, 1:] & pad[:, :-1]).any()  # no real token after a padded one: eager nests
        return torch.where(at_end, padded, out)

    return forward


@contextlib.contextmanager
def torch_modules_traced(model: torch.nn.Module) -> Iterator[None]:
    """While capturing `model`: the attention fast path off, `_detect_is_causal_mask` on the hint alone, and each
    `nn.TransformerEncoder` that eager would run nested giving eager's padded rows (see the module's docstring).
    A model without `nn.MultiheadAttention` (every torch transformer module holds one) is captured as it is."""
    if torch_attention_in(model) is None:
        yield
        return
    fastpath = torch.backends.mha.get_fastpath_enabled()
    encoders = [m for m in model.modules() if isinstance(m, torch.nn.TransformerEncoder)] if fastpath else []
    nested = [m for m in encoders if getattr(m, "use_nested_tensor", False) and not m.layers[0].training
              and "forward" not in vars(m)]  # fmt: skip
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map()  # (built once, from torch's own functions: not from the copy below)
    detect, mha, check = _transformer._detect_is_causal_mask, F.multi_head_attention_forward, F._check_key_padding_mask
    torch.backends.mha.set_fastpath_enabled(False)
    _transformer._detect_is_causal_mask = _hinted_causal
    F.multi_head_attention_forward, F._check_key_padding_mask = _traced_copy(mha), _check_key_padding_mask
    for m in nested:
        m.forward = _padded_as_nested(m)
    try:
        yield
    finally:
        for m in nested:
            del m.forward
        _transformer._detect_is_causal_mask = detect
        F.multi_head_attention_forward, F._check_key_padding_mask = mha, check
        torch.backends.mha.set_fastpath_enabled(fastpath)
