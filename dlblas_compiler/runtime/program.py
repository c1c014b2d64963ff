"""The Program: a compiled specialization as a flat list of steps over a value table.

Steps are kernel launches (one per `dl.fused` region), torch references (ops left unfused, which
includes cuBLAS for a lone GEMM the tuner preferred there) and torch calls. Weight-only expressions
(concatenated / norm-folded weights) are evaluated once and re-evaluated when a source parameter is
modified in place. A region whose kernel fails to build or launch falls back to its reference with one
warning naming the region and the cause (an error under strict=True). On CUDA the whole Program can
be captured once in a CUDA graph and replayed while the input signature matches.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from ..codegen.kernel import Kernel, interpreted_stdlib
from ..codegen.lower import CallableLowering, LoweringError, lower_region, region_ops
from ..dialects import ConstantOp, FusedOp, ParamOp, TorchCallOp
from ..errors import CompileError
from ..passes.algebraic import is_constant
from .reference import DLReference


@dataclass
class KernelChoice:
    """What runs a region: its kernel and config, or its reference (and why)."""

    region: str
    pattern: str
    kernel: Kernel | None
    config: dict | None
    impl: str  # "kernel", "reference", "callable"
    reason: str = ""
    time: float | None = None
    default_time: float | None = None
    reference_time: float | None = None
    trials: int = 0
    from_cache: bool = False


@dataclass
class Program:
    inputs: list[int]
    outputs: list[int]
    steps: list[Callable[[list], None]]
    nslots: int
    consts: list[tuple[int, Callable[[], torch.Tensor], list[torch.Tensor]]]
    choices: list[KernelChoice] = field(default_factory=list)
    cuda_graphs: bool = False
    _const_versions: list[tuple] | None = None
    _graph: Any = None
    _static_in: list[torch.Tensor] | None = None
    _static_out: tuple | None = None
    _const_values: list[torch.Tensor] | None = None

    def _refresh_consts(self) -> list[torch.Tensor]:
        versions = [tuple(t._version for t in srcs) for _, _, srcs in self.consts]
        if self._const_values is None or versions != self._const_versions:
            with torch.no_grad():
                self._const_values = [fn() for _, fn, _ in self.consts]
            self._const_versions = versions
            self._graph = None  # captured pointers may be stale
        return self._const_values

    def run(self, inputs: list[torch.Tensor]) -> tuple:
        env: list[Any] = [None] * self.nslots
        for (slot, _, _), value in zip(self.consts, self._refresh_consts()):
            env[slot] = value
        for slot, x in zip(self.inputs, inputs):
            env[slot] = x if not isinstance(x, torch.Tensor) or x.is_contiguous() else x.contiguous()
        for step in self.steps:
            step(env)
        return tuple(env[s] for s in self.outputs)

    def __call__(self, inputs: list[torch.Tensor]) -> tuple:
        if not self.cuda_graphs or torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            return self.run(inputs)
        self._refresh_consts()
        if self._graph is None:
            self._capture(inputs)
            if self._graph is None:
                return self.run(inputs)
        for buf, x in zip(self._static_in, inputs):
            buf.copy_(x)
        self._graph.replay()
        return tuple(o.clone() for o in self._static_out)

    def _capture(self, inputs: list[torch.Tensor]) -> None:
        self._static_in = [x.detach().clone().contiguous() for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                self.run(self._static_in)  # warm up: compiles kernels, settles the allocator
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._static_out = self.run(self._static_in)
            self._graph = graph
        except Exception as e:  # noqa: BLE001 - a program that cannot be captured still runs
            warnings.warn(f"dlblas_compiler: CUDA graph capture failed ({type(e).__name__}: {e}); running without", stacklevel=3)
            self.cuda_graphs = False
            self._graph = None

    def kernel_summaries(self) -> list[dict]:
        out = []
        for c in self.choices:
            d = {"name": c.region, "pattern": c.pattern, "impl": c.impl, "config": c.config or {}}
            if c.reason:
                d["reason"] = c.reason
            for k in ("time", "default_time", "reference_time"):
                if getattr(c, k) is not None:
                    d[k] = getattr(c, k)
            d["trials"], d["from_cache"] = c.trials, c.from_cache
            out.append(d)
        return out


class Builder:
    def __init__(self, module: ModuleOp, imported, options):
        self.module, self.imported, self.options = module, imported, options
        self.fn = next(o for o in module.walk() if isinstance(o, func.FuncOp))
        self.slots: dict[SSAValue, int] = {}
        self.interpret = options.backend == "interpret"
        self.reference = DLReference(imported.params, imported.calls)

    def slot(self, v: SSAValue) -> int:
        if v not in self.slots:
            self.slots[v] = len(self.slots)
        return self.slots[v]

    def build(self) -> Program:
        block = self.fn.body.block
        inputs = [self.slot(a) for a in block.args]
        steps: list[Callable] = []
        consts: list = []
        choices: list[KernelChoice] = []
        outputs: list[int] = []
        for op in block.ops:
            if isinstance(op, func.ReturnOp):
                outputs = [self.slot(v) for v in op.operands]
            elif isinstance(op, ConstantOp):
                steps.append(_const_step(self.slot(op.result), op.scalar))
            elif isinstance(op, ParamOp) or (op.results and all(is_constant(r) for r in op.results)):
                for r in op.results:
                    consts.append((self.slot(r), *self._const_eval(r)))
            elif isinstance(op, FusedOp):
                step, choice = self._region(op)
                steps.append(step)
                choices.append(choice)
            elif isinstance(op, TorchCallOp):
                steps.append(self._torch_call(op))
            else:
                steps.append(self._reference(op))
        cuda_graphs = self.options.cuda_graphs and self.options.backend == "triton"
        return Program(inputs, outputs, steps, len(self.slots), consts, choices, cuda_graphs)

    # -- steps ---------------------------------------------------------------------------------------
    def _const_eval(self, v: SSAValue) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
        """A function computing a weight-only value from the live parameters, and those parameters."""
        ops: list[Operation] = []
        params: list[torch.Tensor] = []

        def visit(x: SSAValue):
            op = x.owner
            if op in ops:
                return
            for o in op.operands:
                visit(o)
            ops.append(op)
            if isinstance(op, ParamOp):
                params.append(self.imported.params[op.pname])

        visit(v)
        table = self.imported.params

        def compute() -> torch.Tensor:
            env: dict[SSAValue, Any] = {}
            for op in ops:
                if isinstance(op, ParamOp):
                    env[op.result] = table[op.pname]
                elif isinstance(op, ConstantOp):
                    env[op.result] = op.scalar
                else:
                    out = op.reference(*[env[o] for o in op.operands])
                    for r, val in zip(op.results, out if isinstance(out, tuple) else (out,)):
                        env[r] = val
            out = env[v]
            return out.contiguous() if isinstance(out, torch.Tensor) else out

        return compute, params

    def _reference(self, op: Operation) -> Callable:
        ins = [self.slot(v) for v in op.operands]
        outs = [self.slot(r) for r in op.results]
        ref = op.reference

        def step(env):
            out = ref(*[env[i] for i in ins])
            if len(outs) == 1:
                env[outs[0]] = out
            else:
                for s, val in zip(outs, out):
                    env[s] = val

        return step

    def _torch_call(self, op: TorchCallOp) -> Callable:
        ins = [self.slot(v) for v in op.args]
        outs = [self.slot(r) for r in op.res]
        fn = self.imported.calls.get(op.node.data) or (lambda *a, _f=op.resolve(): _as_tuple(_f(*a)))

        def step(env):
            for s, val in zip(outs, fn(*[env[i] for i in ins])):
                env[s] = val

        return step

    def _region_reference(self, fused: FusedOp) -> Callable[[list], list]:
        ops = region_ops(fused)
        args = list(fused.block.args)
        yielded = list(fused.yielded.values)

        def run(tensors: list) -> list:
            env: dict[SSAValue, Any] = dict(zip(args, tensors))
            for op in ops:
                if isinstance(op, ConstantOp):
                    env[op.result] = op.scalar
                    continue
                out = op.reference(*[env[o] for o in op.operands])
                for r, val in zip(op.results, out if isinstance(out, tuple) else (out,)):
                    env[r] = val
            return [env[v] for v in yielded]

        return run

    def _region(self, fused: FusedOp) -> tuple[Callable, KernelChoice]:
        ins = [self.slot(v) for v in fused.inputs]
        outs = [self.slot(r) for r in fused.outputs]
        name = fused.kernel.data if fused.kernel else fused.pattern.data
        reference = self._region_reference(fused)
        choice = KernelChoice(name, fused.pattern.data, None, None, "reference")
        try:
            lowered = lower_region(fused)
        except LoweringError as e:
            return self._fallback(ins, outs, reference, choice, str(e)), choice
        if isinstance(lowered, CallableLowering):
            choice.impl = "callable"
            fn, attrs = lowered.fn, lowered.attrs

            def call(env):
                res = fn(*[env[i] for i in ins], **attrs)
                for s, val in zip(outs, _as_tuple(res)):
                    env[s] = val

            return call, choice
        kernel = lowered
        choice.kernel = kernel
        if self.options.dump_ir:
            os.makedirs(self.options.dump_ir, exist_ok=True)
            with open(os.path.join(self.options.dump_ir, f"{kernel.name}.py"), "w") as f:
                f.write(kernel.file_text())
        try:
            compiled = kernel.compiled(self.interpret)
        except Exception as e:  # noqa: BLE001
            return self._fallback(ins, outs, reference, choice, f"compile: {type(e).__name__}: {e}"), choice
        choice.config = kernel.space.default()
        choice.impl = "kernel"
        if "profile" in fused.attributes and self.options.tune == "none" and not self.interpret:
            choice.impl, choice.reason = "reference", "a lone GEMM: cuBLAS unless tuning measures otherwise"
        state = {"checked": False}
        strict = self.options.strict
        if self.interpret:
            run_kernel = kernel.launch

            def run(fn, tensors, config):
                with interpreted_stdlib():
                    return run_kernel(fn, tensors, config)

        else:
            run = kernel.launch

        def launch(env):
            tensors = [env[i] for i in ins]
            tensors = [t if t.is_contiguous() else t.contiguous() for t in tensors]
            if choice.impl != "kernel":
                res = reference(tensors)
            elif state["checked"]:
                res = run(compiled, tensors, choice.config)
            else:
                try:
                    res = run(compiled, tensors, choice.config)
                    state["checked"] = True
                except Exception as e:  # noqa: BLE001 - first launch compiles; a failure falls back
                    msg = f"region {name}: kernel launch failed ({type(e).__name__}: {_first_line(e)})"
                    if strict:
                        raise CompileError(msg) from e
                    warnings.warn(f"dlblas_compiler: {msg}; using its reference", stacklevel=2)
                    choice.impl, choice.reason = "reference", msg
                    res = reference(tensors)
            for s, val in zip(outs, res):
                env[s] = val

        self._pending_tune.append((fused, choice, reference, ins))
        return launch, choice

    def _fallback(self, ins, outs, reference, choice: KernelChoice, why: str) -> Callable:
        if self.options.strict:
            raise CompileError(why)
        if not why.startswith("region"):
            why = f"region {choice.region}: {why}"
        warnings.warn(f"dlblas_compiler: {why}; using its reference", stacklevel=4)
        choice.impl, choice.reason = "reference", why

        def step(env):
            for s, val in zip(outs, reference([env[i] for i in ins])):
                env[s] = val

        return step

    _pending_tune: list = []


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else tuple(x) if isinstance(x, list) else (x,)


def _const_step(slot: int, value: float) -> Callable:
    def step(env):
        env[slot] = value

    return step


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__


def build_program(module: ModuleOp, imported, options) -> Program:
    b = Builder(module, imported, options)
    b._pending_tune = []
    program = b.build()
    program.pending_tune = b._pending_tune
    return program
