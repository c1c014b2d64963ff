"""Weights the compiler derives from parameters (q/k/v or gate/up concatenated into one GEMM weight, a norm's
weight folded into the next weights): computed once from the live parameters, and again whenever a source
parameter is modified in place (its version counter moves) or gets new storage (`p.data = t`). Writes through
`p.data` bypass the version counter and are not seen; nor are in-place writes to inference tensors (made under
torch.inference_mode), which keep no version counter.

A `DerivedWeight` is shared by every program that computes the same expression of the same parameters
(`derived_weight`, a process-wide table held weakly: an entry lives as long as a program uses it): a model
compiled for twenty sequence lengths, or captured by dynamo as a prefill and a decode graph, holds its
concatenated weights once. And a concatenation of parameters (q/k/v, gate/up along the output dim) takes their place
in memory: once the buffer is built, each source parameter's `.data` becomes its slice of the buffer, so the model
holds those weights once (its values, and its own forward, are unchanged). An in-place update of such a parameter
writes the buffer itself, which is then used as it is; `p.data = t` replaces its slice, and the buffer is built
again with the parameters moved into it. While a CUDA graph is alive at a build the parameters stay where they are
(`_graph_alive`: the graph may read them there; the buffer is then a copy).
"""

from __future__ import annotations

import gc
import logging
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..errors import ParametersChanged
from .graphs import OURS


@dataclass
class DerivedWeight:
    compute: Callable[[], torch.Tensor]
    sources: list[torch.Tensor]  # the parameters it is computed from
    share: list[torch.Tensor] = field(default_factory=list)  # parameters concatenated along dim 0: become views
    _versions: tuple | None = None
    _value: torch.Tensor | None = None

    def value(self) -> tuple[torch.Tensor, bool]:
        """The current value, and whether this call (re)computed it."""
        versions = tuple((_version(t), t.data_ptr()) for t in self.sources)
        if self._value is not None and versions == self._versions:
            return self._value, False
        if self._value is not None and _lives_in(self._value, self.share):
            # (parameters updated in place while they are slices of the buffer: it holds their new values already,
            # at the same address, which graphs captured with it keep reading)
            self._versions = versions
            return self._value, False
        # (outside inference mode: the parameters `share` names become views of the buffer, and a buffer made under
        # `torch.inference_mode()` would make them inference tensors, which autograd refuses to save afterwards;
        # parameters that are inference tensors already, made under it, stay so)
        normal = not any(t.is_inference() for t in (*self.sources, *self.share))
        with torch.inference_mode(not normal and torch.is_inference_mode_enabled()), torch.no_grad():
            self._value = self.compute()
            if _fits(self._value, self.share) and not _graph_alive(self._value):  # the parameters now live in it
                start = 0
                for p in self.share:
                    p.data = self._value[start : start + p.shape[0]]
                    start += p.shape[0]
        self._versions = tuple((_version(t), t.data_ptr()) for t in self.sources)
        return self._value, True

    def __repr__(self) -> str:
        return f"DerivedWeight(from {len(self.sources)} parameters)"


def _graph_alive(buffer: torch.Tensor) -> bool:
    """Whether a CUDA graph exists in the process (the user's own, torch.compile's: anyone's but our programs')
    that may have captured the parameters' current addresses: moving them into the buffer would leave it replaying on
    freed memory (bench/NOTES.md 116), so the buffer is then a copy, with one warning. Checked only when a
    buffer is built (a scan of the garbage collector's objects, ~0.2 s with a model of 32 layers loaded: once per
    fill that builds buffers), and only for buffers on a CUDA device once CUDA is initialized (no graph can read
    CPU tensors, and none exists before). Our programs' graphs (`graphs.OURS`) do not count: a program compares
    its weights' addresses before every replay and captures again when one moved (`Program.__call__`)."""
    if buffer.device.type not in GRAPH_DEVICES or not torch.cuda.is_initialized():
        return False
    if _SCAN:  # (one scan for all the buffers one fill builds)
        return _SCAN[0]
    # (by type, not isinstance: isinstance on a weak proxy whose object is gone raises ReferenceError, and the
    # collector's objects hold such proxies; a live proxy's object is among them itself)
    graph = torch.cuda.CUDAGraph
    alive = any(issubclass(type(o), graph) and o not in OURS for o in gc.get_objects())
    _SCAN.append(alive)
    if alive and not _WARNED:
        _WARNED.append(True)
        logging.getLogger("dlblas_compiler.runtime").warning("a CUDA graph is alive as concatenated weights are built")
        warnings.warn("dlblas_compiler: a CUDA graph exists as the concatenated weights (q/k/v, gate/up) are built "
                      "and may read the parameters where they are: the weights are copies instead of taking the "
                      "parameters' place (more memory; share_weights=False does this always, docs/bad-inputs.md)",
                      stacklevel=6)  # fmt: skip
    return alive


