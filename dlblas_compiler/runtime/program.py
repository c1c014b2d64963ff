"""The Program: a compiled specialization as a flat list of steps over a value table.

Steps are kernel launches (one per `dl.fused` region), torch references (ops left unfused) and torch
calls. Weight-only expressions (concatenated or norm-folded weights) are evaluated once and again
whenever a source parameter is modified in place (its version counter moves) or gets new storage
(`p.data = t`); writes through `p.data` bypass the version counter and are not seen by them. A
region whose kernel fails to lower, compile, tune or launch (at any call) falls back to its reference
with one warning naming the region and the cause (an error under strict=True); a region over empty
tensors runs its reference silently. Tuning runs on the first call, on the real inputs: each kernel's
config is searched, then the kernel is timed against the region's reference (cuBLAS for a lone GEMM),
and both choices are remembered in the persistent cache. On CUDA the whole Program is captured once in a CUDA graph and
replayed while the input signature matches.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from ..codegen.kernel import Kernel, interpreted
from ..codegen.lower import CallableLowering, LoweringError, lower_region, region_ops
from ..dialects import ConstantOp, FusedOp, MoEOp, ParamOp, TorchCallOp
from ..errors import CompileError
from ..numerics import rel_error, tolerance
from ..passes.algebraic import is_constant
from ..tuning import SearchSpace, tune

TOKEN_DIMS = ("M", "rows", "S", "L")


@dataclass
class KernelChoice:
    """What runs a region: its kernel and config, or its reference, and what tuning measured."""

    region: str
    pattern: str
    impl: str = "reference"  # "kernel", "reference" or "callable"
    config: dict | None = None
    reason: str = ""
    time: float | None = None
    default_time: float | None = None
    reference_time: float | None = None
    trials: int = 0
    from_cache: bool = False
    check_error: float | None = None  # check=True: worst relative error against the reference so far
    check_tolerance: float = 0.0
    check_calls: int = 0


def _run_ops(ops: list[Operation], env: dict[SSAValue, Any]) -> None:
    """Execute ops by their torch references (constants as Python scalars)."""
    for op in ops:
        if isinstance(op, ConstantOp):
            env[op.result] = op.scalar
            continue
        out = op.reference(*[env[o] for o in op.operands])
        for r, val in zip(op.results, out if isinstance(out, tuple) else (out,)):
            env[r] = val


@dataclass
class RegionStep:
    """One `dl.fused` region: its kernel launch (or user callable), or its reference.

    A failure of the kernel or callable, at any call, switches the region to its reference with one
    warning (a CompileError under strict=True). With `checks` calls left to check (-1: every call),
    the reference also runs after the kernel and the worst relative error is kept in the choice.
    """

    choice: KernelChoice
    ins: list[int]
    outs: list[int]
    reference: Callable[[list], list]
    kernel: Kernel | None = None
    compiled: Callable | None = None
    interpret: bool = False
    strict: bool = False
    callable_fn: Callable | None = None
    checks: int = 0
    prefer_kernel: bool = False  # keep the kernel even where the reference measures faster (library ops)

    def launch(self, tensors: list, config: dict) -> list:
        if self.interpret:
            with interpreted():
                return self.kernel.launch(self.compiled, tensors, config)
        return self.kernel.launch(self.compiled, tensors, config)

    def fall_back(self, why: str, cause: BaseException | None = None) -> None:
        """Run the reference from now on, with one warning naming the region and the cause (strict: raise)."""
        if self.strict:
            raise CompileError(why) from cause
        warnings.warn(f"dlblas_compiler: {why}; using its reference", stacklevel=4)
        self.choice.impl, self.choice.reason = "reference", why

    def inputs(self, env: list) -> list:
        """The region's input values, made contiguous: kernels index their inputs as dense row-major tensors."""
        return [t if not isinstance(t, torch.Tensor) or t.is_contiguous() else t.contiguous() for t in (env[i] for i in self.ins)]

    def __call__(self, env: list) -> None:
        impl = self.choice.impl
        if impl == "reference":  # torch ops take any strides: no copies (SDPA's output, say, is transposed)
            res = self.reference([env[i] for i in self.ins])
        else:
            tensors = self.inputs(env)
            try:
                if impl == "callable":
                    res = _as_tuple(self.callable_fn(*tensors))
                else:
                    res = self.launch(tensors, self.choice.config)
            except Exception as e:  # noqa: BLE001 - a failing kernel (or user callable) falls back
                config = self.choice.config
                what = "the pattern's callable" if impl == "callable" else f"kernel launch with config {config}"
                self.fall_back(f"region {self.choice.region}: {what} failed ({type(e).__name__}: {_first_line(e)})", e)
                res = self.reference(tensors)
            else:
                if self.checks:
                    self._check(tensors, res)
        for s, val in zip(self.outs, res):
            env[s] = val

    def _check(self, tensors: list, res: list) -> None:
        """Compare the outputs with the region's reference on these inputs; warn once above tolerance."""
        if self.checks > 0:
            self.checks -= 1
        c = self.choice
        with torch.no_grad():
            ref = self.reference(tensors)
        worst, tol = 0.0, 0.0
        for o, r in zip(res, ref):
            if isinstance(r, torch.Tensor) and r.is_floating_point():
                err = rel_error(o, r)
                if err >= worst:
                    worst, tol = err, tolerance(r.dtype)
        warned = c.check_error is not None and c.check_error > c.check_tolerance
        c.check_error = max(worst, c.check_error or 0.0)
        c.check_tolerance, c.check_calls = tol, c.check_calls + 1
        if worst > tol and not warned:
            warnings.warn(f"dlblas_compiler: region {c.region}: relative error {worst:.3g} against its reference "
                          f"exceeds the tolerance {tol:g} (check=True)", stacklevel=4)  # fmt: skip

    def tune(self, tensors: list, mode: str, progress: bool) -> None:
        """Search the kernel's config, then keep the kernel only if it beats the region's reference.
        Any failure of the search falls back to the reference (strict: raises)."""
        try:
            self._tune(tensors, mode, progress)
        except Exception as e:  # noqa: BLE001
            self.fall_back(f"region {self.choice.region}: tuning failed ({type(e).__name__}: {_first_line(e)})", e)

    def _tune(self, tensors: list, mode: str, progress: bool) -> None:
        k, c = self.kernel, self.choice
        dev, dtypes = tensors[0].device, [t.dtype for t in tensors]
        ref_out: list = []

        def ref() -> list:  # the tuner asks for it only on a cache miss
            if not ref_out:
                with torch.no_grad():
                    ref_out.extend(self.reference(tensors))
            return ref_out

        kind, key = k.tuning_key
        out = tune(kind, key, k.space, lambda cfg: (lambda: self.launch(tensors, cfg)), k.shape_key, dtypes,
                   dev, ref, mode=mode, token_dims=TOKEN_DIMS, progress=progress)  # fmt: skip
        c.config, c.time, c.default_time, c.trials, c.from_cache = out.config, out.time, out.default_time, out.trials, out.from_cache
        if self.prefer_kernel:
            return
        impls = SearchSpace({"impl": ["kernel", "reference"]}, default={"impl": "kernel"})
        run = {"kernel": lambda: self.launch(tensors, c.config), "reference": lambda: self.reference(tensors)}
        pick = tune(f"{kind}:impl", key, impls, lambda cfg: run[cfg["impl"]], k.shape_key, dtypes, dev, ref,
                    policy="grid", budget=2, mode=mode, token_dims=TOKEN_DIMS, progress=False)  # fmt: skip
        c.impl = pick.config["impl"]
        c.reference_time = pick.time if c.impl == "reference" else None
        if c.impl == "reference":
            c.reason = "the reference (torch / cuBLAS) measured faster"


