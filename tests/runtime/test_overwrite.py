"""A GEMM region whose residual nothing reads afterwards lets cuBLAS add the product into it (the GEMM template's
MM=2: `torch.addmm(r, x, W^T, out=r)`). The fuse pass marks such inputs (`dialects.aliasing.overwritable`), the
template offers MM=2 only there, and the runtime lets the kernel write the tensor itself only where its own check of
the final function agrees; tuning's candidates, checks and compile warm-ups never write the program's tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dlblas_compiler as dc
from dlblas_compiler.codegen.gemm.space import IN_PLACE
from dlblas_compiler.codegen.kernel import warm_ups
from dlblas_compiler.dialects import FusedOp
from dlblas_compiler.dialects.aliasing import overwritable
from dlblas_compiler.dialects.types import shape_of
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.runtime.steps import RegionStep


class Residuals(nn.Module):
    """h = x + o(relu(a(x))); y = h + down(relu(up(h))), and, by `tail`, something that still reads h afterwards."""

    def __init__(self, tail: str = "", h: int = 64, i: int = 128):
        super().__init__()
        self.tail = tail
        self.a, self.o = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.up, self.down = nn.Linear(h, i, bias=False), nn.Linear(i, h, bias=False)

    def forward(self, x):
        h = x + self.o(torch.relu(self.a(x)))
        if self.tail == "self":  # (the residual is also the GEMM's A operand)
            return h + self.o(h)
        y = h + self.down(torch.relu(self.up(h)))
        if self.tail == "output":
            return y, h
        if self.tail == "view":
            return y, h.reshape(-1)[:5]
        if self.tail == "later":
            return torch.cat([y, h], -1)
        return y


def _compiled(model, *inputs, **options):
    cm = dc.compile(model, backend="interpret", cuda_graphs=False, **options)
    with torch.no_grad():
        cm(*inputs)
    return cm, cm._spec()


def _regions(spec) -> dict[str, RegionStep]:
    return {s.choice.region: s for s in spec.executor.steps if isinstance(s, RegionStep)}


def _residual_regions(spec) -> list[tuple[FusedOp, tuple[int, ...]]]:
    """The regions with an input nothing reads afterwards (fuse pass's marks), with those inputs."""
    return [(op, op.overwritable_inputs) for op in spec.pipeline.module.walk()
            if isinstance(op, FusedOp) and op.overwritable_inputs]  # fmt: skip


def test_only_a_dead_residual_is_marked_and_offered():
    """The second residual add reads h, which nothing reads after it: its region may write over h, and its GEMM
    space offers MM=2 there alone. The first reads the model's input x: never written over."""
    torch.manual_seed(0)
    cm, spec = _compiled(Residuals().eval(), torch.randn(2, 8, 64))
    steps = _regions(spec)
    writers = {name: s for name, s in steps.items() if s.kernel is not None and s.kernel.overwrites}
    assert len(writers) == 1
    (name, step), = writers.items()
    assert step.writes == ((step.kernel.overwrites[0], True),)
    assert step.kernel.space.is_valid(IN_PLACE) and IN_PLACE in step.kernel.space.starts()
    for other, s in steps.items():
        if other != name and s.kernel is not None:
            assert not s.kernel.space.is_valid(IN_PLACE) and IN_PLACE not in s.kernel.space.starts()


@pytest.mark.parametrize("tail", ["output", "view", "later", "self"])
def test_a_residual_read_afterwards_is_never_written_over(tail):
    """h returned, h returned through a view, h read by a later op, h also the GEMM's A operand: no region writes
    over h (the residual regions get no MM=2)."""
    torch.manual_seed(0)
    model = Residuals(tail).eval()
    x = torch.randn(2, 8, 64)
    cm, spec = _compiled(model, x)
    steps = _regions(spec)
    residual = [s for s in steps.values() if s.kernel is not None
                and [o.name for o in s.kernel.region.body_ops] == ["dl.linear", "dl.add"]]  # fmt: skip
    assert len(residual) == 2  # (both residual adds are GEMM regions of the MM=2 form)
    if tail == "self":  # (marked, since nothing reads h afterwards, but it is also what cuBLAS reads as x)
        assert any(s.kernel.region.overwritable_inputs for s in residual)
    assert all(s.kernel is None or not s.kernel.overwrites for s in steps.values())
    with torch.no_grad():
        out, ref = cm(x), model(x)
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,), strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def test_a_reader_moved_after_the_region_withdraws_the_mark():
    """The runtime checks the final function again: with a reader of h moved after the region (as a later pass
    could), `overwritable` no longer lists it, so the kernel would write a copy."""
    torch.manual_seed(0)
    cm, spec = _compiled(Residuals().eval(), torch.randn(2, 8, 64))
    fn = spec.executor.recipe.builder.fn
    (step,) = [s for s in _regions(spec).values() if s.kernel is not None and s.kernel.overwrites]
    region, pos = step.kernel.region, step.kernel.overwrites[0]
    assert pos in overwritable(fn)[region]
    h = region.inputs[pos]
    earlier = [u.operation for u in h.uses if u.operation is not region]
    assert earlier
    earlier[0].detach()
    fn.body.block.insert_op_after(earlier[0], region)
    assert pos not in overwritable(fn).get(region, ())


