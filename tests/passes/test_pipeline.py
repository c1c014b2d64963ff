"""Pass pipeline: stage names, IR at every stage, dumps, verification, per-pass checking."""

import os
from dataclasses import dataclass

import pytest
import torch
from xdsl.parser import Parser
from xdsl.passes import ModulePass

import dlblas_compiler as dc
from dlblas_compiler.dialects import ConstantOp, make_context
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_


@dc.register_pass
@dataclass(frozen=True)
class BreakConstantsPass(ModulePass):
    """A deliberately wrong pass: doubles every scalar constant."""

    name = "test-break-constants"

    def apply(self, ctx, op):
        for o in list(op.walk()):
            if isinstance(o, ConstantOp):
                new = ConstantOp(o.scalar * 2 + 1, o.result.type.element_type)
                o.parent.insert_op_before(new, o)
                o.result.replace_all_uses_with(new.result)
                o.parent.erase_op(o)


@dc.register_pass
@dataclass(frozen=True)
class BreakIRPass(ModulePass):
    """A deliberately broken pass: adds a reshape whose element count is wrong."""

    name = "test-break-ir"

    def apply(self, ctx, op):
        from dlblas_compiler.dialects import ReshapeOp
        from dlblas_compiler.dialects.types import shape_of

        first = next(o for o in op.walk() if isinstance(o, ReshapeOp))
        first.parent.insert_op_after(ReshapeOp(first.result, [*shape_of(first.result), 2]), first)


def _block():
    cfg = BlockConfig()
    return randomize_(LlamaBlock(cfg)).eval(), llama_block_inputs(cfg, 1, 6)


def test_ir_at_every_stage_and_dumps(tmp_path):
    model, inputs = _block()
    cm = dc.compile(model, backend="reference", dump_ir=str(tmp_path), pipeline="cse,classify")
    with torch.no_grad():
        cm(*inputs)
    assert cm.passes == ["input", "after:cse", "after:classify"]
    assert 'kind = "one-to-one"' in cm.ir("after:classify")
    assert "kind =" not in cm.ir("before:classify")
    assert cm.ir("final") == cm.ir("after:classify")
    (spec,) = os.listdir(tmp_path / "0-LlamaBlock")  # the module's folder, then the input signature's
    assert spec == "0-f32_1x6x64-f32_6x16-f32_6x16"
    ir = tmp_path / "0-LlamaBlock" / spec / "ir"
    files = sorted(os.listdir(ir))
    assert files == ["00-input.mlir", "01-after-cse.mlir", "02-after-classify.mlir"]
    for f in files:
        Parser(make_context(), open(ir / f).read()).parse_module().verify()
    with pytest.raises(KeyError, match="stages are"):
        cm.ir("after:nothing")


def test_check_each_pass_names_the_pass_that_broke_the_result():
    model, inputs = _block()
    cm = dc.compile(model, backend="reference", pipeline="cse,test-break-constants,classify", check_each_pass=True)
    with pytest.raises(dc.CompileError, match="pass 'test-break-constants' changed the result"), torch.no_grad():
        cm(*inputs)


def test_invalid_ir_names_the_pass_that_made_it():
    """The IR is verified once after the last pass; invalid IR there is traced back to the pass that made it."""
    model, inputs = _block()
    cm = dc.compile(model, backend="reference", pipeline="cse,test-break-ir,classify")
    with pytest.raises(dc.CompileError, match="pass 'test-break-ir' produced invalid IR"), torch.no_grad():
        cm(*inputs)


def test_unknown_pass_lists_known_ones():
    model, _ = _block()
    with pytest.raises(ValueError, match="known passes: .*classify"):  # (at dc.compile, not at the first call)
        dc.compile(model, backend="reference", pipeline="cse,no-such-pass")


def test_default_pipeline_runs_and_matches_eager():
    model, inputs = _block()
    cm = dc.compile(model, backend="reference", check_each_pass=True)
    with torch.no_grad():
        torch.testing.assert_close(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    assert cm.passes[0] == "input" and len(cm.passes) == len(dc.DEFAULT_PIPELINE.split(",")) + 1
