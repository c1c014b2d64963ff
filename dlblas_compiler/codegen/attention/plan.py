"""What an attention region computes: one dl.sdpa, the views that produce q/k/v (read as strides) and those that
consume its output (written as strides); `analyze` accepts a region or says why not."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from ...dialects import PermuteOp, ReshapeOp, SDPAOp, inverse_permutation
from ...dialects.types import shape_of
from ..views import VIEW_OPS, Layout, view_chain, view_source
from .dims import MAX_HEAD_DIM, head_parts

DECODE_ROWS = 16  # query rows up to which the split-KV decode kernel runs


@dataclass
class AttentionPlan:
    sdpa: SDPAOp
    chains: dict[str, tuple[SSAValue, list[Operation]]]  # q/k/v/mask -> (region input, view chain)
    out_chain: list[Operation]  # views from the sdpa result to the region output

    @property
    def decode(self) -> bool:
        return shape_of(self.sdpa.query)[2] <= DECODE_ROWS

    @property
    def dims(self) -> tuple[int, int]:
        """The head dims of q/k and of v (and the output)."""
        return shape_of(self.sdpa.query)[-1], shape_of(self.sdpa.value)[-1]

    @property
    def output(self) -> SSAValue:
        return self.out_chain[-1].results[0] if self.out_chain else self.sdpa.result


def out_layout(chain: list[Operation], final_shape: tuple[int, ...]) -> Layout | None:
    """Where the sdpa result's elements land in a contiguous buffer of the final view's shape."""
    lay = Layout.contiguous(final_shape)
    for op in reversed(chain):
        src = tuple(op.operands[0].type.get_shape())
        if isinstance(op, ReshapeOp):
            try:
                t = lay.meta().view(src)
            except RuntimeError:
                return None
            lay = Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
        elif isinstance(op, PermuteOp):
            t = lay.meta().permute(inverse_permutation(op.permutation))
            lay = Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
        else:
            return None
    return lay


def analyze(ops: list[Operation], inputs: list[SSAValue]) -> AttentionPlan | str:
    sdpas = [o for o in ops if isinstance(o, SDPAOp)]
    if len(sdpas) != 1 or not all(isinstance(o, VIEW_OPS) for o in ops if o is not sdpas[0]):
        return "an attention region is one sdpa plus views"
    op = sdpas[0]
    inside = set(ops)
    q, k, v = (shape_of(x) for x in (op.query, op.key, op.value))
    if len(q) != 4:
        return f"attention needs [B, H, S, D] operands, got {q}"
    if head_parts(q[-1]) is None or head_parts(v[-1]) is None:
        return (f"head dims {q[-1]} (q, k) and {v[-1]} (v): the template takes multiples of 16 up to "
                f"{MAX_HEAD_DIM}")
    if min(q[2], k[2]) < 1:
        return "empty sequence"
    chains = {}
    for name, val in (("q", op.query), ("k", op.key), ("v", op.value), ("mask", op.mask)):
        if val is None:
            continue
        found = view_source(val, inside, inputs)
        if found is None:
            return f"{name} is not a region input read through views"
        base, chain = found
        if view_chain(Layout.contiguous(shape_of(base)), chain) is None:
            return f"the views producing {name} need a copy"
        chains[name] = found
    out_chain, cur = [], op.result
    while True:
        users = [u.operation for u in cur.uses if u.operation in inside]
        if not users:
            break
        if len(users) != 1 or not cur.has_one_use():
            return "the attention output is used twice inside the region"
        out_chain.append(users[0])
        cur = users[0].results[0]
    if out_layout(out_chain, shape_of(cur)) is None:
        return "the views of the output need a copy"
    return AttentionPlan(op, chains, out_chain)
