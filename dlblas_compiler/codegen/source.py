"""Writing kernel source: indented text, index helpers, dtype names (what every template's emitter uses)."""

from __future__ import annotations

import torch

from ..dialects.types import numel, shape_of

HEADER = "import triton\nimport triton.language as tl\n\n"

TL_DTYPE = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32"}


def stored(expr: str, dtype: torch.dtype) -> str:
    """A register value (fp32; a boolean as 0.0 / 1.0) as a store into a tensor of `dtype` writes it."""
    return f"({expr} != 0.0)" if dtype == torch.bool else f"{expr}.to({TL_DTYPE[dtype]})"

# A kernel touching a tensor of this many elements or more computes its offsets in 64-bit integers
# (int32 products such as row * stride would wrap); smaller ones keep the cheaper 32-bit arithmetic.
INT32_LIMIT = 2**31


def wide_indices(values) -> bool:
    """Whether a kernel reading or writing these SSA tensors needs 64-bit index arithmetic."""
    return any(numel(shape_of(v)) >= INT32_LIMIT for v in values)


class Writer:
    """Indented source text."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.depth + line) if line else "")

    def indent(self) -> Writer:
        self.depth += 1
        return self

    def dedent(self) -> None:
        self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# Every generated kernel takes PDL (programmatic dependent launch, sm90+): launched with `launch_pdl=True` and
# PDL=True (`kernel.Chained`), a kernel's programs may be scheduled while the kernel before it in the stream
# drains; each waits at `gdc_wait` until that kernel has finished and its writes are visible, and lets the next
# kernel start launching (`gdc_launch_dependents`): at once, or (a GEMM) once its K loop has streamed its weight, so
# the next kernel's programs do not take SM slots and bandwidth while it still does (its epilogue's reads after
# that are safe: the next kernel writes nothing before its own wait). Off (`chained_launches=False`, the
# interpreter, GPUs before sm90, CUDA drivers before 12.3) both are gone.
PDL_ARG = "PDL: tl.constexpr = False,"


def chained_start(w: Writer, release: bool = True) -> None:
    """The first statements of a kernel: under PDL, wait for the previous kernel, then (`release`) release the
    next one."""
    w("if PDL:  # chained launch: wait until the previous kernel's writes are visible" + (", then let the next one start" if release else ""))
    w("    tl.extra.cuda.gdc_wait()")
    if release:
        w("    tl.extra.cuda.gdc_launch_dependents()")


def row_indices(w: Writer, flat: str, nrow: int) -> None:
    """Emit i0..i{nrow-1}: the multi-index of flat row numbers over row dims of runtime sizes R1.. (R0 implied)."""
    rest = flat
    for d in reversed(range(nrow)):
        if d == 0:
            w(f"i0 = {rest}")
        else:
            w(f"i{d} = {rest} % R{d}")
            w(f"q{d} = {rest} // R{d}")
            rest = f"q{d}"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def wrapped(w: Writer, opening: str, items: list[str], closing: str) -> None:
    """`opening`, the comma-separated items wrapped over lines of at most ~110 characters, then `closing`: a
    signature or a call."""
    w(opening)
    width, line = 110 - 4 * w.depth - 4, ""
    for item in items:  # (whole items per line: an annotation is not split)
        if line and len(line) + len(item) + 2 > width:
            w("    " + line.rstrip())
            line = ""
        line += item + ", "
    w("    " + line.rstrip())
    w(closing)
