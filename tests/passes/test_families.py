"""`passes.families`: the line through two compiles' sizes, and the classes of equal ops an instance copies once."""

import torch
from xdsl.dialects import func

import dlblas_compiler as dc
from dlblas_compiler.passes.families import ShapeFamily

from ..e2e.test_generate import BASE, causal_lm
from ..e2e.test_shape_families import _LM


def _family() -> ShapeFamily:
    """The family of dynamo's symbolic graph of a 2-layer Llama, compiled at 9 and 11 tokens (8 goes to dynamo's
    first, static graph)."""
    torch._dynamo.reset()
    f = dc.compile(_LM(causal_lm("llama")).forward, backend="reference")
    with torch.no_grad():
        for n in (8, 9, 11):
            f(torch.randint(1, 128, (1, n), generator=torch.Generator().manual_seed(n)))
    (family,) = f.compilations[-1]._families
    return family.shapes


def test_the_parameter_is_the_position_on_the_line_within_the_buckets():
    shapes = _family()
    assert shapes.sizes == ((9, 1, 9, 8), (11, 1, 11, 8))  # (the symbolic length, the ids' dims, inv_freq's)
    assert shapes.parameter((9, 1, 9, 8)) == 0 and shapes.parameter((11, 1, 11, 8)) == 1
    assert shapes.parameter((10, 1, 10, 8)) == 0.5 and shapes.parameter((16, 1, 16, 8)) == 3.5
    assert shapes.parameter((17, 1, 17, 8)) is None  # another bucket
    assert shapes.parameter((10, 1, 10, 9)) is None  # a size the two compiles share differs
    assert shapes.parameter((10, 1, 12, 8)) is None  # two moving sizes off the line
    assert shapes.parameter((1,)) is None


def test_each_layers_copy_of_an_op_is_in_one_class():
    """Ops equal in both compiles up to the values they read are one class: here each op of a layer and its
    copy in the other layer (the two layers' regions among them), never two ops of one kind with other types."""
    shapes = _family()
    ops = list(shapes.module.walk())
    members: dict[int, list] = {}
    for i, c in shapes.classes.items():
        members.setdefault(c, []).append(ops[i])
    assert members and all(len(group) >= 2 for group in members.values())
    assert all(len({op.name for op in group}) == 1 for group in members.values())
    regions = [group for group in members.values() if group[0].name == "dl.fused"]
    assert regions and all(len(group) % BASE["num_hidden_layers"] == 0 for group in regions)
    top = {op for op in next(o for o in ops if isinstance(o, func.FuncOp)).body.block.ops}
    assert all(op in top for group in members.values() for op in group)
