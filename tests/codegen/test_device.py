"""`codegen.device`: Triton's scratch allocator for kernels that build tensor descriptors on the device."""

import contextvars
import threading

import pytest
from triton.runtime import _allocation

from dlblas_compiler.codegen import device


def test_the_descriptor_scratch_is_set_in_every_context_that_launches():
    """Triton keeps its allocator in a context variable, which each thread has apart: set first in a search's
    thread, the caller's launches found none (they failed and fell back to their references). Each context that
    launches sets it; an allocator the caller set is kept."""

    def allocator_after_scratch():
        device.descriptor_scratch()
        return _allocation._allocator.get()

    t = threading.Thread(target=lambda: contextvars.Context().run(allocator_after_scratch))
    t.start()
    t.join()
    assert contextvars.Context().run(allocator_after_scratch) is not _allocation._NULL_ALLOCATOR  # (a fresh context)

    def mine(size, alignment, stream):
        raise AssertionError("not called here")

    def keeps_the_caller_s():
        _allocation._allocator.set(mine)
        return allocator_after_scratch()

    assert contextvars.Context().run(keeps_the_caller_s) is mine


def test_the_descriptor_scratch_in_a_triton_that_keeps_its_allocator_otherwise(monkeypatch):
    """Where Triton's private default allocator is not found, the allocator is set once in each thread."""
    monkeypatch.delattr(_allocation, "_NULL_ALLOCATOR")
    seen = []

    def in_a_thread():
        device.descriptor_scratch()
        seen.append(_allocation._allocator.get())

    t = threading.Thread(target=lambda: contextvars.Context().run(in_a_thread))
    t.start()
    t.join()
    assert seen == [device._scratch]


@pytest.mark.gpu
def test_tma_kernels_launch_in_a_thread_then_in_a_fresh_context_of_the_caller():
    """A Llama block's GEMMs at 512 tokens take TMA configs by default on sm90 (descriptors built on the device,
    which need Triton's allocator): run first in another thread, as a search runs them, then in a fresh context
    of this thread. No launch fails for want of the allocator (each would fall back to its reference with a
    warning, an error here), every region runs its kernel, and the outputs match float64's."""
    import warnings

    import torch

    import dlblas_compiler as dc
    from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
    from dlblas_compiler.numerics import rel_error, tolerance

    cfg = BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)
    model = randomize_(LlamaBlock(cfg)).cuda().to(torch.bfloat16).eval()
    inputs = llama_block_inputs(cfg, 1, 512, torch.bfloat16, "cuda")
    cm = dc.compile(model, backend="triton", tune="none", cuda_graphs=False)
    outs = []

    def call() -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("error", message="dlblas_compiler")
            outs.append(cm(*inputs))

    t = threading.Thread(target=lambda: contextvars.Context().run(call))
    t.start()
    t.join()
    contextvars.Context().run(call)
    assert len(outs) == 2
    assert set(cm.report().impls().values()) == {"kernel"}
    assert any(c.config.get("TMA") for c in cm._spec().executor.choices if c.config), "no TMA config ran"
    ref = model.double()(*[a.double() if a.is_floating_point() else a for a in inputs])
    for out in outs:
        assert rel_error(out, ref) <= tolerance(torch.bfloat16)