@dataclass
class Program:
    inputs: list[int]
    outputs: list[int]
    steps: list[Callable[[list], None]]
    nslots: int
    consts: list[tuple[int, Callable[[], torch.Tensor], list[torch.Tensor]]]
    choices: list[KernelChoice] = field(default_factory=list)
    cuda_graphs: bool = False
    tune_mode: str = "none"
    tuned: bool = False
    graph_note: str = ""
    _const_versions: list[tuple] | None = None
    _const_values: list[torch.Tensor] | None = None
    _graph: Any = None
    _static_in: list[torch.Tensor] | None = None
    _static_out: tuple | None = None

    def _refresh_consts(self) -> list[torch.Tensor]:
        # an in-place update bumps a tensor's version; `p.data = t` gives it new storage
        versions = [tuple((_version(t), t.data_ptr()) for t in srcs) for _, _, srcs in self.consts]
        if self._const_values is None or versions != self._const_versions:
            with torch.no_grad():
                self._const_values = [fn() for _, fn, _ in self.consts]
            self._const_versions = versions
            self._graph = None  # a capture holds the old buffers
        return self._const_values

    def _env(self, inputs: list) -> list:
        env: list[Any] = [None] * self.nslots
        for (slot, _, _), value in zip(self.consts, self._refresh_consts()):
            env[slot] = value
        for slot, x in zip(self.inputs, inputs):
            env[slot] = x.contiguous() if isinstance(x, torch.Tensor) and not x.is_contiguous() else x
        return env

    def run(self, inputs: list) -> tuple:
        env = self._env(inputs)
        if not self.tuned and self.tune_mode != "none":
            self.tuned = True
            for step in self.steps:
                if isinstance(step, RegionStep) and step.kernel is not None and step.choice.impl == "kernel":
                    step.tune(step.inputs(env), self.tune_mode, progress=True)
                step(env)
            return tuple(env[s] for s in self.outputs)
        for step in self.steps:
            step(env)
        return tuple(env[s] for s in self.outputs)

    def __call__(self, inputs: list) -> tuple:
        if not self.cuda_graphs or (torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in inputs)):
            return self.run(inputs)
        self._refresh_consts()
        if self._graph is None:
            self._capture(inputs)
            if self._graph is None:
                return self.run(inputs)
            if not self._graph_pays(inputs):
                self.cuda_graphs, self._graph = False, None
                return self.run(inputs)
        return self._replay(inputs)

    def _replay(self, inputs: list) -> tuple:
        for buf, x in zip(self._static_in, inputs):
            buf.copy_(x)
        self._graph.replay()
        return tuple(o.clone() for o in self._static_out)

    def _graph_pays(self, inputs: list) -> bool:
        """A replay saves launch overhead and costs copying the inputs in and cloning the outputs. Where the
        direct calls are GPU-bound (enqueueing them takes under half their time) there is no overhead to
        save, so the graph goes. Otherwise both are timed, alternating (5 rounds of 3 calls, the best round
        of each: the first direct calls after a capture pay allocator growth), and the faster stays."""

        def seconds(fn) -> tuple[float, float]:  # (enqueue, enqueue + wait for the GPU) per call
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            return (t1 - t0) / 3, (time.perf_counter() - t0) / 3

        direct_fn, replay_fn = (lambda: self.run(inputs)), (lambda: self._replay(inputs))
        direct_fn(), replay_fn()
        rounds = [(seconds(direct_fn), seconds(replay_fn)) for _ in range(5)]
        enqueue, direct = min((r[0] for r in rounds), key=lambda t: t[1])  # the fastest direct round
        replay = min(r[1][1] for r in rounds)
        self.graph_note = (f"CUDA graph replay {replay * 1e6:.0f} µs vs direct launches {direct * 1e6:.0f} µs per call "
                           f"({enqueue * 1e6:.0f} µs of it enqueueing)")  # fmt: skip
        return enqueue >= 0.5 * direct and replay < direct

    def _capture(self, inputs: list) -> None:
        self._static_in = [x.detach().clone().contiguous() for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                self.run(self._static_in)  # warm up: tunes and compiles kernels, settles the allocator
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
            for k in ("reason", "time", "default_time", "reference_time"):
                if getattr(c, k):
                    d[k] = getattr(c, k)
            d["trials"], d["from_cache"] = c.trials, c.from_cache
            if c.check_calls:
                d.update(check_error=c.check_error, check_calls=c.check_calls, check_tolerance=c.check_tolerance)
            out.append(d)
        return out


class Builder:
    """Turns a lowered module into a Program."""

    def __init__(self, module: ModuleOp, imported, options):
        self.imported, self.options = imported, options
        self.fn = next(o for o in module.walk() if isinstance(o, func.FuncOp))
        self.slots: dict[SSAValue, int] = {}
        self.interpret = options.backend == "interpret"

    def slot(self, v: SSAValue) -> int:
        return self.slots.setdefault(v, len(self.slots))

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
                consts.extend((self.slot(r), *self._const_eval(r)) for r in op.results)
            elif isinstance(op, FusedOp):
                step = self._region(op)
                steps.append(step)
                choices.append(step.choice)
            elif isinstance(op, TorchCallOp):
                steps.append(self._torch_call(op))
            elif isinstance(op, MoEOp) and (self.options.backend != "reference" or self.options.expert_parallel is not None):
                steps.append(self._moe(op))
            else:
                steps.append(self._reference(op))
        tune_mode = self.options.tune if self.options.backend == "triton" else "none"
        cuda_graphs = self.options.cuda_graphs and self.options.backend == "triton" and not self.options.check
        if self.options.expert_parallel is not None and any(isinstance(o, MoEOp) for o in block.ops):
            cuda_graphs = False  # the all-to-all exchanges token counts through the host
        return Program(inputs, outputs, steps, len(self.slots), consts, choices, cuda_graphs, tune_mode)

    def _const_eval(self, v: SSAValue) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
        """A function computing a weight-only value from the live parameters, and those parameters."""
        ops: list[Operation] = []

        def visit(x: SSAValue):
            if x.owner not in ops:
                for o in x.owner.operands:
                    visit(o)
                ops.append(x.owner)

        visit(v)
        table = self.imported.params
        params = [table[o.pname] for o in ops if isinstance(o, ParamOp)]

        def compute() -> torch.Tensor:
            env: dict[SSAValue, Any] = {o.result: table[o.pname] for o in ops if isinstance(o, ParamOp)}
            _run_ops([o for o in ops if not isinstance(o, ParamOp)], env)
            out = env[v]
            return out.contiguous() if isinstance(out, torch.Tensor) else out

        return compute, params

    def _reference(self, op: Operation) -> Callable:
        ins = [self.slot(v) for v in op.operands]
        outs = [self.slot(r) for r in op.results]
        ref = op.reference

        def step(env):
            for s, val in zip(outs, _as_tuple(ref(*[env[i] for i in ins]))):
                env[s] = val

        return step

    def _moe(self, op: MoEOp) -> Callable:
        """dl.moe on the library: topk_gating + fused_moe on this device; with an `expert_parallel` group, the
        EPMoE layer over it (torch experts on the reference backend), built on the first call from that call's
        weights and rebuilt when they change. Without a group it never communicates, even where
        torch.distributed is initialized (EPMoE would take the default group)."""
        from ..kernels.gating import topk_gating
        from ..kernels.moe import fused_moe
        from ..layers import EPMoE
        from ..layers.ep_moe import router_logits

        ins = [self.slot(v) for v in op.operands]
        out = self.slot(op.result)
        top_k, renormalize = op.attrs
        group = self.options.expert_parallel
        backend = "reference" if self.options.backend == "reference" else "triton"
        layer: list = []  # [(weights, EPMoE)]

        def local(env):
            x, router_w, w_gate_up, w_down = (env[i] for i in ins)
            ids, weights, _ = topk_gating(router_logits(x, router_w), top_k, renormalize=renormalize)
            env[out] = fused_moe(x, w_gate_up, w_down, ids, weights)

        def parallel(env):
            x, *weights = (env[i] for i in ins)
            if not layer or any(a is not b for a, b in zip(layer[0][0], weights)):
                layer[:] = [(weights, EPMoE(*weights, top_k, renormalize=renormalize, group=group, backend=backend))]
            env[out] = layer[0][1](x)

        return local if group is None else parallel

    def _torch_call(self, op: TorchCallOp) -> Callable:
        ins = [self.slot(v) for v in op.args]
        outs = [self.slot(r) for r in op.res]
        fn = self.imported.calls.get(op.node.data) or (lambda *a, _f=op.resolve(): _as_tuple(_f(*a)))

        def step(env):
            for s, val in zip(outs, fn(*[env[i] for i in ins])):
                env[s] = val

        return step

    def _region(self, fused: FusedOp) -> RegionStep:
        ins = [self.slot(v) for v in fused.inputs]
        outs = [self.slot(r) for r in fused.outputs]
        name = fused.kernel.data if fused.kernel else fused.pattern.data
        ops, args, yielded = region_ops(fused), list(fused.block.args), list(fused.yielded.values)

        def reference(tensors: list) -> list:
            env: dict[SSAValue, Any] = dict(zip(args, tensors))
            _run_ops(ops, env)
            return [env[v] for v in yielded]

        check = self.options.check
        step = RegionStep(KernelChoice(name, fused.pattern.data), ins, outs, reference, interpret=self.interpret,
                          strict=self.options.strict, checks=-1 if check is True else int(check),
                          prefer_kernel=self.options.prefer_kernels)  # fmt: skip
        if any(0 in v.type.get_shape() for v in [*fused.inputs, *fused.outputs]):
            step.choice.reason = "empty tensors: nothing to compute"
            return step
        try:
            lowered = lower_region(fused)
            if not isinstance(lowered, CallableLowering):
                config = lowered.space.default()
        except LoweringError as e:
            step.fall_back(str(e), e)
            return step
        except Exception as e:  # noqa: BLE001 - a template bug must not break the model
            step.fall_back(f"region {name}: lowering failed ({type(e).__name__}: {_first_line(e)})", e)
            return step
        if isinstance(lowered, CallableLowering):
            step.choice.impl = "callable"
            step.callable_fn = lowered
            return step
        step.kernel = lowered
        if self.options.dump_ir:
            os.makedirs(self.options.dump_ir, exist_ok=True)
            with open(os.path.join(self.options.dump_ir, f"{lowered.name}.py"), "w") as f:
                f.write(lowered.file_text())
        try:
            step.compiled = lowered.compiled(self.interpret)
        except Exception as e:  # noqa: BLE001
            step.fall_back(f"region {name}: kernel source does not compile ({type(e).__name__}: {_first_line(e)})", e)
            return step
        step.choice.impl, step.choice.config = "kernel", config
        if "profile" in fused.attributes and self.options.tune == "none" and not self.interpret and not step.prefer_kernel:
            step.choice.impl = "reference"
            step.choice.reason = "a lone GEMM runs on cuBLAS unless tuning measures the kernel faster"
        return step


def _version(t: torch.Tensor) -> int:
    """The version counter; inference tensors (made under torch.inference_mode) keep none: an in-place update
    of one is not seen, like a write through `.data`."""
    return -1 if t.is_inference() else t._version


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
    return Builder(module, imported, options).build()
