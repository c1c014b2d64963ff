"""The `dl` tensor dialect: every op with its mapping kind, verifier and torch reference."""

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.ir import Dialect

from .compute import *  # noqa: F403
from .compute import COMPUTE_OPS, ReduceOp
from .elementwise import *  # noqa: F403
from .elementwise import BINARY_OPS, ELEMENTWISE_OPS, UNARY_OPS, BinaryOp, UnaryOp
from .layout import *  # noqa: F403
from .layout import LAYOUT_OPS, VIEW_OPS
from .structural import *  # noqa: F403
from .structural import STRUCTURAL_OPS
from .traits import Mapping, MappingKind, kind_of

ALL_OPS = [*ELEMENTWISE_OPS, *LAYOUT_OPS, *COMPUTE_OPS, *STRUCTURAL_OPS]
DL = Dialect("dl", ALL_OPS, [])


def make_context() -> Context:
    """A context with builtin, func and dl loaded (what the parser and the passes need)."""
    ctx = Context()
    for d in (Builtin, Func, DL):
        ctx.load_dialect(d)
    return ctx


__all__ = [
    "DL",
    "ALL_OPS",
    "UNARY_OPS",
    "BINARY_OPS",
    "UnaryOp",
    "ReduceOp",
    "BinaryOp",
    "Mapping",
    "MappingKind",
    "kind_of",
    "make_context",
    "VIEW_OPS",
    *[op.__name__ for op in ALL_OPS],
]
