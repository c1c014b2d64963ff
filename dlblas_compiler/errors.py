"""Errors the compiler raises. Each names the op (and, where known, the user's source line)."""


class DLError(Exception):
    """Base class of every error raised by dlblas_compiler."""


class FrontendError(DLError):
    """The module could not be captured or imported (untraceable code, unsupported input)."""


class CompileError(DLError):
    """A pass, codegen or kernel build failed (raised under strict=True; otherwise a fallback warns)."""


class UnsupportedError(DLError):
    """An op or argument the compiler does not handle (raised with strict=True instead of falling back)."""
