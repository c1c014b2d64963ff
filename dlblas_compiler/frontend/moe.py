"""Mixture-of-experts blocks as one graph op.

A Hugging Face MoE block routes tokens with data-dependent Python loops (`for expert in expert_hit`,
`torch.where`), which no tracer can follow. While the frontend captures a model, each recognized MoE block's
forward is swapped for the same computation written with one op, `torch.ops.dlblas.moe` (a torch custom op
whose eager implementation is the torch reference), so the captured graph holds a single node that the
importer turns into `dl.moe`. Recognized: `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock` (its shared
expert and gate stay ordinary ops, which the compiler fuses like any SwiGLU MLP), `Qwen3MoeSparseMoeBlock` and
`OlmoeSparseMoeBlock` (Qwen2-MoE's router and experts without the shared expert); anything else with
`register_moe_block`. Each adapter first checks that the instance has the form `dl.moe` computes (SiLU experts
with 3-d `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], a softmax top-k router with a `weight` [E, H]);
another form keeps the block's own forward, which the capture runs as ordinary ops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from ..dialects.compute import moe_reference

MoEForward = Callable[[torch.Tensor], torch.Tensor]
_BLOCKS: dict[str, Callable[[torch.nn.Module], MoEForward | None]] = {}


@torch.library.custom_op("dlblas::moe", mutates_args=())
def moe(
    x: torch.Tensor, router_weight: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int, renormalize: bool
) -> torch.Tensor:
    """SwiGLU experts behind a softmax top-k router; see `dl.moe` for shapes and semantics."""
    return moe_reference(x, router_weight, w_gate_up, w_down, top_k, renormalize)


@moe.register_fake
def _(x, router_weight, w_gate_up, w_down, top_k, renormalize):
    return torch.empty_like(x)


def register_moe_block(cls: type | str, adapter: Callable[[torch.nn.Module], MoEForward | None]) -> None:
    """Recognize modules of class `cls` (or class name): `adapter(module)` returns a forward computing the
    block with `torch.ops.dlblas.moe` (or None when this instance cannot be expressed, e.g. another activation)."""
    _BLOCKS[cls if isinstance(cls, str) else cls.__name__] = adapter


def _silu_experts(experts: torch.nn.Module) -> bool:
    act = getattr(experts, "act_fn", None)
    return isinstance(act, torch.nn.SiLU) or act is F.silu or type(act).__name__ == "SiLUActivation"


def _standard_experts(block: torch.nn.Module) -> bool:
    """The block's router and experts have the shapes and the activation `dl.moe` computes with."""
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    gu, down, w = (getattr(m, n, None) for m, n in ((experts, "gate_up_proj"), (experts, "down_proj"), (gate, "weight")))
    if not all(isinstance(t, torch.Tensor) for t in (gu, down, w)) or not isinstance(getattr(gate, "top_k", None), int):
        return False
    e, i2, h = gu.shape if gu.dim() == 3 else (0, 0, 0)
    return _silu_experts(experts) and i2 % 2 == 0 and tuple(down.shape) == (e, h, i2 // 2) and tuple(w.shape) == (e, h)


def _hf_routed(block: torch.nn.Module, flat: torch.Tensor, renormalize: bool) -> torch.Tensor:
    gate, experts = block.gate, block.experts
    return torch.ops.dlblas.moe(flat, gate.weight, experts.gate_up_proj, experts.down_proj, gate.top_k, renormalize)


def _mixtral(block: torch.nn.Module) -> MoEForward | None:
    if not _standard_experts(block) or (block.training and block.jitter_noise > 0):
        return None

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, h = hidden_states.shape
        return _hf_routed(block, hidden_states.reshape(-1, h), True).reshape(b, s, h)

    return forward


def _qwen2_moe(block: torch.nn.Module) -> MoEForward | None:
    if not _standard_experts(block):
        return None

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, h = hidden_states.shape
        flat = hidden_states.reshape(-1, h)
        routed = _hf_routed(block, flat, bool(block.gate.norm_topk_prob))
        shared = torch.sigmoid(block.shared_expert_gate(flat)) * block.shared_expert(flat)
        return (routed + shared).reshape(b, s, h)

    return forward


def _routed_only(block: torch.nn.Module) -> MoEForward | None:
    """Qwen3-MoE, OLMoE: Qwen2-MoE's router (softmax in float32, top-k, renormalized if `norm_topk_prob`) and
    experts, no shared expert."""
    if not _standard_experts(block) or not hasattr(block.gate, "norm_topk_prob"):
        return None

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, h = hidden_states.shape
        return _hf_routed(block, hidden_states.reshape(-1, h), bool(block.gate.norm_topk_prob)).reshape(b, s, h)

    return forward


register_moe_block("MixtralSparseMoeBlock", _mixtral)
register_moe_block("Qwen2MoeSparseMoeBlock", _qwen2_moe)
register_moe_block("Qwen3MoeSparseMoeBlock", _routed_only)
register_moe_block("OlmoeSparseMoeBlock", _routed_only)


@contextlib.contextmanager
def moe_blocks_as_ops(model: torch.nn.Module) -> Iterator[list[str]]:
    """While active, every recognized MoE block of `model` runs through `torch.ops.dlblas.moe`; yields the
    names of the blocks swapped (the instance's own forward is restored afterwards)."""
    swapped: list[tuple[torch.nn.Module, object]] = []
    names = []
    try:
        for name, mod in model.named_modules():
            adapter = _BLOCKS.get(type(mod).__name__)
            fwd = adapter(mod) if adapter else None
            if fwd is not None:
                swapped.append((mod, mod.__dict__.get("forward")))
                mod.forward = fwd
                names.append(name or type(mod).__name__)
        yield names
    finally:
        for mod, old in swapped:
            if old is None:
                del mod.forward
            else:
                mod.forward = old
