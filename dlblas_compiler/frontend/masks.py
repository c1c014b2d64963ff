"""Attention masks a graph builds from constants alone, recognized by their values.

Under tracing, Hugging Face builds the causal mask of a prefill from aranges compared with each other (the
offsets are Python ints dynamo specialized): a [1, 1, S, L] boolean tensor that torch recomputes on every call,
and that SDPA then reads tile by tile (cuDNN's masked kernel, ~4.5x the time of its causal one at S = 2048).
Such a mask depends on no input, module state or random number, so the importer evaluates it once (for real,
on the inputs' device) and, where it keeps exactly the keys j <= i + d of every query row i, records `d` on the
op that makes it (`causal_offset`). Recognizing the values, not the spelling, covers every way of writing it
(tril, arange comparisons, vmapped mask functions, additive 0 / -inf masks); `recognize` does the rest.
"""

from __future__ import annotations

import torch
import torch.fx

# names of ops whose value differs from call to call although they read no input
_RANDOM = ("rand", "bernoulli", "normal", "dropout", "empty", "multinomial", "uniform", "exponential", "poisson",
           "cauchy", "geometric", "seed")  # fmt: skip


def is_random(n: torch.fx.Node) -> bool:
    return is_random_name(n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target)))


def is_random_name(name: str) -> bool:
    """Whether the op called `name` gives other values on each call, though it reads no input."""
    return any(word in name.lower() for word in _RANDOM)


def causal_offset(mask: torch.Tensor) -> int | None:
    """d >= 0 if `mask` (boolean, True = keep, or additive with only 0 and -inf) keeps exactly the keys
    j <= i + d of each query row i, the same for every leading index; else None."""
    if mask.dim() < 2 or mask.shape[-1] == 0 or mask.shape[-2] == 0:
        return None
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        keep = mask == 0
        if not bool((keep | (mask == float("-inf"))).all()):
            return None
    else:
        return None
    s, l_ = keep.shape[-2:]
    d = int(keep.reshape(-1, s, l_)[0, 0].sum()) - 1
    if d < 0:
        return None
    rows = torch.arange(s, device=keep.device)[:, None]
    cols = torch.arange(l_, device=keep.device)[None, :]
    return d if torch.equal(keep, (cols <= rows + d).expand_as(keep)) else None
