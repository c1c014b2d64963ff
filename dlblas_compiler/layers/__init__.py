"""Neural-network layers built on the operator library: EPMoE, the expert-parallel mixture of experts."""

from .ep_moe import EPMoE, moe_reference

__all__ = ["EPMoE", "moe_reference"]
