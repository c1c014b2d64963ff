"""The steps a Program runs, each a small typed record over the program's value table (a list of slots).

    ConstantStep   a scalar constant into its slot
    TorchStep      an op the compiler does not know (`dl.torch_call`), run by PyTorch
    ReferenceStep  an unfused `dl` op, run by its torch reference
    RegionStep     a `dl.fused` region: its generated kernel (or the pattern's Python callable), its reference
                   when it has none or when the kernel fails (one warning naming the region; strict: an error)
Any other op with an implementation registered for it (`runtime.ops`, e.g. `dl.moe` by the library) runs
through the step its factory builds. Each step prints what it does (`repr`) and can be run alone on a table.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..codegen.interpreter import interpreted
from ..errors import CompileError, DeviceFault, is_device_fault
from ..fusion.templates import CallLowering
from ..numerics import rel_error, tolerance


@dataclass
class KernelChoice:
    """What runs a region (its kernel and config, a callable, or its reference) and what was measured."""

    region: str
    pattern: str
    impl: str = "reference"  # "kernel", "reference" or "callable"
    config: dict | None = None
    reason: str = ""
    time: float | None = None  # the tuned config's time (s)
    default_time: float | None = None  # the default config's time (s)
    reference_time: float | None = None  # the reference's time, where it measured faster (s)
    trials: int = 0
    from_cache: bool = False
    check_error: float | None = None  # check=True: the worst relative error against the reference so far
    check_tolerance: float = 0.0
    check_calls: int = 0
    # what measured within `selection.NEAR` of this choice alone (impl, config, seconds): the program decides
    # between them in its own CUDA graph after its first call is tuned (`runtime.in_context`)
    alternatives: list[tuple[str, dict | None, float]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = {"name": self.region, "pattern": self.pattern, "impl": self.impl, "config": self.config or {}}
        for k in ("reason", "time", "default_time", "reference_time"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        d["trials"], d["from_cache"] = self.trials, self.from_cache
        if self.check_calls:
            d.update(check_error=self.check_error, check_calls=self.check_calls, check_tolerance=self.check_tolerance)
        return d


def as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else tuple(x) if isinstance(x, list) else (x,)


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__


@dataclass
class ConstantStep:
    slot: int
    value: float

    def __call__(self, env: list) -> None:
        env[self.slot] = self.value

    def __repr__(self) -> str:
        return f"ConstantStep({self.value} -> slot {self.slot})"


@dataclass
class TorchStep:
    name: str  # the dl.torch_call's node
    fn: Callable[..., tuple]
    ins: list[int]
    outs: list[int]
    once: bool = False  # the same values at every call (an input-free call: sizes and constants): kept from the first
    # (method, scalar, slot): `t.<method>(scalar)` on the input in that slot, in place, its result read only by the
    # program's outputs, so it may run at the program's end with others alike (`inplace.batched`)
    foreach: tuple[str, int | float, int] | None = field(default=None, repr=False)
    # the call's structure (`TorchCall.form`): calls of one form on equal tensors compute equal values (elementwise
    # calls alike over inputs run as one, `stacked`; constants of one form are one value)
    form: tuple | None = field(default=None, repr=False)
    _kept: tuple | None = field(default=None, repr=False)

    def __call__(self, env: list) -> None:
        values = self._kept
        if values is None:
            values = self.fn(*[env[i] for i in self.ins])
            if self.once:
                self._kept = values = tuple(values)
        for s, val in zip(self.outs, values):
            env[s] = val

    def __repr__(self) -> str:
        return f"TorchStep({self.name}: {self.ins} -> {self.outs}{', once' if self.once else ''})"


@dataclass
class ReferenceStep:
    op: str  # the dl op's name
    fn: Callable[..., Any]
    ins: list[int]
    outs: list[int]

    def __call__(self, env: list) -> None:
        for s, val in zip(self.outs, as_tuple(self.fn(*[env[i] for i in self.ins]))):
            env[s] = val

    def __repr__(self) -> str:
        return f"ReferenceStep({self.op}: {self.ins} -> {self.outs})"


@dataclass
class RegionStep:
    """One `dl.fused` region. A failure of the kernel or callable, at any call, switches the region to its
    reference with one warning (a CompileError under strict=True). With `checks` calls left to check (-1: every
    call), the reference also runs after the kernel and the worst relative error is kept in the choice."""

    choice: KernelChoice
    ins: list[int]
    outs: list[int]
    reference: Callable[..., list]  # (tensors, in_place=()): the region's ops by their torch references
    kernel: Any = None  # codegen.kernel.Kernel
    compiled: Callable | None = None
    call: CallLowering | None = None
    interpret: bool = False
    strict: bool = False
    checks: int = 0
    prefer_kernel: bool = False  # keep the kernel even where the reference measures faster (library ops)
    profile: bool = False  # the planner asks for a measurement against the reference before keeping the kernel
    # the inputs (positions in `ins`) a kernel may write: at indexed positions (a KV cache its GEMM stores k and v
    # into), or over the whole tensor (a residual cuBLAS adds the product into, which nothing reads afterwards), each
    # with whether it may write that tensor itself (`runtime.inplace`, `FusedOp.overwritable_inputs`) or a copy of it
    writes: tuple[tuple[int, bool], ...] = ()

    def __repr__(self) -> str:
        c = self.choice
        how = f"kernel {c.config}" if c.impl == "kernel" else c.impl + (f" ({c.reason})" if c.reason else "")
        return f"RegionStep({c.region}: {how}; {self.ins} -> {self.outs})"

    def launch(self, tensors: list, config: dict) -> list:
        if self.interpret:
            with interpreted():
                return self.kernel.launch(self.compiled, tensors, config)
        return self.kernel.launch(self.compiled, tensors, config)

    def fall_back(self, why: str, cause: BaseException | None = None) -> None:
        """Run the reference from now on, with one warning (and a WARNING log record, `dlblas_compiler.runtime`)
        naming the region and the cause (strict: raise)."""
        if self.strict:
            raise CompileError(why) from cause
        logging.getLogger("dlblas_compiler.runtime").warning("region %s fell back to its reference: %s",
                                                             self.choice.region, why)  # fmt: skip
        warnings.warn(f"dlblas_compiler: {why}; using its reference", stacklevel=4)
        self.choice.impl, self.choice.reason = "reference", why
        self.choice.alternatives = []  # (a kernel that failed is no alternative for `in_context` to try)

    def inputs(self, env: list) -> list:
        """The region's input values, made contiguous: kernels index their inputs as dense row-major tensors."""
        return [t if not isinstance(t, torch.Tensor) or t.is_contiguous() else t.contiguous() for t in (env[i] for i in self.ins)]

    def run_reference(self, tensors: list) -> list:
        """The reference as the program runs it: the inputs it may write in place written in place (the reference
        alone, as tuning and checks run it, writes none)."""
        in_place = tuple(i for i, ok in self.writes if ok)
        return self.reference(tensors, in_place) if in_place else self.reference(tensors)

    def private(self, tensors: list, every: bool = False) -> list:
        """`tensors` with a copy of each input the kernel writes that it may not write in place (`every`: of each
        one, as tuning's candidates and checks need: a wrong config must not write the caller's tensor)."""
        if not self.writes:
            return tensors
        tensors = list(tensors)
        for i, in_place in self.writes:
            if every or not in_place:
                tensors[i] = tensors[i].clone()
        return tensors

    def by_reference(self, env: list) -> None:
        """Run the reference on the table (torch ops take any strides: no copies; SDPA's output, say, is transposed)."""
        for s, val in zip(self.outs, self.run_reference([env[i] for i in self.ins])):
            env[s] = val

    def __call__(self, env: list) -> None:
        impl = self.choice.impl
        if impl == "reference":
            self.by_reference(env)
            return
        tensors = self.inputs(env)
        written = self.private(tensors, every=bool(self.checks))  # (checked: against the inputs as they were)
        try:
            res = as_tuple(self.call(*tensors)) if impl == "callable" else self.launch(written, self.choice.config)
        except Exception as e:  # noqa: BLE001 - a failing kernel (or user callable) falls back
            what = "the pattern's callable" if impl == "callable" else f"kernel launch with config {self.choice.config}"
            if is_device_fault(e):  # its reference could not run either: say what faulted instead
                raise DeviceFault(f"region {self.choice.region}: {what} faulted the GPU ({type(e).__name__}: "
                                  f"{first_line(e)}); nothing more can run on it in this process: restart it "
                                  "(and report the region and config)") from e  # fmt: skip
            self.fall_back(f"region {self.choice.region}: {what} failed ({type(e).__name__}: {first_line(e)})", e)
            res = self.run_reference(tensors)
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
