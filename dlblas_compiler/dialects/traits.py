"""DNNFusion mapping kinds, carried by every `dl` op as a trait the passes read."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from xdsl.ir import Operation
from xdsl.traits import OpTrait


class MappingKind(str, Enum):
    """How output elements depend on input elements (Niu et al., DNNFusion, PLDI 2021)."""

    ONE_TO_ONE = "one-to-one"  # elementwise: out[i] = f(in[i]) (operand broadcasting allowed)
    ONE_TO_MANY = "one-to-many"  # broadcast / expand: one input element feeds many outputs
    MANY_TO_MANY = "many-to-many"  # matmul, reductions, softmax, norms, attention, gather
    REORGANIZE = "reorganize"  # reshape / view: same elements in the same order, new shape
    SHUFFLE = "shuffle"  # transpose / permute / slice / cat / rotary: elements move
    OPAQUE = "opaque"  # torch_call: unknown, never fused


@dataclass(frozen=True)
class Mapping(OpTrait):
    """The op's mapping kind; `kind_of(op)` reads it."""

    kind: MappingKind


def kind_of(op: Operation) -> MappingKind | None:
    trait = op.get_trait(Mapping)
    return trait.kind if trait is not None else None


ONE_TO_ONE = Mapping(MappingKind.ONE_TO_ONE)
ONE_TO_MANY = Mapping(MappingKind.ONE_TO_MANY)
MANY_TO_MANY = Mapping(MappingKind.MANY_TO_MANY)
REORGANIZE = Mapping(MappingKind.REORGANIZE)
SHUFFLE = Mapping(MappingKind.SHUFFLE)
OPAQUE = Mapping(MappingKind.OPAQUE)
