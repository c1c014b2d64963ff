"""`codegen.device`: Triton's scratch allocator for kernels that build tensor descriptors on the device."""

import contextvars
import threading

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
