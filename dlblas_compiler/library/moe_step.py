"""`dl.moe` on the library, registered into the runtime (which does not import the library).

On the kernel backends: topk_gating + fused_moe on this device; with an `expert_parallel` process group, the
EPMoE layer over it (torch experts on the reference backend), built on the first call from that call's weights
and rebuilt when they change (other tensors, or updated in place); with `expert_parallel_tokens` too, its
exchange goes through the GPUs' memory (`peer_tokens`). Without a group it never communicates, even where
torch.distributed is initialized (EPMoE would take the default group).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dialects import MoEOp
from ..runtime.ops import register_op_step


@dataclass
class MoEStep:
    ins: list[int]  # x, router weight, w_gate_up, w_down
    out: int
    top_k: int
    renormalize: bool
    group: Any = None  # a torch.distributed process group: EPMoE over it
    backend: str = "triton"  # EPMoE's experts: "triton" kernels or "reference" torch ops
    peer_tokens: int | None = None  # EPMoE's exchange through the GPUs' memory, room for this many tokens a rank
    _layer: list = field(default_factory=list)  # [(the weights' state, the weights, EPMoE)]

    def __repr__(self) -> str:
        how = f"EPMoE over {self.group}" if self.group is not None else "topk_gating + fused_moe"
        if self.group is not None and self.peer_tokens is not None:
            how += f", peer exchange for up to {self.peer_tokens} tokens a rank"
        return f"MoEStep(dl.moe top-{self.top_k}, {how}: {self.ins} -> [{self.out}])"

    def __call__(self, env: list) -> None:
        from .ep_moe import EPMoE, router_logits
        from .moe_gemm import fused_moe
        from .gating import topk_gating

        x, *weights = (env[i] for i in self.ins)
        if self.group is None:
            ids, w, _ = topk_gating(router_logits(x, weights[0]), self.top_k, renormalize=self.renormalize)
            env[self.out] = fused_moe(x, weights[1], weights[2], ids, w)
            return
        # rebuilt when a weight is another tensor, was updated in place (its version counter moved) or got new
        # storage (`p.data = t`): with several ranks EPMoE keeps copies of its experts, which would go stale.
        # As for the weights the runtime derives (runtime/weights.py), an inference tensor keeps no version.
        state = [(id(w), -1 if w.is_inference() else w._version, w.data_ptr()) for w in weights]
        if not self._layer or self._layer[0][0] != state:
            layer = EPMoE(*weights, self.top_k, renormalize=self.renormalize, group=self.group, backend=self.backend,
                          peer_tokens=self.peer_tokens)  # fmt: skip
            self._layer[:] = [(state, weights, layer)]
        env[self.out] = self._layer[0][2](x)


def moe_step(op: MoEOp, ins: list[int], outs: list[int], options) -> MoEStep:
    top_k, renormalize = op.attrs
    backend = "reference" if options.backend == "reference" else "triton"
    return MoEStep(ins, outs[0], top_k, renormalize, options.expert_parallel, backend, options.expert_parallel_tokens)


register_op_step(MoEOp, moe_step)
