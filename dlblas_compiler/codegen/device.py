"""Limits of the GPU the templates build for (the current CUDA device; H100/H200 values without one, so the
Triton interpreter on CPU sees the same search spaces)."""

from __future__ import annotations

import ctypes
import functools
import threading

import torch


def smem_limit() -> int:
    """Shared memory one program may use (bytes)."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(getattr(props, "shared_memory_per_block_optin", 232448))
    return 232448


def sm_count() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132


def fp32_dot_precision() -> str:
    """`tl.dot`'s input precision for fp32 operands, following torch's switch as Inductor does: IEEE fp32
    unless the user allowed TF32 for matmuls (`torch.backends.cuda.matmul.allow_tf32 = True`, or
    `torch.set_float32_matmul_precision("high")`)."""
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def dot_args(dtype: torch.dtype) -> str:
    """The extra arguments of a generated `tl.dot` on operands of `dtype` ("" where the default is right)."""
    return f', input_precision="{fp32_dot_precision()}"' if dtype == torch.float32 else ""


def capability() -> tuple[int, int]:
    """The device's compute capability; (9, 0) without CUDA (the interpreter sees an H100's search spaces)."""
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)


def has_tma() -> bool:
    """Tensor descriptors: Hopper and newer; the Triton interpreter emulates them."""
    return capability() >= (9, 0)


def has_pdl() -> bool:
    """Programmatic dependent launch (`launch_pdl`, griddepcontrol): Hopper and newer NVIDIA GPUs, with a CUDA
    driver of 12.3 or later (it captures such launches into CUDA graphs; an older one runs a torch built for a newer
    CUDA through minor-version compatibility, and its captures would fail)."""
    if not torch.cuda.is_available() or torch.version.cuda is None or torch.cuda.get_device_capability() < (9, 0):
        return False
    return driver_version() >= 12030


@functools.cache
def driver_version() -> int:
    """The CUDA driver's version as cuDriverGetVersion gives it (12030 for 12.3); 0 where it cannot be read."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0
    except OSError:
        return 0


_threads = threading.local()


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def descriptor_scratch() -> None:
    """Kernels that build tensor descriptors on the device need Triton's scratch allocator. Triton keeps it in a
    context variable, which each thread has apart (a search's thread setting it left the caller's launches
    without one: they failed and fell back to their references), so it is set wherever it is missing; an
    allocator the caller set is kept."""
    import triton
    from triton.runtime import _allocation

    try:
        missing = _allocation._allocator.get() is _allocation._NULL_ALLOCATOR
    except AttributeError:  # (a Triton that keeps it otherwise: set once in each thread)
        missing, _threads.set = not getattr(_threads, "set", False), True
    if missing:
        triton.set_allocator(_scratch)
