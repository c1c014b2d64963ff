"""`classify`: write every op's DNNFusion mapping kind into the IR (`kind = "one-to-one"`, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

from ..dialects.traits import kind_of
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class ClassifyPass(ModulePass):
    name = "classify"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for o in op.walk():
            kind = kind_of(o)
            if kind is not None:
                o.attributes["kind"] = StringAttr(kind.value)
