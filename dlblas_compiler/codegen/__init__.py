"""Codegen: the built-in templates (row, gemm, attention: importing this package registers them with
`fusion.templates`), the kernel source writer, the compiled-kernel cache, the Triton interpreter context and
the device limits the templates read."""

from . import attention, gemm, row  # noqa: F401  (register the templates)
