"""Ops that structure a program rather than compute: parameters, opaque torch calls, fused regions."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from xdsl.dialects.builtin import AnyTensorType, DenseArrayBase, IntegerAttr, StringAttr
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    lazy_traits_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    MemoryEffect,
    Pure,
    RecursiveMemoryEffect,
    SingleBlockImplicitTerminator,
)
from xdsl.utils.exceptions import VerifyException

from .traits import MANY_TO_MANY, OPAQUE


@irdl_op_definition
class ParamOp(IRDLOperation):
    """`dl.param`: a named parameter or buffer of the module. Its value lives outside the IR, in the
    compiled module's parameter table, so the IR stays small and prints readably."""

    name = "dl.param"
    param_name = prop_def(StringAttr, prop_name="name")
    result = result_def(AnyTensorType)
    traits = traits_def(Pure())
    assembly_format = "$name attr-dict `:` type($result)"

    def __init__(self, name: str, type_: Attribute):
        super().__init__(properties={"name": StringAttr(name)}, result_types=[type_])

    @property
    def pname(self) -> str:
        return self.param_name.data


class InputFreeIsPure(MemoryEffect):
    """A torch_call the importer marked `input_free` (torch ops on constants: aranges, comparisons) or `pure` (an
    allocation: new_empty, zeros_like...; a view taken again after a write) has no effect but its result, so dead
    code elimination drops it once nothing reads it; any other may write."""

    @classmethod
    def get_effects(cls, op: Operation):
        return set() if "input_free" in op.attributes or "pure" in op.attributes else None


@irdl_op_definition
class TorchCallOp(IRDLOperation):
    """`dl.torch_call`: an op the compiler does not know, executed by PyTorch and never fused.

    `callee` names the callable (importable path), `node` the FX node it came from (which the
    compiled module maps to the source line); the bound callable itself lives in the compiled
    module's call table, keyed by `node`. `writes`: the operand an in-place method (`counter.add_(n)`)
    writes; the op works on a copy of it and its first result is that copy, the operand's new value (the
    runtime may let it write an input in place: `runtime.inplace`). A `fresh` attribute: eager's example
    results shared no memory with the operands (new tensors, not views; never set for calls whose answer depends
    on strides, such as `reshape`).
    """

    name = "dl.torch_call"
    args = var_operand_def(AnyTensorType)
    res = var_result_def(AnyTensorType)
    callee = prop_def(StringAttr)
    node = prop_def(StringAttr)
    writes = opt_prop_def(IntegerAttr)
    traits = traits_def(OPAQUE, InputFreeIsPure())
    assembly_format = "$callee `(` $args `)` attr-dict `:` functional-type($args, $res)"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, callee: str, node: str, args: Sequence[SSAValue], result_types: Sequence[Attribute]):
        super().__init__(
            operands=[list(args)],
            result_types=[list(result_types)],
            properties={"callee": StringAttr(callee), "node": StringAttr(node)},
        )

    @property
    def written(self) -> SSAValue | None:
        """The operand the call writes in place (on a copy), if any."""
        return None if self.writes is None else self.args[self.writes.value.data]

    def resolve(self):
        """The callable named by `callee` (used when no call table is at hand, e.g. IR read from text)."""
        parts = self.callee.data.split(".")
        for i in range(len(parts) - 1, 0, -1):  # the longest importable prefix, then attributes (a class's method,
            try:  # torch.ops.aten.slice.Tensor)
                obj = importlib.import_module(".".join(parts[:i]))
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
                return obj
            except (ImportError, AttributeError):
                continue
        raise ImportError(f"cannot import {self.callee.data}")


@irdl_op_definition
class YieldOp(IRDLOperation):
    """`dl.yield`: the values a `dl.fused` region produces."""

    name = "dl.yield"
    values = var_operand_def()
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(FusedOp), Pure()))
    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[list(values)])


@irdl_op_definition
class FusedOp(IRDLOperation):
    """`dl.fused`: a region that becomes one kernel. Block arguments are the region's inputs;
    `pattern` names the fusion pattern that made it, `template` the template that lowers it (when it is not
    the pattern's own name), `kernel` the generated kernel, `overwritable` the inputs whose memory nothing reads
    after the region (set by the fuse pass, `aliasing.overwritable`: its kernel may write over them)."""

    name = "dl.fused"
    inputs = var_operand_def(AnyTensorType)
    outputs = var_result_def(AnyTensorType)
    body = region_def("single_block")
    pattern = prop_def(StringAttr)
    kernel = opt_prop_def(StringAttr)
    template = opt_prop_def(StringAttr)
    overwritable = opt_prop_def(DenseArrayBase)
    traits = traits_def(
        RecursiveMemoryEffect(), IsolatedFromAbove(), SingleBlockImplicitTerminator(YieldOp), MANY_TO_MANY
    )
    assembly_format = "$pattern `(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs) $body"
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(
        self, pattern: str, inputs: Sequence[SSAValue], body: Block, kernel: str | None = None, template: str | None = None
    ):
        outs = [v.type for v in body.last_op.operands]
        props: dict[str, Attribute] = {"pattern": StringAttr(pattern)}
        if kernel:
            props["kernel"] = StringAttr(kernel)
        if template and template != pattern:
            props["template"] = StringAttr(template)
        super().__init__(operands=[list(inputs)], result_types=[outs], regions=[Region(body)], properties=props)

    @property
    def block(self) -> Block:
        return self.body.block

    @property
    def template_name(self) -> str:
        """The template that lowers the region (by default the pattern's name)."""
        return self.template.data if self.template is not None else self.pattern.data

    @property
    def label(self) -> str:
        """The region's name in reports and warnings: its kernel's name, else its pattern's."""
        return self.kernel.data if self.kernel is not None else self.pattern.data

    @property
    def overwritable_inputs(self) -> tuple[int, ...]:
        """The positions of the inputs the region's kernel may write over (`overwritable`)."""
        return tuple(self.overwritable.get_values()) if self.overwritable is not None else ()

    @property
    def body_ops(self) -> list[Operation]:
        """The region's ops, without the terminator."""
        return [o for o in self.block.ops if not isinstance(o, YieldOp)]

    @property
    def yielded(self) -> YieldOp:
        return self.block.last_op  # type: ignore[return-value]

    def verify_(self):
        args = self.block.args
        if len(args) != len(self.inputs) or any(a.type != v.type for a, v in zip(args, self.inputs)):
            raise VerifyException("dl.fused: block arguments must match the inputs one to one")
        if [v.type for v in self.yielded.values] != [r.type for r in self.outputs]:
            raise VerifyException("dl.fused: yielded values must match the results")


STRUCTURAL_OPS = [ParamOp, TorchCallOp, YieldOp, FusedOp]