GRAPH_DEVICES = ("cuda",)  # where a buffer's parameters may be read by a CUDA graph
_WARNED: list[bool] = []  # (one warning per process)
_SCAN: list[bool] = []  # `_graph_alive`'s answer while one `DerivedWeights.fill` builds its buffers


def _lives_in(buffer: torch.Tensor, parts: list[torch.Tensor]) -> bool:
    """Whether each part is its slice of `buffer` (the buffer is their plain concatenation along dim 0)."""
    if not parts or buffer.numel() == 0:
        return False
    start, base = 0, buffer.data_ptr()
    for p in parts:
        if p.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr() or p.data_ptr() != base + start:
            return False
        start += p.numel() * p.element_size()
    return start == buffer.numel() * buffer.element_size()


def _fits(buffer: torch.Tensor, parts: list[torch.Tensor]) -> bool:
    """Whether each part can become its slice of `buffer` unchanged (same dtype, device, layout; each once)."""
    if not parts or len({id(p) for p in parts}) != len(parts) or not isinstance(buffer, torch.Tensor):
        return False
    same = all(p.dtype == buffer.dtype and p.device == buffer.device and p.is_contiguous() for p in parts)
    return same and sum(p.shape[0] for p in parts) == buffer.shape[0] and all(
        p.shape[1:] == buffer.shape[1:] for p in parts
    )


_DERIVED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # structural key -> DerivedWeight
_SHARED: dict[int, weakref.ref] = {}  # id -> parameter living in a concatenated buffer (by identity: a
# tensor's == is elementwise, so no WeakSet)


def _dead():
    return None


def derived_weight(key: tuple, compute: Callable[[], torch.Tensor], sources: list, concatenated: list) -> DerivedWeight:
    """The DerivedWeight of an expression of parameters (`key` names it structurally, with the parameters'
    identities), made once. `concatenated`: the parameters of a plain concatenation along dim 0, which move into
    its buffer, unless one of them already lives in another's."""
    found = _DERIVED.get(key)
    if found is None:
        shared = any(_SHARED.get(id(p), _dead)() is p for p in concatenated)
        share = concatenated if concatenated and not shared else []
        for p in share:
            _SHARED[id(p)] = weakref.ref(p, lambda _, i=id(p): _SHARED.pop(i, None))
        found = _DERIVED[key] = DerivedWeight(compute, sources, share)
    return found


@dataclass
class DerivedWeights:
    """The derived weights one program reads, and the slots of its value table they go to. A call compares the
    source parameters' versions and addresses once (not per weight) to see that nothing changed; where they did, that
    their dtypes, shapes, strides and devices did not (`ParametersChanged`)."""

    weights: list[tuple[int, DerivedWeight]] = field(default_factory=list)
    _values: list | None = None  # the values last put into a table
    _state: list | None = None  # the sources' versions and addresses then
    _layout: list | None = None  # their dtypes, shapes, strides and devices at the first call

    def fill(self, env: list) -> bool:
        """Put the current values into a value table; True when any differs from the last call's."""
        before = self._values
        state = self._sources_state()
        if self._values is None or state != self._state:
            # (their layout only where an address moved: a buffer written in place every call, a KV cache, moves
            # its version alone)
            if self._state is None or self._layout is None or state[1:] != self._state[1:]:
                layout = [(t.dtype, t.shape, t.stride(), t.device) for t in (*self._sources[0], *self._sources[1])]
                if self._layout is not None and layout != self._layout:
                    raise ParametersChanged
                self._layout = layout
            try:
                self._values = [w.value()[0] for _, w in self.weights]
            finally:
                _SCAN.clear()
            self._state = self._sources_state()  # (after: a first computation may move parameters into a buffer)
        for (slot, _), v in zip(self.weights, self._values):
            env[slot] = v
        return before is None or any(a is not b for a, b in zip(before, self._values))

    def changed(self) -> bool:
        """Whether a source changed since the last `fill` (a graph captured with the old values is stale)."""
        return self._sources_state() != self._state

    def _sources_state(self) -> tuple[list, list, list]:
        tracked, untracked = self._sources
        return [t._version for t in tracked], [t.data_ptr() for t in tracked], [t.data_ptr() for t in untracked]

    @cached_property
    def _sources(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each source parameter once (computed at the first call), split into those with a version counter and
        inference tensors (none; only their addresses are compared). Checked on every call, so kept cheap."""
        params = list({id(t): t for _, w in self.weights for t in w.sources}.values())
        inference = [t.is_inference() for t in params]
        return [t for t, i in zip(params, inference) if not i], [t for t, i in zip(params, inference) if i]


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version
