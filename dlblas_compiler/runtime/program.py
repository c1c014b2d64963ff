"""The Program: a compiled specialization as a flat list of typed steps over a value table.

`build_program(module, lowered, imported, options)` turns the final IR and its lowered regions into steps
(`runtime.steps`): kernel launches (one per `dl.fused` region), torch references (ops left unfused), torch
calls, and registered op implementations (`runtime.ops`). Weight-only values are `DerivedWeights`
(`runtime.weights`). On the first call, with tuning on, each kernel's config is searched and the kernel timed
against its region's reference (`runtime.selection`), and where near-ties remain they are decided in the
program's own CUDA graph (`runtime.in_context`); on CUDA the program is then captured as one CUDA graph
and replayed while the input signature matches, where that pays (`runtime.graphs`). A region whose kernel fails
to lower, compile, tune or launch (at any call) falls back to its reference with one warning naming the region
and the cause (an error under strict=True); a region over empty tensors runs its reference silently.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue

from ..codegen.device import has_pdl
from ..codegen.kernel import Kernel
from ..dialects import CatOp, ConstantOp, FusedOp, IndexCopyOp, ParamOp, TorchCallOp
from ..dialects.aliasing import overwritable, reaches_output
from ..errors import DeviceFault, is_device_fault
from ..fusion.templates import CallLowering, KernelLowering, Lowered, ReferenceLowering
from ..passes.algebraic import is_constant
from .graphs import IN_PLACE_BYTES, CudaGraph, input_key
from .inplace import InPlaceIndexCopy, WriteInput, batched, deferrable, inplace_updates, input_writes, region_writes
from .ops import OP_STEPS, op_step
from . import in_context
from .selection import Together
from .stacked import stacked
from .steps import ConstantStep, KernelChoice, ReferenceStep, RegionStep, TorchStep, as_tuple, first_line
from .weights import DerivedWeight, DerivedWeights, derived_weight

log = logging.getLogger("dlblas_compiler.runtime")


def _log_choices(choices: list[KernelChoice]) -> None:
    """After the first run: what runs the regions (INFO: counted; DEBUG: each). Fallbacks log themselves
    (`RegionStep.fall_back`)."""
    if not choices or not log.isEnabledFor(logging.INFO):
        return
    impls = Counter(c.impl for c in choices)
    log.info("what runs the regions: %s", ", ".join(f"{impl} {n}" for impl, n in impls.items()))
    for c in choices:
        if c.impl == "kernel":
            timing = f", {c.time * 1e6:.1f} µs{' (from the cache)' if c.from_cache else ''}" if c.time else ""
            log.debug("region %s runs its kernel with %s%s", c.region, c.config, timing)
        else:
            log.debug("region %s runs its %s: %s", c.region, c.impl, c.reason or "-")


def run_ops(ops: list[Operation], env: dict[SSAValue, Any], in_place: frozenset[SSAValue] = frozenset()) -> None:
    """Execute ops by their torch references (constants as Python scalars); an index_copy into one of `in_place`
    writes that tensor itself (`index_copy_`)."""
    for op in ops:
        if isinstance(op, ConstantOp):
            env[op.result] = op.scalar
            continue
        if isinstance(op, IndexCopyOp) and op.dest in in_place:
            env[op.result] = env[op.dest].index_copy_(op.axis, env[op.index], env[op.source])
            continue
        out = op.reference(*[env[o] for o in op.operands])
        for r, val in zip(op.results, out if isinstance(out, tuple) else (out,)):
            env[r] = val


@dataclass
class Program:
    inputs: list[int]
    outputs: list[int]
    steps: list[Callable[[list], None]]
    nslots: int
    weights: DerivedWeights = field(default_factory=DerivedWeights)
    choices: list[KernelChoice] = field(default_factory=list)
    cuda_graphs: bool = False
    tune_mode: str = "none"
    tuned: bool = False
    graph: CudaGraph | None = None  # the graph captured for the static inputs' current addresses
    graph_note: str = ""
    graphs_pay: bool | None = None  # the keep-or-drop decision, measured once
    static_inputs: tuple[int, ...] = ()  # inputs written in place (a KV cache): a graph captures them at their address
    addresses: tuple = ()  # of the static inputs at the last call
    repeats: int = 0  # consecutive calls with those addresses
    last: list = field(default_factory=list)  # before a capture: the last call's inputs' addresses and layouts
    copy_inputs: bool = False  # an input a capture read where it was moved: captures copy every input
    handout: bool = True  # replays hand out the graph's output buffers, until the caller keeps one (`CudaGraph`)
    frees: list[tuple[int, ...]] = field(default_factory=list)  # per step: the slots no later step reads
    moves: tuple[tuple[int, torch.device], ...] = ()  # (input, device): host inputs the program only moves there
    logged: bool = False  # the first run's choices are logged
    recipe: Recipe | None = field(default=None, repr=False)  # how it was built (`rebuild_program`)

    def __repr__(self) -> str:
        steps = self.plan[0]
        lines = [f"Program({len(steps)} steps, inputs {self.inputs} -> outputs {self.outputs})"]
        lines += [f"  slot {slot}: {w!r}" for slot, w in self.weights.weights] + [f"  {s!r}" for s in steps]
        return "\n".join(lines)

    def _runs_modules(self) -> bool:
        """Whether a step runs an nn.Module opaquely (its parameters read live, not as derived weights' sources)."""
        return any(isinstance(getattr(getattr(s.fn, "func", s.fn), "target", None), torch.nn.Module)
                   for s in self.steps if isinstance(s, TorchStep))  # fmt: skip

    @functools.cached_property
    def plan(self) -> tuple[list, list[tuple[int, ...]]]:
        """The steps in the order they run, each with the slots to drop after it: `steps` (one per op, as built),
        with the elementwise calls alike over inputs and constants run first as one (`stacked`: each layer's cache
        positions) and the in-place calls alike that only the outputs read run last as one (`inplace.batched`)."""
        return batched(*stacked(self.steps, self.frees or [()] * len(self.steps), self.inputs, self.outputs))

    def _env(self, inputs: list) -> list:
        env: list[Any] = [None] * self.nslots
        if self.weights.fill(env):
            self.graph = None  # a capture holds the old buffers
        for slot, x in zip(self.inputs, inputs):
            env[slot] = x.contiguous() if isinstance(x, torch.Tensor) and not x.is_contiguous() else x
        return env

    def run(self, inputs: list) -> tuple:
        """Run every step directly, dropping each intermediate value after the last step that reads it (its memory
        goes once no view of it is alive). The first call with tuning on runs the regions it must tune by their
        references and then tunes them together (`selection.Together`)."""
        env = self._env(inputs)
        tuning = not self.tuned and self.tune_mode != "none"
        self.tuned = self.tuned or tuning
        together = Together(self.tune_mode, self._written(inputs)) if tuning else None
        try:
            for step, free in zip(*self.plan):
                if (together is not None and isinstance(step, RegionStep) and step.kernel is not None
                        and step.choice.impl == "kernel" and together.defer(step, step.inputs(env))):  # fmt: skip
                    step.by_reference(env)  # (this call; its kernel is tuned with the others after it)
                else:
                    step(env)
                for slot in free:
                    env[slot] = None
            if together is not None:
                together.tune()
                if self.cuda_graphs and in_context.ENABLED:
                    self._decide_in_context(inputs, together)
        except BaseException:
            if tuning:  # (interrupted, say: regions left without a config; the next call tunes what is not cached)
                self.tuned = False
            raise
        if not self.logged:
            self.logged = True
            _log_choices(self.choices)
        return tuple(env[s] for s in self.outputs)

    def _decide_in_context(self, inputs: list, together: Together) -> None:
        """The near-ties left by tuning, decided in this program's CUDA graph (`in_context`); a failure keeps the
        choices made alone, with a warning."""
        logged, self.logged = self.logged, True  # (its runs log nothing: the choices are logged once decided)
        try:
            in_context.decide(self, inputs, list(together.groups.values()))
        except Exception as e:  # noqa: BLE001 - an optimisation: the choices made alone stand
            if is_device_fault(e):
                raise DeviceFault(f"deciding near-tied kernels in the program's CUDA graph faulted the GPU "
                                  f"({type(e).__name__}: {first_line(e)}); restart the process") from e  # fmt: skip
            log.warning("deciding near-tied kernels in the program's CUDA graph failed (%s: %s); keeping the choices "
                        "measured alone", type(e).__name__, first_line(e))  # fmt: skip
        finally:
            self.logged = logged

    def _written(self, inputs: list) -> set[int]:
        """The storages of the inputs the program writes in place."""
        return {inputs[i].untyped_storage().data_ptr() for i in self.static_inputs if isinstance(inputs[i], torch.Tensor)}

    def __call__(self, inputs: list) -> tuple:
        """Run, through a CUDA graph from the second consecutive call with the in-place written inputs (a KV
        cache) at the same addresses (the compiled module resets `repeats` when another of its specializations ran
        in between): a signature seen once (a growing length) is never captured, nor one called once per
        generate() (the dynamic cache's lengths), the decode steps are, and so is the prefill of a prompt length
        seen again (HF's static cache is made inside it: it writes no input in place). Host inputs the program
        only moves to the GPU are moved first."""
        if self.moves:  # (before anything is queued: a copy from pageable host memory waits for the GPU)
            inputs = _moved(inputs, self.moves)
        if not self.cuda_graphs:
            return self.run(inputs)
        addresses = tuple(inputs[i].data_ptr() for i in self.static_inputs)
        self.repeats = self.repeats + 1 if addresses == self.addresses else 1
        self.addresses = addresses
        if self.repeats < 2:
            self.last = [input_key(x) for x in inputs] if self.graph is None else []
            return self.run(inputs)
        if self.weights.changed():
            self.graph = None  # a capture holds the old weights' buffers
        if self.graph is not None and not self.graph.matches(addresses, inputs):
            # a new cache (another generate() call): captured again at its address; an input read where it was
            # has moved: captured again, copying the inputs from now on
            self.copy_inputs = self.copy_inputs or addresses == self.graph.addresses
            self.graph = None
        if self.graph is not None and self.graph.held():
            self.handout = False  # the caller kept an output: its buffer is the caller's now, later replays clone
            self.graph = None
        if self.graph is None:
            in_place = () if self.copy_inputs else self._in_place(inputs)
            graph = CudaGraph(self.run, self.static_inputs, in_place=in_place, handout=self.handout,
                              checked=not self._runs_modules())
            keep = graph.capture(inputs)
            if keep and self.graphs_pay is None:
                self.graphs_pay = graph.pays(inputs)
                self.graph_note = graph.note
                log.info("CUDA graph %s: %s", "kept" if self.graphs_pay else "dropped", graph.note)
            if not keep or not self.graphs_pay:
                self.cuda_graphs = False
                return self.run(inputs)
            self.graph = graph
        return self.graph.replay(inputs)

    def _in_place(self, inputs: list) -> tuple[int, ...]:
        """The large inputs not written in place that this call and the one before passed at one address and layout:
        a capture reads them where they are (`CudaGraph`)."""
        return tuple(i for i, x in enumerate(inputs)
                     if i not in self.static_inputs and isinstance(x, torch.Tensor) and x.is_contiguous()
                     and x.numel() * x.element_size() >= IN_PLACE_BYTES and i < len(self.last)
                     and self.last[i] == input_key(x))  # fmt: skip

    def inherit(self, choices: dict[str, KernelChoice]) -> None:
        """Take another program's choices for the regions they name (a shape family's instance: the first compile
        was tuned for the same buckets); with every kernel region covered, this program does not tune."""
        steps = [s for s in self.steps if isinstance(s, RegionStep) and s.kernel is not None and s.choice.impl == "kernel"]
        if not choices or any(s.choice.region not in choices for s in steps):
            return
        for s in steps:
            c = choices[s.choice.region]
            for f in ("impl", "config", "reason", "time", "default_time", "reference_time", "trials"):
                setattr(s.choice, f, getattr(c, f))
            s.choice.from_cache = True
        self.tuned = True

    def release(self) -> None:
        """Drop the CUDA graph (and the memory its capture holds) now, not when the garbage collector finds the
        cycle between this program and its capture: an evicted specialization's memory goes at once."""
        self.graph = None

    def kernel_choices(self) -> list[KernelChoice]:
        return list(self.choices)


class Builder:
    """Turns a lowered module into a Program."""

    def __init__(self, module: ModuleOp, lowered: dict[FusedOp, Lowered], imported, options):
        self.lowered, self.imported, self.options = lowered, imported, options
        self.fn = next(o for o in module.walk() if isinstance(o, func.FuncOp))
        self.slots: dict[SSAValue, int] = {}
        self.interpret = options.backend == "interpret"

    def slot(self, v: SSAValue) -> int:
        return self.slots.setdefault(v, len(self.slots))

    def build(self) -> Program:
        block = self.fn.body.block
        inputs = [self.slot(a) for a in block.args]  # (slots 0, 1, ...: `_writes` relies on it)
        self.inplace = inplace_updates(self.fn, self.imported) if self.options.backend != "reference" else {}
        self.overwritable = overwritable(self.fn) if self.options.backend != "reference" else {}
        steps: list[Callable] = []
        reads: list[list[SSAValue]] = []  # per step, the values it reads and makes (to drop them after their last read)
        weights = DerivedWeights()
        outputs: list[int] = []
        made: dict[Operation, int | list[int]] = {}  # op -> the index of its step, or of its derived weights
        for op in block.ops:
            if isinstance(op, func.ReturnOp):
                outputs = [self.slot(v) for v in op.operands]
                continue
            step = self.step(op)
            if isinstance(step, list):
                made[op] = list(range(len(weights.weights), len(weights.weights) + len(step)))
                weights.weights.extend(step)
            else:
                made[op] = len(steps)
                steps.append(step)
                reads.append([*op.operands, *op.results])
        writes = input_writes(self.fn, self.imported, self.inplace) if self.options.backend != "reference" else []
        steps += [WriteInput(inputs[arg], self.slot(value)) for arg, value in writes]
        reads += [[value] for _, value in writes]  # (a value nothing reads goes after the step that makes it)
        kept = {*inputs, *outputs, *(slot for slot, _ in weights.weights)}
        frees = _frees([[self.slot(v) for v in r] for r in reads], kept)
        opts = self.options
        tune_mode = opts.tune if opts.backend == "triton" else "none"
        cuda_graphs = opts.cuda_graphs and opts.backend == "triton" and not opts.check
        if (opts.expert_parallel is not None and opts.expert_parallel_tokens is None
                and any(op.name == "dl.moe" for op in block.ops)):  # fmt: skip
            cuda_graphs = False  # the all-to-all exchanges token counts through the host (not the peer exchange)
        choices = [st.choice for st in steps if isinstance(st, RegionStep)]
        program = Program(inputs, outputs, steps, len(self.slots), weights, choices, cuda_graphs, tune_mode,
                          static_inputs=tuple(sorted({*(a for args in self.inplace.values() for a in args),
                                                      *(arg for arg, _ in writes)})),
                          frees=frees, moves=self._moves())  # fmt: skip
        program.recipe = Recipe(self, made)
        return program

    def step(self, op: Operation) -> Callable | list[tuple[int, DerivedWeight]]:
        """The step that runs `op`, or (for a parameter or a value computed from parameters alone) its derived
        weights."""
        if isinstance(op, ConstantOp):
            return ConstantStep(self.slot(op.result), op.scalar)
        if isinstance(op, ParamOp) or (op.results and all(is_constant(r) for r in op.results)):
            return [(self.slot(r), self._derived(r)) for r in op.results]
        if isinstance(op, FusedOp):
            return self._region(op)
        if isinstance(op, TorchCallOp):
            return self._torch_call(op)
        if op in self.inplace:
            return InPlaceIndexCopy(self.slot(op.dest), op.axis, self.slot(op.index), self.slot(op.source), self.slot(op.result))
        ins, outs = [self.slot(v) for v in op.operands], [self.slot(r) for r in op.results]
        registered = op_step(op, ins, outs, self.options) if self.options.backend != "reference" or (
            self.options.expert_parallel is not None
        ) else None  # fmt: skip
        return registered or ReferenceStep(op.name, op.reference, ins, outs)

    def share_key(self, op: Operation) -> tuple | None:
        """What must match for the step of another op equal to `op` up to the values it reads to run `op` on its
        own values (`rebound`); None: `op`'s step is built from `op` (its derived weights or torch call are its
        own, or its registered step is opaque)."""
        if isinstance(op, (ParamOp, TorchCallOp)) or (op.results and all(is_constant(r) for r in op.results)):
            return None
        if isinstance(op, FusedOp):
            return ("region",)
        if isinstance(op, ConstantOp):
            return ("constant",)
        if op in self.inplace:
            return ("in place",)
        if type(op) in OP_STEPS and (self.options.backend != "reference" or self.options.expert_parallel is not None):
            return None
        return ("reference",)

    @staticmethod
    def retypes(op: Operation) -> bool:
        """Whether `op`'s step ignores its types, so that a shape family's instance need not copy it: a torch call
        runs its function on the values it reads (`_torch_call`), at any sizes."""
        return isinstance(op, TorchCallOp)

    def rebound(self, step: Callable, op: Operation) -> Callable:
        """`step`, built for an op of `op`'s class (`share_key`), running on `op`'s values."""
        ins, outs = [self.slots[v] for v in op.operands], [self.slots[r] for r in op.results]
        if isinstance(step, RegionStep):
            new = _shallow(step)
            new.ins, new.outs, new.choice = ins, outs, _shallow(step.choice)
            new.choice.region = op.label
            new.writes = self._writes(op, step.kernel)
            return new
        if isinstance(step, ReferenceStep):
            return ReferenceStep(step.op, step.fn, ins, outs)
        if isinstance(step, ConstantStep):
            return ConstantStep(outs[0], step.value)
        assert isinstance(step, InPlaceIndexCopy) and op in self.inplace, step
        return InPlaceIndexCopy(self.slots[op.dest], step.dim, self.slots[op.index], self.slots[op.source], self.slots[op.result])

    def _writes(self, fused: FusedOp, kernel: Kernel | None) -> tuple[tuple[int, bool], ...]:
        """The region inputs its kernel may write, each with whether it may write that tensor itself: those it writes
        at indexed positions (a KV cache: `inplace_updates` found nothing reading the caller's tensor's old value
        afterwards), then those its kernel writes over (`Kernel.overwrites`: a residual cuBLAS adds into, of the fuse
        pass's `FusedOp.overwritable_inputs`), checked again on this function (`overwritable`; where a later pass
        changed who reads them, the kernel writes a copy)."""
        found = self.inplace.get(fused, ())
        # (function argument j has slot j, `build`; a shape family's instance reads it through a stand-in of
        # another block, `rebuild_program`, given the same slot)
        writes = [(i, isinstance(v := fused.inputs[i], BlockArgument) and self.slots.get(v) in found)
                  for i, _ in region_writes(fused)]  # fmt: skip
        verified = self.overwritable.get(fused, ())
        return (*writes, *((i, i in verified) for i in (kernel.overwrites if kernel is not None else ())))

    def _moves(self) -> tuple[tuple[int, torch.device], ...]:
        positions = self.imported.arg_positions
        return tuple((positions.index(i), dev) for i, dev in self.imported.device_moves.items())

    def _derived(self, v: SSAValue) -> DerivedWeight:
        """A weight-only value computed from the live parameters (shared with the module's other programs that
        compute the same expression of the same parameters)."""
        ops: list[Operation] = []

        def visit(x: SSAValue):
            if x.owner not in ops:
                for o in x.owner.operands:
                    visit(o)
                ops.append(x.owner)

        visit(v)
        table = self.imported.params
        params = [table[o.pname] for o in ops if isinstance(o, ParamOp)]

        devices = self.imported.param_devices

        def param(name: str) -> torch.Tensor:  # (a 0-d host tensor read on a device: a copy there)
            return table[name].to(devices[name]) if name in devices else table[name]

        def compute() -> torch.Tensor:
            env: dict[SSAValue, Any] = {o.result: param(o.pname) for o in ops if isinstance(o, ParamOp)}
            run_ops([o for o in ops if not isinstance(o, ParamOp)], env)
            out = env[v]
            return out.contiguous() if isinstance(out, torch.Tensor) else out

        index = {o: i for i, o in enumerate(ops)}
        key = tuple(
            ("param", o.pname, id(table[o.pname])) if isinstance(o, ParamOp)
            else (o.name, str(o.properties), tuple((index[x.owner], x.index) for x in o.operands),
                  tuple(str(r.type) for r in o.results))  # (a shape family's instances differ in their types only)
            for o in ops
        ) + ((v.index,),)  # fmt: skip
        cat = v.owner if isinstance(v.owner, CatOp) and v.owner.axis == 0 else None
        parts = [table[x.owner.pname] for x in cat.inputs] if cat and all(isinstance(x.owner, ParamOp) for x in cat.inputs) else []
        if not self.options.share_weights:  # (the parameters stay where they are: the buffer is a copy)
            parts = []
        return derived_weight(key, compute, params, parts)

    def _torch_call(self, op: TorchCallOp) -> TorchStep:
        fn = self.imported.calls.get(op.node.data)
        if fn is not None and op in self.inplace:  # (an in-place method on an input: no copy of it first)
            fn = functools.partial(fn, _in_place=True)
        fn = fn or (lambda *a, _f=op.resolve(): as_tuple(_f(*a)))
        # an input-free call (torch.arange(n), a mask from sizes) computes the same tensors at every call: once,
        # unless the caller gets them (or views of them) as outputs, which it may write
        once = "input_free" in op.attributes and not reaches_output(list(op.res))
        step = TorchStep(op.node.data, fn, [self.slot(v) for v in op.args], [self.slot(r) for r in op.res], once)
        call = self.imported.calls.get(op.node.data)
        if call is not None and op not in self.inplace and not reaches_output(list(op.res)):
            step.form = call.form()  # (a result the caller gets, or a view of it, stays a tensor of its own)
        method = call.foreach() if op in self.inplace and call is not None else None
        if method is not None and deferrable(op):  # (a counter's `add_(1)`: run last, with the others alike)
            step.foreach = (*method, self.slot(op.written))
        return step

    def _region(self, fused: FusedOp) -> RegionStep:
        ins = [self.slot(v) for v in fused.inputs]
        outs = [self.slot(r) for r in fused.outputs]
        ops, args, yielded = fused.body_ops, list(fused.block.args), list(fused.yielded.values)

        def reference(tensors: list, in_place: tuple[int, ...] = ()) -> list:
            env: dict[SSAValue, Any] = dict(zip(args, tensors))
            run_ops(ops, env, frozenset(args[i] for i in in_place))
            return [env[v] for v in yielded]

        opts = self.options
        low = self.lowered.get(fused)
        kernel = low.kernel if isinstance(low, KernelLowering) else None
        step = RegionStep(KernelChoice(fused.label, fused.pattern.data), ins, outs, reference, interpret=self.interpret,
                          strict=opts.strict, checks=-1 if opts.check is True else int(opts.check),
                          prefer_kernel=opts.prefer_kernels, profile="profile" in fused.attributes,
                          writes=self._writes(fused, kernel))  # fmt: skip
        if low is None:  # the reference backend lowers nothing
            step.choice.reason = "reference backend"
            return step
        if isinstance(low, ReferenceLowering):
            if low.failure:
                step.fall_back(low.reason)
            else:
                step.choice.reason = low.reason
            return step
        if isinstance(low, CallLowering):
            step.choice.impl, step.call = "callable", low
            return step
        assert isinstance(low, KernelLowering)
        step.kernel = low.kernel
        try:
            config = low.space.default()
            step.compiled = low.kernel.compiled(self.interpret, chained=opts.chained_launches and not self.interpret and has_pdl())
        except Exception as e:  # noqa: BLE001
            step.fall_back(f"region {fused.label}: kernel source does not compile ({type(e).__name__}: {first_line(e)})", e)
            return step
        step.choice.impl, step.choice.config = "kernel", config
        if step.profile and opts.tune == "none" and not self.interpret and not step.prefer_kernel:
            step.choice.impl = "reference"
            step.choice.reason = "a lone GEMM runs on cuBLAS unless tuning measures the kernel faster"
        return step


def _moved(inputs: list, moves: tuple[tuple[int, torch.device], ...]) -> list:
    """The inputs with those host tensors copied to their device (through pinned memory, without waiting)."""
    inputs = list(inputs)
    for i, dev in moves:
        x = inputs[i]
        if x.device != dev:
            inputs[i] = x.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else x.to(dev)
    return inputs


def _frees(reads: list[list[int]], kept: set[int]) -> list[tuple[int, ...]]:
    """Per step, the slots it reads (or makes) for the last time (the inputs, outputs and weights stay)."""
    last = {slot: i for i, slots in enumerate(reads) for slot in slots}
    frees: list[list[int]] = [[] for _ in reads]
    for slot, i in last.items():
        if slot not in kept:
            frees[i].append(slot)
    return [tuple(f) for f in frees]


@dataclass
class Recipe:
    """How a program was built (its builder, and the step or derived weights each op made), so that a copy can
    be built with some ops replaced (`rebuild_program`)."""

    builder: Builder
    made: dict[Operation, int | list[int]]
    # the ops whose step keeps its first values and reads what the ops of a key recompute, by key (the same ops are
    # copied for every instance of a family: found once, not per token of a dynamic cache); shared by the rebuilds
    stale: dict[frozenset, list[Operation]] = field(default_factory=dict)


def rebuild_program(program: Program, replaced: dict[Operation, Operation], lowered: dict[FusedOp, Lowered],
                    imported, aliases: dict[SSAValue, SSAValue] | None = None,
                    shared: dict[Operation, Operation] | None = None,
                    retyped: tuple[Operation, ...] = ()) -> Program:  # fmt: skip
    """A copy of `program` in which each op of `replaced` (an op of its function -> a copy of it at other sizes,
    reading the other copies' values, and `aliases`' values for the originals') runs from its copy: the copies
    take their originals' slots, their regions are built from `lowered`, and each op of `shared` runs the step
    of the op it maps to (one of `replaced`) on its own values (`Builder.rebound`); each torch call of `retyped`
    (not copied: `Builder.retypes`) runs the same step, or a new one where `imported`'s function differs (its
    constants move) or the step keeps its first values (an input-free call's). Every other step is shared
    (a region's step is copied, with its choice, so that a fallback in one program does not switch the other).
    A shape family's instance, without rebuilding the steps its sizes leave alone; it keeps `program`'s measured
    decision on CUDA graphs."""
    recipe = program.recipe
    base = recipe.builder
    b = Builder.__new__(Builder)
    b.lowered, b.imported, b.options, b.fn, b.interpret = lowered, imported, base.options, base.fn, base.interpret
    b.slots, b.inplace, b.overwritable = dict(base.slots), base.inplace, base.overwritable
    for new, old in (aliases or {}).items():  # (values the copies read in place of the originals' arguments)
        b.slots[new] = base.slots[old]
    for old, new in replaced.items():
        for r, s in zip(old.results, new.results):
            b.slots[s] = base.slots[r]
        if old in base.inplace:
            b.inplace = {**b.inplace, new: b.inplace[old]}
        if old in base.overwritable:  # (a copy at other sizes: the same readers, in the same order)
            b.overwritable = {**b.overwritable, new: base.overwritable[old]}
    steps = [_shallow(st) if isinstance(st, RegionStep) else st for st in program.steps]
    # (the parameters' layout the template was compiled with: an instance made after `model.half()` is stale too)
    weights = DerivedWeights(list(program.weights.weights), _layout=program.weights._layout)
    for old, new in replaced.items():
        at = recipe.made[old]
        step = b.step(new)
        if isinstance(at, list):
            for i, w in zip(at, step):
                weights.weights[i] = w
        else:
            steps[at] = step
    for op, like in (shared or {}).items():
        steps[recipe.made[op]] = b.rebound(steps[recipe.made[like]], op)
    for op in retyped:  # (a step that keeps its first values, an input-free call's, is built again too)
        name, at = op.node.data, recipe.made[op]
        if steps[at].once or imported.calls.get(name) is not base.imported.calls.get(name):
            steps[at] = b.step(op)
    # an input-free call the sizes leave alone keeps its first values too, but where it reads a value these sizes
    # compute anew (`pos = torch.arange(p, p + 1)[None]`: the slice of a moved arange) those values are stale
    fresh = frozenset((*replaced, *(shared or {}), *retyped))
    stale = recipe.stale.get(fresh)
    if stale is None:
        stale = recipe.stale[fresh] = []
        moved = {r for op in fresh for r in op.results}
        for op in base.fn.body.block.ops:
            if op in fresh or moved.isdisjoint(op.operands):
                continue
            moved.update(op.results)
            at = recipe.made.get(op)
            if isinstance(at, int) and getattr(program.steps[at], "once", False):
                stale.append(op)
    for op in stale:
        steps[recipe.made[op]] = b.step(op)
    for st in steps:
        if isinstance(st, RegionStep):
            st.choice = _shallow(st.choice)
    choices = [st.choice for st in steps if isinstance(st, RegionStep)]
    out = Program(program.inputs, program.outputs, steps, program.nslots, weights, choices, program.cuda_graphs and (
        b.options.cuda_graphs), program.tune_mode, static_inputs=program.static_inputs, frees=program.frees,
        moves=program.moves)  # fmt: skip
    out.recipe = Recipe(b, recipe.made, recipe.stale)
    out.graphs_pay, out.graph_note = program.graphs_pay, program.graph_note  # (measured once: the work is alike)
    if program.graphs_pay is False:
        out.cuda_graphs = False
    return out


def _shallow(x: Any) -> Any:
    """A shallow copy of a plain object (a step, a choice): copy.copy's result, several times faster (an instance
    copies every region's step and choice, per token of a dynamic cache)."""
    new = object.__new__(type(x))
    new.__dict__.update(x.__dict__)
    return new


def build_program(module: ModuleOp, lowered: dict[FusedOp, Lowered], imported, options) -> Program:
    """The program of a lowered module (its derived weights shared with every other program that computes them)."""
    return Builder(module, lowered, imported, options).build()
