"""Errors the compiler raises. Each names the op (and, where known, the user's source line)."""


class DLError(Exception):
    """Base class of every error raised by dlblas_compiler."""


class FrontendError(DLError):
    """The module could not be captured or imported (untraceable code, unsupported input)."""


class CompileError(DLError):
    """A pass, codegen or kernel build failed (raised under strict=True; otherwise a fallback warns)."""


class EagerOnly(FrontendError):
    """The captured graph does what compiled kernels cannot (turns gradients on inside forward): the compiled module
    runs the model eagerly, with one warning (strict=True: this error). `instead`: what to do."""

    def __init__(self, reason: str, instead: str):
        super().__init__(f"{reason}; {instead}")
        self.reason, self.instead = reason, instead


class DataDependent(FrontendError):
    """A shape in the captured graph depends on a tensor's values (`torch.arange(n)` of a tensor `n`, `nonzero`),
    which shape propagation on fake tensors cannot know. A graph dynamo handed over runs eagerly instead. `node`:
    the node and its source line."""

    node: str = ""


class ParametersChanged(Exception):  # noqa: N818 - a signal between the runtime and the compiled module
    """A parameter the program reads has another dtype, shape, strides or device than when it was compiled
    (`model.half()`, `p.data = t` of another shape): the program is stale; the compiled module compiles again."""


class UnsupportedError(DLError):
    """An op or argument the compiler does not handle (raised with strict=True instead of falling back)."""


class DeviceFault(DLError):
    """A kernel faulted the GPU (an illegal memory access, a launch failure): CUDA's errors of this kind are sticky,
    so nothing more, a region's reference included, can run in this process. Raised instead of falling back."""


# the texts of CUDA's sticky errors, as torch and Triton report them
STICKY_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address", "illegal instruction",
                 "device-side assert", "hardware stack error")  # fmt: skip


def is_device_fault(e: BaseException) -> bool:
    """Whether `e` is one of CUDA's sticky errors (the process's CUDA context is lost)."""
    text = str(e).lower()
    return any(s in text for s in STICKY_ERRORS)