@pytest.mark.parametrize("batch, seq", [(2, 8), (1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cublas_adding_into_the_dead_residual_equals_eager(dtype, batch, seq):
    """Down's region of a Llama block (MM=2 forced; also for one row, whose row stride is free) over several calls: the same outputs as eager; with check=True
    its reference reads the residual as it was; the report says what ran."""
    cfg = BlockConfig(hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32)
    model = randomize_(LlamaBlock(cfg)).to(dtype).eval()
    inputs = llama_block_inputs(cfg, batch, seq, dtype=dtype)
    for check in (False, True):
        cm, spec = _compiled(model, *inputs, check=check)
        steps = [s for s in _regions(spec).values() if s.kernel is not None and s.kernel.overwrites]
        assert len(steps) == 1  # (down + residual: o-proj's residual is the block's input)
        steps[0].choice.config = dict(IN_PLACE)
        with torch.no_grad():
            ref = model(*inputs)
            outs = [cm(*inputs) for _ in range(3)]
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for out in outs:
            torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        if check:
            c = steps[0].choice
            assert c.check_error is not None and c.check_error <= c.check_tolerance
    assert "adding into the residual in place" in str(cm.report())


def test_tuning_and_warm_ups_never_write_the_programs_tensors():
    """A candidate gets its own copy of the residual (`private(every=True)`), and a compile warm-up of MM=2 runs
    nothing: the tensors a tuner holds stay as they were."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 64)
    cm, spec = _compiled(Residuals().eval(), x)
    (step,) = [s for s in _regions(spec).values() if s.kernel is not None and s.kernel.overwrites]
    pos = step.kernel.overwrites[0]
    tensors = [torch.randn(shape_of(v)) for v in step.kernel.region.inputs]
    kept = [t.clone() for t in tensors]
    own = step.private(tensors, every=True)
    assert own[pos] is not tensors[pos] and all(own[i] is tensors[i] for i in range(len(tensors)) if i != pos)
    step.launch(own, dict(IN_PLACE))
    warm_ups(step.kernel, step.compiled, tensors, [dict(IN_PLACE)])()
    assert all(torch.equal(t, k) for t, k in zip(tensors, kept, strict=True))
    assert not torch.equal(own[pos], kept[pos])


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 128, 333])
def test_cublas_adds_into_dead_residuals_inside_cuda_graph_replays(tokens):
    """Two Llama blocks in bf16 on the GPU, every region that may run MM=2 made to (the second block's o-proj, both
    downs), replayed from the program's CUDA graph: each call equal to the same program with its default kernels
    within bf16 rounding, and as close to float64 eager as eager in bf16 is."""
    from .test_selection import TwoBlocks

    cfg = BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)
    model = randomize_(TwoBlocks(cfg)).to("cuda", torch.bfloat16).eval()
    inputs = llama_block_inputs(cfg, 1, tokens, dtype=torch.bfloat16, device="cuda")
    cm = dc.compile(model, backend="triton", tune="none", cuda_graphs=True)
    with torch.no_grad():
        default = cm(*inputs).clone()
        steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None
                 and s.kernel.overwrites]  # fmt: skip
        assert len(steps) == 3
        for s in steps:
            s.choice.impl, s.choice.config = "kernel", dict(IN_PLACE)
        cm._spec().executor.graph = None  # (captured again with the new choices)
        outs = [cm(*inputs).clone() for _ in range(4)]
        eager = model(*inputs).float()
        exact = model.double()(*[t.double() for t in inputs])
    err_eager = (eager.double() - exact).norm() / exact.norm()
    for out in outs:
        torch.testing.assert_close(out, default, rtol=2e-2, atol=2e-2)
        assert (out.double() - exact).norm() / exact.norm() <= 2 * err_eager + 1e-3
