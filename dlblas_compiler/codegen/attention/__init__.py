"""The attention template: flash attention (online softmax, exp2) for a `dl.sdpa` region.

q [B, Hq, S, D], k/v [B, Hk, L, D], GQA (Hq a multiple of Hk), causal (top-left aligned, as torch's
is_causal) and/or an additive float or boolean mask broadcast to [B, Hq, S, L]. The views that
produce q/k/v (head reshapes and transposes) and those that consume the output (transpose back and
merge heads) are fused as strides, so the kernel reads projections and writes [B, S, H*D] directly.

Two kernels, chosen by the query length:
  prefill (S > DECODE_ROWS)  one program per block of BLOCK_M query rows of one head, looping over all keys; a
                             key tile the mask keeps nothing of (a materialized causal mask's upper triangle) is
                             skipped after reading the mask tile.
  decode  (S <= DECODE_ROWS) split-KV flash decoding: one program per (batch, KV head, split of the keys) takes
                             the S query rows of every query head sharing that KV head (GQA: each K/V tile is
                             read once for the group), and the last program of a (batch, KV head) to finish (an
                             acq_rel counter) combines the splits' partial softmaxes. A key tile whose mask keeps
                             nothing (a static cache's unused tail) reads no K/V: the traffic follows the valid
                             length.

Files: plan.py (analyze), prefill.py and decode.py (each kernel's source and search space), launch.py.
"""

from __future__ import annotations

from ...fusion.templates import PlannedTemplate, register_template
from ...tuning.space import SearchSpace
from .decode import DECODE_PARAMS, decode_source, decode_space
from .launch import build
from .plan import DECODE_ROWS, AttentionPlan, analyze, out_layout
from .prefill import PARAMS, prefill_space, source

__all__ = ["DECODE_PARAMS", "DECODE_ROWS", "PARAMS", "AttentionPlan", "analyze", "build",
           "decode_source", "decode_space", "out_layout", "prefill_space", "source", "space"]  # fmt: skip


def space(plan: AttentionPlan) -> SearchSpace:
    """The decode kernel's space for a short query, the prefill kernel's otherwise."""
    return decode_space(plan) if plan.decode else prefill_space(plan)


# flash attention for one dl.sdpa, reading q/k/v through the views that produce them and writing through the
# views of its output
register_template(PlannedTemplate("attention", PARAMS, analyze, build, space))
