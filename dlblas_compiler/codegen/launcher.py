"""Launching a jitted kernel on CUDA without Triton's per-launch argument handling.

`fn[grid](*args, **kwargs)` binds every argument, computes the specialization of each one, builds the cache key,
looks the compiled binary up and then launches it: ~57 µs of host time per launch on an H100's host, against ~11
µs for the launch itself (bench/launch_overhead.py). A program run without a CUDA graph (a length never captured,
HF's dynamic cache) launches ~165 kernels a token. `Launcher` sends the first launch of each specialization through
Triton (compiling it if needed) and keeps the compiled binary; later launches find it by a key built from what
Triton specializes on — each tensor's dtype and 16-byte alignment, each int's class (1, a multiple of 16, 32 or
64 bits), the constexprs and options — and call it directly on the current stream.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from triton import knobs

_Tensor = torch.Tensor
# the current device and its current stream, as Triton's own launcher reads them (a CUDA graph's capture stream
# while one is captured)
_device = torch.cuda.current_device
_stream = torch._C._cuda_getCurrentRawStream if hasattr(torch._C, "_cuda_getCurrentRawStream") else None
_I32 = (-(2**31), 2**31 - 1)


def _spec(a: Any) -> Any:
    """What Triton's specialization of argument `a` depends on, as one hashable scalar: an int's class (1, a
    multiple of 16, past 32 bits: codes 0-7), a float (8), a bool (9, 10), a tensor's dtype and 16-byte alignment
    (negative), anything else (None, a constexpr) itself."""
    if type(a) is int:
        return 1 if a == 1 else (not a & 15) * 2 + (not -0x80000000 <= a <= 0x7FFFFFFF) * 4
    if isinstance(a, _Tensor):
        return -2 * id(a.dtype) - (not a.data_ptr() & 15)
    if type(a) is float:
        return 8
    if type(a) is bool:
        return 9 + a
    return a


class WgmmaRace(RuntimeError):
    """A compiled kernel whose pipelined tensor-core product may read registers or shared memory its own loop has
    already overwritten (`wgmma_race`)."""


REFUSE_WGMMA_RACE = True  # (bench/wgmma_race.py switches it off to measure the races)
_DOT = re.compile(r"(%[\w#.]+) = ttng\.warp_group_dot (%[\w#.]+), (%[\w#.]+),[^\n]*?\} : (\S+)")
_WAIT = re.compile(r"ttng\.warp_group_dot_wait ([^{\n]*)\{pendings = (\d+)")
_RING = re.compile(r"(%[\w#.]+) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x")
_VIEW = re.compile(r"(%[\w#.]+) = ttg\.memdesc_\w+ (%[\w#.]+)")


def wgmma_race(ttgir: str) -> str | None:
    """Why a kernel's pipelined wgmma may read data its loop has overwritten, or None. Two bugs of Triton 3.6's
    software pipeliner on sm90 (bench/NOTES.md 167), each giving wrong rows that vary between launches:
      * a wgmma reading its A tile from registers (a tile scaled in registers inside the K loop, split into one wgmma
        per 16-wide K slice) waited on with groups left in flight (pendings > 0): the next K step's loads overwrite
        the registers the last step's later wgmmas still read (triton-lang/triton#9433; in the sm90 SASS, LDSM and
        FMUL into the A registers of HGMMAs the loop's `WARPGROUP.DEPBAR.LE gsb0, 0x3` left running);
      * a wgmma reading both tiles from shared memory while a second user of A (the row statistics' squares) made
        the pipeliner give A's ring one buffer fewer than W's: the load two steps ahead overwrites the A tile the
        last step's wgmma still reads.
    Products waited on in full (attention's P @ V) and equal rings are neither."""
    rings = dict((name, int(depth)) for name, depth in _RING.findall(ttgir))
    source = dict(_VIEW.findall(ttgir))

    def ring(v: str) -> int | None:
        while v in source:
            v = source[v]
        return rings.get(v)

    in_flight = set()  # values a wait with groups left in flight names (its dots' results and operands)
    for ops, pendings in _WAIT.findall(ttgir):
        if int(pendings):
            in_flight |= set(ops.replace(",", " ").split())
    for result, a, b, a_type in _DOT.findall(ttgir):
        if result not in in_flight:
            continue
        if a_type.startswith("tensor<"):
            return "its wgmma reads A from registers the next K step overwrites (triton-lang/triton#9433)"
        depths = {ring(a), ring(b)} - {None}
        if len(depths) > 1:
            return f"its wgmma reads A and W from rings of {sorted(depths)} buffers: the shorter is overwritten early"
    return None


def _keyword(v: Any) -> Any:
    """A keyword argument's part of the key: a constexpr or option by its value, a tensor by its specialization."""
    return _spec(v) if isinstance(v, _Tensor) else v


class Launcher:
    """A jitted function's launches (`launcher[grid](*args, **kwargs)`, as the function's own), each specialization's
    binary called directly after its first launch. `extra`: keyword arguments added to every launch and warm-up
    (`Chained`'s programmatic dependent launch)."""

    extra: dict[str, Any] = {}

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._bins: dict[tuple, tuple[Any, list]] = {}
        # constexprs may be passed by position too: those are keyed by their value
        self._const_at = tuple(i for i, p in enumerate(getattr(fn, "params", ())) if p.is_constexpr)

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:  # (warm-ups: `run(..., grid=, warmup=True)`)
        # (the extras last, as `_launch` passes them: Triton keys a binary on its options in their order)
        return self.fn.run(*args, **{**kwargs, **self.extra})

    def variant(self, name: str) -> Launcher:
        """The launcher of another kernel of the same source (a GEMM's warp-specialized one: `"ws"`; a masked
        attention's kept tiles and their lists: `"blocks"`, `"lists"`), launched without programmatic dependent
        launch (it has no wait for the kernel before it)."""
        return launcher(self.fn.variants[name])

    def __getattr__(self, name: str) -> Any:  # the jitted function's own state (its compiled binaries, ...)
        return getattr(self.fn, name)

    def _launch(self, grid: Sequence[int], args: tuple, kwargs: dict) -> None:
        if self.extra:
            kwargs = {**kwargs, **self.extra}
        device = _device()
        spec = tuple(map(_spec, args))
        if self._const_at and self._const_at[0] < len(args):
            spec = tuple(a if i in self._const_at else s for i, (a, s) in enumerate(zip(args, spec, strict=True)))
        key = (device, spec, tuple(kwargs), tuple(map(_keyword, kwargs.values())))
        try:
            found = self._bins.get(key)
        except TypeError:  # (an argument of a kind the key cannot hold: Triton's own launch, every time)
            self.fn.run(*args, grid=grid, warmup=False, **kwargs)
            return
        if found is None:  # Triton's own launch: binds, specializes, compiles or finds the binary, launches
            binary = self.fn.run(*args, grid=grid, warmup=False, **kwargs)
            if hasattr(binary, "result"):
                binary = binary.result()
            if binary is None:  # (a compile hook skipped it: nothing ran, nothing to keep)
                return
            why = wgmma_race(binary.asm.get("ttgir", "")) if REFUSE_WGMMA_RACE else None
            if why:  # (checked after this first launch: a warm-up first would be a worker's job in `compile_pool`)
                raise WgmmaRace(f"{binary.name} {kwargs}: Triton's pipelining races, its outputs are not to be used "
                                f"and it is not launched again: {why}")
            params = self.fn.params[len(args):]  # the rest, in the function's order (defaults included)
            tail = [kwargs[p.name] if p.name in kwargs else p.default for p in params]
            if len(self._bins) >= 256:  # (arguments whose values keep changing: start over rather than grow)
                self._bins.clear()
            self._bins[key] = (binary, tail)
            return
        binary, tail = found
        stream = _stream(device)
        g = tuple(grid)
        g0, g1, g2 = g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if not getattr(enter, "calls", enter) and not getattr(leave, "calls", leave):  # (no hooks: none to call)
            enter = leave = meta = None
        else:  # (a profiler's hooks: they read the launch's metadata)
            meta = binary.launch_metadata(g, stream, *args, *tail)
        binary.run(g0, g1, g2, stream, binary.function, binary.packed_metadata, meta, enter, leave, *args, *tail)


class Chained(Launcher):
    """A generated kernel launched with programmatic dependent launch: `launch_pdl=True` lets its programs be
    scheduled while the kernel before it drains, and PDL=True compiles in the wait that keeps that safe (see
    `source.chained_start`)."""

    extra = {"PDL": True, "launch_pdl": True}


_LAUNCHERS: dict[tuple[Any, bool], Launcher] = {}


def launcher(fn: Any, chained: bool = False) -> Launcher:
    """The one Launcher of a jitted function (`Chained` with `chained`), shared by every launch of it: each layer's
    region and each length's copy of a region launch the same compiled function, and find its binaries."""
    found = _LAUNCHERS.get((fn, chained))
    if found is None:
        found = _LAUNCHERS[fn, chained] = Chained(fn) if chained else Launcher(fn)
    return found
